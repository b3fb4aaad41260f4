//! A source's full-text index as searches read it, and a generation's, built at flush and
//! stored in its bundle.

use super::cold::{ColdRead, ColdText, GenDirectory, TermAt, TextFile};
use super::schema::TextSchema;
use super::tail::{TailQuery, TailSegment};
use super::{open_reader, segment_files, token_totals, IndexFiles, ROW_FIELD};
use crate::{Error, Result};
use arrow::array::RecordBatch;
use std::sync::Arc;
use tantivy::directory::Directory;
use tantivy::{IndexWriter, Searcher, SegmentReader, TantivyDocument, Term};

/// Writer heap used to build a generation's text index at flush.
const FLUSH_WRITER_HEAP: usize = 128_000_000;

/// A source's full-text index: a tantivy searcher and the token counts of its rows.
#[derive(Clone)]
pub(crate) struct TextIndex {
    pub(super) searcher: Searcher,
    /// `rows × fields` token counts, row-major; empty for a generation opened from its
    /// object, which keeps only their totals.
    pub(super) counts: Arc<Vec<u32>>,
    /// Rows of the committed index (tail segments aside).
    pub(super) committed: usize,
    pub(super) nfields: usize,
    /// Tokens per field over every row, computed at first use.
    pub(super) totals: Arc<std::sync::OnceLock<Vec<u64>>>,
    /// Per segment, each document's row (a generation's, read once when it is opened);
    /// `None` for a memtable's index, whose documents are looked up in the `_row` fast field.
    pub(super) doc_rows: Option<Arc<Vec<Vec<u32>>>>,
    /// A memtable's rows past what its index had committed, in the order of their rows: small
    /// segments searches built themselves (see [`MemTextIndex::view`]). Empty for a generation.
    pub(super) tail: Arc<[Arc<TailSegment>]>,
    /// Where a generation's cold postings and positions lie (see [`TextIndex::cold_ranges`]);
    /// `None` when they are held.
    pub(super) cold: Option<Arc<ColdText>>,
}

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
        Ok(DocRows::Column(seg.fast_fields().u64(ROW_FIELD)?))
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

/// Each segment's document → row table; every row number must be below `rows`.
pub(super) fn doc_row_tables(searcher: &Searcher, rows: usize) -> Result<Vec<Vec<u32>>> {
    searcher
        .segment_readers()
        .iter()
        .map(|seg| {
            let col = seg.fast_fields().u64(ROW_FIELD)?;
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

    /// Documents containing `term`.
    pub(crate) fn doc_freq(&self, term: &Term) -> Result<u64> {
        let tail: u64 = self
            .tail
            .iter()
            .filter_map(|t| t.postings(term))
            .map(|p| p.rows.len() as u64)
            .sum();
        Ok(self.searcher.doc_freq(term)? + tail)
    }

    /// Which opening of a generation's index this is, for what is kept of its terms' cold
    /// ranges (see [`ColdText::id`]); 0 when its postings are held.
    pub(crate) fn opening(&self) -> u64 {
        self.cold.as_ref().map_or(0, |c| c.id())
    }

    /// What a search of `term` reads of a generation's index (one with no rows past a commit):
    /// its document frequency, and where its postings and positions lie in the generation's
    /// cold part (no ranges when they are held).
    pub(crate) fn term(&self, term: &Term) -> Result<TermAt> {
        debug_assert!(self.tail.is_empty(), "a memtable's index");
        match &self.cold {
            Some(c) => c.term(&self.searcher, term),
            None => Ok(TermAt {
                doc_freq: self.searcher.doc_freq(term)?,
                postings: Arc::new([]),
                positions: Arc::new([]),
            }),
        }
    }

    /// Rows of the committed index, tail segments aside.
    pub(super) fn committed_rows(&self) -> usize {
        self.committed
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
            debug_assert!(
                !self.counts.is_empty(),
                "row {row}'s token count asked of a generation that keeps only totals"
            );
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
        let mut writer: IndexWriter<TantivyDocument> =
            index.writer_with_num_threads(1, FLUSH_WRITER_HEAP)?;
        writer.set_merge_policy(Box::new(tantivy::indexer::NoMergePolicy));
        let counts = ts.add_rows(
            &index,
            &mut |doc| writer.add_document(doc).map(drop).map_err(Error::from),
            rows,
            0,
        )?;
        writer.commit()?;
        let ids = index.searchable_segment_ids()?;
        if ids.len() > 1 {
            writer.merge(&ids).wait()?;
        }
        writer.wait_merging_threads()?;
        let files = export_files(&index)?;
        Ok((Self::of_generation(ts, &index, counts)?, files))
    }

    /// A generation's text index over a finished tantivy index and its rows' token counts.
    pub(super) fn of_generation(
        ts: &TextSchema,
        index: &tantivy::Index,
        counts: Vec<u32>,
    ) -> Result<Self> {
        let searcher = open_reader(index)?.searcher();
        let rows = counts.len() / ts.fields.len().max(1);
        Ok(TextIndex {
            doc_rows: Some(Arc::new(doc_row_tables(&searcher, rows)?)),
            searcher,
            counts: Arc::new(counts),
            committed: rows,
            totals: Arc::default(),
            nfields: ts.fields.len(),
            tail: Arc::new([]),
            cold: None,
        })
    }

    /// Open an index from the files [`TextIndex::build`] exported (held, or cold and read
    /// through `read`) and the stored token counts. Every held segment file's own checksum is
    /// verified first (cold ones are checked by block as they are read), and a panic of
    /// tantivy on malformed files becomes an error.
    pub(crate) fn open(
        ts: &TextSchema,
        files: Vec<(String, TextFile)>,
        counts: Vec<u32>,
        read: Option<Arc<dyn ColdRead>>,
    ) -> Result<TextIndex> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Self::open_unguarded(ts, files, counts, read)
        }))
        .unwrap_or_else(|_| Err(Error::internal("tantivy failed on malformed index files")))
    }

    pub(super) fn open_unguarded(
        ts: &TextSchema,
        files: Vec<(String, TextFile)>,
        counts: Vec<u32>,
        read: Option<Arc<dyn ColdRead>>,
    ) -> Result<TextIndex> {
        let segment_files: Vec<std::path::PathBuf> = files
            .iter()
            .filter(|(name, _)| !name.ends_with(".json"))
            .map(|(name, _)| std::path::PathBuf::from(name))
            .collect();
        let dir = GenDirectory::open(files, read)?;
        let index = tantivy::Index::open(dir.clone())?;
        if index.schema() != ts.schema {
            return Err(Error::internal(
                "text index schema differs from the index schema",
            ));
        }
        for path in segment_files.iter().filter(|p| !dir.is_cold(p)) {
            if !index.directory().validate_checksum(path)? {
                return Err(Error::internal(format!(
                    "file '{}' fails its checksum",
                    path.display()
                )));
            }
        }
        let mut ti = Self::of_generation(ts, &index, counts)?;
        ti.cold = ColdText::locate(ts, &ti.searcher, &dir)?.map(Arc::new);
        // Queries need a generation's token totals, not each row's counts (only a memtable's
        // rows past a query's view are counted row by row): 4 bytes a row and field less.
        let totals = std::sync::OnceLock::from(token_totals(&ti.counts, ti.nfields));
        ti.totals = Arc::new(totals);
        ti.counts = Arc::new(Vec::new());
        Ok(ti)
    }

    /// Encode token counts (u32 little-endian, row-major).
    pub(crate) fn encode_counts(&self) -> Vec<u8> {
        self.counts.iter().flat_map(|c| c.to_le_bytes()).collect()
    }
}

/// The files of a committed in-memory index: `meta.json` and every segment component.
pub(super) fn export_files(index: &tantivy::Index) -> Result<IndexFiles> {
    let dir = index.directory();
    let mut names = vec!["meta.json".to_string()];
    for meta in index.searchable_segment_metas()? {
        names.extend(segment_files(&meta).map(|p| p.to_string_lossy().into_owned()));
    }
    let mut out = Vec::new();
    for name in names {
        let p = std::path::Path::new(&name);
        if dir.exists(p)? {
            out.push((name.clone(), dir.atomic_read(p)?));
        }
    }
    Ok(out)
}
