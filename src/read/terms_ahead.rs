//! The terms of generations' rows a handle keeps for the updates of its dead-row statistics
//! (see [`super::dead_rows`]): rows read ahead of the searches that count them (*waiting*
//! until an update uses them), and rows an update used or read (an older view's search
//! uncounts them). A row's text never changes, whichever view holds it, so what is kept for
//! a row of a generation stays true.
//!
//! Past the budget, used rows leave first, oldest first; waiting ones only when no used row
//! is left, and the reading ahead stops while half the budget waits (see
//! [`TermsAhead::room_to_read`]): rows read ahead are not pushed out by the next ones read
//! and read again, however many appends supersede before a search counts them.

use super::source::SourceKey;
use crate::text::in_postings;
use arrow::array::{Array, AsArray, RecordBatch};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use tantivy::schema::Field;
use tantivy::tokenizer::TextAnalyzer;
use tantivy::Term;

/// What one row holds as the BM25 statistics count it: whether it is a tombstone (never a
/// document of a text index), and per text field its tokens and its distinct terms.
#[derive(Debug)]
pub(crate) struct RowTerms {
    pub(super) tombstone: bool,
    pub(super) fields: Vec<(u64, Vec<Term>)>,
}

impl RowTerms {
    /// Row `row` of `batch` (text columns `text_cols`, in the order of the text schema's
    /// `fields`, and `_deleted` at `deleted`), tokenized by `analyzers` as its index
    /// tokenized it.
    pub(super) fn of(
        analyzers: &mut [TextAnalyzer],
        fields: &[Field],
        batch: &RecordBatch,
        row: usize,
        text_cols: impl Iterator<Item = usize>,
        deleted: usize,
    ) -> RowTerms {
        if batch.column(deleted).as_boolean().value(row) {
            return RowTerms {
                tombstone: true,
                fields: Vec::new(),
            };
        }
        let fields = text_cols
            .zip(fields)
            .zip(analyzers.iter_mut())
            .map(|((col, field), analyzer)| {
                let col = batch.column(col).as_string::<i32>();
                if col.is_null(row) {
                    return (0, Vec::new());
                }
                let mut distinct: HashSet<String, foldhash::fast::RandomState> = HashSet::default();
                let mut n = 0u64;
                let mut stream = analyzer.token_stream(col.value(row));
                while stream.advance() {
                    let t = &stream.token().text;
                    if !in_postings(t) {
                        continue;
                    }
                    n += 1;
                    if !distinct.contains(t.as_str()) {
                        distinct.insert(t.clone());
                    }
                }
                let terms = distinct
                    .iter()
                    .map(|t| Term::from_field_text(*field, t))
                    .collect();
                (n, terms)
            })
            .collect();
        RowTerms {
            tombstone: false,
            fields,
        }
    }

    /// A row of one text field holding `terms` distinct terms (a test's).
    #[cfg(test)]
    pub(super) fn with_terms(terms: usize) -> RowTerms {
        let field = Field::from_field_id(0);
        RowTerms {
            tombstone: false,
            fields: vec![(
                terms as u64,
                (0..terms)
                    .map(|i| Term::from_field_text(field, &format!("t{i}")))
                    .collect(),
            )],
        }
    }

    /// Bytes its terms hold, about.
    pub(super) fn bytes(&self) -> usize {
        self.fields
            .iter()
            .map(|(_, terms)| {
                32 + terms
                    .iter()
                    .map(|t| 40 + t.serialized_value_bytes().len())
                    .sum::<usize>()
            })
            .sum::<usize>()
    }
}

/// Bytes an entry costs beside its terms: its slot in its source's map, its place in the
/// order, the `Arc` and the row's struct.
const ENTRY_BYTES: usize = 160;

/// One row's terms, what they cost, and whether an update used them.
#[derive(Debug)]
struct Kept {
    terms: Arc<RowTerms>,
    bytes: usize,
    used: bool,
}

/// Rows' terms within a budget of bytes, oldest out first.
#[derive(Debug, Default)]
pub(super) struct TermsAhead {
    /// Per source, per row.
    sources: HashMap<SourceKey, HashMap<usize, Kept, foldhash::fast::RandomState>>,
    /// Rows used, oldest first, and rows waiting; an entry whose row is no longer kept (its
    /// source left), or no longer waiting, is skipped.
    used: VecDeque<(SourceKey, usize)>,
    waiting: VecDeque<(SourceKey, usize)>,
    bytes: usize,
    rows: usize,
    /// Bytes of the rows waiting.
    waiting_bytes: usize,
}

impl TermsAhead {
    /// The kept terms of rows `rows` of `key`, where kept, now used.
    pub(super) fn get(&mut self, key: SourceKey, rows: &[usize]) -> Vec<Option<Arc<RowTerms>>> {
        let Some(kept) = self.sources.get_mut(&key) else {
            return vec![None; rows.len()];
        };
        rows.iter()
            .map(|r| {
                let k = kept.get_mut(r)?;
                if !k.used {
                    k.used = true;
                    self.waiting_bytes -= k.bytes;
                    self.used.push_back((key, *r));
                }
                Some(k.terms.clone())
            })
            .collect()
    }

    /// Bytes of rows that may be read ahead now: what is left of half the budget once the
    /// rows waiting are counted.
    pub(super) fn room_to_read(&self, budget: usize) -> usize {
        (budget / 2).saturating_sub(self.waiting_bytes)
    }

    /// Bytes a kept row costs on average (an estimate of the next one's before it is read).
    pub(super) fn row_bytes(&self) -> usize {
        match self.rows {
            0 => ENTRY_BYTES + 4096,
            n => self.bytes / n,
        }
    }

    /// Whether row `row` of `key` is kept.
    pub(super) fn holds(&self, key: SourceKey, row: usize) -> bool {
        self.sources.get(&key).is_some_and(|k| k.contains_key(&row))
    }

    /// Keep `rows` of `key` (rows already kept stay as they are), `used` or waiting, used
    /// rows then waiting ones going past `budget`, oldest first; returns what left (to be
    /// dropped once the caller's lock is released).
    pub(super) fn keep(
        &mut self,
        key: SourceKey,
        rows: Vec<(usize, Arc<RowTerms>)>,
        budget: usize,
        used: bool,
    ) -> Vec<Arc<RowTerms>> {
        let mut gone = Vec::new();
        for (r, terms) in rows {
            let bytes = ENTRY_BYTES + terms.bytes();
            if bytes > budget {
                continue;
            }
            let kept = self.sources.entry(key).or_default();
            if kept.contains_key(&r) {
                gone.push(terms);
                continue;
            }
            kept.insert(r, Kept { terms, bytes, used });
            self.rows += 1;
            self.bytes += bytes;
            if used {
                self.used.push_back((key, r));
            } else {
                self.waiting_bytes += bytes;
                self.waiting.push_back((key, r));
            }
        }
        while self.bytes > budget {
            let next = match self.used.pop_front() {
                Some(u) => Some((u, true)),
                None => self.waiting.pop_front().map(|w| (w, false)),
            };
            let Some(((k, r), used)) = next else {
                break;
            };
            if let Some(old) = self.remove(k, r, used) {
                gone.push(old);
            }
        }
        gone
    }

    /// Remove row `r` of `key`, if kept and `used` (or waiting, without).
    fn remove(&mut self, key: SourceKey, r: usize, used: bool) -> Option<Arc<RowTerms>> {
        let kept = self.sources.get_mut(&key)?;
        if kept.get(&r)?.used != used {
            return None;
        }
        let old = kept.remove(&r)?;
        if kept.is_empty() {
            self.sources.remove(&key);
        }
        self.bytes -= old.bytes;
        self.rows -= 1;
        if !old.used {
            self.waiting_bytes -= old.bytes;
        }
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
                    if !k.used {
                        self.waiting_bytes -= k.bytes;
                    }
                    gone.push(k.terms);
                }
            }
        }
        // The orders keep the places of rows that left until they come out; past twice the
        // rows kept, they are rebuilt.
        if self.used.len() + self.waiting.len() > 2 * self.rows + 1024 {
            let sources = &self.sources;
            let is = |k: &SourceKey, r: &usize, used: bool| {
                sources
                    .get(k)
                    .and_then(|s| s.get(r))
                    .is_some_and(|e| e.used == used)
            };
            self.used.retain(|(k, r)| is(k, r, true));
            self.waiting.retain(|(k, r)| is(k, r, false));
            self.used.shrink_to_fit();
            self.waiting.shrink_to_fit();
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
        assert!(kept.keep(a, rows(0, 8), budget, true).is_empty());
        let gone = kept.keep(b, rows(0, 5), budget, true);
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
        // Kept again: the row stays as it was, counted once.
        assert_eq!(kept.keep(b, rows(4, 5), budget, true).len(), 1);
        assert_eq!(kept.held(), (10, 10 * one as u64));
        // A source that leaves takes its rows along; the others stay.
        let gone = kept.retain(|k| *k == b);
        assert_eq!(gone.len(), 5);
        assert_eq!(kept.held(), (5, 5 * one as u64));
        assert!(kept.holds(b, 0) && !kept.holds(a, 3));
        // A row larger than the budget is not kept.
        let mut small = TermsAhead::default();
        assert!(small.keep(a, rows(0, 1), one - 1, true).is_empty());
        assert_eq!(small.held(), (0, 0));
    }

    #[test]
    fn rows_read_ahead_outlast_used_ones_and_cap_the_reading() {
        let one = ENTRY_BYTES + RowTerms::with_terms(10).bytes();
        let budget = 10 * one;
        let g = SourceKey::Generation(1, 1);
        let mut kept = TermsAhead::default();
        assert_eq!(kept.room_to_read(budget), 5 * one);
        // Four rows read ahead wait; six used ones fill the budget.
        kept.keep(g, rows(0, 4), budget, false);
        assert_eq!(kept.room_to_read(budget), one);
        kept.keep(g, rows(100, 106), budget, true);
        // Two more used rows push out the two oldest used ones, not the waiting ones.
        let gone = kept.keep(g, rows(200, 202), budget, true);
        assert_eq!(gone.len(), 2);
        assert!((0..4).all(|r| kept.holds(g, r)));
        assert!(!kept.holds(g, 100) && !kept.holds(g, 101) && kept.holds(g, 102));
        // An update uses two waiting rows: they join the used ones as the newest, and room
        // opens for reading ahead.
        kept.get(g, &[0, 1]);
        assert_eq!(kept.room_to_read(budget), 3 * one);
        let gone = kept.keep(g, rows(300, 301), budget, true);
        assert_eq!(gone.len(), 1);
        assert!(!kept.holds(g, 102), "the oldest used row left");
        assert!(kept.holds(g, 0) && kept.holds(g, 2));
        // With only waiting rows left to go, they go, oldest first.
        let mut waiting = TermsAhead::default();
        waiting.keep(g, rows(0, 10), budget, false);
        assert_eq!(waiting.room_to_read(budget), 0);
        waiting.keep(g, rows(10, 11), budget, false);
        assert!(!waiting.holds(g, 0) && waiting.holds(g, 10));
    }
}
