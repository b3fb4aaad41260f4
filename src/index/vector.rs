//! Vector indexes: an hnsw_rs graph per generation, built at flush and stored in its bundle.
//!
//! The graph only proposes candidates; every returned distance is recomputed exactly. Metrics:
//! `l2` builds on Euclidean distance, `cosine` on one minus the cosine similarity, and `dot`
//! (maximum inner product) on Euclidean distance between vectors augmented with one coordinate
//! `sqrt(M² - |x|²)`, `M` the generation's largest norm, and the query augmented with 0: then
//! `|q' - x'|² = |q|² + M² - 2 q·x`, so the nearest augmented vector has the largest dot product.

use crate::schema::Metric;
use crate::{Error, Result};
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::Float32Type;
use hnsw_rs::prelude::{AnnT, Distance, Hnsw, HnswIo};
use std::sync::Arc;

fn hn(e: impl std::fmt::Display) -> Error {
    Error::internal(format!("hnsw: {e}"))
}

/// Graph parameters (from settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphParams {
    /// Maximum connections per node and layer (hnsw M).
    pub m: usize,
    /// Candidate list size while building.
    pub ef_construction: usize,
}

/// The distance the graph is built with (never negative, as hnsw_rs requires).
#[derive(Debug, Clone, Copy, Default)]
pub struct GraphDistance {
    cosine: bool,
}

impl Distance<f32> for GraphDistance {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        if self.cosine {
            let (mut dot, mut na, mut nb) = (0f32, 0f32, 0f32);
            for (x, y) in a.iter().zip(b) {
                dot += x * y;
                na += x * x;
                nb += y * y;
            }
            if na == 0.0 || nb == 0.0 {
                1.0
            } else {
                (1.0 - dot / (na.sqrt() * nb.sqrt())).max(0.0)
            }
        } else {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y) * (x - y))
                .sum::<f32>()
                .sqrt()
        }
    }
}

type Graph<'a> = Hnsw<'a, f32, GraphDistance>;

self_cell::self_cell!(
    struct LoadedGraph {
        owner: HnswIo,
        #[not_covariant]
        dependent: Graph,
    }
);

enum GraphHolder {
    Built(Graph<'static>),
    Loaded(LoadedGraph),
    /// A generation of tombstones only: nothing to walk.
    Empty,
}

/// A generation's vector graph.
pub struct VectorIndex {
    holder: GraphHolder,
    metric: Metric,
    points: usize,
}

impl std::fmt::Debug for VectorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VectorIndex({} points, {:?})", self.points, self.metric)
    }
}

fn graph_distance(metric: Metric) -> GraphDistance {
    GraphDistance {
        cosine: metric == Metric::Cosine,
    }
}

/// The data ids of up to `k` points near `q` that `admit` accepts, from a filtered walk with
/// candidate list `max(ef, k)`.
fn walk(
    g: &Graph<'_>,
    q: &[f32],
    k: usize,
    ef: usize,
    admit: &dyn Fn(usize) -> bool,
) -> Vec<usize> {
    let filter = |id: &usize| admit(*id);
    g.search_filter(q, k, ef.max(k), Some(&filter))
        .into_iter()
        .map(|n| n.d_id)
        .collect()
}

fn augment(v: &[f32], max_norm: f32) -> Vec<f32> {
    let n2: f32 = v.iter().map(|x| x * x).sum();
    let mut out = v.to_vec();
    out.push((max_norm * max_norm - n2).max(0.0).sqrt());
    out
}

impl VectorIndex {
    /// Build the graph over the non-tombstone rows of a generation (`vcol` is the vector
    /// column's position); returns the index and its encoded sections.
    pub fn build(
        rows: &RecordBatch,
        vcol: usize,
        metric: Metric,
        params: GraphParams,
    ) -> Result<(VectorIndex, crate::index::text::IndexFiles)> {
        let deleted = crate::memtable::deleted_flags(rows);
        let list = rows.column(vcol).as_fixed_size_list();
        let dim = list.value_length() as usize;
        let values = list.values().as_primitive::<Float32Type>().values();
        let mut data: Vec<(Vec<f32>, usize)> = Vec::new();
        for r in 0..rows.num_rows() {
            if deleted.value(r) || list.is_null(r) {
                continue;
            }
            let s = list.value_offset(r) as usize;
            data.push((values[s..s + dim].to_vec(), r));
        }
        let max_norm = if metric == Metric::Dot {
            data.iter()
                .map(|(v, _)| v.iter().map(|x| x * x).sum::<f32>().sqrt())
                .fold(0f32, f32::max)
        } else {
            0.0
        };
        if metric == Metric::Dot {
            for (v, _) in &mut data {
                *v = augment(v, max_norm);
            }
        }
        let mut meta = Vec::with_capacity(8);
        meta.extend_from_slice(&max_norm.to_le_bytes());
        meta.extend_from_slice(&(data.len() as u32).to_le_bytes());
        if data.is_empty() {
            return Ok((
                VectorIndex {
                    holder: GraphHolder::Empty,
                    metric,
                    points: 0,
                },
                vec![("hnsw/meta".to_string(), meta)],
            ));
        }
        let graph: Graph<'static> = Hnsw::new(
            params.m,
            data.len().max(1),
            16,
            params.ef_construction,
            graph_distance(metric),
        );
        let refs: Vec<(&[f32], usize)> = data.iter().map(|(v, r)| (v.as_slice(), *r)).collect();
        graph.parallel_insert_slice(&refs);
        let dir = tempfile::tempdir().map_err(hn)?;
        let base = graph.file_dump(dir.path(), "g").map_err(hn)?;
        let mut sections = Vec::new();
        for (name, ext) in [("hnsw/graph", "hnsw.graph"), ("hnsw/data", "hnsw.data")] {
            let p = dir.path().join(format!("{base}.{ext}"));
            sections.push((name.to_string(), std::fs::read(&p).map_err(hn)?));
        }
        sections.push(("hnsw/meta".to_string(), meta));
        Ok((
            VectorIndex {
                holder: GraphHolder::Built(graph),
                metric,
                points: data.len(),
            },
            sections,
        ))
    }

    /// Load a graph from the sections [`VectorIndex::build`] wrote.
    pub fn open(
        metric: Metric,
        meta: &[u8],
        sections: impl FnOnce() -> Result<(bytes::Bytes, bytes::Bytes)>,
    ) -> Result<VectorIndex> {
        if meta.len() != 8 {
            return Err(Error::internal("hnsw/meta section has the wrong size"));
        }
        let points = u32::from_le_bytes(meta[4..8].try_into().expect("4")) as usize;
        if points == 0 {
            return Ok(VectorIndex {
                holder: GraphHolder::Empty,
                metric,
                points,
            });
        }
        let (graph, data) = sections()?;
        let dir = tempfile::tempdir().map_err(hn)?;
        std::fs::write(dir.path().join("g.hnsw.graph"), &graph).map_err(hn)?;
        std::fs::write(dir.path().join("g.hnsw.data"), &data).map_err(hn)?;
        let io = HnswIo::new(dir.path(), "g");
        let loaded = LoadedGraph::try_new(io, |io| {
            io.load_hnsw_with_dist::<f32, GraphDistance>(graph_distance(metric))
                .map_err(hn)
        })?;
        Ok(VectorIndex {
            holder: GraphHolder::Loaded(loaded),
            metric,
            points,
        })
    }

    /// Points in the graph.
    pub fn points(&self) -> usize {
        self.points
    }

    /// Up to `k` candidate rows near `query` among rows `admit` accepts, from a graph walk with
    /// candidate list `ef`. Distances are the graph's, not exact: callers re-score.
    pub fn candidates(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        admit: &dyn Fn(usize) -> bool,
    ) -> Vec<usize> {
        let mut q = query.to_vec();
        if self.metric == Metric::Dot {
            q.push(0.0);
        }
        let search = |g: &Graph<'_>| walk(g, &q, k, ef, admit);
        match &self.holder {
            GraphHolder::Built(g) => search(g),
            GraphHolder::Loaded(l) => l.with_dependent(|_, g| search(g)),
            GraphHolder::Empty => Vec::new(),
        }
    }
}

/// Shared handle.
pub type SharedVectorIndex = Arc<VectorIndex>;

/// What a memtable needs to keep a vector graph: where the vector is, its metric, the graph
/// parameters, the expected row count (capacity) and the size above which the graph is kept.
#[derive(Debug, Clone, Copy)]
pub struct MemGraphSpec {
    /// Position of the vector column in the stored schema.
    pub vcol: usize,
    /// The schema's metric.
    pub metric: Metric,
    /// Graph parameters.
    pub params: GraphParams,
    /// Rows the memtable is expected to hold at most (the graph's initial capacity).
    pub capacity: usize,
    /// The graph is started once the memtable holds this many rows.
    pub above: usize,
}

/// A memtable's vector graph, filled in the background: rows `[0, indexed)` (memtable row
/// ordinals, every version and tombstone) are in the graph, later rows are scanned exactly by
/// searches until the inserter catches up. `dot` memtables get no graph (the augmentation
/// needs the final largest norm); they are always scanned.
pub struct MemVectorIndex {
    vcol: usize,
    /// hnsw_rs graphs take concurrent inserts and searches (`&self`, locks per node).
    graph: Graph<'static>,
    indexed: std::sync::atomic::AtomicUsize,
    running: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for MemVectorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemVectorIndex({} rows indexed)", self.indexed())
    }
}

/// Rows inserted per step of a catch-up (the step after which `indexed` advances).
const INSERT_CHUNK: usize = 512;

impl MemVectorIndex {
    /// An empty graph as `spec` describes; `None` for `dot`.
    pub fn new(spec: &MemGraphSpec) -> Option<Self> {
        if spec.metric == Metric::Dot {
            return None;
        }
        let graph: Graph<'static> = Hnsw::new(
            spec.params.m,
            spec.capacity.clamp(1, 10_000_000),
            16,
            spec.params.ef_construction,
            graph_distance(spec.metric),
        );
        Some(MemVectorIndex {
            vcol: spec.vcol,
            graph,
            indexed: std::sync::atomic::AtomicUsize::new(0),
            running: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Rows `[0, indexed)` are in the graph.
    pub fn indexed(&self) -> usize {
        self.indexed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Claim the inserter role; false when another inserter runs.
    pub fn try_start(&self) -> bool {
        !self.running.swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// Give the inserter role back.
    pub fn stop(&self) {
        self.running
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// Insert rows `[indexed, rows)` of the memtable's stored `batches` (starting at `offsets`),
    /// a chunk at a time, while `keep_going` holds. Tombstones and older versions are
    /// inserted too (a tombstone's vector is null and skipped): searches mask them. Only the
    /// holder of the inserter role ([`MemVectorIndex::try_start`]) calls this.
    pub fn catch_up(
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
            let mut chunk: Vec<(Vec<f32>, usize)> = Vec::with_capacity(end - start);
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
                chunk.push((values[s..s + dim].to_vec(), ord));
            }
            let refs: Vec<(&[f32], usize)> =
                chunk.iter().map(|(v, o)| (v.as_slice(), *o)).collect();
            self.graph.parallel_insert_slice(&refs);
            self.indexed
                .store(end, std::sync::atomic::Ordering::Release);
        }
    }

    /// Up to `k` candidate rows near `query` among rows `[0, indexed)` that `admit` accepts
    /// (graph distances: callers re-score), and `indexed`, read before the walk: rows inserted
    /// while the walk runs are left to the caller's scan of `[indexed, rows)`.
    pub fn candidates(
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
        let rows = walk(&self.graph, query, k, ef, &|id| id < indexed && admit(id));
        (rows, indexed)
    }
}
