//! Sources of a snapshot: a memtable view or a generation, read through one interface.

use crate::generation::Generation;
use crate::key::Key;
use crate::memtable::MemtableView;
use crate::text::TextIndex;
use crate::vector::{MemVectorIndex, VectorIndex};
use crate::Result;
use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use datafusion::physical_expr::PhysicalExpr;
use std::sync::Arc;

/// A memtable as a query sees it: the view taken when the query started.
#[derive(Debug, Clone)]
pub(crate) struct MemtableSource {
    /// How plans and messages name it (`active memtable`, `frozen memtable 3`, `wal`).
    pub(crate) name: String,
    pub(crate) view: MemtableView,
}

/// One source of a snapshot, newest first in a snapshot: a memtable view (the active one, a
/// frozen one, or the WAL rows a read-only handle replayed) or a generation.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    Memtable(MemtableSource),
    Generation(Arc<Generation>),
}

/// The row offsets of a generation's single batch.
const SINGLE_BATCH: [usize; 1] = [0];

impl Source {
    /// A source reading a memtable view.
    pub(crate) fn memtable(name: impl Into<String>, view: MemtableView) -> Source {
        Source::Memtable(MemtableSource {
            name: name.into(),
            view,
        })
    }

    /// How plans and messages name the source.
    pub(crate) fn name(&self) -> String {
        match self {
            Source::Memtable(m) => m.name.clone(),
            Source::Generation(g) => format!("generation {}", g.meta().id),
        }
    }

    /// Stored batches (index columns, `_seq`, `_deleted`).
    pub(crate) fn batches(&self) -> &[RecordBatch] {
        match self {
            Source::Memtable(m) => &m.view.batches,
            Source::Generation(g) => std::slice::from_ref(g.rows()),
        }
    }

    /// Row ordinal of the first row of each batch.
    pub(crate) fn offsets(&self) -> &[usize] {
        match self {
            Source::Memtable(m) => &m.view.offsets,
            Source::Generation(_) => &SINGLE_BATCH,
        }
    }

    /// Rows in the source (a memtable view: rows applied when the view was taken).
    pub(crate) fn rows(&self) -> usize {
        match self {
            Source::Memtable(m) => m.view.rows,
            Source::Generation(g) => g.rows().num_rows(),
        }
    }

    /// Flushes whose rows the source holds: 1 for a memtable or a flushed generation.
    pub(crate) fn flushes(&self) -> u64 {
        match self {
            Source::Memtable(_) => 1,
            Source::Generation(g) => g.meta().flushes,
        }
    }

    /// (batch, row) of an ordinal.
    pub(crate) fn locate(&self, ord: usize) -> (usize, usize) {
        let offsets = self.offsets();
        let b = offsets.partition_point(|o| *o <= ord) - 1;
        (b, ord - offsets[b])
    }

    /// The key hash of the row at an ordinal.
    pub(crate) fn row_hash(&self, ord: usize) -> u64 {
        match self {
            Source::Memtable(m) => {
                let (b, r) = self.locate(ord);
                m.view.row_hashes[b][r]
            }
            Source::Generation(g) => g.row_hashes()[ord],
        }
    }

    /// The key at an ordinal.
    pub(crate) fn key_at(&self, ord: usize) -> Option<Key> {
        let (b, r) = self.locate(ord);
        Key::from_array(self.batches()[b].column(0).as_ref(), r)
    }

    /// The text index covering the source's rows (a memtable's index is caught up here).
    pub(crate) fn text_index(&self) -> Result<Option<TextIndex>> {
        Ok(match self {
            Source::Memtable(m) => match &m.view.text {
                Some(t) => {
                    t.mark_searched();
                    Some(t.view(&m.view.batches, m.view.rows)?)
                }
                None => None,
            },
            Source::Generation(g) => g.text().cloned(),
        })
    }

    /// A generation's vector graph.
    pub(crate) fn vector(&self) -> Option<&Arc<VectorIndex>> {
        match self {
            Source::Memtable(_) => None,
            Source::Generation(g) => g.vector(),
        }
    }

    /// A memtable's vector graph (covering a prefix of its rows).
    pub(crate) fn mem_graph(&self) -> Option<&Arc<MemVectorIndex>> {
        match self {
            Source::Memtable(m) => m.view.graph.as_ref(),
            Source::Generation(_) => None,
        }
    }

    /// Evaluate a predicate over the user columns of every row; nulls count as false.
    pub(crate) fn filter_rows(
        &self,
        filter: &Arc<dyn PhysicalExpr>,
        user: &SchemaRef,
    ) -> Result<Vec<bool>> {
        let rows = self.rows();
        let mut passes = Vec::with_capacity(rows);
        let n = user.fields().len();
        for b in self.batches() {
            if passes.len() >= rows {
                break;
            }
            // The stored schema's first columns are the user columns, all nullable (tombstones).
            let schema = Arc::new(arrow::datatypes::Schema::new(
                b.schema().fields()[..n].to_vec(),
            ));
            let cols: Vec<ArrayRef> = b.columns()[..n].to_vec();
            let ub = RecordBatch::try_new(schema, cols)?;
            let v = super::filter::evaluate(filter, &ub)?;
            passes.extend(v.values().iter());
        }
        passes.truncate(rows);
        Ok(passes)
    }
}

/// A source's identity while a handle keeps something for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SourceKey {
    Memtable(u64),
    Generation(u64, u64),
}

impl SourceKey {
    pub(crate) fn of(s: &Source) -> SourceKey {
        match s {
            Source::Memtable(m) => SourceKey::Memtable(m.view.id),
            Source::Generation(g) => {
                let (id, epoch) = key_of(g);
                SourceKey::Generation(id, epoch)
            }
        }
    }
}

pub(crate) fn key_of(g: &Generation) -> (u64, u64) {
    (g.meta().id, g.meta().epoch)
}
