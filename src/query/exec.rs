//! The DataFusion leaf of a search: one output partition per arm, each yielding that arm's top k
//! rows, already ordered, for a `SortPreservingMergeExec` to merge.
//!
//! One leaf with a partition per arm instead of a leaf per arm under a `UnionExec`: building a
//! `UnionExec` folds its children's equivalence properties one by one, measured at about 22 µs
//! per child (1.4 ms of planning at 64 generations, 17 ms at 800), for a result every arm
//! already states (the same schema and ordering).

use super::annotate::Annotations;
use crate::read::pool::QueryPool;
use crate::read::{ReadCaches, Source};
use arrow::array::{ArrayRef, AsArray, RecordBatch, UInt32Array, UInt64Array};
use arrow::compute::SortOptions;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{
    EquivalenceProperties, LexOrdering, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::expressions::col;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use std::fmt;
use std::sync::Arc;

/// An arm slower than this is logged at debug level (target `lsmsearch::slow`).
const SLOW_ARM_MS: f64 = 10.0;

/// The work of one arm: search its source and return its top rows, sorted.
/// It checks `Stop` between pieces of its work: a dropped query stops its running arms.
pub(crate) type ArmWork =
    Arc<dyn Fn(&crate::read::pool::Stop) -> crate::Result<ArmRows> + Send + Sync>;

/// The column of an arm's rows naming their source (its position in the snapshot).
pub(crate) const SOURCE_COLUMN: &str = "_source";
/// The column of an arm's rows holding their ordinal in their source.
pub(crate) const ORD_COLUMN: &str = "_ord";

/// The schema of the rows arms return and the merge orders: the key, the score or distance
/// (as `output` names it), the source and the ordinal of each row. [`TakeExec`] reads the
/// payload columns of the rows the merge keeps.
pub(crate) fn ranked_schema(output: &SchemaRef) -> SchemaRef {
    Arc::new(arrow::datatypes::Schema::new(vec![
        output.field(0).clone(),
        output.field(1).clone(),
        arrow::datatypes::Field::new(SOURCE_COLUMN, arrow::datatypes::DataType::UInt32, false),
        arrow::datatypes::Field::new(ORD_COLUMN, arrow::datatypes::DataType::UInt64, false),
    ]))
}

/// What an arm's work yields: its rows, or what is left to do to have them.
pub(crate) enum ArmRows {
    /// The arm's rows, complete.
    Done(RecordBatch),
    /// Reads left to do (a generation's vectors, by range, or the choice of the query's
    /// re-ranking round): run after the arm, off the query threads and concurrently with
    /// every other arm's, so a cold query spends one round trip on them whatever the number
    /// of generations.
    Later(futures::future::BoxFuture<'static, crate::Result<RecordBatch>>),
}

impl ArmRows {
    /// The arm's rows, doing what is left to do.
    async fn finish(self) -> crate::Result<RecordBatch> {
        match self {
            ArmRows::Done(b) => Ok(b),
            ArmRows::Later(f) => f.await,
        }
    }
}

/// Rows `ords` of `source` (number `src` of the snapshot) with their `values` (`_score` or
/// `_distance`), as [`ranked_schema`] lays them out: every source holds its keys in memory.
pub(crate) fn ranked(
    source: &Source,
    src: usize,
    ords: &[usize],
    values: ArrayRef,
    schema: &SchemaRef,
) -> crate::Result<RecordBatch> {
    if ords.is_empty() {
        return Ok(RecordBatch::new_empty(schema.clone()));
    }
    let keys = match source {
        Source::Generation(g) => g.keys(ords)?,
        Source::Memtable(_) => source
            .take(ords, &[0])?
            .pop()
            .ok_or_else(|| crate::Error::internal("no key column"))?,
    };
    let n = ords.len();
    Ok(RecordBatch::try_new(
        schema.clone(),
        vec![
            keys,
            values,
            Arc::new(UInt32Array::from(vec![src as u32; n])),
            Arc::new(UInt64Array::from_iter_values(
                ords.iter().map(|o| *o as u64),
            )),
        ],
    )?)
}

/// A search before its columns are read: its rows ranked and merged ([`ranked_schema`]: the
/// key, the score or distance, the source and the ordinal of each row), with the snapshot's
/// sources and caches to read their columns from.
pub(crate) struct RankedPlan {
    pub(crate) merged: Arc<dyn ExecutionPlan>,
    pub(crate) sources: Vec<Source>,
    pub(crate) caches: Arc<ReadCaches>,
}

impl RankedPlan {
    /// The plan of the search: its rows with the user columns `columns` (positions in the
    /// index's Arrow schema) read after the merge, after the key and `value` (`_score`,
    /// descending, or `_distance`), ordered by `value` then key.
    pub(crate) fn take(
        self,
        schema: &crate::schema::IndexSchema,
        value: &str,
        descending: bool,
        columns: Vec<usize>,
    ) -> crate::Result<Arc<dyn ExecutionPlan>> {
        self.take_annotated(schema, value, descending, columns, None)
    }

    /// [`RankedPlan::take`], then, when `annotations` are given (with the columns they read:
    /// `columns` and more), the rows annotated (see [`Annotations`]).
    pub(crate) fn take_annotated(
        self,
        schema: &crate::schema::IndexSchema,
        value: &str,
        descending: bool,
        columns: Vec<usize>,
        annotations: Option<(Vec<usize>, Annotations)>,
    ) -> crate::Result<Arc<dyn ExecutionPlan>> {
        let (read, annotations) = match annotations {
            Some((read, a)) => (read, Some(Arc::new(a))),
            None => (columns, None),
        };
        let read_schema = super::output_schema(schema, value, &read);
        let out_schema = annotations
            .as_ref()
            .map_or(read_schema.clone(), |a| a.schema());
        let ordering = sort_ordering(&out_schema, descending, value)?;
        Ok(Arc::new(TakeExec::new(
            self.merged,
            self.sources,
            self.caches,
            read.into(),
            (read_schema, annotations),
            out_schema,
            ordering,
        )))
    }
}

/// The order of a search's rows in `schema`: `score` (descending or not), then the key (the
/// first column), as arms, merges and pages keep them.
pub(crate) fn sort_ordering(
    schema: &SchemaRef,
    score_descending: bool,
    score: &str,
) -> crate::Result<LexOrdering> {
    let key = schema.field(0).name().clone();
    LexOrdering::new(vec![
        PhysicalSortExpr::new(
            col(score, schema)?,
            SortOptions {
                descending: score_descending,
                nulls_first: false,
            },
        ),
        PhysicalSortExpr::new(
            col(&key, schema)?,
            SortOptions {
                descending: false,
                nulls_first: false,
            },
        ),
    ])
    .ok_or_else(|| crate::Error::internal("empty ordering"))
}

/// The top of a search: the rows the merge kept ([`ranked_schema`]) with their payload
/// columns read, each source's rows at once and every source concurrently (by range for a
/// generation), so the payload of `k` rows is read once, not `k` rows per arm.
pub(crate) struct TakeExec {
    input: Arc<dyn ExecutionPlan>,
    sources: Arc<[Source]>,
    /// Where fixed-width payload columns are kept decoded.
    columns: Arc<ReadCaches>,
    /// The payload columns (stored positions).
    payload: Arc<[usize]>,
    /// The rows read (key, score or distance, payload).
    read_schema: SchemaRef,
    /// What is computed of the rows read, when asked for (highlights, explanations).
    annotations: Option<Arc<Annotations>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl TakeExec {
    /// Read the `payload` columns of `input`'s rows from `sources` (the snapshot's, in order)
    /// as `read.0` lays them out (key, score or distance, payload), annotated by `read.1` when
    /// given, producing `schema` in `ordering`.
    pub(crate) fn new(
        input: Arc<dyn ExecutionPlan>,
        sources: Vec<Source>,
        columns: Arc<ReadCaches>,
        payload: Arc<[usize]>,
        read: (SchemaRef, Option<Arc<Annotations>>),
        schema: SchemaRef,
        ordering: LexOrdering,
    ) -> Self {
        let eq = EquivalenceProperties::new_with_orderings(schema.clone(), [ordering]);
        let properties = Arc::new(PlanProperties::new(
            eq,
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        TakeExec {
            input,
            sources: sources.into(),
            columns,
            payload,
            read_schema: read.0,
            annotations: read.1,
            schema,
            properties,
        }
    }
}

impl fmt::Debug for TakeExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TakeExec: payload columns={}", self.payload.len())
    }
}

impl DisplayAs for TakeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TakeExec: payload columns={}", self.payload.len())
    }
}

impl ExecutionPlan for TakeExec {
    fn name(&self) -> &str {
        "TakeExec"
    }

    /// One input partition, in order: the merged rows are read from partition 0 alone, so
    /// an optimizer must not split them (a SQL plan around a search would otherwise spread
    /// their batches over partitions, and rows would be lost).
    fn required_input_distribution(&self) -> Vec<datafusion::physical_plan::Distribution> {
        vec![datafusion::physical_plan::Distribution::SinglePartition]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
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
        match <[_; 1]>::try_from(children) {
            Ok([input]) => Ok(Arc::new(TakeExec {
                input,
                sources: self.sources.clone(),
                columns: self.columns.clone(),
                payload: self.payload.clone(),
                read_schema: self.read_schema.clone(),
                annotations: self.annotations.clone(),
                schema: self.schema.clone(),
                properties: self.properties.clone(),
            })),
            Err(_) => Err(DataFusionError::Internal(
                "TakeExec has one child".to_string(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "TakeExec has one partition, asked for {partition}"
            )));
        }
        let parts = self.input.properties().partitioning.partition_count();
        if parts != 1 {
            return Err(DataFusionError::Internal(format!(
                "TakeExec reads one input partition, its input has {parts}"
            )));
        }
        let input = self.input.execute(0, context)?;
        let (sources, payload, schema, caches, annotations) = (
            self.sources.clone(),
            self.payload.clone(),
            self.read_schema.clone(),
            self.columns.clone(),
            self.annotations.clone(),
        );
        let stream = futures::StreamExt::then(input, move |batch| {
            let (sources, payload, schema, caches, annotations) = (
                sources.clone(),
                payload.clone(),
                schema.clone(),
                caches.clone(),
                annotations.clone(),
            );
            async move {
                let batch = batch?;
                let taken = take_payload(&batch, &sources, &caches, &payload, &schema).await;
                match (taken, annotations) {
                    (Ok(taken), Some(a)) => annotate(a, batch, taken).await,
                    (taken, _) => taken,
                }
                .map_err(|e| DataFusionError::External(Box::new(e)))
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}

/// `taken` (the rows of `ranked`, [`ranked_schema`], with their columns read) annotated, on a
/// blocking thread: an explanation may read postings.
async fn annotate(
    a: Arc<Annotations>,
    ranked: RecordBatch,
    taken: RecordBatch,
) -> crate::Result<RecordBatch> {
    if taken.num_rows() == 0 {
        return Ok(RecordBatch::new_empty(a.schema()));
    }
    tokio::task::spawn_blocking(move || {
        let src = ranked
            .column(2)
            .as_primitive::<arrow::datatypes::UInt32Type>();
        let ord = ranked
            .column(3)
            .as_primitive::<arrow::datatypes::UInt64Type>();
        a.apply(&taken, src.values(), ord.values())
    })
    .await?
}

/// Payload columns `payload` of rows `ords` of generation `g`: fixed-width columns (numbers,
/// dates) from their decoded whole, kept in the handle's column cache (read once, then a take
/// per query) when the cache can keep them for every generation the query returns rows of,
/// `rows` rows in all ([`crate::read::ColumnCache::keeps_whole`]); the others read by row.
async fn generation_payload(
    g: &Arc<crate::generation::Generation>,
    ords: &[usize],
    caches: &ReadCaches,
    (payload, rows): (&[usize], u64),
    schema: &SchemaRef,
) -> crate::Result<Vec<ArrayRef>> {
    if !g.reads_by_range() {
        return g.read_rows(ords, payload).await;
    }
    // The output schema's payload fields follow the key and the score.
    let narrow: Vec<bool> = (0..payload.len())
        .map(|i| {
            let width = schema.field(i + 2).data_type().primitive_width();
            width.is_some_and(|w| caches.columns.keeps_whole(rows.saturating_mul(w as u64)))
        })
        .collect();
    let (mut kept, mut by_row) = (Vec::new(), Vec::new());
    for (c, n) in payload.iter().zip(&narrow) {
        if *n {
            kept.push(*c);
        } else {
            by_row.push(*c);
        }
    }
    // Both reads at once: one round trip.
    let (whole, rows) = futures::future::try_join(
        async {
            match kept.is_empty() {
                true => Ok(Vec::new()),
                false => Ok(caches
                    .columns
                    .read_async(&[g], &kept)
                    .await?
                    .pop()
                    .unwrap_or_default()),
            }
        },
        async {
            match by_row.is_empty() {
                true => Ok(Vec::new()),
                false => g.read_rows(ords, &by_row).await,
            }
        },
    )
    .await?;
    let idx = UInt32Array::from_iter_values(ords.iter().map(|o| *o as u32));
    let (mut whole, mut rows) = (whole.into_iter(), rows.into_iter());
    narrow
        .iter()
        .map(|n| {
            let missing = || crate::Error::internal("a payload column missing from a read");
            if *n {
                let column = whole.next().ok_or_else(missing)?;
                Ok(arrow::compute::take(column.as_ref(), &idx, None)?)
            } else {
                rows.next().ok_or_else(missing)
            }
        })
        .collect()
}

/// `batch` ([`ranked_schema`]) with the `payload` columns of its rows, as `schema` says.
pub(crate) async fn take_payload(
    batch: &RecordBatch,
    sources: &[Source],
    caches: &ReadCaches,
    payload: &[usize],
    schema: &SchemaRef,
) -> crate::Result<RecordBatch> {
    if batch.num_rows() == 0 {
        return Ok(RecordBatch::new_empty(schema.clone()));
    }
    let src = batch
        .column(2)
        .as_primitive::<arrow::datatypes::UInt32Type>();
    let ord = batch
        .column(3)
        .as_primitive::<arrow::datatypes::UInt64Type>();
    // Each source's rows: (row of the batch, ordinal in the source).
    let mut by_source: std::collections::BTreeMap<usize, Vec<(usize, usize)>> = Default::default();
    for i in 0..batch.num_rows() {
        by_source
            .entry(src.value(i) as usize)
            .or_default()
            .push((i, ord.value(i) as usize));
    }
    // Rows of the generations the batch has rows of: a column read whole is read whole in
    // each of them.
    let rows_read: u64 = by_source
        .keys()
        .filter_map(|s| match sources.get(*s) {
            Some(Source::Generation(g)) => Some(g.num_rows() as u64),
            _ => None,
        })
        .sum();
    let reads = by_source.iter().map(|(s, rows)| async move {
        let source = sources.get(*s).ok_or_else(|| {
            crate::Error::internal(format!("a row of source {s}, which is not in the snapshot"))
        })?;
        let ords: Vec<usize> = rows.iter().map(|r| r.1).collect();
        match source {
            Source::Generation(g) => {
                generation_payload(g, &ords, caches, (payload, rows_read), schema).await
            }
            Source::Memtable(_) => source.take(&ords, payload),
        }
    });
    let read = futures::future::try_join_all(reads).await?;
    // Where each row of the batch is: (source's read, row in it).
    let mut at = vec![(0usize, 0usize); batch.num_rows()];
    for (n, rows) in by_source.values().enumerate() {
        for (j, (i, _)) in rows.iter().enumerate() {
            at[*i] = (n, j);
        }
    }
    let mut columns: Vec<ArrayRef> = vec![batch.column(0).clone(), batch.column(1).clone()];
    for c in 0..payload.len() {
        let parts: Vec<&dyn arrow::array::Array> =
            read.iter().map(|cols| cols[c].as_ref()).collect();
        columns.push(arrow::compute::interleave(&parts, &at)?);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// One arm of a search: what the plan shows and the work it runs.
pub(crate) struct ArmSpec {
    /// Shown in the plan, e.g. `source=generation 3, rows=…, candidates=…`.
    pub description: String,
    /// The arm's search.
    pub work: ArmWork,
}

/// A leaf with one partition per arm, each producing its arm's top k rows in the plan's sort
/// order.
pub(crate) struct ArmExec {
    kind: &'static str,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    arms: Vec<ArmSpec>,
    /// Where the arms run (no thread per arm).
    pool: Arc<QueryPool>,
}

impl ArmExec {
    pub(crate) fn new(
        kind: &'static str,
        schema: SchemaRef,
        ordering: LexOrdering,
        arms: Vec<ArmSpec>,
        pool: Arc<QueryPool>,
    ) -> Self {
        let eq = EquivalenceProperties::new_with_orderings(schema.clone(), [ordering]);
        let properties = Arc::new(PlanProperties::new(
            eq,
            Partitioning::UnknownPartitioning(arms.len().max(1)),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        ArmExec {
            kind,
            schema,
            properties,
            arms,
            pool,
        }
    }
}

impl fmt::Debug for ArmExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: arms={}", self.kind, self.arms.len())
    }
}

impl DisplayAs for ArmExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: arms={}", self.kind, self.arms.len())?;
        for (i, arm) in self.arms.iter().enumerate() {
            write!(f, ", [arm {i}: {}]", arm.description)?;
        }
        Ok(())
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
        let Some(arm) = self.arms.get(partition) else {
            if self.arms.is_empty() && partition == 0 {
                return Ok(Box::pin(RecordBatchStreamAdapter::new(
                    self.schema.clone(),
                    futures::stream::empty(),
                )));
            }
            return Err(DataFusionError::Internal(format!(
                "{} has {} partitions, asked for {partition}",
                self.kind,
                self.arms.len()
            )));
        };
        let work = arm.work.clone();
        let (kind, description) = (self.kind, arm.description.clone());
        // Queued on the pool now; a stream dropped before its arm starts skips the arm.
        let arm = self.pool.run(move |stop| {
            let t = std::time::Instant::now();
            let out = work(stop);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if ms >= SLOW_ARM_MS {
                tracing::debug!(target: "lsmsearch::slow", "{kind} arm took {ms:.1} ms: {description}");
            }
            out
        });
        let fut = async move {
            match arm.await {
                Ok(rows) => rows.finish().await,
                Err(e) => Err(e),
            }
            .map_err(|e| DataFusionError::External(Box::new(e)))
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            futures::stream::once(fut),
        )))
    }
}
