//! The write-ahead log on the object store: recovery (list, fetch and verify the WAL objects
//! after a manifest's replay point) and the writer's epoch fence. Objects are named
//! `wal/{id:020}.wal` with consecutive ids and written with a conditional PUT
//! (`PutMode::Create`), so two writers can never both write the same id: the loser learns it
//! was fenced. The object codec is `format::wal`.

use crate::format::wal::{decode, encode, WalEntry, WalKind};
use crate::storage::paths::{parse_wal, Paths};
use crate::{Error, Result};
use arrow::datatypes::SchemaRef;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::sync::Arc;

/// The WAL objects found after a replay point.
#[derive(Debug)]
pub(crate) struct Replayed {
    /// `(id, entry)` in id order, torn tail and fences removed.
    pub entries: Vec<(u64, WalEntry)>,
    /// The id after the last object seen (for a writer: after its fence).
    pub next_id: u64,
}

/// How recovery treats the WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A writer of `epoch`: deletes a torn last object, then claims the next id with a fence.
    Writer {
        /// The epoch the writer claimed.
        epoch: u64,
    },
    /// A read-only handle: ignores a torn last object, writes nothing.
    ReadOnly,
}

/// Read every WAL object from `from` on. A torn last object (short or failing its CRC, never
/// anything else) is discarded with a warning; a defect anywhere else, or a gap in the ids, is an error of kind
/// `Data` naming the object. A listed object that vanished before it was read (a concurrent flush
/// deleted it), or a gap, is reported as not found (kind `Data`) so the caller can reload the
/// manifest and retry.
pub(crate) async fn replay(
    store: &Arc<dyn ObjectStore>,
    paths: &Paths,
    schema: &SchemaRef,
    from: u64,
    mode: Mode,
    concurrency: usize,
) -> Result<Replayed> {
    replay_listed(store, paths, schema, from, mode, concurrency, None).await
}

/// The ids of the WAL objects from `from` on.
pub(crate) async fn list_from(
    store: &Arc<dyn ObjectStore>,
    paths: &Paths,
    from: u64,
) -> Result<Vec<u64>> {
    let dir = paths.wal_dir();
    let offset = paths.wal(from.saturating_sub(1));
    Ok(store
        .list_with_offset(Some(&dir), &offset)
        .map_ok(|m| parse_wal(&m.location))
        .try_collect::<Vec<_>>()
        .await
        .map_err(|e| Error::store(&dir, e))?
        .into_iter()
        .flatten()
        .filter(|id| *id >= from)
        .collect())
}

/// [`replay`], starting from `listed` (ids of a listing made beside the manifest's read:
/// those below `from` are left out) instead of a LIST of its own; a retry lists again.
pub(crate) async fn replay_listed(
    store: &Arc<dyn ObjectStore>,
    paths: &Paths,
    schema: &SchemaRef,
    from: u64,
    mode: Mode,
    concurrency: usize,
    mut listed: Option<Vec<u64>>,
) -> Result<Replayed> {
    loop {
        let mut ids: Vec<u64> = match listed.take() {
            Some(ids) => ids.into_iter().filter(|id| *id >= from).collect(),
            None => list_from(store, paths, from).await?,
        };
        ids.sort_unstable();
        for (i, id) in ids.iter().enumerate() {
            let expect = from + i as u64;
            if *id != expect {
                return Err(Error::not_found(
                    paths.wal(expect),
                    format!(
                        "WAL object is missing: the WAL jumps from id {} to id {id}",
                        expect.saturating_sub(1)
                    ),
                ));
            }
        }
        let fetched: Vec<(u64, bytes::Bytes)> = futures::stream::iter(ids.iter().copied())
            .map(|id| async move {
                let p = paths.wal(id);
                let b = crate::storage::read_object(store.as_ref(), &p).await?;
                Ok::<_, Error>((id, b))
            })
            .buffered(concurrency.max(1))
            .try_collect()
            .await?;
        let mut entries = Vec::with_capacity(fetched.len());
        let last = fetched.len().saturating_sub(1);
        let mut next_id = from;
        for (i, (id, bytes)) in fetched.into_iter().enumerate() {
            let p = paths.wal(id);
            match decode(bytes, schema, &p) {
                Ok(e) => {
                    next_id = id + 1;
                    if e.kind == WalKind::Rows {
                        entries.push((id, e));
                    }
                }
                // Only a short object or a CRC mismatch is a torn tail: a whole object this
                // build cannot read (a newer version, a bad payload) holds acknowledged rows.
                Err(e) if i == last && e.is_torn() => {
                    tracing::warn!("discarding torn WAL tail {p}: {e}");
                    if let Mode::Writer { .. } = mode {
                        match store.delete(&p).await {
                            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                            Err(e) => return Err(Error::store(&p, e)),
                        }
                    }
                    next_id = id;
                }
                Err(e) => return Err(e),
            }
        }
        let Mode::Writer { epoch } = mode else {
            return Ok(Replayed { entries, next_id });
        };
        // Claim the next id: an older writer's next WAL write collides with this fence.
        let fence = encode(
            &WalEntry {
                kind: WalKind::Fence,
                epoch,
                first_seq: 0,
                last_seq: 0,
                rows: None,
            },
            schema,
        )?;
        let p = paths.wal(next_id);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match store.put_opts(&p, PutPayload::from(fence), opts).await {
            Ok(_) => {
                return Ok(Replayed {
                    entries,
                    next_id: next_id + 1,
                })
            }
            // The previous writer appended meanwhile: read again and retry.
            Err(object_store::Error::AlreadyExists { .. }) => continue,
            Err(e) => return Err(Error::store(&p, e)),
        }
    }
}
