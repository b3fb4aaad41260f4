//! A generation's HNSW graph in flat arrays, searched in place.
//!
//! Graphs are built by [`super::hnsw`] (or read from a format-1 bundle's hnsw_rs dump); then
//! their layers are copied into flat adjacency arrays ([`FlatGraph`]) that are written to the
//! bundle's `vector/graph` section and searched directly: loading one is a copy of `u32`
//! arrays (no per-node allocation), the vectors are the generation's own vector column (not a
//! second copy), and a walk keeps its visited set in a bitmap.
//!
//! Point ids are row numbers of the generation. Rows without a graph node (tombstones, null
//! vectors) have no neighbours at layer 0 and are never reached.
//!
//! Walks rank nodes by a *search key* that orders them as the graph's build distance does for a
//! fixed query: squared Euclidean distance for `l2`, the negated cosine similarity scaled by the
//! query's norm for `cosine`, the negated dot product for `dot` (whose graph is built over
//! augmented vectors, where `|q' - x'|² = |q|² + M² - 2 q·x`). Callers re-score exactly.
//!
//! The `vector/graph` section's layout is in `docs/format.md`; its version is
//! [`ObjectKind::GraphSection`] in the format registry.

use super::codes::Codes;
use super::distance;
use crate::format::ObjectKind;
use crate::schema::Metric;
use crate::{Error, Result};
use arrow::buffer::ScalarBuffer;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Version of the `vector/graph` section this build writes and reads.
const GRAPH_SECTION_VERSION: u32 = ObjectKind::GraphSection.written();

/// The adjacency of one layer above 0: only its nodes have entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Upper {
    nodes: Vec<u32>,
    offsets: Vec<u32>,
    neighbours: Vec<u32>,
}

impl Upper {
    fn of(&self, node: u32) -> &[u32] {
        match self.nodes.binary_search(&node) {
            Ok(i) => &self.neighbours[self.offsets[i] as usize..self.offsets[i + 1] as usize],
            Err(_) => &[],
        }
    }
}

/// Row numbers below `2^bits`, packed in `bits` bits each: layer 0's neighbour lists, the bulk
/// of a graph (a generation of 150,000 rows needs 18 bits a neighbour, not 32).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PackedIds {
    bits: u32,
    len: usize,
    /// Little-endian bit order; one word more than the values need, so a read of two words
    /// never goes past the end.
    words: Vec<u64>,
}

impl PackedIds {
    /// `ids`, each below `2^bits` (`bits` in `1..=32`).
    fn new(ids: &[u32], bits: u32) -> PackedIds {
        PackedIds::collect(ids.len(), bits, ids.iter().copied())
    }

    /// The `len` values of `ids`, each below `2^bits` (`bits` in `1..=32`).
    fn collect(len: usize, bits: u32, ids: impl Iterator<Item = u32>) -> PackedIds {
        let b = bits as usize;
        let mut words = vec![0u64; (len * b).div_ceil(64) + 1];
        for (i, id) in ids.take(len).enumerate() {
            debug_assert!(u64::from(id) >> b == 0, "{id} needs more than {b} bits");
            let (w, off) = (i * b / 64, i * b % 64);
            let v = u64::from(id);
            words[w] |= v << off;
            if off + b > 64 {
                words[w + 1] |= v >> (64 - off);
            }
        }
        PackedIds { bits, len, words }
    }

    /// Bits a row number of a generation of `rows` rows needs.
    fn bits_for(rows: usize) -> u32 {
        (usize::BITS - rows.saturating_sub(1).leading_zeros()).max(1)
    }

    #[inline]
    fn get(&self, i: usize) -> u32 {
        let b = self.bits as usize;
        let (w, off) = (i * b / 64, i * b % 64);
        let lo = self.words[w] >> off;
        let hi = match off {
            0 => 0,
            _ => self.words[w + 1] << (64 - off),
        };
        ((lo | hi) & ((1u64 << b) - 1)) as u32
    }

    /// Values `range`.
    fn range(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = u32> + '_ {
        range.map(move |i| self.get(i))
    }

    fn to_vec(&self) -> Vec<u32> {
        self.range(0..self.len).collect()
    }
}

/// The structure of an HNSW graph: per layer, each node's neighbours (row numbers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Adjacency {
    rows: u32,
    entry: Option<u32>,
    offsets: Vec<u32>,
    /// Layer 0's lists, node after node (`offsets` says where each starts).
    neighbours: PackedIds,
    upper: Vec<Upper>,
}

impl Adjacency {
    /// From per-node neighbour lists: `nodes[i] = (row, lists)` where `lists[l]` holds the
    /// node's neighbours at layer `l` (a node is in layers `0..lists.len()`); `entry` is a node
    /// of the top layer.
    pub(crate) fn from_lists(
        rows: usize,
        mut nodes: Vec<(u32, Vec<Vec<u32>>)>,
        entry: u32,
    ) -> Self {
        nodes.sort_unstable_by_key(|n| n.0);
        let top = nodes.iter().map(|n| n.1.len()).max().unwrap_or(0);
        let mut degree0 = vec![0u32; rows + 1];
        for (r, lists) in &nodes {
            degree0[*r as usize + 1] = lists.first().map_or(0, |l| l.len() as u32);
        }
        for i in 0..rows {
            degree0[i + 1] += degree0[i];
        }
        let mut neighbours = Vec::with_capacity(degree0[rows] as usize);
        for (_, lists) in &nodes {
            if let Some(l) = lists.first() {
                neighbours.extend_from_slice(l);
            }
        }
        let upper = (1..top)
            .map(|layer| {
                let mut u = Upper {
                    offsets: vec![0],
                    ..Default::default()
                };
                for (r, lists) in nodes.iter().filter(|n| n.1.len() > layer) {
                    u.nodes.push(*r);
                    u.neighbours.extend_from_slice(&lists[layer]);
                    u.offsets.push(u.neighbours.len() as u32);
                }
                u
            })
            .collect();
        Adjacency {
            rows: rows as u32,
            entry: (!nodes.is_empty()).then_some(entry),
            neighbours: PackedIds::new(&neighbours, PackedIds::bits_for(rows)),
            offsets: degree0,
            upper,
        }
    }

    /// Row `row`'s neighbour lists, layer 0 first, up to the highest layer it is in.
    pub(crate) fn lists(&self, row: u32) -> Vec<Vec<u32>> {
        let r = row as usize;
        let mut out = Vec::new();
        if r + 1 < self.offsets.len() {
            out.push(
                self.neighbours
                    .range(self.offsets[r] as usize..self.offsets[r + 1] as usize)
                    .collect(),
            );
        }
        for u in &self.upper {
            match u.nodes.binary_search(&row) {
                Ok(i) => out
                    .push(u.neighbours[u.offsets[i] as usize..u.offsets[i + 1] as usize].to_vec()),
                Err(_) => break,
            }
        }
        out
    }

    /// The entry row, if the graph has nodes.
    pub(crate) fn entry(&self) -> Option<u32> {
        self.entry
    }

    /// The section bytes (layout in `docs/format.md`).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out: Vec<u32> = vec![
            GRAPH_SECTION_VERSION,
            self.rows,
            self.entry.unwrap_or(u32::MAX),
            self.upper.len() as u32,
        ];
        out.extend_from_slice(&self.offsets);
        out.extend(self.neighbours.to_vec());
        for u in &self.upper {
            out.push(u.nodes.len() as u32);
            out.extend_from_slice(&u.nodes);
            out.extend_from_slice(&u.offsets);
            out.extend_from_slice(&u.neighbours);
        }
        out.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Parse and check a section written by [`Adjacency::encode`] for a generation of `rows`
    /// rows. The error message says what is wrong.
    pub(crate) fn decode(bytes: &[u8], rows: usize) -> std::result::Result<Self, String> {
        if !bytes.len().is_multiple_of(4) {
            return Err(format!(
                "has {} bytes, not a whole number of u32",
                bytes.len()
            ));
        }
        // Read straight from the bytes: a graph is decoded beside every other generation's
        // when a handle opens, so no copy of the section is made on the way.
        let words = bytes.len() / 4;
        let word = |i: usize| u32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().expect("4"));
        let mut at = 0usize;
        let take_range =
            |at: &mut usize, n: usize| -> std::result::Result<std::ops::Range<usize>, String> {
                let end = at
                    .checked_add(n)
                    .filter(|e| *e <= words)
                    .ok_or("is truncated")?;
                let r = *at..end;
                *at = end;
                Ok(r)
            };
        let take = |at: &mut usize, n: usize| -> std::result::Result<Vec<u32>, String> {
            Ok(take_range(at, n)?.map(word).collect())
        };
        let head = take(&mut at, 4)?;
        if !(ObjectKind::GraphSection.oldest_read()..=GRAPH_SECTION_VERSION).contains(&head[0]) {
            return Err(format!(
                "has version {}; this build reads version {GRAPH_SECTION_VERSION}",
                head[0]
            ));
        }
        if head[1] as usize != rows {
            return Err(format!(
                "is for {} rows, the generation has {rows}",
                head[1]
            ));
        }
        let check_offsets = |o: &[u32]| -> std::result::Result<usize, String> {
            if o.first() != Some(&0) || o.windows(2).any(|w| w[0] > w[1]) {
                return Err("has offsets that are not ascending from 0".into());
            }
            Ok(*o.last().expect("non-empty") as usize)
        };
        let check_ids = |ids: &[u32]| -> std::result::Result<(), String> {
            match ids.iter().find(|&&r| r as usize >= rows) {
                Some(r) => Err(format!("names row {r} of {rows}")),
                None => Ok(()),
            }
        };
        let offsets = take(&mut at, rows + 1)?;
        let n = check_offsets(&offsets)?;
        let layer0 = take_range(&mut at, n)?;
        if let Some(r) = layer0.clone().map(word).find(|r| *r as usize >= rows) {
            return Err(format!("names row {r} of {rows}"));
        }
        let neighbours = PackedIds::collect(n, PackedIds::bits_for(rows), layer0.map(word));
        let mut upper = Vec::new();
        for _ in 0..head[3] {
            let n = take(&mut at, 1)?[0] as usize;
            let nodes = take(&mut at, n)?;
            check_ids(&nodes)?;
            if nodes.windows(2).any(|w| w[0] >= w[1]) {
                return Err("has upper-layer nodes that are not ascending".into());
            }
            let offsets = take(&mut at, n + 1)?;
            let m = check_offsets(&offsets)?;
            let neighbours = take(&mut at, m)?;
            check_ids(&neighbours)?;
            upper.push(Upper {
                nodes,
                offsets,
                neighbours,
            });
        }
        if at != words {
            return Err(format!("has {} trailing bytes", (words - at) * 4));
        }
        let entry = (head[2] != u32::MAX).then_some(head[2]);
        match entry {
            Some(e) if e as usize >= rows => return Err(format!("has entry row {e} of {rows}")),
            Some(e)
                if upper
                    .last()
                    .is_some_and(|u| u.nodes.binary_search(&e).is_err()) =>
            {
                return Err("has an entry point outside its top layer".into())
            }
            _ => {}
        }
        Ok(Adjacency {
            rows: rows as u32,
            entry,
            offsets,
            neighbours,
            upper,
        })
    }

    /// Nodes in the graph (nodes with a layer-0 list or the entry).
    #[cfg(test)]
    pub(crate) fn nodes(&self) -> usize {
        (0..self.rows as usize)
            .filter(|r| self.offsets[r + 1] > self.offsets[*r] || self.entry == Some(*r as u32))
            .count()
    }

    /// A bit per row, set for the graph's nodes: the entry, and every row with neighbours at
    /// layer 0 or named as one (a node whose own links a flush dropped keeps the links to it;
    /// tombstones and rows without a vector have neither).
    fn nodes_bitmap(&self) -> Vec<u64> {
        let rows = self.rows as usize;
        let mut bits = vec![0u64; rows.div_ceil(64)];
        let mut set = |r: usize| {
            if r < rows {
                bits[r / 64] |= 1 << (r % 64);
            }
        };
        if let Some(e) = self.entry {
            set(e as usize);
        }
        for r in 0..rows {
            if self.offsets[r + 1] > self.offsets[r] {
                set(r);
            }
        }
        for i in 0..self.neighbours.len {
            set(self.neighbours.get(i) as usize);
        }
        bits
    }

    /// Bytes its lists hold in memory.
    pub(crate) fn memory_bytes(&self) -> usize {
        let upper: usize = self
            .upper
            .iter()
            .map(|u| (u.nodes.len() + u.offsets.len() + u.neighbours.len()) * 4)
            .sum();
        self.offsets.len() * 4 + self.neighbours.words.len() * 8 + upper
    }

    fn layer0(&self, node: u32) -> impl Iterator<Item = u32> + '_ {
        let n = node as usize;
        self.neighbours
            .range(self.offsets[n] as usize..self.offsets[n + 1] as usize)
    }
}

/// A node and its search key (or distance), ordered by key then node: the entries of the
/// heaps of graph walks and builds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Scored(pub(crate) f32, pub(crate) u32);

impl Eq for Scored {}

impl PartialOrd for Scored {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scored {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
    }
}

/// An HNSW graph over a generation's vector column, ready to walk.
#[derive(Debug)]
pub(crate) struct FlatGraph {
    adjacency: Adjacency,
    metric: Metric,
    dim: usize,
    /// Row `r`'s vector is `vectors[r * dim..(r + 1) * dim]`.
    vectors: ScalarBuffer<f32>,
    /// `cosine`: each row's norm, `sqrt(x·x)` with the lanes of [`distance::dot`].
    norms: Vec<f32>,
    /// `cosine`: each row's inverse norm (0 for a zero vector).
    inverse_norms: Vec<f32>,
    /// `cosine`: each row over its norm in half precision, which walks read (half the bytes
    /// of `vectors`, with an error far below the angles between neighbours; what a walk keeps
    /// is re-scored from `vectors`). Empty for `l2` and `dot`, whose values have no bound a
    /// half-precision copy could keep its precision under (an offset or one outlier row would
    /// leave nearby rows indistinguishable): their walks read `vectors`.
    halves: Vec<half::f16>,
    /// Format version 3: the walk vectors' 8-bit codes, which walks read instead (`vectors`,
    /// `norms` and `halves` are then empty, and the caller re-ranks what a walk finds).
    codes: Option<Codes>,
    /// Which rows are nodes, found at the first scan (see [`Adjacency::nodes_bitmap`]), and
    /// whether every row is one.
    nodes: std::sync::OnceLock<(Vec<u64>, bool)>,
}

impl FlatGraph {
    /// The graph's layers.
    pub(crate) fn adjacency(&self) -> &Adjacency {
        &self.adjacency
    }

    /// Rows of its generation (nodes or not).
    pub(crate) fn rows(&self) -> usize {
        self.adjacency.rows as usize
    }

    /// A graph over `vectors` (row-major, `dim` per row, one per row of the adjacency).
    pub(crate) fn new(
        adjacency: Adjacency,
        metric: Metric,
        dim: usize,
        vectors: ScalarBuffer<f32>,
    ) -> Result<Self> {
        if vectors.len() != adjacency.rows as usize * dim {
            return Err(Error::internal(format!(
                "graph over {} rows given {} values of dimension {dim}",
                adjacency.rows,
                vectors.len()
            )));
        }
        let norms: Vec<f32> = if metric == Metric::Cosine && dim > 0 {
            vectors
                .chunks_exact(dim)
                .map(|v| distance::dot(v, v).sqrt())
                .collect()
        } else {
            Vec::new()
        };
        let inverse_norms: Vec<f32> = norms
            .iter()
            .map(|n| if *n > 0.0 { 1.0 / n } else { 0.0 })
            .collect();
        let halves = if metric == Metric::Cosine && dim >= distance::HALF_MIN_DIM {
            unit_halves(dim, &vectors, &inverse_norms)
        } else {
            Vec::new()
        };
        Ok(FlatGraph {
            adjacency,
            metric,
            dim,
            vectors,
            norms,
            inverse_norms,
            halves,
            codes: None,
            nodes: std::sync::OnceLock::new(),
        })
    }

    /// A graph walked over the 8-bit `codes` of its rows' walk vectors: its walks return
    /// their whole candidate list, ordered by the codes' keys, for the caller to re-rank.
    pub(crate) fn with_codes(
        adjacency: Adjacency,
        metric: Metric,
        dim: usize,
        codes: Codes,
    ) -> Self {
        FlatGraph {
            adjacency,
            metric,
            dim,
            vectors: ScalarBuffer::from(Vec::<f32>::new()),
            norms: Vec::new(),
            inverse_norms: Vec::new(),
            halves: Vec::new(),
            codes: Some(codes),
            nodes: std::sync::OnceLock::new(),
        }
    }

    /// `cosine`: each row's norm (`sqrt(x·x)`, summed in the lanes of [`distance::dot`], so
    /// `1 - q·x / (|q| |x|)` from it equals [`distance::cosine`] bit for bit); empty for the
    /// other metrics.
    pub(crate) fn norms(&self) -> &[f32] {
        &self.norms
    }

    /// A walk's key of `row`: [`FlatGraph::key`], from the half-precision unit vectors when the
    /// graph keeps them (`cosine`).
    fn walk_key(&self, q: &[f32], row: u32) -> f32 {
        if self.halves.is_empty() {
            return self.key(q, row);
        }
        let r = row as usize;
        -distance::dot_half(q, &self.halves[r * self.dim..(r + 1) * self.dim])
    }

    /// Bytes the graph holds besides the vectors it shares with its rows and what its
    /// object's sections hold (adjacency, codes): the half-precision copy and the norms, and
    /// for a graph over codes the bitmap of its nodes a scan builds ([`FlatGraph::nodes_bytes`],
    /// counted from the start so the graph's weight does not change).
    pub(crate) fn extra_bytes(&self) -> usize {
        self.halves.len() * 2
            + (self.norms.len() + self.inverse_norms.len()) * 4
            + self.nodes_bytes()
    }

    /// Bytes of the bitmap of its nodes a scan of a graph over codes builds (0 for others).
    pub(crate) fn nodes_bytes(&self) -> usize {
        match self.codes {
            Some(_) => (self.adjacency.rows as usize).div_ceil(64) * 8,
            None => 0,
        }
    }

    fn key(&self, q: &[f32], row: u32) -> f32 {
        let r = row as usize;
        let v = &self.vectors[r * self.dim..(r + 1) * self.dim];
        match self.metric {
            Metric::L2 => distance::l2_sq(q, v),
            Metric::Cosine => -distance::dot(q, v) * self.inverse_norms[r],
            Metric::Dot => -distance::dot(q, v),
        }
    }

    /// Up to `k` rows near `query` that `admit` accepts, nearest first, from a walk with a
    /// candidate list of `max(ef, k)`: greedy descent through the upper layers, then a beam
    /// search of layer 0 that walks through rejected rows but keeps only admitted ones.
    pub(crate) fn search(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        admit: &dyn Fn(usize) -> bool,
    ) -> Vec<usize> {
        self.search_keyed(query, k, ef, admit)
            .into_iter()
            .map(|s| s.1 as usize)
            .collect()
    }

    /// [`FlatGraph::search`] with each row's walk key: over codes, the keys the codes give
    /// (comparable between generations: they estimate the same function of the query and
    /// the row); otherwise the exact search key.
    pub(crate) fn search_keyed(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        admit: &dyn Fn(usize) -> bool,
    ) -> Vec<Scored> {
        let Some(mut entry) = self.adjacency.entry else {
            return Vec::new();
        };
        if k == 0 || query.len() != self.dim {
            return Vec::new();
        }
        let ef = ef.max(k);
        let prepared = self.codes.as_ref().map(|c| (c, c.query(query)));
        let walk_key = |row: u32| match &prepared {
            Some((codes, cq)) => codes.key(self.metric, cq, row as usize),
            None => self.walk_key(query, row),
        };
        let mut best = walk_key(entry);
        for layer in self.adjacency.upper.iter().rev() {
            loop {
                let mut moved = false;
                for &n in layer.of(entry) {
                    let d = walk_key(n);
                    if d < best {
                        (best, entry, moved) = (d, n, true);
                    }
                }
                if !moved {
                    break;
                }
            }
        }
        let rows = self.adjacency.rows as usize;
        let mut visited = vec![0u64; rows.div_ceil(64)];
        let mut seen = |r: u32| {
            let (w, b) = (r as usize / 64, 1u64 << (r % 64));
            let was = visited[w] & b != 0;
            visited[w] |= b;
            was
        };
        seen(entry);
        let mut frontier = BinaryHeap::new();
        let mut found: BinaryHeap<Scored> = BinaryHeap::with_capacity(ef + 1);
        frontier.push(std::cmp::Reverse(Scored(best, entry)));
        if admit(entry as usize) {
            found.push(Scored(best, entry));
        }
        // A node's neighbours not yet seen, their codes fetched into the caches together.
        let mut unseen: Vec<u32> = Vec::new();
        while let Some(std::cmp::Reverse(Scored(d, node))) = frontier.pop() {
            if found.len() >= ef && found.peek().is_some_and(|w| d > w.0) {
                break;
            }
            unseen.clear();
            for n in self.adjacency.layer0(node) {
                if !seen(n) {
                    if let Some((codes, _)) = &prepared {
                        codes.prefetch(n as usize);
                    }
                    unseen.push(n);
                }
            }
            for &n in &unseen {
                let dn = walk_key(n);
                let bound = if found.len() >= ef {
                    found.peek().map_or(f32::INFINITY, |w| w.0)
                } else {
                    f32::INFINITY
                };
                if dn < bound {
                    frontier.push(std::cmp::Reverse(Scored(dn, n)));
                    if admit(n as usize) {
                        found.push(Scored(dn, n));
                        if found.len() > ef {
                            found.pop();
                        }
                    }
                }
            }
        }
        if self.codes.is_some() {
            // The whole list, by the codes' keys: the caller re-ranks it exactly.
            return found.into_sorted_vec();
        }
        let mut out: Vec<Scored> = if self.halves.is_empty() {
            found.into_sorted_vec()
        } else {
            // The list found from half-precision keys, ordered by exact ones.
            let mut exact: Vec<Scored> = found
                .into_iter()
                .map(|s| Scored(self.key(query, s.1), s.1))
                .collect();
            exact.sort_unstable();
            exact
        };
        out.truncate(k);
        out
    }

    /// The candidates of a graph over codes for a caller that re-ranks at most `keep` of
    /// them (at least `k`), by the codes' keys, nearest first: a walk's list of `max(ef, k)`
    /// cut to `keep`, or, when the graph has at most [`SCAN_ROWS_PER_EF`] times that list's
    /// rows (and at most [`SCAN_MAX_ROWS`]), the best `keep` of every node `admit` accepts,
    /// found by computing each one's key in row order (cheaper than a walk that would visit
    /// most of them, and exact over the codes; so a scanned graph may propose more than its
    /// list's length, which is harmless: keys of every generation compare). A scan given
    /// `bar` (the query's round's: [`crate::query::rerank`]) keeps only the nodes whose key is
    /// not above it when every row is a node, and says so. `None` for a graph walked over the
    /// vectors themselves.
    pub(crate) fn code_candidates(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        keep: usize,
        bar: Option<f32>,
        admit: &dyn Fn(usize) -> bool,
    ) -> Option<(Vec<Scored>, bool)> {
        let codes = self.codes.as_ref()?;
        let keep = keep.max(k);
        if self.adjacency.entry.is_none() || k == 0 || query.len() != self.dim {
            return Some((Vec::new(), false));
        }
        let scanned = ef
            .max(k)
            .saturating_mul(SCAN_ROWS_PER_EF)
            .min(SCAN_MAX_ROWS);
        if self.adjacency.rows as usize <= scanned {
            let (nodes, every) = self.nodes.get_or_init(|| {
                let bits = self.adjacency.nodes_bitmap();
                let set: usize = bits.iter().map(|w| w.count_ones() as usize).sum();
                let every = set == self.adjacency.rows as usize;
                (bits, every)
            });
            // With every row a node, a scan without the bar never comes back short (it finds
            // every admitted row up to `keep`): the bar changes what it proposes, never
            // whether its caller falls back to ranking every row. Otherwise it is not used.
            let bar = bar.filter(|_| *every);
            let list = self.scan_rows(codes, query, keep, bar, Some(nodes), admit);
            return Some((list, bar.is_some()));
        }
        let mut list = self.search_keyed(query, k, ef, admit);
        list.truncate(keep);
        Some((list, false))
    }

    /// The best `keep` (at least `k`) rows `admit` accepts by the keys of `codes` (the codes
    /// of the rows of a graph walked over its f32 vectors), nearest first; given `bar`, only
    /// rows whose key is not above it, however few.
    pub(crate) fn scan_keyed(
        &self,
        codes: &Codes,
        query: &[f32],
        k: usize,
        keep: usize,
        bar: Option<f32>,
        admit: &dyn Fn(usize) -> bool,
    ) -> Vec<Scored> {
        if k == 0 || query.len() != self.dim {
            return Vec::new();
        }
        self.scan_rows(codes, query, keep.max(k), bar, None, admit)
    }

    /// The best `n` rows `admit` accepts (and, given `nodes`, whose bits are set) by their
    /// codes' keys, nearest first; given `outer_bar`, of those whose key is not above it.
    fn scan_rows(
        &self,
        codes: &Codes,
        query: &[f32],
        n: usize,
        outer_bar: Option<f32>,
        nodes: Option<&[u64]>,
        admit: &dyn Fn(usize) -> bool,
    ) -> Vec<Scored> {
        let cq = codes.query(query);
        let is_node = |r: usize| nodes.is_none_or(|b| b[r / 64] & (1 << (r % 64)) != 0);
        let rows = self.adjacency.rows as usize;
        if n == 0 {
            return Vec::new();
        }
        // The best `n` so far among at most `2n` kept: when `2n` are kept, the best `n` are
        // selected and the worst of them becomes the bar a row must pass. Rows come in
        // order, so one that ties the bar's key orders after it and is not kept. A heap of
        // `n` costs a push and a pop per row that passes; this, amortised, one comparison.
        let full = n.saturating_mul(2);
        let mut found: Vec<Scored> = Vec::with_capacity(full.min(rows));
        // A row whose key is above the caller's bar is not kept; one that ties it is (it
        // may order before the bar's row).
        let above = |key: f32| outer_bar.is_some_and(|b| key.total_cmp(&b).is_gt());
        let mut bar: Option<f32> = None;
        let skip = |key: f32, bar: Option<f32>| {
            bar.is_some_and(|bar| key.total_cmp(&bar).is_ge()) || above(key)
        };
        let mut sums = Vec::with_capacity(SCAN_CHUNK_ROWS.min(rows));
        let mut start = 0;
        while start < rows {
            let end = (start + SCAN_CHUNK_ROWS).min(rows);
            sums.clear();
            codes.sums(&cq, start..end, &mut sums);
            // Rows whose sum is at most `skipped_up_to` (the largest sum whose key a bar
            // skips: `least` of the bar) would be skipped by their key: nearly every row once
            // a bar is known, passed over without one.
            let floor = codes.floor(self.metric, &cq, start..end);
            let least = |bar: Option<f32>| match floor {
                Some(f) if bar.is_some() || outer_bar.is_some() => {
                    f.skipped_up_to(|key| skip(key, bar))
                }
                _ => i64::MIN,
            };
            let mut skipped_up_to = least(bar);
            for (r, sum) in (start..end).zip(sums.iter().copied()) {
                if sum <= skipped_up_to {
                    continue;
                }
                let key = codes.key_of_sum(self.metric, &cq, r, sum);
                if skip(key, bar) {
                    continue;
                }
                if !is_node(r) || !admit(r) {
                    continue;
                }
                found.push(Scored(key, r as u32));
                if found.len() >= full {
                    found.select_nth_unstable(n - 1);
                    found.truncate(n);
                    bar = Some(found[n - 1].0);
                    skipped_up_to = least(bar);
                }
            }
            start = end;
        }
        if found.len() > n {
            found.select_nth_unstable(n - 1);
            found.truncate(n);
        }
        found.sort_unstable();
        found
    }
}

/// A graph over codes is scanned instead of walked when it has at most this many rows per
/// entry of the walk's list, and at most [`SCAN_MAX_ROWS`]. Measured on `bench generations`'
/// indexes (100,000 rows, 128-d, lists of 400; CPU per vector query of 100 rows, walked /
/// scanned): a walk costs 0.5-0.7 ms whatever the generation's size, a scan about 13 ns a row;
/// 1 generation of 99,000 rows 1.0-1.3 / 1.5-1.9 ms, 5 of 20,000 3.0-3.3 / 1.8-2.5 ms, 10 of
/// 10,000 6.0-6.3 / 2.4-2.6 ms, 18 of 5,500 7.9-8.2 / 2.7-3.2 ms: they cost the same near
/// 46,000 rows (115 an entry). Both costs grow with the dimension (every key a walk visits
/// reads a row's codes too), so the bound does not depend on it.
const SCAN_ROWS_PER_EF: usize = 100;
/// The most rows a graph over codes has and is scanned: the largest measured to scan faster
/// than a walk (a merged generation's longer list would otherwise admit scans of hundreds of
/// thousands of rows, where walks with long lists were not measured).
const SCAN_MAX_ROWS: usize = 40_000;

/// Rows whose keys a scan computes at once.
const SCAN_CHUNK_ROWS: usize = 1024;

/// Each row of `vectors` over its norm (`inverse_norms`), in half precision.
fn unit_halves(dim: usize, vectors: &[f32], inverse_norms: &[f32]) -> Vec<half::f16> {
    use half::slice::HalfFloatSliceExt;
    let mut halves = vec![half::f16::ZERO; vectors.len()];
    if dim == 0 {
        return halves;
    }
    let mut unit = vec![0f32; dim];
    for ((v, h), inv) in vectors
        .chunks_exact(dim)
        .zip(halves.chunks_exact_mut(dim))
        .zip(inverse_norms)
    {
        for (u, x) in unit.iter_mut().zip(v) {
            *u = x * inv;
        }
        h.convert_from_f32_slice(&unit);
    }
    halves
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_ids_read_back_what_was_packed() {
        for rows in [0usize, 1, 2, 3, 17, 150_000, 1 << 20, u32::MAX as usize + 1] {
            let bits = PackedIds::bits_for(rows);
            assert!(
                rows <= 1 || (rows - 1) >> bits == 0,
                "{rows} rows in {bits} bits"
            );
            let top = rows.saturating_sub(1) as u32;
            let ids: Vec<u32> = (0..200u32)
                .map(|i| match i % 3 {
                    0 => top,
                    1 => 0,
                    _ => i.wrapping_mul(2_654_435_761) % (top.max(1)),
                })
                .collect();
            let p = PackedIds::new(&ids, bits);
            assert_eq!(p.to_vec(), ids, "{rows} rows");
            assert_eq!(p.range(5..9).collect::<Vec<_>>(), ids[5..9]);
        }
    }

    #[test]
    fn cosine_from_kept_norms_equals_the_distance_kernel_bit_for_bit() {
        let dim = 37;
        let mut next = distance::tests::uniform(11);
        let mut values: Vec<f32> = (0..6 * dim).map(|_| next()).collect();
        values[2 * dim..3 * dim].fill(0.0); // a zero vector
        let rows = Adjacency::from_lists(6, Vec::new(), 0);
        let g = FlatGraph::new(rows, Metric::Cosine, dim, values.clone().into()).unwrap();
        let q: Vec<f32> = (0..dim).map(|_| next()).collect();
        let qn = distance::dot(&q, &q).sqrt();
        for (r, v) in values.chunks_exact(dim).enumerate() {
            let n = g.norms()[r];
            let ours = if qn == 0.0 || n == 0.0 {
                1.0
            } else {
                1.0 - distance::dot(&q, v) / (qn * n)
            };
            assert_eq!(ours.to_bits(), distance::cosine(&q, v).to_bits(), "row {r}");
        }
    }

    #[test]
    fn walks_return_rows_in_exact_order_at_any_scale() {
        let rows = 60usize;
        let dim = 9;
        let mut next = distance::tests::uniform(5);
        let base: Vec<f32> = (0..rows * dim).map(|_| next()).collect();
        let q: Vec<f32> = (0..dim).map(|_| next()).collect();
        // Values far below half precision's smallest normal, and far above its largest.
        for scale in [1e-7f32, 1.0, 1e6] {
            for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
                let vectors: Vec<f32> = base.iter().map(|x| x * scale).collect();
                let query: Vec<f32> = q.iter().map(|x| x * scale).collect();
                let nodes = (0..rows as u32)
                    .map(|r| (r, vec![(0..rows as u32).filter(|&n| n != r).collect()]))
                    .collect();
                let g = FlatGraph::new(
                    Adjacency::from_lists(rows, nodes, 0),
                    metric,
                    dim,
                    ScalarBuffer::from(vectors.clone()),
                )
                .unwrap();
                let mut exact: Vec<(f32, usize)> =
                    (0..rows).map(|r| (g.key(&query, r as u32), r)).collect();
                exact.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let want: Vec<usize> = exact.iter().take(10).map(|e| e.1).collect();
                assert_eq!(
                    g.search(&query, 10, rows, &|_| true),
                    want,
                    "{metric:?} at scale {scale}"
                );
            }
        }
    }

    fn sample() -> Adjacency {
        // Rows 0..6; row 4 has no node (a tombstone); rows 1 and 3 reach layer 1, row 3 layer 2.
        let nodes = vec![
            (0, vec![vec![1, 2]]),
            (1, vec![vec![0, 2, 3], vec![3]]),
            (2, vec![vec![0, 1, 5]]),
            (3, vec![vec![1, 5], vec![1], vec![]]),
            (5, vec![vec![2, 3]]),
        ];
        Adjacency::from_lists(6, nodes, 3)
    }

    #[test]
    fn adjacency_round_trips_and_rejects_damage() {
        let a = sample();
        assert_eq!(a.nodes(), 5);
        let bytes = a.encode();
        assert_eq!(Adjacency::decode(&bytes, 6).unwrap(), a);
        assert!(Adjacency::decode(&bytes, 7).unwrap_err().contains("6 rows"));
        assert!(Adjacency::decode(&bytes[..bytes.len() - 4], 6).is_err());
        let mut extra = bytes.clone();
        extra.extend_from_slice(&[0; 4]);
        assert!(Adjacency::decode(&extra, 6)
            .unwrap_err()
            .contains("trailing"));
        // A neighbour id out of range.
        let mut bad = bytes.clone();
        let first_neighbour = 4 * (4 + 7);
        bad[first_neighbour..first_neighbour + 4].copy_from_slice(&99u32.to_le_bytes());
        assert!(Adjacency::decode(&bad, 6).unwrap_err().contains("row 99"));
        let mut v2 = bytes;
        v2[0] = 2;
        assert!(Adjacency::decode(&v2, 6).unwrap_err().contains("version 2"));
        let empty = Adjacency::from_lists(3, vec![], 0);
        assert_eq!(Adjacency::decode(&empty.encode(), 3).unwrap(), empty);
    }

    #[test]
    fn a_small_graph_over_codes_is_scanned_exactly_and_a_large_one_walked() {
        // Rows over three chunks of a scan; every seventh row has no node (a tombstone, its
        // codes all zeros), and row 102 is a node whose own links were dropped: only links
        // to it remain.
        let (rows, dim, lonely) = (2_500usize, 16, 102u32);
        let mut next = distance::tests::uniform(23);
        let vectors: Vec<f32> = (0..rows * dim).map(|_| next()).collect();
        let is_node = |r: usize| r % 7 != 3;
        let nodes = (0..rows as u32)
            .filter(|r| is_node(*r as usize))
            .map(|r| {
                let near = (1..=8u32)
                    .flat_map(|d| [r.wrapping_sub(d), r + d])
                    .filter(|n| (*n as usize) < rows && is_node(*n as usize))
                    .filter(|_| r != lonely)
                    .collect();
                (r, vec![near])
            })
            .collect();
        let adjacency = Adjacency::from_lists(rows, nodes, 0);
        // Negative everywhere: the tombstones' zero codes (each dimension's minimum) are the
        // nearest rows by every metric's key.
        let away: Vec<f32> = (0..dim).map(|_| -10.0 - next().abs()).collect();
        let own = vectors[lonely as usize * dim..(lonely as usize + 1) * dim].to_vec();
        let admit = |r: usize| !r.is_multiple_of(5);
        for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
            let codes = Codes::build(metric, dim, &vectors, &is_node);
            let g = FlatGraph::with_codes(adjacency.clone(), metric, dim, codes);
            for q in [&away, &own] {
                let codes = g.codes.as_ref().unwrap();
                let cq = codes.query(q);
                let mut want: Vec<Scored> = (0..rows)
                    .filter(|r| is_node(*r) && admit(*r))
                    .map(|r| Scored(codes.key(metric, &cq, r), r as u32))
                    .collect();
                want.sort();
                // A list of 100 over 2,500 rows: scanned, the best 30 by the codes' keys.
                let (scanned, barred) = g.code_candidates(q, 10, 100, 30, None, &admit).unwrap();
                assert_eq!(scanned, want[..30], "{metric:?}");
                assert!(!barred);
                // Some rows are not nodes (tombstones): a bar is not used, so the list is as
                // long as without it.
                let bar = Some(want[3].0);
                let (same, barred) = g.code_candidates(q, 10, 100, 30, bar, &admit).unwrap();
                assert_eq!((same, barred), (scanned.clone(), false), "{metric:?}");
                assert!(
                    scanned.iter().all(|s| is_node(s.1 as usize)),
                    "{metric:?}: a tombstone proposed"
                );
                // Never fewer than k, whatever is kept.
                assert_eq!(
                    g.code_candidates(q, 10, 100, 3, None, &admit).unwrap().0,
                    want[..10]
                );
                // A list of 15: walked (a walk of this band graph misses some of the best),
                // its list cut to what is kept, nearest first.
                let walked = g.code_candidates(q, 10, 15, 15, None, &admit).unwrap().0;
                assert_eq!(walked.len(), 15, "{metric:?}");
                assert!(walked.windows(2).all(|w| w[0] < w[1]));
                assert!(walked.iter().all(|s| want.contains(s)), "{metric:?}");
                assert_ne!(walked, want[..15], "{metric:?}: walked, not scanned");
                assert!(g
                    .code_candidates(q, 10, 100, 30, None, &|_| false)
                    .unwrap()
                    .0
                    .is_empty());
                assert!(g
                    .code_candidates(&q[1..], 10, 100, 30, None, &admit)
                    .unwrap()
                    .0
                    .is_empty());
            }
            // The node without links of its own is found by its own vector.
            if metric != Metric::Dot {
                let found = g
                    .code_candidates(&own, 10, 100, 30, None, &admit)
                    .unwrap()
                    .0;
                assert_eq!(found[0].1, lonely, "{metric:?}");
            }
        }
        let plain = FlatGraph::new(adjacency, Metric::L2, dim, vectors.into()).unwrap();
        assert!(plain
            .code_candidates(&own, 10, 100, 30, None, &admit)
            .is_none());
    }

    #[test]
    fn a_scan_of_a_graph_whose_every_row_is_a_node_keeps_rows_below_a_bar() {
        let (rows, dim) = (1_500usize, 8);
        let mut next = distance::tests::uniform(11);
        let vectors: Vec<f32> = (0..rows * dim).map(|_| next()).collect();
        let nodes = (0..rows as u32)
            .map(|r| {
                let near = [r.wrapping_sub(1), r + 1]
                    .into_iter()
                    .filter(|n| (*n as usize) < rows)
                    .collect();
                (r, vec![near])
            })
            .collect();
        let adjacency = Adjacency::from_lists(rows, nodes, 0);
        let admit = |r: usize| !r.is_multiple_of(4);
        let q: Vec<f32> = (0..dim).map(|_| next()).collect();
        for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
            let codes = Codes::build(metric, dim, &vectors, &|_| true);
            let g = FlatGraph::with_codes(adjacency.clone(), metric, dim, codes);
            let codes = g.codes.as_ref().unwrap();
            let cq = codes.query(&q);
            let mut want: Vec<Scored> = (0..rows)
                .filter(|r| admit(*r))
                .map(|r| Scored(codes.key(metric, &cq, r), r as u32))
                .collect();
            want.sort();
            // Scanned (a list of 100 over 1,500 rows): without a bar, the best 30.
            let (list, barred) = g.code_candidates(&q, 10, 100, 30, None, &admit).unwrap();
            assert_eq!((list, barred), (want[..30].to_vec(), false), "{metric:?}");
            // With one, the rows not above it (ties kept), however few, and it says so.
            for at in [0, 4, 60] {
                let bar = want[at].0;
                let under: Vec<Scored> = want.iter().copied().filter(|s| s.0 <= bar).collect();
                let got = g.code_candidates(&q, 10, 100, 30, Some(bar), &admit);
                let keep = under.len().min(30);
                assert_eq!(got, Some((under[..keep].to_vec(), true)), "{metric:?} {at}");
            }
            // Walked (a list of 10): a walk takes no bar.
            let (_, barred) = g
                .code_candidates(&q, 10, 10, 30, Some(want[0].0), &admit)
                .unwrap();
            assert!(!barred, "{metric:?}");
        }
    }

    #[test]
    fn a_scan_of_a_graph_over_vectors_reads_every_admitted_rows_codes() {
        // A graph over f32 vectors whose row 42 lost its links and was never named (no node):
        // a scan of its codes reads every row `admit` accepts, nodes or not.
        let (rows, dim, lonely) = (300usize, 8, 42u32);
        let mut next = distance::tests::uniform(5);
        let vectors: Vec<f32> = (0..rows * dim).map(|_| next()).collect();
        let nodes = (0..rows as u32)
            .filter(|r| *r != lonely)
            .map(|r| {
                let near = [r.wrapping_sub(1), r + 1, r + 2]
                    .into_iter()
                    .filter(|n| (*n as usize) < rows && *n != lonely)
                    .collect();
                (r, vec![near])
            })
            .collect();
        let adjacency = Adjacency::from_lists(rows, nodes, 0);
        let own = vectors[lonely as usize * dim..(lonely as usize + 1) * dim].to_vec();
        let admit = |r: usize| r % 3 != 1;
        for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
            let codes = Codes::build(metric, dim, &vectors, &|_| true);
            let g = FlatGraph::new(adjacency.clone(), metric, dim, vectors.clone().into()).unwrap();
            let cq = codes.query(&own);
            let mut want: Vec<Scored> = (0..rows)
                .filter(|r| admit(*r))
                .map(|r| Scored(codes.key(metric, &cq, r), r as u32))
                .collect();
            want.sort();
            assert_eq!(g.scan_keyed(&codes, &own, 10, 25, None, &admit), want[..25]);
            // Never fewer than k, whatever is kept.
            assert_eq!(g.scan_keyed(&codes, &own, 10, 3, None, &admit), want[..10]);
            // Given a bar, the rows not above it (ties kept), however few.
            let bar = want[6].0;
            let under: Vec<Scored> = want.iter().copied().filter(|s| s.0 <= bar).collect();
            assert_eq!(g.scan_keyed(&codes, &own, 10, 25, Some(bar), &admit), under);
            if metric == Metric::L2 {
                assert_eq!(
                    g.scan_keyed(&codes, &own, 10, 25, None, &admit)[0].1,
                    lonely
                );
            }
            assert!(g.scan_keyed(&codes, &own, 0, 25, None, &admit).is_empty());
            assert!(g
                .scan_keyed(&codes, &own[1..], 10, 25, None, &admit)
                .is_empty());
            assert!(g
                .scan_keyed(&codes, &own, 10, 25, None, &|_| false)
                .is_empty());
        }
    }

    #[test]
    fn a_scan_keeps_the_lowest_rows_among_equal_keys() {
        // Four distinct vectors repeated over 1,000 rows: keys tie in runs across the scan's
        // chunks, and what is kept is the best by key, then row, as a sort gives.
        let (rows, dim) = (1_000usize, 8);
        let mut next = distance::tests::uniform(11);
        let four: Vec<f32> = (0..4 * dim).map(|_| next()).collect();
        let vectors: Vec<f32> = (0..rows)
            .flat_map(|r| four[(r % 4) * dim..(r % 4 + 1) * dim].to_vec())
            .collect();
        let adjacency = Adjacency::from_lists(
            rows,
            (0..rows as u32)
                .map(|r| (r, vec![vec![(r + 1) % rows as u32]]))
                .collect(),
            0,
        );
        let admit = |r: usize| r % 9 != 4;
        for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
            let codes = Codes::build(metric, dim, &vectors, &|_| true);
            let g = FlatGraph::new(adjacency.clone(), metric, dim, vectors.clone().into()).unwrap();
            let q = &four[dim..2 * dim];
            let cq = codes.query(q);
            let mut want: Vec<Scored> = (0..rows)
                .filter(|r| admit(*r))
                .map(|r| Scored(codes.key(metric, &cq, r), r as u32))
                .collect();
            want.sort();
            for keep in [1, 7, 250, 300, 600, 2_000] {
                let got = g.scan_keyed(&codes, q, 1, keep, None, &admit);
                assert_eq!(got, want[..keep.min(want.len())], "{metric:?}, keep {keep}");
            }
        }
    }

    #[test]
    fn a_walk_over_a_complete_graph_is_exact_and_honours_admit() {
        let rows = 40usize;
        let dim = 3;
        let vectors: Vec<f32> = (0..rows * dim).map(|i| ((i * 37) % 101) as f32).collect();
        let nodes = (0..rows as u32)
            .map(|r| (r, vec![(0..rows as u32).filter(|&n| n != r).collect()]))
            .collect();
        let g = FlatGraph::new(
            Adjacency::from_lists(rows, nodes, 0),
            Metric::L2,
            dim,
            ScalarBuffer::from(vectors.clone()),
        )
        .unwrap();
        let q = [10.0, 50.0, 20.0];
        let mut exact: Vec<(f32, usize)> = (0..rows)
            .map(|r| (distance::l2_sq(&q, &vectors[r * dim..(r + 1) * dim]), r))
            .collect();
        exact.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let want: Vec<usize> = exact.iter().take(5).map(|e| e.1).collect();
        assert_eq!(g.search(&q, 5, 10, &|_| true), want);
        let odd: Vec<usize> = exact
            .iter()
            .filter(|e| e.1 % 2 == 1)
            .take(5)
            .map(|e| e.1)
            .collect();
        assert_eq!(g.search(&q, 5, 10, &|r| r % 2 == 1), odd);
        assert!(g.search(&q, 5, 10, &|_| false).is_empty());
        assert!(
            g.search(&[1.0], 5, 10, &|_| true).is_empty(),
            "wrong dimension"
        );
    }
}
