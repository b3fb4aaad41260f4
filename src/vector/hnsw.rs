//! HNSW construction: a graph that takes inserts from several threads at once and searches
//! while it grows, then becomes a generation's flat graph ([`Adjacency`]) without another
//! build.
//!
//! The layout follows hnswlib: each node holds its (transformed) vector and one neighbour list
//! per layer behind its own lock, taken only to copy or replace the list, never while another
//! node's lock is held. Node ids are the caller's (memtable row ordinals or generation rows);
//! an id without a node (a tombstone, a null vector) is never linked. A node's level comes
//! from a hash of its id, so a graph's shape does not depend on an RNG. Neighbours are chosen
//! with the HNSW paper's heuristic (a candidate is kept when it is nearer to the new node than
//! to every neighbour kept so far), both for a new node's lists and when a full list takes
//! one more link. Distances are the shared kernels of [`distance`], one evaluation each (unit
//! vectors for cosine, kept in half precision: see [`Point`]), with no allocation per evaluation: the visited set and the heaps live
//! in a per-thread [`Scratch`].

use super::distance;
use super::graph::{Adjacency, Scored as Near};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// How two graph points are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    /// Unit vectors (or zero): `1 - a·b`.
    UnitDot,
    /// Squared Euclidean distance.
    L2,
}

/// Nodes per lazily allocated segment.
const SEGMENT: usize = 4096;
/// Segments a graph can hold (`SEGMENT * SEGMENTS` ids, about 268 million).
const SEGMENTS: usize = 1 << 16;
/// Highest layer a node can reach.
const MAX_LEVEL: usize = 15;

/// A lazily allocated run of [`SEGMENT`] node slots.
type Segment = Box<[OnceLock<Node>]>;

struct Node {
    vector: Point,
    /// Neighbour lists, one per layer the node is in.
    layers: Box<[Mutex<Vec<u32>>]>,
}

/// A node's point: unit vectors (cosine) are kept in half precision, which halves the bytes
/// each distance reads (a construction's dominant cost) and keeps about three decimal digits
/// of their distances; Euclidean points, which have no bound half precision could keep its
/// precision under, stay in f32.
enum Point {
    Full(Box<[f32]>),
    Half(Box<[half::f16]>),
}

/// A point borrowed: a node's, or a query's (always f32).
#[derive(Clone, Copy)]
enum At<'a> {
    Full(&'a [f32]),
    Half(&'a [half::f16]),
}

impl Point {
    #[inline]
    fn at(&self) -> At<'_> {
        match self {
            Point::Full(v) => At::Full(v),
            Point::Half(v) => At::Half(v),
        }
    }
}

/// Per-thread working memory of inserts and searches: a visited set stamped with an epoch
/// (cleared in O(1) per search) and a neighbour buffer.
#[derive(Default)]
pub(crate) struct Scratch {
    stamps: Vec<u32>,
    epoch: u32,
    links: Vec<u32>,
}

impl Scratch {
    fn start(&mut self, ids: usize) {
        if self.stamps.len() < ids {
            self.stamps.resize(ids, 0);
        }
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.stamps.iter_mut().for_each(|s| *s = 0);
            self.epoch = 1;
        }
    }

    /// Mark `id` visited; true when it already was.
    #[inline]
    fn seen(&mut self, id: u32) -> bool {
        let s = &mut self.stamps[id as usize];
        let was = *s == self.epoch;
        *s = self.epoch;
        was
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

fn lock(m: &Mutex<Vec<u32>>) -> MutexGuard<'_, Vec<u32>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A point in f32, whatever it is kept in.
fn widen(p: At<'_>) -> std::borrow::Cow<'_, [f32]> {
    match p {
        At::Full(v) => std::borrow::Cow::Borrowed(v),
        At::Half(v) => std::borrow::Cow::Owned(v.iter().map(|x| x.to_f32()).collect()),
    }
}

/// A growing HNSW graph (see the module documentation).
pub(crate) struct HnswBuilder {
    dim: usize,
    space: Space,
    /// Neighbours per node in the upper layers, and chosen for a new node in every layer.
    m: usize,
    /// Neighbours per node in layer 0.
    m0: usize,
    ef_construction: usize,
    level_mult: f64,
    segments: Box<[OnceLock<Segment>]>,
    /// The entry node and its level.
    entry: Mutex<Option<(u32, usize)>>,
    /// Held by an insert whose level is above the top level (see [`HnswBuilder::insert`]).
    raising: Mutex<()>,
    /// One past the largest id added.
    bound: AtomicUsize,
    /// Nodes added.
    nodes: AtomicUsize,
}

impl std::fmt::Debug for HnswBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HnswBuilder({} nodes)",
            self.nodes.load(Ordering::Relaxed)
        )
    }
}

impl HnswBuilder {
    /// An empty graph of `dim`-dimensional points: `m` neighbours per node (`2m` in layer 0),
    /// candidate lists of `ef_construction` while inserting.
    pub(crate) fn new(dim: usize, space: Space, m: usize, ef_construction: usize) -> Self {
        Self::with_segments(dim, space, m, ef_construction, SEGMENTS)
    }

    /// As [`HnswBuilder::new`], with room for ids below `segments` × 4,096.
    pub(crate) fn with_segments(
        dim: usize,
        space: Space,
        m: usize,
        ef_construction: usize,
        segments: usize,
    ) -> Self {
        let m = m.max(2);
        HnswBuilder {
            dim,
            space,
            m,
            m0: 2 * m,
            ef_construction: ef_construction.max(m),
            level_mult: 1.0 / (m as f64).ln(),
            segments: (0..segments).map(|_| OnceLock::new()).collect(),
            entry: Mutex::new(None),
            raising: Mutex::new(()),
            bound: AtomicUsize::new(0),
            nodes: AtomicUsize::new(0),
        }
    }

    #[inline]
    fn node(&self, id: u32) -> Option<&Node> {
        let id = id as usize;
        self.segments
            .get(id / SEGMENT)?
            .get()?
            .get(id % SEGMENT)?
            .get()
    }

    /// Whether points are kept in half precision (see [`Point`]).
    fn half(&self) -> bool {
        self.space == Space::UnitDot && self.dim >= distance::HALF_MIN_DIM
    }

    #[inline]
    fn dist(&self, a: At<'_>, b: At<'_>) -> f32 {
        match (self.space, a, b) {
            (Space::UnitDot, At::Half(a), At::Half(b)) => 1.0 - distance::dot_halves(a, b),
            (Space::UnitDot, At::Full(a), At::Half(b))
            | (Space::UnitDot, At::Half(b), At::Full(a)) => 1.0 - distance::dot_half(a, b),
            (Space::UnitDot, At::Full(a), At::Full(b)) => 1.0 - distance::dot(a, b),
            (Space::L2, At::Full(a), At::Full(b)) => distance::l2_sq(a, b),
            // Euclidean points are never kept in half precision; for completeness:
            (Space::L2, a, b) => {
                let (a, b) = (widen(a), widen(b));
                distance::l2_sq(&a, &b)
            }
        }
    }

    /// The level of node `id`: `floor(-ln(u) / ln(m))` for `u` uniform in (0, 1] drawn from
    /// a hash of the id.
    fn level_of(&self, id: u32) -> usize {
        let mut z = u64::from(id).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let u = ((z >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        ((-u.ln() * self.level_mult) as usize).min(MAX_LEVEL)
    }

    /// Add point `id` with `vector` (already transformed for the graph's space), not yet
    /// linked: [`HnswBuilder::insert`] links it. False when the id is beyond the graph's
    /// capacity, has a node already, or the vector has the wrong dimension.
    pub(crate) fn add(&self, id: u32, vector: Vec<f32>) -> bool {
        let layers = (0..=self.level_of(id))
            .map(|l| {
                Mutex::new(Vec::with_capacity(
                    if l == 0 { self.m0 } else { self.m } + 1,
                ))
            })
            .collect();
        self.put(id, vector, layers)
    }

    /// Add point `id` already linked: `lists[l]` are its neighbours in layer `l` (it is in
    /// layers `0..lists.len()`), as in a graph this one continues. False as for
    /// [`HnswBuilder::add`].
    pub(crate) fn add_linked(&self, id: u32, vector: Vec<f32>, lists: Vec<Vec<u32>>) -> bool {
        let mut lists = lists;
        lists.truncate(MAX_LEVEL + 1);
        if lists.is_empty() {
            lists.push(Vec::new());
        }
        let layers = lists
            .into_iter()
            .enumerate()
            .map(|(l, mut v)| {
                v.truncate(if l == 0 { self.m0 } else { self.m });
                Mutex::new(v)
            })
            .collect();
        self.put(id, vector, layers)
    }

    /// Store node `id` with `vector` and its neighbour lists; false as for
    /// [`HnswBuilder::add`].
    fn put(&self, id: u32, vector: Vec<f32>, layers: Box<[Mutex<Vec<u32>>]>) -> bool {
        let i = id as usize;
        if vector.len() != self.dim {
            return false;
        }
        let vector = if self.half() {
            Point::Half(vector.iter().map(|x| half::f16::from_f32(*x)).collect())
        } else {
            Point::Full(vector.into_boxed_slice())
        };
        let Some(segment) = self.segments.get(i / SEGMENT) else {
            return false;
        };
        let segment = segment.get_or_init(|| (0..SEGMENT).map(|_| OnceLock::new()).collect());
        let added = segment[i % SEGMENT].set(Node { vector, layers }).is_ok();
        if added {
            self.bound.fetch_max(i + 1, Ordering::AcqRel);
            self.nodes.fetch_add(1, Ordering::AcqRel);
        }
        added
    }

    /// Make node `id` (added before) the entry, at its level.
    pub(crate) fn set_entry(&self, id: u32) {
        if let Some(node) = self.node(id) {
            *self.entry.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((id, node.layers.len() - 1));
        }
    }

    /// One past the largest id the graph has room for.
    pub(crate) fn capacity(&self) -> usize {
        self.segments.len() * SEGMENT
    }

    /// Copy node `id`'s neighbours in `layer` into `out`.
    #[inline]
    fn links_into(&self, id: u32, layer: usize, out: &mut Vec<u32>) {
        out.clear();
        if let Some(l) = self.node(id).and_then(|n| n.layers.get(layer)) {
            out.extend_from_slice(&lock(l));
        }
    }

    /// Greedy descent from `(d, ep)` through layers `top` down to `bottom + 1`.
    fn descend(
        &self,
        q: At<'_>,
        mut best: Near,
        top: usize,
        bottom: usize,
        scratch: &mut Scratch,
    ) -> Near {
        let mut links = std::mem::take(&mut scratch.links);
        for layer in (bottom + 1..=top).rev() {
            loop {
                let mut moved = false;
                self.links_into(best.1, layer, &mut links);
                for &n in &links {
                    if let Some(node) = self.node(n) {
                        let d = self.dist(q, node.vector.at());
                        if d < best.0 {
                            best = Near(d, n);
                            moved = true;
                        }
                    }
                }
                if !moved {
                    break;
                }
            }
        }
        scratch.links = links;
        best
    }

    /// A beam search of `layer` from `entries` with candidate list `ef`: up to `ef` nodes that
    /// `admit` accepts, nearest first. The walk goes through rejected nodes too.
    fn search_layer(
        &self,
        q: At<'_>,
        entries: &[Near],
        ef: usize,
        layer: usize,
        scratch: &mut Scratch,
        admit: &dyn Fn(u32) -> bool,
    ) -> Vec<Near> {
        scratch.start(self.bound.load(Ordering::Acquire));
        let mut links = std::mem::take(&mut scratch.links);
        let mut frontier: BinaryHeap<Reverse<Near>> = BinaryHeap::with_capacity(ef * 2);
        let mut found: BinaryHeap<Near> = BinaryHeap::with_capacity(ef + 1);
        for e in entries {
            if scratch.seen(e.1) {
                continue;
            }
            frontier.push(Reverse(*e));
            if admit(e.1) {
                found.push(*e);
                if found.len() > ef {
                    found.pop();
                }
            }
        }
        while let Some(Reverse(c)) = frontier.pop() {
            if found.len() >= ef && found.peek().is_some_and(|w| c.0 > w.0) {
                break;
            }
            self.links_into(c.1, layer, &mut links);
            // The neighbours not yet seen, their vectors fetched into the caches together.
            let mut unseen = 0;
            for i in 0..links.len() {
                let n = links[i];
                if (n as usize) >= scratch.stamps.len() || scratch.seen(n) {
                    continue;
                }
                if let Some(node) = self.node(n) {
                    match node.vector.at() {
                        At::Full(v) => distance::prefetch(v),
                        At::Half(v) => distance::prefetch(v),
                    }
                    links[unseen] = n;
                    unseen += 1;
                }
            }
            for &n in &links[..unseen] {
                let Some(node) = self.node(n) else { continue };
                let d = self.dist(q, node.vector.at());
                let bound = if found.len() >= ef {
                    found.peek().map_or(f32::INFINITY, |w| w.0)
                } else {
                    f32::INFINITY
                };
                if d < bound {
                    frontier.push(Reverse(Near(d, n)));
                    if admit(n) {
                        found.push(Near(d, n));
                        if found.len() > ef {
                            found.pop();
                        }
                    }
                }
            }
        }
        scratch.links = links;
        found.into_sorted_vec()
    }

    /// The HNSW heuristic: from `candidates` (nearest first to some point p), keep each one
    /// nearer to p than to every one kept before it, up to `max`.
    fn select(&self, candidates: &[Near], max: usize) -> Vec<Near> {
        let mut kept: Vec<(Near, At<'_>)> = Vec::with_capacity(max);
        for c in candidates {
            if kept.len() >= max {
                break;
            }
            let Some(node) = self.node(c.1) else { continue };
            let v = node.vector.at();
            // Kept on a tie (as hnswlib does): with `>`, a duplicate of a kept node would
            // shut out every later candidate, since both are equally far from each.
            if kept.iter().all(|(_, s)| self.dist(v, *s) >= c.0) {
                kept.push((*c, v));
            }
        }
        kept.into_iter().map(|(n, _)| n).collect()
    }

    /// Link `from` to `to` (at distance `d`) in `layer`, shrinking `from`'s list with the
    /// heuristic when it is full.
    fn link(&self, from: u32, to: u32, d: f32, layer: usize) {
        let Some(node) = self.node(from) else { return };
        let Some(list) = node.layers.get(layer) else {
            return;
        };
        let max = if layer == 0 { self.m0 } else { self.m };
        let mut l = lock(list);
        if l.contains(&to) {
            return;
        }
        if l.len() < max {
            l.push(to);
            return;
        }
        let mut candidates: Vec<Near> = l
            .iter()
            .filter_map(|n| {
                self.node(*n)
                    .map(|x| Near(self.dist(node.vector.at(), x.vector.at()), *n))
            })
            .collect();
        candidates.push(Near(d, to));
        candidates.sort_unstable();
        let kept = self.select(&candidates, max);
        l.clear();
        l.extend(kept.iter().map(|n| n.1));
    }

    /// Link node `id` (added with [`HnswBuilder::add`]) into the graph. Several threads may
    /// insert at once, and searches may run meanwhile.
    pub(crate) fn insert(&self, id: u32, scratch: &mut Scratch) {
        let Some(node) = self.node(id) else { return };
        let level = node.layers.len() - 1;
        let q = node.vector.at();
        let read_entry = || {
            let mut e = self.entry.lock().unwrap_or_else(|e| e.into_inner());
            match *e {
                Some(entry) => Some(entry),
                None => {
                    *e = Some((id, level));
                    None
                }
            }
        };
        let Some((mut ep, mut top)) = read_entry() else {
            return;
        };
        // An insert that raises the top level runs alone among such inserts (as in hnswlib):
        // two at once would each link only up to the old top and one would become the entry
        // unlinked in the layers above it. It reads the entry again once it holds the lock.
        let _raising = if level > top {
            let guard = self.raising.lock().unwrap_or_else(|e| e.into_inner());
            match read_entry() {
                Some(entry) => (ep, top) = entry,
                None => return,
            }
            Some(guard)
        } else {
            None
        };
        let Some(ep_node) = self.node(ep) else { return };
        let start = Near(self.dist(q, ep_node.vector.at()), ep);
        let mut entries = vec![self.descend(q, start, top, level, scratch)];
        for layer in (0..=level.min(top)).rev() {
            let found =
                self.search_layer(q, &entries, self.ef_construction, layer, scratch, &|n| {
                    n != id
                });
            let chosen = self.select(&found, self.m);
            {
                // Links other inserts already added to this node (they found it through a
                // layer above) are kept while there is room.
                let max = if layer == 0 { self.m0 } else { self.m };
                let mut l = lock(&node.layers[layer]);
                let earlier: Vec<u32> = l.drain(..).collect();
                l.extend(chosen.iter().map(|n| n.1));
                for x in earlier {
                    if l.len() >= max {
                        break;
                    }
                    if !l.contains(&x) {
                        l.push(x);
                    }
                }
            }
            for n in &chosen {
                self.link(n.1, id, n.0, layer);
            }
            if !found.is_empty() {
                entries = found;
            }
        }
        if level > top {
            let mut e = self.entry.lock().unwrap_or_else(|e| e.into_inner());
            if e.is_none_or(|(_, t)| level > t) {
                *e = Some((id, level));
            }
        }
    }

    /// Insert `ids` (each added before) with one thread per core.
    pub(crate) fn insert_all(&self, ids: &[u32]) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.insert_with(ids, cores);
    }

    /// Insert `ids` (each added before) with up to `threads` threads. Raisable background work
    /// (a compaction) that is raised while it inserts goes on with one thread per core.
    pub(crate) fn insert_with(&self, ids: &[u32], threads: usize) {
        let threads = threads.min(ids.len().div_ceil(64)).max(1);
        let next = AtomicUsize::new(0);
        let work = || {
            SCRATCH.with_borrow_mut(|scratch| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(i) else { return };
                self.insert(*id, scratch);
            })
        };
        // Threads doing raisable background work start threads that do it too; those beyond
        // `threads` wait for the raise.
        let lower = crate::priority::current();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let waiting = match &lower {
            Some(_) if ids.len() > 64 => cores.saturating_sub(threads),
            _ => 0,
        };
        if threads == 1 && waiting == 0 {
            work();
            return;
        }
        // Working threads still at it: a waiting thread also stops once none is (all ids taken,
        // or a worker panicked).
        let active = AtomicUsize::new(threads);
        struct Leaving<'a>(&'a AtomicUsize);
        impl Drop for Leaving<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let done =
            || next.load(Ordering::Relaxed) >= ids.len() || active.load(Ordering::Acquire) == 0;
        let active = &active;
        std::thread::scope(|s| {
            for t in 1..threads + waiting {
                let lower = lower.clone();
                s.spawn(move || {
                    let waits = t >= threads;
                    let _leaving = (!waits).then(|| Leaving(active));
                    if waits && !lower.as_ref().is_some_and(|w| w.wait_raised(done)) {
                        return;
                    }
                    let _entered = lower.as_ref().map(|w| w.enter());
                    work()
                });
            }
            let _leaving = Leaving(active);
            work();
        });
    }

    /// Up to `k` nodes near `q` (transformed as the points were) that `admit` accepts, nearest
    /// first, from a walk with candidate list `max(ef, k)`; with points in half precision, the
    /// whole list (nearest first by half-precision distances), for the caller to re-score: its
    /// top k by exact distances may differ at near-ties.
    pub(crate) fn search(
        &self,
        q: &[f32],
        k: usize,
        ef: usize,
        admit: &dyn Fn(u32) -> bool,
    ) -> Vec<u32> {
        if k == 0 || q.len() != self.dim {
            return Vec::new();
        }
        let Some((ep, top)) = *self.entry.lock().unwrap_or_else(|e| e.into_inner()) else {
            return Vec::new();
        };
        let Some(ep_node) = self.node(ep) else {
            return Vec::new();
        };
        let q = At::Full(q);
        SCRATCH.with_borrow_mut(|scratch| {
            let start = Near(self.dist(q, ep_node.vector.at()), ep);
            let entry = self.descend(q, start, top, 0, scratch);
            let mut found = self.search_layer(q, &[entry], ef.max(k), 0, scratch, admit);
            if !self.half() {
                found.truncate(k);
            }
            found.into_iter().map(|n| n.1).collect()
        })
    }

    /// Node `id`'s neighbours in `layer` that `map` keeps, mapped. A dropped neighbour is
    /// replaced by its own kept neighbours, nearest first, while the list has room: a node
    /// whose neighbours were all dropped is not cut off.
    fn kept_links(
        &self,
        id: u32,
        node: &Node,
        layer: usize,
        map: &dyn Fn(u32) -> Option<u32>,
    ) -> Vec<u32> {
        let links = lock(&node.layers[layer]).clone();
        let mut kept: Vec<u32> = Vec::with_capacity(links.len());
        let mut replacements: Vec<u32> = Vec::new();
        let mut buf = Vec::new();
        // Dropped neighbours are walked through (breadth first, a bounded number of them) to
        // the kept nodes behind them: chains of versions of one key are common.
        let mut through: Vec<u32> = Vec::new();
        for n in &links {
            if map(*n).is_some() {
                kept.push(*n);
            } else {
                through.push(*n);
            }
        }
        let limit = 4 * links.len().max(1);
        let mut walked = 0;
        let mut visited: Vec<u32> = through.clone();
        while let Some(n) = (walked < through.len() && walked < limit).then(|| through[walked]) {
            walked += 1;
            self.links_into(n, layer, &mut buf);
            for x in &buf {
                if *x == id || visited.contains(x) {
                    continue;
                }
                visited.push(*x);
                if map(*x).is_some() {
                    replacements.push(*x);
                } else {
                    through.push(*x);
                }
            }
        }
        let max = if layer == 0 { self.m0 } else { self.m };
        if !replacements.is_empty() && kept.len() < max {
            replacements.sort_unstable();
            replacements.dedup();
            replacements.retain(|x| !kept.contains(x));
            let mut near: Vec<Near> = replacements
                .into_iter()
                .filter_map(|x| {
                    self.node(x)
                        .map(|v| Near(self.dist(node.vector.at(), v.vector.at()), x))
                })
                .collect();
            near.sort_unstable();
            kept.extend(near.into_iter().take(max - kept.len()).map(|n| n.1));
        }
        kept.into_iter().filter_map(map).collect()
    }

    /// The graph as a generation's flat graph over `rows` rows: node `id` becomes row
    /// `map(id)`, nodes and links that `map` drops are left out, and the entry is the kept
    /// node of the highest level (the current entry when it is kept).
    pub(crate) fn to_adjacency(
        &self,
        rows: usize,
        ids: impl Iterator<Item = u32>,
        map: &dyn Fn(u32) -> Option<u32>,
    ) -> Adjacency {
        let entry = *self.entry.lock().unwrap_or_else(|e| e.into_inner());
        let mut nodes = Vec::new();
        // The kept node of the highest level, the current entry first among equals.
        let mut best: Option<((usize, bool), u32)> = None;
        for id in ids {
            let (Some(node), Some(row)) = (self.node(id), map(id)) else {
                continue;
            };
            let lists: Vec<Vec<u32>> = (0..node.layers.len())
                .map(|layer| self.kept_links(id, node, layer, map))
                .collect();
            let rank = (lists.len(), entry.is_some_and(|(e, _)| e == id));
            if best.is_none_or(|(b, _)| rank > b) {
                best = Some((rank, row));
            }
            nodes.push((row, lists));
        }
        Adjacency::from_lists(rows, nodes, best.map_or(0, |(_, r)| r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(n: usize, dim: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut s = seed;
        let mut next = || {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        (0..n).map(|_| (0..dim).map(|_| next()).collect()).collect()
    }

    /// A flat l2 graph of `dim`-d rows over `adjacency`.
    fn flat_l2(adjacency: Adjacency, dim: usize, rows: Vec<f32>) -> super::super::graph::FlatGraph {
        super::super::graph::FlatGraph::new(adjacency, crate::schema::Metric::L2, dim, rows.into())
            .unwrap()
    }

    fn exact(data: &[Vec<f32>], q: &[f32], k: usize, keep: &dyn Fn(u32) -> bool) -> Vec<u32> {
        let mut d: Vec<Near> = (0..data.len() as u32)
            .filter(|i| keep(*i))
            .map(|i| Near(distance::l2_sq(q, &data[i as usize]), i))
            .collect();
        d.sort_unstable();
        d.into_iter().take(k).map(|n| n.1).collect()
    }

    fn recall(got: &[u32], want: &[u32]) -> f64 {
        got.iter().filter(|g| want.contains(g)).count() as f64 / want.len() as f64
    }

    #[test]
    fn concurrent_inserts_find_the_true_neighbours() {
        let data = points(3000, 24, 1);
        let g = HnswBuilder::new(24, Space::L2, 16, 100);
        let ids: Vec<u32> = (0..data.len() as u32).collect();
        for (i, v) in data.iter().enumerate() {
            assert!(g.add(i as u32, v.clone()));
        }
        assert!(!g.add(0, data[0].clone()), "a node is added once");
        g.insert_all(&ids);
        let mut total = 0.0;
        for q in points(50, 24, 2) {
            total += recall(
                &g.search(&q, 10, 64, &|_| true),
                &exact(&data, &q, 10, &|_| true),
            );
        }
        assert!(total / 50.0 >= 0.95, "recall@10 {}", total / 50.0);
    }

    #[test]
    fn a_build_raised_midway_inserts_every_node_once_on_more_threads() {
        // Cosine points (kept in half precision), inserted by raisable background work on one
        // thread, raised while it inserts: the waiting threads join, and the graph is as good.
        let data: Vec<Vec<f32>> = points(3000, 48, 3)
            .into_iter()
            .map(|v| {
                let n = distance::dot(&v, &v).sqrt();
                v.iter().map(|x| x / n).collect()
            })
            .collect();
        let g = std::sync::Arc::new(HnswBuilder::new(48, Space::UnitDot, 16, 100));
        assert!(g.half());
        for (i, v) in data.iter().enumerate() {
            assert!(g.add(i as u32, v.clone()));
        }
        let work = std::sync::Arc::new(crate::priority::Raisable::default());
        let (w, b) = (work.clone(), g.clone());
        let build = std::thread::spawn(move || {
            let _in = w.enter();
            let ids: Vec<u32> = (0..3000).collect();
            b.insert_with(&ids, 1);
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        work.raise();
        build.join().unwrap();
        let mut total = 0.0;
        // The caller's exact re-scoring of the list a half-precision walk returns.
        let top = |q: &[f32], rows: &mut dyn Iterator<Item = u32>| -> Vec<u32> {
            let mut all: Vec<Near> = rows
                .map(|i| Near(1.0 - distance::dot(q, &data[i as usize]), i))
                .collect();
            all.sort_unstable();
            all.iter().take(10).map(|n| n.1).collect()
        };
        for q in points(50, 48, 4) {
            let want = top(&q, &mut (0..data.len() as u32));
            let got = g.search(&q, 10, 64, &|_| true);
            assert_eq!(got.len(), 64, "the whole list, for the caller to re-score");
            total += recall(&top(&q, &mut got.into_iter()), &want);
        }
        assert!(total / 50.0 >= 0.95, "recall@10 {}", total / 50.0);
        assert_eq!(g.nodes.load(Ordering::Relaxed), 3000);
    }

    #[test]
    fn a_graph_without_dropped_nodes_still_finds_the_kept_ones() {
        let data = points(3000, 24, 3);
        let g = HnswBuilder::new(24, Space::L2, 16, 100);
        let ids: Vec<u32> = (0..data.len() as u32).collect();
        for (i, v) in data.iter().enumerate() {
            g.add(i as u32, v.clone());
        }
        g.insert_all(&ids);
        // Every third node is dropped; kept node i becomes row i - i / 3 - 1.
        let kept: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|i| !i.is_multiple_of(3))
            .collect();
        let map = |id: u32| (!id.is_multiple_of(3)).then(|| id - id / 3 - 1);
        let adjacency = g.to_adjacency(kept.len(), kept.iter().copied(), &map);
        assert_eq!(adjacency.nodes(), kept.len());
        let rows: Vec<f32> = kept
            .iter()
            .flat_map(|i| data[*i as usize].clone())
            .collect();
        let flat = flat_l2(adjacency, 24, rows);
        let mut total = 0.0;
        for q in points(50, 24, 4) {
            let got: Vec<u32> = flat
                .search(&q, 10, 64, &|_| true)
                .into_iter()
                .map(|r| r as u32)
                .collect();
            let want: Vec<u32> = exact(&data, &q, 10, &|i| !i.is_multiple_of(3))
                .into_iter()
                .map(|i| map(i).unwrap())
                .collect();
            total += recall(&got, &want);
        }
        assert!(total / 50.0 >= 0.9, "recall@10 {}", total / 50.0);
    }

    #[test]
    fn updates_with_unchanged_vectors_leave_every_newest_version_reachable() {
        // Rows 0..1500; every tenth row was upserted with an unchanged vector (only its text
        // changed): ids 0..1500 are first versions, ids 1500..1650 the second versions of rows
        // 0, 10, 20, ..., and the flush drops the first versions of those rows (under the
        // drop rate up to which a flush converts the memtable's graph).
        let base = points(1500, 16, 7);
        let g = HnswBuilder::new(16, Space::L2, 8, 64);
        let ids: Vec<u32> = (0..1650).collect();
        let row_of = |id: u32| if id < 1500 { id } else { (id - 1500) * 10 };
        for id in &ids {
            g.add(*id, base[row_of(*id) as usize].clone());
        }
        g.insert_all(&ids);
        let map = |id: u32| (id >= 1500 || !id.is_multiple_of(10)).then(|| row_of(id));
        let kept: Vec<u32> = ids.iter().copied().filter(|i| map(*i).is_some()).collect();
        let adjacency = g.to_adjacency(1500, kept.iter().copied(), &map);
        let rows: Vec<f32> = base.iter().flatten().copied().collect();
        let flat = flat_l2(adjacency, 16, rows);
        // A graph built over the kept rows alone is the yardstick.
        let fresh = HnswBuilder::new(16, Space::L2, 8, 64);
        let rows_ids: Vec<u32> = (0..1500).collect();
        for id in &rows_ids {
            fresh.add(*id, base[*id as usize].clone());
        }
        fresh.insert_all(&rows_ids);
        let fresh = flat_l2(
            fresh.to_adjacency(1500, rows_ids.iter().copied(), &Some),
            16,
            base.iter().flatten().copied().collect(),
        );
        let finds = |g: &super::super::graph::FlatGraph| {
            (0..1500)
                .filter(|row| g.search(&base[*row], 1, 32, &|_| true) == [*row])
                .count()
        };
        let (converted, yardstick) = (finds(&flat), finds(&fresh));
        assert!(
            converted + 75 >= yardstick,
            "{converted} of 1,500 rows find themselves in the converted graph, {yardstick} in a fresh one"
        );
    }

    #[test]
    fn searches_run_while_inserts_go_on() {
        let data = points(4000, 16, 5);
        let g = HnswBuilder::new(16, Space::L2, 8, 64);
        for (i, v) in data.iter().enumerate() {
            g.add(i as u32, v.clone());
        }
        let ids: Vec<u32> = (0..data.len() as u32).collect();
        std::thread::scope(|s| {
            s.spawn(|| g.insert_all(&ids));
            for q in points(200, 16, 6) {
                let got = g.search(&q, 10, 32, &|_| true);
                assert!(got.len() <= 10);
                assert!(got.iter().all(|i| (*i as usize) < data.len()));
            }
        });
    }
}
