//! Filters: SQL predicates over the user columns, compiled once per read by DataFusion and
//! evaluated on each source's rows.

use crate::{Error, Result};
use arrow::array::{Array, BooleanArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;
use std::sync::Arc;

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
    // Nulls are false: `filter_record_batch` and the filters drop them.
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
