//! The DataFusion leaf of one arm: it yields the arm's top k rows, already ordered.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, LexOrdering, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use std::fmt;
use std::sync::Arc;

/// The work of one arm: search its source and return its top rows, sorted.
pub(crate) type ArmWork = Arc<dyn Fn() -> crate::Result<RecordBatch> + Send + Sync>;

/// A leaf producing one arm's top k rows in the plan's sort order.
pub(crate) struct ArmExec {
    kind: &'static str,
    description: String,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    work: ArmWork,
}

impl ArmExec {
    pub fn new(
        kind: &'static str,
        description: String,
        schema: SchemaRef,
        ordering: LexOrdering,
        work: ArmWork,
    ) -> Self {
        let eq = EquivalenceProperties::new_with_orderings(schema.clone(), [ordering]);
        let properties = Arc::new(PlanProperties::new(
            eq,
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        ArmExec {
            kind,
            description,
            schema,
            properties,
            work,
        }
    }
}

impl fmt::Debug for ArmExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.description)
    }
}

impl DisplayAs for ArmExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.description)
    }
}

impl ExecutionPlan for ArmExec {
    fn name(&self) -> &str {
        self.kind
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
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(format!(
                "{} has no children",
                self.kind
            )))
        }
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "{} has one partition, asked for {partition}",
                self.kind
            )));
        }
        let work = self.work.clone();
        let fut = async move {
            tokio::task::spawn_blocking(move || work())
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?
                .map_err(|e| DataFusionError::External(Box::new(e)))
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            futures::stream::once(fut),
        )))
    }
}
