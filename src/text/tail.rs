//! Tail segments: a memtable's rows past its index's last commit, indexed by a search as
//! postings in memory, and the evaluator that scores them as tantivy would.

use super::schema::TextSchema;
use super::{open_reader, MEMTABLE_WRITER_HEAP};
use crate::{Error, Result};
use arrow::array::RecordBatch;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tantivy::directory::RamDirectory;
use tantivy::{Searcher, TantivyDocument, Term};

/// Consecutive rows of a memtable that a search indexed itself because its index had not
/// committed them yet, shared by later searches until a commit of the memtable's index covers
/// them. They are held as postings in memory (each term's rows and positions), which is all a
/// query of terms, phrases and boolean clauses needs to score them exactly as tantivy would
/// ([`TailQuery`]); other queries read a tantivy segment of the same rows, built the first
/// time one asks.
pub(crate) struct TailSegment {
    /// The first row.
    pub(super) first: usize,
    /// `rows × fields` token counts, row-major.
    pub(super) counts: Vec<u32>,
    /// Tokens per field over its rows.
    pub(super) totals: Vec<u64>,
    pub(super) nfields: usize,
    /// Per text field, each term's postings over these rows.
    pub(super) postings: Vec<HashMap<String, TailPostings>>,
    /// The stored rows (tombstones included), and the memtable index whose schema and
    /// analyzers a tantivy segment of them is built with.
    pub(super) batches: Vec<RecordBatch>,
    pub(super) schema: Arc<TextSchema>,
    pub(super) index: tantivy::Index,
    /// A tantivy segment of the rows, built on demand (`Some(None)` when they are all
    /// tombstones); the lock is held while it is built, so it is built once.
    pub(super) segment: Mutex<Option<Option<Searcher>>>,
}

/// One term's occurrences in a tail segment: the rows holding it (ascending, relative to the
/// segment's first row) and, per row, its positions.
#[derive(Default)]
pub(super) struct TailPostings {
    pub(super) rows: Vec<u32>,
    /// `positions[ends[i - 1]..ends[i]]` are the term's positions in `rows[i]`, ascending.
    pub(super) ends: Vec<u32>,
    pub(super) positions: Vec<u32>,
}

impl TailPostings {
    pub(super) fn positions(&self, i: usize) -> &[u32] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.positions[start..self.ends[i] as usize]
    }
}

impl TailSegment {
    pub(super) fn rows(&self) -> usize {
        self.counts.len() / self.nfields.max(1)
    }

    pub(super) fn end(&self) -> usize {
        self.first + self.rows()
    }

    /// Token count of the segment's `row`-th row (from its first) in text field `field`.
    pub(super) fn tokens(&self, row: usize, field: usize) -> u32 {
        self.counts
            .get(row * self.nfields + field)
            .copied()
            .unwrap_or(0)
    }

    pub(super) fn postings(&self, term: &Term) -> Option<&TailPostings> {
        let field = self.schema.field_position(term.field())?;
        self.postings.get(field)?.get(term.value().as_str()?)
    }

    /// The tantivy segment of these rows (built now if no query asked for it before).
    pub(super) fn searcher(&self) -> Result<Option<Searcher>> {
        let mut segment = self.segment.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = &*segment {
            return Ok(s.clone());
        }
        let mut writer = tantivy::Index::builder()
            .schema(self.schema.schema.clone())
            .single_segment_index_writer::<TantivyDocument>(
                RamDirectory::create(),
                // The writer's hash table is sized from its budget: a small one for a few rows.
                (self.rows() * 4096).clamp(1 << 20, MEMTABLE_WRITER_HEAP),
            )?;
        let mut docs = 0usize;
        let mut first = self.first as u64;
        for b in &self.batches {
            self.schema.add_rows(
                &self.index,
                &mut |doc| {
                    docs += 1;
                    writer.add_document(doc).map_err(Error::from)
                },
                b,
                first,
            )?;
            first += b.num_rows() as u64;
        }
        let searcher = if docs == 0 {
            None
        } else {
            Some(open_reader(&writer.finalize()?)?.searcher())
        };
        *segment = Some(searcher.clone());
        Ok(searcher)
    }
}

/// A parsed query as it scores the rows of tail segments without a tantivy segment: the
/// clauses tantivy's query parser makes of terms and phrases, with the same BM25 weights (from
/// the snapshot's global statistics), fieldnorm ids and phrase counts as tantivy's scorers, and
/// the same matching rules as its boolean weight. Queries with any other clause (a range, a
/// prefix, a boost, a sloppy phrase...) are not compiled: they read a tantivy segment of the
/// tail instead.
pub(crate) enum TailQuery {
    /// Matches nothing.
    Nothing,
    Term {
        field: usize,
        term: Term,
        weight: tantivy::query::Bm25Weight,
    },
    /// Consecutive positions (slop 0), terms in order.
    Phrase {
        field: usize,
        terms: Vec<Term>,
        weight: tantivy::query::Bm25Weight,
    },
    Boolean {
        must: Vec<TailQuery>,
        should: Vec<TailQuery>,
        must_not: Vec<TailQuery>,
        /// How many `should` clauses a row must match.
        should_match: usize,
    },
}

/// fieldnorm id of a field holding `tokens` tokens, as tantivy encodes it.
pub(super) fn fieldnorm_id(tokens: u32) -> u8 {
    static TABLE: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..=255u8)
            .map(tantivy::fieldnorm::FieldNormReader::id_to_fieldnorm)
            .collect()
    });
    // The largest id whose fieldnorm is at most `tokens` (the table starts at 0).
    (table.partition_point(|n| *n <= tokens) - 1) as u8
}

/// Whether `q` is a phrase of consecutive positions without slop (what the query parser
/// makes of a quoted text whose analyzer drops no token): the phrase tail segments score. It is
/// when it equals the phrase built from its terms alone (offsets 0, 1, ..., slop 0).
///
/// tantivy 0.27 exposes a phrase's terms and field but neither its offsets nor its slop, so the
/// two are compared by their derived `Debug` forms, which print every field of the query (see
/// the test `a_phrase_with_slop_or_gaps_is_not_exact`, which fails if that stops telling them
/// apart).
fn is_exact_phrase(q: &tantivy::query::PhraseQuery) -> bool {
    let plain = tantivy::query::PhraseQuery::new(q.phrase_terms());
    format!("{q:?}") == format!("{plain:?}")
}

/// How many times a phrase occurs in a row (tantivy's phrase count): the positions of its first
/// term where each later term `k` (positions `rest[k - 1]`, ascending) is at `start + k`.
fn phrase_count(first: &[u32], rest: &[&[u32]]) -> u32 {
    first
        .iter()
        .filter(|start| {
            rest.iter()
                .enumerate()
                .all(|(k, ps)| ps.binary_search(&(**start + k as u32 + 1)).is_ok())
        })
        .count() as u32
}

impl TailQuery {
    /// Compile `query` (as [`crate::query::fts`] parses it) over `stats`, or `None` when it
    /// holds a clause tail segments cannot score without tantivy.
    pub(crate) fn compile(
        query: &dyn tantivy::query::Query,
        ts: &TextSchema,
        stats: &dyn tantivy::query::Bm25StatisticsProvider,
    ) -> Result<Option<TailQuery>> {
        use tantivy::query::{Bm25Weight, BooleanQuery, EmptyQuery, Occur, PhraseQuery, TermQuery};
        if query.downcast_ref::<EmptyQuery>().is_some() {
            return Ok(Some(TailQuery::Nothing));
        }
        if let Some(q) = query.downcast_ref::<TermQuery>() {
            let Some(field) = ts.field_position(q.term().field()) else {
                return Ok(None);
            };
            let weight = Bm25Weight::for_terms(stats, std::slice::from_ref(q.term()))?;
            return Ok(Some(TailQuery::Term {
                field,
                term: q.term().clone(),
                weight,
            }));
        }
        if let Some(q) = query.downcast_ref::<PhraseQuery>() {
            let terms = q.phrase_terms();
            if terms.len() < 2 || !is_exact_phrase(q) {
                return Ok(None);
            }
            let Some(field) = ts.field_position(q.field()) else {
                return Ok(None);
            };
            let weight = Bm25Weight::for_terms(stats, &terms)?;
            return Ok(Some(TailQuery::Phrase {
                field,
                terms,
                weight,
            }));
        }
        if let Some(q) = query.downcast_ref::<BooleanQuery>() {
            let (mut must, mut should, mut must_not) = (Vec::new(), Vec::new(), Vec::new());
            for (occur, sub) in q.clauses() {
                let Some(sub) = Self::compile(sub.as_ref(), ts, stats)? else {
                    return Ok(None);
                };
                match occur {
                    Occur::Must => must.push(sub),
                    Occur::Should => should.push(sub),
                    Occur::MustNot => must_not.push(sub),
                }
            }
            // As tantivy's boolean weight: as many required `should` clauses as there are
            // make them `must` clauses, more than there are match nothing, and without `must`
            // clauses at least one `should` clause must match.
            let mut should_match = q.get_minimum_number_should_match();
            if should_match > should.len() {
                return Ok(Some(TailQuery::Nothing));
            }
            if should_match == should.len() {
                must.append(&mut should);
                should_match = 0;
            }
            if must.is_empty() {
                if should.is_empty() {
                    return Ok(Some(TailQuery::Nothing));
                }
                should_match = should_match.max(1);
            }
            return Ok(Some(TailQuery::Boolean {
                must,
                should,
                must_not,
                should_match,
            }));
        }
        Ok(None)
    }

    /// The rows of `seg` (relative to its first row, ascending) that match, with their scores.
    pub(super) fn matches(&self, seg: &TailSegment) -> Vec<(u32, f32)> {
        let fieldnorm = |row: u32, field: usize| fieldnorm_id(seg.tokens(row as usize, field));
        match self {
            TailQuery::Nothing => Vec::new(),
            TailQuery::Term {
                field,
                term,
                weight,
            } => {
                let Some(p) = seg.postings(term) else {
                    return Vec::new();
                };
                p.rows
                    .iter()
                    .enumerate()
                    .map(|(i, row)| {
                        let tf = p.positions(i).len() as u32;
                        (*row, weight.score(fieldnorm(*row, *field), tf))
                    })
                    .collect()
            }
            TailQuery::Phrase {
                field,
                terms,
                weight,
            } => {
                let Some(postings) = terms
                    .iter()
                    .map(|t| seg.postings(t))
                    .collect::<Option<Vec<_>>>()
                else {
                    return Vec::new();
                };
                let mut out = Vec::new();
                // The positions of each term in the current row.
                let mut positions: Vec<&[u32]> = Vec::with_capacity(postings.len() - 1);
                'rows: for (i, row) in postings[0].rows.iter().enumerate() {
                    positions.clear();
                    for p in &postings[1..] {
                        match p.rows.binary_search(row) {
                            Ok(j) => positions.push(p.positions(j)),
                            Err(_) => continue 'rows,
                        }
                    }
                    let count = phrase_count(postings[0].positions(i), &positions);
                    if count > 0 {
                        out.push((*row, weight.score(fieldnorm(*row, *field), count)));
                    }
                }
                out
            }
            TailQuery::Boolean {
                must,
                should,
                must_not,
                should_match,
            } => {
                // The clauses' matches, by row: cost in proportion to the matches, not the rows.
                let excluded: std::collections::HashSet<u32> = must_not
                    .iter()
                    .flat_map(|q| q.matches(seg))
                    .map(|(row, _)| row)
                    .collect();
                // `(row, clause, score)`: clauses `0..must.len()` are `must`.
                let mut hits: Vec<(u32, usize, f32)> = Vec::new();
                for (c, q) in must.iter().chain(should).enumerate() {
                    hits.extend(q.matches(seg).into_iter().map(|(row, s)| (row, c, s)));
                }
                hits.sort_unstable_by_key(|h| (h.0, h.1));
                let mut out = Vec::new();
                for group in hits.chunk_by(|a, b| a.0 == b.0) {
                    let row = group[0].0;
                    let musts = group.iter().filter(|h| h.1 < must.len()).count();
                    let shoulds = group.len() - musts;
                    if musts == must.len() && shoulds >= *should_match && !excluded.contains(&row) {
                        out.push((row, group.iter().map(|h| h.2).sum()));
                    }
                }
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tantivy::query::PhraseQuery;
    use tantivy::schema::{Schema, TEXT};

    #[test]
    fn a_phrase_with_slop_or_gaps_is_not_exact() {
        let mut b = Schema::builder();
        let f = b.add_text_field("t", TEXT);
        let (red, fox) = (
            Term::from_field_text(f, "red"),
            Term::from_field_text(f, "fox"),
        );
        let exact = PhraseQuery::new(vec![red.clone(), fox.clone()]);
        assert!(is_exact_phrase(&exact));
        let mut sloppy = exact.clone();
        sloppy.set_slop(1);
        assert!(!is_exact_phrase(&sloppy), "a slop");
        let gap = PhraseQuery::new_with_offset(vec![(0, red), (2, fox)]);
        assert!(!is_exact_phrase(&gap), "a dropped token between the terms");
    }
}
