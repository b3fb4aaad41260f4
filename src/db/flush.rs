//! The flusher: frozen memtable → generation object → manifest version → WAL cleanup.

use super::{is_fenced, read_memtable, Inner, SharedMemtable};
use crate::generation::{Generation, IndexSpec};
use crate::manifest::{delete_all, WriteOutcome};
use crate::{Error, Result};
use object_store::ObjectStoreExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub(crate) async fn run_flusher(inner: Arc<Inner>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let notified = inner.flush_wake.notified();
        if inner.fenced.load(Ordering::SeqCst) || inner.closed.load(Ordering::SeqCst) {
            return;
        }
        let next = inner.read_state().frozen.front().cloned();
        let Some(m) = next else {
            notified.await;
            continue;
        };
        match flush_one(&inner, &m).await {
            Ok(()) => backoff = Duration::from_millis(50),
            Err(e) => {
                let id = read_memtable(&m).id();
                tracing::warn!("flush of memtable {id} failed: {e}");
                if is_fenced(&e) {
                    inner.mark_fenced();
                }
                inner
                    .flush_status
                    .send_modify(|s| s.error = Some(e.clone()));
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

async fn flush_one(inner: &Arc<Inner>, m: &SharedMemtable) -> Result<()> {
    let (rows, last_wal_id, wal_ids, max_seq, mid) = {
        let g = read_memtable(m);
        let ids = g.wal_ids().to_vec();
        (g.newest_rows()?, g.last_wal_id(), ids, g.max_seq(), g.id())
    };
    let base = inner.read_state().manifest.clone();
    let gen_id = base.next_generation_id;
    let epoch = inner.epoch;
    let schema = inner.reader.stored_schema.clone();
    let text = inner.reader.text_schema.clone();
    let vector = inner.reader.schema.vector_spec(&inner.reader.settings);
    let (generation, bytes) = tokio::task::spawn_blocking(move || {
        let spec = IndexSpec {
            text: text.as_deref(),
            vector,
        };
        Generation::build(gen_id, epoch, rows, &schema, spec)
    })
    .await??;
    let path = inner.paths.generation(gen_id, epoch);
    inner
        .loc
        .store
        .put(&path, bytes.into())
        .await
        .map_err(|e| Error::store(&path, e))?;

    let mut next = base.clone();
    next.version += 1;
    next.generations.push(generation.meta().clone());
    next.next_generation_id = gen_id + 1;
    if let Some(w) = last_wal_id {
        next.wal_replay_from = next.wal_replay_from.max(w + 1);
    }
    next.last_seq = next.last_seq.max(max_seq);
    match inner.manifests.write(&next).await? {
        WriteOutcome::Written => {}
        WriteOutcome::Conflict => {
            let latest = inner.manifests.load_latest().await?;
            return Err(match latest {
                Some(l) if l.epoch > epoch => inner.fenced_error(),
                _ => Error::internal(format!(
                    "manifest version {} was created by another handle of epoch {epoch}",
                    next.version
                )),
            });
        }
    }
    // Cached first, so the first query that sees the generation finds it decoded.
    inner.reader.generations.insert(Arc::new(generation)).await;
    // The visibility point: swap the frozen memtable for its generation in one step.
    {
        let mut st = inner.write_state();
        st.manifest = next.clone();
        match st.frozen.front() {
            Some(f) if read_memtable(f).id() == mid => {
                st.frozen.pop_front();
            }
            _ => {
                return Err(Error::internal(
                    "frozen memtable queue changed during a flush",
                ))
            }
        }
    }
    inner.backpressure.notify_waiters();
    inner.flush_status.send_modify(|s| {
        s.flushed_upto = mid;
        s.error = None;
    });
    tracing::debug!(
        "flushed memtable {mid} as generation {gen_id} (manifest {})",
        next.version
    );
    // Cleanup, best effort: the WAL objects holding the flushed rows, old manifests. Fence
    // objects are kept: a fenced writer's next WAL PUT targets the id of the fence that fenced
    // it, and must collide with it however long that writer stalls (deleting the fence would
    // let it write below the replay point: acknowledged, never replayed).
    //
    // The last of them is kept until the next flush: a reader that read the previous manifest
    // and lists the WAL from its replay point after this cleanup then finds a gap before the
    // kept object (or the kept object itself, at the replay point) and starts over on the new
    // manifest, instead of seeing the old generations without these rows.
    let mut doomed: Vec<u64> = wal_ids.split_last().map_or(&[][..], |(_, r)| r).to_vec();
    {
        let mut kept = inner.kept_wal.lock().unwrap_or_else(|e| e.into_inner());
        doomed.extend(kept.take());
        *kept = wal_ids.last().copied();
    }
    let wal: Vec<_> = doomed.iter().map(|id| inner.paths.wal(*id)).collect();
    let conc = inner.reader.settings.io_concurrency;
    let manifests = inner.manifests.clone();
    tokio::join!(
        delete_all(&inner.loc.store, wal, conc),
        manifests.publish_hint(next.version),
    );
    if next.version > inner.reader.settings.manifest_retention {
        manifests
            .prune(next.version, inner.reader.settings.manifest_retention, conc)
            .await;
    }
    Ok(())
}
