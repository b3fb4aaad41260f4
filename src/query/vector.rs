//! Vector k-nearest-neighbour search: exact distances in every arm, live rows and filters
//! applied before each arm's top k, arms merged by `_distance` ascending then key.

use super::exec::{
    ranked, ranked_schema, sort_ordering, ArmExec, ArmRows, ArmSpec, ArmWork, RankedPlan, Spread,
};
use super::rerank::{RerankRound, Ticket};
use super::DISTANCE_COLUMN;
use crate::generation::Generation;
use crate::key::Key;
use crate::read::{compile_filter, filter_rows, LiveRows, Snapshot, Source};
use crate::schema::{IndexSchema, Metric};
use crate::settings::Settings;
use crate::vector::{distance, MemVectorIndex, VectorIndex};
use crate::{Error, Result};
use arrow::array::{Array, ArrayRef, AsArray, Float32Array};
use arrow::datatypes::{Float32Type, SchemaRef};
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::ExecutionPlan;
use futures::{FutureExt, StreamExt};
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

/// Options of a vector search.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VectorSearchOptions {
    /// How many rows to return (at least 1). Default 10.
    pub k: usize,
    /// A SQL predicate over the index's columns, applied inside every arm before its top k.
    pub filter: Option<String>,
    /// Candidate list size of graph searches; default `Settings::hnsw_ef_search`.
    pub ef: Option<usize>,
    /// Scan every arm exactly (brute force) instead of walking the generations' graphs.
    pub exact: bool,
    /// Return only rows at most this far from the query (a radius; finite, and at least 0
    /// but for the `dot` metric, whose distances are negated products): applied before the
    /// top `k` and the offset. Default none.
    pub max_distance: Option<f32>,
    /// Rows to skip before the `k` returned: the rows ranked `offset..offset + k` (by
    /// `_distance`, then key). With an offset, `offset + k` is at most
    /// [`super::MAX_RESULT_WINDOW`]. Default 0.
    ///
    /// An exact search's pages equal one larger search. A graph search's do while `offset + k`
    /// stays within what a generation re-ranks and walks (`Settings::vector_rerank`, default
    /// 100, and `ef`): past that, a page's search re-ranks and walks more than an earlier
    /// page's did, and may find rows it did not, so deep pages of approximate search ask for
    /// `exact` or a larger `ef` and `vector_rerank`.
    pub offset: usize,
    /// The user columns returned after the key and `_distance`, in this order, each once (the
    /// vector too, when named). Default (`None`): every user column but the vector.
    pub columns: Option<Vec<String>>,
    /// How long the search may take, from its call to its last row: past it the search fails
    /// with an [`crate::ErrorKind::Timeout`] error naming the search and the time it was
    /// given (at least 1 ms), and its work is dropped: arms not started never run, a running
    /// full-text arm stops at its next segment (a generation is one segment: it finishes), and
    /// planning already under way (statistics, reads) finishes on its thread, its result
    /// unused. It bounds the searches (`search_*`, `count_fts`), not `plan_*` nor the SQL
    /// table functions. Default none.
    pub timeout: Option<std::time::Duration>,
}

impl Default for VectorSearchOptions {
    fn default() -> Self {
        VectorSearchOptions {
            timeout: None,
            k: 10,
            filter: None,
            ef: None,
            exact: false,
            max_distance: None,
            offset: 0,
            columns: None,
        }
    }
}

impl VectorSearchOptions {
    /// Options returning the top `k` rows.
    pub fn with_k(k: usize) -> Self {
        VectorSearchOptions {
            k,
            ..Default::default()
        }
    }
}

/// Check a radius (`max_distance`) under `metric`: finite, and at least 0 but for `dot`.
pub(crate) fn check_radius(metric: Metric, max_distance: Option<f32>) -> Result<()> {
    match max_distance {
        Some(r) if !r.is_finite() => Err(Error::invalid(format!(
            "max_distance is {r}: it must be a finite number"
        ))),
        Some(r) if r < 0.0 && metric != Metric::Dot => Err(Error::invalid(format!(
            "max_distance is {r}: {metric:?} distances are at least 0"
        ))),
        _ => Ok(()),
    }
}

/// Check a query vector against the schema.
pub(crate) fn check_query(schema: &IndexSchema, query: &[f32]) -> Result<()> {
    let v = schema
        .vector
        .as_ref()
        .ok_or_else(|| Error::invalid("vector search on an index without a vector column"))?;
    if query.len() != v.dim {
        return Err(Error::invalid(format!(
            "query vector has dimension {}, the vector column '{}' has dimension {}",
            query.len(),
            v.column,
            v.dim
        )));
    }
    if let Some((i, x)) = query.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        return Err(Error::invalid(format!(
            "query vector has a non-finite value ({x}) at component {i}"
        )));
    }
    Ok(())
}

#[derive(PartialEq)]
struct Hit {
    distance: f32,
    key: Option<Key>,
    ord: usize,
}

impl Eq for Hit {}

impl PartialOrd for Hit {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Hit {
    /// Worse hits are greater: larger distance, then larger key.
    fn cmp(&self, other: &Self) -> Ordering {
        self.distance
            .total_cmp(&other.distance)
            .then_with(|| self.key.cmp(&other.key))
    }
}

/// The most rows (`offset + k`) a vector search whose arms are gathered in one partition
/// returns ([`Spread::Gathered`]): its arms' rows are merged by sorting them together.
const GATHER_MAX_ROWS: usize = 1_000;

/// How a vector search of `window` rows (`offset + k`) lays out its arms: arms of little work
/// each are gathered in one partition. An exact search's arms scan every admitted vector, and
/// a deep page's return thousands of rows each, which a sort-preserving merge merges as it
/// streams: they keep a partition each.
fn spread(exact: bool, window: usize) -> Spread {
    match exact || window > GATHER_MAX_ROWS {
        true => Spread::PerArm,
        false => Spread::Gathered { fetch: window },
    }
}

/// Build the physical plan of a vector search over a snapshot.
pub(crate) fn plan(
    schema: &IndexSchema,
    settings: &Settings,
    snapshot: Snapshot,
    query: &[f32],
    opts: &VectorSearchOptions,
) -> Result<Arc<dyn ExecutionPlan>> {
    let columns = super::returned_columns(schema, opts.columns.as_deref(), DISTANCE_COLUMN)?;
    plan_ranked(schema, settings, snapshot, query, opts)?.take(
        schema,
        DISTANCE_COLUMN,
        false,
        columns,
    )
}

/// The rows of a vector search over a snapshot, ranked by exact distance and merged, before
/// their columns are read ([`RankedPlan`]).
pub(crate) fn plan_ranked(
    schema: &IndexSchema,
    settings: &Settings,
    snapshot: Snapshot,
    query: &[f32],
    opts: &VectorSearchOptions,
) -> Result<RankedPlan> {
    check_query(schema, query)?;
    let window = super::result_window(opts.k, opts.offset)?;
    let vcol = schema.vector.as_ref().expect("checked above");
    let metric = vcol.metric;
    check_radius(metric, opts.max_distance)?;
    let user = schema.arrow_schema();
    let vidx = user
        .index_of(&vcol.column)
        .map_err(|_| Error::internal("vector column missing from the schema"))?;
    let filter = opts
        .filter
        .as_deref()
        .map(|f| compile_filter(&user, f))
        .transpose()?;
    let out_schema = super::output_schema(schema, DISTANCE_COLUMN, &[]);
    let ranked_schema = ranked_schema(&out_schema);
    let ordering = sort_ordering(&ranked_schema, false, DISTANCE_COLUMN)?;
    let started = std::time::Instant::now();
    let live = snapshot.live();
    let t_live = started.elapsed();
    if t_live.as_millis() >= 10 {
        tracing::debug!(
            target: "lsmsearch::slow",
            "vector plan: live rows took {:.1} ms",
            t_live.as_secs_f64() * 1e3
        );
    }
    let pool = snapshot.pool.clone();
    let caches = snapshot.caches.clone();
    let sources = snapshot.sources;
    let filter_rows = filter_rows(&pool, &caches.columns, &sources, filter.as_ref(), &user)?;
    let query: Arc<Vec<f32>> = Arc::new(query.to_vec());
    let mut arms: Vec<ArmSpec> = Vec::with_capacity(sources.len());
    let all_sources = sources.clone();
    // The arms whose vectors are read by range, and the small generations that scan their
    // codes, choose what they re-rank together.
    let round = RerankRound::new(settings.vector_rerank.max(window));
    for (src, ((source, live), fm)) in sources.into_iter().zip(live).zip(filter_rows).enumerate() {
        let live_rows = live.count();
        let eligible = match fm {
            Some(fm) => live.and(&fm),
            None => live,
        };
        let candidates = eligible.count();
        // No arm returns more than its candidates, and a walk visits at most every row: both
        // bound what an arm allocates, whatever `k` and `ef` the caller asked for.
        let arm_k = window.min(candidates.max(1));
        let ef = opts
            .ef
            .unwrap_or_else(|| ef_for(settings, source.flushes(), source.rows()))
            .max(arm_k)
            .min(source.rows().max(1));
        let walk = !opts.exact && candidates >= settings.vector_exact_below;
        let graph = match (source.vector(), source.mem_graph()) {
            (Some(g), _) if walk => ArmGraph::Generation(g.clone()),
            (_, Some(g)) if walk && g.indexed() > 0 => ArmGraph::Memtable(g.clone()),
            (Some(g), _) if !opts.exact && g.scans_codes() => ArmGraph::Codes(g.clone()),
            _ => ArmGraph::None,
        };
        let mode = graph.describe(ef, round.budget());
        let description = format!(
            "source={}, rows={}, live={live_rows}, candidates={candidates}, metric={metric:?}, {mode}, k={}",
            source.name(),
            source.rows(),
            window
        );
        // A generation that holds its vectors and scans its codes proposes its best in the
        // round too: ranking them costs no request, but 64 such generations ranking their
        // best 300 each (k = 100) spent a third of a vector search's CPU on it.
        let reads_vectors = matches!(&source, Source::Generation(g) if g.vector_values().is_none());
        let in_round = reads_vectors || matches!(&graph, ArmGraph::Codes(_));
        let ticket = in_round.then(|| round.ticket());
        let work = arm_work(ArmParts {
            source,
            eligible,
            graph,
            query: query.clone(),
            vidx,
            metric,
            k: arm_k,
            ef,
            keep: round.budget(),
            candidates,
            src,
            ranked: ranked_schema.clone(),
            ticket,
        });
        arms.push(ArmSpec { description, work });
    }
    round.seal();
    let leaf = Arc::new(ArmExec::new(
        "VectorArmExec",
        (ranked_schema, ordering.clone()),
        arms,
        spread(opts.exact, window),
        pool,
    ));
    let merged = Arc::new(SortPreservingMergeExec::new(ordering, leaf).with_fetch(Some(window)));
    Ok(RankedPlan {
        merged: super::page(
            super::within(merged, DISTANCE_COLUMN, opts.max_distance, false)?,
            opts.offset,
            opts.k,
        ),
        sources: all_sources,
        caches,
    })
}

/// The default candidate list of a generation's graph: `hnsw_ef_search` for a flushed
/// generation. A compaction's merged one holds the rows of k flushes, and one graph over them
/// finds less with one list than the k graphs did with a list each (clustered vectors, paced
/// `bench stream`: recall@10 0.89 with the same list, 0.96 with k times it, but 0.948 at the
/// checkpoint right after a merge of three flushes, 0.968 with k + 1 times it): it is walked
/// with `hnsw_ef_search` times k + 1, k no more than its rows in units of half a memtable (a
/// typical flush: the graphs the default list was measured on; it keeps a merge of many small
/// flushes, whose graphs a list of 400 walked almost whole, from walking its graph whole),
/// divided by how much longer a list built it than a flush's graph
/// (`compaction_ef_construction` against `hnsw_ef_construction`: a better graph finds as much
/// with a shorter list).
fn ef_for(settings: &Settings, flushes: u64, rows: usize) -> usize {
    if flushes <= 1 {
        return settings.hnsw_ef_search;
    }
    let unit = (settings.memtable_max_rows / 2).max(1);
    let by_rows = rows.div_ceil(unit).max(1);
    let by_flushes = usize::try_from(flushes).unwrap_or(usize::MAX);
    let list = settings
        .hnsw_ef_search
        .saturating_mul(by_flushes.min(by_rows).saturating_add(1))
        .saturating_mul(settings.hnsw_ef_construction)
        / settings.compaction_ef_construction.max(1);
    list.max(settings.hnsw_ef_search)
}

/// What one arm searches, and how.
struct ArmParts {
    source: Source,
    eligible: LiveRows,
    graph: ArmGraph,
    query: Arc<Vec<f32>>,
    vidx: usize,
    metric: Metric,
    k: usize,
    ef: usize,
    /// At most how many of its walk's candidates the query's round re-ranks.
    keep: usize,
    candidates: usize,
    /// The arm's position in the snapshot.
    src: usize,
    /// The schema of the rows it returns ([`ranked_schema`]).
    ranked: SchemaRef,
    /// The arm's place in the query's re-ranking round, when its vectors are read by range
    /// or it scans the codes of vectors it holds.
    ticket: Option<Ticket>,
}

/// The work of one arm: its top k from its graph (or a scan), ranked exactly, the rows of a
/// generation whose vectors are in its object re-ranked from vectors read after the arm, and
/// those of a generation that holds its vectors once the round has chosen them.
fn arm_work(p: ArmParts) -> ArmWork {
    Arc::new(move |stop| {
        stop.check()?;
        let arm = Arm {
            source: &p.source,
            eligible: &p.eligible,
            vidx: p.vidx,
            metric: p.metric,
            query: &p.query,
            k: p.k,
        };
        match (&p.source, &p.ticket) {
            // What the walk (or the scan) proposes is re-ranked once the round has chosen
            // among every such arm's candidates: from vectors read by range after the arm,
            // with every arm's reads, when they are in the object.
            (Source::Generation(g), Some(ticket)) => {
                let held = g.vector_values().is_some();
                let rows = arm.candidate_rows(&p.graph, p.ef, p.keep, p.candidates, ticket.bar());
                let chosen: futures::future::BoxFuture<'static, Vec<usize>> = match rows {
                    Candidates::Keyed(keyed) => {
                        let mut chosen = ticket.propose(keyed);
                        // The round chose at this arm's arrival (it came last), and every
                        // chosen vector is in memory: ranked here, with no step after the arm
                        // (in place, from the vectors the generation holds).
                        if let Some(rows) = (&mut chosen).now_or_never() {
                            if held {
                                return arm.output(arm.rank_listed(&rows), p.src, &p.ranked);
                            }
                            let ranked_now = g.vectors_in_memory(&rows).map(|v| {
                                rank_read(g, &rows, v?, &p.query, p.metric, p.k, p.src, &p.ranked)
                            });
                            if let Some(batch) = ranked_now {
                                return Ok(ArmRows::Done(batch?));
                            }
                            Box::pin(std::future::ready(rows))
                        } else if held {
                            return Ok(rank_held_later(&p, chosen));
                        } else {
                            chosen
                        }
                    }
                    Candidates::All(rows) => {
                        ticket.abstain();
                        if held {
                            return arm.output(arm.rank(rows.into_iter()), p.src, &p.ranked);
                        }
                        Box::pin(std::future::ready(rows))
                    }
                };
                Ok(rerank_later(
                    g.clone(),
                    chosen,
                    p.query.clone(),
                    p.metric,
                    p.k,
                    p.src,
                    p.ranked.clone(),
                ))
            }
            _ => {
                let hits = arm.search(&p.graph, p.ef, p.candidates);
                arm.output(hits, p.src, &p.ranked)
            }
        }
    })
}

/// The arm's rows of a generation that holds its vectors, once the query's round has chosen
/// them (`chosen`): ranked in place, from the vectors it holds and the norms its graph keeps,
/// as [`Arm::rank_listed`] ranks them when the round chose at the arm's arrival, not from a
/// copy of them ([`rerank_later`], whose copy of the vectors was 5.5% of a vector search's
/// samples at 64 generations).
fn rank_held_later(
    p: &ArmParts,
    chosen: futures::future::BoxFuture<'static, Vec<usize>>,
) -> ArmRows {
    let (source, eligible, query) = (p.source.clone(), p.eligible.clone(), p.query.clone());
    let (vidx, metric, k, src, ranked) = (p.vidx, p.metric, p.k, p.src, p.ranked.clone());
    ArmRows::Later(Box::pin(async move {
        let rows = chosen.await;
        let arm = Arm {
            source: &source,
            eligible: &eligible,
            vidx,
            metric,
            query: &query,
            k,
        };
        hits_batch(&source, &arm.rank_listed(&rows), src, &ranked)
    }))
}

/// How many rows ahead [`Arm::rank_listed`] asks for a row's vector.
const RANK_AHEAD: usize = 8;

/// Bytes of vectors an arm re-ranks at once (an exact search over a generation whose vectors
/// are read by range re-ranks all of them, a chunk at a time, with the next chunk's read under
/// way while it ranks one: two chunks in memory at most).
const RERANK_CHUNK_BYTES: usize = 8 << 20;

/// The arm's rows of a generation whose vectors are read by range: `rows` (the candidates its
/// arm proposes, all admitted) re-ranked from their exact vectors, the best `k` by distance
/// then key.
fn rerank_later(
    g: Arc<Generation>,
    rows: futures::future::BoxFuture<'static, Vec<usize>>,
    query: Arc<Vec<f32>>,
    metric: Metric,
    k: usize,
    src: usize,
    ranked_schema: SchemaRef,
) -> ArmRows {
    ArmRows::Later(Box::pin(async move {
        let rows = rows.await;
        let dim = query.len();
        let mut heap: BinaryHeap<Hit> = BinaryHeap::with_capacity(super::heap_capacity(k));
        // An exact search re-ranks every admitted row: read in chunks, so what it holds at
        // once is bounded whatever the generation's size.
        let chunk = (RERANK_CHUNK_BYTES / (dim.max(1) * 4)).max(1);
        // The next chunk is read while one is ranked.
        let rows: Arc<[usize]> = rows.into();
        let (reader, all) = (g.clone(), rows.clone());
        let mut reads = futures::stream::iter((0..rows.len()).step_by(chunk))
            .map(move |from| {
                let (g, rows) = (reader.clone(), all.clone());
                async move {
                    let at = from..(from + chunk).min(rows.len());
                    let read = g.read_vectors(&rows[at.clone()]).await;
                    (at, read)
                }
            })
            .buffered(2);
        while let Some((at, vectors)) = reads.next().await {
            push_hits(&mut heap, &g, &rows[at], &vectors?, &query, metric, k);
        }
        finish_hits(heap, &g, src, &ranked_schema)
    }))
}

/// Push the rows `part` (whose vectors `vectors` holds, in their order) onto `heap`, the best
/// `k` by exact distance to `query` then key.
fn push_hits(
    heap: &mut BinaryHeap<Hit>,
    g: &Generation,
    part: &[usize],
    vectors: &ArrayRef,
    query: &[f32],
    metric: Metric,
    k: usize,
) {
    let dim = query.len();
    let list = vectors.as_fixed_size_list();
    let values = list.values().as_primitive::<Float32Type>().values();
    for (i, ord) in part.iter().enumerate() {
        if list.is_null(i) {
            continue;
        }
        let start = list.value_offset(i) as usize;
        let d = distance(metric, query, &values[start..start + dim]);
        if heap.len() == k {
            let worst = heap.peek().expect("k > 0");
            if d.total_cmp(&worst.distance) == Ordering::Greater {
                continue;
            }
        }
        heap.push(Hit {
            distance: d,
            key: g.key_at(*ord),
            ord: *ord,
        });
        if heap.len() > k {
            heap.pop();
        }
    }
}

/// The rows of `heap`, nearest first, as the arm's ranked batch.
fn finish_hits(
    heap: BinaryHeap<Hit>,
    g: &Arc<Generation>,
    src: usize,
    ranked_schema: &SchemaRef,
) -> Result<arrow::array::RecordBatch> {
    hits_batch(
        &Source::Generation(g.clone()),
        &heap.into_sorted_vec(),
        src,
        ranked_schema,
    )
}

/// `hits` of `source` (number `src` of the snapshot), in their order, as an arm's ranked
/// batch ([`ranked`]).
fn hits_batch(
    source: &Source,
    hits: &[Hit],
    src: usize,
    ranked_schema: &SchemaRef,
) -> Result<arrow::array::RecordBatch> {
    let ords: Vec<usize> = hits.iter().map(|h| h.ord).collect();
    let distances: ArrayRef = Arc::new(Float32Array::from_iter_values(
        hits.iter().map(|h| h.distance),
    ));
    ranked(source, src, &ords, distances, ranked_schema)
}

/// The arm's ranked batch of `rows` of `g`, whose vectors `vectors` holds (in their order).
#[allow(clippy::too_many_arguments)]
fn rank_read(
    g: &Arc<Generation>,
    rows: &[usize],
    vectors: ArrayRef,
    query: &[f32],
    metric: Metric,
    k: usize,
    src: usize,
    ranked_schema: &SchemaRef,
) -> Result<arrow::array::RecordBatch> {
    let mut heap = BinaryHeap::with_capacity(super::heap_capacity(k));
    push_hits(&mut heap, g, rows, &vectors, query, metric, k);
    finish_hits(heap, g, src, ranked_schema)
}

/// What an arm in the query's round re-ranks.
enum Candidates {
    /// Its walk's candidates with their codes' keys, for the query's round to choose from.
    Keyed(Vec<(f32, usize)>),
    /// These rows, all of them.
    All(Vec<usize>),
}

/// The graph an arm walks, if any.
enum ArmGraph {
    Generation(Arc<VectorIndex>),
    Memtable(Arc<MemVectorIndex>),
    /// No walk: a scan of the codes of a generation that holds its vectors
    /// ([`VectorIndex::scan_keyed`]), its best proposed to the query's round and those chosen
    /// ranked exactly from the vectors it holds.
    Codes(Arc<VectorIndex>),
    None,
}

impl ArmGraph {
    /// How the arm finds its rows, as its plan shows it (`ef`, the round's `budget`).
    fn describe(&self, ef: usize, budget: usize) -> String {
        match self {
            ArmGraph::Generation(_) => format!("hnsw ef={ef}"),
            ArmGraph::Memtable(g) => {
                format!("hnsw ef={ef} over {} rows + exact tail", g.indexed())
            }
            ArmGraph::Codes(_) => format!("scan of codes, re-ranked in the round of {budget}"),
            ArmGraph::None => "exact".to_string(),
        }
    }
}

/// One arm's search.
struct Arm<'a> {
    source: &'a Source,
    eligible: &'a LiveRows,
    vidx: usize,
    metric: Metric,
    query: &'a [f32],
    k: usize,
}

impl Arm<'_> {
    /// The arm's top k: a walk of `graph` (with `ef`) re-ranked exactly, or an exact scan of
    /// the `candidates` eligible rows without a graph or when the walk comes back short.
    fn search(&self, graph: &ArmGraph, ef: usize, candidates: usize) -> Vec<Hit> {
        let (query, k, eligible) = (self.query, self.k, self.eligible);
        let admitted = || eligible.rows();
        let admit = |r: usize| eligible.admits(r);
        match graph {
            ArmGraph::Generation(g) => {
                let rows = g.candidates(query, k, ef, &admit);
                if rows.len() >= k.min(candidates) {
                    self.rank_listed(&rows)
                } else {
                    // The walk came back short (few live rows, or a selective filter): scan.
                    self.rank(admitted())
                }
            }
            ArmGraph::Memtable(g) => {
                // The graph covers rows [0, indexed); the rows after it are scanned.
                let (rows, indexed) = g.candidates(query, k, ef, &admit);
                // Short only when fewer than k of the rows it covers are admitted.
                if rows.len() >= k
                    || rows.len() >= eligible.rows().take_while(|r| *r < indexed).count()
                {
                    self.rank(rows.into_iter().chain(indexed..eligible.len()))
                } else {
                    self.rank(admitted())
                }
            }
            // A scan of codes is proposed to the query's round (see `arm_work`).
            ArmGraph::Codes(_) | ArmGraph::None => self.rank(admitted()),
        }
    }

    /// The rows to rank exactly for an arm in the query's round (a generation's whose vectors
    /// are read by range, or that scans its codes): the candidates its codes propose with
    /// their keys, at most `keep` (a walk's list, or the best by a scan of the codes; the
    /// round chooses among them), or every admitted row without a graph over codes or when
    /// the candidates come back short. A scan given the round's `bar` proposes only the rows
    /// not above it, however few (the round never chooses the others), when a scan without
    /// it could not come back short: every row has a vector (a small generation's scan of its
    /// codes), or every row is a node of the graph (a graph scanned instead of walked).
    fn candidate_rows(
        &self,
        graph: &ArmGraph,
        ef: usize,
        keep: usize,
        candidates: usize,
        bar: Option<f32>,
    ) -> Candidates {
        let admit = |r: usize| self.eligible.admits(r);
        let mut barred = false;
        let keyed = match graph {
            ArmGraph::Generation(g) => g
                .keyed_candidates(self.query, self.k, ef, keep, bar, &admit)
                .map(|(keyed, cut)| {
                    barred = cut;
                    keyed
                }),
            ArmGraph::Codes(g) => {
                // Rows without a vector have codes too (zeros): never proposed. The column's
                // null bits are read directly (`Array::is_valid` is a dynamic call per row).
                let held = self.source.vector_columns(self.vidx);
                let column = held.first();
                let nulls = column.and_then(|a| a.nulls());
                let has = |r: usize| column.is_some() && nulls.is_none_or(|n| n.is_valid(r));
                // With a vector in every row, a scan without the bar never comes back short:
                // the bar changes what the arm proposes, never whether it proposes, whenever
                // the round set it. Otherwise the arm scans without it.
                let every = column.is_some_and(|c| c.null_count() == 0);
                let bar = bar.filter(|_| every);
                barred = bar.is_some();
                g.scan_keyed(self.query, self.k, keep, bar, &|r| has(r) && admit(r))
            }
            ArmGraph::Memtable(_) | ArmGraph::None => None,
        };
        match keyed {
            Some(keyed) if barred || keyed.len() >= self.k.min(candidates) => {
                Candidates::Keyed(keyed)
            }
            _ => Candidates::All(self.eligible.rows().collect()),
        }
    }

    /// Exact distances to the given rows (admitted ones only); the top k, nearest first.
    /// Bit-identical to [`distance`] for every metric: a generation's cosine arm reuses the
    /// rows' norms its graph keeps instead of summing them again per query.
    fn rank(&self, rows: impl Iterator<Item = usize>) -> Vec<Hit> {
        self.rank_ahead(rows.map(|r| (r, None)))
    }

    /// [`Arm::rank`] of candidates in no order of the rows (a walk's or a scan's, by key):
    /// each row's vector is asked of the processor's caches [`RANK_AHEAD`] rows before it
    /// is ranked, so the reads of several rows wait for memory at once (64 generations of
    /// 1,562 rows, `bench generations`: their exact distances took a quarter of a vector
    /// search's CPU, mostly waiting for memory).
    fn rank_listed(&self, rows: &[usize]) -> Vec<Hit> {
        self.rank_ahead(
            rows.iter()
                .enumerate()
                .map(|(i, r)| (*r, rows.get(i + RANK_AHEAD).copied())),
        )
    }

    /// [`Arm::rank`] of `(row, row to prefetch)`.
    fn rank_ahead(&self, rows: impl Iterator<Item = (usize, Option<usize>)>) -> Vec<Hit> {
        let dim = self.query.len();
        let norms = self
            .source
            .vector()
            .map(|v| v.norms())
            .filter(|n| self.metric == Metric::Cosine && n.len() == self.source.rows());
        let query_norm = crate::vector::distance::dot(self.query, self.query).sqrt();
        let arrays = self.source.vector_columns(self.vidx);
        let columns: Vec<(&arrow::array::FixedSizeListArray, &[f32])> = arrays
            .iter()
            .map(|a| {
                let list = a.as_fixed_size_list();
                (
                    list,
                    list.values()
                        .as_primitive::<Float32Type>()
                        .values()
                        .as_ref(),
                )
            })
            .collect();
        let single = columns.len() == 1;
        let mut heap: BinaryHeap<Hit> = BinaryHeap::with_capacity(super::heap_capacity(self.k));
        let locate = |ord: usize| {
            if single {
                (0, ord)
            } else {
                self.source.locate(ord)
            }
        };
        for (ord, ahead) in rows {
            if let Some(ahead) = ahead {
                let (b, r) = locate(ahead);
                let (list, values) = columns[b];
                let start = list.value_offset(r) as usize;
                if let Some(v) = values.get(start..start + dim) {
                    distance::prefetch(v);
                }
            }
            if !self.eligible.admits(ord) {
                continue;
            }
            let (b, r) = locate(ord);
            let (list, values) = columns[b];
            if list.is_null(r) {
                continue;
            }
            let start = list.value_offset(r) as usize;
            let v = &values[start..start + dim];
            let d = match norms {
                Some(norms) => {
                    let dot = crate::vector::distance::dot(self.query, v);
                    let n = norms[ord];
                    if query_norm == 0.0 || n == 0.0 {
                        1.0
                    } else {
                        1.0 - dot / (query_norm * n)
                    }
                }
                None => distance(self.metric, self.query, v),
            };
            if heap.len() == self.k {
                let worst = heap.peek().expect("k > 0");
                if d.total_cmp(&worst.distance) == Ordering::Greater {
                    continue;
                }
            }
            heap.push(Hit {
                distance: d,
                key: self.source.key_at(ord),
                ord,
            });
            if heap.len() > self.k {
                heap.pop();
            }
        }
        heap.into_sorted_vec()
    }

    fn output(&self, hits: Vec<Hit>, src: usize, ranked_schema: &SchemaRef) -> Result<ArmRows> {
        Ok(ArmRows::Done(hits_batch(
            self.source,
            &hits,
            src,
            ranked_schema,
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merged_graph_is_walked_with_its_flushes_lists_shortened_by_its_better_build() {
        let s = Settings::default();
        assert_eq!(ef_for(&s, 1, 40_000), 400);
        // Four flushes of 50,000 rows, built with the flushes' own list: their total list,
        // and one more.
        assert_eq!(ef_for(&s, 4, 200_000), 2_000);
        // Many small flushes: bounded by the rows (in units of half a memtable).
        assert_eq!(ef_for(&s, 48, 75_000), 1_200);
        // Built with twice the list of a flush's graph: half of it.
        let better = Settings {
            compaction_ef_construction: 2 * s.hnsw_ef_construction,
            ..Settings::default()
        };
        assert_eq!(ef_for(&better, 4, 200_000), 1_000);
        assert_eq!(ef_for(&better, 48, 75_000), 600);
    }
}
