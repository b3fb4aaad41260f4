//! Sources of a search snapshot and their block lists.

use crate::generation::Generation;
use crate::index::text::{MemTextIndex, TextIndex};
use crate::key::Key;
use crate::memtable::{deleted_flags, MemtableView};
use crate::{Error, Result};
use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use datafusion::physical_expr::PhysicalExpr;
use std::collections::HashMap;
use std::sync::Arc;

/// Where a source's text index comes from.
#[derive(Debug, Clone)]
pub(crate) enum SourceText {
    /// A memtable's index, caught up at planning time.
    Mem(Arc<MemTextIndex>),
    /// A generation's index.
    Gen(TextIndex),
    /// The schema has no text columns.
    None,
}

/// One source of a snapshot: a memtable view or a generation.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub name: String,
    /// Stored batches (index columns, `_seq`, `_deleted`).
    pub batches: Vec<RecordBatch>,
    pub offsets: Vec<usize>,
    pub rows: usize,
    /// `(ordinal, key hash)` of the newest version of each key in the source.
    pub candidates: Arc<Vec<(usize, u64)>>,
    pub text: SourceText,
}

impl Source {
    pub fn from_memtable(name: String, v: MemtableView) -> Source {
        Source {
            name,
            batches: v.batches,
            offsets: v.offsets,
            rows: v.rows,
            candidates: Arc::new(v.candidates),
            text: v.text.map_or(SourceText::None, SourceText::Mem),
        }
    }

    pub fn from_generation(g: &Arc<Generation>) -> Source {
        let candidates = g.row_hashes().iter().copied().enumerate().collect();
        Source {
            name: format!("generation {}", g.meta().id),
            batches: vec![g.rows().clone()],
            offsets: vec![0],
            rows: g.rows().num_rows(),
            candidates: Arc::new(candidates),
            text: g.text().cloned().map_or(SourceText::None, SourceText::Gen),
        }
    }

    /// (batch, row) of an ordinal.
    pub fn locate(&self, ord: usize) -> (usize, usize) {
        let b = self.offsets.partition_point(|o| *o <= ord) - 1;
        (b, ord - self.offsets[b])
    }

    pub fn key_at(&self, ord: usize) -> Option<Key> {
        let (b, r) = self.locate(ord);
        Key::from_array(self.batches[b].column(0).as_ref(), r)
    }

    /// The text index covering the source's rows (a memtable's index is caught up here).
    pub fn text_index(&self) -> Result<Option<TextIndex>> {
        Ok(match &self.text {
            SourceText::Mem(m) => Some(m.catch_up(&self.batches, self.rows)?),
            SourceText::Gen(t) => Some(t.clone()),
            SourceText::None => None,
        })
    }

    /// Evaluate a predicate over the user columns of every row; nulls count as false.
    pub fn filter_mask(
        &self,
        filter: &Arc<dyn PhysicalExpr>,
        user: &SchemaRef,
    ) -> Result<Vec<bool>> {
        let mut mask = Vec::with_capacity(self.rows);
        let n = user.fields().len();
        for b in &self.batches {
            // The stored schema's first columns are the user columns, all nullable (tombstones).
            let schema = Arc::new(arrow::datatypes::Schema::new(
                b.schema().fields()[..n].to_vec(),
            ));
            let cols: Vec<ArrayRef> = b.columns()[..n].to_vec();
            let ub = RecordBatch::try_new(schema, cols)?;
            let v = filter.evaluate(&ub)?.into_array(ub.num_rows())?;
            let v = v
                .as_any()
                .downcast_ref::<BooleanArray>()
                .ok_or_else(|| Error::invalid("filter: the predicate is not boolean"))?;
            mask.extend((0..v.len()).map(|i| v.is_valid(i) && v.value(i)));
        }
        mask.truncate(self.rows);
        Ok(mask)
    }
}

/// The live rows of each source (newest first): the newest version of a key within the source,
/// not a tombstone, and not hidden by a strictly newer source. A newer source's key hashes form
/// the block list; a hash hit is confirmed on the exact key before a row is hidden.
pub(crate) fn live_masks(sources: &[Source]) -> Vec<Vec<bool>> {
    let mut newer: HashMap<u64, Vec<(usize, usize)>> = HashMap::new();
    let mut out = Vec::with_capacity(sources.len());
    for (i, s) in sources.iter().enumerate() {
        let mut live = vec![false; s.rows];
        let deleted: Vec<BooleanArray> = s.batches.iter().map(deleted_flags).collect();
        for &(ord, h) in s.candidates.iter() {
            if ord >= s.rows {
                continue;
            }
            let hidden = newer.get(&h).is_some_and(|hits| {
                let k = s.key_at(ord);
                hits.iter().any(|(j, o)| sources[*j].key_at(*o) == k)
            });
            let (b, r) = s.locate(ord);
            live[ord] = !hidden && !deleted[b].value(r);
        }
        for &(ord, h) in s.candidates.iter() {
            if ord < s.rows {
                newer.entry(h).or_default().push((i, ord));
            }
        }
        out.push(live);
    }
    out
}
