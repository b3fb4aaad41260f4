//! Background work runs on threads of a lower scheduling priority than appends and searches,
//! so that on a machine whose cores are busy a search rarely waits for index maintenance.
//! Work that appends or searches may end up waiting for keeps a share of the CPU: the memtable's
//! graph inserter and text commits run at nice 10, flushes at the default priority. Work nothing
//! waits for, a compaction that is not urgent, runs in the idle class and takes only the CPU the
//! foreground leaves. Threads such a thread starts (a graph's inserters, tantivy's indexing and
//! merge threads) inherit its priority.

use crate::{Error, Result};

/// The nice value of background threads where the idle policy is refused: a runnable thread of
/// nice 0 gets about ten times the CPU of one of nice 10.
const BACKGROUND_NICE: i32 = 10;

/// Put the calling thread in the idle scheduling class, `SCHED_IDLE` (Linux): it runs on CPU no
/// thread of the normal class wants, and a search or append that wakes up takes its core at
/// once (a thread of nice 10 can keep a core for a scheduler slice, milliseconds). Where the
/// class is refused, its nice value becomes [`BACKGROUND_NICE`].
#[cfg(target_os = "linux")]
pub(crate) fn lower_priority() {
    // SAFETY: gettid takes no arguments; sched_setscheduler reads the parameter struct passed
    // by reference for the duration of the call, and on Linux applies to the thread whose id
    // it is given.
    let idle = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::pid_t;
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) == 0
    };
    if !idle {
        nice_priority();
    }
}

/// Give the calling thread nice [`BACKGROUND_NICE`] (Linux; elsewhere nothing): for background
/// work appends or searches may wait for (the memtable's graph inserter and text commits),
/// which must keep a share of a busy CPU (about a tenth of a core against one busy thread of
/// nice 0) where the idle class could get none.
#[cfg(target_os = "linux")]
pub(crate) fn nice_priority() {
    // SAFETY: gettid and setpriority take no pointers; on Linux, PRIO_PROCESS with a thread id
    // sets that thread's nice value alone.
    let r = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, BACKGROUND_NICE)
    };
    if r != 0 {
        tracing::debug!("could not lower a background thread's priority");
    }
}

/// Lower the calling thread's priority (Linux; elsewhere nothing).
#[cfg(not(target_os = "linux"))]
pub(crate) fn nice_priority() {}

/// Lower the calling thread's scheduling priority (Linux; elsewhere nothing).
#[cfg(not(target_os = "linux"))]
pub(crate) fn lower_priority() {}

/// Background work whose threads can be raised to the foreground's priority while it runs (a
/// compaction started when nothing waited for it, which a flush later finds one generation short
/// of the cap). Each thread doing the work enters it ([`Raisable::enter`]): it is lowered, and
/// counted in until it ends; [`Raisable::raise`] puts every thread counted in, and every thread
/// that enters later, at the foreground's priority.
#[derive(Debug, Default)]
pub(crate) struct Raisable {
    /// Whether raised, and the threads counted in (Linux thread ids).
    state: std::sync::Mutex<(bool, Vec<i64>)>,
    /// Notified when raised.
    raised: std::sync::Condvar,
}

thread_local! {
    /// The raisable work the calling thread does, if any: threads it starts for the same work
    /// enter it too (see [`current`]).
    static CURRENT: std::cell::RefCell<Option<std::sync::Arc<Raisable>>> =
        const { std::cell::RefCell::new(None) };
}

/// The raisable work the calling thread does, for a thread it starts to enter.
pub(crate) fn current() -> Option<std::sync::Arc<Raisable>> {
    CURRENT.with_borrow(|c| c.clone())
}

/// A thread counted in a [`Raisable`] until it is dropped (at the end of the thread's work).
pub(crate) struct Entered {
    work: std::sync::Arc<Raisable>,
    tid: i64,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let mut st = self.work.lock();
        st.1.retain(|t| *t != self.tid);
        CURRENT.set(None);
    }
}

impl Raisable {
    fn lock(&self) -> std::sync::MutexGuard<'_, (bool, Vec<i64>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count the calling thread in: lowered to the background's priority unless the work was
    /// raised already, until the returned guard is dropped.
    pub(crate) fn enter(self: &std::sync::Arc<Self>) -> Entered {
        let tid = thread_id();
        let mut st = self.lock();
        if st.0 {
            // Raised already: a thread started by a lowered one inherited its class.
            foreground(tid);
        } else {
            lower_priority();
            st.1.push(tid);
        }
        drop(st);
        CURRENT.set(Some(self.clone()));
        Entered {
            work: self.clone(),
            tid,
        }
    }

    /// Put every thread of the work at the foreground's priority, now and as they enter.
    pub(crate) fn raise(&self) {
        let mut st = self.lock();
        if st.0 {
            return;
        }
        st.0 = true;
        for tid in st.1.drain(..) {
            foreground(tid);
        }
        self.raised.notify_all();
    }

    /// Wait until the work is raised (true) or `done` (false), whichever comes first: a thread
    /// that joins the work only once it runs at the foreground's priority (on every core).
    pub(crate) fn wait_raised(&self, done: impl Fn() -> bool) -> bool {
        let mut st = self.lock();
        loop {
            if st.0 {
                return true;
            }
            if done() {
                return false;
            }
            st = self
                .raised
                .wait_timeout(st, std::time::Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Whether [`Raisable::raise`] was called.
    pub(crate) fn raised(&self) -> bool {
        self.lock().0
    }
}

/// The calling thread's id (Linux; elsewhere 0).
fn thread_id() -> i64 {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid takes no arguments and cannot fail.
    return unsafe { libc::syscall(libc::SYS_gettid) };
    #[cfg(not(target_os = "linux"))]
    0
}

/// Put thread `tid` (of this process, counted in and not yet ended: its id is not reused
/// meanwhile) at the foreground's priority: the normal class, nice 0 (Linux; elsewhere
/// nothing). Linux lets a thread leave the idle class, or lower its nice value, only with
/// `CAP_SYS_NICE` or an `RLIMIT_NICE` of 20 or more (`ulimit -e 20`); without either the thread
/// stays where it is (logged at debug), and a raised compaction only gains the threads that
/// join its graph build.
fn foreground(tid: i64) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sched_setscheduler reads the parameter struct passed by reference for the
        // duration of the call; setpriority takes no pointers. Both apply to the one thread
        // whose id they are given, a thread of this process.
        let ok = unsafe {
            let param = libc::sched_param { sched_priority: 0 };
            let class = libc::sched_setscheduler(tid as libc::pid_t, libc::SCHED_OTHER, &param);
            let nice = libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 0);
            class == 0 && nice == 0
        };
        if !ok {
            tracing::debug!("could not raise a background thread's priority");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = tid;
}

/// Run `work` on a thread of its own, named `name`, as part of the raisable background work
/// `lower` (at the background's priority until it is raised), or at the foreground's priority
/// (work appends wait for) without one; and wait for its answer.
pub(crate) async fn in_background_thread<T: Send + 'static>(
    name: &str,
    lower: Option<std::sync::Arc<Raisable>>,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _entered = lower.as_ref().map(|w| w.enter());
            // A panic becomes an error rather than a lost answer.
            let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                .unwrap_or_else(|_| Err(Error::internal("a background thread panicked")));
            let _ = tx.send(answer);
        })
        .map_err(|e| Error::internal(format!("cannot start a background thread: {e}")))?;
    rx.await
        .map_err(|_| Error::internal("a background thread stopped without an answer"))?
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The scheduling class of thread `tid` of this process.
    fn class_of(tid: i64) -> i32 {
        // SAFETY: sched_getscheduler takes no pointers.
        unsafe { libc::sched_getscheduler(tid as libc::pid_t) }
    }

    #[test]
    fn raised_work_runs_at_the_foreground_priority_in_threads_under_way_and_new_ones() {
        let work = Arc::new(Raisable::default());
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let w = work.clone();
        let t = std::thread::spawn(move || {
            let _in = w.enter();
            started_tx.send(thread_id()).unwrap();
            go_rx.recv().unwrap();
            // A thread started for the same work after the raise enters it raised.
            let child = current().unwrap();
            let inner = std::thread::spawn(move || {
                let _in = child.enter();
                class_of(thread_id())
            });
            (class_of(thread_id()), inner.join().unwrap())
        });
        let tid = started_rx.recv().unwrap();
        let idle = class_of(tid);
        work.raise();
        assert!(work.raised());
        let raised_now = class_of(tid);
        go_tx.send(()).unwrap();
        let (own, child) = t.join().unwrap();
        // Where the idle class is refused, threads stay in the normal one; where leaving it is
        // refused (no CAP_SYS_NICE, RLIMIT_NICE below 20), they stay in the idle class.
        assert!(
            idle == libc::SCHED_IDLE || idle == libc::SCHED_OTHER,
            "{idle}"
        );
        let may_leave = {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit writes the struct passed by reference.
            let got = unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut lim) } == 0;
            // SAFETY: geteuid takes no arguments.
            (got && lim.rlim_cur >= 20) || unsafe { libc::geteuid() } == 0
        };
        if idle == libc::SCHED_IDLE && may_leave {
            assert_eq!(
                (raised_now, own, child),
                (libc::SCHED_OTHER, libc::SCHED_OTHER, libc::SCHED_OTHER)
            );
        }
        assert!(
            work.lock().1.is_empty(),
            "threads that ended are counted out"
        );
    }
}
