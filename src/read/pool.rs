//! The query pool: a fixed set of threads that runs the arms of every search of a handle and
//! its per-source planning (live rows, statistics, filters), so a search over a thousand
//! generations starts no thread of its own and the process runs a bounded number of threads
//! whatever the number of generations ([`crate::Settings::query_threads`]).

use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A handle's query threads.
pub(crate) struct QueryPool {
    pool: rayon::ThreadPool,
    /// [`crate::Settings::query_piece_docs`].
    piece_docs: u32,
    /// Jobs handed to the pool ([`QueryPool::run`], [`QueryPool::install`]) and not finished:
    /// queued or running.
    jobs: Arc<AtomicUsize>,
}

/// Counts a job of the pool from when it is handed over until it is finished or skipped.
struct Job(Arc<AtomicUsize>);

impl Job {
    fn new(jobs: &Arc<AtomicUsize>) -> Job {
        jobs.fetch_add(1, Ordering::Relaxed);
        Job(jobs.clone())
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for QueryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueryPool({} threads)", self.pool.current_num_threads())
    }
}

/// Sets a flag when dropped: the arm it belongs to was cancelled (its stream dropped).
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Whether the query an arm belongs to still wants its answer: no once the arm's stream was
/// dropped (the query was cancelled, or passed its deadline). An arm checks between pieces of
/// its work (a full-text arm, between segments) and stops with an error no one reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stop(Arc<AtomicBool>);

impl Stop {
    /// A stop and what sets it when dropped (held by the future of the query it belongs to).
    pub(crate) fn with_guard() -> (Stop, impl Drop + Send) {
        let flag = Arc::new(AtomicBool::new(false));
        (Stop(flag.clone()), CancelOnDrop(flag))
    }

    /// An error when the query no longer wants the answer.
    pub(crate) fn check(&self) -> Result<()> {
        match self.0.load(Ordering::Relaxed) {
            true => Err(Error::timeout(
                "the query was stopped: its stream was dropped",
            )),
            false => Ok(()),
        }
    }
}

impl QueryPool {
    /// A pool of `threads` threads (0: one per core), whose full-text arms score segments in
    /// pieces of `piece_docs` documents at least (0: whole).
    pub(crate) fn new(threads: usize, piece_docs: usize) -> Result<Arc<QueryPool>> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("lsmsearch-query-{i}"))
            .build()
            .map_err(|e| Error::internal(format!("cannot start the query threads: {e}")))?;
        Ok(Arc::new(QueryPool {
            pool,
            piece_docs: u32::try_from(piece_docs).unwrap_or(u32::MAX),
            jobs: Arc::default(),
        }))
    }

    /// Documents of a text segment one thread scores at least (0: a segment is one piece).
    pub(crate) fn piece_docs(&self) -> u32 {
        self.piece_docs
    }

    /// The pool's threads.
    pub(crate) fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Whether the pool has more jobs queued or running than threads: a job that splits its
    /// work then waits for its parts while the thread that waits runs other jobs (rayon's
    /// join), one of which may be another query's arm.
    pub(crate) fn saturated(&self) -> bool {
        self.jobs.load(Ordering::Relaxed) > self.threads()
    }

    /// Run `f` on the pool (its parallel iterators use the pool's threads), waiting for it.
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let _job = Job::new(&self.jobs);
        self.pool.install(f)
    }

    /// Run `work` on the pool; the future resolves to its result. Dropping the future before
    /// the work starts (a cancelled query) skips it. A panic in `work` is an internal error.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Stop) -> Result<T> + Send + 'static,
    ) -> impl std::future::Future<Output = Result<T>> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let cancelled = Arc::new(AtomicBool::new(false));
        let flag = cancelled.clone();
        let job = Job::new(&self.jobs);
        self.pool.spawn(move || {
            let _job = job;
            if flag.load(Ordering::Relaxed) {
                return;
            }
            let stop = Stop(flag);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&stop)))
                .unwrap_or_else(|_| Err(Error::internal("a search arm panicked")));
            let _ = tx.send(r);
        });
        let guard = CancelOnDrop(cancelled);
        async move {
            let _guard = guard;
            rx.await
                .map_err(|_| Error::internal("a search arm stopped without an answer"))?
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dropped_arm_never_runs_and_a_panic_is_an_error() {
        let pool = QueryPool::new(1, 0).unwrap();
        // Hold the only thread so the next job waits in the queue.
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let busy = pool.run(move |_| {
            let _ = hold_rx.recv();
            Ok(())
        });
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        drop(pool.run(move |_| {
            r.store(true, Ordering::SeqCst);
            Ok(())
        }));
        hold_tx.send(()).unwrap();
        busy.await.unwrap();
        let after = pool.run(|_| Ok(7));
        assert_eq!(after.await.unwrap(), 7);
        assert!(!ran.load(Ordering::SeqCst), "a cancelled arm ran");
        let e = pool
            .run(|_| -> Result<()> { panic!("boom") })
            .await
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Internal);
    }

    #[tokio::test]
    async fn a_running_arm_sees_its_stream_dropped() {
        let pool = QueryPool::new(1, 0).unwrap();
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel::<(bool, bool)>();
        let arm = pool.run(move |stop| {
            let before = stop.check().is_ok();
            let _ = started_tx.send(());
            let _ = go_rx.recv();
            let _ = seen_tx.send((before, stop.check().is_err()));
            Ok(())
        });
        let polled = tokio::spawn(arm);
        started_rx.recv().unwrap();
        polled.abort();
        let _ = polled.await;
        go_tx.send(()).unwrap();
        let (wanted_before, stopped_after) = seen_rx.recv().unwrap();
        assert!(wanted_before, "the arm was stopped before its stream went");
        assert!(stopped_after, "the arm did not see its stream dropped");
        let e = Stop(Arc::new(AtomicBool::new(true))).check().unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Timeout, "{e}");
    }
}
