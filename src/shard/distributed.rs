//! Sharded searches run by workers: each shard's part of a search is a leaf of a DataFusion
//! plan ([`ShardExec`]) that datafusion-distributed ships to a worker over Arrow Flight, one
//! task per worker reading the shards routed to it, merged on the coordinator by a
//! `SortPreservingMergeExec` (the plan is built in its distributed form, not by the crate's
//! planner).
//!
//! A worker (`lsmsearch worker --listen HOST:PORT`, or [`serve`]) opens the shards a task
//! names read-only (any worker can serve any shard: the data is in the object store),
//! refreshes them, and keeps the point in time each search took of each shard for the
//! search's second phase: full text asks every shard for its statistics first (a task that
//! takes a point in time of each shard and pins it under the search's token), then for its
//! rows scored with the sums (a task that must find those points in time). Shard `i` is read
//! on the same worker in both phases (worker `i mod W`, or the process that writes the
//! shard and serves it with [`serve_writer`]); a second phase that finds no point in time
//! (its worker restarted) fails with an `Unavailable` error naming the shard, never with
//! rows of another snapshot. A search whose worker cannot be reached or dies runs again from
//! its first phase without that worker.

use super::{Parts, ShardLayout};
use crate::query::{
    returned_columns, within_deadline, FtsStatistics, HybridSearchOptions, SearchOptions,
    VectorSearchOptions, DISTANCE_COLUMN, SCORE_COLUMN,
};
use crate::{
    Error, ErrorKind, IndexSchema, Location, PointInTime, ReadOnlyIndex, Result, Settings,
};
use arrow::array::{
    Array, ArrayRef, Float32Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, SessionStateBuilder, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_distributed::{
    DistributedConfig, DistributedExec, DistributedExt, DistributedLeafExec, NetworkBoundary,
    NetworkCoalesceExec, RouteTasksEvent, RouteTasksEventResponse, Stage, Worker,
    WorkerQueryContext, WorkerResolver,
};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use url::Url;

/// How long a worker keeps the point in time a search took of a shard, for the search's
/// second phase.
const PINNED_FOR: Duration = Duration::from_secs(60);

/// How long a round of a search's tasks may take by default.
const DEFAULT_TASK_TIMEOUT: Duration = Duration::from_secs(30);

/// The most attempts of one search (see [`DistributedIndex`]'s retries).
const MAX_ATTEMPTS: usize = 3;

/// What a worker says when a search's second phase finds no point in time.
const PIN_MISSING: &str = "the point in time this search took of it is not on this worker";

/// The most points in time a worker keeps pinned at once (the least recently used go first).
const MAX_PINNED: u64 = 4096;

/// Where one attempt of a search reads each shard (a session extension that
/// [`Search::planned`] and the round's routing read, [`Route::tasks`]): on the worker that
/// writes the shard when one serves it, else on worker `i mod W`. A search that retries
/// leaves out the workers that failed it.
#[derive(Debug, Clone, PartialEq)]
struct Route {
    workers: Vec<Url>,
    writers: HashMap<usize, Url>,
}

impl Route {
    /// The worker of shard `i`'s task.
    fn worker(&self, i: usize) -> &Url {
        match self.writers.get(&i) {
            Some(w) => w,
            None => &self.workers[i % self.workers.len()],
        }
    }

    /// The tasks of a round that reads shards `reads` on this route: each a worker and the
    /// shards it reads. A worker's shards are one task: a task costs its streams and their
    /// setup on the worker whatever it reads, and the shards of one task share its worker's
    /// query threads as they would in one process.
    fn tasks(&self, reads: &[usize]) -> Vec<(Url, Vec<usize>)> {
        let mut tasks: Vec<(Url, Vec<usize>)> = Vec::new();
        for &i in reads {
            let worker = self.worker(i);
            match tasks.iter_mut().find(|(url, _)| url == worker) {
                Some((_, reads)) => reads.push(i),
                None => tasks.push((worker.clone(), vec![i])),
            }
        }
        tasks
    }

    /// The workers of this route that `text` (an error) names.
    fn named_in(&self, text: &str) -> Vec<Url> {
        let mut named: Vec<Url> = self
            .workers
            .iter()
            .chain(self.writers.values())
            .filter(|u| names(text, &address(u)))
            .cloned()
            .collect();
        named.sort();
        named.dedup();
        named
    }

    /// This route without the workers `gone`: `None` when no worker is left.
    fn without(&self, gone: &[Url]) -> Option<Route> {
        let workers: Vec<Url> = self
            .workers
            .iter()
            .filter(|u| !gone.contains(u))
            .cloned()
            .collect();
        if workers.is_empty() {
            return None;
        }
        let writers = self
            .writers
            .iter()
            .filter(|(_, u)| !gone.contains(u))
            .map(|(i, u)| (*i, u.clone()))
            .collect();
        Some(Route { workers, writers })
    }
}

/// `HOST:PORT` of worker `url`.
fn address(url: &Url) -> String {
    format!(
        "{}:{}",
        url.host_str().unwrap_or_default(),
        url.port_or_known_default().unwrap_or_default()
    )
}

/// Whether `text` names `address` (not as the start of a longer port).
fn names(text: &str, address: &str) -> bool {
    text.match_indices(address).any(|(at, _)| {
        !text[at + address.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// What a shard's part of a search does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Request {
    /// The shard's share of the full-text statistics of `query`.
    Statistics {
        query: String,
        options: SearchOptions,
    },
    /// The shard's best `options.k` rows of `query`, scored with `statistics`.
    Fts {
        query: String,
        options: SearchOptions,
        statistics: FtsStatistics,
    },
    /// The shard's own statistics of `query`, and, when they are still `shares[shard]` (the
    /// shares an earlier search found), its best `options.k` rows scored with their sum: one
    /// round where the shares still hold, instead of two.
    FtsChecked {
        query: String,
        options: SearchOptions,
        shares: Vec<FtsStatistics>,
    },
    /// The shard's count of rows matching `query` (scored with `statistics` when given).
    Count {
        query: String,
        options: SearchOptions,
        statistics: Option<FtsStatistics>,
    },
    /// The shard's nearest `options.k` rows to `query`.
    Vector {
        query: Vec<f32>,
        options: VectorSearchOptions,
    },
}

/// Whether a task takes the point in time it reads, or finds the one an earlier task of the
/// same search took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Pin {
    Take,
    Find,
    /// Take a point in time for this task alone: a search of one phase keeps nothing.
    Once,
}

/// The newest format of the [`ShardNode`]s this process sends: 2, for a
/// [`Request::FtsChecked`] (format 1 has none; every other request is sent as format 1).
const NODE_FORMAT: u32 = 2;

/// What a [`ShardExec`] carries to its worker (its codec's JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ShardNode {
    /// The format of this message ([`NODE_FORMAT`]).
    version: u32,
    /// The sharded index's location, as a worker parses it.
    location: String,
    /// The schema of every shard.
    schema: IndexSchema,
    /// The index's shard count.
    shards: u32,
    /// The shards this node reads.
    reads: Vec<usize>,
    /// The search this task belongs to: the key its points in time are pinned under.
    search: String,
    pin: Pin,
    request: Request,
}

impl ShardNode {
    /// The rows this node returns, and the order they come in.
    fn output(&self) -> Result<(SchemaRef, Option<(bool, &'static str)>)> {
        Ok(match &self.request {
            Request::Statistics { .. } => (
                Arc::new(Schema::new(vec![
                    Field::new("shard", DataType::UInt32, false),
                    Field::new("statistics", DataType::Utf8, false),
                ])),
                None,
            ),
            Request::Count { .. } => (
                Arc::new(Schema::new(vec![
                    Field::new("shard", DataType::UInt32, false),
                    Field::new("count", DataType::UInt64, false),
                ])),
                None,
            ),
            Request::Fts { options, .. } => (
                fts_output(&self.schema, options)?,
                Some((true, SCORE_COLUMN)),
            ),
            Request::FtsChecked { options, .. } => (
                checked_output(fts_output(&self.schema, options)?.as_ref()),
                Some((true, SCORE_COLUMN)),
            ),
            Request::Vector { options, .. } => {
                let columns =
                    returned_columns(&self.schema, options.columns.as_deref(), DISTANCE_COLUMN)?;
                (
                    crate::query::output_schema(&self.schema, DISTANCE_COLUMN, &columns),
                    Some((false, DISTANCE_COLUMN)),
                )
            }
        })
    }

    /// The same node reading `reads`.
    fn reading(&self, reads: Vec<usize>) -> ShardNode {
        ShardNode {
            reads,
            ..self.clone()
        }
    }
}

/// The rows of a shard's full-text part: key, `_score`, the columns `options` names, and
/// its highlights and explanations.
fn fts_output(schema: &IndexSchema, options: &SearchOptions) -> Result<SchemaRef> {
    let columns = returned_columns(schema, options.columns.as_deref(), SCORE_COLUMN)?;
    let base = crate::query::output_schema(schema, SCORE_COLUMN, &columns);
    crate::query::annotate::annotated_schema(
        schema,
        &base,
        options.highlight.as_ref(),
        options.explain,
    )
}

/// The shard a row of a checked full-text part's statistics is of (null on a ranked row).
const SHARD_COLUMN: &str = "_shard";

/// A shard's statistics (JSON) on a checked full-text part's rows of statistics.
const STATISTICS_COLUMN: &str = "_statistics";

/// The rows of a checked full-text part ([`Request::FtsChecked`]): its ranked rows (`rows`,
/// every column but `_score` nullable), then `_shard` and `_statistics`. A row of
/// statistics has `_score` +∞, so that the merge above the tasks puts every shard's first,
/// and nulls in the other columns.
fn checked_output(rows: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = rows
        .fields()
        .iter()
        .map(|f| {
            let nullable = f.is_nullable() || f.name() != SCORE_COLUMN;
            f.as_ref().clone().with_nullable(nullable)
        })
        .collect();
    fields.push(Field::new(SHARD_COLUMN, DataType::UInt32, true));
    fields.push(Field::new(STATISTICS_COLUMN, DataType::Utf8, true));
    Arc::new(Schema::new(fields))
}

/// A checked full-text part's one batch of `schema` ([`checked_output`]): a row of each of
/// `shards`' statistics (`shares`), then the ranked `rows`.
fn checked_rows(
    schema: &SchemaRef,
    shards: &[usize],
    shares: &[FtsStatistics],
    rows: &[RecordBatch],
) -> Result<RecordBatch> {
    let n = shards.len();
    let json: Vec<String> = shares
        .iter()
        .map(|s| serde_json::to_string(s).map_err(|e| Error::internal(e.to_string())))
        .collect::<Result<_>>()?;
    let mut json = Some(json);
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| match f.name().as_str() {
            SCORE_COLUMN => Arc::new(Float32Array::from(vec![f32::INFINITY; n])) as ArrayRef,
            SHARD_COLUMN => Arc::new(UInt32Array::from_iter_values(
                shards.iter().map(|s| *s as u32),
            )),
            STATISTICS_COLUMN => Arc::new(StringArray::from(json.take().unwrap_or_default())),
            _ => arrow::array::new_null_array(f.data_type(), n),
        })
        .collect();
    let mut batches = vec![RecordBatch::try_new(schema.clone(), columns)?];
    for b in rows {
        let mut columns = b.columns().to_vec();
        columns.push(arrow::array::new_null_array(
            &DataType::UInt32,
            b.num_rows(),
        ));
        columns.push(arrow::array::new_null_array(&DataType::Utf8, b.num_rows()));
        batches.push(RecordBatch::try_new(schema.clone(), columns)?);
    }
    Ok(arrow::compute::concat_batches(schema, &batches)?)
}

/// A shard's part of a sharded search: the leaf of the plan a worker runs. One partition:
/// the rows of the shards it reads, ordered by score (or distance) then key.
#[derive(Debug)]
pub struct ShardExec {
    node: ShardNode,
    properties: Arc<PlanProperties>,
}

impl ShardExec {
    fn new(node: ShardNode) -> Result<ShardExec> {
        let (schema, order) = node.output()?;
        // Ranked rows come by score (or distance) then key; a shard's statistics or count,
        // by shard. Either way the merge above the tasks keeps their order
        // ([`Search::planned`] puts the tasks on workers below it).
        let ordering = match order {
            // A checked part's rows of statistics have `_score` +∞ and no key: with keys
            // ordered nulls first, they come before any row, even one scored +∞ (a huge
            // boost), and the merge's fetch keeps every one.
            Some((descending, value)) => {
                let ordering = crate::query::exec::sort_ordering(&schema, descending, value)?;
                match node.request {
                    Request::FtsChecked { .. } => {
                        let mut exprs: Vec<_> = ordering.iter().cloned().collect();
                        if let Some(key) = exprs.get_mut(1) {
                            key.options.nulls_first = true;
                        }
                        datafusion::physical_expr::LexOrdering::new(exprs)
                            .ok_or_else(|| Error::internal("an empty ordering"))?
                    }
                    _ => ordering,
                }
            }
            None => datafusion::physical_expr::LexOrdering::new(vec![
                datafusion::physical_expr::PhysicalSortExpr::new(
                    datafusion::physical_expr::expressions::col("shard", &schema)?,
                    arrow::compute::SortOptions::default(),
                ),
            ])
            .ok_or_else(|| Error::internal("an empty ordering"))?,
        };
        let equivalence = EquivalenceProperties::new_with_orderings(schema.clone(), [ordering]);
        let properties = Arc::new(PlanProperties::new(
            equivalence,
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(ShardExec { node, properties })
    }

    /// The ordering of this node's rows, for the merge above it.
    fn ordering(&self) -> Option<datafusion::physical_expr::LexOrdering> {
        self.properties.equivalence_properties().output_ordering()
    }
}

impl DisplayAs for ShardExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let what = match &self.node.request {
            Request::Statistics { query, .. } => format!("statistics of {query:?}"),
            Request::Fts { query, options, .. } => format!("full text {query:?}, k={}", options.k),
            Request::FtsChecked { query, options, .. } => {
                format!("full text {query:?} (statistics checked), k={}", options.k)
            }
            Request::Count { query, .. } => format!("count of {query:?}"),
            Request::Vector { options, .. } => format!("vector, k={}", options.k),
        };
        write!(
            f,
            "ShardExec: {what}, shards={:?} of {}",
            self.node.reads, self.node.shards
        )
    }
}

impl ExecutionPlan for ShardExec {
    fn name(&self) -> &str {
        "ShardExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::common::Result<TreeNodeRecursion>,
    ) -> datafusion::common::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> datafusion::common::Result<SendableRecordBatchStream> {
        let node = self.node.clone();
        let schema = self.schema();
        let out = schema.clone();
        let rows = async move {
            let batch = run(&node, &out)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            Ok(batch)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(rows),
        )))
    }
}

/// Run `node` on this worker: its shards' parts, as one batch of `schema`.
async fn run(node: &ShardNode, schema: &SchemaRef) -> Result<RecordBatch> {
    if !(1..=NODE_FORMAT).contains(&node.version) {
        return Err(Error::invalid(format!(
            "a shard task of format {} (this worker reads formats 1 to {NODE_FORMAT})",
            node.version
        )));
    }
    let pits = futures::future::try_join_all(
        node.reads
            .iter()
            .map(|shard| registry().point_in_time(node, *shard)),
    )
    .await?;
    let shard_ids = || UInt32Array::from_iter_values(node.reads.iter().map(|s| *s as u32));
    let batches: Vec<RecordBatch> = match &node.request {
        Request::Statistics { query, options } => {
            let shares = futures::future::try_join_all(
                pits.iter().map(|p| p.fts_statistics(query, options)),
            )
            .await?;
            let json: Vec<String> = shares
                .iter()
                .map(|s| serde_json::to_string(s).map_err(|e| Error::internal(e.to_string())))
                .collect::<Result<_>>()?;
            vec![RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(shard_ids()) as ArrayRef,
                    Arc::new(StringArray::from(json)),
                ],
            )?]
        }
        Request::Count {
            query,
            options,
            statistics,
        } => {
            let counts = futures::future::try_join_all(pits.iter().map(|p| async move {
                match statistics {
                    Some(s) => p.count_fts_with_statistics(query, options, s).await,
                    None => p.count_fts(query, options).await,
                }
            }))
            .await?;
            vec![RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(shard_ids()) as ArrayRef,
                    Arc::new(UInt64Array::from(counts)),
                ],
            )?]
        }
        // The shards' rows merged as in one process: the same code ranks them.
        Request::Fts {
            query,
            options,
            statistics,
        } => {
            let local = super::ShardedPointInTime {
                schema: node.schema.clone(),
                pits,
            };
            Parts::fts(&local, query, options, statistics).await?
        }
        // The statistics of the points in time read and, when each is the share the sums
        // given were made of, the rows scored with those sums. A shard whose share changed
        // scores nothing: the sums no longer hold, and may count less than it does.
        Request::FtsChecked {
            query,
            options,
            shares: kept,
        } => {
            let found = futures::future::try_join_all(
                pits.iter().map(|p| p.fts_statistics(query, options)),
            )
            .await?;
            let unchanged = node
                .reads
                .iter()
                .zip(&found)
                .all(|(shard, share)| kept.get(*shard) == Some(share));
            let rows = match unchanged {
                true => {
                    let local = super::ShardedPointInTime {
                        schema: node.schema.clone(),
                        pits,
                    };
                    Parts::fts(&local, query, options, &FtsStatistics::sum(kept)).await?
                }
                false => Vec::new(),
            };
            vec![checked_rows(schema, &node.reads, &found, &rows)?]
        }
        Request::Vector { query, options } => {
            let local = super::ShardedPointInTime {
                schema: node.schema.clone(),
                pits,
            };
            Parts::vector(&local, query, options).await?
        }
    };
    match batches.first() {
        None => Ok(RecordBatch::new_empty(schema.clone())),
        Some(b) => Ok(RecordBatch::try_new(schema.clone(), b.columns().to_vec())?),
    }
}

/// A shard's read-only handle, opened by the first task that needs it.
type OpenedOnce = tokio::sync::OnceCell<Arc<ReadOnlyIndex>>;

/// What a worker holds: a read-only handle of each shard it served, and the points in time
/// searches pinned.
struct Registry {
    settings: Mutex<Settings>,
    /// Each opened once, outside the map's lock: opening one shard holds up no other.
    handles: Mutex<HashMap<(String, usize), Arc<OpenedOnce>>>,
    /// The writers of shards this process writes and serves ([`serve_writer`]), by the
    /// location every process names the index by.
    writers: Mutex<HashMap<(String, usize), Arc<crate::Index>>>,
    pinned: moka::future::Cache<(String, String, usize), PointInTime>,
}

/// A cache of pinned points in time of at most `capacity` entries, each kept
/// [`PINNED_FOR`].
fn pin_cache<K, V>(capacity: u64) -> moka::future::Cache<K, V>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    // Least recently used first: the default admission policy (TinyLFU) turns away a new
    // key once the cache is full, and a pin is needed only by the search that took it.
    moka::future::Cache::builder()
        .max_capacity(capacity)
        .time_to_live(PINNED_FOR)
        .eviction_policy(moka::policy::EvictionPolicy::lru())
        .build()
}

/// This process's registry (workers in one process share it).
fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        settings: Mutex::new(Settings::default()),
        handles: Mutex::new(HashMap::new()),
        writers: Mutex::new(HashMap::new()),
        pinned: pin_cache(MAX_PINNED),
    })
}

impl Registry {
    /// The read-only handle of `shard` of the index at `location`, opened on first use.
    async fn handle(
        &self,
        location: &str,
        shard: usize,
        shards: u32,
    ) -> Result<Arc<ReadOnlyIndex>> {
        let key = (location.to_string(), shard);
        let cell = {
            let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
            handles.entry(key.clone()).or_default().clone()
        };
        let opened = cell
            .get_or_try_init(|| async {
                let root = Location::parse(location)?;
                let loc = root.child(&format!("shard-{shard}"))?;
                // A disk cache directory of its own (two handles cannot share one).
                let name = format!(
                    "{:016x}-shard-{shard}",
                    xxhash_rust::xxh3::xxh3_64(location.as_bytes())
                );
                let settings = self
                    .settings
                    .lock()
                    .map(|s| s.clone())
                    .unwrap_or_default()
                    .share(1, &name);
                let h = crate::Index::open_read_only(loc, settings)
                    .await
                    .map_err(|e| e.context(format!("shard {shard} of {shards} at {location}")))?;
                Ok::<_, Error>(Arc::new(h))
            })
            .await
            .cloned();
        if opened.is_err() {
            // Nothing is kept for a shard that did not open (a task may name any location).
            let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
            if handles.get(&key).is_some_and(|c| c.get().is_none()) {
                handles.remove(&key);
            }
        }
        opened
    }

    /// The point in time `node`'s search reads of `shard`: taken now (after a refresh) by a
    /// task that takes one, found by a task of a later phase.
    async fn point_in_time(&self, node: &ShardNode, shard: usize) -> Result<PointInTime> {
        if shard >= node.shards as usize {
            return Err(Error::invalid(format!(
                "a task names shard {shard} of an index of {} shards",
                node.shards
            )));
        }
        let key = (node.search.clone(), node.location.clone(), shard);
        match node.pin {
            Pin::Find => self.pinned.get(&key).await.ok_or_else(|| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "shard {shard} of {}: {PIN_MISSING} (the worker restarted, or the \
                         search's tasks moved); run the search again",
                        node.location
                    ),
                )
            }),
            Pin::Take => self
                .pinned
                .try_get_with(key, self.take(node, shard))
                .await
                .map_err(|e: Arc<Error>| Error::new(e.kind(), e.message())),
            Pin::Once => self.take(node, shard).await,
        }
    }

    /// A point in time of `shard` for `node`'s search: of its writer when this process
    /// serves one, else of its read-only handle, refreshed.
    async fn take(&self, node: &ShardNode, shard: usize) -> Result<PointInTime> {
        let writer = self
            .writers
            .lock()
            .ok()
            .and_then(|w| w.get(&(node.location.clone(), shard)).cloned());
        if let Some(w) = writer {
            // This process writes the shard: its memtable rows too, unless it no longer is
            // the shard's writer (a newer one fenced it, or it was closed): then the shard
            // is read as any worker reads it.
            match w.current_point_in_time().await {
                Ok(pit) => return Ok(pit),
                Err(e) => tracing::warn!(
                    "shard {shard} of {}: its writer here cannot serve it ({e}); \
                     reading it read-only",
                    node.location
                ),
            }
        }
        let h = self.handle(&node.location, shard, node.shards).await?;
        // A shard must have the schema the task was planned for.
        if h.schema() != &node.schema {
            return Err(Error::invalid(format!(
                "shard {shard} of {} at {} has another schema than the index's \
                 descriptor",
                node.shards, node.location
            )));
        }
        h.refresh().await?;
        h.point_in_time().await
    }
}

/// The codec of [`ShardExec`]: the description of its part of a search (format 1) as JSON.
#[derive(Debug)]
pub struct ShardCodec;

impl PhysicalExtensionCodec for ShardCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        if !inputs.is_empty() {
            return Err(DataFusionError::Internal(format!(
                "a shard task has no inputs, not {}",
                inputs.len()
            )));
        }
        let node: ShardNode = serde_json::from_slice(buf)
            .map_err(|e| DataFusionError::Internal(format!("a shard task: {e}")))?;
        Ok(Arc::new(
            ShardExec::new(node).map_err(|e| DataFusionError::External(Box::new(e)))?,
        ))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> datafusion::common::Result<()> {
        let Some(exec) = node.downcast_ref::<ShardExec>() else {
            return Err(DataFusionError::Internal(format!(
                "the shard codec encodes ShardExec, not {}",
                node.name()
            )));
        };
        serde_json::to_writer(buf, &exec.node)
            .map_err(|e| DataFusionError::Internal(format!("a shard task: {e}")))
    }
}

/// Serve shard tasks on `listener` until the process ends: the worker of `lsmsearch worker
/// --listen ADDR`. Shards are opened read-only with `settings`.
pub async fn serve(listener: tokio::net::TcpListener, settings: Settings) -> Result<()> {
    settings.validate()?;
    if let Ok(mut s) = registry().settings.lock() {
        *s = settings;
    }
    let worker = Worker::from_session_builder(|ctx: WorkerQueryContext| async move {
        // A task's plan arrives planned: decoding and running it needs the task's config,
        // the runtime and our codec, not the SQL functions, file formats and expression
        // planners of a default session, whose registration is most of the cost of building
        // one a task. Only those are left out: whatever else the library sets is kept.
        let mut builder = ctx.builder;
        *builder.scalar_functions() = None;
        *builder.higher_order_functions() = None;
        *builder.aggregate_functions() = None;
        *builder.window_functions() = None;
        *builder.file_formats() = None;
        *builder.expr_planners() = None;
        Ok(builder.with_distributed_user_codec(ShardCodec).build())
    });
    tonic::transport::Server::builder()
        .add_service(worker.into_worker_server())
        // Without TCP_NODELAY, a task's small answer waits for the coordinator's delayed
        // acknowledgement (40 ms on Linux) before it is sent.
        .serve_with_incoming(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        )
        .await
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("worker: {e}")))
}

/// Serve shard tasks on `listener` as [`serve`] does, in a process that writes some shards
/// of a sharded index (`index`, opened with [`super::ShardedIndex::open_shards`]): their
/// tasks read its writers, so searches see their rows the moment an append returns (route
/// them here with [`DistributedIndex::with_writer`]); other shards are read read-only. Until
/// this returns or its future is dropped.
pub async fn serve_writer(
    listener: tokio::net::TcpListener,
    settings: Settings,
    index: &super::ShardedIndex,
) -> Result<()> {
    let written = index.writer_handles();
    if written.is_empty() {
        return Err(Error::invalid(
            "a writer serving its shards' tasks must write at least one shard",
        ));
    }
    let location = shared_location(&index.root().display)?;
    let keys: Vec<(String, usize)> = written
        .iter()
        .map(|(i, _)| (location.clone(), *i))
        .collect();
    if let Ok(mut w) = registry().writers.lock() {
        for (i, h) in written {
            w.insert((location.clone(), i), h);
        }
    }
    /// Takes the writers out of the registry when serving ends.
    struct Unregister(Vec<(String, usize)>);
    impl Drop for Unregister {
        fn drop(&mut self) {
            if let Ok(mut w) = registry().writers.lock() {
                for k in &self.0 {
                    w.remove(k);
                }
            }
        }
    }
    let _unregister = Unregister(keys);
    serve(listener, settings).await
}

/// The URL of the worker at `worker` (`HOST:PORT`, or a URL).
fn worker_url(worker: &str) -> Result<Url> {
    let url = match worker.contains("://") {
        true => worker.to_string(),
        false => format!("http://{worker}"),
    };
    Url::parse(&url).map_err(|e| Error::invalid(format!("worker '{worker}': {e}")))
}

/// `location` as every process names it: workers resolve a local path in their own
/// directory, so a local one becomes absolute (and canonical: a writer serving its shards
/// and a coordinator must name it alike).
fn shared_location(location: &str) -> Result<String> {
    if location.contains("://") && !location.starts_with("file://") {
        return Ok(location.to_string());
    }
    let path = location.strip_prefix("file://").unwrap_or(location);
    std::fs::canonicalize(path)
        .map_err(|e| Error::invalid(format!("location '{location}': {e}")))?
        .to_str()
        .map(str::to_string)
        .ok_or_else(|| Error::invalid(format!("location '{location}' is not UTF-8")))
}

/// The workers a coordinator sends tasks to.
#[derive(Debug, Clone)]
struct Urls(Arc<Vec<Url>>);

impl WorkerResolver for Urls {
    /// The workers. Read only by datafusion-distributed's own routing, which ours replaces
    /// ([`Route::tasks`]).
    fn get_urls(&self) -> datafusion::common::Result<Vec<Url>> {
        Ok(self.0.as_ref().clone())
    }
}

/// A sharded index searched through workers: the same searches as a [`super::ShardedIndex`]
/// in this process, and the same results, with each shard's part run by a worker.
pub struct DistributedIndex {
    /// How long a search's tasks may take to answer.
    task_timeout: Duration,
    location: String,
    layout: ShardLayout,
    workers: Arc<Vec<Url>>,
    /// The workers that write shards and serve their tasks.
    writers: HashMap<usize, Url>,
    ctx: SessionContext,
    /// The full-text statistics searches found of each shard, by query: a search of a query
    /// found here scores with their sums at once where the shards' own still equal them.
    statistics: Option<StatisticsCache>,
    /// Rounds of tasks sent to workers.
    rounds: std::sync::atomic::AtomicU64,
}

/// Each shard's full-text statistics of a query (by shard), by [`statistics_key`], weighed
/// in bytes.
type StatisticsCache = moka::future::Cache<String, Arc<Vec<FtsStatistics>>>;

/// The bytes of statistics a [`DistributedIndex`] keeps by default.
const DEFAULT_STATISTICS_CACHE: u64 = 4 << 20;

/// A cache of at most `bytes` of statistics, none when `bytes` is 0.
fn statistics_cache(bytes: u64) -> Option<StatisticsCache> {
    (bytes > 0).then(|| {
        moka::future::Cache::builder()
            .max_capacity(bytes)
            .weigher(|k: &String, v: &Arc<Vec<FtsStatistics>>| {
                let size: usize = v.iter().map(FtsStatistics::size).sum();
                u32::try_from(k.len() + size).unwrap_or(u32::MAX)
            })
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .build()
    })
}

/// The statistics (`json`) of each row naming a shard (`shards`; a null names none), into
/// `found` by shard.
fn read_shares(
    shards: &UInt32Array,
    json: &StringArray,
    found: &mut [Option<FtsStatistics>],
) -> Result<()> {
    for i in (0..shards.len()).filter(|i| shards.is_valid(*i)) {
        let share: FtsStatistics = serde_json::from_str(json.value(i))
            .map_err(|e| Error::internal(format!("shard statistics: {e}")))?;
        if let Some(s) = found.get_mut(shards.value(i) as usize) {
            *s = Some(share);
        }
    }
    Ok(())
}

/// What the statistics of a full-text search depend on: its query and how its terms join.
fn statistics_key(query: &str, options: &SearchOptions) -> String {
    format!("{:?}\n{query}", options.conjunction)
}

impl std::fmt::Debug for DistributedIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedIndex")
            .field("location", &self.location)
            .field("shards", &self.layout.shards)
            .field("workers", &self.workers)
            .finish()
    }
}

impl DistributedIndex {
    /// The sharded index at `location` (which every worker must reach: a local path shared
    /// with them, or `s3://...`), searched through the workers at `workers` (`HOST:PORT`).
    pub async fn open(location: &str, workers: &[String]) -> Result<DistributedIndex> {
        if workers.is_empty() {
            return Err(Error::invalid(
                "a distributed search needs at least one worker",
            ));
        }
        let urls = workers
            .iter()
            .map(|w| worker_url(w))
            .collect::<Result<Vec<_>>>()?;
        let layout = ShardLayout::read(&Location::parse(location)?).await?;
        let location = shared_location(location)?;
        let urls = Arc::new(urls);
        // A search's plan is built distributed ([`Search::planned`]): its session needs the
        // distributed configuration, codec and routing, not SQL functions, optimizer rules or
        // the distributed planner, whose copies and passes were most of the cost of a round.
        let state = SessionStateBuilder::new()
            .with_physical_optimizer_rules(Vec::new())
            .with_distributed_worker_resolver(Urls(urls.clone()))
            .with_distributed_user_codec(ShardCodec)
            // Nothing reads the tasks' metrics: a worker would gather and send them after
            // every task.
            .with_distributed_metrics_collection(false)?
            // A task answers with at most its top rows (or a row of statistics a shard):
            // compressing them costs a worker more than the bytes it saves.
            .with_distributed_compression(None)?
            .with_distributed_route_tasks_handler(move |ev: RouteTasksEvent| {
                // A task goes to the worker its shards are routed to: both phases of a
                // search find a shard's point in time on the worker that took it.
                let config = ev.task_ctx.session_config();
                let tasks = stage_reads(ev.plan)
                    .and_then(|reads| planned_tasks(config, &reads, ev.task_count));
                let tasks = match tasks {
                    Ok(t) => t,
                    Err(e) => return Some(Err(e)),
                };
                Some(Ok(RouteTasksEventResponse::new(
                    tasks.into_iter().map(|(url, _)| url).collect(),
                )))
            })
            .build();
        Ok(DistributedIndex {
            task_timeout: DEFAULT_TASK_TIMEOUT,
            location,
            layout,
            workers: urls,
            writers: HashMap::new(),
            ctx: SessionContext::from(state),
            statistics: statistics_cache(DEFAULT_STATISTICS_CACHE),
            rounds: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Send the tasks of `shard` to the worker at `worker` (`HOST:PORT`): a process that
    /// writes the shard and serves its tasks ([`serve_writer`]), so that searches see its
    /// memtable rows at once. When that worker cannot be reached, the search runs again with
    /// the shard read by the other workers, which read the shard's WAL: rows appended with
    /// [`crate::Durability::Buffered`] and not yet in it are not found there.
    pub fn with_writer(mut self, shard: usize, worker: &str) -> Result<DistributedIndex> {
        if shard >= self.layout.shards as usize {
            return Err(Error::invalid(format!(
                "shard {shard} of an index of {} shards",
                self.layout.shards
            )));
        }
        self.writers.insert(shard, worker_url(worker)?);
        Ok(self)
    }

    /// The layout: shard count, routing and schema.
    pub fn layout(&self) -> &ShardLayout {
        &self.layout
    }

    /// How long each round of a search's tasks may take before the search fails with an
    /// `Unavailable` error naming the workers (default 30 s): a worker that stops answering
    /// without closing its connection.
    pub fn with_task_timeout(mut self, timeout: Duration) -> DistributedIndex {
        self.task_timeout = timeout;
        self
    }

    /// Keep at most `bytes` of full-text statistics (default 4 MiB; 0 keeps none).
    ///
    /// A full-text search takes two rounds of tasks: the shards' statistics of its query, then
    /// their rows scored with the sums. A search of a query whose shares are kept takes one:
    /// each shard returns its own statistics and, when they are still its kept share, its
    /// rows scored with the kept sums; when every shard's are, the rows are the search's, and
    /// otherwise a second round scores with the new sums, on the same points in time (as
    /// keeping none would have: two rounds).
    pub fn with_statistics_cache(mut self, bytes: u64) -> DistributedIndex {
        self.statistics = statistics_cache(bytes);
        self
    }

    /// The rounds of tasks this handle's searches sent to the workers so far (a round: the
    /// tasks of one phase, which read every shard), the rounds of failed attempts included.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A new attempt of a search over `route`: the token its points in time are pinned under.
    fn search(&self, route: Route, single: bool) -> Search<'_> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let token = format!(
            "{:016x}",
            xxhash_rust::xxh3::xxh3_64(format!("{now}-{}-{n}", std::process::id()).as_bytes())
        );
        Search {
            index: self,
            route,
            single,
            retry: Mutex::new(None),
            token,
            taken: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Run `search` (every phase of one search) until it succeeds, fails in a way another
    /// attempt would too, or [`MAX_ATTEMPTS`] attempts failed: an attempt after a worker could
    /// not be reached or went away leaves out the workers it named (while one is left), and
    /// takes new points in time.
    ///
    /// All attempts run within one deadline, `timeout`, past which the `what` search fails
    /// with a `Timeout` error.
    async fn retrying<'a, T>(
        &'a self,
        what: &str,
        timeout: Option<Duration>,
        single: bool,
        search: impl Fn(Search<'a>) -> BoxFuture<'a, (Result<T>, Option<Vec<Url>>)>,
    ) -> Result<T> {
        within_deadline(what, timeout, self.attempts(single, search)).await
    }

    /// The attempts of [`DistributedIndex::retrying`].
    async fn attempts<'a, T>(
        &'a self,
        single: bool,
        search: impl Fn(Search<'a>) -> BoxFuture<'a, (Result<T>, Option<Vec<Url>>)>,
    ) -> Result<T> {
        let mut route = Route {
            workers: self.workers.as_ref().clone(),
            writers: self.writers.clone(),
        };
        let mut attempt = 1;
        loop {
            let (out, retry) = search(self.search(route.clone(), single)).await;
            match (out, retry) {
                (Err(e), Some(gone)) if attempt < MAX_ATTEMPTS => {
                    if !gone.is_empty() {
                        match route.without(&gone) {
                            Some(left) => route = left,
                            None => return Err(e),
                        }
                    }
                    tracing::warn!("{e}; searching again (attempt {})", attempt + 1);
                    attempt += 1;
                }
                (out, _) => return out,
            }
        }
    }

    /// Full-text search, exact (see [`super::ShardedPointInTime::search_fts`]).
    pub async fn search_fts(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        self.retrying("full-text", options.timeout, false, |s| {
            Box::pin(async move {
                let out = super::search_fts(&s, query, options).await;
                (out, s.retry())
            })
        })
        .await
    }

    /// The exact number of live rows matching a full-text query.
    pub async fn count_fts(&self, query: &str, options: &SearchOptions) -> Result<u64> {
        self.retrying(
            "full-text count",
            options.timeout,
            options.min_score.is_none(),
            |s| {
                Box::pin(async move {
                    let out = super::count_fts(&s, query, options).await;
                    (out, s.retry())
                })
            },
        )
        .await
    }

    /// A full-text search and the number of live rows matching it, both of one point in
    /// time of each shard.
    pub async fn search_and_count_fts(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> Result<(Vec<RecordBatch>, u64)> {
        // The search and the count each have the timeout, as in one process.
        let both = options.timeout.map(|t| t.saturating_mul(2));
        self.retrying("full-text search and count", both, false, |s| {
            Box::pin(async move {
                let out = async {
                    let rows = super::search_fts(&s, query, options).await?;
                    let count = super::count_fts(&s, query, options).await?;
                    Ok((rows, count))
                }
                .await;
                (out, s.retry())
            })
        })
        .await
    }

    /// Vector search (see [`super::ShardedPointInTime::search_vector`]).
    pub async fn search_vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        self.retrying("vector", options.timeout, true, |s| {
            Box::pin(async move {
                let out = super::search_vector(&s, query, options).await;
                (out, s.retry())
            })
        })
        .await
    }

    /// Hybrid search (see [`super::ShardedPointInTime::search_hybrid`]).
    pub async fn search_hybrid(
        &self,
        query: &str,
        vector: &[f32],
        options: &HybridSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        let schema = &self.layout.schema;
        self.retrying("hybrid", options.timeout, false, |s| {
            Box::pin(async move {
                let out = super::search_hybrid(&s, schema, query, vector, options).await;
                (out, s.retry())
            })
        })
        .await
    }

    /// The distributed plan of a full-text search's second phase, as text: its stages, the
    /// tasks of each and the workers they go to.
    pub async fn explain_fts(&self, query: &str, options: &SearchOptions) -> Result<String> {
        let search = self.search(
            Route {
                workers: self.workers.as_ref().clone(),
                writers: self.writers.clone(),
            },
            false,
        );
        let node = search.node(
            Pin::Find,
            Request::Fts {
                query: query.to_string(),
                options: options.clone(),
                statistics: FtsStatistics::default(),
            },
        );
        let tasks = search.route.tasks(&node.reads);
        let plan = search.planned(&search.state(), node, Some(options.k))?;
        let mut text = datafusion_distributed::display_plan_ascii(plan.as_ref(), false);
        // The plan names its tasks, not where they go: the route does.
        text.push_str("tasks of stage 1:\n");
        for (j, (worker, reads)) in tasks.iter().enumerate() {
            text.push_str(&format!(
                "  t{j} on {}: shards {reads:?}\n",
                address(worker)
            ));
        }
        Ok(text)
    }
}

/// One search through the workers.
struct Search<'a> {
    index: &'a DistributedIndex,
    /// The workers of this attempt.
    route: Route,
    /// Whether the search has one phase: its points in time are not kept.
    single: bool,
    /// Set when this attempt failed in a way another may not: the workers it could not
    /// reach or that went away (none when the error named no worker).
    retry: Mutex<Option<Vec<Url>>>,
    token: String,
    /// Whether a part of this search took its points in time: later parts must find them
    /// (one that finds none fails, rather than read another snapshot).
    taken: std::sync::atomic::AtomicBool,
}

impl Search<'_> {
    fn node(&self, pin: Pin, request: Request) -> ShardNode {
        let pin = match pin {
            Pin::Take if self.single => Pin::Once,
            other => other,
        };
        // Format 1 when format 1 says it all: a worker that reads only format 1 serves every
        // task but a checked one.
        let version = match request {
            Request::FtsChecked { .. } => NODE_FORMAT,
            _ => 1,
        };
        ShardNode {
            version,
            location: self.index.location.clone(),
            schema: self.index.layout.schema.clone(),
            shards: self.index.layout.shards,
            reads: (0..self.index.layout.shards as usize).collect(),
            search: self.token.clone(),
            pin,
            request,
        }
    }

    /// `node` over every shard as a distributed plan: a task a worker of the round's route
    /// ([`Route::tasks`]), each reading its shards, under a merge by the node's order on the
    /// coordinator (keeping `fetch` rows), in `state` (the attempt's, [`Search::state`]).
    ///
    /// Built here, not by datafusion-distributed's planner: the planner keeps a stage of one
    /// task in the coordinator, where every shard's part must run on a worker, so a round
    /// through one worker took two tasks, each with its streams and its session there.
    fn planned(
        &self,
        state: &datafusion::execution::SessionState,
        node: ShardNode,
        fetch: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let tasks = route_in(state.config())?.tasks(&node.reads);
        if tasks.is_empty() {
            return Err(Error::internal("a sharded search's round reads no shards"));
        }
        let variants = tasks
            .into_iter()
            .map(|(_, reads)| {
                ShardExec::new(node.reading(reads)).map(|e| Arc::new(e) as Arc<dyn ExecutionPlan>)
            })
            .collect::<Result<Vec<_>>>()?;
        let producers = variants.len();
        let all = Arc::new(ShardExec::new(node)?);
        let ordering = all
            .ordering()
            .ok_or_else(|| Error::internal("a shard node without an ordering"))?;
        // Task `j` reads the shards of the round's task `j`, routed to its worker by the
        // session's handler.
        let leaf: Arc<dyn ExecutionPlan> = Arc::new(DistributedLeafExec::try_new(all, variants)?);
        let boundary = NetworkCoalesceExec::try_new(Arc::clone(&leaf), producers, 1)?;
        // The stage's identity on the workers, as the planner gives it: a query of its own,
        // so that the tasks of searches run at once never meet.
        let Stage::Local(mut stage) = boundary.input_stage().clone() else {
            return Err(Error::internal(
                "a new network boundary with a remote stage",
            ));
        };
        stage.query_id = uuid::Uuid::new_v4();
        stage.num = 1;
        let boundary: Arc<dyn ExecutionPlan> = boundary.with_input_stage(Stage::Local(stage))?;
        let merge = SortPreservingMergeExec::new(ordering, boundary).with_fetch(fetch);
        let metrics = DistributedConfig::from_config_options(state.config().options())?;
        Ok(Arc::new(
            DistributedExec::new(Arc::new(merge)).with_metrics_collection(metrics.collect_metrics),
        ))
    }

    /// The session state of this attempt: the index's, with its route.
    fn state(&self) -> datafusion::execution::SessionState {
        let mut state = self.index.ctx.state();
        state
            .config_mut()
            .set_extension(Arc::new(self.route.clone()));
        state
    }

    /// What a worker would refuse (as one process refuses it), refused here: a value JSON
    /// cannot carry (NaN and infinities become null, which would read as no option).
    fn check(&self, request: &Request) -> Result<()> {
        let schema = &self.index.layout.schema;
        match request {
            Request::Statistics { options, .. }
            | Request::Fts { options, .. }
            | Request::FtsChecked { options, .. }
            | Request::Count { options, .. } => {
                crate::query::fts::check_min_score(options.min_score)
            }
            Request::Vector { query, options } => {
                crate::query::vector::check_query(schema, query)?;
                let metric = schema.vector.as_ref().map(|v| v.metric);
                match metric {
                    Some(m) => crate::query::vector::check_radius(m, options.max_distance),
                    None => Ok(()),
                }
            }
        }
    }

    /// Run `node` over every shard through the workers.
    async fn run(&self, node: ShardNode, fetch: Option<usize>) -> Result<Vec<RecordBatch>> {
        self.check(&node.request)?;
        self.index
            .rounds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // One copy of the session's state a round, not two (each clones its registries, as
        // the task context made from it does once more).
        let state = self.state();
        let plan = self.planned(&state, node, fetch)?;
        let ctx = Arc::new(TaskContext::from(&state));
        let tasks = datafusion::physical_plan::collect(plan, ctx);
        match tokio::time::timeout(self.index.task_timeout, tasks).await {
            Ok(done) => done.map_err(|e| self.failed(e)),
            Err(_) => {
                let workers: Vec<String> = self.route.workers.iter().map(address).collect();
                Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "a sharded search of {}: the tasks on workers {} did not answer within \
                         {:?}",
                        self.index.location,
                        workers.join(", "),
                        self.index.task_timeout
                    ),
                ))
            }
        }
    }

    /// The error of a search whose tasks failed: of the kind of ours when a worker returned
    /// one (a task's error crosses as text: `External error: <kind>: ...`), otherwise
    /// `Unavailable` (a worker that cannot be reached or died), naming the workers.
    fn failed(&self, e: DataFusionError) -> Error {
        let text = e.to_string();
        let ours = [
            ErrorKind::Invalid,
            ErrorKind::Data,
            ErrorKind::Timeout,
            ErrorKind::Unavailable,
            ErrorKind::Fenced,
            ErrorKind::Closed,
            ErrorKind::Internal,
        ]
        .into_iter()
        .find(|k| text.contains(&format!("External error: {k}: ")));
        // Not ours: a worker that could not be reached or went away is Unavailable (retry
        // it), anything else Internal.
        let unreachable = [
            "transport error",
            "Error connecting",
            "connection",
            "Connection",
        ]
        .iter()
        .any(|t| text.contains(t));
        let kind = match (ours, unreachable) {
            (Some(k), _) => k,
            (None, true) => ErrorKind::Unavailable,
            (None, false) => ErrorKind::Internal,
        };
        // A worker gone (named, or not: a stream cut mid-answer names none; the next attempt
        // then finds it refusing connections), or a second phase that did not find its point
        // in time (its worker restarted): another attempt may succeed.
        let retry = match ours {
            None if unreachable => Some(self.route.named_in(&text)),
            Some(ErrorKind::Unavailable) if text.contains(PIN_MISSING) => Some(Vec::new()),
            _ => None,
        };
        if let (Some(r), Ok(mut slot)) = (retry, self.retry.lock()) {
            slot.get_or_insert_with(Vec::new).extend(r);
        }
        let workers: Vec<String> = self.route.workers.iter().map(address).collect();
        // The shards whose tasks went to a worker the error names.
        let named: Vec<usize> = (0..self.index.layout.shards as usize)
            .filter(|i| names(&text, &address(self.route.worker(*i))))
            .collect();
        let shards = match named.is_empty() {
            true => String::new(),
            false => format!(" (shards {named:?} were on the worker it names)"),
        };
        Error::new(
            kind,
            format!(
                "a sharded search of {} on workers {}{shards}: {text}",
                self.index.location,
                workers.join(", ")
            ),
        )
    }
}

#[async_trait::async_trait]
impl Parts for Search<'_> {
    async fn statistics(&self, query: &str, options: &SearchOptions) -> Result<FtsStatistics> {
        Ok(FtsStatistics::sum(&self.shares(query, options).await?))
    }

    async fn fts(
        &self,
        query: &str,
        options: &SearchOptions,
        statistics: &FtsStatistics,
    ) -> Result<Vec<RecordBatch>> {
        let node = self.node(
            Pin::Find,
            Request::Fts {
                query: query.to_string(),
                options: options.clone(),
                statistics: statistics.clone(),
            },
        );
        self.run(node, Some(options.k)).await
    }

    /// The statistics kept for `query`, when any: the shards score with them and check them
    /// in one round; otherwise, or when they no longer hold, the statistics found are kept
    /// and the shards score with those in a second round (of the same points in time).
    async fn ranked_fts(&self, query: &str, options: &SearchOptions) -> Result<Vec<RecordBatch>> {
        let Some(cache) = &self.index.statistics else {
            let statistics = self.statistics(query, options).await?;
            return self.fts(query, options, &statistics).await;
        };
        let key = statistics_key(query, options);
        let shares = match cache.get(&key).await {
            Some(kept) => {
                let (rows, found) = self.fts_checked(query, options, &kept).await?;
                // Every shard scored with the kept sums: its share is the one they count.
                if found == *kept {
                    return Ok(rows);
                }
                found
            }
            None => self.shares(query, options).await?,
        };
        let statistics = FtsStatistics::sum(&shares);
        cache.insert(key, Arc::new(shares)).await;
        self.fts(query, options, &statistics).await
    }

    async fn count(
        &self,
        query: &str,
        options: &SearchOptions,
        statistics: Option<&FtsStatistics>,
    ) -> Result<u64> {
        let shards = self.index.layout.shards as usize;
        let pin = match statistics {
            Some(_) => Pin::Find,
            None => self.pin(),
        };
        let node = self.node(
            pin,
            Request::Count {
                query: query.to_string(),
                options: options.clone(),
                statistics: statistics.cloned(),
            },
        );
        // One row a shard.
        let rows = self.run(node, Some(shards)).await?;
        let mut seen = vec![false; self.index.layout.shards as usize];
        let mut total = 0;
        for b in &rows {
            let shards = b.column(0).as_any().downcast_ref::<UInt32Array>();
            let counts = b.column(1).as_any().downcast_ref::<UInt64Array>();
            let (Some(shards), Some(counts)) = (shards, counts) else {
                return Err(Error::internal("shard counts of an unexpected type"));
            };
            for i in 0..b.num_rows() {
                total += counts.value(i);
                if let Some(s) = seen.get_mut(shards.value(i) as usize) {
                    *s = true;
                }
            }
        }
        self.all_shards(&seen)?;
        Ok(total)
    }

    async fn vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        let pin = self.pin();
        let node = self.node(
            pin,
            Request::Vector {
                query: query.to_vec(),
                options: options.clone(),
            },
        );
        let rows = self.run(node, Some(options.k)).await?;
        self.taken.store(true, std::sync::atomic::Ordering::Release);
        Ok(rows)
    }
}

impl Search<'_> {
    /// Each shard's statistics of `query` (by shard): one round of tasks.
    async fn shares(&self, query: &str, options: &SearchOptions) -> Result<Vec<FtsStatistics>> {
        let shards = self.index.layout.shards as usize;
        // A second look at the statistics (a count with a floor, after the search) reads the
        // same points in time, or fails.
        let pin = self.pin();
        let node = self.node(
            pin,
            Request::Statistics {
                query: query.to_string(),
                options: options.clone(),
            },
        );
        // One row a shard.
        let rows = self.run(node, Some(shards)).await?;
        self.taken.store(true, std::sync::atomic::Ordering::Release);
        let mut found: Vec<Option<FtsStatistics>> = vec![None; shards];
        for b in &rows {
            let shards = b.column(0).as_any().downcast_ref::<UInt32Array>();
            let json = b.column(1).as_any().downcast_ref::<StringArray>();
            let (Some(shards), Some(json)) = (shards, json) else {
                return Err(Error::internal("shard statistics of an unexpected type"));
            };
            read_shares(shards, json, &mut found)?;
        }
        self.every_share(found)
    }

    /// The shards' statistics of the points in time they read (by shard), and the best
    /// `options.k` rows, merged, of the shards whose statistics are still their share of
    /// `kept` (each shard's, an earlier search found), scored with the sums of `kept`: one
    /// round of tasks.
    async fn fts_checked(
        &self,
        query: &str,
        options: &SearchOptions,
        kept: &[FtsStatistics],
    ) -> Result<(Vec<RecordBatch>, Vec<FtsStatistics>)> {
        let shards = self.index.layout.shards as usize;
        let pin = self.pin();
        let node = self.node(
            pin,
            Request::FtsChecked {
                query: query.to_string(),
                options: options.clone(),
                shares: kept.to_vec(),
            },
        );
        let ranked = fts_output(&self.index.layout.schema, options)?;
        // Every shard's row of statistics comes first (`_score` +∞), then the best rows.
        let batches = self
            .run(node, Some(options.k.saturating_add(shards)))
            .await?;
        self.taken.store(true, std::sync::atomic::Ordering::Release);
        let mut found: Vec<Option<FtsStatistics>> = vec![None; shards];
        let mut rows = Vec::with_capacity(batches.len());
        for b in &batches {
            let n = b.num_columns();
            let (Some(shard), Some(json)) = (
                b.column_by_name(SHARD_COLUMN)
                    .and_then(|c| c.as_any().downcast_ref::<UInt32Array>()),
                b.column_by_name(STATISTICS_COLUMN)
                    .and_then(|c| c.as_any().downcast_ref::<StringArray>()),
            ) else {
                return Err(Error::internal(
                    "a checked full-text part of an unexpected type",
                ));
            };
            read_shares(shard, json, &mut found)?;
            let ranked_rows =
                arrow::compute::filter_record_batch(b, &arrow::compute::is_null(shard)?)?;
            if ranked_rows.num_rows() > 0 {
                let columns = ranked_rows.columns()[..n.saturating_sub(2)].to_vec();
                rows.push(RecordBatch::try_new(ranked.clone(), columns)?);
            }
        }
        Ok((rows, self.every_share(found)?))
    }

    /// Whether another attempt may succeed where this one failed, and the workers it must
    /// leave out.
    fn retry(&self) -> Option<Vec<Url>> {
        self.retry.lock().ok().and_then(|r| r.clone())
    }

    /// Whether a part of this search took its points in time.
    fn taken(&self) -> bool {
        self.taken.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How a part of this search reads its points in time: taken by the first part, found
    /// by later ones.
    fn pin(&self) -> Pin {
        match self.taken() {
            true => Pin::Find,
            false => Pin::Take,
        }
    }

    /// Every shard's statistics (by shard), or an `Unavailable` error naming the shards no
    /// task answered for.
    fn every_share(&self, found: Vec<Option<FtsStatistics>>) -> Result<Vec<FtsStatistics>> {
        let seen: Vec<bool> = found.iter().map(Option::is_some).collect();
        self.all_shards(&seen)?;
        Ok(found.into_iter().flatten().collect())
    }

    /// An `Unavailable` error naming the shards no task answered for (never a partial sum).
    fn all_shards(&self, seen: &[bool]) -> Result<()> {
        let missing: Vec<usize> = (0..seen.len()).filter(|i| !seen[*i]).collect();
        match missing.is_empty() {
            true => Ok(()),
            false => Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "a sharded search of {}: no worker answered for shards {missing:?}",
                    self.index.location
                ),
            )),
        }
    }
}

/// The route of the round planned in `config`: its attempt's ([`Search::state`]). A round
/// planned without one has no writers' routes to follow: an internal error.
fn route_in(config: &SessionConfig) -> datafusion::common::Result<Arc<Route>> {
    config.get_extension::<Route>().ok_or_else(|| {
        DataFusionError::Internal("a sharded search's round was planned without its route".into())
    })
}

/// The tasks of a round that reads shards `reads`, planned in `config` ([`Route::tasks`],
/// [`Search::planned`] made `planned` of them).
fn planned_tasks(
    config: &SessionConfig,
    reads: &[usize],
    planned: usize,
) -> datafusion::common::Result<Vec<(Url, Vec<usize>)>> {
    let tasks = route_in(config)?.tasks(reads);
    if tasks.len() != planned {
        return Err(DataFusionError::Internal(format!(
            "a round of {} tasks was planned as {planned}",
            tasks.len()
        )));
    }
    Ok(tasks)
}

/// The shards read by the round whose stage `plan` heads: those of its leaf, which
/// [`Search::planned`] split between the tasks the router then routes.
fn stage_reads(plan: &Arc<dyn ExecutionPlan>) -> datafusion::common::Result<Vec<usize>> {
    use datafusion::common::tree_node::TreeNode;
    let mut reads = None;
    plan.apply(|node| {
        let exec = node
            .downcast_ref::<DistributedLeafExec>()
            .and_then(|leaf| leaf.original().downcast_ref::<ShardExec>());
        match exec {
            Some(exec) => {
                reads = Some(exec.node.reads.clone());
                Ok(TreeNodeRecursion::Stop)
            }
            None => Ok(TreeNodeRecursion::Continue),
        }
    })?;
    reads
        .ok_or_else(|| DataFusionError::Internal("a sharded search's stage reads no shards".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_sends_a_task_a_worker() {
        let url = |p: u16| Url::parse(&format!("http://127.0.0.1:{p}")).unwrap();
        let route = |workers: &[u16], writers: &[(usize, u16)]| Route {
            workers: workers.iter().map(|p| url(*p)).collect(),
            writers: writers.iter().map(|(i, p)| (*i, url(*p))).collect(),
        };
        let tasks = |r: &Route, shards: usize| -> Vec<(u16, Vec<usize>)> {
            r.tasks(&(0..shards).collect::<Vec<_>>())
                .into_iter()
                .map(|(u, reads)| (u.port().unwrap(), reads))
                .collect()
        };
        // One worker: its shards are one task.
        assert_eq!(tasks(&route(&[1], &[]), 3), vec![(1, vec![0, 1, 2])]);
        assert_eq!(tasks(&route(&[1], &[]), 1), vec![(1, vec![0])]);
        // Workers take shards i mod W, a task each.
        assert_eq!(
            tasks(&route(&[1, 2], &[]), 5),
            vec![(1, vec![0, 2, 4]), (2, vec![1, 3])]
        );
        assert_eq!(
            tasks(&route(&[1, 2, 3], &[]), 3),
            vec![(1, vec![0]), (2, vec![1]), (3, vec![2])]
        );
        // A shard's writer serves its shard, with any shard routed to the same worker.
        assert_eq!(
            tasks(&route(&[1, 2], &[(1, 9), (3, 1)]), 4),
            vec![(1, vec![0, 2, 3]), (9, vec![1])]
        );
        // A round that reads some shards sends tasks for those only.
        let some: Vec<(u16, Vec<usize>)> = route(&[1, 2], &[])
            .tasks(&[1, 2, 3])
            .into_iter()
            .map(|(u, reads)| (u.port().unwrap(), reads))
            .collect();
        assert_eq!(some, vec![(2, vec![1, 3]), (1, vec![2])]);
        // Every shard goes to a writer that serves them all: one task.
        assert_eq!(
            tasks(&route(&[1], &[(0, 9), (1, 9)]), 2),
            vec![(9, vec![0, 1])]
        );
    }

    #[tokio::test]
    async fn a_full_pin_cache_takes_the_newest_pin() {
        // A search's second phase follows its first within milliseconds: the cache must
        // keep the newest pins, whatever older pins it holds.
        let cache: moka::future::Cache<u64, u64> = pin_cache(64);
        for i in 0..1_000u64 {
            cache.insert(i, i).await;
            cache.run_pending_tasks().await;
            assert_eq!(cache.get(&i).await, Some(i), "pin {i} was not kept");
        }
    }
}
