//! One compaction: pick → build → upload → publish, or give up.
//!
//! The merged object is created under a fresh id, then one conditional manifest version
//! replaces the run, under the same lock as flushes, so each publish starts from the latest
//! version. A crash before that leaves an object no manifest names, collected by the next open;
//! a fenced writer's manifest PUT collides and it publishes nothing. A run a concurrent
//! operation changed is given up, and its merged object deleted.

use super::merge::{continue_largest, merge_rows, superseded_share};
use super::policy::{all, due};
use super::urgency::{raise_if_due, Running};
use super::CompactionReport;
use crate::format::manifest::Manifest;
use crate::format::GenerationMeta;
use crate::generation::{Generation, IndexSpec};
use crate::priority::{in_background_thread, Raisable};
use crate::writer::publish::{self, clean_up_manifests, install, settle, Published};
use crate::writer::{is_fenced, Unsure, Writer};
use crate::{Error, Result};
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Which generations a compaction merges.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pick {
    /// The run the policy picks, if any.
    Policy,
    /// The oldest run that fits in `compaction_max_rows` among the generations of sequence
    /// numbers up to this one (`compact()` on demand), if that changes anything (see
    /// [`super::policy::all`]).
    All(u64),
}

impl Pick {
    /// The generations of `metas` (a list, oldest first) this pick may merge or count as
    /// newer: with `All`, those present when `compact()` was called (sequence numbers grow
    /// along the list, and a merge keeps its inputs' place and numbers); all with `Policy`.
    fn present(self, metas: &[GenerationMeta]) -> &[GenerationMeta] {
        match self {
            Pick::All(last) => &metas[..metas.partition_point(|m| m.max_seq <= last)],
            Pick::Policy => metas,
        }
    }
}

/// A compaction picked: its run and how its merge is built.
#[derive(Debug)]
struct Job {
    /// The generations merged, oldest first, adjacent in the list they were picked from.
    run: Vec<GenerationMeta>,
    /// The generations after the run in that list (with `compact()`, those present when it
    /// was called): the versions they supersede are dead.
    newer: Vec<GenerationMeta>,
    /// The run starts at the oldest generation: nothing older remains for a tombstone to hide.
    drop_tombstones: bool,
    /// At the foreground's priority on every core (see [`super::urgency`]).
    urgent: bool,
    started: Instant,
}

/// Run one compaction if `pick_by` finds something to merge; `Ok(None)` when it does not, or
/// when it gave up (the list changed under it). One compaction runs at a time per writer.
pub(crate) async fn compact_once(
    w: &Arc<Writer>,
    pick_by: Pick,
) -> Result<Option<CompactionReport>> {
    if matches!(pick_by, Pick::All(_)) {
        // Asked for: a background compaction under way finishes first, at the foreground's
        // priority.
        raise_if_due(w, None);
    }
    let _one = w.compaction.running.lock().await;
    w.check_live()?;
    // An earlier compaction's manifest whose PUT reported an error is settled first: the list
    // to pick from is the one after it, and no merge is built that could not be published
    // while that version is unsure.
    if w.publisher.unsure().is_some() {
        let _publish = w.publisher.lock.lock().await;
        settle(w).await?;
    }
    let job = match pick(w, pick_by) {
        Some(job) => job,
        None => match reclaim(w, pick_by).await {
            Some(job) => job,
            None => return Ok(None),
        },
    };
    let inputs = w.reader.generations.get_all(&job.run).await?;
    // Only the newer generations this handle holds: one it would have to fetch only costs a
    // few superseded versions kept.
    let newer = w.reader.generations.held(&job.newer).await;
    // The merged generation's id.
    let id = w
        .publisher
        .next_generation_id
        .fetch_add(1, Ordering::SeqCst);
    // Not urgent, it runs at the background's priority until a flush finds the generations one
    // short of the cap (see `raise_if_due`): then at the foreground's, from where it is.
    let lower = (!job.urgent).then(|| Arc::new(Raisable::default()));
    let _running = Running::new(w, lower.clone());
    let merged = match build(w, &job, id, &inputs, &newer, lower.clone()).await? {
        Some((_, bytes)) => {
            let bytes = bytes::Bytes::from(bytes);
            upload(w, id, bytes.clone()).await?;
            // Opened from its hot part, as a reader opens it, and cached.
            Some(w.reader.generations.insert_built(bytes, false).await?)
        }
        None => None,
    };
    stage(w, &job, merged.as_ref(), lower).await;
    publish_or_give_up(w, job, id, inputs, merged).await
}

/// The run to merge now, if any.
fn pick(w: &Writer, pick_by: Pick) -> Option<Job> {
    let started = Instant::now();
    let metas = w.read_state().manifest.generations.clone();
    let s = &w.reader.settings;
    let run: Range<usize> = match pick_by {
        Pick::Policy => {
            let rows: Vec<u64> = metas.iter().map(|m| m.rows).collect();
            due(
                &rows,
                s.compaction_fanout,
                s.compaction_max_generations,
                s.compaction_max_rows as u64,
            )?
        }
        Pick::All(last) => all(&metas, s.compaction_max_rows as u64, last)?,
    };
    // One flush short of the cap (where flushes, and then appends, wait for compaction) or
    // asked for, a compaction is urgent: it runs at the foreground's priority on every core.
    let open = super::policy::open(metas.iter().map(|m| m.rows), s.compaction_max_rows as u64);
    let urgent = matches!(pick_by, Pick::All(_)) || open + 1 >= s.compaction_max_generations;
    tracing::debug!(
        "compacting generations {:?} of {} (urgent: {urgent})",
        run,
        metas.len()
    );
    Some(Job {
        drop_tombstones: run.start == 0,
        newer: pick_by.present(&metas)[run.end..].to_vec(),
        run: metas[run].to_vec(),
        urgent,
        started,
    })
}

/// Rows of a full generation [`reclaim`] samples.
const RECLAIM_SAMPLES: usize = 128;

/// A full generation (at least half of `compaction_max_rows`, see [`super::policy::open`])
/// most of whose rows newer generations supersede (at least half of a sample), to rewrite
/// alone: it merges with no neighbour that would take it past the cap, so its dead rows would
/// otherwise stay. Only generations this handle holds are sampled (no fetch), and with
/// `Pick::All` only those present when `compact()` was called; a list sampled without result
/// is not sampled again.
async fn reclaim(w: &Writer, pick_by: Pick) -> Option<Job> {
    use std::sync::atomic::Ordering::Relaxed;
    let started = Instant::now();
    let (metas, version) = {
        let st = w.read_state();
        (st.manifest.generations.clone(), st.manifest.version)
    };
    if w.compaction.reclaim_checked.load(Relaxed) == version {
        return None;
    }
    let max_rows = w.reader.settings.compaction_max_rows as u64;
    let present = pick_by.present(&metas);
    for i in 0..present.len().saturating_sub(1) {
        let m = &present[i];
        if m.rows.saturating_mul(2) < max_rows {
            continue;
        }
        let newer = present[i + 1..].to_vec();
        let (Some(g), later) = (
            w.reader.generations.cached(std::slice::from_ref(m)).await,
            w.reader.generations.held(&newer).await,
        ) else {
            continue;
        };
        let share = superseded_share(&g[0], &later, RECLAIM_SAMPLES);
        if share >= 0.5 {
            tracing::debug!(
                "rewriting full generation {} ({} rows, about {:.0}% superseded)",
                m.id,
                m.rows,
                share * 100.0
            );
            return Some(Job {
                run: vec![m.clone()],
                newer,
                drop_tombstones: i == 0,
                urgent: matches!(pick_by, Pick::All(_)),
                started,
            });
        }
    }
    w.compaction.reclaim_checked.store(version, Relaxed);
    None
}

/// Build the merged generation and its object on a background thread at `lower`'s priority;
/// `None` when every row of the run was a superseded version or a dropped tombstone.
async fn build(
    w: &Writer,
    job: &Job,
    id: u64,
    inputs: &[Arc<Generation>],
    newer: &[Arc<Generation>],
    lower: Option<Arc<Raisable>>,
) -> Result<Option<(Generation, Vec<u8>)>> {
    let settings = &w.reader.settings;
    let epoch = w.epoch;
    let schema = w.reader.stored_schema.clone();
    let text = w.reader.text_schema.clone();
    let urgent = job.urgent;
    let vector = w
        .reader
        .schema
        .vector_spec(settings)
        .map(|(col, metric, mut params)| {
            params.threads = if urgent {
                0
            } else {
                settings.compaction_threads
            };
            params.ef_construction = settings.compaction_ef_construction;
            (col, metric, params)
        });
    let inputs = inputs.to_vec();
    let newer = newer.to_vec();
    let drop_tombstones = job.drop_tombstones;
    let continue_graph = settings.compaction_continue_graph;
    in_background_thread("lsmsearch-compact", lower, move || {
        // Each input's rows, read in full (their cold parts from the store) and decoded here,
        // at the compaction's priority, not on the runtime's threads: one input at a time.
        let read = |g: &Arc<Generation>| g.block_on(g.all_rows());
        let (rows, kept) = merge_rows(&inputs, &newer, read, drop_tombstones)?;
        if rows.num_rows() == 0 {
            return Ok(None);
        }
        let graph = match vector {
            Some((col, metric, params)) if continue_graph => {
                continue_largest(&inputs, &kept, &rows, col, metric, params)?
            }
            _ => None,
        };
        let spec = IndexSpec {
            text: text.as_deref(),
            vector,
        };
        let flushes = inputs.iter().map(|g| g.meta().flushes).sum();
        Generation::build(id, epoch, rows, &schema, spec, graph, flushes).map(Some)
    })
    .await
}

/// Create the merged generation's object (never overwriting one).
async fn upload(w: &Writer, id: u64, bytes: bytes::Bytes) -> Result<()> {
    let path = w.paths.generation(id, w.epoch);
    let create = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    w.loc
        .store
        .put_opts(&path, PutPayload::from(bytes), create)
        .await
        .map_err(|e| Error::store(&path, e))?;
    Ok(())
}

/// Compute the live rows of the list the compaction will publish (unless a flush adds to it
/// meanwhile), and the dead-row statistics of its merged generation under the memtables, at
/// the compaction's priority, so that neither the first query over it nor the publish lock
/// waits for them.
async fn stage(
    w: &Writer,
    job: &Job,
    merged: Option<&Arc<Generation>>,
    lower: Option<Arc<Raisable>>,
) {
    // The merged generation is counted under the memtables' keys only while full-text
    // searches count statistics (see `DeadRowCache::reads_ahead`): a writer that stopped
    // searching does no work, and keeps nothing, for searches that may never come.
    let keys = merged.is_some_and(|g| g.text().is_some()) && w.reader.caches.dead.reads_ahead();
    let Ok((listed, memtables)) = w.listed_and_memtable_keys(keys) else {
        return;
    };
    let replacement = merged.map(|g| g.meta().clone());
    if let Ok(expected) = replace_run(&listed, &job.run, replacement, false) {
        w.reader.compute_ahead(&expected, memtables, lower).await;
    }
}

/// `listed` with `run` replaced by `merged`; an error naming why not when `run` is not in it
/// any more, or (when tombstones are dropped) no longer at its start.
fn replace_run(
    listed: &[GenerationMeta],
    run: &[GenerationMeta],
    merged: Option<GenerationMeta>,
    drop_tombstones: bool,
) -> std::result::Result<Vec<GenerationMeta>, &'static str> {
    let at = listed
        .windows(run.len())
        .position(|w| w == run)
        .ok_or("the list changed")?;
    // Tombstones may only go when nothing older remains below them.
    if drop_tombstones && at != 0 {
        return Err("generations appeared below its run");
    }
    let mut out = listed.to_vec();
    out.splice(at..at + run.len(), merged);
    Ok(out)
}

/// Publish the run replaced by the merged generation (or by nothing, when every row of it was
/// a superseded version or a dropped tombstone), or give up when the list changed under the
/// compaction.
async fn publish_or_give_up(
    w: &Writer,
    job: Job,
    id: u64,
    inputs: Vec<Arc<Generation>>,
    merged: Option<Arc<Generation>>,
) -> Result<Option<CompactionReport>> {
    let merged_key = merged.as_ref().map(|g| (g.meta().id, g.meta().epoch));
    let forget = || async {
        if let Some(key) = merged_key {
            w.reader.generations.remove(key.0, key.1).await;
        }
    };
    let run_len = job.run.len();
    let give_up = |why: String| async move {
        tracing::info!("compaction of {run_len} generations given up: {why}");
        if let Some(merged) = merged_key {
            crate::gc::discard(&w.loc, &w.paths, &w.reader.generations, merged).await;
        }
        Ok(None)
    };
    let lock = w.publisher.lock.lock().await;
    if let Err(e) = settle(w).await {
        forget().await;
        return Err(e);
    }
    let base = w.read_state().manifest.clone();
    let replacement = merged.as_ref().map(|g| g.meta().clone());
    let generations = match replace_run(
        &base.generations,
        &job.run,
        replacement,
        job.drop_tombstones,
    ) {
        Ok(g) => g,
        Err(why) => {
            drop(lock);
            return give_up(why.to_string()).await;
        }
    };
    let mut next: Manifest = base.clone();
    next.version += 1;
    next.next_generation_id = next.next_generation_id.max(id + 1);
    next.generations = generations;
    // Recorded as unsure before the PUT: if this call is cancelled while the PUT is in flight
    // (a caller's timeout drops `compact()`), the version stays unsure and the next publish
    // settles it, instead of finding a manifest it cannot account for.
    *w.publisher.unsure() = Some(Unsure {
        manifest: next.clone(),
        run: job.run.clone(),
        inputs: inputs.iter().map(Arc::downgrade).collect(),
        merged: merged_key,
        took: job.started.elapsed(),
    });
    let outcome = publish::publish(w, &next).await;
    if !matches!(&outcome, Err(e) if !is_fenced(e)) {
        // Any outcome but an unknown one: the version is settled.
        *w.publisher.unsure() = None;
    }
    match outcome {
        Ok(Published::Ours) => {}
        // A flush's earlier attempt holds the version (its PUT reported an error, and landed):
        // its retry adopts it, and this run is given up.
        Ok(Published::Taken) => {
            drop(lock);
            let why = format!("a flush's earlier attempt holds manifest {}", next.version);
            return give_up(why).await;
        }
        // Fenced, it publishes nothing; otherwise the PUT may have landed although it
        // reported an error, or may still: it stays unsure, and the next publish (or
        // compaction) settles it.
        Err(e) => {
            if is_fenced(&e) {
                forget().await;
            }
            return Err(e);
        }
    }
    install(w, next.clone());
    drop(lock);
    let report = CompactionReport {
        generations_before: base.generations.len(),
        generations_after: next.generations.len(),
        rows_in: job.run.iter().map(|m| m.rows).sum(),
        rows_out: merged.as_ref().map_or(0, |g| g.meta().rows),
        bytes_in: job.run.iter().map(|m| m.bytes).sum(),
        bytes_out: merged.as_ref().map_or(0, |g| g.meta().bytes),
        millis: job.started.elapsed().as_millis() as u64,
    };
    w.compaction.published(
        &job.run,
        inputs.iter().map(Arc::downgrade),
        job.started.elapsed(),
    );
    drop(inputs);
    tracing::debug!(
        "compacted {} generations ({} rows) into {} rows (manifest {})",
        job.run.len(),
        report.rows_in,
        report.rows_out,
        next.version
    );
    clean_up_manifests(w, &next).await;
    Ok(Some(report))
}
