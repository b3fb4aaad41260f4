//! Background work (the memtable's graph inserter and text commits, flushes, compactions) runs
//! on threads of a lower scheduling priority than appends and searches, so that on a machine
//! whose cores are busy a search waits for no index maintenance: the background takes the CPU
//! the foreground leaves. Threads such a thread starts (a graph's inserters, tantivy's indexing
//! and merge threads) inherit its priority.

use crate::{Error, Result};

/// The nice value of background threads (Linux): a runnable thread of nice 0 gets about ten
/// times the CPU of one of nice 10.
const BACKGROUND_NICE: i32 = 10;

/// Lower the calling thread's scheduling priority to [`BACKGROUND_NICE`] (Linux; elsewhere
/// nothing).
#[cfg(target_os = "linux")]
pub(crate) fn lower_priority() {
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

/// Lower the calling thread's scheduling priority (Linux; elsewhere nothing).
#[cfg(not(target_os = "linux"))]
pub(crate) fn lower_priority() {}

/// Run `work` on a thread of its own, named `name`, at the background's priority, and wait for
/// its answer.
pub(crate) async fn in_background_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            lower_priority();
            // A panic becomes an error rather than a lost answer.
            let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                .unwrap_or_else(|_| Err(Error::internal("a background thread panicked")));
            let _ = tx.send(answer);
        })
        .map_err(|e| Error::internal(format!("cannot start a background thread: {e}")))?;
    rx.await
        .map_err(|_| Error::internal("a background thread stopped without an answer"))?
}
