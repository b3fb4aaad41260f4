//! Compaction: a run of adjacent generations merged into one, published by one manifest version
//! that replaces the run.
//!
//! **Policy** ([`pick`]): looking from a generation back towards older ones, a generation joins
//! the run while it holds at most 1.5 times the rows of the run so far; a run of at least
//! [`crate::Settings::compaction_fanout`] generations is merged (the newest such run first).
//! This is size-tiered compaction in the form of RocksDB's universal compaction (size ratio
//! with slack): generations grow geometrically from newest to oldest, so their count stays
//! logarithmic in the number of flushes, and each row is rewritten about log_fanout(flushes)
//! times. Without the slack (a ratio of 1), flushes each a little smaller than the one before
//! would never merge. `docs/architecture.md` gives the figures it was chosen by.
//!
//! **Merge** ([`merge_rows`]): the newest version of each key among the inputs, in sequence
//! order (older inputs first); a tombstone is kept unless the run starts at the oldest
//! generation, when nothing older remains for it to hide. The merged generation's text index
//! and vector graph are built over its rows (the graph on
//! [`crate::Settings::compaction_threads`] cores).
//!
//! **Publication**: the merged object is created under a fresh id, then one conditional manifest
//! version replaces the run, under the same lock as flushes, so each publish starts from the
//! latest version. A crash before that leaves an object no manifest names, collected by the next
//! open; a fenced writer's manifest PUT collides and it publishes nothing. A run a concurrent
//! operation changed is given up.
//!
//! **Snapshots**: the replaced generations stay in memory as long as a query holds them, and
//! their objects are deleted once [`crate::Settings::compaction_grace_ms`] has passed and no
//! query of this handle reads them, so read-only handles (which refresh onto the new list when
//! a generation they planned with is gone) and queries planned on the older manifest finish.

use super::{flush, Inner};
use crate::format::manifest::Manifest;
use crate::format::GenerationMeta;
use crate::generation::{Generation, HashIsKey, IndexSpec};
use crate::priority::{in_background_thread, Raisable};
use crate::schema::deleted_flags;
use crate::schema::Metric;
use crate::settings::GraphParams;
use crate::vector::graph::Adjacency;
use crate::vector::VectorIndex;
use crate::{Error, Result};
use arrow::array::{BooleanArray, RecordBatch};
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use serde::Serialize;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// What one compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CompactionReport {
    /// Generations before and after.
    pub generations_before: usize,
    /// Generations after.
    pub generations_after: usize,
    /// Rows (versions and tombstones) of the generations merged.
    pub rows_in: u64,
    /// Rows of the merged generation: superseded versions and dropped tombstones are gone.
    pub rows_out: u64,
    /// Bytes of the objects replaced, and of the merged one.
    pub bytes_in: u64,
    /// Bytes of the merged generation's object.
    pub bytes_out: u64,
    /// Milliseconds the compaction took.
    pub millis: u64,
}

/// A generation a compaction replaced, waiting for its grace period and its last reader.
#[derive(Debug)]
pub(crate) struct Replaced {
    meta: GenerationMeta,
    since: Instant,
    generation: Weak<Generation>,
}

impl Replaced {
    /// Bytes of its object.
    pub(crate) fn bytes(&self) -> u64 {
        self.meta.bytes
    }
}

/// A compaction's manifest whose PUT reported an error (it may have landed, or may still), with
/// the run it replaces: settled before anything else is published (see `flush::settle`), and
/// recorded as a compaction of this writer once it is.
#[derive(Debug, Clone)]
pub(crate) struct Unsure {
    pub(crate) manifest: Manifest,
    run: Vec<GenerationMeta>,
    inputs: Vec<Weak<Generation>>,
    /// `(id, epoch)` of the merged generation, if any.
    merged: Option<(u64, u64)>,
    /// How long the compaction took up to its publication.
    took: Duration,
}

impl Unsure {
    /// Record the compaction as published (its manifest is installed).
    pub(crate) fn published(&self, inner: &Inner) {
        published(inner, &self.run, self.inputs.iter().cloned(), self.took);
    }

    /// The compaction published nothing: see [`discard`].
    pub(crate) async fn given_up(&self, inner: &Inner) {
        discard(inner, self.merged).await;
    }
}

/// Record a compaction whose manifest is installed: the generations of `run` (`inputs`, the
/// decoded ones this handle holds) await deletion after the grace period.
fn published(
    inner: &Inner,
    run: &[GenerationMeta],
    inputs: impl Iterator<Item = Weak<Generation>>,
    took: Duration,
) {
    let mut st = inner.compaction_state();
    let now = Instant::now();
    st.replaced
        .extend(run.iter().zip(inputs).map(|(meta, g)| Replaced {
            meta: meta.clone(),
            since: now,
            generation: g,
        }));
    st.last_ms = took.as_millis() as u64;
    st.compactions += 1;
    st.last_error = None;
}

/// Compaction telemetry and the replaced generations awaiting deletion.
#[derive(Debug, Default)]
pub(crate) struct CompactionState {
    pub(crate) replaced: Vec<Replaced>,
    pub(crate) last_ms: u64,
    pub(crate) compactions: u64,
    pub(crate) last_error: Option<Error>,
}

/// Which generations a compaction merges.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pick {
    /// The run the policy picks, if any.
    Policy,
    /// Every generation into one (`compact()` on demand), if that changes anything.
    All,
}

/// The run (indices into `rows`, the generations' row counts oldest first) the policy merges
/// next, if any: the newest run of at least `fanout` adjacent generations in which each
/// generation holds at most 1.5 times the rows of the newer ones of the run together.
pub(crate) fn pick(rows: &[u64], fanout: usize) -> Option<Range<usize>> {
    for end in (0..rows.len()).rev() {
        let mut sum = rows[end];
        let mut start = end;
        // rows ≤ 1.5 × sum: a slack that lets flushes of slightly varying sizes merge. (Row
        // counts come from manifests: the arithmetic saturates.)
        while start > 0 && rows[start - 1].saturating_mul(2) <= sum.saturating_mul(3) {
            start -= 1;
            sum = sum.saturating_add(rows[start]);
        }
        if end + 1 - start >= fanout.max(2) {
            return Some(start..end + 1);
        }
    }
    None
}

/// The run to merge now: the policy's, or at `cap` generations the `fanout` adjacent ones
/// holding the fewest rows.
pub(crate) fn due(rows: &[u64], fanout: usize, cap: usize) -> Option<Range<usize>> {
    pick(rows, fanout).or_else(|| {
        if rows.len() < cap {
            return None;
        }
        let width = fanout.clamp(2, rows.len());
        (0..=rows.len() - width)
            .min_by_key(|&s| {
                rows[s..s + width]
                    .iter()
                    .fold(0u64, |a, r| a.saturating_add(*r))
            })
            .map(|s| s..s + width)
    })
}

/// The rows of the generation merging `inputs` (adjacent generations, oldest first): the newest
/// version of each key among them, in sequence order; tombstones left out when
/// `drop_tombstones` (nothing older remains for them to hide).
pub(crate) fn merge_rows(
    inputs: &[Arc<Generation>],
    drop_tombstones: bool,
) -> Result<(RecordBatch, Vec<Vec<bool>>)> {
    let schema = match inputs.first() {
        Some(g) => g.rows().schema(),
        None => return Err(Error::internal("a compaction of no generations")),
    };
    // Key hash → (input, row) of the newest version seen, newest input first; a hit is confirmed
    // on the exact key, and a true hash collision falls back to asking every newer input.
    let mut seen: HashMap<u64, (usize, usize), BuildHasherDefault<HashIsKey>> =
        HashMap::with_capacity_and_hasher(
            inputs.iter().map(|g| g.rows().num_rows()).sum(),
            Default::default(),
        );
    let mut keep: Vec<Vec<bool>> = vec![Vec::new(); inputs.len()];
    for (i, g) in inputs.iter().enumerate().rev() {
        let deleted = deleted_flags(g.rows());
        let mut mine = vec![false; g.rows().num_rows()];
        for (r, h) in g.row_hashes().iter().enumerate() {
            let superseded = match seen.get(h) {
                None => false,
                Some(&(gi, gr)) => {
                    let key = g.key_at(r);
                    inputs[gi].key_at(gr) == key
                        || inputs[i + 1..]
                            .iter()
                            .any(|n| n.row_of_key(*h, || key.clone()).is_some())
                }
            };
            if superseded {
                continue;
            }
            seen.entry(*h).or_insert((i, r));
            mine[r] = !(drop_tombstones && deleted.value(r));
        }
        keep[i] = mine;
    }
    let parts = inputs
        .iter()
        .zip(&keep)
        .map(|(g, k)| arrow::compute::filter_record_batch(g.rows(), &BooleanArray::from(k.clone())))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((arrow::compute::concat_batches(&schema, &parts)?, keep))
}

/// The merged generation's graph, continuing the graph of the input with the most rows (its
/// nodes keep their links; the other inputs' rows are inserted), when that input's graph can
/// be continued (see [`VectorIndex::continue_graph`]); `None` to build it afresh.
pub(crate) fn continue_largest(
    inputs: &[Arc<Generation>],
    kept: &[Vec<bool>],
    rows: &RecordBatch,
    col: usize,
    metric: Metric,
    params: GraphParams,
) -> Result<Option<Adjacency>> {
    let Some(largest) = (0..inputs.len()).max_by_key(|i| inputs[*i].rows().num_rows()) else {
        return Ok(None);
    };
    let Some(base) = inputs[largest].vector() else {
        return Ok(None);
    };
    // Merged rows are the kept rows of each input, oldest input first.
    let offset: usize = kept[..largest]
        .iter()
        .map(|k| k.iter().filter(|x| **x).count())
        .sum();
    let mut next = offset as u32;
    let base_rows: Vec<Option<u32>> = kept[largest]
        .iter()
        .map(|k| {
            k.then(|| {
                next += 1;
                next - 1
            })
        })
        .collect();
    VectorIndex::continue_graph(rows, col, metric, params, base, &base_rows)
}

/// The raisable priority of the compaction under way, for as long as it runs.
struct Running<'a> {
    inner: &'a Inner,
}

impl<'a> Running<'a> {
    fn new(inner: &'a Inner, lower: Option<Arc<Raisable>>) -> Running<'a> {
        *inner
            .compaction_priority
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = lower;
        Running { inner }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        *self
            .inner
            .compaction_priority
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Drop a merged generation no manifest names (nor may name) from the cache.
async fn forget(inner: &Inner, merged: Option<&Arc<Generation>>) {
    if let Some(g) = merged {
        inner
            .reader
            .generations
            .remove(g.meta().id, g.meta().epoch)
            .await;
    }
}

/// A merged generation `(id, epoch)` of a compaction that published nothing: no manifest
/// names its object, nor may: it leaves the cache, and the object is deleted now rather than
/// at the next open.
async fn discard(inner: &Inner, merged: Option<(u64, u64)>) {
    if let Some((id, epoch)) = merged {
        inner.reader.generations.remove(id, epoch).await;
        let path = inner.paths.generation(id, epoch);
        crate::manifest::delete_all(&inner.loc.store, vec![path], 1).await;
    }
}

/// Raise the compaction under way to the foreground's priority when it became urgent: `gens`
/// generations are one flush short of the cap (where flushes wait for compaction), or
/// `compact()` waits for it.
pub(crate) fn raise_if_due(inner: &Inner, gens: Option<usize>) {
    let due = gens.is_none_or(|n| n + 1 >= inner.reader.settings.compaction_max_generations);
    if !due {
        return;
    }
    let running = inner
        .compaction_priority
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(r) = running.filter(|r| !r.raised()) {
        tracing::debug!(
            "the compaction under way became urgent: raised to the foreground's priority"
        );
        r.raise();
    }
}

/// Run one compaction if `pick` finds something to merge; `Ok(None)` when it does not. One
/// compaction runs at a time per writer.
pub(crate) async fn compact_once(
    inner: &Arc<Inner>,
    pick_by: Pick,
) -> Result<Option<CompactionReport>> {
    if matches!(pick_by, Pick::All) {
        // Asked for: a background compaction under way finishes first, at the foreground's
        // priority.
        raise_if_due(inner, None);
    }
    let _one = inner.compacting.lock().await;
    if inner.fenced.load(Ordering::SeqCst) {
        return Err(inner.fenced_error());
    }
    if inner.closed.load(Ordering::SeqCst) {
        return Err(Error::closed());
    }
    // An earlier compaction's manifest whose PUT reported an error is settled first (see
    // `flush::settle`): the list to pick from is the one after it, and no merge is built that
    // could not be published while that version is unsure.
    let unsure = inner.unsure().is_some();
    if unsure {
        let _publish = inner.publish.lock().await;
        flush::settle(inner).await?;
    }
    let started = Instant::now();
    let metas = inner.read_state().manifest.generations.clone();
    let run = match pick_by {
        Pick::Policy => {
            let rows: Vec<u64> = metas.iter().map(|m| m.rows).collect();
            let s = &inner.reader.settings;
            match due(&rows, s.compaction_fanout, s.compaction_max_generations) {
                Some(run) => run,
                None => return Ok(None),
            }
        }
        Pick::All => {
            let nothing_to_drop = metas.len() == 1 && metas[0].tombstones == 0;
            if metas.is_empty() || nothing_to_drop {
                return Ok(None);
            }
            0..metas.len()
        }
    };
    // One flush short of the cap (where flushes, and then appends, wait for compaction) or
    // asked for, a compaction is urgent: it runs at the foreground's priority on every core.
    let urgent = matches!(pick_by, Pick::All)
        || metas.len() + 1 >= inner.reader.settings.compaction_max_generations;
    let run_metas = metas[run.clone()].to_vec();
    tracing::debug!(
        "compacting generations {:?} of {} (urgent: {urgent})",
        run,
        metas.len()
    );
    let inputs = inner.reader.generations.get_all(&run_metas).await?;
    let drop_tombstones = run.start == 0;
    let id = inner.next_generation_id.fetch_add(1, Ordering::SeqCst);
    let epoch = inner.epoch;
    let schema = inner.reader.stored_schema.clone();
    let text = inner.reader.text_schema.clone();
    let vector =
        inner
            .reader
            .schema
            .vector_spec(&inner.reader.settings)
            .map(|(col, metric, mut params)| {
                params.threads = if urgent {
                    0
                } else {
                    inner.reader.settings.compaction_threads
                };
                params.ef_construction = inner.reader.settings.compaction_ef_construction;
                (col, metric, params)
            });
    let built_inputs = inputs.clone();
    let continue_graph = inner.reader.settings.compaction_continue_graph;
    // Not urgent, it runs at the background's priority until a flush finds the generations one
    // short of the cap (see `raise_if_due`): then at the foreground's, from where it is.
    let lower = (!urgent).then(|| Arc::new(Raisable::default()));
    let _running = Running::new(inner, lower.clone());
    let built = in_background_thread(
        "lsmsearch-compact",
        lower.clone(),
        move || -> Result<Option<(Generation, Vec<u8>)>> {
            let (rows, kept) = merge_rows(&built_inputs, drop_tombstones)?;
            if rows.num_rows() == 0 {
                return Ok(None);
            }
            let graph = match vector {
                Some((col, metric, params)) if continue_graph => {
                    continue_largest(&built_inputs, &kept, &rows, col, metric, params)?
                }
                _ => None,
            };
            let spec = IndexSpec {
                text: text.as_deref(),
                vector,
            };
            let flushes = built_inputs.iter().map(|g| g.meta().flushes).sum();
            Generation::build(id, epoch, rows, &schema, spec, graph, flushes).map(Some)
        },
    )
    .await?;
    let (merged, bytes) = match built {
        Some((g, bytes)) => (Some(Arc::new(g)), Some(bytes)),
        None => (None, None),
    };
    if let Some(bytes) = bytes {
        let path = inner.paths.generation(id, epoch);
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        inner
            .loc
            .store
            .put_opts(&path, PutPayload::from(bytes), create)
            .await
            .map_err(|e| Error::store(&path, e))?;
    }

    // The list it will publish, unless a flush adds to it meanwhile: its block lists computed
    // now (with the merged generation cached), at the compaction's priority, so that neither
    // the first query over it nor the publish lock waits for them.
    if let Some(g) = &merged {
        inner.reader.generations.insert(g.clone()).await;
    }
    let expected = {
        let mut gens = inner.read_state().manifest.generations.clone();
        gens.windows(run_metas.len())
            .position(|w| w == &run_metas[..])
            .map(|at| {
                let replacement = merged.iter().map(|g| g.meta().clone());
                gens.splice(at..at + run_metas.len(), replacement);
                gens
            })
    };
    if let Some(expected) = expected {
        inner.reader.warm(&expected, lower).await;
    }

    // Publish: the run replaced by the merged generation (or by nothing, when every row of it
    // was a superseded version or a dropped tombstone).
    let merged_key = merged.as_ref().map(|g| (g.meta().id, g.meta().epoch));
    let publish = inner.publish.lock().await;
    if let Err(e) = flush::settle(inner).await {
        forget(inner, merged.as_ref()).await;
        return Err(e);
    }
    let base = inner.read_state().manifest.clone();
    let at = base
        .generations
        .windows(run_metas.len())
        .position(|w| w == &run_metas[..]);
    let given_up = match at {
        None => Some("the list changed"),
        // Tombstones may only go when nothing older remains below them.
        Some(at) if drop_tombstones && at != 0 => Some("generations appeared below its run"),
        Some(_) => None,
    };
    let Some(at) = at.filter(|_| given_up.is_none()) else {
        drop(publish);
        tracing::info!(
            "compaction of {} generations given up: {}",
            run_metas.len(),
            given_up.unwrap_or("the list changed")
        );
        discard(inner, merged_key).await;
        return Ok(None);
    };
    let mut next: Manifest = base.clone();
    next.version += 1;
    next.next_generation_id = next.next_generation_id.max(id + 1);
    let replacement: Vec<GenerationMeta> = merged.iter().map(|g| g.meta().clone()).collect();
    next.generations
        .splice(at..at + run_metas.len(), replacement);
    // Recorded as unsure before the PUT: if this call is cancelled while the PUT is in flight
    // (a caller's timeout drops `compact()`), the version stays unsure and the next publish
    // settles it, instead of finding a manifest it cannot account for.
    *inner.unsure() = Some(Unsure {
        manifest: next.clone(),
        run: run_metas.clone(),
        inputs: inputs.iter().map(Arc::downgrade).collect(),
        merged: merged_key,
        took: started.elapsed(),
    });
    let outcome = flush::publish(inner, &next).await;
    if !matches!(&outcome, Err(e) if !super::is_fenced(e)) {
        // Any outcome but an unknown one: the version is settled.
        *inner.unsure() = None;
    }
    match outcome {
        Ok(flush::Published::Ours) => {}
        Ok(flush::Published::Taken) => {
            // A flush's earlier attempt holds the version (its PUT reported an error, and
            // landed): its retry adopts it, and this run is given up.
            drop(publish);
            tracing::info!(
                "compaction of {} generations given up: a flush's earlier attempt holds \
                 manifest {}",
                run_metas.len(),
                next.version
            );
            discard(inner, merged_key).await;
            return Ok(None);
        }
        Err(e) => {
            // Fenced, it publishes nothing; otherwise the PUT may have landed although it
            // reported an error, or may still: it stays unsure, and the next publish (or
            // compaction) settles it.
            if super::is_fenced(&e) {
                forget(inner, merged.as_ref()).await;
            }
            return Err(e);
        }
    }
    inner.write_state().manifest = next.clone();
    drop(publish);
    let report = CompactionReport {
        generations_before: base.generations.len(),
        generations_after: next.generations.len(),
        rows_in: run_metas.iter().map(|m| m.rows).sum(),
        rows_out: merged.as_ref().map_or(0, |g| g.meta().rows),
        bytes_in: run_metas.iter().map(|m| m.bytes).sum(),
        bytes_out: merged.as_ref().map_or(0, |g| g.meta().bytes),
        millis: started.elapsed().as_millis() as u64,
    };
    published(
        inner,
        &run_metas,
        inputs.iter().map(Arc::downgrade),
        started.elapsed(),
    );
    drop(inputs);
    tracing::debug!(
        "compacted {} generations ({} rows) into {} rows (manifest {})",
        run_metas.len(),
        report.rows_in,
        report.rows_out,
        next.version
    );
    flush::clean_up_manifests(inner, next.version).await;
    Ok(Some(report))
}

/// Objects an open found replaced by an earlier writer's compaction (`(id, epoch, bytes)`):
/// deleted after the grace period, as this writer's replaced generations are.
pub(crate) fn replaced_at_open(inner: &Inner, objects: &[(u64, u64, u64)]) {
    let now = Instant::now();
    inner
        .compaction_state()
        .replaced
        .extend(objects.iter().map(|&(id, epoch, bytes)| Replaced {
            meta: GenerationMeta {
                id,
                epoch,
                rows: 0,
                tombstones: 0,
                bytes,
                min_seq: 0,
                max_seq: 0,
                flushes: 1,
            },
            since: now,
            generation: Weak::new(),
        }));
}

/// Delete the objects of replaced generations whose grace period has passed and that no query
/// of this handle still reads.
pub(crate) async fn delete_replaced(inner: &Arc<Inner>) {
    let grace = Duration::from_millis(inner.reader.settings.compaction_grace_ms);
    let due: Vec<GenerationMeta> = inner
        .compaction_state()
        .replaced
        .iter()
        .filter(|r| r.since.elapsed() >= grace)
        .map(|r| r.meta.clone())
        .collect();
    if due.is_empty() {
        return;
    }
    // Out of the cache for good first: then only queries hold them.
    for m in &due {
        inner.reader.generations.retire(m.id, m.epoch).await;
    }
    let doomed: Vec<GenerationMeta> = {
        let mut st = inner.compaction_state();
        let mut doomed = Vec::new();
        st.replaced.retain(|r| {
            let free = r.since.elapsed() >= grace && r.generation.strong_count() == 0;
            if free {
                doomed.push(r.meta.clone());
            }
            !free
        });
        doomed
    };
    let paths = doomed
        .iter()
        .map(|m| inner.paths.generation(m.id, m.epoch))
        .collect();
    crate::manifest::delete_all(
        &inner.loc.store,
        paths,
        inner.reader.settings.io_concurrency,
    )
    .await;
}

/// The background compactor: after each flush (and every second, for deletions due), merge
/// what the policy picks, one compaction at a time.
pub(crate) async fn run_compactor(inner: Arc<Inner>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let woken = inner.compact_wake.notified();
        if inner.fenced.load(Ordering::SeqCst) || inner.closed.load(Ordering::SeqCst) {
            return;
        }
        delete_replaced(&inner).await;
        if inner.reader.settings.compaction {
            match compact_once(&inner, Pick::Policy).await {
                // More may be due (a merge can complete a run one level up).
                Ok(Some(_)) => continue,
                Ok(None) => backoff = Duration::from_secs(1),
                Err(e) => {
                    tracing::warn!("compaction failed: {e}");
                    if super::is_fenced(&e) {
                        inner.mark_fenced();
                        return;
                    }
                    inner.compaction_state().last_error = Some(e);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            }
        }
        tokio::select! {
            _ = woken => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Rows of the run compaction would merge now (0 when none is due).
pub(crate) fn debt(metas: &[GenerationMeta], fanout: usize, cap: usize) -> u64 {
    let rows: Vec<u64> = metas.iter().map(|m| m.rows).collect();
    due(&rows, fanout, cap).map_or(0, |r| {
        rows[r].iter().fold(0u64, |a, r| a.saturating_add(*r))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flushes of random, shrinking or mixed sizes, merges shrinking by up to 20% (updates and
    /// deletes): the count stays within `max(fanout - 1, 2 log2(flushes))` after every round,
    /// and each row is rewritten about log_fanout(flushes) times.
    #[test]
    fn the_policy_keeps_the_count_logarithmic() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for fanout in [2, 3, 4, 8] {
            for shape in ["random", "shrinking", "mixed"] {
                let mut gens: Vec<u64> = Vec::new();
                let mut rewritten = 0u64;
                let mut flushed = 0u64;
                let n = 2000u64;
                for flush in 1..=n {
                    let rows = match shape {
                        "random" => 40_000 + rand(20_000),
                        "shrinking" => 60_000 - flush * 10,
                        _ if rand(4) == 0 => 1 + rand(100),
                        _ => 50_000,
                    };
                    flushed += rows;
                    gens.push(rows);
                    while let Some(run) = pick(&gens, fanout) {
                        let sum: u64 = gens[run.clone()].iter().sum();
                        rewritten += sum;
                        let shrunk = sum - sum * rand(20) / 100;
                        gens.splice(run, [shrunk]);
                    }
                    let bound = ((2.0 * (flush as f64).log2()).floor() as usize).max(fanout - 1);
                    assert!(
                        gens.len() <= bound,
                        "fanout {fanout}, {shape}: {} generations after {flush} flushes \
                         (bound {bound}): {gens:?}",
                        gens.len()
                    );
                }
                let amplification = rewritten as f64 / flushed as f64;
                assert!(
                    amplification < 1.5 * (n as f64).log(fanout as f64),
                    "fanout {fanout}, {shape}: each row rewritten {amplification:.1} times"
                );
            }
        }
    }

    #[test]
    fn at_the_cap_the_cheapest_run_is_merged() {
        let doubling = [64, 32, 16, 8, 4, 2, 1];
        assert_eq!(pick(&doubling, 4), None, "the policy waits");
        assert_eq!(due(&doubling, 4, 8), None, "under the cap");
        assert_eq!(
            due(&doubling, 4, 7),
            Some(3..7),
            "at the cap: the four smallest"
        );
        assert_eq!(due(&[5, 9], 4, 2), Some(0..2));
    }

    #[test]
    fn a_run_needs_fanout_generations_each_no_bigger_than_the_newer_ones() {
        assert_eq!(pick(&[8, 1, 1, 1], 4), None, "8 is more than 1.5 × 3");
        assert_eq!(pick(&[8, 1, 1, 1, 1], 4), Some(1..5));
        assert_eq!(pick(&[8, 4, 4, 4], 4), Some(0..4));
        assert_eq!(
            pick(&[20, 4, 4, 4], 3),
            Some(1..4),
            "20 is more than 1.5 × 12"
        );
        assert_eq!(pick(&[100, 1, 1, 1, 1, 50], 4), Some(1..6));
        assert_eq!(
            pick(&[1000, 5, 5, 5, 5, 1], 4),
            Some(1..5),
            "an older run is found"
        );
        assert_eq!(pick(&[1, 1, 1], 4), None);
        assert_eq!(pick(&[], 4), None);
    }
}
