//! What a source's text index counts of rows a query must not: superseded versions, rows a newer
//! source supersedes, and (in a memtable) rows appended after the query's view was taken.
//!
//! BM25 over the snapshot needs, per query term, the documents holding it among the *live* rows
//! of every source, and the tokens per field over them. A text index knows its totals over every
//! document it holds; the live figures are those totals minus what the dead rows hold. The dead
//! rows of a source change little from one query to the next (a few appends supersede a few rows), so
//! a handle keeps, per source, the set of rows it counted as dead with their term and token
//! counts, and each query only tokenizes the rows that entered or left the set since the last
//! query, with the source's own analyzers. A query's cost is then one pass over a byte per row,
//! not a walk of every query term's postings.
//!
//! A memtable's index may hold rows appended after the query's view was taken (another search or
//! the background caught it up since); the view holds no text for them, so they are counted per
//! query from the postings of the few recent segments that hold them ([`past_view`]).

use super::live_rows::{lock, LiveRows};
use super::source::{Source, SourceKey};
use super::terms_ahead::{RowTerms, TermsAhead};
use crate::flags::RowFlags;
use crate::generation::Generation;
use crate::schema::DELETED_COLUMN;
use crate::text::{DocRows, TextIndex, TextSchema};
use crate::Result;
use arrow::array::RecordBatch;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::Mutex;
use tantivy::schema::IndexRecordOption;
use tantivy::tokenizer::TextAnalyzer;
use tantivy::{DocSet, Term, TERMINATED};

/// Rows of a generation whose text one read fetches, when its dead rows change.
const READ_ROWS: usize = 4096;

/// How long after a full-text search a writer reads superseded rows ahead.
const READ_AHEAD_AFTER_SEARCH: std::time::Duration = std::time::Duration::from_secs(10);

/// A row not counted as dead.
const NOT_COUNTED: u8 = 0;
/// A row counted as dead: its terms and tokens are in the totals.
const COUNTED: u8 = 1;
/// A tombstone: never a document of a text index.
const TOMBSTONE: u8 = 2;

/// The dead rows of one source that a handle last counted, with what they hold.
#[derive(Debug, Default)]
pub(crate) struct DeadRowStats {
    /// Per row: [`NOT_COUNTED`], [`COUNTED`] or [`TOMBSTONE`].
    state: Vec<u8>,
    /// Counted rows holding each term.
    doc_freq: HashMap<Term, u64, foldhash::fast::RandomState>,
    /// Tokens of the counted rows, per text field.
    tokens: Vec<u64>,
    /// The stored batches (and their first rows) of the longest view seen: they hold the text
    /// of every row ever counted, which a query with an older, shorter view may have to
    /// uncount (a row's text never changes, whichever view holds it).
    text: (Vec<RecordBatch>, Vec<usize>),
    /// The live rows and the rows covered at the last update: a row whose flag chunk and
    /// superseded-ness are the same as then, and that is covered as then, is counted as it was.
    /// Holding the flags keeps their chunks shared, so a change to one is a new chunk.
    last: Option<(LiveRows, usize)>,
}

impl DeadRowStats {
    /// Make the counted rows the dead rows of `source` for one query among the rows both its
    /// view and `index` hold (the first `live.len()`, tombstones aside): those `live` does not
    /// admit. Rows past the view are [`past_view`]'s. Only rows that may have changed since the
    /// last update are looked at: in flag chunks that changed, superseded in one of the two
    /// updates, or covered by one only.
    ///
    /// The terms of a generation's rows are taken from `ahead` where it holds them (read
    /// ahead of the search, or by an earlier update), and those read here are left there.
    pub(crate) fn update(
        &mut self,
        ts: &TextSchema,
        source: &Source,
        index: &TextIndex,
        live: &LiveRows,
        ahead: Option<&DeadRowCache>,
    ) -> Result<()> {
        let covered = index.rows().min(live.len());
        let visit = self.visit(live, covered);
        // A first count (every dead row of the source) leaves nothing to keep: what an older
        // view uncounts is what the updates after it counted.
        let counted_before = self.last.take().is_some();
        let held: usize = self.text.0.iter().map(RecordBatch::num_rows).sum();
        if let Some(batches) = source.memtable_batches() {
            if source.rows() > held || self.text.0.is_empty() {
                self.text = (batches.to_vec(), source.offsets().to_vec());
            }
        }
        let end = covered.max(self.state.len());
        if self.state.len() < end {
            self.state.resize(end, NOT_COUNTED);
        }
        if self.tokens.len() < ts.fields().len() {
            self.tokens.resize(ts.fields().len(), 0);
        }
        let mut analyzers: Option<Vec<TextAnalyzer>> = None;
        let changes = self.changes(visit, end, covered, live);
        // What is kept ahead is kept for a generation's rows read by range (a memtable's, or
        // a generation's held whole, are at hand).
        let ahead = ahead.filter(|_| matches!(source, Source::Generation(g) if g.reads_by_range()));
        let key = SourceKey::of(source);
        // A generation's changed rows are read a bounded number at a time.
        for part in changes.chunks(READ_ROWS) {
            let rows: Vec<usize> = part.iter().map(|c| c.0).collect();
            let mut known = match ahead {
                Some(a) => a.terms_ahead(key, &rows),
                None => vec![None; rows.len()],
            };
            let missing: Vec<usize> = rows
                .iter()
                .zip(&known)
                .filter(|(_, k)| k.is_none())
                .map(|(r, _)| *r)
                .collect();
            let fetched = read_changed(ts, source, &missing)?;
            let mut read = Vec::new();
            for (i, &(r, change)) in part.iter().enumerate() {
                let terms = match known[i].take() {
                    Some(t) => t,
                    None => {
                        let analyzers = match &mut analyzers {
                            Some(a) => a,
                            None => analyzers.insert(analyzers_of(ts, index)?),
                        };
                        let terms = Arc::new(match &fetched {
                            Some(b) => read_row_terms(analyzers, ts, b, read.len()),
                            None => {
                                let Some((batch, row)) = locate(&self.text, r) else {
                                    return Err(crate::Error::internal(format!(
                                        "row {r} is in no stored batch of its source"
                                    )));
                                };
                                let deleted = batch.schema().index_of(DELETED_COLUMN)?;
                                RowTerms::of(
                                    analyzers,
                                    ts.fields(),
                                    batch,
                                    row,
                                    ts.columns().iter().copied(),
                                    deleted,
                                )
                            }
                        });
                        if fetched.is_some() {
                            read.push((r, terms.clone()));
                        }
                        terms
                    }
                };
                if change > 0 && terms.tombstone {
                    self.state[r] = TOMBSTONE;
                    continue;
                }
                self.count(&terms, change);
                self.state[r] = if change > 0 { COUNTED } else { NOT_COUNTED };
            }
            if let (Some(a), true) = (ahead, counted_before) {
                a.keep_ahead(key, read, true);
            }
        }
        self.last = Some((live.clone(), covered));
        Ok(())
    }

    /// Rows whose state may have changed since the last update (all of them the first time),
    /// for a view `live` covering the first `covered` rows.
    fn visit(&self, live: &LiveRows, covered: usize) -> Vec<Range<usize>> {
        match &self.last {
            None => std::iter::once(0..covered.max(self.state.len())).collect(),
            Some((last, last_covered)) => {
                let mut v = live.own().changed_since(last.own());
                v.push(covered.min(*last_covered)..covered.max(*last_covered));
                if !Arc::ptr_eq(live.superseded(), last.superseded()) {
                    v.extend(
                        symmetric_difference(live.superseded().rows(), last.superseded().rows())
                            .map(|r| r as usize..r as usize + 1),
                    );
                }
                v
            }
        }
    }

    /// The rows the next update with view `live` (covering the first `covered` rows) counts as
    /// dead, when an update was made before (the first counts every row, which is not read
    /// ahead).
    fn pending(&self, live: &LiveRows, covered: usize) -> Vec<usize> {
        if self.last.is_none() {
            return Vec::new();
        }
        let visit = self.visit(live, covered);
        let end = covered.max(self.state.len());
        self.changes(visit, end, covered, live)
            .into_iter()
            .filter(|c| c.1 > 0)
            .map(|c| c.0)
            .collect()
    }

    /// Count a row's terms and tokens in (`change` > 0) or out.
    fn count(&mut self, terms: &RowTerms, change: i64) {
        for (pos, (n, distinct)) in terms.fields.iter().enumerate() {
            self.tokens[pos] = apply(self.tokens[pos], *n, change);
            for t in distinct {
                // A term no counted row holds leaves the map.
                match self.doc_freq.get_mut(t) {
                    Some(c) => match apply(*c, 1, change) {
                        0 => {
                            self.doc_freq.remove(t);
                        }
                        n => *c = n,
                    },
                    None if change > 0 => {
                        self.doc_freq.insert(t.clone(), 1);
                    }
                    None => {}
                }
            }
        }
    }

    /// The rows of `visit` (below `end`) whose state changes, each once, with `1` for a row
    /// to count as dead and `-1` for one to uncount.
    fn changes(
        &self,
        visit: Vec<Range<usize>>,
        end: usize,
        covered: usize,
        live: &LiveRows,
    ) -> Vec<(usize, i64)> {
        // The ranges to visit may overlap: merged, so that each row is visited once, in order.
        let mut visit: Vec<Range<usize>> = visit
            .into_iter()
            .map(|v| v.start.min(end)..v.end.min(end))
            .filter(|v| !v.is_empty())
            .collect();
        visit.sort_unstable_by_key(|v| v.start);
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(visit.len());
        for v in visit {
            match merged.last_mut() {
                Some(m) if v.start <= m.end => m.end = m.end.max(v.end),
                _ => merged.push(v),
            }
        }
        merged
            .into_iter()
            .flatten()
            .filter_map(|r| {
                let dead = r < covered && !live.admits(r);
                match (self.state.get(r).copied().unwrap_or(NOT_COUNTED), dead) {
                    (NOT_COUNTED, true) => Some((r, 1i64)),
                    (COUNTED, false) => Some((r, -1)),
                    _ => None,
                }
            })
            .collect()
    }

    /// The rows superseded besides the own flags at the last update (none before one).
    pub(crate) fn last_superseded(&self) -> Vec<u32> {
        self.last
            .as_ref()
            .map(|(live, _)| live.superseded().rows().to_vec())
            .unwrap_or_default()
    }

    /// Counted rows holding `term`.
    pub(crate) fn doc_freq(&self, term: &Term) -> u64 {
        self.doc_freq.get(term).copied().unwrap_or(0)
    }

    /// Tokens of text field number `field` over the counted rows.
    pub(crate) fn tokens(&self, field: usize) -> u64 {
        self.tokens.get(field).copied().unwrap_or(0)
    }
}

/// The dead-row statistics a handle keeps between queries, per source (a cache: anything
/// dropped is counted again).
#[derive(Default)]
pub(crate) struct DeadRowCache {
    sources: Mutex<HashMap<SourceKey, Arc<Mutex<DeadRowStats>>>>,
    /// The terms of generations' rows read ahead of the searches that count them (see
    /// [`DeadRowCache::pending`]), and by updates (an older view's search uncounts them).
    ahead: Mutex<TermsAhead>,
    /// Budget of `ahead`, in bytes ([`crate::Settings::dead_row_terms_bytes`]).
    ahead_budget: usize,
    /// When a full-text search last counted statistics.
    last_search: Mutex<Option<std::time::Instant>>,
    /// Called where counts are computed ahead without the locks: what a test checks there.
    #[cfg(test)]
    pub(super) computing: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

impl std::fmt::Debug for DeadRowCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadRowCache")
            .field("sources", &lock(&self.sources).len())
            .finish_non_exhaustive()
    }
}

impl DeadRowCache {
    /// A cache that keeps the terms of at most `ahead_budget` bytes of rows read ahead.
    pub(crate) fn new(ahead_budget: u64) -> DeadRowCache {
        DeadRowCache {
            ahead_budget: usize::try_from(ahead_budget).unwrap_or(usize::MAX),
            ..DeadRowCache::default()
        }
    }

    /// Whether rows are worth reading ahead: the budget holds some and a full-text search
    /// counted statistics in the last [`READ_AHEAD_AFTER_SEARCH`] (a writer that searched
    /// once and then only appends stops; its next search reads what it needs).
    pub(crate) fn reads_ahead(&self) -> bool {
        self.ahead_budget > 0
            && lock(&self.last_search).is_some_and(|t| t.elapsed() < READ_AHEAD_AFTER_SEARCH)
            && !lock(&self.sources).is_empty()
    }

    /// The rows of generation `source` (whose text index holds `rows` rows) that the next
    /// update with view `live` will count as dead and whose terms are not kept: at most
    /// [`READ_ROWS`] and what half the budget leaves room for beside the rows waiting, none
    /// when no search counted it yet or one is counting it now (this never waits for a
    /// search).
    pub(crate) fn pending(&self, source: &Source, rows: usize, live: &LiveRows) -> Vec<usize> {
        let key = SourceKey::of(source);
        let Some(stats) = lock(&self.sources).get(&key).cloned() else {
            return Vec::new();
        };
        let Ok(stats) = stats.try_lock() else {
            return Vec::new();
        };
        let mut pending = stats.pending(live, rows.min(live.len()));
        drop(stats);
        let ahead = lock(&self.ahead);
        pending.retain(|r| !ahead.holds(key, *r));
        // Within what may wait: rows read ahead are not pushed out by the next ones.
        let room = ahead.room_to_read(self.ahead_budget) / ahead.row_bytes().max(1);
        pending.truncate(READ_ROWS.min(room));
        pending
    }

    /// Read the text of rows `rows` of generation `g` (the text index `index`) and keep
    /// their terms: the update that counts them finds them here.
    pub(crate) async fn read_ahead(
        &self,
        ts: &TextSchema,
        g: &Arc<Generation>,
        index: &TextIndex,
        rows: &[usize],
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let batch = read_text(ts, g, rows).await?;
        let mut analyzers = analyzers_of(ts, index)?;
        let terms = rows
            .iter()
            .enumerate()
            .map(|(i, r)| (*r, Arc::new(read_row_terms(&mut analyzers, ts, &batch, i))))
            .collect();
        self.keep_ahead(SourceKey::of(&Source::Generation(g.clone())), terms, false);
        Ok(())
    }

    /// The kept terms of rows `rows` of `key`, where kept.
    fn terms_ahead(&self, key: SourceKey, rows: &[usize]) -> Vec<Option<Arc<RowTerms>>> {
        // Kept ahead: used now.
        lock(&self.ahead).get(key, rows)
    }

    /// Keep the terms of rows of `key`, the oldest kept going past the budget.
    fn keep_ahead(&self, key: SourceKey, rows: Vec<(usize, Arc<RowTerms>)>, used: bool) {
        if self.ahead_budget == 0 || rows.is_empty() {
            return;
        }
        let gone = lock(&self.ahead).keep(key, rows, self.ahead_budget, used);
        // Freed outside the lock.
        drop(gone);
    }

    /// Rows whose terms are kept, and their bytes.
    pub(crate) fn ahead_held(&self) -> (u64, u64) {
        lock(&self.ahead).held()
    }

    /// What `source`'s text index holds of rows that were dead for the last query that asked
    /// (a full-text search's: it keeps the reading ahead on).
    pub(crate) fn for_source(&self, source: &Source) -> Arc<Mutex<DeadRowStats>> {
        *lock(&self.last_search) = Some(std::time::Instant::now());
        lock(&self.sources)
            .entry(SourceKey::of(source))
            .or_default()
            .clone()
    }

    /// Whether statistics are kept for `key`.
    #[cfg(test)]
    pub(super) fn holds(&self, key: &SourceKey) -> bool {
        lock(&self.sources).contains_key(key)
    }

    /// Whether the cache's lock and every source's are free (a test's check).
    #[cfg(test)]
    pub(super) fn all_free(&self) -> bool {
        self.sources
            .try_lock()
            .is_ok_and(|d| d.values().all(|s| s.try_lock().is_ok()))
    }

    /// Keep the statistics of memtables and generations `keep` names, and drop the rest.
    pub(crate) fn retain(&self, keep: impl Fn(&SourceKey) -> bool) {
        lock(&self.sources).retain(|k, _| keep(k));
        let gone = lock(&self.ahead).retain(keep);
        // Freed outside the lock.
        drop(gone);
    }

    /// Whether statistics are kept for any source (a full-text search counted them).
    pub(crate) fn counts(&self) -> bool {
        !lock(&self.sources).is_empty()
    }

    /// Count ahead what each generation of `gens` (oldest first, with `own`, their own flags
    /// in that list) holds of the rows newer sources supersede, as the BM25 statistics count
    /// them: a merged generation holds many such rows, and counting them is a search's to do
    /// otherwise. A generation counted here for the first time is counted with the rows
    /// `superseded` says the memtables supersede of it. Only for a handle that counts
    /// statistics (one that ran a full-text search).
    ///
    /// With `recount`, the generations searches counted are counted again with the new list's
    /// flags and the rows memtables superseded at the last search (a flush's list: the rows
    /// its generation supersedes are counted then, not by a search). Without it (a
    /// compaction's, at the background's priority) they are left alone: a search would wait
    /// for the lock held meanwhile.
    pub(crate) fn compute_ahead(
        &self,
        gens: &[&Arc<Generation>],
        own: Vec<RowFlags>,
        superseded: &dyn Fn(&Generation) -> Vec<u32>,
        ts: &TextSchema,
        recount: bool,
    ) -> Result<()> {
        if !self.counts() {
            return Ok(());
        }
        for (g, own) in gens.iter().zip(own) {
            let Some(ti) = g.text() else {
                continue;
            };
            let source = Source::Generation(Arc::clone(g));
            let key = SourceKey::of(&source);
            let counted = lock(&self.sources).get(&key).cloned();
            match counted {
                // A generation a search counted is counted with the rows memtables superseded
                // then (else they would be counted back in, and out again by the next search).
                Some(dead) if recount => {
                    let mut dead = lock(&dead);
                    let superseded = dead.last_superseded();
                    dead.update(ts, &source, ti, &LiveRows::new(own, superseded), Some(self))?;
                }
                Some(_) => {}
                // Counted before any search can see it, then made visible: a search never
                // waits for this count (a compaction's runs at the background's priority).
                None => {
                    let mut fresh = DeadRowStats::default();
                    #[cfg(test)]
                    if let Some(f) = lock(&self.computing).clone() {
                        f();
                    }
                    // A compaction's count, at the background's priority, keeps the lock
                    // of the kept terms free: a search may wait for it.
                    let ahead = recount.then_some(self);
                    let live = LiveRows::new(own, superseded(g));
                    fresh.update(ts, &source, ti, &live, ahead)?;
                    lock(&self.sources)
                        .entry(key)
                        .or_insert_with(|| Arc::new(Mutex::new(fresh)));
                }
            }
        }
        Ok(())
    }
}

/// The rows in exactly one of two ascending lists.
fn symmetric_difference<'a>(a: &'a [u32], b: &'a [u32]) -> impl Iterator<Item = u32> + 'a {
    let (mut i, mut j) = (0, 0);
    std::iter::from_fn(move || loop {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x == y => {
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x < y => {
                i += 1;
                return Some(*x);
            }
            (Some(_), Some(y)) => {
                j += 1;
                return Some(*y);
            }
            (Some(x), None) => {
                i += 1;
                return Some(*x);
            }
            (None, Some(y)) => {
                j += 1;
                return Some(*y);
            }
            (None, None) => return None,
        }
    })
}

/// The text columns and `_deleted` of a generation's changed `rows`, in their order, read in
/// one go (a memtable's come from the longest view: `None`).
fn read_changed(ts: &TextSchema, source: &Source, rows: &[usize]) -> Result<Option<RecordBatch>> {
    let Source::Generation(g) = source else {
        return Ok(None);
    };
    if rows.is_empty() {
        return Ok(None);
    }
    g.block_on(read_text(ts, g, rows)).map(Some)
}

/// The text columns, then `_deleted`, of rows `rows` of `g`, in their order.
async fn read_text(ts: &TextSchema, g: &Generation, rows: &[usize]) -> Result<RecordBatch> {
    let cols = text_and_deleted(ts, g)?;
    let schema = Arc::new(g.schema().project(&cols)?);
    Ok(RecordBatch::try_new(
        schema,
        g.read_rows(rows, &cols).await?,
    )?)
}

/// The terms of row `row` of a batch [`read_text`] read.
fn read_row_terms(
    analyzers: &mut [TextAnalyzer],
    ts: &TextSchema,
    batch: &RecordBatch,
    row: usize,
) -> RowTerms {
    let n = ts.columns().len();
    RowTerms::of(analyzers, ts.fields(), batch, row, 0..n, n)
}

/// The stored columns of `g` an update reads of a row: its text columns, then `_deleted`.
fn text_and_deleted(ts: &TextSchema, g: &Generation) -> Result<Vec<usize>> {
    let mut cols = ts.columns().to_vec();
    cols.push(g.schema().index_of(DELETED_COLUMN)?);
    Ok(cols)
}

/// The analyzer of each text field of `index`, in the text schema's order.
fn analyzers_of(ts: &TextSchema, index: &TextIndex) -> Result<Vec<TextAnalyzer>> {
    Ok(ts
        .fields()
        .iter()
        .map(|f| index.searcher().index().tokenizer_for_field(*f))
        .collect::<tantivy::Result<_>>()?)
}

/// The batch holding row `r` of `(batches, first rows)`, and its row in it.
fn locate(text: &(Vec<RecordBatch>, Vec<usize>), r: usize) -> Option<(&RecordBatch, usize)> {
    let (batches, offsets) = text;
    let b = offsets.partition_point(|o| *o <= r).checked_sub(1)?;
    let batch = batches.get(b)?;
    let row = r - offsets[b];
    (row < batch.num_rows()).then_some((batch, row))
}

/// What `index` holds of its rows from `from` on (rows a memtable's view does not hold): each
/// of `terms`' documents among them, and their tokens per text field.
pub(crate) fn past_view(
    index: &TextIndex,
    fields: usize,
    from: usize,
    terms: &[Term],
) -> Result<(Vec<u64>, Vec<u64>)> {
    let mut tokens = vec![0u64; fields];
    for row in from..index.rows() {
        for (f, t) in tokens.iter_mut().enumerate() {
            *t += u64::from(index.tokens(row, f));
        }
    }
    let mut df = vec![0u64; terms.len()];
    if from >= index.rows() {
        return Ok((df, tokens));
    }
    for (ord, seg) in index.segment_readers().enumerate() {
        let rows = index.doc_rows(ord)?;
        // Rows grow with documents in a memtable's segments: most hold none of the newest.
        if let DocRows::Column(c) = &rows {
            if (c.max_value() as usize) < from {
                continue;
            }
        }
        for (t, n) in terms.iter().zip(df.iter_mut()) {
            let inv = seg.inverted_index(t.field())?;
            let Some(mut postings) = inv
                .read_postings(t, IndexRecordOption::Basic)
                .map_err(tantivy::TantivyError::from)?
            else {
                continue;
            };
            let mut doc = postings.doc();
            while doc != TERMINATED {
                if rows.get(doc).is_some_and(|r| r >= from) {
                    *n += 1;
                }
                doc = postings.advance();
            }
        }
    }
    for (t, n) in terms.iter().zip(df.iter_mut()) {
        *n += index.tail_doc_freq_from(t, from);
    }
    Ok((df, tokens))
}

/// `total` with `n` added (`change` > 0) or taken away.
fn apply(total: u64, n: u64, change: i64) -> u64 {
    if change > 0 {
        total + n
    } else {
        total.saturating_sub(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::RowFlags;
    use crate::memtable::MemtableView;
    use crate::schema::IndexSchema;
    use crate::text::MemTextIndex;
    use arrow::array::{ArrayRef, RecordBatch, StringArray};
    use std::sync::Arc;

    /// Document frequencies and tokens of the `dead` rows, from a tantivy index of those rows
    /// alone.
    fn reference(
        ts: &TextSchema,
        batches: &[RecordBatch],
        dead: &[usize],
        terms: &[Term],
    ) -> (Vec<u64>, u64) {
        let all = arrow::compute::concat_batches(&batches[0].schema(), batches).unwrap();
        let idx = arrow::array::UInt32Array::from_iter_values(dead.iter().map(|r| *r as u32));
        let cols = all
            .columns()
            .iter()
            .map(|c| arrow::compute::take(c, &idx, None).unwrap())
            .collect();
        let rows = RecordBatch::try_new(all.schema(), cols).unwrap();
        let (index, _) = TextIndex::build(ts, &rows).unwrap();
        let df = terms
            .iter()
            .map(|t| index.searcher().doc_freq(t).unwrap())
            .collect();
        (df, index.total_tokens(0))
    }

    /// Four rows, a tombstone of "k1", then "k0" again and "k4"; the text schema, its six
    /// query terms.
    fn dead_rows_fixture() -> (Arc<TextSchema>, Vec<RecordBatch>, Vec<Term>) {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t"]}"#).unwrap();
        let ts = TextSchema::new(&s).unwrap();
        let stored = |keys: Vec<&str>, texts: Vec<Option<&str>>, seq| {
            let keys: ArrayRef = Arc::new(StringArray::from(keys));
            let texts: ArrayRef = Arc::new(StringArray::from(texts));
            let user = RecordBatch::try_new(s.arrow_schema(), vec![keys, texts]).unwrap();
            s.to_stored(&user, seq).unwrap()
        };
        let tomb: ArrayRef = Arc::new(StringArray::from(vec!["k1"]));
        let batches = vec![
            stored(
                vec!["k0", "k1", "k2", "k3"],
                vec![
                    Some("alpha beta beta"),
                    Some("beta gamma"),
                    None,
                    Some("Gamma delta"),
                ],
                1,
            ),
            s.tombstones(&tomb, 5).unwrap(),
            stored(
                vec!["k0", "k4"],
                vec![Some("alpha alpha"), Some("epsilon beta")],
                6,
            ),
        ];
        let terms: Vec<Term> = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
            .iter()
            .map(|w| Term::from_field_text(ts.fields()[0], w))
            .collect();
        (ts, batches, terms)
    }

    /// A view of the first `rows` rows of the fixture's `batches` (it holds only the batches
    /// with them), with `mem` as its text index.
    fn view_source(batches: &[RecordBatch], mem: &Arc<MemTextIndex>, rows: usize) -> Source {
        let n = [0, 4, 5].iter().filter(|o| **o < rows).count();
        let view = MemtableView {
            id: 1,
            batches: batches[..n].to_vec(),
            offsets: vec![0, 4, 5][..n].to_vec(),
            rows,
            live: RowFlags::default(),
            text: Some(mem.clone()),
            graph: None,
            row_hashes: Vec::new(),
        };
        Source::memtable("memtable 1", view)
    }

    #[test]
    fn counts_follow_the_dead_rows_of_each_query_in_any_order() {
        let (ts, batches, terms) = dead_rows_fixture();
        let mem = Arc::new(MemTextIndex::new(ts.clone()).unwrap());
        let source = |rows: usize| view_source(&batches, &mem, rows);
        mem.commit(&batches, 7).unwrap();
        let full = mem.view(&batches, 7).unwrap();
        // The same rows as a search sees them when the index committed only the first batch:
        // the rest in two tail segments (the first all tombstones) built by two searches.
        let tailed = Arc::new(MemTextIndex::new(ts.clone()).unwrap());
        tailed.commit(&batches, 2).unwrap();
        tailed.view(&batches, 5).unwrap();
        let tailed = tailed.view(&batches, 7).unwrap();
        assert_eq!(tailed.rows(), 7);
        // Live rows of successive queries, newer and older views interleaved; the index holds rows
        // past a short view, which the view has no text for.
        let mut deads = [Box::<DeadRowStats>::default(), Box::default()];
        let flags: [&[bool]; 9] = [
            &[true; 7],
            &[false, false, true, true, false, true, true],
            &[true, true, true, true, false, false, true],
            &[false, false, true, true, false, true, true],
            &[true, false, true],
            &[false, true, true, true, false],
            &[false; 7],
            // An older view after a newer one counted rows past it as dead.
            &[true, false, true],
            &[true; 7],
        ];
        // Then the same flags less rows newer memtables supersede, and flags changed in place (as a
        // memtable's are when a row is superseded): only what changed is looked at again.
        let base = RowFlags::from_vec(vec![true; 7]);
        let mut cleared = base.clone();
        cleared.clear(2);
        let lives: Vec<LiveRows> = flags
            .iter()
            .map(|m| LiveRows::from_vec(m.to_vec()))
            .chain([
                LiveRows::new(base.clone(), vec![1, 5]),
                LiveRows::new(base.clone(), vec![5]),
                LiveRows::new(base.clone(), vec![0, 3, 6]),
                LiveRows::new(cleared.clone(), vec![0, 3, 6]),
                LiveRows::new(cleared, vec![]),
                LiveRows::new(base, vec![]),
            ])
            .collect();
        for (index, live) in [&full, &tailed]
            .into_iter()
            .flat_map(|i| lives.iter().map(move |m| (i, m)))
        {
            let dead = &mut *deads[usize::from(std::ptr::eq(index, &tailed))];
            let flags: Vec<bool> = (0..live.len()).map(|r| live.admits(r)).collect();
            dead.update(&ts, &source(flags.len()), index, live, None)
                .unwrap();
            let (past_df, past_tokens) = past_view(index, 1, flags.len(), &terms).unwrap();
            let expect: Vec<usize> = (0..7)
                .filter(|r| *r != 4 && !flags.get(*r).copied().unwrap_or(false))
                .collect();
            let (df, tokens) = reference(&ts, &batches, &expect, &terms);
            let got: Vec<u64> = terms
                .iter()
                .zip(&past_df)
                .map(|(t, p)| dead.doc_freq(t) + p)
                .collect();
            assert_eq!(got, df, "flags {flags:?}");
            assert_eq!(dead.tokens(0) + past_tokens[0], tokens, "flags {flags:?}");
        }
    }

    #[test]
    fn rows_an_index_newly_covers_are_counted() {
        // The same live rows while the index catches up with them: the rows it newly covers
        // are counted although their flags did not change.
        let (ts, batches, terms) = dead_rows_fixture();
        let mem = Arc::new(MemTextIndex::new(ts.clone()).unwrap());
        mem.commit(&batches, 7).unwrap();
        let source = |rows: usize| view_source(&batches, &mem, rows);
        let growing = Arc::new(MemTextIndex::new(ts.clone()).unwrap());
        growing.commit(&batches, 2).unwrap();
        let short = growing.view(&batches, 5).unwrap();
        let long = growing.view(&batches, 7).unwrap();
        assert_eq!((short.rows(), long.rows()), (5, 7));
        let live = LiveRows::new(RowFlags::from_vec(vec![true; 7]), vec![1, 6]);
        let mut dead = DeadRowStats::default();
        let steps: [(&TextIndex, &[usize]); 3] = [(&short, &[1]), (&long, &[1, 6]), (&short, &[1])];
        for (index, expect) in steps {
            dead.update(&ts, &source(7), index, &live, None).unwrap();
            let (df, tokens) = reference(&ts, &batches, expect, &terms);
            let got: Vec<u64> = terms.iter().map(|t| dead.doc_freq(t)).collect();
            assert_eq!(got, df, "index of {} rows", index.rows());
            assert_eq!(dead.tokens(0), tokens, "index of {} rows", index.rows());
        }
    }
}
