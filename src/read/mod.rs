//! The read path: a snapshot of sources, the live rows of each (block lists), SQL filters, and
//! scans. Searches (`query`) plan over the same snapshot with the same live masks and filters.
//!
//! A *source* is the active memtable, a frozen memtable, the WAL rows a read-only handle
//! replayed, or a generation. Sources are ordered newest first; for each key only the newest
//! version in the snapshot is live, and a tombstone hides every older version.

mod block_list;
mod dead_terms;
pub(crate) mod pool;
mod source;

pub(crate) use block_list::{live_masks, BlockLists, Live};
pub(crate) use dead_terms::past_view;
pub(crate) use source::Source;

use crate::{Error, Result};
use arrow::array::{Array, BooleanArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;
use pool::QueryPool;
use std::sync::Arc;

/// Per source, the rows that pass `filter` (`None` without one), evaluated concurrently on
/// the query pool.
pub(crate) fn filter_masks(
    pool: &QueryPool,
    sources: &[Source],
    filter: Option<&Arc<dyn PhysicalExpr>>,
    user: &SchemaRef,
) -> Result<Vec<Option<Vec<bool>>>> {
    let Some(f) = filter else {
        return Ok(vec![None; sources.len()]);
    };
    pool.install(|| {
        use rayon::prelude::*;
        sources
            .par_iter()
            .map(|s| s.filter_mask(f, user).map(Some))
            .collect()
    })
}

/// What a query reads, fixed when it starts: its sources, newest first, and the handle's
/// block lists.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// Memtable views first (newest first), then generations (newest first).
    pub(crate) sources: Vec<Source>,
    /// The handle's cached block lists.
    pub(crate) block_lists: Arc<BlockLists>,
    /// The handle's query threads.
    pub(crate) pool: Arc<QueryPool>,
}

impl Snapshot {
    /// Sources and the block lists they are read with; what the block lists keep for sources
    /// that are gone is dropped.
    pub(crate) fn new(
        sources: Vec<Source>,
        block_lists: Arc<BlockLists>,
        pool: Arc<QueryPool>,
    ) -> Snapshot {
        block_lists.retain(&sources);
        Snapshot {
            sources,
            block_lists,
            pool,
        }
    }

    /// The live rows of each source (generations' computed concurrently on the query pool).
    pub(crate) fn live(&self) -> Vec<Live> {
        self.pool
            .install(|| live_masks(&self.sources, &self.block_lists))
    }

    /// Every live row that passes `filter`, projected to `user_schema`: one batch per source
    /// holding any, newest source first, rows in their source's order. The filter sees live
    /// rows only (a superseded version or a tombstone can never make it fail).
    pub(crate) fn scan(
        &self,
        user_schema: &SchemaRef,
        filter: Option<&Arc<dyn PhysicalExpr>>,
    ) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for (source, live) in self.sources.iter().zip(self.live()) {
            let idx: Vec<(usize, usize)> = live.rows().map(|ord| source.locate(ord)).collect();
            if idx.is_empty() {
                continue;
            }
            let columns = (0..user_schema.fields().len())
                .map(|c| {
                    let arrays: Vec<&dyn Array> = source
                        .batches()
                        .iter()
                        .map(|b| b.column(c).as_ref())
                        .collect();
                    arrow::compute::interleave(&arrays, &idx)
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let rows = RecordBatch::try_new(user_schema.clone(), columns)?;
            let rows = match filter {
                Some(f) => arrow::compute::filter_record_batch(&rows, &evaluate(f, &rows)?)?,
                None => rows,
            };
            if rows.num_rows() > 0 {
                out.push(rows);
            }
        }
        Ok(out)
    }
}

/// A predicate's value on every row of `batch` (null counts as false); a predicate that fails
/// on the data (a cast of a non-number) is the caller's: `Invalid`.
pub(crate) fn evaluate(
    filter: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
) -> Result<BooleanArray> {
    let v = filter
        .evaluate(batch)
        .and_then(|v| v.into_array(batch.num_rows()))
        .map_err(|e| Error::invalid(format!("filter: {e}")))?;
    let v = v
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| Error::invalid("filter: the predicate is not boolean"))?;
    // Nulls are false: `filter_record_batch` and the masks drop them.
    Ok(if v.null_count() > 0 {
        arrow::compute::prep_null_mask_filter(v)
    } else {
        v.clone()
    })
}

/// Compile a SQL predicate over the user columns; `Invalid` when it does not parse, names an
/// unknown column or is not boolean.
pub(crate) fn compile_filter(user: &SchemaRef, filter: &str) -> Result<Arc<dyn PhysicalExpr>> {
    let invalid =
        |e: datafusion::error::DataFusionError| Error::invalid(format!("filter '{filter}': {e}"));
    let ctx = SessionContext::new();
    let df_schema = DFSchema::try_from(user.as_ref().clone())?;
    let expr = ctx.parse_sql_expr(filter, &df_schema).map_err(invalid)?;
    let phys = ctx
        .create_physical_expr(expr, &df_schema)
        .map_err(invalid)?;
    let t = phys.data_type(user).map_err(invalid)?;
    if t != DataType::Boolean {
        return Err(Error::invalid(format!(
            "filter '{filter}': the predicate has type {t}, not Boolean"
        )));
    }
    Ok(phys)
}
