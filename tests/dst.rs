//! Deterministic simulation: a seeded run of a writer appending and deleting (durable and
//! buffered) over a small key space, flushing, compacting (in the background and on demand,
//! with a small generation cap), closing and reopening, crashing (its store dies at a random
//! request: a crash between any two requests, mid-flush, mid-compaction or mid-open included)
//! and restarting from the store, a second writer taking over while the first still runs (which
//! must then acknowledge nothing), and read-only handles opening and refreshing; every process
//! talks to the store through its own `SimStore`, which adds latency, fails requests, reports
//! errors for PUTs that landed (ambiguous outcomes), and fails manifest PUTs more often, some
//! of them landing later.
//!
//! Every read is checked against a model of each key's history: what it returns for a key is
//! the newest version acknowledged (durably, or on this handle) or something written after it
//! whose outcome is unknown; never an older version (no stale row), never nothing when a version
//! was acknowledged (never short), and never a write made by a writer after it was taken over.
//!
//! Liveness is checked too: once the faults stop, the writer's append and `flush()` complete
//! within [`LIVENESS`], and the generation count goes back under the cap (with compaction on).
//! A stuck writer is a violation like a lost write.
//!
//! `cargo test --test dst` runs 200 seeds; `LSMSEARCH_DST_SEEDS=N` (and `LSMSEARCH_DST_FIRST`,
//! `LSMSEARCH_DST_THREADS`) run more; `LSMSEARCH_DST_SEED=S` replays one, printing its steps. Fault decisions come from
//! the seed; the interleaving of background flushes with the steps depends on timing, so a
//! replay reproduces the same operations and faults, and most often the same interleaving.

mod common;

use common::sim::{Faults, SimStore};
use common::*;
use lsmsearch::{
    Durability, ErrorKind, Index, Key, Location, ReadOnlyIndex, ScanOptions, Settings, WriteOptions,
};
use object_store::memory::InMemory;
use object_store::ObjectStore;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

const KEYS: usize = 12;
const STEPS: usize = 60;
const SEED_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);
/// How long a writer may take, once the faults stop, to acknowledge an append, to finish a
/// flush, and to bring its generations back under the cap (the compactor backs off for at most
/// 30 s after failures).
const LIVENESS: std::time::Duration = std::time::Duration::from_secs(60);

/// Figures of a run: seeds in which the writer reached the generation cap, compactions
/// published, liveness checks passed.
static AT_CAP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static COMPACTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static LIVE_CHECKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Acknowledged by a durable append, or a buffered one a later durable step covered.
    Durable,
    /// Acknowledged as buffered by writer `n`, not yet known to be in the WAL.
    Pending(u32),
    /// Outcome unknown (failed, or buffered by a writer that died): may or may not exist.
    Maybe,
    /// Made by a writer that was taken over: must never be visible.
    Never,
}

#[derive(Debug, Clone)]
struct Write {
    step: usize,
    value: Option<Row>,
    status: Status,
}

#[derive(Default)]
struct History {
    keys: BTreeMap<String, Vec<Write>>,
}

impl History {
    fn record(&mut self, step: usize, key: &str, value: Option<Row>, status: Status) {
        self.keys.entry(key.to_string()).or_default().push(Write {
            step,
            value,
            status,
        });
    }

    fn promote(&mut self, writer: u32, to: Status) {
        for w in self.keys.values_mut().flatten() {
            if w.status == Status::Pending(writer) {
                w.status = to;
            }
        }
    }

    /// Check what a read returned. `floor` says which statuses a version must have to be
    /// required (the newest such version, or something written after it, must be returned).
    fn check(&self, found: &Model, floor: &dyn Fn(Status) -> bool) -> Result<(), String> {
        for (k, f) in found {
            if !self.keys.contains_key(k) {
                return Err(format!("key {k} was never written: {f:?}"));
            }
        }
        for (k, writes) in &self.keys {
            let got = found.get(k);
            let from = writes.iter().rposition(|w| floor(w.status));
            let candidates: Vec<&Write> = match from {
                Some(i) => writes[i..].iter().collect(),
                None => writes.iter().collect(),
            };
            let ok = candidates
                .iter()
                .filter(|w| w.status != Status::Never)
                .any(|w| w.value.as_ref() == got)
                || (from.is_none() && got.is_none());
            if !ok {
                let history: Vec<String> = writes
                    .iter()
                    .map(|w| {
                        format!(
                            "step {} {:?} {}",
                            w.step,
                            w.status,
                            w.value
                                .as_ref()
                                .map_or("delete".into(), |r| format!("v{}", r.year))
                        )
                    })
                    .collect();
                return Err(format!(
                    "key {k}: read {:?}, history [{}]",
                    got.map(|r| r.year),
                    history.join(", ")
                ));
            }
        }
        Ok(())
    }
}

struct Writer {
    id: u32,
    index: Index,
    store: Arc<SimStore>,
}

struct Sim {
    rng: StdRng,
    shared: Arc<dyn ObjectStore>,
    history: History,
    writer: Option<Writer>,
    /// A writer taken over by `writer`, still running: everything it does must fail.
    zombie: Option<Writer>,
    readers: Vec<(ReadOnlyIndex, Arc<SimStore>)>,
    next_writer: u32,
    next_version: i64,
    faults: Faults,
    settings: Settings,
    verbose: bool,
    log: Arc<std::sync::Mutex<Vec<String>>>,
    /// The writer reached the generation cap at some step.
    hit_cap: bool,
    /// Compactions published by writers that are gone.
    compactions: u64,
}

fn write_error_ok(e: &lsmsearch::Error) -> Result<(), String> {
    match e.kind() {
        ErrorKind::Unavailable | ErrorKind::Fenced | ErrorKind::Closed => Ok(()),
        _ => Err(format!("a write failed with {:?}: {e}", e.kind())),
    }
}

fn read_error_ok(e: &lsmsearch::Error) -> Result<(), String> {
    match e.kind() {
        ErrorKind::Unavailable | ErrorKind::Fenced | ErrorKind::Closed => Ok(()),
        _ => Err(format!("a read failed with {:?}: {e}", e.kind())),
    }
}

impl Sim {
    fn note(&mut self, s: String) {
        if self.verbose {
            println!("{s}");
        }
        self.log.lock().unwrap().push(s);
    }

    fn location(&self, store: &Arc<SimStore>) -> Location {
        Location::from_store(store.clone() as Arc<dyn ObjectStore>, "idx")
    }

    fn process_store(&mut self) -> Arc<SimStore> {
        SimStore::new(self.shared.clone(), self.rng.random(), self.faults)
    }

    /// Open a writer, retrying through injected failures.
    async fn open_writer(&mut self) -> Result<Writer, String> {
        for attempt in 0..50 {
            // An open makes dozens of requests: past a few attempts, let one through (this
            // tests safety, not how many failures an open survives).
            let store = if attempt < 10 {
                self.process_store()
            } else {
                SimStore::new(self.shared.clone(), self.rng.random(), Faults::NONE)
            };
            match Index::open(self.location(&store), self.settings.clone()).await {
                Ok(index) => {
                    self.next_writer += 1;
                    let w = Writer {
                        id: self.next_writer,
                        index,
                        store,
                    };
                    self.note(format!(
                        "writer {} opened (epoch {})",
                        w.id,
                        w.index.epoch()
                    ));
                    return Ok(w);
                }
                Err(e) if e.kind() == ErrorKind::Unavailable || e.kind() == ErrorKind::Fenced => {
                    store.kill();
                }
                Err(e) => return Err(format!("open failed with {:?}: {e}", e.kind())),
            }
        }
        Err("no open succeeded in 50 attempts".into())
    }

    /// A version of `key` no other write has (rows are derived from key and version).
    fn value(&mut self, key: &str, _step: usize) -> Row {
        self.next_version += 1;
        Row::new(key, self.next_version)
    }

    async fn step(&mut self, step: usize) -> Result<(), String> {
        let roll = self.rng.random_range(0..110);
        if self.writer.is_none() {
            let w = self.open_writer().await?;
            self.writer = Some(w);
            return self.check_writer("after a restart").await;
        }
        let r = match roll {
            0..=39 => self.append(step).await,
            40..=47 => self.delete(step).await,
            48..=57 => self.flush().await,
            58..=63 => self.compact().await,
            64..=67 => self.liveness(step).await,
            68..=77 => self.check_writer("read").await,
            78..=87 => self.read_only().await,
            88..=93 => self.crash(step).await,
            94..=98 => self.takeover().await,
            99..=103 => self.close_and_reopen().await,
            _ => self.zombie_write(step).await,
        };
        if let Some(w) = &self.writer {
            let cap = self.settings.compaction_max_generations;
            if self.open_generations(&w.index) >= cap {
                self.hit_cap = true;
            }
        }
        r
    }

    /// Everything the writer does (before it goes) that the run's figures count.
    fn retire(&mut self, w: &Writer) {
        self.compactions += w.index.stats().compactions;
    }

    async fn compact(&mut self) -> Result<(), String> {
        let w = self.writer.as_ref().expect("a writer");
        let r = w.index.compact().await;
        let id = w.id;
        if let Err(e) = &r {
            write_error_ok(e)?;
        }
        self.note(format!(
            "writer {id} compacts -> {:?}",
            r.map(|r| r.map(|r| (r.generations_before, r.generations_after)))
                .map_err(|e| e.kind())
        ));
        Ok(())
    }

    /// The faults stop for the writer: an append and a flush complete, and (compaction on) the
    /// generations go back under the cap, all within [`LIVENESS`]; then the faults resume.
    /// Requests already under way when the faults stop may still fail (their fate was drawn
    /// before): a failed append or flush is retried, and only the outcome at the deadline
    /// counts.
    async fn liveness(&mut self, step: usize) -> Result<(), String> {
        let (id, faults) = {
            let w = self.writer.as_ref().expect("a writer");
            (w.id, w.store.faults())
        };
        self.writer
            .as_ref()
            .expect("a writer")
            .store
            .set_faults(Faults::NONE);
        let started = Instant::now();
        let left = || LIVENESS.saturating_sub(started.elapsed());
        let mut attempt = 0;
        loop {
            let key = format!("k{:02}", self.rng.random_range(0..KEYS));
            let row = self.value(&key, step);
            let w = self.writer.as_ref().expect("a writer");
            let appended = tokio::time::timeout(
                left(),
                w.index
                    .append(&batch(&schema(), std::slice::from_ref(&row))),
            )
            .await;
            match appended {
                Ok(Ok(_)) => {
                    self.history.record(step, &key, Some(row), Status::Durable);
                    self.history.promote(id, Status::Durable);
                    break;
                }
                // Only failures of the store's requests may clear up: a fenced or closed
                // writer never recovers.
                Ok(Err(e))
                    if started.elapsed() < LIVENESS && e.kind() == ErrorKind::Unavailable =>
                {
                    self.history.record(step, &key, Some(row), Status::Maybe);
                }
                Ok(Err(e)) => {
                    self.history.record(step, &key, Some(row), Status::Maybe);
                    return Err(format!(
                        "writer {id}: appends without faults fail ({:?} after {:?}): {e}",
                        e.kind(),
                        started.elapsed()
                    ));
                }
                Err(_) => {
                    self.history.record(step, &key, Some(row), Status::Maybe);
                    return Err(format!(
                        "writer {id} is stuck: an append without faults took over {LIVENESS:?}"
                    ));
                }
            }
            attempt += 1;
            tokio::time::sleep(std::time::Duration::from_millis(20 * attempt.min(10))).await;
        }
        let mut attempt = 0;
        loop {
            let w = self.writer.as_ref().expect("a writer");
            match tokio::time::timeout(left(), w.index.flush()).await {
                Ok(Ok(())) => break,
                Ok(Err(e))
                    if started.elapsed() < LIVENESS && e.kind() == ErrorKind::Unavailable => {}
                Ok(Err(e)) => {
                    return Err(format!(
                        "writer {id}: flushes without faults fail ({:?} after {:?}): {e}",
                        e.kind(),
                        started.elapsed()
                    ))
                }
                Err(_) => {
                    return Err(format!(
                        "writer {id} is stuck: a flush without faults took over {LIVENESS:?}"
                    ))
                }
            }
            attempt += 1;
            tokio::time::sleep(std::time::Duration::from_millis(20 * attempt.min(10))).await;
        }
        let w = self.writer.as_ref().expect("a writer");
        let cap = self.settings.compaction_max_generations;
        // The cap applies to the open generations (under half of `compaction_max_rows`).
        let mut gens = self.open_generations(&w.index);
        if self.settings.compaction {
            while gens >= cap && started.elapsed() < LIVENESS {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                gens = self.open_generations(&w.index);
            }
            if gens >= cap {
                return Err(format!(
                    "writer {id} is stuck at {gens} generations (cap {cap}) {LIVENESS:?} after \
                     the faults stopped"
                ));
            }
        }
        w.store.set_faults(faults);
        LIVE_CHECKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.note(format!(
            "step {step}: writer {id} without faults: append and flush in {:?}, {gens} \
             generations",
            started.elapsed()
        ));
        Ok(())
    }

    /// Generations under half of `compaction_max_rows`: those the cap on the count applies to.
    fn open_generations(&self, index: &Index) -> usize {
        let max = self.settings.compaction_max_rows as u64;
        index
            .stats()
            .generations
            .iter()
            .filter(|g| g.rows * 2 < max)
            .count()
    }

    async fn append(&mut self, step: usize) -> Result<(), String> {
        let n = self.rng.random_range(1..=4);
        let mut keys: Vec<String> = (0..n)
            .map(|_| format!("k{:02}", self.rng.random_range(0..KEYS)))
            .collect();
        keys.sort();
        keys.dedup();
        let rows: Vec<Row> = keys.iter().map(|k| self.value(k, step)).collect();
        let durable = self.rng.random_bool(0.6);
        let w = self.writer.as_ref().expect("a writer");
        let opts = WriteOptions::with_durability(if durable {
            Durability::Durable
        } else {
            Durability::Buffered
        });
        let r = w.index.append_with(&batch(&schema(), &rows), opts).await;
        let id = w.id;
        let status = match &r {
            Ok(_) if durable => Status::Durable,
            Ok(_) => Status::Pending(id),
            Err(e) => {
                write_error_ok(e)?;
                Status::Maybe
            }
        };
        if durable && r.is_ok() {
            // The group commit wrote this handle's buffered rows with it.
            self.history.promote(id, Status::Durable);
        }
        for r in &rows {
            self.history.record(step, &r.id, Some(r.clone()), status);
        }
        self.note(format!(
            "step {step}: writer {id} appends {keys:?} {} -> {:?}",
            if durable { "durable" } else { "buffered" },
            r.as_ref().map(|_| ()).map_err(|e| e.kind())
        ));
        Ok(())
    }

    async fn delete(&mut self, step: usize) -> Result<(), String> {
        let key = format!("k{:02}", self.rng.random_range(0..KEYS));
        let w = self.writer.as_ref().expect("a writer");
        let r = w.index.delete(&[Key::from(key.as_str())]).await;
        let id = w.id;
        let status = match &r {
            Ok(_) => Status::Durable,
            Err(e) => {
                write_error_ok(e)?;
                Status::Maybe
            }
        };
        if r.is_ok() {
            self.history.promote(id, Status::Durable);
        }
        self.history.record(step, &key, None, status);
        self.note(format!(
            "step {step}: writer {id} deletes {key} -> {:?}",
            r.as_ref().map(|_| ()).map_err(|e| e.kind())
        ));
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), String> {
        let w = self.writer.as_ref().expect("a writer");
        let r = w.index.flush().await;
        let id = w.id;
        match &r {
            Ok(()) => self.history.promote(id, Status::Durable),
            Err(e) => write_error_ok(e)?,
        }
        self.note(format!(
            "writer {id} flushes -> {:?}",
            r.map_err(|e| e.kind())
        ));
        Ok(())
    }

    async fn check_writer(&mut self, what: &str) -> Result<(), String> {
        let w = self.writer.as_ref().expect("a writer");
        let id = w.id;
        match w.index.scan(ScanOptions::default()).await {
            Ok(b) => {
                let found = to_model(&b);
                self.history
                    .check(&found, &|s| {
                        s == Status::Durable || s == Status::Pending(id)
                    })
                    .map_err(|e| format!("writer {id} {what}: {e}"))?;
                self.note(format!(
                    "writer {id} {what}: {} live rows, as the model allows",
                    found.len()
                ));
            }
            Err(e) => read_error_ok(&e)?,
        }
        Ok(())
    }

    async fn read_only(&mut self) -> Result<(), String> {
        let fresh = self.readers.is_empty() || self.rng.random_bool(0.3);
        self.read_only_with(fresh).await
    }

    async fn read_only_fresh(&mut self) -> Result<(), String> {
        self.read_only_with(true).await
    }

    async fn read_only_with(&mut self, fresh: bool) -> Result<(), String> {
        if fresh {
            let store = self.process_store();
            match Index::open_read_only(self.location(&store), self.settings.clone()).await {
                Ok(r) => self.readers.push((r, store)),
                Err(e) => return read_error_ok(&e),
            }
            if self.readers.len() > 3 {
                self.readers.remove(0);
            }
        } else {
            let i = self.rng.random_range(0..self.readers.len());
            if let Err(e) = self.readers[i].0.refresh().await {
                return read_error_ok(&e);
            }
            let r = self.readers.remove(i);
            self.readers.push(r);
        }
        let (reader, _) = self.readers.last().expect("a reader");
        match reader.scan(ScanOptions::default()).await {
            Ok(b) => {
                let found = to_model(&b);
                self.history
                    .check(&found, &|s| s == Status::Durable)
                    .map_err(|e| format!("read-only handle: {e}"))?;
                self.note(format!(
                    "read-only handle: {} live rows, as the model allows",
                    found.len()
                ));
                Ok(())
            }
            Err(e) => read_error_ok(&e),
        }
    }

    /// The writer's process dies at one of its next requests (or at once), possibly in the
    /// middle of a write or a flush; it is dropped, and a new writer starts from the store.
    async fn crash(&mut self, step: usize) -> Result<(), String> {
        let w = self.writer.take().expect("a writer");
        let at = self.rng.random_range(0..6);
        w.store.die_in(at);
        let mut w = Some(w);
        // Keep it busy so that the death lands inside an operation.
        for i in 0..3 {
            self.writer = w.take();
            if self.rng.random_bool(0.5) {
                self.append(step * 10 + i).await?;
            } else {
                self.flush().await?;
            }
            w = self.writer.take();
        }
        let w = w.expect("the crashing writer");
        self.retire(&w);
        w.store.kill();
        self.history.promote(w.id, Status::Maybe);
        self.note(format!(
            "writer {} crashed (its store died at request +{at})",
            w.id
        ));
        drop(w.index);
        Ok(())
    }

    /// A second writer opens while the first still runs: the first is fenced.
    async fn takeover(&mut self) -> Result<(), String> {
        if let Some(z) = self.zombie.take() {
            z.store.kill();
            drop(z.index);
        }
        let old = self.writer.take().expect("a writer");
        self.retire(&old);
        let new = self.open_writer().await?;
        // What the old writer buffered may be lost; what it acknowledged durably is not.
        self.history.promote(old.id, Status::Maybe);
        self.note(format!(
            "writer {} took over from writer {}",
            new.id, old.id
        ));
        self.zombie = Some(old);
        self.writer = Some(new);
        self.check_writer("after a takeover").await
    }

    /// The taken-over writer tries again: nothing may be acknowledged, nothing may appear.
    async fn zombie_write(&mut self, step: usize) -> Result<(), String> {
        if self.zombie.is_none() {
            return self.append(step).await;
        }
        let key = format!("k{:02}", self.rng.random_range(0..KEYS));
        let row = self.value(&key, step);
        let durable = self.rng.random_bool(0.5);
        let z = self.zombie.as_ref().expect("a zombie");
        let opts = WriteOptions::with_durability(if durable {
            Durability::Durable
        } else {
            Durability::Buffered
        });
        let r = z
            .index
            .append_with(&batch(&schema(), std::slice::from_ref(&row)), opts)
            .await;
        let id = z.id;
        let holds_rows = {
            let st = z.index.stats();
            st.memtable_rows + st.frozen_rows > 0
        };
        let flushed = if self.rng.random_bool(0.5) {
            Some(z.index.flush().await)
        } else {
            None
        };
        self.note(format!(
            "step {step}: taken-over writer {id} appends {key} -> {:?}",
            r.as_ref().map(|_| ()).map_err(|e| e.kind())
        ));
        match r {
            Ok(_) if durable => {
                return Err(format!(
                    "writer {id}, taken over, acknowledged a durable write of {key}"
                ))
            }
            // A buffered ack stays in its memory: it never reaches the WAL.
            Ok(_) => {}
            Err(e) => write_error_ok(&e)?,
        }
        self.history.record(step, &key, Some(row), Status::Never);
        // A flush that succeeds had nothing to publish, or published before the takeover (a
        // retry adopting a manifest its earlier attempt wrote): either way, what a fresh reader
        // sees now must hold nothing this writer wrote after it was taken over.
        if let Some(Ok(())) = flushed {
            self.note(format!(
                "taken-over writer {id} flushes -> Ok (it held rows: {holds_rows})"
            ));
            return self.read_only_fresh().await;
        }
        Ok(())
    }

    async fn close_and_reopen(&mut self) -> Result<(), String> {
        let w = self.writer.take().expect("a writer");
        self.retire(&w);
        let r = w.index.close().await;
        match &r {
            Ok(()) => self.history.promote(w.id, Status::Durable),
            Err(e) => {
                write_error_ok(e)?;
                self.history.promote(w.id, Status::Maybe);
            }
        }
        self.note(format!(
            "writer {} closes -> {:?}",
            w.id,
            r.map_err(|e| e.kind())
        ));
        w.store.kill();
        Ok(())
    }

    /// Without faults: a last writer opens, and every durably acknowledged write is there.
    async fn finish(&mut self) -> Result<(), String> {
        if let Some(z) = self.zombie.take() {
            z.store.kill();
        }
        if let Some(w) = self.writer.take() {
            self.retire(&w);
            w.store.kill();
            self.history.promote(w.id, Status::Maybe);
        }
        if self.hit_cap {
            AT_CAP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        COMPACTIONS.fetch_add(self.compactions, std::sync::atomic::Ordering::Relaxed);
        self.faults = Faults::NONE;
        let w = self.open_writer().await?;
        let found = to_model(
            &w.index
                .scan(ScanOptions::default())
                .await
                .map_err(|e| e.to_string())?,
        );
        self.history
            .check(&found, &|s| s == Status::Durable)
            .map_err(|e| format!("final open: {e}"))?;
        w.index
            .flush()
            .await
            .map_err(|e| format!("final flush: {e}"))?;
        w.index
            .close()
            .await
            .map_err(|e| format!("final close: {e}"))?;
        let store = self.process_store();
        let r = Index::open_read_only(self.location(&store), self.settings.clone())
            .await
            .map_err(|e| format!("final read-only open: {e}"))?;
        let again = to_model(
            &r.scan(ScanOptions::default())
                .await
                .map_err(|e| e.to_string())?,
        );
        if again != found {
            return Err("the final flush changed the live rows".into());
        }
        self.note(format!(
            "final: {} live rows, as the model allows",
            found.len()
        ));
        Ok(())
    }
}

type Log = Arc<std::sync::Mutex<Vec<String>>>;

async fn run_seed(seed: u64, verbose: bool, log: Log) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let faults = Faults {
        fail: [0.0, 0.01, 0.03, 0.06][rng.random_range(0..4)],
        ambiguous: [0.0, 0.02, 0.05][rng.random_range(0..3)],
        latency_us: [0, 200, 2_000][rng.random_range(0..3)],
        manifest_fail: [0.0, 0.05, 0.15][rng.random_range(0..3)],
        manifest_late: [0.0, 0.03, 0.1][rng.random_range(0..3)],
    };
    let fanout = rng.random_range(2..4);
    let settings = Settings {
        memtable_max_rows: rng.random_range(4..40),
        max_frozen_memtables: rng.random_range(1..3),
        wal_buffer_interval_ms: rng.random_range(1..30),
        wal_buffer_max_rows: rng.random_range(2..20),
        manifest_retention: rng.random_range(0..4),
        io_concurrency: rng.random_range(1..8),
        compaction: rng.random_bool(0.85),
        compaction_fanout: fanout,
        compaction_max_generations: fanout + rng.random_range(1..4),
        // Often small enough that merges stop at it: full generations beside open ones.
        compaction_max_rows: [200_000, 40, 80][rng.random_range(0..3)],
        compaction_grace_ms: [0, 20, 500][rng.random_range(0..3)],
        // Often 0: every generation opened by one ranged GET of its hot part, so that the
        // store's faults meet those reads too (at the default, these small generations of a
        // schema with vectors are read whole at open; their rows are read by range either way).
        vector_exact_below: [Settings::default().vector_exact_below, 0, 0][rng.random_range(0..3)],
        ..Settings::default()
    };
    let shared: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut sim = Sim {
        rng,
        shared: shared.clone(),
        history: History::default(),
        writer: None,
        zombie: None,
        readers: Vec::new(),
        next_writer: 0,
        next_version: 0,
        faults,
        settings: settings.clone(),
        verbose,
        log,
        hit_cap: false,
        compactions: 0,
    };
    sim.note(format!(
        "seed {seed}: faults {faults:?}, settings {settings:?}"
    ));
    let create = Index::create(
        Location::from_store(shared, "idx"),
        schema(),
        settings.clone(),
    )
    .await;
    match create {
        // The index is created without faults and closed at once.
        Ok(i) => {
            sim.next_writer += 1;
            i.close().await.map_err(|e| e.to_string())?;
        }
        Err(e) => return Err(format!("create: {e}")),
    }
    for step in 0..STEPS {
        sim.step(step).await?;
    }
    sim.finish().await
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn simulation() {
    if let Some(seed) = env_u64("LSMSEARCH_DST_SEED") {
        // A replay prints the library's log too, as RUST_LOG asks (default: none).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
            )
            .with_test_writer()
            .try_init();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        match rt.block_on(run_seed(seed, true, Log::default())) {
            Ok(()) => println!("seed {seed}: no violation"),
            Err(e) => panic!("seed {seed}: {e}"),
        }
        return;
    }
    let seeds = env_u64("LSMSEARCH_DST_SEEDS").unwrap_or(200);
    let first = env_u64("LSMSEARCH_DST_FIRST").unwrap_or(1);
    let started = Instant::now();
    let next = std::sync::atomic::AtomicU64::new(first);
    let failures = std::sync::Mutex::new(Vec::new());
    // Seeds spend much of their time waiting on simulated latency: more threads than cores
    // help long runs (`LSMSEARCH_DST_THREADS`, default 2).
    let threads = env_u64("LSMSEARCH_DST_THREADS").unwrap_or(2);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                loop {
                    let seed = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if seed >= first + seeds {
                        break;
                    }
                    let log = Log::default();
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        rt.block_on(async {
                            tokio::time::timeout(SEED_TIMEOUT, run_seed(seed, false, log.clone()))
                                .await
                                .unwrap_or_else(|_| Err(format!("hung for {SEED_TIMEOUT:?}")))
                        })
                    }));
                    let last_steps = || {
                        let log = log.lock().unwrap_or_else(|e| e.into_inner());
                        log.iter().rev().take(12).rev().cloned().collect::<Vec<_>>().join("\n      ")
                    };
                    let failure = match r {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(format!("{e}\n    last steps:\n      {}", last_steps())),
                        Err(_) => Some(format!("panicked\n    last steps:\n      {}", last_steps())),
                    };
                    if let Some(f) = failure {
                        failures.lock().unwrap().push(format!(
                            "seed {seed}: {f}\n    replay: LSMSEARCH_DST_SEED={seed} cargo test --test dst -- --nocapture"
                        ));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "{seeds} seeds ({first}..{}) in {:.1} s: {} violations; {} seeds reached the generation \
         cap, {} compactions published, {} liveness checks passed, {} ranged GETs failed ({} of \
         hot parts)",
        first + seeds,
        started.elapsed().as_secs_f64(),
        failures.len(),
        load(&AT_CAP),
        load(&COMPACTIONS),
        load(&LIVE_CHECKS),
        load(&common::sim::RANGED_GETS_FAILED),
        load(&common::sim::HOT_PART_GETS_FAILED)
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The faults must reach the reads of parts of objects (hot parts among them), not only
    // whole-object reads.
    assert!(
        seeds < 100 || load(&common::sim::HOT_PART_GETS_FAILED) > 0,
        "{seeds} seeds failed no ranged GET of a hot part ({} ranged GETs failed)",
        load(&common::sim::RANGED_GETS_FAILED)
    );
}
