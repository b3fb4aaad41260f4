//! The memtable: every row appended since the last freeze, with its sequence number, and a
//! primary key → newest version map.
//!
//! Rows are kept as the stored Arrow batches they arrived in (user columns, `_seq`, `_deleted`);
//! the key map points at the newest version of each key, tombstones included. The full-text and
//! vector indexes over the memtable hang off this type (see `index/`); they observe every
//! [`Memtable::apply`].

use crate::index::text::{MemTextIndex, TextSchema};
use crate::index::vector::{MemGraphSpec, MemVectorIndex};
use crate::key::Key;
use crate::schema::{DELETED_COLUMN, SEQ_COLUMN};
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
pub struct Memtable {
    id: u64,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    /// Row ordinal of the first row of each batch.
    offsets: Vec<usize>,
    index: HashMap<Key, Slot>,
    text: Option<Arc<MemTextIndex>>,
    /// The key hash of every row, one slice per stored batch.
    row_hashes: Vec<Arc<[u64]>>,
    /// Per generation id: how many rows were checked against it, and its rows they hide.
    kills: Arc<KillCache>,
    graph_spec: Option<MemGraphSpec>,
    graph: Option<Arc<MemVectorIndex>>,
    rows: usize,
    bytes: usize,
    max_seq: u64,
    last_wal_id: Option<u64>,
}

impl Memtable {
    /// An empty memtable for stored rows of `schema`; `id` orders memtables of one handle.
    /// With `graph`, a vector graph is started once the memtable holds `graph.above` rows (see
    /// [`Memtable::graph_behind`]).
    pub fn new(
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
            kills: Arc::default(),
            graph_spec: graph,
            graph: None,
            rows: 0,
            bytes: 0,
            max_seq: 0,
            last_wal_id: None,
        })
    }

    /// The memtable's id (increasing within one handle).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Add stored rows. For each key the row with the highest sequence number wins (so a later
    /// row of the same batch wins, and applying batches out of order is still correct).
    pub fn apply(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let seqs = batch
            .column_by_name(SEQ_COLUMN)
            .ok_or_else(|| crate::Error::internal("stored batch without _seq"))?
            .as_primitive::<UInt64Type>()
            .clone();
        let keys = batch.column(0).clone();
        let b = self.batches.len() as u32;
        let mut hashes = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let key = Key::from_array(keys.as_ref(), row)
                .ok_or_else(|| crate::Error::internal("stored row with a null key"))?;
            let seq = seqs.value(row);
            self.max_seq = self.max_seq.max(seq);
            let slot = Slot {
                batch: b,
                row: row as u32,
                seq,
                hash: key.hash64(),
            };
            hashes.push(slot.hash);
            self.index
                .entry(key)
                .and_modify(|s| {
                    if seq >= s.seq {
                        *s = slot
                    }
                })
                .or_insert(slot);
        }
        self.row_hashes.push(hashes.into());
        self.offsets.push(self.rows);
        self.rows += batch.num_rows();
        self.bytes += batch.get_array_memory_size();
        self.batches.push(batch);
        if let (None, Some(spec)) = (&self.graph, &self.graph_spec) {
            if self.rows >= spec.above {
                self.graph = MemVectorIndex::new(spec).map(Arc::new);
                self.graph_spec = None;
            }
        }
        Ok(())
    }

    /// The vector graph when it lags behind the rows (the caller runs its catch-up).
    pub fn graph_behind(&self) -> Option<Arc<MemVectorIndex>> {
        self.graph
            .as_ref()
            .filter(|g| g.indexed() < self.rows)
            .cloned()
    }

    /// Rows in the vector graph (0 without one).
    pub fn graph_rows(&self) -> usize {
        self.graph.as_ref().map_or(0, |g| g.indexed())
    }

    /// The stored batches, their first ordinals and the row count, for a graph catch-up.
    pub fn batches(&self) -> (Vec<RecordBatch>, Vec<usize>, usize) {
        (self.batches.clone(), self.offsets.clone(), self.rows)
    }

    /// Record that the rows applied so far are covered by WAL objects up to `id`.
    pub fn set_last_wal_id(&mut self, id: u64) {
        self.last_wal_id = Some(self.last_wal_id.map_or(id, |w| w.max(id)));
    }

    /// The last WAL object holding rows of this memtable.
    pub fn last_wal_id(&self) -> Option<u64> {
        self.last_wal_id
    }

    /// Rows applied (every version and tombstone).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Distinct keys (live or tombstoned).
    pub fn keys(&self) -> usize {
        self.index.len()
    }

    /// Bytes of Arrow buffers held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Highest sequence number applied (0 when empty).
    pub fn max_seq(&self) -> u64 {
        self.max_seq
    }

    /// True when nothing was applied.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Whether `key` has a version (live or tombstone) here.
    pub fn contains(&self, key: &Key) -> bool {
        self.index.contains_key(key)
    }

    /// A consistent view for a search: the stored batches, the row count, and the ordinal and
    /// key hash of the newest version of every key (tombstones included).
    pub fn search_view(&self) -> MemtableView {
        let candidates = self
            .index
            .values()
            .map(|s| (self.offsets[s.batch as usize] + s.row as usize, s.hash))
            .collect();
        MemtableView {
            batches: self.batches.clone(),
            offsets: self.offsets.clone(),
            rows: self.rows,
            candidates,
            text: self.text.clone(),
            graph: self.graph.clone(),
            row_hashes: self.row_hashes.clone(),
            kills: self.kills.clone(),
        }
    }

    /// The newest version of every key (tombstones included), in sequence order, as one stored
    /// batch: what a flush writes and what a scan reads.
    pub fn newest_rows(&self) -> Result<RecordBatch> {
        let mut slots: Vec<Slot> = self.index.values().copied().collect();
        slots.sort_unstable_by_key(|s| s.seq);
        let idx: Vec<(usize, usize)> = slots
            .iter()
            .map(|s| (s.batch as usize, s.row as usize))
            .collect();
        if idx.is_empty() {
            return Ok(RecordBatch::new_empty(self.schema.clone()));
        }
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for c in 0..self.schema.fields().len() {
            let arrays: Vec<&dyn Array> =
                self.batches.iter().map(|b| b.column(c).as_ref()).collect();
            columns.push(arrow::compute::interleave(&arrays, &idx)?);
        }
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

/// What a search reads of a memtable (see [`Memtable::search_view`]).
#[derive(Debug, Clone)]
pub struct MemtableView {
    /// Stored batches.
    pub batches: Vec<RecordBatch>,
    /// Row ordinal of the first row of each batch.
    pub offsets: Vec<usize>,
    /// Rows in the view.
    pub rows: usize,
    /// `(ordinal, key hash)` of the newest version of each key.
    pub candidates: Vec<(usize, u64)>,
    /// The memtable's full-text index.
    pub text: Option<Arc<MemTextIndex>>,
    /// The memtable's vector graph, covering a prefix of the rows.
    pub graph: Option<Arc<MemVectorIndex>>,
    /// The key hash of every row, one slice per stored batch.
    pub row_hashes: Vec<Arc<[u64]>>,
    /// The generation rows this memtable's keys hide, found so far.
    pub kills: Arc<KillCache>,
}

/// Memtable rows checked against one generation, and `(generation row, memtable row)` pairs.
type Hidden = (usize, Vec<(u32, u32)>);

/// The rows of older generations a memtable's keys hide, kept up to date incrementally: each
/// memtable row is checked against each generation once (a hash lookup), not once per search.
#[derive(Debug, Default)]
pub struct KillCache {
    /// Per generation id: memtable rows checked so far, and `(generation row, memtable row)`
    /// for each hidden generation row.
    per_generation: std::sync::Mutex<HashMap<u64, Hidden>>,
}

impl KillCache {
    /// The rows of `generation` hidden by the first `rows` rows of a memtable view (its stored
    /// `batches` starting at `offsets`, with their `row_hashes`). Every version and tombstone
    /// hides: a memtable is newer than every generation.
    pub fn hidden_in(
        &self,
        generation: &crate::generation::Generation,
        batches: &[RecordBatch],
        offsets: &[usize],
        row_hashes: &[Arc<[u64]>],
        rows: usize,
    ) -> Vec<u32> {
        let mut all = self
            .per_generation
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (checked, hidden) = all.entry(generation.meta().id).or_default();
        if *checked < rows {
            for (b, hashes) in row_hashes.iter().enumerate() {
                let start = offsets[b];
                let end = (start + hashes.len()).min(rows);
                for ord in (*checked).max(start)..end {
                    let r = ord - start;
                    let key = || Key::from_array(batches[b].column(0).as_ref(), r);
                    if let Some(row) = generation.row_of_key(hashes[r], key) {
                        hidden.push((row as u32, ord as u32));
                    }
                }
            }
            *checked = rows;
        }
        // A search holding an older view sees only what its own rows hide.
        hidden
            .iter()
            .filter(|(_, ord)| (*ord as usize) < rows)
            .map(|(row, _)| *row)
            .collect()
    }
}

/// Whether each stored row is a tombstone.
pub(crate) fn deleted_flags(batch: &RecordBatch) -> arrow::array::BooleanArray {
    batch
        .column_by_name(DELETED_COLUMN)
        .map(|c| c.as_boolean().clone())
        .unwrap_or_else(|| arrow::array::BooleanArray::from(vec![false; batch.num_rows()]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::IndexSchema;
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
        let rows = m.newest_rows().unwrap();
        assert_eq!(rows.num_rows(), 2);
        let v = rows.column(2).as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(v.value(0), 3); // "a" newest = 3 (seq 3)
        assert!(deleted_flags(&rows).value(1)); // "b" is a tombstone
        assert_eq!(m.rows(), 5);
        assert_eq!(m.max_seq(), 10);
    }

    type ArrayRefStr = arrow::array::ArrayRef;
}
