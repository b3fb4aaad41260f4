//! The terms of generations' rows a handle keeps for the updates of its dead-row statistics
//! (see [`super::dead_rows`]): rows read ahead of the searches that count them, and rows an
//! update read (an older view's search uncounts them). A row's text never changes, whichever
//! view holds it, so what is kept for a row of a generation stays true.

use super::dead_rows::RowTerms;
use super::source::SourceKey;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Bytes an entry costs beside its terms: its slot in its source's map, its place in the
/// order, the `Arc` and the row's struct.
const ENTRY_BYTES: usize = 160;

/// One row's terms, and what they cost.
#[derive(Debug)]
struct Kept {
    terms: Arc<RowTerms>,
    bytes: usize,
}

/// Rows' terms within a budget of bytes, oldest out first.
#[derive(Debug, Default)]
pub(super) struct TermsAhead {
    /// Per source, per row.
    sources: HashMap<SourceKey, HashMap<usize, Kept, foldhash::fast::RandomState>>,
    /// Rows, oldest first; an entry whose row is no longer kept (its source left) is skipped.
    order: VecDeque<(SourceKey, usize)>,
    bytes: usize,
    rows: usize,
}

impl TermsAhead {
    /// The kept terms of rows `rows` of `key`, where kept.
    pub(super) fn get(&self, key: SourceKey, rows: &[usize]) -> Vec<Option<Arc<RowTerms>>> {
        match self.sources.get(&key) {
            Some(kept) => rows
                .iter()
                .map(|r| kept.get(r).map(|k| k.terms.clone()))
                .collect(),
            None => vec![None; rows.len()],
        }
    }

    /// Whether row `row` of `key` is kept.
    pub(super) fn holds(&self, key: SourceKey, row: usize) -> bool {
        self.sources.get(&key).is_some_and(|k| k.contains_key(&row))
    }

    /// Keep `rows` of `key`, the oldest going past `budget`; returns what left (to be dropped
    /// once the caller's lock is released).
    pub(super) fn keep(
        &mut self,
        key: SourceKey,
        rows: Vec<(usize, Arc<RowTerms>)>,
        budget: usize,
    ) -> Vec<Arc<RowTerms>> {
        let mut gone = Vec::new();
        for (r, terms) in rows {
            let bytes = ENTRY_BYTES + terms.bytes();
            if bytes > budget {
                continue;
            }
            let kept = self.sources.entry(key).or_default();
            match kept.insert(r, Kept { terms, bytes }) {
                // Replaced: its place in the order stays.
                Some(old) => {
                    self.bytes -= old.bytes;
                    gone.push(old.terms);
                }
                None => {
                    self.order.push_back((key, r));
                    self.rows += 1;
                }
            }
            self.bytes += bytes;
        }
        while self.bytes > budget {
            let Some((k, r)) = self.order.pop_front() else {
                break;
            };
            if let Some(old) = self.remove(k, r) {
                gone.push(old);
            }
        }
        gone
    }

    /// Remove row `r` of `key`, if kept.
    fn remove(&mut self, key: SourceKey, r: usize) -> Option<Arc<RowTerms>> {
        let kept = self.sources.get_mut(&key)?;
        let old = kept.remove(&r)?;
        if kept.is_empty() {
            self.sources.remove(&key);
        }
        self.bytes -= old.bytes;
        self.rows -= 1;
        Some(old.terms)
    }

    /// Keep only the rows of sources `keep` names: a pass over the sources, not the rows
    /// (every snapshot asks). Returns what left.
    pub(super) fn retain(&mut self, keep: impl Fn(&SourceKey) -> bool) -> Vec<Arc<RowTerms>> {
        let mut gone = Vec::new();
        let dropped: Vec<SourceKey> = self.sources.keys().filter(|k| !keep(k)).copied().collect();
        for key in dropped {
            if let Some(kept) = self.sources.remove(&key) {
                for (_, k) in kept {
                    self.bytes -= k.bytes;
                    self.rows -= 1;
                    gone.push(k.terms);
                }
            }
        }
        // The order keeps the places of rows that left until they come out; past twice the
        // rows kept, it is rebuilt.
        if self.order.len() > 2 * self.rows + 1024 {
            let sources = &self.sources;
            self.order
                .retain(|(k, r)| sources.get(k).is_some_and(|s| s.contains_key(r)));
            self.order.shrink_to_fit();
        }
        gone
    }

    /// Rows kept, and their bytes.
    pub(super) fn held(&self) -> (u64, u64) {
        (self.rows as u64, self.bytes as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(from: usize, to: usize) -> Vec<(usize, Arc<RowTerms>)> {
        (from..to)
            .map(|r| (r, Arc::new(RowTerms::with_terms(10))))
            .collect()
    }

    #[test]
    fn rows_stay_within_the_budget_oldest_out_first() {
        let one = ENTRY_BYTES + RowTerms::with_terms(10).bytes();
        let budget = 10 * one;
        let (a, b) = (SourceKey::Generation(1, 1), SourceKey::Generation(2, 1));
        let mut kept = TermsAhead::default();
        assert!(kept.keep(a, rows(0, 8), budget).is_empty());
        let gone = kept.keep(b, rows(0, 5), budget);
        assert_eq!(gone.len(), 3, "the three oldest leave");
        assert_eq!(kept.held(), (10, 10 * one as u64));
        assert_eq!(
            kept.get(a, &[0, 2, 3, 7])
                .iter()
                .map(Option::is_some)
                .collect::<Vec<_>>(),
            [false, false, true, true]
        );
        assert!(kept.holds(b, 4) && !kept.holds(b, 5));
        // Kept again: replaced in place, counted once.
        assert_eq!(kept.keep(b, rows(4, 5), budget).len(), 1);
        assert_eq!(kept.held(), (10, 10 * one as u64));
        // A source that leaves takes its rows along; the others stay.
        let gone = kept.retain(|k| *k == b);
        assert_eq!(gone.len(), 5);
        assert_eq!(kept.held(), (5, 5 * one as u64));
        assert!(kept.holds(b, 0) && !kept.holds(a, 3));
        // A row larger than the budget is not kept.
        let mut small = TermsAhead::default();
        assert!(small.keep(a, rows(0, 1), one - 1).is_empty());
        assert_eq!(small.held(), (0, 0));
    }
}
