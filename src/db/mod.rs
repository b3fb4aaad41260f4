//! The index handles: [`Index`] (the one writer) and [`ReadOnlyIndex`].
//!
//! Writes flow through one *committer* task: it drains every request waiting in its queue into
//! one group, assigns sequence numbers, writes one WAL object for the group (group commit),
//! applies the rows to the memtable and acknowledges. When the memtable is full it is frozen and
//! handed to the *flusher* task, which writes the generation, publishes a manifest and deletes
//! the WAL objects the generation covers. The frozen memtable stays searchable until the manifest
//! naming its generation is published; both swaps happen under one lock, so a reader never sees a
//! row twice or not at all.

mod commit;
pub(crate) mod compact;
#[cfg(test)]
mod fixtures;
mod flush;
mod garbage;
mod pace;
mod reader;
mod readonly;
mod search;

pub use compact::CompactionReport;
pub use readonly::ReadOnlyIndex;
pub use search::Search;

use crate::format::manifest::Manifest;
use crate::format::GenerationMeta;
use crate::key::Key;
use crate::manifest::{ManifestStore, WriteOutcome};
use crate::memtable::{catch_up, read_memtable, Memtable, SharedMemtable};
use crate::read::{Snapshot, Source};
use crate::schema::IndexSchema;
use crate::settings::{Settings, WriteOptions};
use crate::storage::paths::Paths;
use crate::storage::{check_conditional_create, Location};
use crate::vector::MemGraphSpec;
use crate::wal::{replay, Mode};
use crate::{Error, ErrorKind, Result};
use arrow::array::{ArrayRef, RecordBatch};
use reader::Reader;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tokio::sync::{mpsc, oneshot, watch, Notify};

/// Options of a scan.
#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    /// A SQL predicate over the index's columns, e.g. `year >= 2020 AND lang = 'en'`.
    pub filter: Option<String>,
}

/// What a write call returns once it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WriteReceipt {
    /// Sequence number of the last row written by the call.
    pub last_seq: u64,
    /// Rows written (appended rows or tombstones).
    pub rows: usize,
}

/// A point-in-time description of an index handle.
#[derive(Debug, Clone, Serialize)]
pub struct IndexStats {
    /// The index location.
    pub location: String,
    /// The epoch of the newest manifest this handle knows.
    pub epoch: u64,
    /// The newest manifest version this handle knows.
    pub manifest_version: u64,
    /// Flushed generations, oldest first.
    pub generations: Vec<GenerationMeta>,
    /// Rows (versions and tombstones) in the active memtable.
    pub memtable_rows: usize,
    /// Rows of the active memtable in its vector graph (searches scan the rest exactly).
    pub memtable_graph_rows: usize,
    /// Rows in frozen memtables waiting for their flush.
    pub frozen_rows: usize,
    /// Frozen memtables waiting for their flush.
    pub frozen_memtables: usize,
    /// WAL objects not yet covered by a generation.
    pub wal_objects_pending: u64,
    /// Highest sequence number assigned.
    pub last_seq: u64,
    /// Rows of the active and frozen memtables not yet in their vector graph: searches scan
    /// them exactly, and appends slow down once there are more than
    /// [`Settings::max_unindexed_rows`] (see [`Settings::max_unindexed_rows`]).
    pub unindexed_rows: usize,
    /// Milliseconds the last successful flush took (0 before the first).
    pub last_flush_ms: u64,
    /// Milliseconds the last group commit waited because of the indexing debt.
    pub append_delay_ms: f64,
    /// Milliseconds group commits waited in total because of the indexing debt.
    pub append_delay_total_ms: f64,
    /// Rows of the generations the compaction policy would merge now (0 when none is due, or
    /// compaction is off and the policy would merge nothing).
    pub compaction_debt_rows: u64,
    /// Bytes of generation objects a compaction replaced, awaiting their deletion (see
    /// [`Settings::compaction_grace_ms`]).
    pub bytes_reclaimable: u64,
    /// Milliseconds the last compaction took (0 before the first).
    pub last_compaction_ms: u64,
    /// Compactions this handle published.
    pub compactions: u64,
    /// The last compaction failure, if the compactions since have not succeeded.
    pub compaction_error: Option<String>,
}

#[derive(Debug)]
pub(crate) struct State {
    pub manifest: Manifest,
    pub active: SharedMemtable,
    /// Oldest first.
    pub frozen: VecDeque<SharedMemtable>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct FlushStatus {
    pub flushed_upto: u64,
    /// The last failure, and how many flush attempts have failed so far: a `flush()` reports a
    /// failure only if it happened while it waited, never a stale one.
    pub error: Option<Error>,
    pub failures: u64,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub loc: Location,
    pub paths: Paths,
    pub manifests: ManifestStore,
    /// Schemas, settings, the generation cache (`manifest.generations` says which are
    /// current) and the block lists.
    pub reader: Reader,
    pub epoch: u64,
    pub state: RwLock<State>,
    pub fenced: AtomicBool,
    pub closed: AtomicBool,
    pub next_wal_id: AtomicU64,
    pub last_seq: AtomicU64,
    pub flush_status: watch::Sender<FlushStatus>,
    pub flush_wake: Notify,
    pub backpressure: Notify,
    /// The last WAL object the previous flush covered, kept until the next flush (see
    /// `flush.rs`).
    pub kept_wal: std::sync::Mutex<Option<u64>>,
    /// Milliseconds the last successful flush took.
    pub last_flush_ms: AtomicU64,
    /// Microseconds the last group commit was delayed by pacing (see `pace.rs`), and in total.
    pub append_delay_us: AtomicU64,
    pub append_delay_total_us: AtomicU64,
    /// Held while a manifest version is computed from the latest one, written and installed
    /// (flushes and compactions), so every publish starts from the latest version.
    pub publish: tokio::sync::Mutex<()>,
    /// A compaction's manifest whose PUT reported an error (it may have landed): settled
    /// before the next publish.
    pub unsure_manifest: std::sync::Mutex<Option<compact::Unsure>>,
    /// Held by the compaction under way: one at a time.
    pub compacting: tokio::sync::Mutex<()>,
    /// The priority of the compaction under way when it runs in the background (a flush raises
    /// it when it becomes urgent).
    pub compaction_priority: std::sync::Mutex<Option<Arc<crate::priority::Raisable>>>,
    /// The id the next generation (flushed or merged) gets.
    pub next_generation_id: AtomicU64,
    /// Wakes the compactor (after a flush).
    pub compact_wake: Notify,
    pub compaction: std::sync::Mutex<compact::CompactionState>,
}

impl Inner {
    /// The vector graph a new active memtable keeps (none without a vector column).
    pub(crate) fn mem_graph_spec(&self) -> Option<MemGraphSpec> {
        mem_graph_spec(&self.reader.schema, &self.reader.settings)
    }

    /// Rows of the active and frozen memtables not yet in their vector graph.
    pub(crate) fn unindexed_rows(&self) -> usize {
        let st = self.read_state();
        std::iter::once(&st.active)
            .chain(st.frozen.iter())
            .map(|m| read_memtable(m).unindexed_rows())
            .sum()
    }

    /// The debt appends are paced by (see `pace.rs`): the unindexed rows, plus the active
    /// memtable's rows while the queue of frozen memtables is full (its freeze would wait for
    /// a flush), plus what generations near the cap add while a compaction is due and
    /// compaction is not failing (at the cap flushes wait for it).
    pub(crate) fn debt_rows(&self) -> usize {
        let s = &self.reader.settings;
        let (queue_full, generations, due) = {
            let st = self.read_state();
            let queue_full = if st.frozen.len() >= s.max_frozen_memtables {
                read_memtable(&st.active).rows()
            } else {
                0
            };
            let gens = &st.manifest.generations;
            let due = compact::debt(gens, s.compaction_fanout, s.compaction_max_generations) > 0;
            (queue_full, gens.len(), due)
        };
        // Only while a compaction is due: one that is not would never drain it.
        let compaction = if s.compaction && due && self.compaction_state().last_error.is_none() {
            pace::generation_debt(
                generations,
                s.compaction_max_generations,
                s.compaction_fanout,
                s.max_unindexed_rows,
            )
        } else {
            0
        };
        self.unindexed_rows() + queue_full + compaction
    }

    /// The compaction manifest whose PUT's outcome is unknown, if any (see `flush::settle`).
    pub(crate) fn unsure(&self) -> std::sync::MutexGuard<'_, Option<compact::Unsure>> {
        self.unsure_manifest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn compaction_state(&self) -> std::sync::MutexGuard<'_, compact::CompactionState> {
        self.compaction.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn write_state(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn mark_fenced(&self) {
        if !self.fenced.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                "writer of epoch {} on {} was fenced by a newer writer",
                self.epoch,
                self.loc.display
            );
        }
        self.flush_wake.notify_waiters();
        self.compact_wake.notify_one();
        self.backpressure.notify_waiters();
    }

    pub(crate) fn fenced_error(&self) -> Error {
        Error::fenced(format!(
            "a newer writer claimed the index at {}; this writer (epoch {}) acknowledges nothing more",
            self.loc.display, self.epoch
        ))
    }
}

/// The newest manifest at `loc`; `Invalid` when there is no index there.
async fn latest_manifest(manifests: &ManifestStore, loc: &Location) -> Result<Manifest> {
    manifests
        .load_latest()
        .await?
        .ok_or_else(|| Error::invalid(format!("no index at {} (create it first)", loc.display)))
}

/// A name for a probe object no other handle picks.
fn probe_token() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        COUNT.fetch_add(1, Ordering::Relaxed)
    )
}

fn mem_graph_spec(schema: &IndexSchema, settings: &Settings) -> Option<MemGraphSpec> {
    let (vcol, metric, params) = schema.vector_spec(settings)?;
    Some(MemGraphSpec {
        vcol,
        dim: schema.vector.as_ref()?.dim,
        metric,
        params,
        above: settings.memtable_graph_above,
    })
}

pub(crate) enum WriteRows {
    Append(RecordBatch),
    Delete(ArrayRef),
}

impl WriteRows {
    fn len(&self) -> usize {
        match self {
            WriteRows::Append(b) => b.num_rows(),
            WriteRows::Delete(k) => k.len(),
        }
    }
}

pub(crate) enum Request {
    Write {
        rows: WriteRows,
        options: WriteOptions,
        ack: oneshot::Sender<Result<WriteReceipt>>,
    },
    /// Freeze the active memtable; answers the id of the newest memtable to wait for.
    Freeze {
        ack: oneshot::Sender<Result<Option<u64>>>,
    },
    /// Write buffered rows and stop; answers whether they reached the WAL.
    Close { ack: oneshot::Sender<Result<()>> },
}

/// The writer of an index. Cheap to share behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Index {
    inner: Arc<Inner>,
    tx: mpsc::Sender<Request>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The leak collection started at open (`garbage.rs`).
    collector: tokio::task::JoinHandle<()>,
    /// The background compactor (`compact.rs`): stopped, not awaited, by `close()`; a
    /// compaction cut off publishes nothing or a complete manifest version.
    compactor: tokio::task::JoinHandle<()>,
}

impl Index {
    /// Create a new index at `loc` and open it as its writer. Fails with `Invalid` if an index
    /// already exists there.
    pub async fn create(loc: Location, schema: IndexSchema, settings: Settings) -> Result<Index> {
        schema.check()?;
        settings.validate()?;
        let paths = Paths::new(loc.root.clone());
        let manifests = ManifestStore::new(loc.store.clone(), paths.clone());
        check_conditional_create(loc.store.as_ref(), &paths.probe(&probe_token())).await?;
        if manifests.latest_version().await?.is_some() {
            return Err(Error::invalid(format!(
                "an index already exists at {}",
                loc.display
            )));
        }
        let m = Manifest {
            version: 1,
            epoch: 0,
            schema,
            generations: vec![],
            wal_replay_from: 1,
            last_seq: 0,
            next_generation_id: 1,
        };
        match manifests.write(&m).await? {
            WriteOutcome::Written => {}
            WriteOutcome::Conflict => {
                return Err(Error::invalid(format!(
                    "an index already exists at {}",
                    loc.display
                )))
            }
        }
        manifests.publish_hint(1).await;
        // The store was checked above.
        Self::open_checked(loc, settings, false).await
    }

    /// Open the index at `loc` as its writer: claims a new epoch (fencing any previous writer),
    /// loads the generations and replays the WAL into the memtable.
    pub async fn open(loc: Location, settings: Settings) -> Result<Index> {
        Self::open_checked(loc, settings, true).await
    }

    /// [`Index::open`], checking first that the store honours conditional creates when
    /// `probe_store` (`create` has just checked it).
    async fn open_checked(loc: Location, settings: Settings, probe_store: bool) -> Result<Index> {
        settings.validate()?;
        let paths = Paths::new(loc.root.clone());
        let manifests = ManifestStore::new(loc.store.clone(), paths.clone());
        if probe_store {
            check_conditional_create(loc.store.as_ref(), &paths.probe(&probe_token())).await?;
        }
        // Read and check every generation (through the handle's cache) and every WAL object
        // first, then claim epoch + 1 with a conditional PUT of the next manifest version: an
        // open that fails on a bad generation or WAL object fails before it fences the running
        // writer, which may still hold those rows in memory and flush them.
        let mut reader: Option<Reader> = None;
        let (manifest, generations, checked) = loop {
            let cur = latest_manifest(&manifests, &loc).await?;
            if reader.is_none() {
                reader = Some(Reader::new(
                    &loc,
                    &paths,
                    cur.schema.clone(),
                    settings.clone(),
                )?);
            }
            let r = reader.as_mut().expect("just set");
            let generations = match r.generations.get_all(&cur.generations).await {
                Ok(g) => g,
                // A compaction of the running writer replaced it and deleted it (its grace
                // period was shorter than this gap) after the list was read: start again on
                // the newer list. Otherwise the object really is missing.
                Err(e) if e.is_not_found() => {
                    let newest = manifests.load_latest().await?;
                    // Every generation of the list still listed: the missing one is named by
                    // the newest version, the object really is missing.
                    let replaced = newest.is_some_and(|n| {
                        cur.generations.iter().any(|g| !n.generations.contains(g))
                    });
                    if !replaced {
                        return Err(e);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            let checked = match replay(
                &loc.store,
                &paths,
                &r.stored_schema,
                cur.wal_replay_from,
                Mode::ReadOnly,
                settings.io_concurrency,
            )
            .await
            {
                Ok(c) => c,
                // If a flush published a newer version meanwhile, it freed these objects: start
                // again. Otherwise the WAL really has a hole.
                Err(e) if e.is_not_found() => {
                    let now = manifests.load_latest().await?.map(|m| m.version);
                    if now == Some(cur.version) {
                        return Err(e);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut next = cur.clone();
            next.version += 1;
            next.epoch += 1;
            // The claim succeeds only if no version was published since `cur`, so no flush
            // freed the objects just read.
            if let WriteOutcome::Written = manifests.write(&next).await? {
                break (next, generations, checked);
            }
        };
        let reader = reader.ok_or_else(|| Error::internal("no reader after the claim"))?;
        manifests.publish_hint(manifest.version).await;
        let epoch = manifest.epoch;
        let stored_schema = reader.stored_schema.clone();
        // Every open adds a version: prune as a flush does, while the WAL is replayed.
        let ((), replayed) = tokio::join!(
            manifests.prune(
                manifest.version,
                settings.manifest_retention,
                settings.io_concurrency,
            ),
            // Objects appended since the check (by the writer this open fences), a torn tail
            // to delete, then the fence.
            replay(
                &loc.store,
                &paths,
                &stored_schema,
                checked.next_id,
                Mode::Writer { epoch },
                settings.io_concurrency,
            )
        );
        let replayed = replayed?;
        let entries = checked.entries.into_iter().chain(replayed.entries);
        let mut mem = Memtable::new(
            1,
            stored_schema,
            reader.text_schema.as_ref(),
            mem_graph_spec(&reader.schema, &settings),
        )?;
        let mut last_seq = manifest.last_seq;
        for (id, e) in entries {
            last_seq = last_seq.max(e.last_seq);
            if let Some(rows) = e.rows {
                mem.apply(rows)?;
            }
            mem.add_wal_id(id);
        }
        tracing::info!(
            "opened {} as writer: epoch {epoch}, {} generations, {} rows replayed from the WAL",
            loc.display,
            generations.len(),
            mem.rows()
        );
        let (status_tx, _) = watch::channel(FlushStatus::default());
        let kept_wal = manifest.wal_replay_from.checked_sub(1).filter(|id| *id > 0);
        let next_generation_id = manifest.next_generation_id;
        let inner = Arc::new(Inner {
            paths,
            manifests,
            reader,
            epoch,
            state: RwLock::new(State {
                manifest,
                active: Arc::new(RwLock::new(mem)),
                frozen: VecDeque::new(),
            }),
            fenced: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            next_wal_id: AtomicU64::new(replayed.next_id),
            last_seq: AtomicU64::new(last_seq),
            flush_status: status_tx,
            flush_wake: Notify::new(),
            backpressure: Notify::new(),
            // The object the previous writer's last flush kept (the last one below the replay
            // point, always a rows object): this writer's first flush deletes it.
            kept_wal: std::sync::Mutex::new(kept_wal),
            last_flush_ms: AtomicU64::new(0),
            append_delay_us: AtomicU64::new(0),
            append_delay_total_us: AtomicU64::new(0),
            publish: tokio::sync::Mutex::new(()),
            compacting: tokio::sync::Mutex::new(()),
            compaction_priority: std::sync::Mutex::new(None),
            unsure_manifest: std::sync::Mutex::new(None),
            next_generation_id: AtomicU64::new(next_generation_id),
            compact_wake: Notify::new(),
            compaction: Default::default(),
            loc,
        });
        let (tx, rx) = mpsc::channel(1024);
        let committer = commit::Committer::new(inner.clone(), rx, last_seq + 1, replayed.next_id);
        let opened_on = inner.read_state().manifest.clone();
        let tasks = vec![
            tokio::spawn(committer.run()),
            tokio::spawn(flush::run_flusher(inner.clone())),
        ];
        let compactor = tokio::spawn(compact::run_compactor(inner.clone()));
        // Leak collection is best effort: close() and drop stop it wherever it is.
        let collector = tokio::spawn(garbage::collect(inner.clone(), opened_on));
        catch_up(&inner.read_state().active);
        Ok(Index {
            inner,
            tx,
            tasks: std::sync::Mutex::new(tasks),
            collector,
            compactor,
        })
    }

    /// The schema of the index at `loc`, from its newest manifest alone (one GET and one
    /// short LIST): nothing else is read and nothing is written.
    pub async fn read_schema(loc: &Location) -> Result<IndexSchema> {
        let manifests = ManifestStore::new(loc.store.clone(), Paths::new(loc.root.clone()));
        Ok(latest_manifest(&manifests, loc).await?.schema)
    }

    /// Open the index at `loc` read-only (see [`ReadOnlyIndex`]).
    pub async fn open_read_only(loc: Location, settings: Settings) -> Result<ReadOnlyIndex> {
        ReadOnlyIndex::open(loc, settings).await
    }

    search::read_methods!(inner.reader);

    /// The epoch this writer claimed.
    pub fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    fn check_open(&self) -> Result<()> {
        if self.inner.fenced.load(Ordering::SeqCst) {
            return Err(self.inner.fenced_error());
        }
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(Error::closed());
        }
        Ok(())
    }

    async fn submit<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Request) -> Result<T> {
        let (ack, rx) = oneshot::channel();
        self.tx.send(make(ack)).await.map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())
    }

    fn gone(&self) -> Error {
        if self.inner.fenced.load(Ordering::SeqCst) {
            self.inner.fenced_error()
        } else {
            Error::closed()
        }
    }

    /// Upsert rows by primary key, durably (see [`Index::append_with`]).
    pub async fn append(&self, batch: &RecordBatch) -> Result<WriteReceipt> {
        self.append_with(batch, WriteOptions::default()).await
    }

    /// Upsert rows by primary key. The newest version of a key wins; within one batch the last
    /// row for a key wins. When the call returns the rows are visible to every search that
    /// starts afterwards and, with `Durable`, in the WAL. A rejected batch changes nothing.
    pub async fn append_with(
        &self,
        batch: &RecordBatch,
        options: WriteOptions,
    ) -> Result<WriteReceipt> {
        self.check_open()?;
        let batch = self.inner.reader.schema.validate_batch(batch)?;
        self.submit(|ack| Request::Write {
            rows: WriteRows::Append(batch),
            options,
            ack,
        })
        .await?
    }

    /// Delete keys durably (see [`Index::delete_with`]).
    pub async fn delete(&self, keys: &[Key]) -> Result<WriteReceipt> {
        self.delete_with(keys, WriteOptions::default()).await
    }

    /// Write tombstones for `keys`: older versions are hidden from every later search.
    pub async fn delete_with(&self, keys: &[Key], options: WriteOptions) -> Result<WriteReceipt> {
        self.check_open()?;
        let keys = self.inner.reader.schema.key_column(keys)?;
        self.submit(|ack| Request::Write {
            rows: WriteRows::Delete(keys),
            options,
            ack,
        })
        .await?
    }

    /// Freeze the memtable and wait until it (and every memtable frozen before it) is published
    /// as a generation.
    pub async fn flush(&self) -> Result<()> {
        self.check_open()?;
        let target = self.submit(|ack| Request::Freeze { ack }).await??;
        let Some(target) = target else {
            return Ok(());
        };
        let mut rx = self.inner.flush_status.subscribe();
        let failures_before = rx.borrow().failures;
        loop {
            {
                let s = rx.borrow_and_update();
                if s.flushed_upto >= target {
                    return Ok(());
                }
                if s.failures > failures_before {
                    if let Some(e) = &s.error {
                        return Err(e.clone());
                    }
                }
            }
            if self.inner.fenced.load(Ordering::SeqCst) {
                return Err(self.inner.fenced_error());
            }
            // A concurrent close() stops the flusher: the frozen memtables stay in the WAL.
            if self.inner.closed.load(Ordering::SeqCst) {
                return Err(Error::closed());
            }
            if rx.changed().await.is_err() {
                return Err(self.gone());
            }
        }
    }

    /// Write any buffered WAL data, stop the background tasks and refuse further calls. Frozen
    /// memtables not yet flushed stay in the WAL and are replayed by the next open. Fails when
    /// buffered rows could not be written to the WAL: they were acknowledged and are lost.
    pub async fn close(&self) -> Result<()> {
        // Refuse new calls and release a committer waiting for a flush slot (flushes may keep
        // failing) before asking it to stop: the frozen memtables stay in the WAL.
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.collector.abort();
        self.compactor.abort();
        self.inner.flush_wake.notify_waiters();
        self.inner.backpressure.notify_waiters();
        // Wake flush() callers, which see the handle closed.
        self.inner.flush_status.send_modify(|_| {});
        // The final WAL write of buffered rows: a failure means they are lost, and says so.
        let last_write = match self.submit(|ack| Request::Close { ack }).await {
            Ok(r) => r,
            // The committer already stopped (fenced): nothing more to write.
            Err(_) => Ok(()),
        };
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        for t in tasks {
            t.await?;
        }
        last_write
    }

    /// What a read started now sees: the active memtable, the frozen ones (newest first) and
    /// the generations of the handle's manifest. A generation object deleted between reading
    /// the list and loading it (a compaction replaced it, and its grace period was shorter
    /// than this gap) means the list changed: the read starts over on the new one.
    async fn snapshot(&self) -> Result<Snapshot> {
        let mut attempts = 0;
        loop {
            match self.try_snapshot().await {
                Err(e) if e.is_not_found() && attempts < 3 => attempts += 1,
                other => return other,
            }
        }
    }

    async fn try_snapshot(&self) -> Result<Snapshot> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(Error::closed());
        }
        let (memtables, metas) = {
            let st = self.inner.read_state();
            let mut v = vec![Source::memtable(
                "active memtable",
                read_memtable(&st.active).search_view(),
            )];
            for m in st.frozen.iter().rev() {
                let m = read_memtable(m);
                v.push(Source::memtable(
                    format!("frozen memtable {}", m.id()),
                    m.search_view(),
                ));
            }
            (v, st.manifest.generations.clone())
        };
        self.inner.reader.snapshot(memtables, &metas).await
    }

    /// Generations, memtable and WAL figures.
    pub fn stats(&self) -> IndexStats {
        let st = self.inner.read_state();
        let frozen_rows = st.frozen.iter().map(|m| read_memtable(m).rows()).sum();
        let (memtable_rows, memtable_graph_rows) = {
            let m = read_memtable(&st.active);
            (m.rows(), m.graph_rows())
        };
        let stats = IndexStats {
            location: self.inner.loc.display.clone(),
            epoch: st.manifest.epoch,
            manifest_version: st.manifest.version,
            generations: st.manifest.generations.clone(),
            memtable_rows,
            memtable_graph_rows,
            frozen_rows,
            frozen_memtables: st.frozen.len(),
            wal_objects_pending: self
                .inner
                .next_wal_id
                .load(Ordering::SeqCst)
                .saturating_sub(st.manifest.wal_replay_from),
            last_seq: self.inner.last_seq.load(Ordering::SeqCst),
            unindexed_rows: 0,
            last_flush_ms: self.inner.last_flush_ms.load(Ordering::Relaxed),
            append_delay_ms: self.inner.append_delay_us.load(Ordering::Relaxed) as f64 / 1e3,
            append_delay_total_ms: self.inner.append_delay_total_us.load(Ordering::Relaxed) as f64
                / 1e3,
            compaction_debt_rows: 0,
            bytes_reclaimable: 0,
            last_compaction_ms: 0,
            compactions: 0,
            compaction_error: None,
        };
        drop(st);
        let c = self.inner.compaction_state();
        IndexStats {
            unindexed_rows: self.inner.unindexed_rows(),
            compaction_debt_rows: compact::debt(
                &stats.generations,
                self.inner.reader.settings.compaction_fanout,
                self.inner.reader.settings.compaction_max_generations,
            ),
            bytes_reclaimable: c.replaced.iter().map(compact::Replaced::bytes).sum(),
            last_compaction_ms: c.last_ms,
            compactions: c.compactions,
            compaction_error: c.last_error.as_ref().map(|e| e.to_string()),
            ..stats
        }
    }

    /// Merge every generation into one now (superseded versions and tombstones dropped), and
    /// wait until the merged generation is published; `None` when there was nothing to merge
    /// (no generation, or one without tombstones), or when the list changed under the merge
    /// (a flush's earlier attempt took the version it was to be published at): call it again.
    /// Runs beside appends and queries; a background compaction under way finishes first. See
    /// [`Settings::compaction`].
    pub async fn compact(&self) -> Result<Option<CompactionReport>> {
        self.check_open()?;
        let compacted = compact::compact_once(&self.inner, compact::Pick::All).await;
        if compacted.as_ref().is_err_and(is_fenced) {
            self.inner.mark_fenced();
        }
        compacted
    }

    /// Whether a newer writer has fenced this one.
    pub fn is_fenced(&self) -> bool {
        self.inner.fenced.load(Ordering::SeqCst)
    }
}

search::impl_search!(Index);

impl Drop for Index {
    fn drop(&mut self) {
        // The committer stops when its queue closes (dropping `tx`); stop the flusher too.
        self.inner.closed.store(true, Ordering::SeqCst);
        self.collector.abort();
        self.compactor.abort();
        self.inner.flush_wake.notify_waiters();
        self.inner.backpressure.notify_waiters();
    }
}

/// Map an error kind for a whole group of callers.
pub(crate) fn is_fenced(e: &Error) -> bool {
    e.kind() == ErrorKind::Fenced
}
