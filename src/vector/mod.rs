//! Vector indexes: an HNSW graph per generation, built by the crate's own builder ([`hnsw`]:
//! a memtable's graph, filled in the background, becomes its generation's at flush) and kept
//! (in the bundle and in memory) as flat arrays ([`graph`]); memtables keep their graph live
//! ([`MemVectorIndex`]). hnsw_rs only reads the graphs of format-1 bundles (its dump files),
//! which are converted to flat arrays.
//!
//! A graph only proposes candidates; every returned distance is recomputed exactly. Metrics:
//! `l2` builds on Euclidean distance, `cosine` on one minus the cosine similarity, and `dot`
//! (maximum inner product) on Euclidean distance between vectors augmented with one coordinate
//! `sqrt(M² - |x|²)`, `M` the generation's largest norm, and the query augmented with 0: then
//! `|q' - x'|² = |q|² + M² - 2 q·x`, so the nearest augmented vector has the largest dot product.

pub(crate) mod codes;
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
/// Name of the bundle section holding the 8-bit codes of a generation's walk vectors (format
/// version 3).
pub(crate) const CODES_SECTION: &str = "vector/codes";

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
    /// A graph walked over its f32 vectors (a small generation's, which keeps them): the 8-bit
    /// codes of its rows, which a search that need not be exact scans instead of the vectors
    /// (see [`VectorIndex::scan_keyed`]).
    scan: Option<codes::Codes>,
}

impl VectorIndex {
    /// Bytes the index holds in memory besides what its generation's object holds (its
    /// codes, scanned or walked, are counted with the object's hot part they come from).
    pub(crate) fn extra_bytes(&self) -> usize {
        self.graph.as_ref().map_or(0, FlatGraph::extra_bytes)
    }

    /// Bytes of the bitmap of its graph's nodes a scan builds (part of
    /// [`VectorIndex::extra_bytes`]).
    pub(crate) fn nodes_bytes(&self) -> usize {
        self.graph.as_ref().map_or(0, FlatGraph::nodes_bytes)
    }

    /// This index (a graph over its rows' f32 vectors, of `dim` values each) with the 8-bit
    /// codes of its rows from section `codes` (see [`codes`]), which searches that need not
    /// be exact scan instead of the vectors ([`VectorIndex::scan_keyed`]).
    pub(crate) fn with_scan_codes(
        mut self,
        section: &[u8],
        metric: Metric,
        dim: usize,
    ) -> Result<Self> {
        let Some(graph) = &self.graph else {
            return Ok(self);
        };
        let rows = graph.rows();
        let codes = codes::Codes::decode(section, metric, rows, dim)
            .map_err(|m| Error::internal(format!("section '{CODES_SECTION}' {m}")))?;
        self.scan = Some(codes);
        Ok(self)
    }

    /// Whether searches that need not be exact scan its codes ([`VectorIndex::scan_keyed`]).
    pub(crate) fn scans_codes(&self) -> bool {
        self.scan.is_some() && self.graph.is_some()
    }

    /// The best `keep` rows (at least `k`) that `admit` accepts by the keys of their codes
    /// (smaller is nearer; comparable between generations, as a walk over codes proposes
    /// them), nearest first, found by scanning every row's code: for the caller to re-rank
    /// exactly. Given `bar`, only rows whose key is not above it, however few (the query's
    /// round never chooses the others). Every row is scanned, nodes of the graph or not:
    /// `admit` must refuse rows without a vector (whose codes are zeros). `None` when the
    /// index keeps no codes to scan.
    pub(crate) fn scan_keyed(
        &self,
        query: &[f32],
        k: usize,
        keep: usize,
        bar: Option<f32>,
        admit: &dyn Fn(usize) -> bool,
    ) -> Option<Vec<(f32, usize)>> {
        let (graph, codes) = (self.graph.as_ref()?, self.scan.as_ref()?);
        let list = graph.scan_keyed(codes, query, k, keep, bar, admit);
        Some(list.into_iter().map(|s| (s.0, s.1 as usize)).collect())
    }

    /// Bytes its graph's neighbour lists hold in memory.
    pub(crate) fn graph_bytes(&self) -> usize {
        self.graph
            .as_ref()
            .map_or(0, |g| g.adjacency().memory_bytes())
    }
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

    /// The graph over `rows` (a compaction's merged rows) continuing `base`'s (the graph of
    /// one of the merged generations): base row `b` is merged row `base_rows[b]` (`None` when
    /// the merge dropped it); base nodes keep their links among the kept nodes, and the other
    /// rows are inserted on `params.threads` threads. `None` when `base` cannot be continued:
    /// `dot` (its vectors are augmented by the largest norm, which the merge changes), a graph
    /// read from format 1, or more than a tenth of its nodes dropped (their links would be
    /// missed: the graph is then built afresh).
    pub(crate) fn continue_graph(
        rows: &RecordBatch,
        vcol: usize,
        metric: Metric,
        params: GraphParams,
        base: &VectorIndex,
        base_rows: &[Option<u32>],
    ) -> Result<Option<Adjacency>> {
        let Some(adjacency) = base.graph.as_ref().map(FlatGraph::adjacency) else {
            return Ok(None);
        };
        let dropped = base_rows.iter().filter(|r| r.is_none()).count();
        if metric == Metric::Dot || dropped * 10 > base_rows.len() {
            return Ok(None);
        }
        let (data, _) = graph_points(rows, vcol, metric)?;
        let Some(dim) = data.first().map(|(v, _)| v.len()) else {
            return Ok(None);
        };
        let mut from_base: Vec<Option<u32>> = vec![None; rows.num_rows()];
        for (b, r) in base_rows.iter().enumerate() {
            if let Some(r) = r {
                if let Some(slot) = from_base.get_mut(*r as usize) {
                    *slot = Some(b as u32);
                }
            }
        }
        let graph = HnswBuilder::new(dim, space_of(metric), params.m, params.ef_construction);
        let map = |b: u32| base_rows.get(b as usize).copied().flatten();
        let ids: Vec<u32> = data.iter().map(|(_, r)| *r as u32).collect();
        let mut inserted = Vec::new();
        // The kept base node of the highest level: the base entry when it is kept.
        let mut entry: Option<(usize, bool, u32)> = None;
        for (v, r) in data {
            let r32 = r as u32;
            match from_base[r] {
                Some(b) => {
                    // A link to a dropped node is replaced by that node's kept neighbours in
                    // the same layer (a walk through it), so dropping a node does not cut
                    // the paths that went through it.
                    let lists: Vec<Vec<u32>> = adjacency
                        .lists(b)
                        .into_iter()
                        .enumerate()
                        .map(|(layer, l)| {
                            let mut out: Vec<u32> = Vec::with_capacity(l.len());
                            for x in l {
                                match map(x) {
                                    Some(k) => out.push(k),
                                    None => out.extend(
                                        adjacency
                                            .lists(x)
                                            .get(layer)
                                            .into_iter()
                                            .flatten()
                                            .filter_map(|y| map(*y))
                                            .filter(|y| *y != r32),
                                    ),
                                }
                            }
                            let mut seen = std::collections::HashSet::new();
                            out.retain(|x| seen.insert(*x));
                            out
                        })
                        .collect();
                    let rank = (lists.len(), adjacency.entry() == Some(b), r32);
                    if entry.is_none_or(|e| (rank.0, rank.1) > (e.0, e.1)) {
                        entry = Some(rank);
                    }
                    graph.add_linked(r32, v, lists);
                }
                None => {
                    graph.add(r32, v);
                    inserted.push(r32);
                }
            }
        }
        let Some((_, _, entry)) = entry else {
            return Ok(None);
        };
        graph.set_entry(entry);
        if params.threads == 0 {
            graph.insert_all(&inserted);
        } else {
            graph.insert_with(&inserted, params.threads);
        }
        Ok(Some(graph.to_adjacency(
            rows.num_rows(),
            ids.into_iter(),
            &Some,
        )))
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
                scan: None,
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
            scan: None,
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
            scan: None,
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

    /// The `vector/codes` section of `rows`' vector column: 8-bit codes of each row's walk
    /// vector (see [`codes`]).
    pub(crate) fn codes_section(
        rows: &RecordBatch,
        vcol: usize,
        metric: Metric,
    ) -> Result<Vec<u8>> {
        let (dim, vectors) = vectors_of(rows, vcol)?;
        let deleted = deleted_flags(rows);
        let list = rows.column(vcol).as_fixed_size_list();
        let has = |r: usize| !deleted.value(r) && !list.is_null(r);
        let walk: Vec<f32> = if metric == Metric::Cosine {
            vectors
                .chunks_exact(dim.max(1))
                .flat_map(|v| graph_vector(metric, v))
                .collect()
        } else {
            vectors.to_vec()
        };
        Ok(codes::Codes::build(metric, dim, &walk, &has).encode())
    }

    /// A generation's graph (section `graph`) walked over the codes of its rows (section
    /// `codes`), its f32 vectors left in the object: walks return their candidate list for
    /// the caller to re-rank.
    pub(crate) fn open_codes(
        rows: usize,
        dim: usize,
        metric: Metric,
        graph: &[u8],
        codes: &[u8],
    ) -> Result<Self> {
        let adjacency = Adjacency::decode(graph, rows)
            .map_err(|m| Error::internal(format!("section '{GRAPH_SECTION}' {m}")))?;
        let codes = codes::Codes::decode(codes, metric, rows, dim)
            .map_err(|m| Error::internal(format!("section '{CODES_SECTION}' {m}")))?;
        Ok(VectorIndex {
            graph: Some(FlatGraph::with_codes(adjacency, metric, dim, codes)),
            scan: None,
        })
    }

    /// `cosine`: each row's norm (see [`FlatGraph::norms`]); empty otherwise.
    pub(crate) fn norms(&self) -> &[f32] {
        self.graph.as_ref().map_or(&[], |g| g.norms())
    }

    /// Up to `k` candidate rows near `query` among rows `admit` accepts, from a graph walk with
    /// candidate list `ef`, nearest first by the graph's order (over codes: the whole list, up
    /// to `ef`): callers re-score exactly.
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

    /// The candidates of a graph over codes, at most `keep` (at least `k`), with each row's
    /// key by the codes (smaller is nearer; comparable between generations), nearest first
    /// (see [`graph::FlatGraph::code_candidates`]), and whether `bar` cut them (a scan's, of
    /// a graph whose every row is a node); `None` for a graph walked over the vectors
    /// themselves.
    pub(crate) fn keyed_candidates(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        keep: usize,
        bar: Option<f32>,
        admit: &dyn Fn(usize) -> bool,
    ) -> Option<(Vec<(f32, usize)>, bool)> {
        let (list, barred) = self
            .graph
            .as_ref()?
            .code_candidates(query, k, ef, keep, bar, admit)?;
        Some((
            list.into_iter().map(|s| (s.0, s.1 as usize)).collect(),
            barred,
        ))
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
        Self::with_builder(
            spec,
            HnswBuilder::new(
                spec.dim,
                space_of(spec.metric),
                spec.params.m,
                spec.params.ef_construction,
            ),
        )
    }

    fn with_builder(spec: &MemGraphSpec, graph: HnswBuilder) -> Option<Self> {
        if spec.metric == Metric::Dot {
            return None;
        }
        Some(MemVectorIndex {
            vcol: spec.vcol,
            metric: spec.metric,
            graph,
            indexed: std::sync::atomic::AtomicUsize::new(0),
            running: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// How many of `rows` memtable rows the graph can take (ids below 2^28); the rest stay in
    /// the tail searches scan exactly.
    pub(crate) fn coverable(&self, rows: usize) -> usize {
        rows.min(self.graph.capacity())
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
            // Rows from the graph's capacity on (2^28 ids) stay in the tail searches scan.
            let rows = self.coverable(rows);
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

    /// Candidate rows near `query` among rows `[0, indexed)` that `admit` accepts (up to `k`,
    /// or the walk's whole list of up to `max(k, ef)` for half-precision points: callers
    /// re-score exactly), and `indexed`, read before the walk: rows inserted while the walk runs
    /// are left to the caller's scan of `[indexed, rows)`.
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

    /// A small l2 memtable graph of `dim` dimensions, started at once.
    fn l2_spec(dim: usize) -> MemGraphSpec {
        MemGraphSpec {
            vcol: 0,
            dim,
            metric: Metric::L2,
            params: GraphParams {
                m: 4,
                ef_construction: 8,
                threads: 0,
            },
            above: 0,
        }
    }

    #[test]
    fn rows_beyond_the_graphs_capacity_stay_in_the_scanned_tail() {
        use arrow::array::{FixedSizeListArray, Float32Array};
        use arrow::datatypes::{DataType, Field, Schema};
        let spec = l2_spec(2);
        // Room for ids below 4,096: a memtable of 5,000 rows outgrows it.
        let graph = HnswBuilder::with_segments(2, Space::L2, 4, 8, 1);
        let g = MemVectorIndex::with_builder(&spec, graph).expect("an l2 graph");
        let n = 5000;
        let values: Vec<f32> = (0..n).flat_map(|i| [i as f32, 1.0]).collect();
        let list = FixedSizeListArray::try_new(
            std::sync::Arc::new(Field::new("item", DataType::Float32, true)),
            2,
            std::sync::Arc::new(Float32Array::from(values)),
            None,
        )
        .unwrap();
        let schema = Schema::new(vec![Field::new("v", list.data_type().clone(), true)]);
        let batch =
            RecordBatch::try_new(std::sync::Arc::new(schema), vec![std::sync::Arc::new(list)])
                .unwrap();
        let _role = g.try_start().expect("free");
        g.catch_up(&[batch], &[0], n, &|| true);
        // Rows at and past `indexed` are scanned by searches: none may be counted as in the
        // graph without being in it.
        assert!(
            g.indexed() <= 4096,
            "{} rows counted as indexed",
            g.indexed()
        );
    }

    #[test]
    fn a_refused_claim_leaves_the_inserter_role_with_its_holder() {
        let spec = l2_spec(4);
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

#[cfg(test)]
mod continue_tests {
    use super::*;
    use arrow::array::{FixedSizeListArray, Float32Array};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    const DIM: usize = 16;

    fn rows(points: &[Vec<f32>]) -> RecordBatch {
        let values: Vec<f32> = points.iter().flatten().copied().collect();
        let list = FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            DIM as i32,
            Arc::new(Float32Array::from(values)),
            None,
        )
        .unwrap();
        let schema = Schema::new(vec![Field::new("v", list.data_type().clone(), true)]);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(list)]).unwrap()
    }

    /// Clustered points, as near-duplicate documents give: 40 centres, each point a jittered
    /// copy. (With jitter 0.1 both graphs find about 0.75 of the true neighbours at ef 64, the
    /// continued one within 0.03 of the fresh one.)
    fn points(n: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f32 / (1u64 << 53) as f32 - 0.5
        };
        let centres: Vec<Vec<f32>> = (0..40)
            .map(|_| (0..DIM).map(|_| next()).collect())
            .collect();
        (0..n)
            .map(|i| {
                let c = &centres[(i * 7919) % centres.len()];
                c.iter().map(|x| x + 0.3 * next()).collect()
            })
            .collect()
    }

    fn recall(index: &VectorIndex, data: &[Vec<f32>], queries: &[Vec<f32>]) -> f64 {
        let mut hit = 0;
        for q in queries {
            let mut exact: Vec<(f32, usize)> = data
                .iter()
                .enumerate()
                .map(|(r, p)| (distance::l2_sq(p, q), r))
                .collect();
            exact.sort_by(|a, b| a.0.total_cmp(&b.0));
            let want: Vec<usize> = exact[..10].iter().map(|x| x.1).collect();
            let got = index.candidates(q, 10, 64, &|_| true);
            hit += got.iter().filter(|r| want.contains(r)).count();
        }
        hit as f64 / (10 * queries.len()) as f64
    }

    #[test]
    fn a_continued_graph_finds_what_a_fresh_one_finds() {
        let params = GraphParams {
            m: 8,
            ef_construction: 64,
            threads: 2,
        };
        let old = points(3000, 1);
        let (base, _) = VectorIndex::build(&rows(&old), 0, Metric::L2, params).unwrap();
        // The merge drops every 20th base row (5%), and adds 1,500 rows after the kept ones.
        let mut merged: Vec<Vec<f32>> = Vec::new();
        let base_rows: Vec<Option<u32>> = old
            .iter()
            .enumerate()
            .map(|(i, p)| {
                (i % 20 != 0).then(|| {
                    merged.push(p.clone());
                    merged.len() as u32 - 1
                })
            })
            .collect();
        merged.extend(points(1500, 2));
        let batch = rows(&merged);
        let adjacency =
            VectorIndex::continue_graph(&batch, 0, Metric::L2, params, &base, &base_rows)
                .unwrap()
                .expect("an l2 graph with 5% dropped continues");
        let (continued, _) = VectorIndex::from_adjacency(&batch, 0, Metric::L2, adjacency).unwrap();
        let (fresh, _) = VectorIndex::build(&batch, 0, Metric::L2, params).unwrap();
        let queries = points(100, 3);
        let (c, f) = (
            recall(&continued, &merged, &queries),
            recall(&fresh, &merged, &queries),
        );
        assert!(c >= 0.9 && c >= f - 0.03, "continued {c:.3}, fresh {f:.3}");
        // Too many dropped: built afresh instead.
        let sparse: Vec<Option<u32>> = base_rows
            .iter()
            .enumerate()
            .map(|(i, r)| if i % 5 == 0 { None } else { *r })
            .collect();
        assert!(
            VectorIndex::continue_graph(&batch, 0, Metric::L2, params, &base, &sparse)
                .unwrap()
                .is_none()
        );
    }
}
