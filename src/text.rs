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
                    if in_postings(&ts.token().text) {
                        n += 1;
                    }
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
/// committed them yet, shared by later searches until a commit of the memtable's index covers
/// them. They are held as postings in memory (each term's rows and positions), which is all a
/// query of terms, phrases and boolean clauses needs to score them exactly as tantivy would
/// ([`TailQuery`]); other queries read a tantivy segment of the same rows, built the first
/// time one asks.
pub(crate) struct TailSegment {
    /// The first row.
    first: usize,
    /// `rows × fields` token counts, row-major.
    counts: Vec<u32>,
    /// Tokens per field over its rows.
    totals: Vec<u64>,
    nfields: usize,
    /// Per text field, each term's postings over these rows.
    postings: Vec<HashMap<String, TailPostings>>,
    /// The stored rows (tombstones included), and the memtable index whose schema and
    /// analyzers a tantivy segment of them is built with.
    batches: Vec<RecordBatch>,
    schema: Arc<TextSchema>,
    index: tantivy::Index,
    /// A tantivy segment of the rows, built on demand (`Some(None)` when they are all
    /// tombstones); the lock is held while it is built, so it is built once.
    segment: Mutex<Option<Option<Searcher>>>,
}

/// One term's occurrences in a tail segment: the rows holding it (ascending, relative to the
/// segment's first row) and, per row, its positions.
#[derive(Default)]
struct TailPostings {
    rows: Vec<u32>,
    /// `positions[ends[i - 1]..ends[i]]` are the term's positions in `rows[i]`, ascending.
    ends: Vec<u32>,
    positions: Vec<u32>,
}

impl TailPostings {
    fn positions(&self, i: usize) -> &[u32] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.positions[start..self.ends[i] as usize]
    }
}

impl TailSegment {
    fn rows(&self) -> usize {
        self.counts.len() / self.nfields.max(1)
    }

    fn end(&self) -> usize {
        self.first + self.rows()
    }

    /// Token count of the segment's `row`-th row (from its first) in text field `field`.
    fn tokens(&self, row: usize, field: usize) -> u32 {
        self.counts
            .get(row * self.nfields + field)
            .copied()
            .unwrap_or(0)
    }

    fn postings(&self, term: &Term) -> Option<&TailPostings> {
        let field = self.schema.field_position(term.field())?;
        self.postings.get(field)?.get(term.value().as_str()?)
    }

    /// The tantivy segment of these rows (built now if no query asked for it before).
    fn searcher(&self) -> Result<Option<Searcher>> {
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
            )
            .map_err(tv)?;
        let mut docs = 0usize;
        let mut first = self.first as u64;
        for b in &self.batches {
            self.schema.add_rows(
                &self.index,
                &mut |doc| {
                    docs += 1;
                    writer.add_document(doc).map_err(tv)
                },
                b,
                first,
            )?;
            first += b.num_rows() as u64;
        }
        let searcher = if docs == 0 {
            None
        } else {
            Some(open_reader(&writer.finalize().map_err(tv)?)?.searcher())
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
fn fieldnorm_id(tokens: u32) -> u8 {
    static TABLE: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..=255u8)
            .map(tantivy::fieldnorm::FieldNormReader::id_to_fieldnorm)
            .collect()
    });
    // The largest id whose fieldnorm is at most `tokens` (the table starts at 0).
    (table.partition_point(|n| *n <= tokens) - 1) as u8
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
            let weight =
                Bm25Weight::for_terms(stats, std::slice::from_ref(q.term())).map_err(tv)?;
            return Ok(Some(TailQuery::Term {
                field,
                term: q.term().clone(),
                weight,
            }));
        }
        if let Some(q) = query.downcast_ref::<PhraseQuery>() {
            let terms = q.phrase_terms();
            // Only a phrase of consecutive positions without slop (what the parser makes of a
            // quoted text whose analyzer drops no token): the same phrase built from its terms
            // alone (offsets 0, 1, ..., slop 0) must be the same query.
            if terms.len() < 2
                || format!("{q:?}") != format!("{:?}", PhraseQuery::new(terms.clone()))
            {
                return Ok(None);
            }
            let Some(field) = ts.field_position(q.field()) else {
                return Ok(None);
            };
            let weight = Bm25Weight::for_terms(stats, &terms).map_err(tv)?;
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
    fn matches(&self, seg: &TailSegment) -> Vec<(u32, f32)> {
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
                    // Phrase starts: term k at start + k for every k (tantivy's phrase count).
                    let count = postings[0]
                        .positions(i)
                        .iter()
                        .filter(|start| {
                            positions
                                .iter()
                                .enumerate()
                                .all(|(k, ps)| ps.binary_search(&(**start + k as u32 + 1)).is_ok())
                        })
                        .count() as u32;
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
    /// The rows of a segment whose documents carry them in the `_row` fast field.
    pub(crate) fn of_segment(seg: &SegmentReader) -> Result<Self> {
        Ok(DocRows::Column(
            seg.fast_fields().u64(ROW_FIELD).map_err(tv)?,
        ))
    }

    /// The row of `doc`.
    #[inline]
    pub(crate) fn get(&self, doc: tantivy::DocId) -> Option<usize> {
        match self {
            DocRows::Table(t) => t.get(doc as usize).map(|r| *r as usize),
            DocRows::Column(c) => c.first(doc).map(|r| r as usize),
        }
    }
}

/// Whether tantivy indexes `token`: it leaves one over `MAX_TOKEN_LEN` bytes out of the
/// postings and out of the field's length (its fieldnorm and token totals).
pub(crate) fn in_postings(token: &str) -> bool {
    token.len() <= tantivy::tokenizer::MAX_TOKEN_LEN
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

    /// The segments of the committed index (a memtable's tail segments aside, see
    /// [`TextIndex::score_tail`] and [`TextIndex::tail_readers`]), in the order
    /// [`TextIndex::doc_rows`] numbers them.
    pub(crate) fn segment_readers(&self) -> impl Iterator<Item = &SegmentReader> {
        self.searcher.segment_readers().iter()
    }

    /// Whether a memtable's index holds rows past its last commit.
    pub(crate) fn has_tail(&self) -> bool {
        !self.tail.is_empty()
    }

    /// The tantivy segments of a memtable's rows past its last commit (built by the first
    /// query that asks), for queries [`TailQuery`] does not score: their documents' rows are
    /// in the `_row` fast field.
    pub(crate) fn tail_readers(&self) -> Result<Vec<SegmentReader>> {
        let mut out = Vec::new();
        for t in self.tail.iter() {
            if let Some(s) = t.searcher()? {
                out.extend(s.segment_readers().iter().cloned());
            }
        }
        Ok(out)
    }

    /// Score the rows past a memtable's last commit that match `query`: `f(row, score)`.
    pub(crate) fn score_tail(&self, query: &TailQuery, f: &mut dyn FnMut(usize, f32)) {
        for t in self.tail.iter() {
            for (row, score) in query.matches(t) {
                f(t.first + row as usize, score);
            }
        }
    }

    /// Rows at or past `from` among the rows past a memtable's last commit that hold `term`.
    pub(crate) fn tail_doc_freq_from(&self, term: &Term, from: usize) -> u64 {
        self.tail
            .iter()
            .filter(|t| t.end() > from)
            .filter_map(|t| {
                let p = t.postings(term)?;
                let skip = from.saturating_sub(t.first);
                Some(p.rows.iter().filter(|r| **r as usize >= skip).count() as u64)
            })
            .sum()
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
        DocRows::of_segment(seg)
    }

    /// Documents containing `term` (a generation's index remembers the answer).
    pub(crate) fn doc_freq(&self, term: &Term) -> Result<u64> {
        let tail: u64 = self
            .tail
            .iter()
            .filter_map(|t| t.postings(term))
            .map(|p| p.rows.len() as u64)
            .sum();
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
        self.tail
            .get(t)
            .map_or(0, |t| t.tokens(row - t.first, field))
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
fn prune_tail(tail: &mut Vec<Arc<TailSegment>>, from: usize) {
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
    fn committed_rows(&self) -> usize {
        self.committed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .committed_rows()
    }

    /// The tail segments from row `from` (the last commit) through row `rows` at least,
    /// tokenizing the rows no earlier caller did.
    fn tail_through(
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

    /// A tail segment over rows `from..to` of `batches`: the postings of their terms in
    /// memory, tokenized with the index's analyzers (no tantivy segment yet: see
    /// [`TailSegment::searcher`]).
    fn tail_segment(&self, batches: &[RecordBatch], from: usize, to: usize) -> Result<TailSegment> {
        let nfields = self.schema.fields.len();
        let mut analyzers = self
            .schema
            .fields
            .iter()
            .map(|f| self.index.tokenizer_for_field(*f).map_err(tv))
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
                        let mut n = 0u32;
                        let mut ts = analyzers[f].token_stream(col.value(r));
                        while ts.advance() {
                            let token = ts.token();
                            if !in_postings(&token.text) {
                                continue;
                            }
                            n += 1;
                            let p = match postings[f].get_mut(token.text.as_str()) {
                                Some(p) => p,
                                None => postings[f].entry(token.text.clone()).or_default(),
                            };
                            if p.rows.last() != Some(&row) {
                                p.rows.push(row);
                                p.ends.push(p.positions.len() as u32);
                            }
                            p.positions.push(token.position as u32);
                            *p.ends.last_mut().expect("pushed above") += 1;
                        }
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
