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
#[cfg(test)]
mod fixtures;
mod flush;
mod pace;
mod readonly;
mod search;
mod stats;

pub use commit::WriteReceipt;
pub use readonly::ReadOnlyIndex;
pub use search::Search;
pub use stats::IndexStats;

use crate::compaction::job::{compact_once, Pick};
use crate::compaction::policy::debt;
use crate::compaction::schedule::run_compactor;
use crate::compaction::CompactionReport;
use crate::format::manifest::Manifest;
use crate::gc;
use crate::key::Key;
use crate::manifest::{ManifestStore, WriteOutcome};
use crate::memtable::{catch_up, read_memtable, Memtable};
use crate::query::reader::Reader;
use crate::read::Snapshot;
use crate::schema::IndexSchema;
use crate::settings::{Settings, WriteOptions};
use crate::storage::paths::Paths;
use crate::storage::{check_conditional_create, Location};
use crate::wal::{replay, Mode};
use crate::writer::{is_fenced, mem_graph_spec, Opened, Writer};
use crate::{Error, Result};
use arrow::array::RecordBatch;
use commit::{Request, WriteRows};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tokio::sync::{mpsc, oneshot};

/// The newest manifest at `loc`; `Invalid` when there is no index there.
async fn latest_manifest(manifests: &ManifestStore, loc: &Location) -> Result<Manifest> {
    manifests
        .load_latest()
        .await?
        .ok_or_else(|| Error::invalid(format!("no index at {} (create it first)", loc.display)))
}

/// What a writer's open claimed: the manifest version it created (a new epoch), the reader it
/// checked the generations with, how many there are, and the WAL objects it read.
struct Claimed {
    manifest: Manifest,
    reader: Reader,
    generations: usize,
    checked: crate::wal::Replayed,
}

/// Read and check every generation (through the handle's cache) and every WAL object first,
/// then claim epoch + 1 with a conditional PUT of the next manifest version: an open that fails
/// on a bad generation or WAL object fails before it fences the running writer, which may
/// still hold those rows in memory and flush them.
async fn claim(
    loc: &Location,
    paths: &Paths,
    manifests: &ManifestStore,
    settings: &Settings,
) -> Result<Claimed> {
    let mut reader: Option<Reader> = None;
    loop {
        let cur = latest_manifest(manifests, loc).await?;
        if reader.is_none() {
            reader = Some(Reader::new(loc, paths, cur.schema.clone(), settings.clone()).await?);
        }
        let r = reader.as_ref().expect("just set");
        let generations = match r.generations.get_all(&cur.generations).await {
            Ok(g) => g.len(),
            // A compaction of the running writer replaced it and deleted it (its grace period
            // was shorter than this gap) after the list was read: start again on the newer
            // list. Otherwise the object really is missing.
            Err(e) if e.is_not_found() => {
                let newest = manifests.load_latest().await?;
                // Every generation of the list still listed: the missing one is named by the
                // newest version, the object really is missing.
                let replaced = newest
                    .is_some_and(|n| cur.generations.iter().any(|g| !n.generations.contains(g)));
                if !replaced {
                    return Err(e);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        let checked = match replay(
            &loc.store,
            paths,
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
        // The claim succeeds only if no version was published since `cur`, so no flush freed
        // the objects just read.
        if let WriteOutcome::Written = manifests.write(&next).await? {
            let reader = reader.ok_or_else(|| Error::internal("no reader after the claim"))?;
            return Ok(Claimed {
                manifest: next,
                reader,
                generations,
                checked,
            });
        }
    }
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

/// The writer of an index. Cheap to share behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Index {
    inner: Arc<Writer>,
    tx: mpsc::Sender<Request>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The leak collection started at open (`gc::leaks`).
    collector: tokio::task::JoinHandle<()>,
    /// The background compactor (`compaction::schedule`): stopped by `close()`, which waits
    /// until it has stopped (not until it finishes); a compaction cut off publishes nothing or
    /// a complete manifest version, which `close()` then settles and cleans up after
    /// (`writer::publish::finish_cut_off`). Taken by `close()`.
    compactor: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The reading ahead of superseded rows ([`read_ahead`]): stopped, not awaited.
    read_ahead: tokio::task::JoinHandle<()>,
}

/// Read ahead, after appends, the text of the generations' rows they supersede, for the
/// full-text searches that take them out of the statistics (see
/// [`crate::Settings::dead_row_terms_bytes`]); best effort. Appends that arrive meanwhile
/// wake it once more.
async fn read_ahead(inner: Arc<Writer>) {
    // A failure is a warning once, until a round succeeds again.
    let mut failing = false;
    loop {
        inner.read_ahead.notified().await;
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        if !inner.reader.caches.dead.reads_ahead() {
            continue;
        }
        let read = match writer_snapshot(&inner, false).await {
            Ok(snapshot) => {
                let w = inner.clone();
                let stopped = move || w.closed.load(Ordering::SeqCst);
                inner.reader.read_dead_rows_ahead(snapshot, stopped).await
            }
            Err(e) => Err(e),
        };
        match read {
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(
                    "reading superseded rows ahead failed (searches will read them): {e}"
                );
            }
            Err(e) => tracing::debug!("reading superseded rows ahead failed again: {e}"),
            Ok(()) => failing = false,
        }
    }
}

/// What a read started now sees: the active memtable, the frozen ones (newest first) and the
/// generations of the writer's manifest; a search's (`retain`) drops what the caches keep for
/// sources it does not hold.
async fn writer_snapshot(inner: &Writer, retain: bool) -> Result<Snapshot> {
    let (memtables, metas) = inner.read_view();
    match retain {
        true => inner.reader.snapshot(memtables, &metas).await,
        false => inner.reader.snapshot_keeping(memtables, &metas).await,
    }
}

/// Whether an index exists at `loc` (it has a manifest version).
pub(crate) async fn index_exists(loc: &Location) -> Result<bool> {
    let manifests = ManifestStore::new(loc.store.clone(), Paths::new(loc.root.clone()));
    Ok(manifests.latest_version().await?.is_some())
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
        manifests.publish_hint(&m).await;
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
        let claimed = claim(&loc, &paths, &manifests, &settings).await?;
        let manifest = claimed.manifest;
        let reader = claimed.reader;
        manifests.publish_hint(&manifest).await;
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
                claimed.checked.next_id,
                Mode::Writer { epoch },
                settings.io_concurrency,
            )
        );
        let replayed = replayed?;
        let entries = claimed.checked.entries.into_iter().chain(replayed.entries);
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
            claimed.generations,
            mem.rows()
        );
        let opened = Opened {
            manifest,
            active: Arc::new(RwLock::new(mem)),
            next_wal_id: replayed.next_id,
            last_seq,
        };
        Ok(Self::start(Arc::new(Writer::new(
            loc, paths, manifests, reader, opened,
        ))))
    }

    /// Start the writer's tasks: the committer, the flusher, the compactor and the collection
    /// of leaks.
    fn start(inner: Arc<Writer>) -> Index {
        // The manifest the open claimed, read before any task can publish another: leak
        // collection judges what is garbage by the versions kept from it on.
        let opened_on = inner.read_state().manifest.clone();
        let (tx, rx) = mpsc::channel(1024);
        let (last_seq, next_wal_id) = (
            inner.log.last_seq.load(Ordering::SeqCst),
            inner.log.next_wal_id.load(Ordering::SeqCst),
        );
        let committer = commit::Committer::new(inner.clone(), rx, last_seq + 1, next_wal_id);
        let tasks = vec![
            tokio::spawn(committer.run()),
            tokio::spawn(flush::run_flusher(inner.clone())),
        ];
        let compactor = tokio::spawn(run_compactor(inner.clone()));
        let read_ahead = tokio::spawn(read_ahead(inner.clone()));
        // Leak collection is best effort: close() and drop stop it wherever it is.
        let w = inner.clone();
        let collector = tokio::spawn(async move {
            let found = gc::leaks::collect(w.gc_scope(), &opened_on).await;
            w.compaction.replaced.add_found(&found);
        });
        catch_up(&inner.read_state().active);
        Index {
            inner,
            tx,
            tasks: std::sync::Mutex::new(tasks),
            collector,
            compactor: std::sync::Mutex::new(Some(compactor)),
            read_ahead,
        }
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

    /// A point in time of what this writer holds, for a reader that must not see less than
    /// every acknowledged write: a `Fenced` error when a newer writer has claimed the index
    /// (which this writer only learns from its next write otherwise). Taken first, then checked
    /// against the newest manifest (the hint and a LIST): a newer writer acknowledges nothing
    /// before its manifest is published, so a point in time taken before a check that finds
    /// this writer's epoch holds every write acknowledged until then.
    pub(crate) async fn current_point_in_time(&self) -> Result<crate::PointInTime> {
        let pit = self.point_in_time().await?;
        let newest = self.inner.manifests.load_latest_for_reading().await?;
        match newest {
            Some(m) if m.epoch > self.inner.epoch => Err(self.inner.fenced_error()),
            _ if self.inner.fenced.load(Ordering::SeqCst) => Err(self.inner.fenced_error()),
            _ => Ok(pit),
        }
    }

    fn check_open(&self) -> Result<()> {
        self.inner.check_live()
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
        let mut rx = self.inner.flushes.status.subscribe();
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
        let compactor = self.stop_compactor();
        self.read_ahead.abort();
        self.inner.flushes.wake.notify_waiters();
        self.inner.flushes.backpressure.notify_waiters();
        // Wake flush() callers, which see the handle closed.
        self.inner.flushes.status.send_modify(|_| {});
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
        // The compactor was stopped, maybe in the midst of publishing. An abort takes effect
        // when the poll under way on another thread ends, which may still take the publish
        // lock and PUT a manifest: once it has ended, finish what the compactor cut off.
        if let Some(c) = compactor {
            // Cancelled (or panicked): nothing it did is left to report.
            let _ = c.await;
        }
        crate::writer::publish::finish_cut_off(&self.inner).await;
        self.inner.reader.generations.close().await?;
        last_write
    }

    /// Abort the background compactor (once): its handle, for `close()` to wait until it has
    /// stopped.
    fn stop_compactor(&self) -> Option<tokio::task::JoinHandle<()>> {
        let compactor = self
            .compactor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(c) = &compactor {
            c.abort();
        }
        compactor
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

    /// Whether a read that failed with `e` starts over: a generation object was deleted while
    /// it read it by range (a compaction replaced it and its grace period passed while a query
    /// of a list that still names it read it, or it was removed by another process); the new
    /// snapshot no longer names it. At most three times; streamed reads do not start over.
    async fn retry_gone(&self, e: &Error, attempts: &mut u32) -> Result<bool> {
        if !e.is_not_found() || *attempts >= 3 {
            return Ok(false);
        }
        *attempts += 1;
        Ok(true)
    }

    async fn try_snapshot(&self) -> Result<Snapshot> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(Error::closed());
        }
        writer_snapshot(&self.inner, true).await
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
                .log
                .next_wal_id
                .load(Ordering::SeqCst)
                .saturating_sub(st.manifest.wal_replay_from),
            last_seq: self.inner.log.last_seq.load(Ordering::SeqCst),
            unindexed_rows: 0,
            last_flush_ms: self.inner.flushes.last_ms.load(Ordering::Relaxed),
            append_delay_ms: self.inner.log.append_delay_us.load(Ordering::Relaxed) as f64 / 1e3,
            append_delay_total_ms: self.inner.log.append_delay_total_us.load(Ordering::Relaxed)
                as f64
                / 1e3,
            compaction_debt_rows: 0,
            bytes_reclaimable: 0,
            last_compaction_ms: 0,
            compactions: 0,
            compaction_error: None,
        };
        drop(st);
        let c = self.inner.compaction.telemetry().clone();
        let settings = &self.inner.reader.settings;
        IndexStats {
            unindexed_rows: self.inner.unindexed_rows(),
            compaction_debt_rows: debt(
                &stats.generations,
                settings.compaction_fanout,
                settings.compaction_max_generations,
                settings.compaction_max_rows as u64,
            ),
            bytes_reclaimable: self.inner.compaction.replaced.bytes(),
            last_compaction_ms: c.last_ms,
            compactions: c.compactions,
            compaction_error: c.last_error.as_ref().map(|e| e.to_string()),
            ..stats
        }
    }

    /// Merge the generations now (superseded versions and tombstones dropped) into as few as
    /// [`Settings::compaction_max_rows`] allows (one, unless the index holds more rows than
    /// that), oldest runs first, and wait until each merged generation is published. The
    /// report sums the merges; `None` when there was nothing to merge (no generation, one
    /// without tombstones, or none that fit together), or when the list changed under the
    /// first merge (a flush's earlier attempt took the version it was to be published at):
    /// call it again. Runs beside appends and queries; a background compaction under way
    /// finishes first. See [`Settings::compaction`].
    pub async fn compact(&self) -> Result<Option<CompactionReport>> {
        self.check_open()?;
        let mut total: Option<CompactionReport> = None;
        // The generations present now: under appends, the merges end.
        let last = self
            .inner
            .read_state()
            .manifest
            .generations
            .iter()
            .map(|g| g.max_seq)
            .max()
            .unwrap_or(0);
        loop {
            let compacted = compact_once(&self.inner, Pick::All(last)).await;
            if compacted.as_ref().is_err_and(is_fenced) {
                self.inner.mark_fenced();
            }
            let Some(r) = compacted? else {
                return Ok(total);
            };
            total = Some(match total {
                None => r,
                Some(t) => CompactionReport {
                    generations_before: t.generations_before,
                    generations_after: r.generations_after,
                    rows_in: t.rows_in + r.rows_in,
                    rows_out: t.rows_out + r.rows_out,
                    bytes_in: t.bytes_in + r.bytes_in,
                    bytes_out: t.bytes_out + r.bytes_out,
                    millis: t.millis + r.millis,
                },
            });
        }
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
        self.stop_compactor();
        self.read_ahead.abort();
        self.inner.flushes.wake.notify_waiters();
        self.inner.flushes.backpressure.notify_waiters();
    }
}
