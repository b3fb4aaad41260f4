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

/// Run `work` on a thread of its own, named `name`, at the background's priority when `lower`
/// (else the foreground's: work appends wait for), and wait for its answer.
pub(crate) async fn in_background_thread<T: Send + 'static>(
    name: &str,
    lower: bool,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if lower {
                lower_priority();
            }
            // A panic becomes an error rather than a lost answer.
            let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                .unwrap_or_else(|_| Err(Error::internal("a background thread panicked")));
            let _ = tx.send(answer);
        })
        .map_err(|e| Error::internal(format!("cannot start a background thread: {e}")))?;
    rx.await
        .map_err(|_| Error::internal("a background thread stopped without an answer"))?
}
