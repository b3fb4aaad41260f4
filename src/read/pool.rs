//! The query pool: a fixed set of threads that runs the arms of every search of a handle and
//! its per-source planning (live rows, statistics, filters), so a search over a thousand
//! generations starts no thread of its own and the process runs a bounded number of threads
//! whatever the number of generations ([`crate::Settings::query_threads`]).

use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// The group of the handle at `location` whose query pool it shares
/// ([`QueryPool::shared`]): a shard's (`<root>/shard-<i>`) is its sharded index's root, any
/// other's its own location.
pub(crate) fn pool_group(location: &str) -> &str {
    let trimmed = location.trim_end_matches('/');
    match trimmed.rsplit_once("/shard-") {
        Some((root, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => root,
        _ => location,
    }
}

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

/// `work`'s result, a panic in it an internal error: what the pool's threads run never
/// unwinds into them.
pub(crate) fn caught<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
        .unwrap_or_else(|_| Err(Error::internal("a search arm panicked")))
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

    /// The pool of `threads` threads (0: one per core) and `piece_docs` that the handles of
    /// this process in `group` (the shards of one sharded index: [`pool_group`]) opened with
    /// the same two settings share, started by the first and ended when the last is dropped.
    /// A search of N shards (in one process, or on a worker serving them) then runs on one
    /// set of threads, not N: it woke N pools' threads, which spin a while before they sleep
    /// and took the cores from the threads with work. Other indexes keep pools of their own,
    /// so that one whose reads wait on a slow store holds up no other's searches.
    pub(crate) fn shared(threads: usize, piece_docs: usize, group: &str) -> Result<Arc<QueryPool>> {
        type Key = (usize, usize, String);
        type Pools = std::sync::Mutex<std::collections::HashMap<Key, Weak<QueryPool>>>;
        static POOLS: std::sync::OnceLock<Pools> = std::sync::OnceLock::new();
        let mut pools = POOLS
            .get_or_init(Pools::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = (threads, piece_docs, group.to_string());
        if let Some(pool) = pools.get(&key).and_then(Weak::upgrade) {
            return Ok(pool);
        }
        let pool = QueryPool::new(threads, piece_docs)?;
        pools.retain(|_, p| p.strong_count() > 0);
        pools.insert(key, Arc::downgrade(&pool));
        Ok(pool)
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
            let _ = tx.send(caught(|| work(&stop)));
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
impl QueryPool {
    /// Hold one of the pool's threads (tests: the next job waits in the queue of a pool of
    /// one): it is let go when the returned sender sends, and the future ends then.
    pub(crate) fn hold_a_thread(
        &self,
    ) -> (
        std::sync::mpsc::Sender<()>,
        impl std::future::Future<Output = Result<()>>,
    ) {
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let busy = self.run(move |_| {
            let _ = hold_rx.recv();
            Ok(())
        });
        (hold_tx, busy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_of_one_index_share_one_pool_while_one_holds_it() {
        // Settings no other test of this binary uses: no other test holds these pools.
        let group = |l| pool_group(l).to_string();
        assert_eq!(group("s3://b/idx/shard-0"), "s3://b/idx");
        assert_eq!(group("/data/idx/shard-12/"), "/data/idx");
        assert_eq!(group("/data/idx"), "/data/idx");
        assert_eq!(group("/data/shard-x"), "/data/shard-x");
        assert_eq!(group("/data/idx/shard-"), "/data/idx/shard-");
        let a = QueryPool::shared(3, 7_001, pool_group("/i/shard-0")).unwrap();
        let b = QueryPool::shared(3, 7_001, pool_group("/i/shard-1")).unwrap();
        assert!(
            Arc::ptr_eq(&a, &b),
            "two shards' pools of the same settings"
        );
        assert_eq!(a.threads(), 3);
        let other = QueryPool::shared(2, 7_001, "/i").unwrap();
        assert!(!Arc::ptr_eq(&a, &other), "a pool of other settings");
        assert_eq!(other.threads(), 2);
        let apart = QueryPool::shared(3, 7_001, "/j").unwrap();
        assert!(!Arc::ptr_eq(&a, &apart), "another index's pool");
        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none(), "a pool no handle holds was kept");
        let again = QueryPool::shared(3, 7_001, "/i").unwrap();
        assert_eq!(again.threads(), 3);
    }

    #[tokio::test]
    async fn a_dropped_arm_never_runs_and_a_panic_is_an_error() {
        let pool = QueryPool::new(1, 0).unwrap();
        // Hold the only thread so the next job waits in the queue.
        let (hold_tx, busy) = pool.hold_a_thread();
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
