//! What a writer's tasks share: the committer, the flusher, the compactor and the collection
//! (`crate::db` runs them), grouped by who uses what, and the one way a manifest version is
//! published ([`publish`]).

pub(crate) mod publish;

use crate::format::manifest::Manifest;
use crate::format::GenerationMeta;
use crate::gc::replaced::ReplacedGenerations;
use crate::gc::wal::KeptWal;
use crate::gc::Scope;
use crate::generation::Generation;
use crate::manifest::ManifestStore;
use crate::memtable::{read_memtable, MemtableView, SharedMemtable};
use crate::priority::Raisable;
use crate::query::reader::Reader;
use crate::read::Source;
use crate::schema::IndexSchema;
use crate::settings::Settings;
use crate::storage::paths::Paths;
use crate::storage::Location;
use crate::vector::MemGraphSpec;
use crate::{Error, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// What reads see: the latest manifest this writer installed and its memtables.
#[derive(Debug)]
pub(crate) struct State {
    pub manifest: Manifest,
    pub active: SharedMemtable,
    /// Oldest first.
    pub frozen: VecDeque<SharedMemtable>,
}

/// How far flushes got.
#[derive(Debug, Clone, Default)]
pub(crate) struct FlushStatus {
    pub flushed_upto: u64,
    /// The last failure, and how many flush attempts have failed so far: a `flush()` reports a
    /// failure only if it happened while it waited, never a stale one.
    pub error: Option<Error>,
    pub failures: u64,
}

/// What an open found: the manifest it claimed, the active memtable holding the rows replayed
/// from the WAL, the id the next WAL object gets and the highest sequence number assigned.
#[derive(Debug)]
pub(crate) struct Opened {
    pub manifest: Manifest,
    pub active: SharedMemtable,
    pub next_wal_id: u64,
    pub last_seq: u64,
}

/// The shared state of a writer.
#[derive(Debug)]
pub(crate) struct Writer {
    pub loc: Location,
    pub paths: Paths,
    pub manifests: ManifestStore,
    /// Schemas, settings, the generation cache (`manifest.generations` says which are
    /// current) and the live-row cache.
    pub reader: Reader,
    pub epoch: u64,
    pub state: RwLock<State>,
    pub fenced: AtomicBool,
    pub closed: AtomicBool,
    /// The committer's counters.
    pub log: Log,
    /// Flush progress, and the signals between the committer and the flusher.
    pub flushes: Flushes,
    /// Manifest publication, shared by flushes and compactions.
    pub publisher: Publisher,
    /// The compactor's state.
    pub compaction: Compaction,
    /// Wakes the reading ahead of superseded rows (rows were appended).
    pub read_ahead: Notify,
}

/// The committer's counters.
#[derive(Debug)]
pub(crate) struct Log {
    pub next_wal_id: AtomicU64,
    pub last_seq: AtomicU64,
    /// Microseconds the last group commit was delayed by pacing, and in total.
    pub append_delay_us: AtomicU64,
    pub append_delay_total_us: AtomicU64,
}

/// Flush progress, and the signals between the committer and the flusher.
#[derive(Debug)]
pub(crate) struct Flushes {
    pub status: watch::Sender<FlushStatus>,
    /// Wakes the flusher (a memtable was frozen).
    pub wake: Notify,
    /// Wakes a committer waiting for room in the queue of frozen memtables.
    pub backpressure: Notify,
    /// Milliseconds the last successful flush took.
    pub last_ms: AtomicU64,
    /// The WAL object the previous flush covered and kept.
    pub kept_wal: KeptWal,
}

/// Manifest publication (see [`publish`]).
#[derive(Debug)]
pub(crate) struct Publisher {
    /// Held while a manifest version is computed from the latest one, written and installed
    /// (flushes and compactions), so every publish starts from the latest version.
    pub lock: tokio::sync::Mutex<()>,
    /// A compaction's manifest whose PUT reported an error (it may have landed): settled
    /// before the next publish.
    unsure: Mutex<Option<Unsure>>,
    /// The id the next generation (flushed or merged) gets.
    pub next_generation_id: AtomicU64,
    /// The newest manifest version whose clean-up (LATEST moved, old versions pruned; best
    /// effort, so one that failed counts too) was not cut off, or the version opened:
    /// `close()` cleans up after a newer one ([`publish::finish_cut_off`]).
    pub cleaned_up: AtomicU64,
}

impl Publisher {
    /// The compaction manifest whose PUT's outcome is unknown, if any (see
    /// [`publish::settle`]).
    pub(crate) fn unsure(&self) -> MutexGuard<'_, Option<Unsure>> {
        self.unsure.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The compactor's state.
#[derive(Debug, Default)]
pub(crate) struct Compaction {
    /// Held by the compaction under way: one at a time.
    pub running: tokio::sync::Mutex<()>,
    /// The priority of the compaction under way when it runs in the background (a flush raises
    /// it when it becomes urgent).
    pub priority: Mutex<Option<Arc<Raisable>>>,
    /// Wakes the compactor (after a flush).
    pub wake: Notify,
    telemetry: Mutex<Telemetry>,
    /// Generations compactions replaced, awaiting deletion.
    pub replaced: ReplacedGenerations,
    /// The manifest version whose full generations were last sampled for a rewrite and held
    /// none (see `compaction::job::reclaim`): they are not sampled again until it changes.
    pub reclaim_checked: std::sync::atomic::AtomicU64,
}

/// What the compactions of this handle did.
#[derive(Debug, Default, Clone)]
pub(crate) struct Telemetry {
    pub last_ms: u64,
    pub compactions: u64,
    /// The last failure, if the compactions since have not succeeded.
    pub last_error: Option<Error>,
}

impl Compaction {
    pub(crate) fn telemetry(&self) -> MutexGuard<'_, Telemetry> {
        self.telemetry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record a compaction whose manifest is installed: the generations of `run` (`inputs`,
    /// the decoded ones this handle holds) await deletion after the grace period.
    pub(crate) fn published(
        &self,
        run: &[GenerationMeta],
        inputs: impl Iterator<Item = Weak<Generation>>,
        took: Duration,
    ) {
        self.replaced.add(run, inputs);
        let mut t = self.telemetry();
        t.last_ms = took.as_millis() as u64;
        t.compactions += 1;
        t.last_error = None;
    }
}

impl Writer {
    /// Assemble a writer's state after its open claimed the epoch of `opened.manifest`.
    pub(crate) fn new(
        loc: Location,
        paths: Paths,
        manifests: ManifestStore,
        reader: Reader,
        opened: Opened,
    ) -> Writer {
        let Opened {
            manifest,
            active,
            next_wal_id,
            last_seq,
        } = opened;
        let (status, _) = watch::channel(FlushStatus::default());
        // The object the previous writer's last flush kept (the last one below the replay
        // point, always a rows object): this writer's first flush deletes it.
        let kept_wal = manifest.wal_replay_from.checked_sub(1).filter(|id| *id > 0);
        let next_generation_id = manifest.next_generation_id;
        let opened_version = manifest.version;
        Writer {
            loc,
            paths,
            manifests,
            reader,
            epoch: manifest.epoch,
            state: RwLock::new(State {
                manifest,
                active,
                frozen: VecDeque::new(),
            }),
            fenced: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            log: Log {
                next_wal_id: AtomicU64::new(next_wal_id),
                last_seq: AtomicU64::new(last_seq),
                append_delay_us: AtomicU64::new(0),
                append_delay_total_us: AtomicU64::new(0),
            },
            flushes: Flushes {
                status,
                wake: Notify::new(),
                backpressure: Notify::new(),
                last_ms: AtomicU64::new(0),
                kept_wal: KeptWal::new(kept_wal),
            },
            publisher: Publisher {
                lock: tokio::sync::Mutex::new(()),
                unsure: Mutex::new(None),
                next_generation_id: AtomicU64::new(next_generation_id),
                cleaned_up: AtomicU64::new(opened_version),
            },
            compaction: Compaction::default(),
            read_ahead: Notify::new(),
        }
    }

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

    /// What garbage collection works on.
    pub(crate) fn gc_scope(&self) -> Scope<'_> {
        Scope {
            loc: &self.loc,
            paths: &self.paths,
            manifests: &self.manifests,
            epoch: self.epoch,
            concurrency: self.reader.settings.io_concurrency,
        }
    }

    pub(crate) fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// What a read started now sees: the active memtable, then the frozen ones (newest
    /// first), as sources, with the generations the manifest lists (oldest first).
    pub(crate) fn read_view(&self) -> (Vec<Source>, Vec<GenerationMeta>) {
        let st = self.read_state();
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
    }

    /// The generations the manifest lists (oldest first) and, with `keys`, the keys of the
    /// memtables (all newer than them: the active one, then the frozen ones newest first;
    /// see [`crate::memtable::Memtable::keys_view`]), read at once.
    pub(crate) fn listed_and_memtable_keys(
        &self,
        keys: bool,
    ) -> Result<(Vec<GenerationMeta>, Vec<MemtableView>)> {
        let st = self.read_state();
        let views = match keys {
            true => std::iter::once(&st.active)
                .chain(st.frozen.iter().rev())
                .map(|m| read_memtable(m).keys_view())
                .collect::<Result<_>>()?,
            false => Vec::new(),
        };
        Ok((st.manifest.generations.clone(), views))
    }

    pub(crate) fn write_state(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Fail with [`Writer::fenced_error`] once fenced, or as closed once closed.
    pub(crate) fn check_live(&self) -> Result<()> {
        if self.fenced.load(Ordering::SeqCst) {
            return Err(self.fenced_error());
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::closed());
        }
        Ok(())
    }

    pub(crate) fn mark_fenced(&self) {
        if !self.fenced.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                "writer of epoch {} on {} was fenced by a newer writer",
                self.epoch,
                self.loc.display
            );
        }
        self.flushes.wake.notify_waiters();
        self.compaction.wake.notify_one();
        self.flushes.backpressure.notify_waiters();
    }

    pub(crate) fn fenced_error(&self) -> Error {
        Error::fenced(format!(
            "a newer writer claimed the index at {}; this writer (epoch {}) acknowledges nothing more",
            self.loc.display, self.epoch
        ))
    }
}

/// A compaction's manifest whose PUT reported an error (it may have landed, or may still), with
/// the run it replaces: settled before anything else is published (see [`publish::settle`]), and
/// recorded as a compaction of this writer once it is.
#[derive(Debug, Clone)]
pub(crate) struct Unsure {
    pub(crate) manifest: Manifest,
    /// The generations it replaces.
    pub(crate) run: Vec<GenerationMeta>,
    /// Those of them this handle holds decoded.
    pub(crate) inputs: Vec<Weak<Generation>>,
    /// `(id, epoch)` of the merged generation, if any.
    pub(crate) merged: Option<(u64, u64)>,
    /// How long the compaction took up to its publication.
    pub(crate) took: Duration,
}

impl Unsure {
    /// Record the compaction as published (its manifest is installed).
    pub(crate) fn published(&self, w: &Writer) {
        w.compaction
            .published(&self.run, self.inputs.iter().cloned(), self.took);
    }

    /// The compaction published nothing: its merged generation is discarded.
    pub(crate) async fn given_up(&self, w: &Writer) {
        if let Some(merged) = self.merged {
            crate::gc::discard(&w.loc, &w.paths, &w.reader.generations, merged).await;
        }
    }
}

/// The vector graph a memtable of an index with `schema` keeps (none without a vector column).
pub(crate) fn mem_graph_spec(schema: &IndexSchema, settings: &Settings) -> Option<MemGraphSpec> {
    let (vcol, metric, params) = schema.vector_spec(settings)?;
    Some(MemGraphSpec {
        vcol,
        dim: schema.vector.as_ref()?.dim,
        metric,
        params,
        above: settings.memtable_graph_above,
    })
}

/// Whether `e` says a newer writer fenced this one.
pub(crate) fn is_fenced(e: &Error) -> bool {
    e.kind() == crate::ErrorKind::Fenced
}
