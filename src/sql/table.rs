//! An index as a DataFusion table.

use super::scan::external;
use crate::db::Search;
use crate::query::reader::PointInTime;
use crate::Result;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use futures::future::BoxFuture;
use std::sync::Arc;

/// Takes a point in time of a handle (a writer or a read-only handle).
type TakePointInTime = Arc<dyn Fn() -> BoxFuture<'static, Result<PointInTime>> + Send + Sync>;

/// An index as a DataFusion table: its live rows, read from a point in time taken when a
/// statement's physical plan is made (`TableProvider::scan`): a plan run later, or again,
/// reads the rows of that moment, and holds that point in time's generations while it lives.
/// Projections and filters are pushed into the scan: only the columns a query reads are
/// read, and a filter is applied as the rows are read (`EXPLAIN` shows both on
/// `IndexScanExec`). Rows come newest source first, as [`crate::Search::scan`] returns them.
pub struct IndexTable {
    arrow_schema: SchemaRef,
    point_in_time: TakePointInTime,
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
            point_in_time,
        }
    }

    /// A point in time of the index.
    pub(crate) async fn point_in_time(&self) -> Result<PointInTime> {
        (self.point_in_time)().await
    }
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
        let pit = self.point_in_time().await.map_err(external)?;
        super::scan::plan(
            state,
            pit,
            &self.arrow_schema,
            projection.cloned(),
            filters,
            limit,
        )
    }
}
