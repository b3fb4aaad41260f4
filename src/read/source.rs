//! Sources of a snapshot: a memtable view or a generation, read through one interface.

use crate::generation::Generation;
use crate::key::Key;
use crate::memtable::MemtableView;
use crate::text::TextIndex;
use crate::vector::{MemVectorIndex, VectorIndex};
use crate::Result;
use arrow::array::{Array, ArrayRef, NullArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::physical_expr::utils::collect_columns;
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

    /// Columns `cols` (stored schema positions) of rows `ords`, in the order given. A
    /// generation may read them by range: this blocks, so it runs on a query or blocking
    /// thread, never on the async runtime's own.
    pub(crate) fn take(&self, ords: &[usize], cols: &[usize]) -> Result<Vec<ArrayRef>> {
        match self {
            Source::Memtable(m) => {
                let idx: Vec<(usize, usize)> = ords.iter().map(|o| self.locate(*o)).collect();
                cols.iter()
                    .map(|c| {
                        let arrays: Vec<&dyn Array> = m
                            .view
                            .batches
                            .iter()
                            .map(|b| b.column(*c).as_ref())
                            .collect();
                        Ok(arrow::compute::interleave(&arrays, &idx)?)
                    })
                    .collect()
            }
            Source::Generation(g) => g.read_rows_blocking(ords, cols),
        }
    }

    /// The vector column (stored position `col`) of each stored batch, in memory.
    pub(crate) fn vector_columns(&self, col: usize) -> Vec<ArrayRef> {
        match self {
            Source::Memtable(m) => m
                .view
                .batches
                .iter()
                .map(|b| b.column(col).clone())
                .collect(),
            Source::Generation(g) => g.vector_values().into_iter().cloned().collect(),
        }
    }

    /// A memtable view's stored batches (a generation has none in memory).
    pub(crate) fn memtable_batches(&self) -> Option<&[RecordBatch]> {
        match self {
            Source::Memtable(m) => Some(&m.view.batches),
            Source::Generation(_) => None,
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
            Source::Generation(g) => g.num_rows(),
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
            Source::Generation(g) => g.row_hash(ord),
        }
    }

    /// The key at an ordinal.
    pub(crate) fn key_at(&self, ord: usize) -> Option<Key> {
        match self {
            Source::Memtable(m) => {
                let (b, r) = self.locate(ord);
                Key::from_array(m.view.batches[b].column(0).as_ref(), r)
            }
            Source::Generation(g) => g.key_at(ord),
        }
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

    /// Evaluate a predicate over the user columns of every row; nulls count as false. A
    /// generation evaluates it over `read`, the columns it names ([`filter_columns`]) as
    /// the caller read them (every generation at once, see [`super::filter_rows`]).
    pub(crate) fn filter_rows(
        &self,
        filter: &Arc<dyn PhysicalExpr>,
        user: &SchemaRef,
        read: Option<Vec<ArrayRef>>,
    ) -> Result<Vec<bool>> {
        let rows = self.rows();
        let n = user.fields().len();
        let batches: Vec<RecordBatch> = match self {
            Source::Memtable(m) => m.view.batches.clone(),
            Source::Generation(_) => {
                let used = filter_columns(filter, user);
                let read = read.ok_or_else(|| {
                    crate::Error::internal("a generation's filter columns were not read")
                })?;
                // The columns the predicate does not name are typed nulls of no size.
                let mut fields = Vec::with_capacity(n);
                let mut columns: Vec<ArrayRef> = Vec::with_capacity(n);
                for c in 0..n {
                    match used.iter().position(|u| *u == c) {
                        Some(i) => {
                            fields.push(user.field(c).clone().with_nullable(true));
                            columns.push(read[i].clone());
                        }
                        None => {
                            fields.push(Field::new(user.field(c).name(), DataType::Null, true));
                            columns.push(Arc::new(NullArray::new(rows)));
                        }
                    }
                }
                vec![RecordBatch::try_new(
                    Arc::new(Schema::new(fields)),
                    columns,
                )?]
            }
        };
        let mut passes = Vec::with_capacity(rows);
        for b in &batches {
            if passes.len() >= rows {
                break;
            }
            // The stored schema's first columns are the user columns, all nullable (tombstones).
            let schema = Arc::new(Schema::new(b.schema().fields()[..n].to_vec()));
            let cols: Vec<ArrayRef> = b.columns()[..n].to_vec();
            let ub = RecordBatch::try_new(schema, cols)?;
            let v = super::filter::evaluate(filter, &ub)?;
            passes.extend(v.values().iter());
        }
        passes.truncate(rows);
        Ok(passes)
    }
}

/// The user columns `filter` names, ascending.
pub(crate) fn filter_columns(filter: &Arc<dyn PhysicalExpr>, user: &SchemaRef) -> Vec<usize> {
    let n = user.fields().len();
    collect_columns(filter)
        .iter()
        .map(|c| c.index())
        .filter(|c| *c < n)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// A source's identity while a handle keeps something for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
