//! The scan of an [`super::IndexTable`]: the live rows of a point in time, the columns a query
//! reads only, its filters applied as the rows are read.

use crate::query::reader::PointInTime;
use arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::DFSchema;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use std::fmt;
use std::sync::Arc;

/// The plan of a scan of `pit`'s live rows (`user`: the Arrow schema of its rows): the user
/// columns `projection` (all when `None`), the rows passing every one of `filters`, at most
/// `limit` of them.
pub(super) fn plan(
    state: &dyn Session,
    pit: PointInTime,
    user: &SchemaRef,
    projection: Option<Vec<usize>>,
    filters: &[Expr],
    limit: Option<usize>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let projection = projection.unwrap_or_else(|| (0..user.fields().len()).collect());
    let keep = projection.len();
    // The filters' columns are read too, after the projection's.
    let mut read = projection.clone();
    let predicate = conjunction(filters.iter().cloned());
    if let Some(p) = &predicate {
        for c in p.column_refs() {
            let i = user.index_of(&c.name)?;
            if !read.contains(&i) {
                read.push(i);
            }
        }
    }
    let read_schema = Arc::new(user.project(&read)?);
    let filter = match &predicate {
        Some(p) => {
            let df_schema = DFSchema::try_from(read_schema.as_ref().clone())?;
            Some(state.create_physical_expr(p.clone(), &df_schema)?)
        }
        None => None,
    };
    let schema = Arc::new(read_schema.project(&(0..keep).collect::<Vec<_>>())?);
    let shown = predicate.as_ref().map(|p| p.to_string());
    Ok(Arc::new(IndexScanExec::new(
        pit, read, keep, filter, shown, limit, schema,
    )))
}

/// A scan of the live rows of a point in time (one partition): the columns `read` of which
/// the first `keep` are returned, filtered as they are read.
pub(crate) struct IndexScanExec {
    pit: PointInTime,
    read: Vec<usize>,
    keep: usize,
    filter: Option<Arc<dyn PhysicalExpr>>,
    /// The filter as the query wrote it, for the plan.
    shown: Option<String>,
    limit: Option<usize>,
    properties: Arc<PlanProperties>,
}

impl IndexScanExec {
    fn new(
        pit: PointInTime,
        read: Vec<usize>,
        keep: usize,
        filter: Option<Arc<dyn PhysicalExpr>>,
        shown: Option<String>,
        limit: Option<usize>,
        schema: SchemaRef,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        IndexScanExec {
            pit,
            read,
            keep,
            filter,
            shown,
            limit,
            properties,
        }
    }
}

impl IndexScanExec {
    /// The names of the columns it returns, for the plan.
    fn names(&self) -> String {
        let schema = self.properties.eq_properties.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        names.join(", ")
    }
}

impl fmt::Debug for IndexScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IndexScanExec: projection=[{}]", self.names())
    }
}

impl DisplayAs for IndexScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IndexScanExec: projection=[{}]", self.names())?;
        if let Some(p) = &self.shown {
            write!(f, ", filter={p}")?;
        }
        if let Some(l) = self.limit {
            write!(f, ", limit={l}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for IndexScanExec {
    fn name(&self) -> &str {
        "IndexScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        match children.is_empty() {
            true => Ok(self),
            false => Err(DataFusionError::Internal(
                "IndexScanExec has no children".to_string(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(external(crate::Error::internal(format!(
                "IndexScanExec has one partition, asked for {partition}"
            ))));
        }
        let stream = self
            .pit
            .scan_columns(self.read.clone(), self.keep, self.filter.clone());
        Ok(match self.limit {
            Some(limit) => limited(stream, limit),
            None => stream,
        })
    }
}

/// The first `limit` rows of `stream`: it is not polled past them.
fn limited(stream: SendableRecordBatchStream, limit: usize) -> SendableRecordBatchStream {
    use futures::StreamExt;
    let schema = stream.schema();
    let rows = futures::stream::unfold((stream, limit), |(mut stream, left)| async move {
        if left == 0 {
            return None;
        }
        match stream.next().await? {
            Ok(b) if b.num_rows() > left => Some((Ok(b.slice(0, left)), (stream, 0))),
            Ok(b) => {
                let n = b.num_rows();
                Some((Ok(b), (stream, left - n)))
            }
            Err(e) => Some((Err(e), (stream, 0))),
        }
    });
    Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, rows))
}

/// One of ours, carried through DataFusion (it comes back as it was, see
/// `From<DataFusionError> for Error`).
pub(crate) fn external(e: crate::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}
