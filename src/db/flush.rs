//! The flusher: frozen memtable → generation object → manifest version → WAL cleanup.

use crate::compaction::urgency::raise_if_due;
use crate::format::manifest::Manifest;
use crate::generation::{Generation, IndexSpec};
use crate::memtable::{read_memtable, SharedMemtable};
use crate::priority::in_background_thread;
use crate::vector::graph::Adjacency;
use crate::vector::MemVectorIndex;
use crate::writer::publish::{self, clean_up_manifests, fenced_if_superseded, settle, Published};
use crate::writer::{is_fenced, Writer};
use crate::{Error, Result};
use arrow::array::RecordBatch;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How long a flush waits for a memtable graph inserter that makes no progress.
const STUCK_INSERTER: Duration = Duration::from_secs(30);

pub(crate) async fn run_flusher(inner: Arc<Writer>) {
    let mut backoff = Duration::from_millis(50);
    // After a failure the manifest write may have landed although it reported an error.
    let mut retrying = false;
    // The generation id of the memtable being flushed: every attempt builds the same object.
    let mut attempt: Option<(u64, u64)> = None;
    loop {
        let notified = inner.flushes.wake.notified();
        if inner.fenced.load(Ordering::SeqCst) || inner.closed.load(Ordering::SeqCst) {
            return;
        }
        let next = inner.read_state().frozen.front().cloned();
        let Some(m) = next else {
            notified.await;
            continue;
        };
        // At the generation cap, the flush waits for compaction (appends slow down through the
        // frozen-memtable queue meanwhile), unless compaction is failing.
        if over_cap(&inner) {
            // The compaction under way (if it started before the count reached the cap) is
            // what this flush waits for.
            raise_if_due(&inner, None);
            inner.compaction.wake.notify_one();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                _ = notified => {}
            }
            continue;
        }
        let started = std::time::Instant::now();
        let mid = read_memtable(&m).id();
        let gen_id = match attempt {
            Some((id, g)) if id == mid => g,
            _ => {
                let g = inner
                    .publisher
                    .next_generation_id
                    .fetch_add(1, Ordering::SeqCst);
                attempt = Some((mid, g));
                g
            }
        };
        match flush_one(&inner, &m, gen_id, retrying).await {
            Ok(()) => {
                inner.compaction.wake.notify_one();
                inner
                    .flushes
                    .last_ms
                    .store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                backoff = Duration::from_millis(50);
                retrying = false;
            }
            Err(e) => {
                retrying = true;
                let id = read_memtable(&m).id();
                tracing::warn!("flush of memtable {id} failed: {e}");
                if is_fenced(&e) {
                    inner.mark_fenced();
                }
                inner.flushes.status.send_modify(|s| {
                    s.error = Some(e.clone());
                    s.failures += 1;
                });
                // A freeze waiting for room gives up with this error.
                inner.flushes.backpressure.notify_waiters();
                if is_fenced(&e) {
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = notified => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Whether a flush must wait for compaction: compaction is on and not failing, the
/// generations are at the cap, and a merge can bring the count down (on a large index,
/// generations near `compaction_max_rows` may not fit together).
fn over_cap(inner: &Writer) -> bool {
    let s = &inner.reader.settings;
    let gens = &inner.read_state().manifest.generations;
    s.compaction
        && crate::compaction::policy::open(
            gens.iter().map(|g| g.rows),
            s.compaction_max_rows as u64,
        ) >= s.compaction_max_generations
        && inner.compaction.telemetry().last_error.is_none()
        && crate::compaction::policy::debt(
            gens,
            s.compaction_fanout,
            s.compaction_max_generations,
            s.compaction_max_rows as u64,
        ) > 0
}

/// The manifest version after `base` when this writer already published it (an earlier
/// attempt whose manifest PUT landed but reported an error): the next version, of this epoch,
/// holding `base`'s generations and generation `gen_id`. Fenced when a newer version exists:
/// that PUT may have re-created a version a newer writer had pruned (see
/// [`fenced_if_superseded`]).
async fn published_earlier(
    inner: &Writer,
    base: &Manifest,
    gen_id: u64,
) -> Result<Option<Manifest>> {
    match inner.manifests.read(base.version + 1).await {
        Ok(m) => {
            let n = base.generations.len();
            let ours = m.epoch == inner.epoch
                && m.generations.len() == n + 1
                && m.generations[..n] == base.generations[..]
                && m.generations[n].id == gen_id
                && m.generations[n].epoch == inner.epoch;
            if !ours {
                return Ok(None);
            }
            fenced_if_superseded(inner, m.version).await?;
            Ok(Some(m))
        }
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The memtable's graph, every row in, as the generation's: no row is inserted into a graph
/// twice. `None` (the generation's graph is built afresh) when the graph has no room for every
/// row (2^28 ids), or when the background inserter makes no progress for a while (it should
/// not happen) instead of waiting on. `rows` are the memtable's batches, their first rows and
/// its row count; `ordinals` the rows the generation keeps.
fn finish_graph(
    mid: u64,
    graph: &MemVectorIndex,
    (batches, offsets, mrows): (Vec<RecordBatch>, Vec<usize>, usize),
    ordinals: &[usize],
) -> Option<Adjacency> {
    if graph.coverable(mrows) < mrows {
        return None;
    }
    let mut progress = (graph.indexed(), std::time::Instant::now());
    while graph.indexed() < mrows {
        if let Some(_role) = graph.try_start() {
            graph.catch_up(&batches, &offsets, mrows, &|| true);
        } else if graph.indexed() != progress.0 {
            progress = (graph.indexed(), std::time::Instant::now());
        } else if progress.1.elapsed() > STUCK_INSERTER {
            tracing::warn!(
                "memtable {mid}: its graph inserter is stuck; building the graph at flush"
            );
            return None;
        } else {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    graph.to_adjacency(mrows, ordinals)
}

async fn flush_one(
    inner: &Arc<Writer>,
    m: &SharedMemtable,
    gen_id: u64,
    retrying: bool,
) -> Result<()> {
    let (rows, ordinals, mem_graph, last_wal_id, wal_ids, max_seq, mid) = {
        let g = read_memtable(m);
        let ids = g.wal_ids().to_vec();
        let (rows, ordinals) = g.newest()?;
        let graph = g.graph().map(|graph| (graph, g.batches()));
        (
            rows,
            ordinals,
            graph,
            g.last_wal_id(),
            ids,
            g.max_seq(),
            g.id(),
        )
    };
    let epoch = inner.epoch;
    if retrying {
        let publish = inner.publisher.lock.lock().await;
        settle(inner).await?;
        let base = inner.read_state().manifest.clone();
        if let Some(next) = published_earlier(inner, &base, gen_id).await? {
            return adopt(inner, mid, next, publish, &wal_ids).await;
        }
    }
    let schema = inner.reader.stored_schema.clone();
    let text = inner.reader.text_schema.clone();
    let vector = inner.reader.schema.vector_spec(&inner.reader.settings);
    let (_, bytes) = in_background_thread("lsmsearch-flush", None, move || {
        let spec = IndexSpec {
            text: text.as_deref(),
            vector,
        };
        let graph = mem_graph.and_then(|(graph, rows)| finish_graph(mid, &graph, rows, &ordinals));
        Generation::build(gen_id, epoch, rows, &schema, spec, graph, 1)
    })
    .await?;
    // Created, never overwritten: if an earlier attempt's PUT landed (whatever it reported),
    // that object is the one a manifest may name, so it is read back and used instead of the
    // one just built (a rebuilt graph differs from it).
    let path = inner.paths.generation(gen_id, epoch);
    let create = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    let bytes = bytes::Bytes::from(bytes);
    let object = match inner
        .loc
        .store
        .put_opts(&path, PutPayload::from(bytes.clone()), create)
        .await
    {
        Ok(_) => bytes,
        Err(object_store::Error::AlreadyExists { .. }) => {
            drop(bytes);
            crate::storage::read_object(inner.loc.store.as_ref(), &path).await?
        }
        Err(e) => return Err(Error::store(&path, e)),
    };

    // Cached first (opened from its hot part, as a reader would), so the first query that
    // sees the generation finds it; and the live rows of the list it will publish (unless a
    // compaction publishes first) computed before taking the publish lock.
    let generation = inner.reader.generations.insert_built(object, true).await?;
    let mut expected = inner.read_state().manifest.generations.clone();
    expected.push(generation.meta().clone());
    // Not under the memtables: the one flushed is among them until the list is published.
    inner
        .reader
        .compute_ahead(&expected, Vec::new(), None)
        .await;

    // Publish, from the latest version (a compaction may have published since the build).
    let publish = inner.publisher.lock.lock().await;
    settle(inner).await?;
    let base = inner.read_state().manifest.clone();
    let mut next = base.clone();
    next.version += 1;
    next.generations.push(generation.meta().clone());
    next.next_generation_id = next.next_generation_id.max(gen_id + 1);
    if let Some(w) = last_wal_id {
        next.wal_replay_from = next.wal_replay_from.max(w + 1);
    }
    next.last_seq = next.last_seq.max(max_seq);
    if publish::publish(inner, &next).await? == Published::Taken {
        // An earlier attempt of this flush landed after its retry looked for it: adopt it.
        return match published_earlier(inner, &base, gen_id).await? {
            Some(earlier) => adopt(inner, mid, earlier, publish, &wal_ids).await,
            None => Err(Error::internal(format!(
                "manifest version {} holds a manifest of this writer that no flush or \
                 compaction of it accounts for",
                next.version
            ))),
        };
    }
    swap(inner, mid, &next)?;
    drop(publish);
    raise_if_due(
        inner,
        Some(crate::compaction::policy::open(
            next.generations.iter().map(|g| g.rows),
            inner.reader.settings.compaction_max_rows as u64,
        )),
    );
    finish(inner, mid, next, generation, &wal_ids).await
}

/// Adopt manifest `next`, which an earlier attempt of the flush of memtable `mid` published
/// (its PUT reported an error and landed): the generation object it names is read back, never
/// rebuilt (a rebuilt graph may differ from the one the published manifest describes).
async fn adopt(
    inner: &Arc<Writer>,
    mid: u64,
    next: Manifest,
    publish: tokio::sync::MutexGuard<'_, ()>,
    wal_ids: &[u64],
) -> Result<()> {
    tracing::info!(
        "manifest {} of memtable {mid} was published by an earlier attempt",
        next.version
    );
    let meta = next.generations[next.generations.len() - 1].clone();
    let generation = inner
        .reader
        .generations
        .get_all(std::slice::from_ref(&meta))
        .await?
        .pop()
        .ok_or_else(|| Error::internal("the generation cache returned nothing"))?;
    swap(inner, mid, &next)?;
    drop(publish);
    finish(inner, mid, next, generation, wal_ids).await
}

/// The visibility point of a flush: swap the frozen memtable `mid` for manifest `next` (which
/// names its generation) in one step.
fn swap(inner: &Writer, mid: u64, next: &Manifest) -> Result<()> {
    let mut st = inner.write_state();
    match st.frozen.front() {
        Some(f) if read_memtable(f).id() == mid => {
            st.frozen.pop_front();
            st.manifest = next.clone();
            Ok(())
        }
        _ => Err(Error::internal(
            "frozen memtable queue changed during a flush",
        )),
    }
}

/// After manifest `next` naming `generation` is published and swapped in: report the flush,
/// and clean up what it covers.
async fn finish(
    inner: &Arc<Writer>,
    mid: u64,
    next: Manifest,
    generation: Arc<Generation>,
    wal_ids: &[u64],
) -> Result<()> {
    let gen_id = generation.meta().id;
    inner.flushes.backpressure.notify_waiters();
    inner.flushes.status.send_modify(|s| {
        s.flushed_upto = mid;
        s.error = None;
    });
    tracing::debug!(
        "flushed memtable {mid} as generation {gen_id} (manifest {})",
        next.version
    );
    // Cleanup, best effort: the WAL objects holding the flushed rows (see `gc::wal`), old
    // manifests.
    let conc = inner.reader.settings.io_concurrency;
    tokio::join!(
        inner
            .flushes
            .kept_wal
            .after_flush(&inner.loc, &inner.paths, wal_ids, conc),
        clean_up_manifests(inner, &next),
    );
    Ok(())
}
