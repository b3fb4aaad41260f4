//! Filters: SQL predicates over the user columns, compiled once per read by DataFusion and
//! evaluated on each source's rows.

use crate::{Error, Result};
use arrow::array::{Array, BooleanArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::TreeNode;
use datafusion::common::DFSchema;
use datafusion::logical_expr::{Expr, Volatility};
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

/// A compiled SQL predicate over the user columns.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    /// The predicate.
    pub(crate) expr: Arc<dyn PhysicalExpr>,
    /// The predicate as written, when its value on a row depends on nothing but the row (it
    /// calls no volatile or stable function, such as `random()` or `now()`): which rows of a
    /// generation it passes never changes, and is kept under this text (see
    /// [`super::ColumnCache`]).
    pub(crate) key: Option<Arc<str>>,
}

/// Compile a SQL predicate over the user columns; `Invalid` when it does not parse, names an
/// unknown column or is not boolean.
pub(crate) fn compile_filter(user: &SchemaRef, filter: &str) -> Result<Filter> {
    let invalid =
        |e: datafusion::error::DataFusionError| Error::invalid(format!("filter '{filter}': {e}"));
    let ctx = SessionContext::new();
    let df_schema = DFSchema::try_from(user.as_ref().clone())?;
    let expr = ctx.parse_sql_expr(filter, &df_schema).map_err(invalid)?;
    let immutable = !expr
        .exists(|e| {
            Ok(matches!(e, Expr::ScalarFunction(f)
                if f.func.signature().volatility != Volatility::Immutable))
        })
        .unwrap_or(true);
    let phys = ctx
        .create_physical_expr(expr, &df_schema)
        .map_err(invalid)?;
    let t = phys.data_type(user).map_err(invalid)?;
    if t != DataType::Boolean {
        return Err(Error::invalid(format!(
            "filter '{filter}': the predicate has type {t}, not Boolean"
        )));
    }
    Ok(Filter {
        expr: phys,
        key: immutable.then(|| Arc::from(filter)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Field, Schema};

    /// A filter is kept under its text only when its value on a row depends on the row alone.
    #[test]
    fn only_filters_of_the_row_alone_have_a_key() {
        let user: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("year", DataType::Int64, true),
            Field::new("lang", DataType::Utf8, true),
        ]));
        for f in [
            "year > 3",
            "lang = 'en' AND abs(year) < 5",
            "upper(lang) = 'EN'",
        ] {
            let c = compile_filter(&user, f).unwrap();
            assert_eq!(c.key.as_deref(), Some(f), "{f}");
        }
        for f in [
            "random() < 0.5",
            "year > 3 AND random() < 0.5",
            "to_unixtime(now()) > year",
        ] {
            let c = compile_filter(&user, f).unwrap();
            assert_eq!(c.key, None, "{f}");
        }
    }
}
