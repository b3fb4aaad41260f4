//! A generation's rows by key hash, in about 5 bytes a row beside its `pk_hashes` section.
//!
//! A generation's distinct key hashes are stored ascending (`pk_hashes`, 8 bytes each, held in
//! its hot part). [`HashIndex`] adds the first row holding each hash (4 bytes) and a table of
//! where each range of leading hash bits starts (a bucket per 4 hashes on average, 1 byte a
//! row), so that a lookup is one table read and a search of about four hashes. Key hashes are
//! uniform, so buckets stay small.
//!
//! It replaces a hash map of hash to row (about 30 bytes a row), and sorted hashes let live
//! rows be computed by merging generations ([`for_each_common`], [`merge`]) without a map as
//! large as every row of a list.

use bytes::Bytes;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Hashes per bucket of the table, on average (at least).
const PER_BUCKET: usize = 4;

/// The rows of one generation by key hash.
#[derive(Debug)]
pub(crate) struct HashIndex {
    /// The distinct key hashes, ascending, 8 bytes little-endian each.
    hashes: Bytes,
    /// Per distinct hash, the first row holding it.
    first: Vec<u32>,
    /// `starts[b]`: the first hash whose leading `bits` bits are `b` or more; one more entry
    /// than buckets.
    starts: Vec<u32>,
    bits: u32,
    /// `(position, row)` of every row holding a hash that is not the first to hold it
    /// (distinct keys of one hash, a 64-bit collision), ascending: almost always empty.
    others: Vec<(u32, u32)>,
}

impl HashIndex {
    /// The index of rows whose key hashes are `row_hashes` (row after row), with `hashes`
    /// their distinct values ascending (8 bytes little-endian each, as the `pk_hashes` section
    /// stores them). The caller checked that `hashes` is that set.
    pub(crate) fn new(hashes: Bytes, row_hashes: impl Iterator<Item = u64>) -> HashIndex {
        let n = hashes.len() / 8;
        let buckets = (n / PER_BUCKET).max(1).next_power_of_two();
        let bits = buckets.trailing_zeros();
        let mut starts = Vec::with_capacity(buckets + 1);
        let mut i = 0usize;
        for b in 0..buckets as u64 {
            while i < n && bucket(read(&hashes, i), bits) < b {
                i += 1;
            }
            starts.push(i as u32);
        }
        starts.push(n as u32);
        let mut index = HashIndex {
            hashes,
            first: vec![u32::MAX; n],
            starts,
            bits,
            others: Vec::new(),
        };
        for (r, h) in row_hashes.enumerate() {
            if let Some(i) = index.find(h) {
                match index.first[i] {
                    u32::MAX => index.first[i] = r as u32,
                    _ => index.others.push((i as u32, r as u32)),
                }
            }
        }
        index.others.sort_unstable();
        index
    }

    /// The index of hashes given as values (ascending and distinct, or not).
    #[cfg(test)]
    pub(crate) fn of(row_hashes: &[u64]) -> HashIndex {
        let mut sorted = row_hashes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let bytes: Vec<u8> = sorted.iter().flat_map(|h| h.to_le_bytes()).collect();
        HashIndex::new(Bytes::from(bytes), row_hashes.iter().copied())
    }

    /// Distinct hashes.
    pub(crate) fn len(&self) -> usize {
        self.first.len()
    }

    /// The `i`-th distinct hash.
    #[inline]
    pub(crate) fn hash(&self, i: usize) -> u64 {
        read(&self.hashes, i)
    }

    /// The position of `hash` among the distinct hashes, if a row has it.
    #[inline]
    pub(crate) fn find(&self, hash: u64) -> Option<usize> {
        let b = bucket(hash, self.bits) as usize;
        let (mut lo, mut hi) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.hash(mid).cmp(&hash) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// The rows holding the `i`-th distinct hash, ascending: one, unless keys of the
    /// generation share a hash.
    pub(crate) fn rows(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let from = self.others.partition_point(|(p, _)| (*p as usize) < i);
        let others = self.others[from..]
            .iter()
            .take_while(move |(p, _)| *p as usize == i)
            .map(|(_, r)| *r as usize);
        std::iter::once(self.first[i] as usize).chain(others)
    }

    /// The first position at or after `from` whose hash is at least `hash` (galloping).
    fn seek(&self, from: usize, hash: u64) -> usize {
        let n = self.len();
        let mut step = 1;
        let mut lo = from;
        let mut hi = from;
        while hi < n && self.hash(hi) < hash {
            lo = hi + 1;
            hi += step;
            step *= 2;
        }
        let mut hi = hi.min(n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.hash(mid) < hash {
                true => lo = mid + 1,
                false => hi = mid,
            }
        }
        lo
    }
}

/// The bucket of `hash` in a table of `2^bits` buckets: its leading bits.
#[inline]
fn bucket(hash: u64, bits: u32) -> u64 {
    hash.checked_shr(64 - bits).unwrap_or(0)
}

#[inline]
fn read(hashes: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(hashes[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
}

/// Calls `f(i, j)` for every hash two indexes share (`a.hash(i) == b.hash(j)`), ascending:
/// the smaller one's hashes sought in the larger one by galloping, so O(small × log(large /
/// small)).
pub(crate) fn for_each_common(a: &HashIndex, b: &HashIndex, mut f: impl FnMut(usize, usize)) {
    let swap = a.len() > b.len();
    let (small, large) = if swap { (b, a) } else { (a, b) };
    let mut at = 0;
    for i in 0..small.len() {
        let h = small.hash(i);
        at = large.seek(at, h);
        if at == large.len() {
            return;
        }
        if large.hash(at) == h {
            match swap {
                false => f(i, at),
                true => f(at, i),
            }
        }
    }
}

/// Merges the hashes of `indexes`, ascending: calls `f(group)` for every hash more than one
/// index holds, with `(index, position)` of each holder, the index positions ascending.
/// O(hashes × log indexes), in one pass.
pub(crate) fn merge(indexes: &[&HashIndex], mut f: impl FnMut(&[(usize, usize)])) {
    let mut heap: BinaryHeap<Reverse<(u64, usize, usize)>> = indexes
        .iter()
        .enumerate()
        .filter(|(_, x)| x.len() > 0)
        .map(|(k, x)| Reverse((x.hash(0), k, 0)))
        .collect();
    let mut group = Vec::new();
    while let Some(Reverse((h, k, i))) = heap.pop() {
        group.clear();
        group.push((k, i));
        while let Some(Reverse((h2, k2, i2))) = heap.peek().copied() {
            if h2 != h {
                break;
            }
            heap.pop();
            group.push((k2, i2));
        }
        for &(k, i) in &group {
            if i + 1 < indexes[k].len() {
                heap.push(Reverse((indexes[k].hash(i + 1), k, i + 1)));
            }
        }
        if group.len() > 1 {
            f(&group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(n: usize, seed: u64) -> Vec<u64> {
        (0..n as u64)
            .map(|i| xxhash_rust::xxh3::xxh3_64(&(i * 31 + seed).to_le_bytes()))
            .collect()
    }

    #[test]
    fn finds_every_row_and_nothing_else() {
        for n in [0, 1, 3, 4, 5, 17, 1000] {
            let h = hashes(n, 7);
            let x = HashIndex::of(&h);
            assert_eq!(x.len(), n);
            for (r, v) in h.iter().enumerate() {
                let i = x.find(*v).expect("held");
                assert_eq!(x.rows(i).collect::<Vec<_>>(), vec![r]);
            }
            for v in hashes(50, 99_999) {
                assert_eq!(x.find(v), None);
            }
            assert_eq!(x.find(0), h.iter().position(|v| *v == 0));
            assert_eq!(x.find(u64::MAX), h.iter().position(|v| *v == u64::MAX));
        }
    }

    #[test]
    fn rows_sharing_a_hash_are_all_found() {
        let h = vec![5, 9, 5, u64::MAX, 0, 5, 0];
        let x = HashIndex::of(&h);
        assert_eq!(x.len(), 4);
        assert_eq!(x.rows(x.find(5).unwrap()).collect::<Vec<_>>(), [0, 2, 5]);
        assert_eq!(x.rows(x.find(0).unwrap()).collect::<Vec<_>>(), [4, 6]);
        assert_eq!(x.rows(x.find(9).unwrap()).collect::<Vec<_>>(), [1]);
        assert_eq!(x.find(6), None);
    }

    #[test]
    fn common_hashes_of_two_indexes() {
        for (na, nb) in [(0, 10), (10, 0), (5, 1000), (1000, 5), (300, 300)] {
            let a = hashes(na, 1);
            let mut b = hashes(nb, 2);
            b.extend(a.iter().step_by(3).copied());
            let (xa, xb) = (HashIndex::of(&a), HashIndex::of(&b));
            let mut got = Vec::new();
            for_each_common(&xa, &xb, |i, j| {
                assert_eq!(xa.hash(i), xb.hash(j));
                got.push(xa.hash(i));
            });
            let mut want: Vec<u64> = a.iter().step_by(3).copied().collect();
            want.sort_unstable();
            assert_eq!(got, want, "{na} {nb}");
        }
    }

    #[test]
    fn merge_groups_hashes_held_twice_or_more() {
        let a = vec![1, 2, 3, 10];
        let b = vec![2, 3, 4];
        let c = vec![3, 4, 10, 11];
        let xs = [HashIndex::of(&a), HashIndex::of(&b), HashIndex::of(&c)];
        let refs: Vec<&HashIndex> = xs.iter().collect();
        let mut got = Vec::new();
        merge(&refs, |g| {
            let h = refs[g[0].0].hash(g[0].1);
            assert!(g.iter().all(|(k, i)| refs[*k].hash(*i) == h));
            let mut ks: Vec<usize> = g.iter().map(|(k, _)| *k).collect();
            ks.sort_unstable();
            got.push((h, ks));
        });
        assert_eq!(
            got,
            vec![
                (2, vec![0, 1]),
                (3, vec![0, 1, 2]),
                (4, vec![1, 2]),
                (10, vec![0, 2])
            ]
        );
    }
}
