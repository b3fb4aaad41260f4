//! Block lists: which rows of a source newer sources hide.
//!
//! A row is *live* when it is the newest version of its key in its source, not a tombstone, and
//! its key is in no strictly newer source. The keys (key hashes, a hit confirmed on the exact
//! key) of the newer sources form the source's block list. Memtables are compared with each
//! other per query. What newer generations hide of a generation only changes when the list of
//! generations does: it is computed for a whole list in one pass from the newest generation to
//! the oldest with a growing map of the keys seen (O(rows), whatever the number of
//! generations), and extended in O(new rows) when a flush adds a generation on top. What a
//! memtable's rows hide of a generation only grows as rows are appended. A handle keeps both in
//! its [`BlockLists`], so a query does no work proportional to the generations' rows.

use super::dead_terms::DeadTerms;
use super::source::Source;
use crate::generation::{Generation, HashIsKey};
use crate::key::Key;
use crate::schema::deleted_flags;
use arrow::array::{BooleanArray, RecordBatch};
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};

/// The live rows of one source.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    /// Per row: the newest version of its key in the snapshot, and not a tombstone.
    pub(crate) mask: Arc<Vec<bool>>,
}

impl Live {
    /// Rows the mask admits.
    pub(crate) fn count(&self) -> usize {
        self.mask.iter().filter(|l| **l).count()
    }
}

/// What newer generations hide of every generation of one list, from one pass over their rows.
#[derive(Debug)]
struct ListMasks {
    /// `(id, epoch)` of the generations, oldest first.
    ids: Vec<(u64, u64)>,
    /// Key hash → `(generation position, row)` of the newest version in the list.
    newest: HashMap<u64, (u32, u32), BuildHasherDefault<HashIsKey>>,
    /// Per generation, oldest first: per row, neither a tombstone nor superseded by a newer
    /// generation.
    live: Vec<Arc<Vec<bool>>>,
}

/// Lists of generations whose masks a handle keeps: the newest two (queries of an older
/// snapshot may interleave with the newest).
const KEPT_LISTS: usize = 2;

impl ListMasks {
    /// The masks of `gens` (oldest first), newest to oldest with a growing map of the keys
    /// seen: O(rows) whatever the number of generations.
    fn build(gens: &[&Arc<Generation>]) -> ListMasks {
        let mut m = ListMasks {
            ids: gens.iter().map(|g| key_of(g)).collect(),
            newest: HashMap::with_capacity_and_hasher(
                gens.iter().map(|g| g.rows().num_rows()).sum(),
                Default::default(),
            ),
            live: (0..gens.len()).map(|_| Arc::default()).collect(),
        };
        for pos in (0..gens.len()).rev() {
            let g = gens[pos];
            let deleted = deleted_flags(g.rows());
            let mut live: Vec<bool> = (0..g.rows().num_rows())
                .map(|r| !deleted.value(r))
                .collect();
            for (r, h) in g.row_hashes().iter().enumerate() {
                match m.newest.get(h) {
                    None => {
                        m.newest.insert(*h, (pos as u32, r as u32));
                    }
                    Some(&(np, nr)) => {
                        let key = g.key_at(r);
                        let newer = gens[np as usize].key_at(nr as usize) == key
                            || gens[pos + 1..]
                                .iter()
                                .any(|n| n.row_of_key(*h, || key.clone()).is_some());
                        if newer {
                            live[r] = false;
                        }
                    }
                }
            }
            m.live[pos] = Arc::new(live);
        }
        m
    }

    /// Add `added` (newer than every generation of the list, oldest first) on top: each of
    /// their rows hides the version the list held, if any. O(their rows).
    fn extend(&mut self, all: &[&Arc<Generation>], added: usize) {
        let first = all.len() - added;
        for pos in first..all.len() {
            let g = all[pos];
            let deleted = deleted_flags(g.rows());
            self.live.push(Arc::new(
                (0..g.rows().num_rows())
                    .map(|r| !deleted.value(r))
                    .collect(),
            ));
            self.ids.push(key_of(g));
            for (r, h) in g.row_hashes().iter().enumerate() {
                let key = || g.key_at(r);
                match self.newest.get(h).copied() {
                    Some((np, nr)) if all[np as usize].key_at(nr as usize) == key() => {
                        Arc::make_mut(&mut self.live[np as usize])[nr as usize] = false;
                        self.newest.insert(*h, (pos as u32, r as u32));
                    }
                    Some(_) => {
                        // A hash collision: look the key up in every older generation.
                        let k = key();
                        for (o, older) in all[..pos].iter().enumerate() {
                            if let Some(x) = older.row_of_key(*h, || k.clone()) {
                                Arc::make_mut(&mut self.live[o])[x] = false;
                            }
                        }
                    }
                    None => {
                        self.newest.insert(*h, (pos as u32, r as u32));
                    }
                }
            }
        }
    }
}

/// Memtable rows checked against one generation, and `(generation row, memtable row)` pairs.
type Hidden = (usize, Vec<(u32, u32)>);

/// The rows of generations one memtable's keys hide, kept up to date incrementally: each
/// memtable row is checked against each generation once (a hash lookup), not once per query.
#[derive(Debug, Default)]
struct MemtableBlocks {
    /// Per generation `(id, epoch)`: memtable rows checked so far, and `(generation row,
    /// memtable row)` for each hidden generation row.
    per_generation: Mutex<HashMap<(u64, u64), Hidden>>,
}

/// The block lists a handle keeps between queries (a cache: anything dropped is recomputed).
#[derive(Debug, Default)]
pub(crate) struct BlockLists {
    /// What newer generations hide of each generation, for the lists last asked about (most
    /// recent first).
    lists: Mutex<Vec<ListMasks>>,
    /// Per memtable id: what its rows hide of each generation.
    memtables: Mutex<HashMap<u64, Arc<MemtableBlocks>>>,
    /// Per source: the dead rows of its text index last counted.
    dead: Mutex<HashMap<SourceKey, Arc<Mutex<DeadTerms>>>>,
}

/// A source's identity while a handle keeps something for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum SourceKey {
    Memtable(u64),
    Generation(u64, u64),
}

impl SourceKey {
    fn of(s: &Source) -> SourceKey {
        match s {
            Source::Memtable(m) => SourceKey::Memtable(m.view.id),
            Source::Generation(g) => {
                let (id, epoch) = key_of(g);
                SourceKey::Generation(id, epoch)
            }
        }
    }
}

fn key_of(g: &Generation) -> (u64, u64) {
    (g.meta().id, g.meta().epoch)
}

impl BlockLists {
    /// Drop what is kept for memtables and sources `sources` does not hold (flushed memtables,
    /// generations no longer listed; the masks of generation lists go as newer lists come).
    pub(crate) fn retain(&self, sources: &[Source]) {
        let mems: HashSet<u64> = sources
            .iter()
            .filter_map(|s| match s {
                Source::Memtable(m) => Some(m.view.id),
                Source::Generation(_) => None,
            })
            .collect();
        lock(&self.memtables).retain(|id, _| mems.contains(id));
        // Lists naming a generation the snapshot does not hold (replaced by a compaction) go:
        // their key maps are as large as the generations' rows.
        let gens: HashSet<(u64, u64)> = sources
            .iter()
            .filter_map(|s| match s {
                Source::Generation(g) => Some(key_of(g)),
                Source::Memtable(_) => None,
            })
            .collect();
        lock(&self.lists).retain(|l| l.ids.iter().all(|k| gens.contains(k)));
        let keys: HashSet<SourceKey> = sources.iter().map(SourceKey::of).collect();
        lock(&self.dead).retain(|k, _| keys.contains(k));
    }

    /// What `source`'s text index holds of rows that were dead for the last query that asked.
    pub(crate) fn dead_terms(&self, source: &Source) -> Arc<Mutex<DeadTerms>> {
        lock(&self.dead)
            .entry(SourceKey::of(source))
            .or_default()
            .clone()
    }

    fn memtable(&self, id: u64) -> Arc<MemtableBlocks> {
        lock(&self.memtables).entry(id).or_default().clone()
    }

    /// Per generation of `gens` (oldest first): the rows neither tombstones nor superseded by
    /// a newer generation of the list. Computed once per list in O(rows), and extended in
    /// O(new rows) when generations were only added on top (a flush).
    fn generation_masks(&self, gens: &[&Arc<Generation>]) -> Vec<Arc<Vec<bool>>> {
        let ids: Vec<(u64, u64)> = gens.iter().map(|g| key_of(g)).collect();
        let mut lists = lock(&self.lists);
        // The exact list, else the longest one this list extends.
        let found = lists
            .iter()
            .enumerate()
            .filter(|(_, l)| ids.len() >= l.ids.len() && ids[..l.ids.len()] == l.ids[..])
            .max_by_key(|(_, l)| l.ids.len())
            .map(|(i, _)| i);
        let mut entry = match found {
            Some(i) => lists.remove(i),
            None => {
                // Built without holding the lock: other queries' lists stay available.
                drop(lists);
                let built = ListMasks::build(gens);
                lists = lock(&self.lists);
                built
            }
        };
        if entry.ids.len() < ids.len() {
            let added = ids.len() - entry.ids.len();
            entry.extend(gens, added);
        }
        let masks = entry.live.clone();
        lists.retain(|l| l.ids != entry.ids);
        lists.insert(0, entry);
        lists.truncate(KEPT_LISTS);
        masks
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemtableBlocks {
    /// The rows of `generation` hidden by the first `rows` rows of a memtable view (its stored
    /// `batches` starting at `offsets`, with their `row_hashes`). Every version and tombstone
    /// hides: a memtable is newer than every generation.
    fn hidden_in(
        &self,
        generation: &Generation,
        batches: &[RecordBatch],
        offsets: &[usize],
        row_hashes: &[Arc<[u64]>],
        rows: usize,
    ) -> Vec<u32> {
        let mut all = lock(&self.per_generation);
        let (checked, hidden) = all.entry(key_of(generation)).or_default();
        if *checked < rows {
            for (b, hashes) in row_hashes.iter().enumerate() {
                let start = offsets[b];
                let end = (start + hashes.len()).min(rows);
                for ord in (*checked).max(start)..end {
                    let r = ord - start;
                    let key = || Key::from_array(batches[b].column(0).as_ref(), r);
                    if let Some(row) = generation.row_of_key(hashes[r], key) {
                        hidden.push((row as u32, ord as u32));
                    }
                }
            }
            *checked = rows;
        }
        // A query holding an older view sees only what its own rows hide.
        hidden
            .iter()
            .filter(|(_, ord)| (*ord as usize) < rows)
            .map(|(row, _)| *row)
            .collect()
    }
}

/// The live rows of each source of a snapshot (newest first): memtables first, compared with
/// each other here; generations from the handle's cached block lists.
pub(crate) fn live_masks(sources: &[Source], cache: &BlockLists) -> Vec<Live> {
    let m = sources
        .iter()
        .take_while(|s| matches!(s, Source::Memtable(_)))
        .count();
    let mut out: Vec<Live> = memtable_masks(&sources[..m])
        .into_iter()
        .map(|mask| Live {
            mask: Arc::new(mask),
        })
        .collect();
    let gens: Vec<&Arc<Generation>> = sources[m..]
        .iter()
        .filter_map(|s| match s {
            Source::Generation(g) => Some(g),
            Source::Memtable(_) => None,
        })
        .collect();
    debug_assert_eq!(gens.len(), sources.len() - m, "memtables come first");
    let memtables: Vec<_> = sources[..m]
        .iter()
        .filter_map(|s| match s {
            Source::Memtable(mt) => Some((mt, cache.memtable(mt.view.id))),
            Source::Generation(_) => None,
        })
        .collect();
    use rayon::prelude::*;
    // The generations' own masks (what newer generations hide), oldest first.
    let oldest_first: Vec<&Arc<Generation>> = gens.iter().rev().copied().collect();
    let mut bases = cache.generation_masks(&oldest_first);
    bases.reverse();
    let gen_masks: Vec<Live> = gens
        .par_iter()
        .zip(bases)
        .map(|(g, base)| {
            let mut kills: Vec<u32> = Vec::new();
            for (mt, blocks) in &memtables {
                let v = &mt.view;
                kills.extend(blocks.hidden_in(g, &v.batches, &v.offsets, &v.row_hashes, v.rows));
            }
            kills.retain(|r| base[*r as usize]);
            let mask = if kills.is_empty() {
                base
            } else {
                let mut live = (*base).clone();
                for r in &kills {
                    live[*r as usize] = false;
                }
                Arc::new(live)
            };
            Live { mask }
        })
        .collect();
    out.extend(gen_masks);
    out
}

/// Live masks among memtables (newest first), compared key by key.
fn memtable_masks(sources: &[Source]) -> Vec<Vec<bool>> {
    // The newest (source, ordinal) seen for each key hash; a hit is confirmed on the exact key,
    // and a true hash collision falls back to looking the key up in every newer source.
    let mut newer: HashMap<u64, (usize, usize)> = HashMap::new();
    let mut out = Vec::with_capacity(sources.len());
    for (i, s) in sources.iter().enumerate() {
        let rows = s.rows();
        let mut live = vec![false; rows];
        let deleted: Vec<BooleanArray> = s.batches().iter().map(deleted_flags).collect();
        for &(ord, h) in s.candidates().iter() {
            if ord >= rows {
                continue;
            }
            let hidden = match newer.get(&h) {
                None => false,
                Some((j, o)) => {
                    let k = s.key_at(ord);
                    sources[*j].key_at(*o) == k || in_any(&sources[..i], h, &k)
                }
            };
            let (b, r) = s.locate(ord);
            live[ord] = !hidden && !deleted[b].value(r);
        }
        if i + 1 < sources.len() {
            for &(ord, h) in s.candidates().iter() {
                if ord < rows {
                    newer.entry(h).or_insert((i, ord));
                }
            }
        }
        out.push(live);
    }
    out
}

/// Whether any of `sources` holds `key` (whose hash is `h`): the slow path of a hash collision.
fn in_any(sources: &[Source], h: u64, key: &Option<Key>) -> bool {
    sources.iter().any(|s| {
        s.candidates()
            .iter()
            .any(|&(o, hh)| hh == h && o < s.rows() && &s.key_at(o) == key)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memtable::MemtableView;
    use crate::schema::IndexSchema;
    use arrow::array::{ArrayRef, StringArray};

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
            batches: vec![batch],
            offsets: vec![0],
            candidates: hashes.iter().copied().enumerate().collect(),
            text: None,
            graph: None,
        };
        Source::memtable(format!("memtable {id}"), view)
    }

    #[test]
    fn a_hash_collision_never_hides_a_live_row() {
        // "b" in the newer source collides with "a" in the older one: "a" must stay live.
        let newer = source(2, &["b", "c"], &[7, 9], false);
        let older = source(1, &["a", "c", "d"], &[7, 9, 11], false);
        let m = live_masks(&[newer, older], &BlockLists::default());
        assert_eq!(*m[0].mask, vec![true, true]);
        assert_eq!(
            *m[1].mask,
            vec![true, false, true],
            "only the superseded 'c' is hidden"
        );
    }

    #[test]
    fn a_collision_beside_a_real_match_still_hides_the_real_match() {
        // Hash 7 is held by "x" (newest) and "a" (middle); the oldest "a" is superseded by the
        // middle one although the first hash hit is the unrelated "x".
        let newest = source(3, &["x"], &[7], false);
        let middle = source(2, &["a"], &[7], true);
        let oldest = source(1, &["a", "z"], &[7, 3], false);
        let m = live_masks(&[newest, middle, oldest], &BlockLists::default());
        assert_eq!(*m[0].mask, vec![true]);
        assert_eq!(*m[1].mask, vec![false], "a tombstone is never live");
        assert_eq!(*m[2].mask, vec![false, true]);
    }
}
