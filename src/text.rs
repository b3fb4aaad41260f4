//! Full-text indexes: one tantivy index per source, all with the same tantivy schema, analyzers
//! and `_row` fast field, so one parsed query runs on every source and BM25 can be fed global
//! statistics.
//!
//! Every source also keeps the exact token count of each row and text field (the analyzer's
//! output, as tantivy counts it for fieldnorms) so that the snapshot's total token count can be
//! computed over live rows only.

use crate::schema::{deleted_flags, IndexSchema};
use crate::{Error, Result};
use arrow::array::{Array, AsArray, RecordBatch};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tantivy::directory::{Directory, RamDirectory};
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, FAST, INDEXED,
};
use tantivy::{
    IndexReader, IndexWriter, ReloadPolicy, Searcher, SegmentReader, TantivyDocument, Term,
};

/// The files of a tantivy index: `(name, bytes)`.
pub(crate) type IndexFiles = Vec<(String, Vec<u8>)>;

/// Name of the fast field mapping a tantivy document to its row in the source.
pub(crate) const ROW_FIELD: &str = "_row";
/// Writer heap of a memtable's text index (tantivy's minimum per thread is 15 MB).
const MEMTABLE_WRITER_HEAP: usize = 20_000_000;
/// Writer heap used to build a generation's text index at flush.
const FLUSH_WRITER_HEAP: usize = 128_000_000;

fn tv(e: impl std::fmt::Display) -> Error {
    Error::internal(format!("tantivy: {e}"))
}

/// The tantivy schema shared by every source of an index.
#[derive(Debug, Clone)]
pub(crate) struct TextSchema {
    schema: Schema,
    /// The text fields alone, for parsing queries.
    query_schema: Schema,
    /// One field per text column, in schema order.
    fields: Vec<Field>,
    /// Column positions of the text columns in the user schema.
    columns: Vec<usize>,
    row: Field,
}

impl TextSchema {
    /// The text schema of `schema`, or `None` when it declares no text column.
    pub(crate) fn new(schema: &IndexSchema) -> Option<Arc<TextSchema>> {
        if schema.text.is_empty() {
            return None;
        }
        let text_fields = |b: &mut tantivy::schema::SchemaBuilder| -> Vec<Field> {
            schema
                .text
                .iter()
                .map(|name| {
                    let opts = TextOptions::default().set_indexing_options(
                        TextFieldIndexing::default()
                            .set_tokenizer(schema.tokenizer_of(name))
                            .set_index_option(IndexRecordOption::WithFreqsAndPositions),
                    );
                    b.add_text_field(name, opts)
                })
                .collect()
        };
        // Queries are parsed against the text fields alone (added in the same order, so with
        // the same ids): the internal `_row` field is no field of a query.
        let mut q = Schema::builder();
        text_fields(&mut q);
        let query_schema = q.build();
        let mut b = Schema::builder();
        let fields = text_fields(&mut b);
        let row = b.add_u64_field(ROW_FIELD, INDEXED | FAST);
        Some(Arc::new(TextSchema {
            schema: b.build(),
            query_schema,
            fields,
            columns: (1..=schema.text.len()).collect(),
            row,
        }))
    }

    /// The tantivy schema.
    pub(crate) fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The text fields, in schema order.
    pub(crate) fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Column positions of the text columns in a stored batch, in the order of [`Self::fields`].
    pub(crate) fn columns(&self) -> &[usize] {
        &self.columns
    }

    /// Position of `field` among the text fields.
    pub(crate) fn field_position(&self, field: Field) -> Option<usize> {
        self.fields.iter().position(|f| *f == field)
    }

    /// An empty in-memory index with this schema (used to parse queries and as a template).
    pub(crate) fn empty_index(&self) -> tantivy::Index {
        tantivy::Index::create_in_ram(self.schema.clone())
    }

    /// An empty in-memory index of the text fields alone, to parse queries with: a query can
    /// name a text column, never the internal `_row` field.
    pub(crate) fn query_index(&self) -> tantivy::Index {
        tantivy::Index::create_in_ram(self.query_schema.clone())
    }

    /// Add the non-tombstone rows of `batch` (stored rows) as documents numbered from `first_row`,
    /// and return each row's token count per text field (tombstones count zero).
    fn add_rows(
        &self,
        index: &tantivy::Index,
        add: &mut dyn FnMut(TantivyDocument) -> Result<()>,
        batch: &RecordBatch,
        first_row: u64,
    ) -> Result<Vec<u32>> {
        let deleted = deleted_flags(batch);
        let mut analyzers = self
            .fields
            .iter()
            .map(|f| index.tokenizer_for_field(*f).map_err(tv))
            .collect::<Result<Vec<_>>>()?;
        let texts: Vec<_> = self
            .columns
            .iter()
            .map(|c| batch.column(*c).as_string::<i32>().clone())
            .collect();
        let mut counts = Vec::with_capacity(batch.num_rows() * self.fields.len());
        for r in 0..batch.num_rows() {
            if deleted.value(r) {
                counts.extend(std::iter::repeat_n(0, self.fields.len()));
                continue;
            }
            let mut doc = TantivyDocument::default();
            doc.add_u64(self.row, first_row + r as u64);
            for (i, col) in texts.iter().enumerate() {
                if col.is_null(r) {
                    counts.push(0);
                    continue;
                }
                let text = col.value(r);
                let mut n = 0u32;
                let mut ts = analyzers[i].token_stream(text);
                while ts.advance() {
                    n += 1;
                }
                counts.push(n);
                doc.add_text(self.fields[i], text);
            }
            add(doc)?;
        }
        Ok(counts)
    }
}

/// A source's full-text index: a tantivy searcher and the token counts of its rows.
#[derive(Clone)]
pub(crate) struct TextIndex {
    searcher: Searcher,
    /// `rows × fields` token counts, row-major.
    counts: Arc<Vec<u32>>,
    nfields: usize,
    /// Tokens per field over every row, computed at first use.
    totals: Arc<std::sync::OnceLock<Vec<u64>>>,
    /// Per segment, each document's row (a generation's, read once when it is opened);
    /// `None` for a memtable's index, whose documents are looked up in the `_row` fast field.
    doc_rows: Option<Arc<Vec<Vec<u32>>>>,
    /// A generation's document frequencies of recently queried terms (a generation never
    /// changes, so neither do they); `None` for a memtable's index.
    doc_freqs: Option<Arc<Mutex<HashMap<Term, u64>>>>,
    /// A memtable's rows past what its index had committed, in the order of their rows: small
    /// segments searches built themselves (see [`MemTextIndex::view`]). Empty for a generation.
    tail: Arc<[Arc<TailSegment>]>,
}

/// Consecutive rows of a memtable that a search indexed itself because its index had not
/// committed them yet: one tantivy segment built without a writer, its threads or a commit, then
/// shared by later searches until a commit of the memtable's index covers its rows.
struct TailSegment {
    /// An index holding one segment, or `None` when the rows are all tombstones.
    searcher: Option<Searcher>,
    /// The first row.
    first: usize,
    /// `rows × fields` token counts, row-major.
    counts: Vec<u32>,
    /// Tokens per field over its rows.
    totals: Vec<u64>,
    nfields: usize,
}

impl TailSegment {
    fn rows(&self) -> usize {
        self.counts.len() / self.nfields.max(1)
    }

    fn end(&self) -> usize {
        self.first + self.rows()
    }

    fn segment_readers(&self) -> &[SegmentReader] {
        self.searcher.as_ref().map_or(&[], |s| s.segment_readers())
    }
}

/// Terms whose document frequencies a generation's index remembers; the memo starts over
/// when it is full.
const DOC_FREQ_MEMO: usize = 4096;

/// How a segment's documents map to rows: a table read once, or the `_row` fast field.
pub(crate) enum DocRows<'a> {
    /// `table[doc]` is the document's row.
    Table(&'a [u32]),
    /// The segment's `_row` fast field.
    Column(tantivy::columnar::Column<u64>),
}

impl DocRows<'_> {
    /// The row of `doc`.
    #[inline]
    pub(crate) fn get(&self, doc: tantivy::DocId) -> Option<usize> {
        match self {
            DocRows::Table(t) => t.get(doc as usize).map(|r| *r as usize),
            DocRows::Column(c) => c.first(doc).map(|r| r as usize),
        }
    }
}

/// Tokens per field over row-major `counts` of `nfields` fields.
fn token_totals(counts: &[u32], nfields: usize) -> Vec<u64> {
    let mut t = vec![0u64; nfields];
    for row in counts.chunks_exact(nfields.max(1)) {
        for (f, c) in row.iter().enumerate() {
            t[f] += u64::from(*c);
        }
    }
    t
}

/// Each segment's document → row table; every row number must be below `rows`.
fn doc_row_tables(searcher: &Searcher, rows: usize) -> Result<Vec<Vec<u32>>> {
    searcher
        .segment_readers()
        .iter()
        .map(|seg| {
            let col = seg.fast_fields().u64(ROW_FIELD).map_err(tv)?;
            (0..seg.max_doc())
                .map(|d| {
                    col.first(d)
                        .and_then(|r| u32::try_from(r).ok())
                        .filter(|r| (*r as usize) < rows)
                        .ok_or_else(|| {
                            Error::internal(format!("document {d} has no row number below {rows}"))
                        })
                })
                .collect()
        })
        .collect()
}

impl std::fmt::Debug for TextIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TextIndex({} docs)", self.searcher.num_docs())
    }
}

impl TextIndex {
    /// The searcher of the committed index (a memtable's tail segments aside): its schema and
    /// analyzers are every source's.
    pub(crate) fn searcher(&self) -> &Searcher {
        &self.searcher
    }

    /// Every segment the index searches: the committed index's, then a memtable's tail
    /// segments. [`TextIndex::doc_rows`] numbers them in this order.
    pub(crate) fn segment_readers(&self) -> impl Iterator<Item = &SegmentReader> {
        self.searcher
            .segment_readers()
            .iter()
            .chain(self.tail.iter().flat_map(|t| t.segment_readers()))
    }

    /// How the documents of segment `ord` (in the order of [`TextIndex::segment_readers`]) map
    /// to rows.
    pub(crate) fn doc_rows(&self, ord: usize) -> Result<DocRows<'_>> {
        if let Some(t) = &self.doc_rows {
            return t
                .get(ord)
                .map(|t| DocRows::Table(t))
                .ok_or_else(|| Error::internal(format!("no segment {ord}")));
        }
        let seg = self
            .segment_readers()
            .nth(ord)
            .ok_or_else(|| Error::internal(format!("no segment {ord}")))?;
        Ok(DocRows::Column(
            seg.fast_fields().u64(ROW_FIELD).map_err(tv)?,
        ))
    }

    /// Documents containing `term` (a generation's index remembers the answer).
    pub(crate) fn doc_freq(&self, term: &Term) -> Result<u64> {
        let mut tail = 0;
        for t in self.tail.iter() {
            if let Some(s) = &t.searcher {
                tail += s.doc_freq(term).map_err(tv)?;
            }
        }
        let Some(memo) = &self.doc_freqs else {
            return Ok(self.searcher.doc_freq(term).map_err(tv)? + tail);
        };
        if let Some(n) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(term) {
            return Ok(*n + tail);
        }
        let n = self.searcher.doc_freq(term).map_err(tv)?;
        let mut memo = memo.lock().unwrap_or_else(|e| e.into_inner());
        if memo.len() >= DOC_FREQ_MEMO {
            memo.clear();
        }
        memo.insert(term.clone(), n);
        Ok(n + tail)
    }

    /// Rows of the committed index, tail segments aside.
    fn committed_rows(&self) -> usize {
        self.counts.len() / self.nfields.max(1)
    }

    /// Rows the index covers: its documents are the non-tombstone rows among them.
    pub(crate) fn rows(&self) -> usize {
        self.tail
            .last()
            .map_or_else(|| self.committed_rows(), |t| t.end())
    }

    /// Token count of `row` in text field number `field`.
    pub(crate) fn tokens(&self, row: usize, field: usize) -> u32 {
        let committed = self.committed_rows();
        if row < committed {
            return self
                .counts
                .get(row * self.nfields + field)
                .copied()
                .unwrap_or(0);
        }
        let t = self.tail.partition_point(|t| t.end() <= row);
        self.tail.get(t).map_or(0, |t| {
            t.counts
                .get((row - t.first) * self.nfields + field)
                .copied()
                .unwrap_or(0)
        })
    }

    /// Tokens of text field `field` summed over every row (tombstones count none).
    pub(crate) fn total_tokens(&self, field: usize) -> u64 {
        let committed = self
            .totals
            .get_or_init(|| token_totals(&self.counts, self.nfields))[field];
        committed + self.tail.iter().map(|t| t.totals[field]).sum::<u64>()
    }

    /// Build the index of a generation's stored rows (one tantivy segment).
    pub(crate) fn build(ts: &TextSchema, rows: &RecordBatch) -> Result<(TextIndex, IndexFiles)> {
        let index = ts.empty_index();
        let mut writer: IndexWriter<TantivyDocument> = index
            .writer_with_num_threads(1, FLUSH_WRITER_HEAP)
            .map_err(tv)?;
        writer.set_merge_policy(Box::new(tantivy::indexer::NoMergePolicy));
        let counts = ts.add_rows(
            &index,
            &mut |doc| writer.add_document(doc).map(drop).map_err(tv),
            rows,
            0,
        )?;
        writer.commit().map_err(tv)?;
        let ids = index.searchable_segment_ids().map_err(tv)?;
        if ids.len() > 1 {
            writer.merge(&ids).wait().map_err(tv)?;
        }
        writer.wait_merging_threads().map_err(tv)?;
        let files = export_files(&index)?;
        Ok((Self::of_generation(ts, &index, counts)?, files))
    }

    /// A generation's text index over a finished tantivy index and its rows' token counts.
    fn of_generation(ts: &TextSchema, index: &tantivy::Index, counts: Vec<u32>) -> Result<Self> {
        let searcher = open_reader(index)?.searcher();
        let rows = counts.len() / ts.fields.len().max(1);
        Ok(TextIndex {
            doc_rows: Some(Arc::new(doc_row_tables(&searcher, rows)?)),
            doc_freqs: Some(Arc::default()),
            searcher,
            counts: Arc::new(counts),
            totals: Arc::default(),
            nfields: ts.fields.len(),
            tail: Arc::new([]),
        })
    }

    /// Open an index from the files [`TextIndex::build`] exported and the stored token counts.
    /// Every segment file's own checksum is verified first, and a panic of tantivy on
    /// malformed files becomes an error.
    pub(crate) fn open(ts: &TextSchema, files: IndexFiles, counts: Vec<u32>) -> Result<TextIndex> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Self::open_unguarded(ts, files, counts)
        }))
        .unwrap_or_else(|_| Err(Error::internal("tantivy failed on malformed index files")))
    }

    fn open_unguarded(ts: &TextSchema, files: IndexFiles, counts: Vec<u32>) -> Result<TextIndex> {
        let dir = RamDirectory::create();
        let mut segment_files = Vec::new();
        for (name, bytes) in files {
            let path = std::path::PathBuf::from(&name);
            dir.atomic_write(&path, &bytes).map_err(tv)?;
            if !name.ends_with(".json") {
                segment_files.push(path);
            }
        }
        let index = tantivy::Index::open(dir).map_err(tv)?;
        if index.schema() != ts.schema {
            return Err(Error::internal(
                "text index schema differs from the index schema",
            ));
        }
        for path in segment_files {
            if !index.directory().validate_checksum(&path).map_err(tv)? {
                return Err(Error::internal(format!(
                    "file '{}' fails its checksum",
                    path.display()
                )));
            }
        }
        Self::of_generation(ts, &index, counts)
    }

    /// Encode token counts (u32 little-endian, row-major).
    pub(crate) fn encode_counts(&self) -> Vec<u8> {
        self.counts.iter().flat_map(|c| c.to_le_bytes()).collect()
    }
}

fn open_reader(index: &tantivy::Index) -> Result<IndexReader> {
    index
        .reader_builder()
        .reload_policy(ReloadPolicy::Manual)
        .try_into()
        .map_err(tv)
}

/// The paths of a segment's component files (some may not exist: a schema without stored
/// fields has no store).
pub(crate) fn segment_files(
    meta: &tantivy::index::SegmentMeta,
) -> impl Iterator<Item = std::path::PathBuf> + '_ {
    use tantivy::index::SegmentComponent as C;
    [
        C::Postings,
        C::Positions,
        C::FastFields,
        C::FieldNorms,
        C::Terms,
        C::Store,
    ]
    .into_iter()
    .map(|c| meta.relative_path(c))
}

/// The files of a committed in-memory index: `meta.json` and every segment component.
fn export_files(index: &tantivy::Index) -> Result<IndexFiles> {
    let dir = index.directory();
    let mut names = vec!["meta.json".to_string()];
    for meta in index.searchable_segment_metas().map_err(tv)? {
        names.extend(segment_files(&meta).map(|p| p.to_string_lossy().into_owned()));
    }
    let mut out = Vec::new();
    for name in names {
        let p = std::path::Path::new(&name);
        if dir.exists(p).map_err(tv)? {
            out.push((name.clone(), dir.atomic_read(p).map_err(tv)?));
        }
    }
    Ok(out)
}

struct MemState {
    writer: Option<IndexWriter<TantivyDocument>>,
    reader: IndexReader,
    /// Token counts of the committed rows, row-major.
    counts: Vec<u32>,
    /// Tokens per field over the committed rows.
    totals: Vec<u64>,
    indexed_rows: usize,
}

/// A search commits nothing: it builds a tail segment of the rows its view holds past the last
/// commit and asks for a commit in the background once the tail holds this many rows...
const TAIL_COMMIT_ROWS: usize = 256;
/// ... or this many tail segments.
const TAIL_COMMIT_SEGMENTS: usize = 4;
/// The most tail segments a search reads: with more (a commit that is slow to come), the
/// next search indexes the rows past the commit into one segment again.
const TAIL_MAX_SEGMENTS: usize = 16;

/// The full-text index of a memtable: a tantivy index in memory that commits in the background
/// (between the graph inserter's chunks, or on a thread a search starts), so appends never wait
/// for indexing and searches never wait for a commit. A search reads the last commit, and the
/// rows its view holds past it from tail segments it builds itself (see [`MemTextIndex::view`]).
pub(crate) struct MemTextIndex {
    schema: Arc<TextSchema>,
    index: tantivy::Index,
    /// The writer and what it committed: held by a commit for as long as it indexes.
    state: Mutex<MemState>,
    /// What the last commit published, without tail segments.
    committed: Mutex<TextIndex>,
    /// Tail segments searches built past `committed`, over consecutive rows.
    tail: Mutex<Vec<Arc<TailSegment>>>,
    /// A commit a search asked for is running.
    committing: Arc<std::sync::atomic::AtomicBool>,
    /// Set by the first search that reads this index: from then on the background inserter
    /// keeps it up to date too.
    searched: std::sync::atomic::AtomicBool,
    /// Tests: fail the next commit (after its rows were added to the writer).
    #[cfg(test)]
    fail_next_commit: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for MemTextIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemTextIndex")
    }
}

/// The searcher of `st`'s last commit and its counts, as a source's text index.
fn published(st: &MemState, nfields: usize) -> TextIndex {
    let totals = std::sync::OnceLock::new();
    let _ = totals.set(st.totals.clone());
    TextIndex {
        doc_rows: None,
        doc_freqs: None,
        searcher: st.reader.searcher(),
        counts: Arc::new(st.counts.clone()),
        totals: Arc::new(totals),
        nfields,
        tail: Arc::new([]),
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
    fn index_rows(&self, st: &mut MemState, batches: &[RecordBatch], rows: usize) -> Result<()> {
        if st.writer.is_none() {
            st.writer = Some(
                self.index
                    .writer_with_num_threads(1, MEMTABLE_WRITER_HEAP)
                    .map_err(tv)?,
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
                        &mut |doc| writer.add_document(doc).map(drop).map_err(tv),
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
        writer.commit().map_err(tv)?;
        // Committed: these rows are indexed whatever happens next.
        st.indexed_rows = offset.max(start);
        let nfields = self.schema.fields.len();
        for (t, n) in st.totals.iter_mut().zip(token_totals(&new_counts, nfields)) {
            *t += n;
        }
        st.counts.extend(new_counts);
        st.reader.reload().map_err(tv)?;
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
        let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        // Segments a commit covers since go; so do all when the first left starts past the
        // commit (one straddled it).
        tail.retain(|t| t.first >= from);
        if tail.first().is_some_and(|t| t.first != from) {
            tail.clear();
        }
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
        if rows - from >= TAIL_COMMIT_ROWS || segments.len() >= TAIL_COMMIT_SEGMENTS {
            self.commit_in_background(batches, rows);
        }
        Ok(TextIndex {
            tail: segments,
            ..committed
        })
    }

    /// Commit up to `rows` on a thread of its own, unless such a commit is running.
    fn commit_in_background(self: &Arc<Self>, batches: &[RecordBatch], rows: usize) {
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

    /// A tail segment over rows `from..to` of `batches`: one tantivy segment written in this
    /// thread, with the index's schema and analyzers, documents numbered by row.
    fn tail_segment(&self, batches: &[RecordBatch], from: usize, to: usize) -> Result<TailSegment> {
        let nfields = self.schema.fields.len();
        // The writer's hash table is sized from its budget: a small one for a few rows.
        let budget = ((to - from) * 4096).clamp(1 << 20, MEMTABLE_WRITER_HEAP);
        let mut writer = tantivy::Index::builder()
            .schema(self.schema.schema.clone())
            .single_segment_index_writer::<TantivyDocument>(RamDirectory::create(), budget)
            .map_err(tv)?;
        let mut counts = Vec::with_capacity((to - from) * nfields);
        let mut docs = 0usize;
        let mut offset = 0usize;
        for b in batches {
            let end = offset + b.num_rows();
            let (lo, hi) = (from.max(offset), to.min(end));
            if lo < hi {
                counts.extend(self.schema.add_rows(
                    &self.index,
                    &mut |doc| {
                        docs += 1;
                        writer.add_document(doc).map_err(tv)
                    },
                    &b.slice(lo - offset, hi - lo),
                    lo as u64,
                )?);
            }
            offset = end;
        }
        if counts.len() != (to - from) * nfields {
            return Err(Error::internal(format!(
                "rows {from}..{to} are not all in the memtable's {offset} stored rows"
            )));
        }
        let searcher = if docs == 0 {
            None
        } else {
            Some(open_reader(&writer.finalize().map_err(tv)?)?.searcher())
        };
        Ok(TailSegment {
            searcher,
            first: from,
            totals: token_totals(&counts, nfields),
            counts,
            nfields,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::IndexSchema;
    use arrow::array::StringArray;

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

    #[test]
    fn a_search_indexes_only_rows_new_to_it_and_never_commits() {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t"]}"#).unwrap();
        let batches: Vec<RecordBatch> = (0..8)
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
            .collect();
        let mem = Arc::new(MemTextIndex::new(TextSchema::new(&s).unwrap()).unwrap());
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
        let docs: u32 = c.segment_readers().map(|s| s.max_doc()).sum();
        assert_eq!(docs, 4);
        // The fourth tail segment asks for a commit in the background, which folds them in.
        mem.view(&batches[..5], 5).unwrap();
        let d = mem.view(&batches[..6], 6).unwrap();
        assert_eq!((d.tail.len(), d.doc_freq(&red).unwrap()), (4, 6));
        let start = std::time::Instant::now();
        while indexed() < 6 {
            assert!(
                start.elapsed().as_secs() < 30,
                "no commit in the background"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let e = mem.view(&batches[..6], 6).unwrap();
        assert!(e.tail.is_empty());
        assert_eq!((e.rows(), e.doc_freq(&red).unwrap()), (6, 6));
    }
}
