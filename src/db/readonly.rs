//! Read-only handles: any number of them, in any process, beside the one writer.

use super::stats::IndexStats;
use crate::format::manifest::Manifest;
use crate::manifest::ManifestStore;
use crate::memtable::Memtable;
use crate::query::reader::Reader;
use crate::read::{Snapshot, Source};
use crate::settings::Settings;
use crate::storage::paths::Paths;
use crate::storage::Location;
use crate::wal::{replay_listed, Mode};
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
struct View {
    manifest: Manifest,
    /// Rows of the WAL objects not yet covered by a generation.
    wal: Memtable,
    wal_objects: u64,
    /// The WAL id after the last object read: with the manifest version, how new the view is.
    wal_next: u64,
}

/// A read-only view of an index: the flushed generations of the newest manifest plus the rows
/// of the WAL objects written since. It never writes; [`ReadOnlyIndex::refresh`] moves it to the
/// newest manifest and WAL.
#[derive(Debug)]
pub struct ReadOnlyIndex {
    loc: Location,
    paths: Paths,
    manifests: ManifestStore,
    reader: Reader,
    /// Ids of the memtables holding the WAL rows of successive views (live rows are kept
    /// per memtable id).
    next_view_id: AtomicU64,
    view: std::sync::RwLock<View>,
    /// Held by a refresh: one at a time, so that new WAL objects join the view's memtable once.
    refreshing: tokio::sync::Mutex<()>,
    /// Refreshes begun, counted.
    refreshes_begun: AtomicU64,
    /// The count of the last refresh that succeeded, when it began: one that began after a
    /// caller arrived read everything written before it, and serves that caller too.
    refreshed: AtomicU64,
    /// Set by [`ReadOnlyIndex::close`]: reads are refused.
    closed: std::sync::atomic::AtomicBool,
}

impl ReadOnlyIndex {
    pub(crate) async fn open(loc: Location, settings: Settings) -> Result<Self> {
        settings.validate()?;
        let started = std::time::Instant::now();
        let paths = Paths::new(loc.root.clone());
        let manifests = ManifestStore::new(loc.store.clone(), paths.clone());
        // The newest manifest and the WAL's listing in one round.
        let (m, wal) = futures::try_join!(
            manifests.load_latest_for_reading(),
            crate::wal::list_from(&loc.store, &paths, 0)
        )?;
        let m = m.ok_or_else(|| Error::invalid(format!("no index at {}", loc.display)))?;
        let reader = Reader::new(&loc, &paths, m.schema.clone(), settings).await?;
        let handle = ReadOnlyIndex {
            view: std::sync::RwLock::new(View {
                manifest: m.clone(),
                wal: Memtable::new(0, reader.stored_schema.clone(), None, None)?,
                wal_objects: 0,
                wal_next: 0,
            }),
            loc,
            paths,
            manifests,
            reader,
            next_view_id: AtomicU64::new(1),
            refreshing: Default::default(),
            refreshes_begun: AtomicU64::new(0),
            refreshed: AtomicU64::new(0),
            closed: Default::default(),
        };
        let view = handle.load_view(Some((m, wal))).await?;
        tracing::debug!(
            "opened {} read-only in {:?}: {} generations, {} rows from the WAL",
            handle.loc.display,
            started.elapsed(),
            view.manifest.generations.len(),
            view.wal.rows()
        );
        *handle.view.write().unwrap_or_else(|e| e.into_inner()) = view;
        Ok(handle)
    }

    /// The newest manifest (or `listed`: a manifest and the WAL's ids listed beside its
    /// read), its generations (fetched into the cache) and the WAL written since: two rounds
    /// of requests, the manifest with the WAL's listing, then the generations' hot parts with
    /// the WAL objects.
    async fn load_view(&self, mut listed: Option<(Manifest, Vec<u64>)>) -> Result<View> {
        let r = &self.reader;
        let mut attempts = 0;
        loop {
            let (m, wal) = match listed.take() {
                Some(l) => l,
                None => {
                    // The replay point only moves forward: the listing starts at the view's.
                    let from = self
                        .view
                        .read()
                        .unwrap_or_else(|e| e.into_inner())
                        .manifest
                        .wal_replay_from;
                    let (m, wal) = futures::try_join!(
                        self.manifests.load_latest_for_reading(),
                        crate::wal::list_from(&self.loc.store, &self.paths, from)
                    )?;
                    let m = m.ok_or_else(|| {
                        Error::invalid(format!("no index at {}", self.loc.display))
                    })?;
                    (m, wal)
                }
            };
            let loaded = futures::try_join!(
                r.generations.get_all(&m.generations),
                replay_listed(
                    &self.loc.store,
                    &self.paths,
                    &r.stored_schema,
                    m.wal_replay_from,
                    Mode::ReadOnly,
                    r.settings.io_concurrency,
                    Some(wal)
                )
            );
            match loaded {
                Ok((_, replayed)) => {
                    let id = self.next_view_id.fetch_add(1, Ordering::Relaxed);
                    let mut wal =
                        Memtable::new(id, r.stored_schema.clone(), r.text_schema.as_ref(), None)?;
                    for (id, e) in replayed.entries {
                        if let Some(rows) = e.rows {
                            wal.apply(rows)?;
                        }
                        wal.add_wal_id(id);
                    }
                    return Ok(View {
                        wal_objects: replayed.next_id.saturating_sub(m.wal_replay_from),
                        wal_next: replayed.next_id,
                        manifest: m,
                        wal,
                    });
                }
                // A flush published a new manifest and deleted WAL objects (or the writer
                // pruned what we were reading) between our LIST and GET: start over. Real
                // damage persists and is reported after the retries.
                Err(e) if e.is_not_found() && attempts < 5 => attempts += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Move to the newest manifest and WAL. Cached generations are reused; those the newest
    /// manifest no longer lists (a compaction replaced them) leave the cache for good. A view
    /// never moves backwards: when a concurrent refresh already installed a newer view, this
    /// one keeps it.
    ///
    /// Only what is new is read: with the same manifest, the WAL objects written since the
    /// last refresh join the view's memtable (nothing is read when there are none); a new
    /// manifest loads a new view.
    ///
    /// Refreshes run one at a time; a call that arrives while one is under way waits for it
    /// and then shares the next (one that began after the call arrived), so any number of
    /// concurrent calls costs about two refreshes.
    pub async fn refresh(&self) -> Result<()> {
        let arrived = self.refreshes_begun.load(Ordering::SeqCst);
        let _one = self.refreshing.lock().await;
        if self.refreshed.load(Ordering::SeqCst) > arrived {
            return Ok(());
        }
        let number = self.refreshes_begun.fetch_add(1, Ordering::SeqCst) + 1;
        self.refresh_once().await?;
        self.refreshed.fetch_max(number, Ordering::SeqCst);
        Ok(())
    }

    /// One refresh (the caller holds `refreshing`).
    async fn refresh_once(&self) -> Result<()> {
        let (version, next) = {
            let v = self.view();
            (v.manifest.version, v.wal_next)
        };
        // The WAL past the view's, beside the newest manifest: with the same manifest, all
        // that is new.
        let (m, wal) = futures::try_join!(
            self.manifests.load_latest_for_reading(),
            crate::wal::list_from(&self.loc.store, &self.paths, next)
        )?;
        let m = m.ok_or_else(|| Error::invalid(format!("no index at {}", self.loc.display)))?;
        if m.version < version {
            return Ok(());
        }
        if m.version == version {
            let new: Vec<u64> = wal.iter().copied().filter(|id| *id >= next).collect();
            if new.is_empty() {
                return Ok(());
            }
            let r = &self.reader;
            match replay_listed(
                &self.loc.store,
                &self.paths,
                &r.stored_schema,
                next,
                Mode::ReadOnly,
                r.settings.io_concurrency,
                Some(new),
            )
            .await
            {
                Ok(replayed) => {
                    let mut v = self.view.write().unwrap_or_else(|e| e.into_inner());
                    for (id, e) in replayed.entries {
                        if let Some(rows) = e.rows {
                            v.wal.apply(rows)?;
                        }
                        v.wal.add_wal_id(id);
                        // What failed after this object is read again by the next refresh.
                        v.wal_next = id + 1;
                    }
                    v.wal_next = v.wal_next.max(replayed.next_id);
                    v.wal_objects = v.wal_next.saturating_sub(v.manifest.wal_replay_from);
                    return Ok(());
                }
                // A flush published a new manifest and deleted the objects between our LIST
                // and GET: load the new view.
                Err(e) if e.is_not_found() => {
                    return self.install(self.load_view(None).await?).await
                }
                Err(e) => return Err(e),
            }
        }
        // A new manifest: its WAL is listed from its replay point.
        let view = self.load_view(None).await?;
        self.install(view).await
    }

    /// Make `view` the handle's view, unless the current one is newer, and let go of the
    /// generations it no longer lists.
    async fn install(&self, view: View) -> Result<()> {
        // The view replaced (its WAL memtable and text index) is dropped at the end, after the
        // lock is released: searches wait for this lock on their thread.
        let (gone, _replaced): (Vec<(u64, u64)>, View) = {
            let mut current = self.view.write().unwrap_or_else(|e| e.into_inner());
            let newness = |v: &View| (v.manifest.version, v.wal_next);
            if newness(&view) < newness(&current) {
                return Ok(());
            }
            let listed: std::collections::HashSet<(u64, u64)> = view
                .manifest
                .generations
                .iter()
                .map(|g| (g.id, g.epoch))
                .collect();
            let gone = current
                .manifest
                .generations
                .iter()
                .map(|g| (g.id, g.epoch))
                .filter(|k| !listed.contains(k))
                .collect();
            (gone, std::mem::replace(&mut *current, view))
        };
        for (id, epoch) in gone {
            self.reader.generations.retire(id, epoch).await;
        }
        Ok(())
    }

    /// Close the handle: later reads fail with a `Closed` error, and the block cache writes
    /// the blocks its memory holds to its disk tier (when [`crate::Settings::cache_dir`] gives
    /// one) so that the next handle opened on the same directory finds them. Closing twice
    /// does nothing more.
    pub async fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.reader.generations.close().await
    }

    fn view(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(|e| e.into_inner())
    }

    /// What a read started now sees: the WAL's rows, then the generations. When a generation
    /// of the view is gone (a compaction replaced it and its grace period passed), the view
    /// moves to the newest manifest first.
    async fn snapshot(&self) -> Result<Snapshot> {
        let mut attempts = 0;
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return Err(Error::closed());
            }
            let (wal, metas) = {
                let v = self.view();
                (v.wal.search_view(), v.manifest.generations.clone())
            };
            match self
                .reader
                .snapshot(vec![Source::memtable("wal", wal)], &metas)
                .await
            {
                Err(e) if e.is_not_found() && attempts < 3 => {
                    attempts += 1;
                    self.refresh().await?;
                }
                other => return other,
            }
        }
    }

    /// Whether a read that failed with `e` starts over: a generation object of its view was
    /// deleted while it read it by range (a compaction replaced it and its grace period
    /// passed), so the view moves to the newest manifest first. At most three times.
    async fn retry_gone(&self, e: &Error, attempts: &mut u32) -> Result<bool> {
        if !e.is_not_found() || *attempts >= 3 {
            return Ok(false);
        }
        *attempts += 1;
        self.refresh().await?;
        Ok(true)
    }

    super::search::read_methods!(reader);

    /// Figures of the view.
    pub fn stats(&self) -> IndexStats {
        let v = self.view();
        IndexStats {
            location: self.loc.display.clone(),
            epoch: v.manifest.epoch,
            manifest_version: v.manifest.version,
            generations: v.manifest.generations.clone(),
            memtable_rows: v.wal.rows(),
            memtable_graph_rows: 0,
            frozen_rows: 0,
            frozen_memtables: 0,
            wal_objects_pending: v.wal_objects,
            last_seq: v.manifest.last_seq.max(v.wal.max_seq()),
            unindexed_rows: v.wal.unindexed_rows(),
            last_flush_ms: 0,
            append_delay_ms: 0.0,
            append_delay_total_ms: 0.0,
            compaction_debt_rows: 0,
            bytes_reclaimable: 0,
            last_compaction_ms: 0,
            compactions: 0,
            compaction_error: None,
        }
    }
}

super::search::impl_search!(ReadOnlyIndex);
