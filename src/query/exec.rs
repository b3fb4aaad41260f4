//! The DataFusion leaf of a search: one output partition per arm, each yielding that arm's top k
//! rows, already ordered, for a `SortPreservingMergeExec` to merge, or ([`Spread::Gathered`])
//! one partition yielding every arm's rows merged.
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
use futures::StreamExt;
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
    /// re-ranking round): run after the arm (after every arm, in a leaf that gathers its
    /// arms), off the query threads and concurrently with every other arm's, so a cold query
    /// spends one round trip on them whatever the number of generations.
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

/// How an [`ArmExec`] lays its arms out in partitions.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Spread {
    /// A partition per arm, each a job of the pool: full-text arms, which split the scoring
    /// of a large segment in pieces over the pool's threads.
    PerArm,
    /// One partition: a job of the pool per thread (at most one an arm) takes the arms in turn
    /// (a thread that frees up late helps with those left), and the arms' rows are merged in
    /// the plan's order, the first `fetch` of them. For arms of little work each (vector arms:
    /// a walk or a scan of codes), whose partitions cost more than their work: a job, a
    /// channel, a wake-up, a stream and a merge input each (64 generations,
    /// `bench generations`: half the CPU of a vector search).
    Gathered {
        /// At most how many rows the partition yields (the search's `offset + k`).
        fetch: usize,
    },
}

/// A leaf with one partition per arm, each producing its arm's top k rows in the plan's sort
/// order, or ([`Spread::Gathered`]) one partition producing every arm's.
pub(crate) struct ArmExec {
    kind: &'static str,
    schema: SchemaRef,
    ordering: LexOrdering,
    properties: Arc<PlanProperties>,
    arms: Arc<[ArmSpec]>,
    spread: Spread,
    /// Where the arms run (no thread per arm).
    pool: Arc<QueryPool>,
}

impl ArmExec {
    /// A leaf named `kind` running `arms` on `pool`, laid out as `spread` says, each
    /// partition's rows (`schema`) in `ordering`.
    pub(crate) fn new(
        kind: &'static str,
        (schema, ordering): (SchemaRef, LexOrdering),
        arms: Vec<ArmSpec>,
        spread: Spread,
        pool: Arc<QueryPool>,
    ) -> Self {
        let partitions = match spread {
            Spread::PerArm => arms.len().max(1),
            Spread::Gathered { .. } => 1,
        };
        let eq = EquivalenceProperties::new_with_orderings(schema.clone(), [ordering.clone()]);
        let properties = Arc::new(PlanProperties::new(
            eq,
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        ArmExec {
            kind,
            schema,
            ordering,
            properties,
            arms: arms.into(),
            spread,
            pool,
        }
    }

    /// The one partition of a [`Spread::Gathered`] leaf: its arms taken in turn by a job of the
    /// pool per thread, at most one an arm ([`Gathered`]), what is left to do of each (reads,
    /// the re-ranking round) done concurrently, and their rows merged, the first `fetch`.
    fn gathered(&self, fetch: usize) -> SendableRecordBatchStream {
        let shared = Arc::new(Gathered::new(self.kind, self.arms.clone()));
        let jobs: Vec<_> = (0..self.pool.threads().min(self.arms.len()).max(1))
            .map(|_| {
                let shared = shared.clone();
                self.pool.run(move |stop| {
                    shared.work(stop);
                    Ok(())
                })
            })
            .collect();
        let (schema, ordering) = (self.schema.clone(), self.ordering.clone());
        let fut = async move {
            let rows = shared.rows(jobs).await?;
            let n = rows.len().max(1);
            let mut finished =
                futures::stream::iter(rows.into_iter().map(ArmRows::finish)).buffer_unordered(n);
            let mut merged = Merged::new(schema, ordering, fetch);
            while let Some(batch) = finished.next().await {
                merged.push(batch?)?;
            }
            merged.finish()
        };
        let fut = futures::TryFutureExt::map_err(fut, |e| DataFusionError::External(Box::new(e)));
        Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            futures::stream::once(fut),
        ))
    }
}

/// The arms of a [`Spread::Gathered`] leaf and their rows, shared by the jobs that run them:
/// each job takes the next arm no job took until none is left. The pool's threads that are
/// free run the arms, one that frees up late helps with those left, and a job that starts
/// after the last was taken ends at once. No thread waits for another: rayon's join would,
/// running meanwhile whatever job is queued, another query's arm for one. (A hybrid search
/// queues its vector arms behind its full-text arms: run by one job, they kept one thread
/// busy after the full-text arms were done while the other had nothing to do.)
struct Gathered {
    kind: &'static str,
    arms: Arc<[ArmSpec]>,
    /// The next arm to take.
    next: std::sync::atomic::AtomicUsize,
    /// Each arm's rows, once run.
    rows: Vec<std::sync::Mutex<Option<crate::Result<ArmRows>>>>,
    /// Arms not yet run (one that fails tells at once, without counting).
    left: std::sync::atomic::AtomicUsize,
    /// Told when every arm has run, or one failed.
    done: tokio::sync::Notify,
}

impl Gathered {
    fn new(kind: &'static str, arms: Arc<[ArmSpec]>) -> Self {
        Gathered {
            kind,
            next: 0.into(),
            rows: arms.iter().map(|_| Default::default()).collect(),
            left: arms.len().into(),
            arms,
            done: tokio::sync::Notify::new(),
        }
    }

    /// Run arms until none is left to take, or one failed, or the query stopped.
    fn work(&self, stop: &crate::read::pool::Stop) {
        use std::sync::atomic::Ordering;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(arm) = self.arms.get(i) else {
                return;
            };
            let out = stop
                .check()
                .and_then(|()| crate::read::pool::caught(|| run_arm(self.kind, arm, stop)));
            let failed = out.is_err();
            *self.rows[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
            if failed {
                // No other arm is taken: the search fails.
                self.next.store(self.arms.len(), Ordering::Relaxed);
                self.done.notify_one();
                return;
            }
            if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.done.notify_one();
            }
        }
    }

    /// Every arm's rows, in the arms' order, once `jobs` (those running [`Gathered::work`])
    /// have run them all; the first error of an arm that failed. Jobs not started by then
    /// are dropped, and skipped.
    async fn rows(
        &self,
        jobs: Vec<impl std::future::Future<Output = crate::Result<()>>>,
    ) -> crate::Result<Vec<ArmRows>> {
        let ended = futures::future::join_all(jobs);
        futures::pin_mut!(ended);
        let told = self.done.notified();
        futures::pin_mut!(told);
        // The jobs end without telling only when one could not run its arm to the end.
        if let futures::future::Either::Right((ended, _)) =
            futures::future::select(told, ended).await
        {
            ended.into_iter().collect::<crate::Result<Vec<()>>>()?;
        }
        let mut rows = Vec::with_capacity(self.rows.len());
        let mut missing = false;
        for slot in &self.rows {
            match slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                Some(Ok(r)) => rows.push(r),
                Some(Err(e)) => return Err(e),
                None => missing = true,
            }
        }
        match missing {
            true => Err(crate::Error::internal(
                "a search arm stopped without an answer",
            )),
            false => Ok(rows),
        }
    }
}

/// Run one arm's work, logging it when slow.
fn run_arm(
    kind: &'static str,
    arm: &ArmSpec,
    stop: &crate::read::pool::Stop,
) -> crate::Result<ArmRows> {
    let t = std::time::Instant::now();
    let out = (arm.work)(stop);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if ms >= SLOW_ARM_MS {
        tracing::debug!(
            target: "lsmsearch::slow",
            "{kind} arm took {ms:.1} ms: {}",
            arm.description
        );
    }
    out
}

/// The rows of several arms, each in the plan's order, merged: the first `fetch` in that
/// order. Arms' rows are sorted together once they are twice `fetch` (and more than a few
/// thousand), so what it holds stays bounded by the rows of the arms not yet merged.
struct Merged {
    schema: SchemaRef,
    ordering: LexOrdering,
    fetch: usize,
    batches: Vec<RecordBatch>,
    rows: usize,
}

impl Merged {
    /// Rows merged below this are merged once, at the end.
    const AT_ONCE: usize = 8192;

    fn new(schema: SchemaRef, ordering: LexOrdering, fetch: usize) -> Self {
        Merged {
            schema,
            ordering,
            fetch,
            batches: Vec::new(),
            rows: 0,
        }
    }

    /// Add an arm's rows.
    fn push(&mut self, batch: RecordBatch) -> crate::Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.rows += batch.num_rows();
        self.batches.push(batch);
        if self.rows > self.fetch.saturating_mul(2).max(Self::AT_ONCE) {
            let first = self.sorted()?;
            self.rows = first.num_rows();
            self.batches = vec![first];
        }
        Ok(())
    }

    /// The rows held, sorted, the first `fetch`.
    fn sorted(&self) -> crate::Result<RecordBatch> {
        let all = arrow::compute::concat_batches(&self.schema, &self.batches)?;
        Ok(datafusion::physical_plan::sorts::sort::sort_batch(
            &all,
            &self.ordering,
            Some(self.fetch),
        )?)
    }

    /// The first `fetch` rows of every arm's.
    fn finish(self) -> crate::Result<RecordBatch> {
        match self.batches.len() {
            0 => Ok(RecordBatch::new_empty(self.schema)),
            _ => self.sorted(),
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
        if let Spread::Gathered { fetch } = self.spread {
            write!(f, ", gathered in one partition, fetch={fetch}")?;
        }
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
        if let Spread::Gathered { fetch } = self.spread {
            if partition != 0 {
                return Err(DataFusionError::Internal(format!(
                    "{} has one partition, asked for {partition}",
                    self.kind
                )));
            }
            return Ok(self.gathered(fetch));
        }
        if partition >= self.arms.len() {
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
        }
        let (arms, kind) = (self.arms.clone(), self.kind);
        // Queued on the pool now; a stream dropped before its arm starts skips the arm.
        let arm = self
            .pool
            .run(move |stop| run_arm(kind, &arms[partition], stop));
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float32Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use rand::{Rng, SeedableRng};

    /// The ranked schema of a vector search: key, distance, source, ordinal.
    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("_distance", DataType::Float32, false),
            Field::new(SOURCE_COLUMN, DataType::UInt32, false),
            Field::new(ORD_COLUMN, DataType::UInt64, false),
        ]))
    }

    /// `n` arms of random sizes (up to `most` rows each), each sorted by distance then key,
    /// distances drawn from few values so that ties are broken by the key; every third arm's
    /// rows come later (as a read would give them).
    fn arms(seed: u64, n: usize, most: usize) -> Vec<ArmSpec> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|a| {
                let rows = rng.random_range(0..=most);
                let mut hits: Vec<(f32, String)> = (0..rows)
                    .map(|r| {
                        (
                            rng.random_range(0..20) as f32 / 4.0,
                            format!("k{a:03}-{r:05}"),
                        )
                    })
                    .collect();
                hits.sort_by(|x, y| x.0.total_cmp(&y.0).then_with(|| x.1.cmp(&y.1)));
                let batch = RecordBatch::try_new(
                    schema(),
                    vec![
                        Arc::new(StringArray::from_iter_values(hits.iter().map(|h| &h.1))),
                        Arc::new(Float32Array::from_iter_values(hits.iter().map(|h| h.0))),
                        Arc::new(UInt32Array::from(vec![a as u32; rows])),
                        Arc::new(UInt64Array::from_iter_values(0..rows as u64)),
                    ],
                )
                .unwrap();
                let later = a % 3 == 0;
                let work: ArmWork = Arc::new(move |_| {
                    let b = batch.clone();
                    Ok(match later {
                        true => ArmRows::Later(Box::pin(async move { Ok(b) })),
                        false => ArmRows::Done(b),
                    })
                });
                ArmSpec {
                    description: format!("arm {a}"),
                    work,
                }
            })
            .collect()
    }

    /// The rows a leaf of `arms` laid out as `spread` yields under a merge that keeps
    /// `fetch`: (key, distance).
    async fn search(arms: Vec<ArmSpec>, spread: Spread, fetch: usize) -> Vec<(String, f32)> {
        let ordering = sort_ordering(&schema(), false, "_distance").unwrap();
        let pool = QueryPool::new(2, 0).unwrap();
        let leaf = Arc::new(ArmExec::new(
            "VectorArmExec",
            (schema(), ordering.clone()),
            arms,
            spread,
            pool,
        ));
        let merged = Arc::new(
            datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec::new(
                ordering, leaf,
            )
            .with_fetch(Some(fetch)),
        );
        let ctx = datafusion::prelude::SessionContext::new();
        let batches = datafusion::physical_plan::collect(merged, ctx.task_ctx())
            .await
            .unwrap();
        rows_of(&batches)
    }

    /// The (key, distance) of every row of `batches`, in order.
    fn rows_of(batches: &[RecordBatch]) -> Vec<(String, f32)> {
        let mut out = Vec::new();
        for b in batches {
            let keys = b.column(0).as_string::<i32>();
            let d = b.column(1).as_primitive::<arrow::datatypes::Float32Type>();
            for i in 0..b.num_rows() {
                out.push((keys.value(i).to_string(), d.value(i)));
            }
        }
        out
    }

    #[tokio::test]
    async fn gathered_arms_yield_what_a_merge_of_a_partition_per_arm_does() {
        // Few rows (merged once at the end) and many (merged as they come, past
        // `Merged::AT_ONCE`), a small fetch and one larger than every row.
        for (seed, n, most, fetch) in [
            (1, 65, 100, 10),
            (2, 65, 100, 100),
            (3, 40, 900, 7),
            (4, 40, 900, 3_000),
            (5, 3, 5, 1_000),
            (6, 1, 50, 20),
            (7, 0, 0, 10),
        ] {
            let per_arm = search(arms(seed, n, most), Spread::PerArm, fetch).await;
            let gathered = search(arms(seed, n, most), Spread::Gathered { fetch }, fetch).await;
            assert_eq!(gathered, per_arm, "seed {seed}: {n} arms, fetch {fetch}");
            assert_eq!(per_arm.is_empty(), n == 0, "seed {seed}");
        }
    }

    #[tokio::test]
    async fn gathered_arms_run_in_turn_on_a_busy_pool() {
        // The pool's only thread is held, and a job queued behind the gathered one: when the
        // thread is free, the gathered leaf's one job runs its arms in turn.
        let pool = QueryPool::new(1, 0).unwrap();
        let (hold_tx, busy) = pool.hold_a_thread();
        let ordering = sort_ordering(&schema(), false, "_distance").unwrap();
        let leaf = Arc::new(ArmExec::new(
            "VectorArmExec",
            (schema(), ordering),
            arms(11, 30, 60),
            Spread::Gathered { fetch: 25 },
            pool.clone(),
        ));
        let ctx = datafusion::prelude::SessionContext::new();
        let gathered = tokio::spawn(datafusion::physical_plan::collect(leaf, ctx.task_ctx()));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            pool.saturated(),
            "the gathered job is queued behind the held one"
        );
        let after = pool.run(|_| Ok(()));
        hold_tx.send(()).unwrap();
        busy.await.unwrap();
        after.await.unwrap();
        let rows = rows_of(&gathered.await.unwrap().unwrap());
        assert_eq!(rows, search(arms(11, 30, 60), Spread::PerArm, 25).await);
    }

    #[tokio::test]
    async fn a_thread_that_frees_up_runs_the_gathered_arms_left() {
        // Both threads held, and a job queued behind the gathered leaf's. The first thread let
        // go takes arm 0, which waits until arm 1 has started: only the second thread, let go
        // later, can start it. A gathered leaf run by one job (in turn, as the pool is
        // saturated) would wait for ever; this one's waits 10 s at most.
        let pool = QueryPool::new(2, 0).unwrap();
        let (hold_a, busy_a) = pool.hold_a_thread();
        let (hold_b, busy_b) = pool.hold_a_thread();
        let mut all = arms(12, 6, 40);
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (first, second) = (all[0].work.clone(), all[1].work.clone());
        let flag = started.clone();
        all[0].work = Arc::new(move |stop| {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !flag.load(std::sync::atomic::Ordering::Acquire) {
                if std::time::Instant::now() > until {
                    return Err(crate::Error::internal("arm 1 never started"));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            first(stop)
        });
        all[1].work = Arc::new(move |stop| {
            started.store(true, std::sync::atomic::Ordering::Release);
            second(stop)
        });
        let ordering = sort_ordering(&schema(), false, "_distance").unwrap();
        let leaf = Arc::new(ArmExec::new(
            "VectorArmExec",
            (schema(), ordering),
            all,
            Spread::Gathered { fetch: 30 },
            pool.clone(),
        ));
        let ctx = datafusion::prelude::SessionContext::new();
        let gathered = tokio::spawn(datafusion::physical_plan::collect(leaf, ctx.task_ctx()));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let queued = pool.run(|_| Ok(()));
        // The gathered leaf's jobs are queued behind the held threads: the pool is saturated,
        // so a leaf run by one job would run its arms in turn.
        assert!(pool.saturated(), "the gathered leaf is queued");
        hold_a.send(()).unwrap();
        busy_a.await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        hold_b.send(()).unwrap();
        busy_b.await.unwrap();
        queued.await.unwrap();
        let rows = rows_of(&gathered.await.unwrap().unwrap());
        assert_eq!(rows, search(arms(12, 6, 40), Spread::PerArm, 30).await);
    }

    #[tokio::test]
    async fn a_gathered_arm_that_fails_fails_the_search() {
        let mut all = arms(9, 20, 30);
        all[13].work = Arc::new(|_| Err(crate::Error::invalid("arm 13 failed")));
        let ordering = sort_ordering(&schema(), false, "_distance").unwrap();
        let leaf = ArmExec::new(
            "VectorArmExec",
            (schema(), ordering),
            all,
            Spread::Gathered { fetch: 10 },
            QueryPool::new(2, 0).unwrap(),
        );
        let ctx = datafusion::prelude::SessionContext::new();
        let e = datafusion::physical_plan::collect(Arc::new(leaf), ctx.task_ctx())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("arm 13 failed"), "{e}");
    }
}
