//! An index as a DataFusion table.

use super::scan::external;
use crate::db::Search;
use crate::query::reader::PointInTime;
use crate::shard::distributed::DistributedIndex;
use crate::shard::ShardedIndex;
use crate::Result;
use crate::{Error, HybridSearchOptions, SearchOptions, VectorSearchOptions};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::TableType;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::ExecutionPlan;
use futures::future::BoxFuture;
use std::sync::Arc;

/// Takes a point in time of a handle (a writer or a read-only handle).
type TakePointInTime = Arc<dyn Fn() -> BoxFuture<'static, Result<PointInTime>> + Send + Sync>;

/// What a table reads.
#[derive(Clone)]
enum Source {
    /// One index.
    One(TakePointInTime),
    /// Every shard of a sharded index, in this process.
    Sharded(Arc<ShardedIndex>),
    /// Every shard of a sharded index, through workers.
    Distributed(Arc<DistributedIndex>),
}

/// An index as a DataFusion table: its live rows, read from a point in time taken when a
/// statement's physical plan is made (`TableProvider::scan`): a plan run later, or again,
/// reads the rows of that moment, and holds that point in time's generations while it lives.
/// Projections and filters are pushed into the scan: only the columns a query reads are
/// read, and a filter is applied as the rows are read (`EXPLAIN` shows both on
/// `IndexScanExec`). Rows come newest source first, as [`crate::Search::scan`] returns them.
///
/// A sharded index is a table too ([`IndexTable::sharded`]): its scan is the union of every
/// shard's, each read from a point in time of the shard, and its searches rank as one index
/// (through workers with [`IndexTable::distributed`], which searches but does not scan).
pub struct IndexTable {
    arrow_schema: SchemaRef,
    source: Source,
}

impl std::fmt::Debug for IndexTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IndexTable({} columns)",
            self.arrow_schema.fields().len()
        )
    }
}

impl IndexTable {
    /// The table of `index` (an [`crate::Index`] or a [`crate::ReadOnlyIndex`]).
    pub fn new<T: Search + Send + Sync + 'static>(index: Arc<T>) -> IndexTable {
        let arrow_schema = index.arrow_schema();
        let point_in_time: TakePointInTime = Arc::new(move || {
            let index = index.clone();
            Box::pin(async move { index.point_in_time().await })
        });
        IndexTable {
            arrow_schema,
            source: Source::One(point_in_time),
        }
    }

    /// The table of a sharded index searched in this process: every shard's live rows.
    pub fn sharded(index: Arc<ShardedIndex>) -> IndexTable {
        IndexTable {
            arrow_schema: index.layout().schema.arrow_schema(),
            source: Source::Sharded(index),
        }
    }

    /// The table of a sharded index searched through workers: the search functions run each
    /// shard's part on a worker; a scan of the table is refused (an `Invalid` error: scan it
    /// with [`IndexTable::sharded`]).
    pub fn distributed(index: Arc<DistributedIndex>) -> IndexTable {
        IndexTable {
            arrow_schema: index.layout().schema.arrow_schema(),
            source: Source::Distributed(index),
        }
    }

    /// The plan of a scan of the live rows: of a point in time of the index, or the union
    /// of one of each shard.
    async fn scan_plan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let pits = match &self.source {
            Source::One(take) => vec![take().await?],
            Source::Sharded(index) => index.point_in_time().await?.shards().to_vec(),
            Source::Distributed(_) => {
                return Err(Error::invalid(
                    "a sharded index searched through workers cannot be scanned: query it \
                     with fts(), knn() or hybrid(), or scan it without workers",
                ))
            }
        };
        let plans = pits
            .into_iter()
            .map(|pit| {
                super::scan::plan(
                    state,
                    pit,
                    &self.arrow_schema,
                    projection.cloned(),
                    filters,
                    limit,
                )
            })
            .collect::<DfResult<Vec<_>>>()?;
        Ok(UnionExec::try_new(plans)?)
    }

    /// The plan of a full-text search: one index's, or the rows of a search of every shard
    /// (`schema`: theirs when there are none).
    pub(crate) async fn fts(
        &self,
        query: &str,
        options: &SearchOptions,
        schema: &SchemaRef,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let rows = match &self.source {
            Source::One(take) => return take().await?.plan_fts(query, options).await,
            Source::Sharded(index) => index.search_fts(query, options).await?,
            Source::Distributed(index) => index.search_fts(query, options).await?,
        };
        rows_plan(rows, schema)
    }

    /// The plan of a vector search (see [`IndexTable::fts`]).
    pub(crate) async fn knn(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
        schema: &SchemaRef,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let rows = match &self.source {
            Source::One(take) => return take().await?.plan_vector(query, options).await,
            Source::Sharded(index) => index.search_vector(query, options).await?,
            Source::Distributed(index) => index.search_vector(query, options).await?,
        };
        rows_plan(rows, schema)
    }

    /// The rows of a hybrid search.
    pub(crate) async fn hybrid(
        &self,
        query: &str,
        vector: &[f32],
        options: &HybridSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        match &self.source {
            Source::One(take) => take().await?.search_hybrid(query, vector, options).await,
            Source::Sharded(index) => index.search_hybrid(query, vector, options).await,
            Source::Distributed(index) => index.search_hybrid(query, vector, options).await,
        }
    }
}

/// A plan serving `rows` (of `schema` when there are none) from memory.
fn rows_plan(rows: Vec<RecordBatch>, schema: &SchemaRef) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = rows.first().map_or_else(|| schema.clone(), |b| b.schema());
    Ok(MemorySourceConfig::try_new_exec(&[rows], schema, None)?)
}

#[async_trait]
impl TableProvider for IndexTable {
    fn schema(&self) -> SchemaRef {
        self.arrow_schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        // Every filter is evaluated exactly as the rows are read.
        Ok(vec![TableProviderFilterPushDown::Exact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.scan_plan(state, projection, filters, limit)
            .await
            .map_err(external)
    }
}
