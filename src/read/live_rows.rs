//! Live rows: which rows of a source a read sees.
//!
//! A row is *live* when it is the newest version of its key in its source, not a tombstone, and
//! its key is in no strictly newer source. A source's [`LiveRows`] are its own flags (shared,
//! never copied per query) less a short sorted list of the rows newer memtables supersede:
//!
//! - A memtable flags its rows as it applies them (see [`crate::memtable`]).
//! - What newer generations supersede of a generation only changes when the list of
//!   generations does: it is computed for a whole list in one merge of the generations'
//!   sorted key hashes (O(rows × log generations), holding nothing as large as the rows), and
//!   extended when a flush adds a generation on top by searching each older generation's
//!   sorted hashes for the new rows' (O(new rows × generations × log)).
//! - What a memtable's rows supersede of an older source (a generation, or an older frozen
//!   memtable) only grows as rows are appended: each memtable row is looked up in each older
//!   source once.
//!
//! A handle keeps all three in its [`LiveRowCache`], so a query's live rows cost O(sources +
//! rows newer memtables supersede), whatever the rows of the sources.

use super::source::{key_of, MemtableSource, Source, SourceKey};
use crate::flags::RowFlags;
use crate::generation::by_hash::{self, HashIndex};
use crate::generation::{Generation, HashIsKey};
use crate::key::Key;
use crate::memtable::MemtableView;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};

/// The live rows of one source: its own flags less the rows newer memtables supersede.
#[derive(Debug, Clone)]
pub(crate) struct LiveRows {
    /// Per row: live in its source, and (a generation) among newer generations.
    own: RowFlags,
    /// Rows `own` flags that newer memtables supersede.
    superseded: Arc<Superseded>,
    count: usize,
}

/// Rows superseded besides a source's own flags, ascending, with a sieve that answers "no" for
/// most rows without searching.
#[derive(Debug, Default)]
pub(crate) struct Superseded {
    rows: Vec<u32>,
    /// Bit `r % bits` set for every superseded row `r`, with at least eight bits per row (a
    /// power of two): a row not superseded finds its bit clear seven times in eight or more.
    sieve: Vec<u64>,
}

/// Bits of [`Superseded`]'s sieve at least.
const SIEVE_BITS: usize = 4096;

impl Superseded {
    /// `rows`, ascending and distinct.
    fn new(rows: Vec<u32>) -> Superseded {
        debug_assert!(rows.windows(2).all(|w| w[0] < w[1]));
        let bits = if rows.is_empty() {
            0
        } else {
            (rows.len() * 8).next_power_of_two().max(SIEVE_BITS)
        };
        let mut sieve = vec![0u64; bits / 64];
        for r in &rows {
            let b = *r as usize & (bits - 1);
            sieve[b / 64] |= 1 << (b % 64);
        }
        Superseded { rows, sieve }
    }

    #[inline]
    fn contains(&self, r: usize) -> bool {
        if self.rows.is_empty() {
            return false;
        }
        let b = r & (self.sieve.len() * 64 - 1);
        self.sieve[b / 64] & (1 << (b % 64)) != 0 && self.rows.binary_search(&(r as u32)).is_ok()
    }

    /// The superseded rows, ascending.
    pub(crate) fn rows(&self) -> &[u32] {
        &self.rows
    }
}

impl LiveRows {
    /// The rows `own` flags, less `superseded` (any order, repeats allowed).
    pub(crate) fn new(own: RowFlags, mut superseded: Vec<u32>) -> LiveRows {
        superseded.retain(|r| own.get(*r as usize));
        superseded.sort_unstable();
        superseded.dedup();
        LiveRows {
            count: own.count() - superseded.len(),
            superseded: Arc::new(Superseded::new(superseded)),
            own,
        }
    }

    /// The rows `flags` says are live.
    #[cfg(test)]
    pub(crate) fn from_vec(flags: Vec<bool>) -> LiveRows {
        LiveRows::new(RowFlags::from_vec(flags), Vec::new())
    }

    /// Whether row `r` is live.
    #[inline]
    pub(crate) fn admits(&self, r: usize) -> bool {
        self.own.get(r) && !self.superseded.contains(r)
    }

    /// Live rows.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Rows of the source (live or not).
    pub(crate) fn len(&self) -> usize {
        self.own.len()
    }

    /// The live rows, ascending.
    pub(crate) fn rows(&self) -> impl Iterator<Item = usize> + '_ {
        self.rows_from(0)
    }

    /// The live rows from row `from` on, ascending.
    pub(crate) fn rows_from(&self, from: usize) -> impl Iterator<Item = usize> + '_ {
        self.own
            .iter_set_from(from)
            .filter(move |r| !self.superseded.contains(*r))
    }

    /// The live rows `filter` (per row of the source) admits too.
    pub(crate) fn and(&self, filter: &[bool]) -> LiveRows {
        let mut flags = self.own.to_vec();
        for (m, f) in flags.iter_mut().zip(filter) {
            *m &= *f;
        }
        if let Some(past) = flags.get_mut(filter.len()..) {
            past.fill(false);
        }
        for r in self.superseded.rows() {
            flags[*r as usize] = false;
        }
        LiveRows::new(RowFlags::from_vec(flags), Vec::new())
    }

    /// The source's own flags.
    pub(crate) fn own(&self) -> &RowFlags {
        &self.own
    }

    /// The rows the own flags admit that newer memtables supersede.
    pub(crate) fn superseded(&self) -> &Arc<Superseded> {
        &self.superseded
    }
}

/// What newer generations supersede of every generation of one list, from one merge of their
/// sorted key hashes.
#[derive(Debug, Clone)]
struct ListLiveRows {
    /// `(id, epoch)` of the generations, oldest first.
    ids: Vec<(u64, u64)>,
    /// Per generation, oldest first: per row, neither a tombstone nor superseded by a newer
    /// generation.
    live: Vec<RowFlags>,
}

/// Lists of generations whose live rows a handle keeps, the most recently computed: the list
/// queries see, the one a flush or a compaction is about to make visible, and older ones
/// queries of an older snapshot may still ask for. Their flags share the chunks that did not
/// change between them.
const KEPT_LISTS: usize = 4;

/// Per row of `g`: not a tombstone.
fn not_deleted(g: &Generation) -> Vec<bool> {
    let deleted = g.deleted();
    (0..g.num_rows()).map(|r| !deleted.value(r)).collect()
}

/// Clears, in `older` (whose flags are `flags`), the rows holding hash `i` of `older`'s
/// hashes whose key a row of `newer` holding hash `j` of its hashes has.
fn clear_same_keys(
    newer: &Generation,
    j: usize,
    older: &Generation,
    i: usize,
    mut clear: impl FnMut(usize),
) {
    let newer_keys: Vec<Option<Key>> = newer.by_hash().rows(j).map(|r| newer.key_at(r)).collect();
    for r in older.by_hash().rows(i) {
        if newer_keys.contains(&older.key_at(r)) {
            clear(r);
        }
    }
}

impl ListLiveRows {
    /// The live rows of `gens` (oldest first), from one merge of their sorted key hashes:
    /// O(rows × log generations), holding nothing as large as the rows.
    fn build(gens: &[&Arc<Generation>]) -> ListLiveRows {
        let mut live: Vec<Vec<bool>> = gens.iter().map(|g| not_deleted(g)).collect();
        let indexes: Vec<&HashIndex> = gens.iter().map(|g| g.by_hash()).collect();
        let mut seen: Vec<Option<Key>> = Vec::new();
        by_hash::merge(&indexes, |group| {
            // Holders oldest first: a row is superseded when a newer holder has its key.
            seen.clear();
            for &(pos, i) in group.iter().rev() {
                let g = gens[pos];
                for r in g.by_hash().rows(i) {
                    let key = g.key_at(r);
                    match seen.contains(&key) {
                        true => live[pos][r] = false,
                        false => seen.push(key),
                    }
                }
            }
        });
        ListLiveRows {
            ids: gens.iter().map(|g| key_of(g)).collect(),
            live: live.into_iter().map(RowFlags::from_vec).collect(),
        }
    }

    /// The list extended with `added` generations (newer than every generation of this list,
    /// oldest first, `all` being the whole new list): each of their rows supersedes the
    /// versions older generations hold, found by searching their sorted key hashes: O(new rows
    /// × generations × log). Flag chunks the new rows leave alone are shared with this list.
    fn extend(&self, all: &[&Arc<Generation>], added: usize) -> ListLiveRows {
        let mut live = self.live.clone();
        let first = all.len() - added;
        for pos in first..all.len() {
            let g = all[pos];
            live.push(RowFlags::from_vec(not_deleted(g)));
            for (o, older) in all[..pos].iter().enumerate() {
                let flags = &mut live[o];
                by_hash::for_each_common(g.by_hash(), older.by_hash(), |j, i| {
                    clear_same_keys(g, j, older, i, |r| {
                        flags.clear(r);
                    })
                });
            }
        }
        ListLiveRows {
            ids: all.iter().map(|g| key_of(g)).collect(),
            live,
        }
    }
}

/// Memtable rows checked against one older source, and `(older row, memtable row)` pairs.
type Pairs = Arc<Mutex<(usize, Vec<(u32, u32)>)>>;

/// The rows of older sources one memtable's keys supersede, kept up to date incrementally: each
/// memtable row is looked up in each older source once, not once per query.
#[derive(Debug, Default)]
struct Superseding {
    /// Per older source (and its rows): memtable rows checked so far, and `(older row,
    /// memtable row)` for each superseded row of the older source. Kept while the memtable is (a
    /// source a compaction replaced leaves its few pairs until then).
    per_source: Mutex<HashMap<(SourceKey, usize), Pairs>>,
}

/// The key → live row lookup of a memtable older than another (a frozen memtable: its rows no
/// longer change), built once per handle.
#[derive(Debug)]
struct MemKeys {
    /// Key hash → the first live row with it.
    first: HashMap<u64, u32, BuildHasherDefault<HashIsKey>>,
}

/// A source newer memtables may supersede rows of, with its key lookup.
enum Older<'a> {
    Generation(&'a Generation),
    /// A memtable source, its live rows and their key lookup.
    Memtable(&'a Source, &'a RowFlags, Arc<MemKeys>),
}

impl Older<'_> {
    fn key(&self) -> (SourceKey, usize) {
        match self {
            Older::Generation(g) => {
                let (id, epoch) = key_of(g);
                (SourceKey::Generation(id, epoch), g.num_rows())
            }
            Older::Memtable(s, _, _) => (SourceKey::of(s), s.rows()),
        }
    }

    /// The live row holding `key` (whose hash is `hash`), if any; `key` is only computed on a
    /// hash hit, and a hit is confirmed on the exact key.
    fn row_of_key(&self, hash: u64, key: impl FnOnce() -> Option<Key>) -> Option<usize> {
        match self {
            Older::Generation(g) => g.row_of_key(hash, key),
            Older::Memtable(s, live, keys) => {
                let first = *keys.first.get(&hash)? as usize;
                let key = key();
                if s.key_at(first) == key {
                    return Some(first);
                }
                // Two live keys share the hash (the map keeps the first): look further.
                live.iter_set()
                    .filter(|r| *r > first)
                    .find(|r| s.row_hash(*r) == hash && s.key_at(*r) == key)
            }
        }
    }
}

/// The live rows a handle keeps between queries (a cache: anything dropped is recomputed).
#[derive(Default)]
pub(crate) struct LiveRowCache {
    /// What newer generations supersede of each generation, for the lists last computed (most
    /// recent first).
    lists: Mutex<Vec<ListLiveRows>>,
    /// Per memtable id: what its rows supersede of each older source.
    memtables: Mutex<HashMap<u64, Arc<Superseding>>>,
    /// Per memtable (and its rows) newer ones supersede rows of: its key lookup.
    keys: Mutex<HashMap<(SourceKey, usize), Arc<MemKeys>>>,
    /// Lists computed from scratch.
    #[cfg(test)]
    builds: std::sync::atomic::AtomicUsize,
    /// Called where a list is computed ahead without the lock: what a test checks there.
    #[cfg(test)]
    pub(super) computing: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

impl std::fmt::Debug for LiveRowCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveRowCache")
            .field("lists", &lock(&self.lists).len())
            .field("memtables", &lock(&self.memtables).len())
            .finish_non_exhaustive()
    }
}

impl LiveRowCache {
    /// Drop what is kept for memtables and sources `sources` does not hold (flushed memtables,
    /// generations no longer listed).
    pub(crate) fn retain(&self, sources: &[Source]) {
        let mems: HashSet<u64> = sources
            .iter()
            .filter_map(|s| match s {
                Source::Memtable(m) => Some(m.view.id),
                Source::Generation(_) => None,
            })
            .collect();
        lock(&self.memtables).retain(|id, _| mems.contains(id));
        // The live rows of generation lists are not dropped here: a list no snapshot names yet
        // may be the one a flush or a compaction is about to make visible (see
        // `compute_ahead`). They go as newer lists are computed.
        let keys: HashSet<SourceKey> = sources.iter().map(SourceKey::of).collect();
        lock(&self.keys).retain(|(k, _), _| keys.contains(k));
    }

    /// Whether the lock on the kept lists is free (a test's check).
    #[cfg(test)]
    pub(super) fn lists_free(&self) -> bool {
        self.lists.try_lock().is_ok()
    }

    /// The generations the kept lists name.
    pub(crate) fn listed(&self) -> HashSet<SourceKey> {
        lock(&self.lists)
            .iter()
            .flat_map(|l| l.ids.iter())
            .map(|(id, epoch)| SourceKey::Generation(*id, *epoch))
            .collect()
    }

    /// The rows of generation `g` that the memtables `views` (all newer than it) supersede,
    /// as a search's live rows count them, for a generation no search sees yet (one a
    /// compaction is about to publish): only `g`'s entries are locked, which no search can
    /// be waiting for. What is found is kept for the first search of `g` under the memtables
    /// searches keep entries for; nothing is kept for the others (a memtable no search asked
    /// about, whose entry only a search's snapshot would drop).
    pub(crate) fn superseded_ahead(&self, g: &Generation, views: &[&MemtableView]) -> Vec<u32> {
        let older = Older::Generation(g);
        views
            .iter()
            .flat_map(|v| {
                let kept = lock(&self.memtables).get(&v.id).cloned();
                kept.unwrap_or_default().superseded_in(&older, v)
            })
            .collect()
    }

    /// Whether anything is kept for memtable `id` (a test's check).
    #[cfg(test)]
    pub(super) fn keeps_memtable(&self, id: u64) -> bool {
        lock(&self.memtables).contains_key(&id)
    }

    fn memtable(&self, id: u64) -> Arc<Superseding> {
        lock(&self.memtables).entry(id).or_default().clone()
    }

    /// The key lookup of the `live` rows of memtable source `s`.
    fn mem_keys(&self, s: &Source, live: &RowFlags) -> Arc<MemKeys> {
        let id = (SourceKey::of(s), s.rows());
        if let Some(k) = lock(&self.keys).get(&id) {
            return k.clone();
        }
        // Built without holding the lock; two queries may both build it, one is kept.
        let mut first: HashMap<u64, u32, BuildHasherDefault<HashIsKey>> =
            HashMap::with_capacity_and_hasher(live.count(), Default::default());
        for r in live.iter_set() {
            first.entry(s.row_hash(r)).or_insert(r as u32);
        }
        lock(&self.keys)
            .entry(id)
            .or_insert_with(|| Arc::new(MemKeys { first }))
            .clone()
    }

    /// Compute ahead what the first query over generation list `gens` (oldest first) would:
    /// what newer generations supersede of each (their key lookups are built when they are
    /// opened). A flush or a compaction does this before it makes its list visible, so no
    /// query waits for it.
    /// Returns each generation's own flags (see [`LiveRows`]).
    ///
    /// In the `background` (a compaction's list), a kept list is extended without holding the
    /// lock searches take (see [`LiveRowCache::generation_live_rows`]).
    pub(crate) fn compute_ahead(
        &self,
        gens: &[&Arc<Generation>],
        background: bool,
    ) -> Vec<RowFlags> {
        self.generation_live_rows(gens, background)
    }

    /// Where a list is computed ahead without holding the locks searches take: a test checks
    /// them here.
    fn computing_here(&self) {
        #[cfg(test)]
        if let Some(f) = lock(&self.computing).clone() {
            f();
        }
    }

    /// Per generation of `gens` (oldest first): the rows neither tombstones nor superseded by
    /// a newer generation of the list. Computed once per list in O(rows × log generations),
    /// and from a kept list it starts with (a flush adds generations on top) in O(new rows ×
    /// generations × log).
    ///
    /// In the `background` (a compaction's list, computed ahead at the background's
    /// priority), a list is extended without holding the lock, so no search waits for that
    /// thread; a search or a flush that wants the same new list meanwhile extends the kept
    /// list too. Otherwise it is extended under the lock: queries asking for the same new list
    /// at once (after a read-only handle's refresh) wait for one extension instead of each
    /// building the list from scratch.
    fn generation_live_rows(&self, gens: &[&Arc<Generation>], background: bool) -> Vec<RowFlags> {
        let ids: Vec<(u64, u64)> = gens.iter().map(|g| key_of(g)).collect();
        let extends = |l: &ListLiveRows| ids.len() > l.ids.len() && ids[..l.ids.len()] == l.ids[..];
        let mut lists = lock(&self.lists);
        if let Some(l) = lists.iter().find(|l| l.ids == ids) {
            return l.live.clone();
        }
        // The longest kept list that this list extends.
        let start = lists
            .iter()
            .filter(|l| extends(l))
            .max_by_key(|l| l.ids.len());
        let computed = match start {
            Some(l) if !background => l.extend(gens, ids.len() - l.ids.len()),
            Some(l) => {
                let l = l.clone();
                drop(lists);
                self.computing_here();
                let extended = l.extend(gens, ids.len() - l.ids.len());
                lists = lock(&self.lists);
                extended
            }
            None => {
                // Built without holding the lock: other queries' lists stay available.
                drop(lists);
                #[cfg(test)]
                self.builds
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let built = ListLiveRows::build(gens);
                lists = lock(&self.lists);
                built
            }
        };
        // Another query may have computed it meanwhile.
        if let Some(l) = lists.iter().find(|l| l.ids == ids) {
            return l.live.clone();
        }
        let own = computed.live.clone();
        lists.insert(0, computed);
        lists.truncate(KEPT_LISTS);
        own
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Superseding {
    /// The rows of `older` the rows of the memtable `view` supersede. Every version and
    /// tombstone supersedes: a memtable is newer than every generation and every memtable frozen
    /// before it.
    fn superseded_in(&self, older: &Older, view: &MemtableView) -> Vec<u32> {
        let entry = lock(&self.per_source)
            .entry(older.key())
            .or_default()
            .clone();
        // Other sources' checks against this memtable go on meanwhile.
        let mut pairs = lock(&entry);
        let (checked, superseded) = &mut *pairs;
        let rows = view.rows;
        if *checked < rows {
            for (b, hashes) in view.row_hashes.iter().enumerate() {
                let start = view.offsets[b];
                let end = (start + hashes.len()).min(rows);
                for ord in (*checked).max(start)..end {
                    let r = ord - start;
                    let key = || Key::from_array(view.batches[b].column(0).as_ref(), r);
                    if let Some(row) = older.row_of_key(hashes[r], key) {
                        superseded.push((row as u32, ord as u32));
                    }
                }
            }
            *checked = rows;
        }
        // A query holding an older view sees only what its own rows supersede.
        superseded
            .iter()
            .filter(|(_, ord)| (*ord as usize) < rows)
            .map(|(row, _)| *row)
            .collect()
    }
}

/// The live rows of each source of a snapshot (newest first, memtables first): each source's
/// own flags (a generation's from the handle's live rows of its generation list), less what
/// the newer memtables' rows supersede of it. Computed concurrently across sources.
pub(crate) fn live_rows(sources: &[Source], cache: &LiveRowCache) -> Vec<LiveRows> {
    let memtables: Vec<(&MemtableSource, Arc<Superseding>)> = sources
        .iter()
        .map_while(|s| match s {
            Source::Memtable(mt) => Some((mt, cache.memtable(mt.view.id))),
            Source::Generation(_) => None,
        })
        .collect();
    let m = memtables.len();
    let gens: Vec<&Arc<Generation>> = sources[m..]
        .iter()
        .filter_map(|s| match s {
            Source::Generation(g) => Some(g),
            Source::Memtable(_) => None,
        })
        .collect();
    debug_assert_eq!(gens.len(), sources.len() - m, "memtables come first");
    // The generations' own flags (less what newer generations supersede), oldest first.
    let oldest_first: Vec<&Arc<Generation>> = gens.iter().rev().copied().collect();
    let mut own = cache.generation_live_rows(&oldest_first, false);
    own.reverse();
    use rayon::prelude::*;
    (0..sources.len())
        .into_par_iter()
        .map(|i| {
            let (own, older) = match &sources[i] {
                Source::Memtable(mt) => {
                    let live = &mt.view.live;
                    let keys = (i > 0).then(|| cache.mem_keys(&sources[i], live));
                    (
                        live.clone(),
                        keys.map(|k| Older::Memtable(&sources[i], live, k)),
                    )
                }
                Source::Generation(g) => (own[i - m].clone(), Some(Older::Generation(g))),
            };
            let mut superseded = Vec::new();
            if let Some(older) = older {
                for (mt, blocks) in &memtables[..i.min(m)] {
                    superseded.extend(blocks.superseded_in(&older, &mt.view));
                }
            }
            LiveRows::new(own, superseded)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memtable::MemtableView;
    use crate::schema::IndexSchema;
    use arrow::array::{ArrayRef, RecordBatch, StringArray};

    fn source(id: u64, keys: &[&str], hashes: &[u64], deleted: bool) -> Source {
        let s = IndexSchema::from_json(r#"{"primary_key": "id"}"#).unwrap();
        let keys: ArrayRef = Arc::new(StringArray::from(keys.to_vec()));
        let batch = if deleted {
            s.tombstones(&keys, 1).unwrap()
        } else {
            let user = RecordBatch::try_new(s.arrow_schema(), vec![keys]).unwrap();
            s.to_stored(&user, 1).unwrap()
        };
        let view = MemtableView {
            id,
            rows: batch.num_rows(),
            row_hashes: vec![hashes.into()],
            live: RowFlags::from_vec(vec![!deleted; batch.num_rows()]),
            batches: vec![batch],
            offsets: vec![0],
            text: None,
            graph: None,
        };
        Source::memtable(format!("memtable {id}"), view)
    }

    fn admitted(live: &LiveRows) -> Vec<bool> {
        let flags: Vec<bool> = (0..live.len()).map(|r| live.admits(r)).collect();
        assert_eq!(flags.iter().filter(|f| **f).count(), live.count());
        assert_eq!(
            live.rows().collect::<Vec<_>>(),
            (0..live.len()).filter(|r| flags[*r]).collect::<Vec<_>>()
        );
        flags
    }

    /// A generation `id` of rows with keys `keys` and text `text`.

    #[test]
    fn a_hash_collision_never_hides_a_live_row() {
        // "b" in the newer source collides with "a" in the older one: "a" must stay live.
        let newer = source(2, &["b", "c"], &[7, 9], false);
        let older = source(1, &["a", "c", "d"], &[7, 9, 11], false);
        let m = live_rows(&[newer, older], &LiveRowCache::default());
        assert_eq!(admitted(&m[0]), vec![true, true]);
        assert_eq!(
            admitted(&m[1]),
            vec![true, false, true],
            "only the older 'c' is superseded"
        );
    }

    #[test]
    fn a_newer_memtable_hides_what_its_own_view_holds() {
        // The handle's live rows are kept across queries: the newer memtable's rows are
        // looked up in the older one as they come, and a query of a shorter view of it (one
        // taken before) still sees only what that view's rows supersede.
        let cache = LiveRowCache::default();
        let older = source(1, &["a", "b", "c"], &[1, 2, 3], false);
        let short = source(2, &["b"], &[2], false);
        let long = source(2, &["b", "c"], &[2, 3], false);
        for (newer, expect) in [
            (&short, [true, false, true]),
            (&long, [true, false, false]),
            (&short, [true, false, true]),
        ] {
            let m = live_rows(&[newer.clone(), older.clone()], &cache);
            assert_eq!(admitted(&m[1]), expect, "{} rows", newer.rows());
            // A filter (shorter than the rows: the rest fail it) selects among the live rows.
            let filtered = admitted(&m[1].and(&[false, true]));
            assert_eq!(filtered, [false, expect[1], false]);
            let filtered = admitted(&m[1].and(&[true, true, true]));
            assert_eq!(filtered, expect);
        }
    }

    fn generation(id: u64, keys: &[&str], deleted: bool) -> Arc<Generation> {
        let s = IndexSchema::from_json(r#"{"primary_key": "id"}"#).unwrap();
        let keys: ArrayRef = Arc::new(StringArray::from(keys.to_vec()));
        let batch = if deleted {
            s.tombstones(&keys, id).unwrap()
        } else {
            let user = RecordBatch::try_new(s.arrow_schema(), vec![keys]).unwrap();
            s.to_stored(&user, id).unwrap()
        };
        let spec = crate::generation::IndexSpec {
            text: None,
            vector: None,
        };
        let (g, _) = Generation::build(id, 1, batch, &s.stored_schema(), spec, None, 1).unwrap();
        Arc::new(g)
    }

    #[test]
    fn each_list_is_computed_once_and_lists_a_flush_extends_stay_available() {
        let cache = LiveRowCache::default();
        let live = |gens: &[&Arc<Generation>]| -> Vec<Vec<bool>> {
            cache
                .generation_live_rows(gens, false)
                .iter()
                .map(|f| (0..f.len()).map(|r| f.get(r)).collect())
                .collect()
        };
        let builds = || cache.builds.load(std::sync::atomic::Ordering::Relaxed);
        let g1 = generation(1, &["a", "b", "c"], false);
        let g2 = generation(2, &["b"], false);
        let g3 = generation(3, &["c"], true);
        let g4 = generation(4, &["a"], false);
        let l1 = [&g1, &g2];
        let l2 = [&g1, &g2, &g3];
        let m1 = vec![vec![true, false, true], vec![true]];
        assert_eq!(live(&l1), m1);
        assert_eq!(builds(), 1);
        // A flush computes its list ahead from the list queries see, which stays as it was.
        cache.compute_ahead(&l2, false);
        let m2 = vec![vec![true, false, false], vec![true], vec![false]];
        assert_eq!(live(&l1), m1);
        assert_eq!(live(&l2), m2);
        assert_eq!(builds(), 1);
        // A compaction merges g1 and g2 and computes its list; a flush that races with it
        // extends the list queries see; the compaction then publishes on top of the flush.
        let g12 = generation(12, &["a", "b", "c"], false);
        let lc = [&g12, &g3];
        cache.compute_ahead(&lc, true);
        assert_eq!(builds(), 2, "a compaction's list starts no kept list");
        let l3 = [&g1, &g2, &g3, &g4];
        cache.compute_ahead(&l3, false);
        let lc4 = [&g12, &g3, &g4];
        assert_eq!(
            live(&lc4),
            vec![vec![false, true, false], vec![false], vec![true]]
        );
        assert_eq!(live(&l2), m2, "an older snapshot's list is kept");
        assert_eq!(builds(), 2, "every list extended a kept one");
    }

    #[test]
    fn a_collision_beside_a_real_match_still_hides_the_real_match() {
        // Hash 7 is held by "x" (newest) and "a" (middle); the oldest "a" is superseded by the
        // middle one although the first hash hit is the unrelated "x".
        let newest = source(3, &["x"], &[7], false);
        let middle = source(2, &["a"], &[7], true);
        let oldest = source(1, &["a", "z"], &[7, 3], false);
        let m = live_rows(&[newest, middle, oldest], &LiveRowCache::default());
        assert_eq!(admitted(&m[0]), vec![true]);
        assert_eq!(admitted(&m[1]), vec![false], "a tombstone is never live");
        assert_eq!(admitted(&m[2]), vec![false, true]);
    }
}
