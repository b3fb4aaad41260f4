//! The memtable's text index: a tantivy index in memory that commits in the background, read
//! by searches with the tail segments past its last commit.

use super::index::TextIndex;
use super::schema::TextSchema;
use super::tail::{TailPostings, TailSegment};
use super::{in_postings, open_reader, token_totals, MEMTABLE_WRITER_HEAP};
use crate::schema::deleted_flags;
use crate::{Error, Result};
use arrow::array::{Array, AsArray, RecordBatch};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tantivy::{IndexReader, IndexWriter, TantivyDocument};

pub(super) struct MemState {
    pub(super) writer: Option<IndexWriter<TantivyDocument>>,
    pub(super) reader: IndexReader,
    /// Token counts of the committed rows, row-major.
    pub(super) counts: Vec<u32>,
    /// Tokens per field over the committed rows.
    pub(super) totals: Vec<u64>,
    pub(super) indexed_rows: usize,
}

/// A search commits nothing: it tokenizes the rows its view holds past the last commit into a
/// tail segment, and asks for a commit in the background once the tail holds this many rows...
/// Tail rows cost a search little (postings in memory, shared by later searches); each commit
/// costs a tantivy segment and, later, merges of it. The graph inserter commits between its
/// chunks at the same threshold.
const TAIL_COMMIT_ROWS: usize = 2048;
/// ... or this many tail segments.
const TAIL_COMMIT_SEGMENTS: usize = 12;
/// The most tail segments a search reads: with more (a commit that is slow to come), the
/// next search tokenizes the rows past the commit into one segment again.
const TAIL_MAX_SEGMENTS: usize = 32;

/// Drop the tail segments a commit up to row `from` covers; all of them when the first left
/// starts past it (one straddled the commit).
pub(super) fn prune_tail(tail: &mut Vec<Arc<TailSegment>>, from: usize) {
    tail.retain(|t| t.first >= from);
    if tail.first().is_some_and(|t| t.first != from) {
        tail.clear();
    }
}

/// The full-text index of a memtable: a tantivy index in memory that commits in the background
/// (between the graph inserter's chunks, or on a thread a search starts), so appends never wait
/// for indexing and searches never wait for a commit. A search reads the last commit, and the
/// rows its view holds past it from tail segments it builds itself (see [`MemTextIndex::view`]).
pub(crate) struct MemTextIndex {
    pub(super) schema: Arc<TextSchema>,
    pub(super) index: tantivy::Index,
    /// The writer and what it committed: held by a commit for as long as it indexes.
    pub(super) state: Mutex<MemState>,
    /// What the last commit published, without tail segments.
    pub(super) committed: Mutex<TextIndex>,
    /// Tail segments searches built past `committed`, over consecutive rows.
    pub(super) tail: Mutex<Vec<Arc<TailSegment>>>,
    /// A commit a search asked for is running.
    pub(super) committing: Arc<std::sync::atomic::AtomicBool>,
    /// Set by the first search that reads this index: from then on the background inserter
    /// keeps it up to date too.
    pub(super) searched: std::sync::atomic::AtomicBool,
    /// Tests: fail the next commit (after its rows were added to the writer).
    #[cfg(test)]
    pub(super) fail_next_commit: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for MemTextIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemTextIndex")
    }
}

/// The searcher of `st`'s last commit and its counts, as a source's text index.
pub(super) fn published(st: &MemState, nfields: usize) -> TextIndex {
    let totals = std::sync::OnceLock::new();
    let _ = totals.set(st.totals.clone());
    TextIndex {
        doc_rows: None,
        searcher: st.reader.searcher(),
        counts: Arc::new(st.counts.clone()),
        committed: st.counts.len() / nfields.max(1),
        totals: Arc::new(totals),
        nfields,
        tail: Arc::new([]),
        cold: None,
    }
}

impl MemTextIndex {
    /// An empty memtable index.
    pub(crate) fn new(schema: Arc<TextSchema>) -> Result<Self> {
        let index = schema.empty_index();
        let reader = open_reader(&index)?;
        let nfields = schema.fields.len();
        let st = MemState {
            writer: None,
            reader,
            counts: Vec::new(),
            totals: vec![0; nfields],
            indexed_rows: 0,
        };
        Ok(MemTextIndex {
            committed: Mutex::new(published(&st, nfields)),
            schema,
            index,
            state: Mutex::new(st),
            tail: Mutex::default(),
            committing: Arc::default(),
            searched: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            fail_next_commit: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Index the rows of `batches` from `st.indexed_rows` up to at least `rows`, and commit.
    pub(super) fn index_rows(
        &self,
        st: &mut MemState,
        batches: &[RecordBatch],
        rows: usize,
    ) -> Result<()> {
        if st.writer.is_none() {
            st.writer = Some(
                self.index
                    .writer_with_num_threads(1, MEMTABLE_WRITER_HEAP)?,
            );
        }
        let mut offset = 0usize;
        let mut new_counts = Vec::new();
        let start = st.indexed_rows;
        {
            let writer = st.writer.as_ref().expect("just created");
            for b in batches {
                let end = offset + b.num_rows();
                if end > start && offset < rows {
                    let from = start.saturating_sub(offset);
                    let slice = b.slice(from, b.num_rows() - from);
                    new_counts.extend(self.schema.add_rows(
                        &self.index,
                        &mut |doc| writer.add_document(doc).map(drop).map_err(Error::from),
                        &slice,
                        (offset + from) as u64,
                    )?);
                }
                offset = end;
            }
        }
        let writer = st.writer.as_mut().expect("just created");
        #[cfg(test)]
        if self
            .fail_next_commit
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(Error::internal("injected commit failure"));
        }
        writer.commit()?;
        // Committed: these rows are indexed whatever happens next.
        st.indexed_rows = offset.max(start);
        let nfields = self.schema.fields.len();
        for (t, n) in st.totals.iter_mut().zip(token_totals(&new_counts, nfields)) {
            *t += n;
        }
        st.counts.extend(new_counts);
        st.reader.reload()?;
        *self.committed.lock().unwrap_or_else(|e| e.into_inner()) = published(st, nfields);
        Ok(())
    }

    /// Record that a search reads this index (see [`MemTextIndex::searched`]).
    pub(crate) fn mark_searched(&self) {
        self.searched
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a search has read this index.
    pub(crate) fn searched(&self) -> bool {
        self.searched.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Commit (as [`MemTextIndex::commit`]) once the rows or tail segments past the last commit
    /// reach the threshold at which a search asks for one.
    pub(crate) fn commit_due(&self, batches: &[RecordBatch], rows: usize) -> Result<()> {
        let committed = self.committed_rows();
        // Segments a commit already covers do not count.
        let segments = self
            .tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|t| t.first >= committed)
            .count();
        if rows.saturating_sub(committed) < TAIL_COMMIT_ROWS && segments < TAIL_COMMIT_SEGMENTS {
            return Ok(());
        }
        self.commit(batches, rows)
    }

    /// Index and commit the first `rows` rows of `batches` (the memtable's stored batches, in
    /// order) or more. The background's: a search calls [`MemTextIndex::view`].
    pub(crate) fn commit(&self, batches: &[RecordBatch], rows: usize) -> Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.indexed_rows < rows {
            if let Err(e) = self.index_rows(&mut st, batches, rows) {
                // Dropping the writer discards the documents it added but did not commit, so
                // the next commit starts again from `indexed_rows` without duplicates.
                st.writer = None;
                return Err(e);
            }
        }
        Ok(())
    }

    /// The index a search of the first `rows` rows of `batches` reads: the last commit, and
    /// tail segments over the rows past it. Tail segments built by earlier searches are
    /// reused, so a search indexes only the rows appended since the last search; it never
    /// commits, reloads or waits for a commit, and asks for one on a thread of its own once the
    /// tail grows. Rows beyond `rows` may be covered too; callers mask them.
    pub(crate) fn view(
        self: &Arc<Self>,
        batches: &[RecordBatch],
        rows: usize,
    ) -> Result<TextIndex> {
        let committed = self
            .committed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let from = committed.committed_rows();
        if from >= rows {
            return Ok(committed);
        }
        let segments = self.tail_through(from, batches, rows)?;
        if rows - from >= TAIL_COMMIT_ROWS || segments.len() >= TAIL_COMMIT_SEGMENTS {
            self.commit_in_background(batches, rows);
        }
        Ok(TextIndex {
            tail: segments,
            cold: None,
            ..committed
        })
    }

    /// Tokenize the rows past the last commit up to `rows` that no search or earlier call
    /// tokenized, for searches to share (the background's, between graph chunks). It tokenizes
    /// without holding the tail, which searches wait for, and adds its segment only if the tail
    /// still ends where it began.
    pub(crate) fn extend_tail(&self, batches: &[RecordBatch], rows: usize) -> Result<()> {
        let end = {
            let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
            let from = self.committed_rows();
            prune_tail(&mut tail, from);
            if tail.len() + 1 >= TAIL_MAX_SEGMENTS {
                return Ok(());
            }
            tail.last().map_or(from, |t| t.end())
        };
        if end >= rows {
            return Ok(());
        }
        let segment = self.tail_segment(batches, end, rows)?;
        let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        let from = self.committed_rows();
        prune_tail(&mut tail, from);
        if tail.last().map_or(from, |t| t.end()) == end {
            tail.push(Arc::new(segment));
        }
        Ok(())
    }

    /// Rows the last commit published.
    pub(super) fn committed_rows(&self) -> usize {
        self.committed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .committed_rows()
    }

    /// The tail segments from row `from` (the last commit) through row `rows` at least,
    /// tokenizing the rows no earlier caller did.
    pub(super) fn tail_through(
        &self,
        from: usize,
        batches: &[RecordBatch],
        rows: usize,
    ) -> Result<Arc<[Arc<TailSegment>]>> {
        let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        prune_tail(&mut tail, from);
        // However long the background's commit takes, a search reads a bounded number of
        // segments: past that many, one segment replaces them.
        if tail.len() >= TAIL_MAX_SEGMENTS {
            tail.clear();
        }
        let end = tail.last().map_or(from, |t| t.end());
        if end < rows {
            let started = std::time::Instant::now();
            tail.push(Arc::new(self.tail_segment(batches, end, rows)?));
            tracing::debug!(
                rows = rows - end,
                segments = tail.len(),
                micros = started.elapsed().as_micros() as u64,
                "tail segment"
            );
        }
        let segments: Arc<[Arc<TailSegment>]> = tail.iter().cloned().collect();
        drop(tail);
        Ok(segments)
    }

    /// Commit up to `rows` on a thread of its own, unless such a commit is running.
    pub(super) fn commit_in_background(self: &Arc<Self>, batches: &[RecordBatch], rows: usize) {
        use std::sync::atomic::Ordering;
        if self.committing.swap(true, Ordering::AcqRel) {
            return;
        }
        let index = Arc::downgrade(self);
        let batches = batches.to_vec();
        let committing = self.committing.clone();
        let spawned = std::thread::Builder::new()
            .name("lsmsearch-memtext".into())
            .spawn(move || {
                crate::priority::nice_priority();
                // The flag is cleared however the commit ends, a panic included.
                struct Done(Arc<std::sync::atomic::AtomicBool>);
                impl Drop for Done {
                    fn drop(&mut self) {
                        self.0.store(false, Ordering::Release);
                    }
                }
                let _done = Done(committing);
                if let Some(index) = index.upgrade() {
                    let commit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        index.commit(&batches, rows)
                    }));
                    match commit {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!("memtable text index commit failed: {e}"),
                        Err(_) => tracing::warn!("memtable text index commit panicked"),
                    }
                }
            });
        if let Err(e) = spawned {
            self.committing.store(false, Ordering::Release);
            tracing::warn!("could not start a memtable text index commit: {e}");
        }
    }

    /// A tail segment over rows `from..to` of `batches`: the postings of their terms in
    /// memory, tokenized with the index's analyzers (no tantivy segment yet: see
    /// [`TailSegment::searcher`]).
    pub(super) fn tail_segment(
        &self,
        batches: &[RecordBatch],
        from: usize,
        to: usize,
    ) -> Result<TailSegment> {
        let nfields = self.schema.fields.len();
        let mut analyzers = self
            .schema
            .fields
            .iter()
            .map(|f| self.index.tokenizer_for_field(*f).map_err(Error::from))
            .collect::<Result<Vec<_>>>()?;
        let mut counts = Vec::with_capacity((to - from) * nfields);
        let mut postings: Vec<HashMap<String, TailPostings>> =
            (0..nfields).map(|_| HashMap::new()).collect();
        let mut sliced = Vec::new();
        let mut offset = 0usize;
        for b in batches {
            let end = offset + b.num_rows();
            let (lo, hi) = (from.max(offset), to.min(end));
            if lo < hi {
                let slice = b.slice(lo - offset, hi - lo);
                let deleted = deleted_flags(&slice);
                let texts: Vec<_> = self
                    .schema
                    .columns
                    .iter()
                    .map(|c| slice.column(*c).as_string::<i32>().clone())
                    .collect();
                for r in 0..slice.num_rows() {
                    let row = (lo - from + r) as u32;
                    for (f, col) in texts.iter().enumerate() {
                        if deleted.value(r) || col.is_null(r) {
                            counts.push(0);
                            continue;
                        }
                        let n =
                            add_postings(&mut analyzers[f], col.value(r), row, &mut postings[f]);
                        counts.push(n);
                    }
                }
                sliced.push(slice);
            }
            offset = end;
        }
        if counts.len() != (to - from) * nfields {
            return Err(Error::internal(format!(
                "rows {from}..{to} are not all in the memtable's {offset} stored rows"
            )));
        }
        Ok(TailSegment {
            first: from,
            totals: token_totals(&counts, nfields),
            counts,
            nfields,
            postings,
            batches: sliced,
            schema: self.schema.clone(),
            index: self.index.clone(),
            segment: Mutex::new(None),
        })
    }
}

/// Add the tokens of `text` (row `row` of a tail segment) to `postings`, with their positions,
/// as `analyzer` makes them; returns how many tokens tantivy would count (see [`in_postings`]).
fn add_postings(
    analyzer: &mut tantivy::tokenizer::TextAnalyzer,
    text: &str,
    row: u32,
    postings: &mut HashMap<String, TailPostings>,
) -> u32 {
    let mut n = 0u32;
    let mut ts = analyzer.token_stream(text);
    while ts.advance() {
        let token = ts.token();
        if !in_postings(&token.text) {
            continue;
        }
        n += 1;
        let p = match postings.get_mut(token.text.as_str()) {
            Some(p) => p,
            None => postings.entry(token.text.clone()).or_default(),
        };
        if p.rows.last() != Some(&row) {
            p.rows.push(row);
            p.ends.push(p.positions.len() as u32);
        }
        p.positions.push(token.position as u32);
        *p.ends.last_mut().expect("pushed above") += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::IndexSchema;
    use arrow::array::StringArray;
    use tantivy::Term;

    #[test]
    fn a_failed_catch_up_indexes_nothing_twice() {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t"]}"#).unwrap();
        let user = RecordBatch::try_new(
            s.arrow_schema(),
            vec![
                Arc::new(StringArray::from(vec!["a", "b", "c"])),
                Arc::new(StringArray::from(vec!["red fox", "red hen", "blue jay"])),
            ],
        )
        .unwrap();
        let stored = s.to_stored(&user, 1).unwrap();
        let mem = Arc::new(MemTextIndex::new(TextSchema::new(&s).unwrap()).unwrap());
        mem.fail_next_commit
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let batches = [stored];
        assert!(mem.commit(&batches, 3).is_err());
        mem.commit(&batches, 3).unwrap();
        let t = mem.view(&batches, 3).unwrap();
        assert!(t.tail.is_empty());
        assert_eq!(t.searcher().num_docs(), 3, "rows indexed twice");
        let red = Term::from_field_text(mem.schema.fields()[0], "red");
        assert_eq!(t.doc_freq(&red).unwrap(), 2);
    }

    /// `n` batches of [`red_fox_batches`] and an empty memtable text index for them.
    fn red_fox_index(n: usize) -> (Vec<RecordBatch>, Arc<MemTextIndex>) {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t"]}"#).unwrap();
        let mem = Arc::new(MemTextIndex::new(TextSchema::new(&s).unwrap()).unwrap());
        (red_fox_batches(&s, n), mem)
    }

    /// `n` one-row stored batches, keys `k{i}`, texts `red fox {i}`.
    fn red_fox_batches(s: &IndexSchema, n: usize) -> Vec<RecordBatch> {
        (0..n as u64)
            .map(|i| {
                let user = RecordBatch::try_new(
                    s.arrow_schema(),
                    vec![
                        Arc::new(StringArray::from(vec![format!("k{i}")])),
                        Arc::new(StringArray::from(vec![format!("red fox {i}")])),
                    ],
                )
                .unwrap();
                s.to_stored(&user, i + 1).unwrap()
            })
            .collect()
    }

    #[test]
    fn a_search_indexes_only_rows_new_to_it_and_never_commits() {
        let n = TAIL_COMMIT_SEGMENTS + 4;
        let (batches, mem) = red_fox_index(n);
        let red = Term::from_field_text(mem.schema.fields()[0], "red");
        let indexed = || mem.state.lock().unwrap().indexed_rows;
        mem.commit(&batches[..2], 2).unwrap();
        let a = mem.view(&batches[..3], 3).unwrap();
        assert_eq!((a.tail.len(), a.rows(), indexed()), (1, 3, 2));
        assert_eq!(a.doc_freq(&red).unwrap(), 3);
        assert_eq!(a.total_tokens(0), 9);
        // The same view again builds nothing; a longer one indexes only the rows new to it.
        let b = mem.view(&batches[..3], 3).unwrap();
        assert!(Arc::ptr_eq(&a.tail[0], &b.tail[0]));
        let c = mem.view(&batches[..4], 4).unwrap();
        assert!(Arc::ptr_eq(&a.tail[0], &c.tail[0]));
        assert_eq!((c.tail.len(), c.tail[1].first, c.rows()), (2, 3, 4));
        assert_eq!(
            (c.doc_freq(&red).unwrap(), c.tokens(3, 0), indexed()),
            (4, 3, 2)
        );
        // The tail's rows are in memory; a tantivy segment of them is built only when asked.
        let docs: u32 = c.segment_readers().map(|s| s.max_doc()).sum();
        assert_eq!(docs, 2);
        assert!(c.tail.iter().all(|t| t.segment.lock().unwrap().is_none()));
        let docs: u32 = c.tail_readers().unwrap().iter().map(|s| s.max_doc()).sum();
        assert_eq!(docs, 2);
        // The tail segment that makes TAIL_COMMIT_SEGMENTS asks for a commit in the
        // background, which folds them in.
        let last = 2 + TAIL_COMMIT_SEGMENTS;
        for rows in 5..last {
            mem.view(&batches[..rows], rows).unwrap();
            assert_eq!(indexed(), 2, "a commit asked for early");
        }
        let d = mem.view(&batches[..last], last).unwrap();
        assert_eq!(
            (d.tail.len(), d.doc_freq(&red).unwrap()),
            (TAIL_COMMIT_SEGMENTS, last as u64)
        );
        let start = std::time::Instant::now();
        while indexed() < last {
            assert!(
                start.elapsed().as_secs() < 30,
                "no commit in the background"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let e = mem.view(&batches[..last], last).unwrap();
        assert!(e.tail.is_empty());
        assert_eq!((e.rows(), e.doc_freq(&red).unwrap()), (last, last as u64));
    }

    #[test]
    fn the_background_tokenizes_the_tail_for_searches_and_commits_when_due() {
        let n = TAIL_COMMIT_SEGMENTS + 4;
        let (batches, mem) = red_fox_index(n);
        let red = Term::from_field_text(mem.schema.fields()[0], "red");
        let indexed = || mem.state.lock().unwrap().indexed_rows;
        mem.commit(&batches[..2], 2).unwrap();
        // The background's segment serves the search: it tokenizes nothing itself.
        mem.extend_tail(&batches[..5], 5).unwrap();
        let built = mem.tail.lock().unwrap()[0].clone();
        assert_eq!((built.first, built.end()), (2, 5));
        let v = mem.view(&batches[..5], 5).unwrap();
        assert_eq!(v.tail.len(), 1);
        assert!(Arc::ptr_eq(&v.tail[0], &built));
        assert_eq!(v.doc_freq(&red).unwrap(), 5);
        // Nothing past the tail: nothing to add.
        mem.extend_tail(&batches[..5], 5).unwrap();
        assert_eq!(mem.tail.lock().unwrap().len(), 1);
        // Below both thresholds a due commit is none; at TAIL_COMMIT_SEGMENTS segments it runs.
        mem.commit_due(&batches[..5], 5).unwrap();
        assert_eq!(indexed(), 2);
        let last = 4 + TAIL_COMMIT_SEGMENTS;
        for rows in 6..last {
            mem.extend_tail(&batches[..rows], rows).unwrap();
        }
        assert_eq!(mem.tail.lock().unwrap().len(), TAIL_COMMIT_SEGMENTS - 1);
        mem.commit_due(&batches[..last - 1], last - 1).unwrap();
        assert_eq!(indexed(), 2);
        mem.extend_tail(&batches[..last], last).unwrap();
        mem.commit_due(&batches[..last], last).unwrap();
        assert_eq!(indexed(), last);
        // The segments the commit covers no longer count, nor are they read.
        mem.commit_due(&batches[..last], last).unwrap();
        let e = mem.view(&batches[..last], last).unwrap();
        assert!(e.tail.is_empty());
        assert_eq!(e.doc_freq(&red).unwrap(), last as u64);
    }
}
