//! The search table functions: `fts(table, query, k)`, `knn(table, vector, k)` and
//! `hybrid(table, query, vector, k)`, each with an optional last argument, a filter (a SQL
//! predicate string applied inside the search, before its top k), and SQL array literals of
//! numbers for their vectors.

use super::scan::external;
use super::table::IndexTable;
use crate::query::{
    DISTANCE_COLUMN, FTS_RANK_COLUMN, FTS_SCORE_COLUMN, SCORE_COLUMN, VECTOR_RANK_COLUMN,
};
use crate::{Error, HybridSearchOptions, Result, SearchOptions, VectorSearchOptions};
use arrow::array::Array;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{DFSchema, ScalarValue, TableReference};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::TableType;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::expressions::col;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::ExecutionPlan;
use futures::FutureExt;
use std::sync::Arc;

/// `fts(table, query, k [, filter])`: the top `k` live rows of a full-text search of `query`
/// (tantivy's query syntax, BM25 over the global statistics of the live rows) in the index
/// registered as `table`: the key, `_score` and every user column (only those the query
/// reads are read), ordered by `_score` descending then key. The same rows as
/// [`crate::Search::search_fts`].
#[derive(Debug)]
pub struct FtsFunction;

/// `knn(table, vector, k [, filter])`: the `k` live rows nearest to `vector` (an array literal
/// `[0.1, 0.2, ...]` or a JSON array string), by exact distance after the graphs' walk: the
/// key, `_distance` and every user column. The same rows as
/// [`crate::Search::search_vector`].
#[derive(Debug)]
pub struct KnnFunction;

/// `hybrid(table, query, vector, k [, filter])`: a hybrid search fused by reciprocal rank
/// fusion (k 60, 100 candidates a part): the key, the fused `_score`, `_fts_score`,
/// `_distance`, `_fts_rank`, `_vector_rank` and every user column. The same rows as
/// [`crate::Search::search_hybrid`] with default options.
/// The search runs when the statement's physical plan is made (an `EXPLAIN` of it runs it
/// too); its rows are then served from memory.
#[derive(Debug)]
pub struct HybridFunction;

/// What a search table function searches for.
#[derive(Debug, Clone)]
enum Wanted {
    Fts(String),
    Knn(Vec<f32>),
    Hybrid(String, Vec<f32>),
}

/// The rows of one search of a registered index, as a table.
struct SearchTable {
    table: Arc<dyn TableProvider>,
    wanted: Wanted,
    k: usize,
    filter: Option<String>,
    schema: SchemaRef,
    /// The leading columns before the user columns (key, score, ...).
    leading: usize,
}

impl std::fmt::Debug for SearchTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SearchTable({:?}, k={})", self.wanted, self.k)
    }
}

impl TableFunctionImpl for FtsFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        call(args, "fts(table, query, k [, filter])", |a| {
            Ok(Wanted::Fts(string(&a[0], "query")?))
        })
    }
}

impl TableFunctionImpl for KnnFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        call(args, "knn(table, vector, k [, filter])", |a| {
            Ok(Wanted::Knn(vector(&a[0])?))
        })
    }
}

impl TableFunctionImpl for HybridFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        call(args, "hybrid(table, query, vector, k [, filter])", |a| {
            Ok(Wanted::Hybrid(string(&a[0], "query")?, vector(&a[1])?))
        })
    }
}

/// A search table of `args` (`usage` names them): the table, what `wanted` makes of the
/// arguments between it and `k`, `k`, and an optional filter.
fn call(
    args: TableFunctionArgs,
    usage: &str,
    wanted: impl Fn(&[Expr]) -> Result<Wanted>,
) -> DfResult<Arc<dyn TableProvider>> {
    let exprs = args.exprs();
    let middle = match usage.starts_with("hybrid") {
        true => 2,
        false => 1,
    };
    if exprs.len() < middle + 2 || exprs.len() > middle + 3 {
        return Err(external(Error::invalid(format!(
            "{usage} takes {} or {} arguments, not {}",
            middle + 2,
            middle + 3,
            exprs.len()
        ))));
    }
    let name = string(&exprs[0], "table").map_err(external)?;
    let table = index_table(args.session(), &name).map_err(external)?;
    let wanted = wanted(&exprs[1..=middle]).map_err(|e| external(e.context(usage)))?;
    let k = count(&exprs[middle + 1]).map_err(|e| external(e.context(usage)))?;
    let filter = exprs
        .get(middle + 2)
        .map(|f| string(f, "filter"))
        .transpose()
        .map_err(external)?;
    let index = table
        .downcast_ref::<IndexTable>()
        .ok_or_else(|| external(Error::internal("not an index table")))?;
    let (schema, leading) = search_schema(&wanted, &index.schema());
    Ok(Arc::new(SearchTable {
        table: table.clone(),
        wanted,
        k,
        filter,
        schema,
        leading,
    }))
}

/// The index registered as `name` in the session (in its default catalog and schema unless
/// the name says).
fn index_table(session: &dyn Session, name: &str) -> Result<Arc<dyn TableProvider>> {
    let opts = &session.config_options().catalog;
    let r = TableReference::from(name).resolve(&opts.default_catalog, &opts.default_schema);
    let missing = || Error::invalid(format!("table '{name}' is not registered"));
    let schema = session
        .catalog_list()
        .catalog(&r.catalog)
        .and_then(|c| c.schema(&r.schema))
        .ok_or_else(missing)?;
    let table = schema
        .table(&r.table)
        .now_or_never()
        .ok_or_else(|| Error::invalid(format!("table '{name}' cannot be looked up at once")))??
        .ok_or_else(missing)?;
    if table.downcast_ref::<IndexTable>().is_none() {
        return Err(Error::invalid(format!(
            "table '{name}' is not an lsmsearch index (see lsmsearch::sql::register)"
        )));
    }
    Ok(table)
}

/// The schema of a search's rows (key, the search's own columns, every user column) and how
/// many columns come before the user columns.
fn search_schema(wanted: &Wanted, user: &SchemaRef) -> (SchemaRef, usize) {
    let mut fields = vec![user.field(0).clone()];
    match wanted {
        Wanted::Fts(_) => fields.push(Field::new(SCORE_COLUMN, DataType::Float32, false)),
        Wanted::Knn(_) => fields.push(Field::new(DISTANCE_COLUMN, DataType::Float32, false)),
        Wanted::Hybrid(..) => fields.extend([
            Field::new(SCORE_COLUMN, DataType::Float32, false),
            Field::new(FTS_SCORE_COLUMN, DataType::Float32, true),
            Field::new(DISTANCE_COLUMN, DataType::Float32, true),
            Field::new(FTS_RANK_COLUMN, DataType::UInt32, true),
            Field::new(VECTOR_RANK_COLUMN, DataType::UInt32, true),
        ]),
    }
    let leading = fields.len();
    for f in user.fields().iter().skip(1) {
        fields.push(Field::new(f.name(), f.data_type().clone(), true));
    }
    (Arc::new(Schema::new(fields)), leading)
}

/// A string literal argument.
fn string(e: &Expr, what: &str) -> Result<String> {
    match e {
        Expr::Literal(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
            _,
        ) => Ok(s.clone()),
        other => Err(Error::invalid(format!(
            "the {what} must be a string literal, not {other}"
        ))),
    }
}

/// The number of rows argument: an integer literal at least 1.
fn count(e: &Expr) -> Result<usize> {
    let n = match e {
        Expr::Literal(v, _) if v.data_type().is_integer() => {
            v.cast_to(&DataType::Int64).ok().and_then(|v| match v {
                ScalarValue::Int64(Some(n)) => Some(n),
                _ => None,
            })
        }
        _ => None,
    };
    match n {
        Some(n) if n >= 1 => Ok(n as usize),
        _ => Err(Error::invalid(format!(
            "k must be an integer literal at least 1, not {e}"
        ))),
    }
}

/// A vector argument: an array literal of numbers, or a string holding a JSON array.
fn vector(e: &Expr) -> Result<Vec<f32>> {
    let bad = || {
        Error::invalid(format!(
            "the vector must be an array literal of numbers like [0.1, 0.2], not {e}"
        ))
    };
    match e {
        Expr::Literal(ScalarValue::List(list), _) if list.len() == 1 && list.is_valid(0) => {
            let values =
                arrow::compute::cast(&list.value(0), &DataType::Float32).map_err(|_| bad())?;
            let values = values
                .as_any()
                .downcast_ref::<arrow::array::Float32Array>()
                .ok_or_else(bad)?;
            if values.null_count() > 0 {
                return Err(bad());
            }
            Ok(values.values().to_vec())
        }
        Expr::Literal(ScalarValue::Utf8(Some(s)), _) => {
            serde_json::from_str::<Vec<f32>>(s).map_err(|_| bad())
        }
        _ => Err(bad()),
    }
}

#[async_trait]
impl TableProvider for SearchTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let index = self
            .table
            .downcast_ref::<IndexTable>()
            .ok_or_else(|| external(Error::internal("not an index table")))?;
        let projection: Vec<usize> = projection
            .cloned()
            .unwrap_or_else(|| (0..self.schema.fields().len()).collect());
        // The user columns the query reads.
        let mut columns: Vec<String> = Vec::new();
        for i in &projection {
            if *i >= self.leading {
                let name = self.schema.field(*i).name().clone();
                if !columns.contains(&name) {
                    columns.push(name);
                }
            }
        }
        let (k, filter) = (self.k, self.filter.clone());
        let plan: Arc<dyn ExecutionPlan> = match &self.wanted {
            Wanted::Fts(q) => {
                let opts = SearchOptions {
                    k,
                    filter,
                    columns: Some(columns),
                    ..SearchOptions::default()
                };
                index.fts(q, &opts, &self.schema).await.map_err(external)?
            }
            Wanted::Knn(v) => {
                let opts = VectorSearchOptions {
                    k,
                    filter,
                    columns: Some(columns),
                    ..VectorSearchOptions::default()
                };
                index.knn(v, &opts, &self.schema).await.map_err(external)?
            }
            Wanted::Hybrid(q, v) => {
                let opts = HybridSearchOptions {
                    k,
                    filter,
                    columns: Some(columns),
                    ..HybridSearchOptions::default()
                };
                let rows = index.hybrid(q, v, &opts).await.map_err(external)?;
                let schema = match rows.first() {
                    Some(b) => b.schema(),
                    None => hybrid_schema(&self.schema, self.leading, &opts),
                };
                MemorySourceConfig::try_new_exec(&[rows], schema, None)?
            }
        };
        // The search's columns, in the order the query asked for them.
        let input = plan.schema();
        let exprs = projection
            .iter()
            .map(|i| {
                let name = self.schema.field(*i).name();
                Ok(ProjectionExpr {
                    expr: col(name, &input)?,
                    alias: name.clone(),
                })
            })
            .collect::<DfResult<Vec<_>>>()?;
        Ok(Arc::new(ProjectionExec::try_new(exprs, plan)?))
    }
}

/// The schema of a hybrid search of no rows: the leading columns and those asked for.
fn hybrid_schema(schema: &SchemaRef, leading: usize, opts: &HybridSearchOptions) -> SchemaRef {
    let names = opts.columns.clone().unwrap_or_default();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(i, f)| *i < leading || names.contains(f.name()))
        .map(|(_, f)| f.as_ref().clone())
        .collect();
    Arc::new(Schema::new(fields))
}

/// Plans SQL array literals of numbers (`[0.1, -2, 3e-1]`) as list literals of 64-bit
/// floats, so a query vector can be written in SQL (DataFusion plans array literals only with
/// its nested-expression functions, which this crate does not build). In a session where it
/// is registered, every array literal of numbers is such a list (`[1, 2]` too).
#[derive(Debug)]
pub struct VectorLiterals;

impl ExprPlanner for VectorLiterals {
    fn plan_array_literal(
        &self,
        exprs: Vec<Expr>,
        _schema: &DFSchema,
    ) -> DfResult<PlannerResult<Vec<Expr>>> {
        let mut values = Vec::with_capacity(exprs.len());
        for e in &exprs {
            let v = match e {
                Expr::Literal(v, _) => v.clone(),
                Expr::Negative(inner) => match inner.as_ref() {
                    Expr::Literal(v, _) => v.arithmetic_negate()?,
                    _ => return Ok(PlannerResult::Original(exprs)),
                },
                _ => return Ok(PlannerResult::Original(exprs)),
            };
            match v.cast_to(&DataType::Float64) {
                Ok(ScalarValue::Float64(Some(x))) if v.data_type().is_numeric() => values.push(x),
                _ => return Ok(PlannerResult::Original(exprs)),
            }
        }
        let list = ScalarValue::new_list_nullable(
            &values
                .into_iter()
                .map(|x| ScalarValue::Float64(Some(x)))
                .collect::<Vec<_>>(),
            &DataType::Float64,
        );
        Ok(PlannerResult::Planned(Expr::Literal(
            ScalarValue::List(list),
            None,
        )))
    }
}
