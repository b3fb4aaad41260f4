//! The memtable: every row appended since the last freeze, with its sequence number, and a
//! primary key → newest version map.
//!
//! Rows are kept as the stored Arrow batches they arrived in (user columns, `_seq`, `_deleted`);
//! the key map points at the newest version of each key, tombstones included, and a flag per row
//! says whether it is live in the memtable (its key's newest version, not a tombstone), which a
//! search takes with its view instead of comparing versions itself. The memtable's
//! full-text index ([`MemTextIndex`]) and vector graph ([`MemVectorIndex`]) hang off this type.

mod background;

pub(crate) use background::{catch_up, read_memtable, write_memtable, SharedMemtable};

use crate::flags::RowFlags;
use crate::key::Key;
use crate::schema::{deleted_flags, SEQ_COLUMN};
use crate::text::{MemTextIndex, TextSchema};
use crate::vector::{MemGraphSpec, MemVectorIndex};
use crate::Result;
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{SchemaRef, UInt64Type};
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy)]
struct Slot {
    batch: u32,
    row: u32,
    seq: u64,
    hash: u64,
}

/// Rows in memory, newest version per key.
#[derive(Debug)]
pub(crate) struct Memtable {
    id: u64,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    /// Row ordinal of the first row of each batch.
    offsets: Vec<usize>,
    index: HashMap<Key, Slot>,
    text: Option<Arc<MemTextIndex>>,
    /// The key hash of every row, one slice per stored batch.
    row_hashes: Vec<Arc<[u64]>>,
    /// Per row: the newest version of its key here, and not a tombstone.
    live: RowFlags,
    graph_spec: Option<MemGraphSpec>,
    graph: Option<Arc<MemVectorIndex>>,
    rows: usize,
    bytes: usize,
    max_seq: u64,
    /// Ids of the WAL objects holding rows of this memtable, ascending.
    wal_ids: Vec<u64>,
    /// First of the trailing batches that may still be coalesced (see
    /// [`Memtable::coalesce`]).
    open_from: usize,
}

/// Batches of fewer rows than this are coalesced; a larger one is kept as it came.
const SMALL_BATCH: usize = 512;
/// Trailing small batches are coalesced once there are this many of them...
const COALESCE_BATCHES: usize = 32;
/// ...into one batch, which takes more batches until it holds this many rows.
const COALESCED_ROWS: usize = 4096;

impl Memtable {
    /// An empty memtable for stored rows of `schema`; `id` orders memtables of one handle.
    /// With `graph`, a vector graph is started once the memtable holds `graph.above` rows (see
    /// [`Memtable::graph_behind`]).
    pub(crate) fn new(
        id: u64,
        schema: SchemaRef,
        text: Option<&Arc<TextSchema>>,
        graph: Option<MemGraphSpec>,
    ) -> Result<Self> {
        let text = match text {
            Some(ts) => Some(Arc::new(MemTextIndex::new(ts.clone())?)),
            None => None,
        };
        Ok(Memtable {
            id,
            schema,
            batches: Vec::new(),
            offsets: Vec::new(),
            index: HashMap::new(),
            text,
            row_hashes: Vec::new(),
            live: RowFlags::default(),
            graph_spec: graph,
            graph: None,
            rows: 0,
            bytes: 0,
            max_seq: 0,
            wal_ids: Vec::new(),
            open_from: 0,
        })
    }

    /// The memtable's id (increasing within one handle).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Add stored rows. For each key the row with the highest sequence number wins (so a later
    /// row of the same batch wins, and applying batches out of order is still correct).
    pub(crate) fn apply(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let seqs = batch
            .column_by_name(SEQ_COLUMN)
            .ok_or_else(|| crate::Error::internal("stored batch without _seq"))?
            .as_primitive::<UInt64Type>()
            .clone();
        let keys = batch.column(0).clone();
        let deleted = deleted_flags(&batch);
        let b = self.batches.len() as u32;
        // Every key first: a batch that fails changes nothing (the key map and the row flags
        // stay in step with the rows).
        let batch_keys = (0..batch.num_rows())
            .map(|row| {
                Key::from_array(keys.as_ref(), row)
                    .ok_or_else(|| crate::Error::internal("stored row with a null key"))
            })
            .collect::<Result<Vec<Key>>>()?;
        let mut hashes = Vec::with_capacity(batch.num_rows());
        for (row, key) in batch_keys.into_iter().enumerate() {
            let seq = seqs.value(row);
            self.max_seq = self.max_seq.max(seq);
            let slot = Slot {
                batch: b,
                row: row as u32,
                seq,
                hash: key.hash64(),
            };
            hashes.push(slot.hash);
            let ord = self.rows + row;
            // The row is live when it is now its key's newest version and not a tombstone;
            // the version it replaces no longer is.
            let newest = match self.index.entry(key) {
                std::collections::hash_map::Entry::Occupied(mut e) if seq >= e.get().seq => {
                    let old = e.insert(slot);
                    let old_ord = if old.batch == b {
                        self.rows + old.row as usize
                    } else {
                        self.offsets[old.batch as usize] + old.row as usize
                    };
                    self.live.clear(old_ord);
                    true
                }
                std::collections::hash_map::Entry::Occupied(_) => false,
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(slot);
                    true
                }
            };
            debug_assert_eq!(self.live.len(), ord);
            self.live.push(newest && !deleted.value(row));
        }
        self.row_hashes.push(hashes.into());
        self.offsets.push(self.rows);
        self.rows += batch.num_rows();
        self.bytes += batch.get_array_memory_size();
        let small = batch.num_rows() < SMALL_BATCH;
        self.batches.push(batch);
        if !small {
            self.open_from = self.batches.len();
        } else if self.batches.len() - self.open_from >= COALESCE_BATCHES {
            self.coalesce()?;
        }
        if let (None, Some(spec)) = (&self.graph, &self.graph_spec) {
            if self.rows >= spec.above {
                self.graph = MemVectorIndex::new(spec).map(Arc::new);
                self.graph_spec = None;
            }
        }
        Ok(())
    }

    /// Concatenate the trailing batches from `open_from` into one, so that a memtable fed by
    /// many small appends holds few batches and what a search copies of it (the batch list,
    /// see [`Memtable::search_view`]) does not grow with the number of appends. Row ordinals
    /// are unchanged (the text index and the graph refer to rows by ordinal); the key map is
    /// pointed at the new batch.
    fn coalesce(&mut self) -> Result<()> {
        let from = self.open_from;
        let merged = arrow::compute::concat_batches(&self.schema, &self.batches[from..])?;
        let base = self.offsets[from];
        let keys = merged.column(0).clone();
        for row in 0..merged.num_rows() {
            let key = Key::from_array(keys.as_ref(), row)
                .ok_or_else(|| crate::Error::internal("stored row with a null key"))?;
            if let Some(slot) = self.index.get_mut(&key) {
                let b = slot.batch as usize;
                if b >= from && self.offsets[b] + slot.row as usize == base + row {
                    slot.batch = from as u32;
                    slot.row = row as u32;
                }
            }
        }
        let hashes: Vec<u64> = self.row_hashes[from..]
            .iter()
            .flat_map(|h| h.iter().copied())
            .collect();
        self.bytes -= self.batches[from..]
            .iter()
            .map(RecordBatch::get_array_memory_size)
            .sum::<usize>();
        self.bytes += merged.get_array_memory_size();
        let rows = merged.num_rows();
        self.batches.truncate(from);
        self.batches.push(merged);
        self.offsets.truncate(from + 1);
        self.row_hashes.truncate(from);
        self.row_hashes.push(hashes.into());
        if rows >= COALESCED_ROWS {
            self.open_from = self.batches.len();
        }
        Ok(())
    }

    /// The vector graph when it lags behind the rows (the caller runs its catch-up).
    pub(crate) fn graph_behind(&self) -> Option<Arc<MemVectorIndex>> {
        self.graph
            .as_ref()
            .filter(|g| g.indexed() < g.coverable(self.rows))
            .cloned()
    }

    /// The full-text index, when the schema has text columns.
    pub(crate) fn text(&self) -> Option<Arc<MemTextIndex>> {
        self.text.clone()
    }

    /// Rows not yet in the vector graph (0 without one: a memtable below the graph's
    /// threshold is small, and a `dot` memtable is scanned by design).
    pub(crate) fn unindexed_rows(&self) -> usize {
        self.graph
            .as_ref()
            .map_or(0, |g| g.coverable(self.rows).saturating_sub(g.indexed()))
    }

    /// Rows in the vector graph (0 without one).
    pub(crate) fn graph_rows(&self) -> usize {
        self.graph.as_ref().map_or(0, |g| g.indexed())
    }

    /// The stored batches, their first ordinals and the row count, for a graph catch-up.
    pub(crate) fn batches(&self) -> (Vec<RecordBatch>, Vec<usize>, usize) {
        (self.batches.clone(), self.offsets.clone(), self.rows)
    }

    /// Record that WAL object `id` holds rows applied to this memtable.
    pub(crate) fn add_wal_id(&mut self, id: u64) {
        if let Err(at) = self.wal_ids.binary_search(&id) {
            self.wal_ids.insert(at, id);
        }
    }

    /// The last WAL object holding rows of this memtable.
    pub(crate) fn last_wal_id(&self) -> Option<u64> {
        self.wal_ids.last().copied()
    }

    /// The WAL objects holding rows of this memtable, ascending: what its flush may delete
    /// (never a fence object, which must outlive every writer it fenced).
    pub(crate) fn wal_ids(&self) -> &[u64] {
        &self.wal_ids
    }

    /// Rows applied (every version and tombstone).
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes of Arrow buffers held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Highest sequence number applied (0 when empty).
    pub(crate) fn max_seq(&self) -> u64 {
        self.max_seq
    }

    /// True when nothing was applied.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// A consistent view for a search: the stored batches, the row count, and which rows are
    /// live (in time independent of the rows: the flags are shared, not copied).
    pub(crate) fn search_view(&self) -> MemtableView {
        MemtableView {
            id: self.id,
            batches: self.batches.clone(),
            offsets: self.offsets.clone(),
            rows: self.rows,
            live: self.live.clone(),
            text: self.text.clone(),
            graph: self.graph.clone(),
            row_hashes: self.row_hashes.clone(),
        }
    }

    /// A view of the memtable's keys only (its stored batches cut to the key column, no text
    /// index, no graph): what finds the rows it supersedes of older sources, without holding
    /// the rest of the memtable.
    pub(crate) fn keys_view(&self) -> Result<MemtableView> {
        Ok(MemtableView {
            id: self.id,
            batches: self
                .batches
                .iter()
                .map(|b| b.project(&[0]))
                .collect::<std::result::Result<_, _>>()?,
            offsets: self.offsets.clone(),
            rows: self.rows,
            live: self.live.clone(),
            text: None,
            graph: None,
            row_hashes: self.row_hashes.clone(),
        })
    }

    /// The newest version of every key (tombstones included), in sequence order, as one stored
    /// batch (what a flush writes), and the memtable row ordinal of each of its rows.
    pub(crate) fn newest(&self) -> Result<(RecordBatch, Vec<usize>)> {
        let mut slots: Vec<Slot> = self.index.values().copied().collect();
        slots.sort_unstable_by_key(|s| s.seq);
        let idx: Vec<(usize, usize)> = slots
            .iter()
            .map(|s| (s.batch as usize, s.row as usize))
            .collect();
        let ordinals = idx.iter().map(|(b, r)| self.offsets[*b] + r).collect();
        if idx.is_empty() {
            return Ok((RecordBatch::new_empty(self.schema.clone()), ordinals));
        }
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for c in 0..self.schema.fields().len() {
            let arrays: Vec<&dyn Array> =
                self.batches.iter().map(|b| b.column(c).as_ref()).collect();
            columns.push(arrow::compute::interleave(&arrays, &idx)?);
        }
        Ok((
            RecordBatch::try_new(self.schema.clone(), columns)?,
            ordinals,
        ))
    }

    /// The vector graph, when the memtable has one.
    pub(crate) fn graph(&self) -> Option<Arc<MemVectorIndex>> {
        self.graph.clone()
    }
}

/// What a search reads of a memtable (see [`Memtable::search_view`]).
#[derive(Debug, Clone)]
pub(crate) struct MemtableView {
    /// The memtable's id (live rows computed for it are kept under this id).
    pub id: u64,
    /// Stored batches.
    pub batches: Vec<RecordBatch>,
    /// Row ordinal of the first row of each batch.
    pub offsets: Vec<usize>,
    /// Rows in the view.
    pub rows: usize,
    /// Per row of the view: the newest version of its key in the memtable, and not a
    /// tombstone.
    pub live: RowFlags,
    /// The memtable's full-text index.
    pub text: Option<Arc<MemTextIndex>>,
    /// The memtable's vector graph, covering a prefix of the rows.
    pub graph: Option<Arc<MemVectorIndex>>,
    /// The key hash of every row, one slice per stored batch.
    pub row_hashes: Vec<Arc<[u64]>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{deleted_flags, IndexSchema};
    use arrow::array::{Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn newest_version_wins_within_and_across_batches() {
        let s = IndexSchema::from_json(
            r#"{"primary_key": "id", "text": ["t"], "payload": [{"name": "v", "type": "int64"}]}"#,
        )
        .unwrap();
        let user = |ids: Vec<&str>, vs: Vec<i64>| {
            RecordBatch::try_new(
                s.arrow_schema(),
                vec![
                    Arc::new(StringArray::from(ids.clone())),
                    Arc::new(StringArray::from(ids)),
                    Arc::new(Int64Array::from(vs)),
                ],
            )
            .unwrap()
        };
        let mut m = Memtable::new(0, s.stored_schema(), None, None).unwrap();
        m.apply(
            s.to_stored(&user(vec!["a", "b", "a"], vec![1, 2, 3]), 1)
                .unwrap(),
        )
        .unwrap();
        // An out-of-order (older) batch does not override newer versions.
        m.apply(s.to_stored(&user(vec!["a"], vec![0]), 0).unwrap())
            .unwrap();
        let keys: ArrayRefStr = Arc::new(StringArray::from(vec!["b"]));
        m.apply(s.tombstones(&keys, 10).unwrap()).unwrap();
        let rows = m.newest().unwrap().0;
        assert_eq!(rows.num_rows(), 2);
        let v = rows.column(2).as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(v.value(0), 3); // "a" newest = 3 (seq 3)
        assert!(deleted_flags(&rows).value(1)); // "b" is a tombstone
        assert_eq!(m.rows(), 5);
        assert_eq!(m.max_seq(), 10);
        // Live: only the second "a" (the older one applied after it, a superseded "a", "b"
        // and its tombstone are not).
        let live = m.search_view().live;
        assert_eq!(
            (0..6).map(|r| live.get(r)).collect::<Vec<_>>(),
            [false, false, true, false, false, false]
        );
        assert_eq!(live.count(), 1);
    }

    type ArrayRefStr = arrow::array::ArrayRef;

    #[test]
    fn many_small_appends_are_coalesced_without_changing_a_row() {
        let s = IndexSchema::from_json(
            r#"{"primary_key": "id", "text": ["t"], "payload": [{"name": "v", "type": "int64"}]}"#,
        )
        .unwrap();
        let mut m = Memtable::new(0, s.stored_schema(), None, None).unwrap();
        // 10,000 one-row appends over 300 keys: versions supersede each other across the
        // coalesced batches.
        for i in 0..10_000i64 {
            let id = format!("k{}", i % 300);
            let user = RecordBatch::try_new(
                s.arrow_schema(),
                vec![
                    Arc::new(StringArray::from(vec![id.as_str()])),
                    Arc::new(StringArray::from(vec!["t"])),
                    Arc::new(Int64Array::from(vec![i])),
                ],
            )
            .unwrap();
            m.apply(s.to_stored(&user, i as u64 + 1).unwrap()).unwrap();
        }
        assert_eq!(m.rows(), 10_000);
        assert!(m.batches.len() < 100, "{} batches", m.batches.len());
        let (rows, ordinals) = m.newest().unwrap();
        assert_eq!(rows.num_rows(), 300);
        let v = rows.column(2).as_primitive::<arrow::datatypes::Int64Type>();
        for (r, ord) in ordinals.iter().enumerate() {
            // The newest version of key k{j} is the last i with i % 300 == j.
            let i = v.value(r);
            assert!(i >= 10_000 - 300, "row {r} holds an old version {i}");
            assert_eq!(*ord, i as usize, "ordinal of row {r}");
        }
        let view = m.search_view();
        let hashes: usize = view.row_hashes.iter().map(|h| h.len()).sum();
        assert_eq!(hashes, 10_000);
        let mut newest = ordinals.clone();
        newest.sort_unstable();
        assert_eq!(view.live.iter_set().collect::<Vec<_>>(), newest);
        assert_eq!(
            *view.offsets.last().unwrap() + view.batches.last().unwrap().num_rows(),
            10_000
        );
    }
}
