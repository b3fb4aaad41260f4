//! One flag per row, in chunks shared copy-on-write.
//!
//! A memtable keeps which of its rows are live as it appends them, and a search takes the flags
//! with its view of the memtable. Whole-vector copy-on-write would copy every row's flag at the
//! first change after each search took them; in chunks, a change copies one chunk, and a
//! search's copy of the flags is one pointer per chunk.

use std::sync::Arc;

/// Rows per chunk, as a power of two.
const CHUNK_BITS: u32 = 12;
/// Rows per chunk.
const CHUNK: usize = 1 << CHUNK_BITS;

/// A flag per row, with the number of rows flagged.
#[derive(Debug, Clone, Default)]
pub(crate) struct RowFlags {
    /// Full chunks of [`CHUNK`] flags, the last one possibly shorter.
    chunks: Vec<Arc<Vec<bool>>>,
    len: usize,
    set: usize,
}

impl RowFlags {
    /// The flags of `rows`.
    pub(crate) fn from_vec(rows: Vec<bool>) -> RowFlags {
        let set = rows.iter().filter(|f| **f).count();
        RowFlags {
            len: rows.len(),
            chunks: rows.chunks(CHUNK).map(|c| Arc::new(c.to_vec())).collect(),
            set,
        }
    }

    /// The flags as one vector.
    pub(crate) fn to_vec(&self) -> Vec<bool> {
        let mut out = Vec::with_capacity(self.len);
        for c in &self.chunks {
            out.extend_from_slice(c);
        }
        out
    }

    /// Rows with a flag.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Rows flagged.
    pub(crate) fn count(&self) -> usize {
        self.set
    }

    /// Whether row `r` is flagged (false past the last row).
    #[inline]
    pub(crate) fn get(&self, r: usize) -> bool {
        r < self.len && self.chunks[r >> CHUNK_BITS][r & (CHUNK - 1)]
    }

    /// Add a row.
    pub(crate) fn push(&mut self, flag: bool) {
        if self.len.is_multiple_of(CHUNK) {
            self.chunks.push(Arc::new(Vec::with_capacity(CHUNK)));
        }
        if let Some(last) = self.chunks.last_mut() {
            Arc::make_mut(last).push(flag);
        }
        self.len += 1;
        self.set += usize::from(flag);
    }

    /// Unflag row `r`; whether it was flagged.
    pub(crate) fn clear(&mut self, r: usize) -> bool {
        if !self.get(r) {
            return false;
        }
        Arc::make_mut(&mut self.chunks[r >> CHUNK_BITS])[r & (CHUNK - 1)] = false;
        self.set -= 1;
        true
    }

    /// The flagged rows, ascending.
    pub(crate) fn iter_set(&self) -> impl Iterator<Item = usize> + '_ {
        self.iter_set_from(0)
    }

    /// The flagged rows from row `from` on, ascending (chunks before it are not looked at).
    pub(crate) fn iter_set_from(&self, from: usize) -> impl Iterator<Item = usize> + '_ {
        self.chunks
            .iter()
            .enumerate()
            .skip(from >> CHUNK_BITS)
            .flat_map(|(c, chunk)| {
                chunk
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| **f)
                    .map(move |(i, _)| (c << CHUNK_BITS) + i)
            })
            .filter(move |r| *r >= from)
    }

    /// The rows of chunks whose flags may differ from `other`'s (not the same shared chunk),
    /// as ranges: every row whose flag differs is in one, and rows only one of them has.
    pub(crate) fn changed_since(&self, other: &RowFlags) -> Vec<std::ops::Range<usize>> {
        let mut out: Vec<std::ops::Range<usize>> = Vec::new();
        let chunks = self.chunks.len().max(other.chunks.len());
        for c in 0..chunks {
            let same = match (self.chunks.get(c), other.chunks.get(c)) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            if same {
                continue;
            }
            let start = c << CHUNK_BITS;
            let end = (start + CHUNK).min(self.len.max(other.len));
            match out.last_mut() {
                Some(r) if r.end == start => r.end = end,
                _ => out.push(start..end),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterating_from_a_row_skips_what_is_before_it() {
        let flags = RowFlags::from_vec((0..3 * CHUNK + 7).map(|r| r % 3 == 0).collect());
        for from in [
            0,
            1,
            2,
            3,
            CHUNK - 1,
            CHUNK,
            CHUNK + 1,
            3 * CHUNK + 6,
            3 * CHUNK + 7,
            5 * CHUNK,
        ] {
            let expected: Vec<usize> = flags.iter_set().filter(|r| *r >= from).collect();
            assert_eq!(
                flags.iter_set_from(from).collect::<Vec<_>>(),
                expected,
                "from {from}"
            );
        }
    }

    #[test]
    fn flags_follow_a_plain_vector_and_share_untouched_chunks() {
        let n = 3 * CHUNK + 17;
        let mut plain: Vec<bool> = (0..n).map(|r| r % 3 != 0).collect();
        let mut flags = RowFlags::default();
        for f in &plain {
            flags.push(*f);
        }
        let taken = flags.clone();
        assert!(flags.clear(CHUNK + 1));
        assert!(!flags.clear(CHUNK + 1), "cleared already");
        assert!(!flags.clear(n + 5), "past the last row");
        plain[CHUNK + 1] = false;
        assert!(taken.get(CHUNK + 1), "a copy taken before keeps its flags");
        assert_eq!(flags.count(), plain.iter().filter(|f| **f).count());
        assert_eq!(
            flags.iter_set().collect::<Vec<_>>(),
            (0..n).filter(|r| plain[*r]).collect::<Vec<_>>()
        );
        assert_eq!(flags.changed_since(&taken), vec![CHUNK..2 * CHUNK]);
        flags.push(true);
        assert_eq!(
            flags.changed_since(&taken),
            vec![CHUNK..2 * CHUNK, 3 * CHUNK..n + 1],
            "the last chunk grew"
        );
        let same = RowFlags::from_vec(plain.clone());
        assert_eq!(same.to_vec(), plain);
        assert_eq!((same.len(), same.count()), (n, flags.count() - 1));
        assert!((0..n).all(|r| same.get(r) == plain[r]));
    }
}
