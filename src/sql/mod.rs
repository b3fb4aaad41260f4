//! SQL over the live index with Apache DataFusion: the index as a table ([`IndexTable`], a
//! `TableProvider` over a point in time of the live rows, its projection and filters pushed
//! into the scan) and the search table functions `fts(table, query, k)`, `knn(table, vector,
//! k)` and `hybrid(table, query, vector, k)`, which return a search's rows (key, score or
//! distance, columns) for SQL to join, filter, group and order. [`register`] puts both in a
//! user's `SessionContext`.
//!
//! ```no_run
//! # async fn demo(index: std::sync::Arc<lsmsearch::Index>) -> lsmsearch::Result<()> {
//! let ctx = datafusion::prelude::SessionContext::new();
//! lsmsearch::sql::register(&ctx, "docs", index)?;
//! let facets = ctx
//!     .sql("SELECT year, count(*) FROM fts('docs', 'shock wave', 1000) GROUP BY year")
//!     .await?
//!     .collect()
//!     .await?;
//! # Ok(()) }
//! ```

mod functions;
mod scan;
mod table;

use crate::db::Search;
use crate::{Error, Result};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use std::sync::Arc;

pub use functions::{FtsFunction, HybridFunction, KnnFunction, VectorLiterals};
pub use table::IndexTable;

/// Register `index` in `ctx` as the table `name` (see [`IndexTable`]), with the table
/// functions `fts`, `knn` and `hybrid` (see [`FtsFunction`]) and SQL array literals of
/// numbers (`[0.1, 0.2]`, a query vector) when they are not registered yet. A table of the
/// same name is replaced.
pub fn register<T: Search + Send + Sync + 'static>(
    ctx: &SessionContext,
    name: &str,
    index: Arc<T>,
) -> Result<()> {
    register_table(ctx, name, IndexTable::new(index))
}

/// Register a sharded index searched in this process as the table `name`, as [`register`]
/// does (see [`IndexTable::sharded`]): its scan reads every shard, and the search functions
/// rank as one index.
pub fn register_sharded(
    ctx: &SessionContext,
    name: &str,
    index: Arc<crate::shard::ShardedIndex>,
) -> Result<()> {
    register_table(ctx, name, IndexTable::sharded(index))
}

/// Register a sharded index searched through workers as the table `name`, as [`register`]
/// does (see [`IndexTable::distributed`]): the search functions run each shard's part on a
/// worker; the table itself cannot be scanned.
pub fn register_distributed(
    ctx: &SessionContext,
    name: &str,
    index: Arc<crate::shard::distributed::DistributedIndex>,
) -> Result<()> {
    register_table(ctx, name, IndexTable::distributed(index))
}

/// Register `table` as `name`, with the search functions and vector literals.
fn register_table(ctx: &SessionContext, name: &str, table: IndexTable) -> Result<()> {
    ctx.register_table(name, Arc::new(table))?;
    if ctx.table_function("fts").is_err() {
        ctx.register_udtf("fts", Arc::new(FtsFunction));
        ctx.register_udtf("knn", Arc::new(KnnFunction));
        ctx.register_udtf("hybrid", Arc::new(HybridFunction));
    }
    let state = ctx.state_ref();
    let mut state = state.write();
    let planned = state
        .expr_planners()
        .iter()
        .any(|p| format!("{p:?}").contains("VectorLiterals"));
    if !planned {
        datafusion::execution::FunctionRegistry::register_expr_planner(
            &mut *state,
            Arc::new(VectorLiterals),
        )?;
    }
    Ok(())
}

/// Run one SQL statement in `ctx` (where [`register`] put an index) and collect its rows.
/// A statement that does not parse or plan (a syntax error, an unknown table, column or
/// function, wrong arguments to a search function) is an `Invalid` error naming what was
/// wrong; an error of the index keeps its kind.
pub async fn query(
    ctx: &SessionContext,
    statement: &str,
) -> Result<Vec<arrow::array::RecordBatch>> {
    Ok(query_with_schema(ctx, statement).await?.0)
}

/// [`query`], with the schema of the statement's rows (which an empty result does not
/// carry).
pub async fn query_with_schema(
    ctx: &SessionContext,
    statement: &str,
) -> Result<(Vec<arrow::array::RecordBatch>, arrow::datatypes::SchemaRef)> {
    let df = ctx
        .sql(statement)
        .await
        .map_err(|e| sql_error(e, statement))?;
    let schema = df.schema().inner().clone();
    let rows = df.collect().await.map_err(|e| sql_error(e, statement))?;
    Ok((rows, schema))
}

/// `e`, an error of `statement`, as one of ours.
fn sql_error(e: DataFusionError, statement: &str) -> Error {
    match e.find_root() {
        DataFusionError::External(inner) if inner.downcast_ref::<Error>().is_some() => {
            Error::from(e)
        }
        DataFusionError::SQL(..)
        | DataFusionError::Plan(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_) => {
            Error::invalid(format!("SQL '{statement}': {}", e.find_root()))
        }
        _ => Error::from(e),
    }
}
