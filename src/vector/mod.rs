//! Vector indexes: an HNSW graph per generation, built with hnsw_rs at flush and kept (in the
//! bundle and in memory) as flat arrays ([`graph`]); memtables keep a live hnsw_rs
//! graph ([`MemVectorIndex`]).
//!
//! A graph only proposes candidates; every returned distance is recomputed exactly. Metrics:
//! `l2` builds on Euclidean distance, `cosine` on one minus the cosine similarity, and `dot`
//! (maximum inner product) on Euclidean distance between vectors augmented with one coordinate
//! `sqrt(M² - |x|²)`, `M` the generation's largest norm, and the query augmented with 0: then
//! `|q' - x'|² = |q|² + M² - 2 q·x`, so the nearest augmented vector has the largest dot product.

pub(crate) mod distance;
pub(crate) mod graph;
pub(crate) mod hnsw;

use crate::format::bundle::Sections;
use crate::schema::{deleted_flags, Metric};
use crate::settings::GraphParams;
use crate::{Error, Result};
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::Float32Type;
use graph::{Adjacency, FlatGraph};
use hnsw::{HnswBuilder, Space};
use hnsw_rs::prelude::{Distance, Hnsw, HnswIo};

/// Name of the bundle section holding a generation's graph.
pub(crate) const GRAPH_SECTION: &str = "vector/graph";

fn hn(e: impl std::fmt::Display) -> Error {
    Error::internal(format!("hnsw: {e}"))
}

/// The distance the graph is built with (never negative, as hnsw_rs requires).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GraphDistance {
    cosine: bool,
}

impl Distance<f32> for GraphDistance {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        if self.cosine {
            // Graph points (and queries) are unit vectors (or zero, whose distance to anything
            // is then 1, as `cosine` says): one dot product instead of three accumulations.
            (1.0 - distance::dot(a, b)).max(0.0)
        } else {
            distance::l2_sq(a, b).sqrt()
        }
    }
}

/// `v` as a graph point: for `cosine`, scaled to unit length (a zero vector stays zero); for
/// the other metrics, as is.
fn graph_vector(metric: Metric, v: &[f32]) -> Vec<f32> {
    if metric != Metric::Cosine {
        return v.to_vec();
    }
    let norm = distance::dot(v, v).sqrt();
    if norm == 0.0 || !norm.is_finite() {
        return vec![0.0; v.len()];
    }
    v.iter().map(|x| x / norm).collect()
}

/// The distance between `a` and `b` under `metric`, in f32 (accumulated in fixed lanes, see
/// [`distance`]): Euclidean distance for `l2`, one minus the cosine similarity for `cosine`
/// (1 when either vector is zero), the negated dot product for `dot`. Smaller is nearer.
pub fn distance(metric: Metric, a: &[f32], b: &[f32]) -> f32 {
    match metric {
        Metric::L2 => distance::l2_sq(a, b).sqrt(),
        Metric::Dot => -distance::dot(a, b),
        Metric::Cosine => distance::cosine(a, b),
    }
}

type Graph<'a> = Hnsw<'a, f32, GraphDistance>;

/// A generation's vector graph (see [`graph`]).
#[derive(Debug)]
pub(crate) struct VectorIndex {
    graph: Option<FlatGraph>,
}

/// The space a graph of `metric` is built in: unit vectors for `cosine`, Euclidean for `l2`
/// and for `dot` (over augmented vectors).
fn space_of(metric: Metric) -> Space {
    if metric == Metric::Cosine {
        Space::UnitDot
    } else {
        Space::L2
    }
}

fn graph_distance(metric: Metric) -> GraphDistance {
    GraphDistance {
        cosine: metric == Metric::Cosine,
    }
}

fn augment(v: &[f32], max_norm: f32) -> Vec<f32> {
    let n2: f32 = v.iter().map(|x| x * x).sum();
    let mut out = v.to_vec();
    out.push((max_norm * max_norm - n2).max(0.0).sqrt());
    out
}

/// The vector column of `rows` as one row-major buffer (`dim` values per row, nulls included),
/// shared with the batch.
fn vectors_of(rows: &RecordBatch, vcol: usize) -> Result<(usize, ScalarBuffer<f32>)> {
    let list = rows
        .column(vcol)
        .as_fixed_size_list_opt()
        .ok_or_else(|| Error::internal("vector column is not a fixed-size list"))?;
    let dim = list.value_length() as usize;
    let values = list
        .values()
        .as_primitive_opt::<Float32Type>()
        .ok_or_else(|| Error::internal("vector column is not float32"))?
        .values();
    let start = if rows.num_rows() == 0 {
        0
    } else {
        list.value_offset(0) as usize
    };
    Ok((dim, values.slice(start, rows.num_rows() * dim)))
}

/// A graph point: its vector (augmented for `dot`) and its row.
type Point = (Vec<f32>, usize);

/// The points a generation's graph is built over: `(vector, row)` of every row that is not a
/// tombstone and has a vector, each augmented with `sqrt(M² - |x|²)` for `dot`; and `M`, the
/// largest norm (0 for the other metrics).
fn graph_points(rows: &RecordBatch, vcol: usize, metric: Metric) -> Result<(Vec<Point>, f32)> {
    let deleted = deleted_flags(rows);
    let list = rows.column(vcol).as_fixed_size_list();
    let (dim, vectors) = vectors_of(rows, vcol)?;
    let mut data: Vec<Point> = (0..rows.num_rows())
        .filter(|r| !deleted.value(*r) && !list.is_null(*r))
        .map(|r| (graph_vector(metric, &vectors[r * dim..(r + 1) * dim]), r))
        .collect();
    if metric != Metric::Dot {
        return Ok((data, 0.0));
    }
    let max_norm = data
        .iter()
        .map(|(v, _)| v.iter().map(|x| x * x).sum::<f32>().sqrt())
        .fold(0f32, f32::max);
    for (v, _) in &mut data {
        *v = augment(v, max_norm);
    }
    Ok((data, max_norm))
}

/// The layers of an hnsw_rs graph over rows `0..rows` (data ids are rows).
fn adjacency_of(g: &Graph<'_>, rows: usize) -> Adjacency {
    let points = g.get_point_indexation();
    let mut nodes = Vec::with_capacity(g.get_nb_point());
    for p in points {
        let layers = p.get_point_id().0 as usize + 1;
        let lists = p
            .get_neighborhood_id()
            .into_iter()
            .take(layers)
            .map(|l| l.into_iter().map(|n| n.d_id as u32).collect())
            .collect();
        nodes.push((p.get_origin_id() as u32, lists));
    }
    let top = g.get_max_level_observed() as usize;
    let entry = points
        .get_layer_iterator(top)
        .next()
        .map_or(0, |p| p.get_origin_id() as u32);
    Adjacency::from_lists(rows, nodes, entry)
}

impl VectorIndex {
    /// Build the graph over the non-tombstone rows of a generation (`vcol` is the vector
    /// column's position); returns the index and its encoded `vector/graph` section.
    pub(crate) fn build(
        rows: &RecordBatch,
        vcol: usize,
        metric: Metric,
        params: GraphParams,
    ) -> Result<(VectorIndex, Sections)> {
        let (data, _) = graph_points(rows, vcol, metric)?;
        let Some(dim) = data.first().map(|(v, _)| v.len()) else {
            let adjacency = Adjacency::from_lists(rows.num_rows(), Vec::new(), 0);
            return Self::from_adjacency(rows, vcol, metric, adjacency);
        };
        let graph = HnswBuilder::new(dim, space_of(metric), params.m, params.ef_construction);
        let ids: Vec<u32> = data.iter().map(|(_, r)| *r as u32).collect();
        for (v, r) in data {
            graph.add(r as u32, v);
        }
        if params.threads == 0 {
            graph.insert_all(&ids);
        } else {
            graph.insert_with(&ids, params.threads);
        }
        let adjacency = graph.to_adjacency(rows.num_rows(), ids.into_iter(), &Some);
        Self::from_adjacency(rows, vcol, metric, adjacency)
    }

    /// The index over a graph built elsewhere (a memtable's, converted to the generation's
    /// rows), and its encoded `vector/graph` section.
    pub(crate) fn from_adjacency(
        rows: &RecordBatch,
        vcol: usize,
        metric: Metric,
        adjacency: Adjacency,
    ) -> Result<(VectorIndex, Sections)> {
        let (dim, vectors) = vectors_of(rows, vcol)?;
        let section = vec![(GRAPH_SECTION.to_string(), adjacency.encode())];
        Ok((
            VectorIndex {
                graph: Some(FlatGraph::new(adjacency, metric, dim, vectors)?),
            },
            section,
        ))
    }

    /// Open the graph of a `vector/graph` section over the generation's `rows`.
    pub(crate) fn open(
        rows: &RecordBatch,
        vcol: usize,
        metric: Metric,
        section: &[u8],
    ) -> Result<Self> {
        let adjacency = Adjacency::decode(section, rows.num_rows())
            .map_err(|m| Error::internal(format!("section '{GRAPH_SECTION}' {m}")))?;
        let (dim, vectors) = vectors_of(rows, vcol)?;
        Ok(VectorIndex {
            graph: Some(FlatGraph::new(adjacency, metric, dim, vectors)?),
        })
    }

    /// Open the graph of a format-1 bundle (hnsw_rs dump files in sections `hnsw/graph` and
    /// `hnsw/data`, `meta` = largest norm and point count): the graph is reloaded through
    /// hnsw_rs and converted to flat arrays.
    pub(crate) fn open_hnsw_dump(
        rows: &RecordBatch,
        vcol: usize,
        metric: Metric,
        meta: &[u8],
        sections: impl FnOnce() -> Result<(bytes::Bytes, bytes::Bytes)>,
    ) -> Result<VectorIndex> {
        if meta.len() != 8 {
            return Err(Error::internal("hnsw/meta section has the wrong size"));
        }
        let points = u32::from_le_bytes(meta[4..8].try_into().expect("4")) as usize;
        let adjacency = if points == 0 {
            Adjacency::from_lists(rows.num_rows(), Vec::new(), 0)
        } else {
            let (graph, data) = sections()?;
            let dir = tempfile::tempdir().map_err(hn)?;
            std::fs::write(dir.path().join("g.hnsw.graph"), &graph).map_err(hn)?;
            std::fs::write(dir.path().join("g.hnsw.data"), &data).map_err(hn)?;
            let io = HnswIo::new(dir.path(), "g");
            let g: Graph<'_> = io
                .load_hnsw_with_dist::<f32, GraphDistance>(graph_distance(metric))
                .map_err(hn)?;
            adjacency_of(&g, rows.num_rows())
        };
        let (dim, vectors) = vectors_of(rows, vcol)?;
        Ok(VectorIndex {
            graph: Some(FlatGraph::new(adjacency, metric, dim, vectors)?),
        })
    }

    /// The sections a format-1 bundle stored for this generation's graph (`hnsw/graph`,
    /// `hnsw/data`: hnsw_rs dump files; `hnsw/meta`: largest norm and point count), built as
    /// format-1 writers built them. Only the fixtures of `tests/fixtures/` need it.
    #[cfg(test)]
    pub(crate) fn build_hnsw_dump(
        rows: &RecordBatch,
        vcol: usize,
        metric: Metric,
        params: GraphParams,
    ) -> Result<Sections> {
        use hnsw_rs::api::AnnT;
        let (data, max_norm) = graph_points(rows, vcol, metric)?;
        let mut meta = max_norm.to_le_bytes().to_vec();
        meta.extend_from_slice(&(data.len() as u32).to_le_bytes());
        if data.is_empty() {
            return Ok(vec![("hnsw/meta".to_string(), meta)]);
        }
        let graph: Graph<'static> = Hnsw::new(
            params.m,
            data.len(),
            16,
            params.ef_construction,
            graph_distance(metric),
        );
        for (v, r) in &data {
            graph.insert((v.as_slice(), *r));
        }
        let dir = tempfile::tempdir().map_err(hn)?;
        let base = graph.file_dump(dir.path(), "g").map_err(hn)?;
        let mut sections = Vec::new();
        for (name, ext) in [("hnsw/graph", "hnsw.graph"), ("hnsw/data", "hnsw.data")] {
            let p = dir.path().join(format!("{base}.{ext}"));
            sections.push((name.to_string(), std::fs::read(&p).map_err(hn)?));
        }
        sections.push(("hnsw/meta".to_string(), meta));
        Ok(sections)
    }

    /// `cosine`: each row's norm (see [`FlatGraph::norms`]); empty otherwise.
    pub(crate) fn norms(&self) -> &[f32] {
        self.graph.as_ref().map_or(&[], |g| g.norms())
    }

    /// Up to `k` candidate rows near `query` among rows `admit` accepts, from a graph walk with
    /// candidate list `ef`, nearest first by the graph's order: callers re-score exactly.
    pub(crate) fn candidates(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        admit: &dyn Fn(usize) -> bool,
    ) -> Vec<usize> {
        self.graph
            .as_ref()
            .map_or_else(Vec::new, |g| g.search(query, k, ef, admit))
    }
}

/// What a memtable needs to keep a vector graph: where the vector is, its dimension and
/// metric, the graph parameters, and the size above which the graph is kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemGraphSpec {
    /// Position of the vector column in the stored schema.
    pub vcol: usize,
    /// The vector dimension.
    pub dim: usize,
    /// The schema's metric.
    pub metric: Metric,
    /// Graph parameters.
    pub params: GraphParams,
    /// The graph is started once the memtable holds this many rows.
    pub above: usize,
}

/// A memtable's vector graph, filled in the background: rows `[0, indexed)` (memtable row
/// ordinals, every version and tombstone) are in the graph, later rows are scanned exactly by
/// searches until the inserter catches up. At flush the graph becomes the generation's (see
/// [`MemVectorIndex::to_adjacency`]). `dot` memtables get no graph (the augmentation needs the
/// generation's largest norm); they are scanned, and their generation's graph is built at
/// flush.
pub(crate) struct MemVectorIndex {
    vcol: usize,
    /// Points and queries go through [`graph_vector`] with it.
    metric: Metric,
    /// Takes concurrent inserts and searches (`&self`, a lock per node).
    graph: HnswBuilder,
    indexed: std::sync::atomic::AtomicUsize,
    running: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for MemVectorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemVectorIndex({} rows indexed)", self.indexed())
    }
}

/// The inserter role of a [`MemVectorIndex`] (see [`MemVectorIndex::try_start`]).
pub(crate) struct InserterRole<'a>(&'a MemVectorIndex);

impl Drop for InserterRole<'_> {
    fn drop(&mut self) {
        self.0
            .running
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

/// The largest fraction of a memtable's rows that may be older versions for its flush to
/// convert its graph (see [`MemVectorIndex::to_adjacency`]).
const MAX_DROPPED: f64 = 0.1;

/// Rows inserted per step of a catch-up (the step after which `indexed` advances).
const INSERT_CHUNK: usize = 1024;

impl MemVectorIndex {
    /// An empty graph as `spec` describes; `None` for `dot`.
    pub(crate) fn new(spec: &MemGraphSpec) -> Option<Self> {
        if spec.metric == Metric::Dot {
            return None;
        }
        Some(MemVectorIndex {
            vcol: spec.vcol,
            metric: spec.metric,
            graph: HnswBuilder::new(
                spec.dim,
                space_of(spec.metric),
                spec.params.m,
                spec.params.ef_construction,
            ),
            indexed: std::sync::atomic::AtomicUsize::new(0),
            running: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Rows `[0, indexed)` are in the graph.
    pub(crate) fn indexed(&self) -> usize {
        self.indexed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether an inserter holds the role.
    pub(crate) fn running(&self) -> bool {
        self.running.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Claim the inserter role, given back when the returned guard drops (also when its
    /// holder panics); `None` when another inserter runs.
    pub(crate) fn try_start(&self) -> Option<InserterRole<'_>> {
        (!self.running.swap(true, std::sync::atomic::Ordering::AcqRel))
            // `then`, not `then_some`: a guard built for a refused claim would release the
            // holder's role when dropped.
            .then(|| InserterRole(self))
    }

    /// Insert rows `[indexed, rows)` of the memtable's stored `batches` (starting at `offsets`),
    /// a chunk at a time (with every core when more than two chunks behind), while `keep_going` holds. Older versions are
    /// inserted too (searches mask them; a flush leaves them out); tombstones and null vectors
    /// have no node. Only the holder of the inserter role ([`MemVectorIndex::try_start`])
    /// calls this.
    pub(crate) fn catch_up(
        &self,
        batches: &[RecordBatch],
        offsets: &[usize],
        rows: usize,
        keep_going: &dyn Fn() -> bool,
    ) {
        loop {
            let start = self.indexed();
            if start >= rows || !keep_going() {
                return;
            }
            let end = rows.min(start + INSERT_CHUNK);
            let mut ids = Vec::with_capacity(end - start);
            for ord in start..end {
                let b = offsets.partition_point(|o| *o <= ord) - 1;
                let r = ord - offsets[b];
                let list = batches[b].column(self.vcol).as_fixed_size_list();
                if list.is_null(r) {
                    continue;
                }
                let dim = list.value_length() as usize;
                let values = list.values().as_primitive::<Float32Type>().values();
                let s = list.value_offset(r) as usize;
                let id = ord as u32;
                if self
                    .graph
                    .add(id, graph_vector(self.metric, &values[s..s + dim]))
                {
                    ids.push(id);
                }
            }
            // One thread while the inserter keeps up, every core once it falls behind: a
            // paced stream leaves a core to the searches.
            let threads = if rows - end > 2 * INSERT_CHUNK {
                std::thread::available_parallelism().map_or(1, |n| n.get())
            } else {
                1
            };
            self.graph.insert_with(&ids, threads);
            self.indexed
                .store(end, std::sync::atomic::Ordering::Release);
        }
    }

    /// Up to `k` candidate rows near `query` among rows `[0, indexed)` that `admit` accepts
    /// (graph distances: callers re-score), and `indexed`, read before the walk: rows inserted
    /// while the walk runs are left to the caller's scan of `[indexed, rows)`.
    pub(crate) fn candidates(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        admit: &dyn Fn(usize) -> bool,
    ) -> (Vec<usize>, usize) {
        let indexed = self.indexed();
        if indexed == 0 {
            return (Vec::new(), 0);
        }
        let query = graph_vector(self.metric, query);
        let rows = self
            .graph
            .search(&query, k, ef, &|id| {
                (id as usize) < indexed && admit(id as usize)
            })
            .into_iter()
            .map(|id| id as usize)
            .collect();
        (rows, indexed)
    }

    /// The graph over a generation's rows, once every memtable row is in it: generation row
    /// `r` is memtable row `ordinals[r]`; older versions are left out, with their links.
    /// `None` (the flush builds a graph instead) before that, or when more than
    /// [`MAX_DROPPED`] of the memtable's rows are older versions: leaving out that many nodes
    /// loses more links than the repair of [`HnswBuilder::to_adjacency`] restores (a test with
    /// half the nodes dropped found 1,216 of 1,500 rows by their own vector, against 1,497 in
    /// a graph built over the kept rows).
    pub(crate) fn to_adjacency(
        &self,
        memtable_rows: usize,
        ordinals: &[usize],
    ) -> Option<Adjacency> {
        let dropped = memtable_rows.saturating_sub(ordinals.len());
        if self.indexed() < memtable_rows || dropped as f64 > MAX_DROPPED * memtable_rows as f64 {
            return None;
        }
        let mut row_of = vec![u32::MAX; memtable_rows];
        for (row, ord) in ordinals.iter().enumerate() {
            if let Some(slot) = row_of.get_mut(*ord) {
                *slot = row as u32;
            }
        }
        let map = |id: u32| row_of.get(id as usize).copied().filter(|r| *r != u32::MAX);
        Some(
            self.graph
                .to_adjacency(ordinals.len(), ordinals.iter().map(|o| *o as u32), &map),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_claim_leaves_the_inserter_role_with_its_holder() {
        let spec = MemGraphSpec {
            vcol: 0,
            dim: 4,
            metric: Metric::L2,
            params: GraphParams {
                m: 4,
                ef_construction: 8,
                threads: 0,
            },
            above: 0,
        };
        let g = MemVectorIndex::new(&spec).expect("an l2 graph");
        let held = g.try_start().expect("the role is free");
        assert!(g.try_start().is_none(), "the role is held");
        assert!(g.running(), "a refused claim released the holder's role");
        assert!(g.try_start().is_none(), "two inserters at once");
        drop(held);
        assert!(!g.running());
        assert!(g.try_start().is_some());
    }
}
