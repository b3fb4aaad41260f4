//! A version-3 generation's rows in its cold part: every stored column but the vector column,
//! as one Parquet file (LZ4 pages of at most [`PAGE_ROWS`] rows and [`PAGE_BYTES`] bytes, no
//! dictionaries, an offset index), whose metadata lives in the hot part. A read of some rows fetches only the pages
//! holding them, for the columns it asks for, all at once through the block cache.

use super::cold::ColdObject;
use crate::{Error, Result};
use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, TryStreamExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, RowSelection};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::{ArrowWriter, ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::metadata::{
    PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader, ParquetMetaDataWriter,
};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use std::ops::Range;
use std::sync::Arc;

/// Rows per Parquet page at most: a returned row costs the page holding it, per column (a
/// page of a wide column is bounded by [`PAGE_BYTES`] first; one of a number column holds
/// this many rows, which a filter reading the column decodes at once).
pub(crate) const PAGE_ROWS: usize = 1024;
/// Bytes per Parquet page at most (before compression, checked every [`WRITE_ROWS`] rows): a
/// page of long text holds a few rows.
const PAGE_BYTES: usize = 8 << 10;
/// Rows the writer encodes at a time, and so checks a page's size after.
const WRITE_ROWS: usize = 16;
/// Rows per Parquet row group: what the writer buffers before writing pages out.
const GROUP_ROWS: usize = 64 * 1024;

/// The cold rows of `rows` without column `skip` (the vector column): the Parquet file and its
/// metadata (footer and offset index) serialized on its own, for the hot part.
pub(crate) fn encode(rows: &RecordBatch, skip: Option<usize>) -> Result<(Vec<u8>, Vec<u8>)> {
    let keep: Vec<usize> = (0..rows.num_columns())
        .filter(|c| Some(*c) != skip)
        .collect();
    let batch = rows.project(&keep)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::LZ4_RAW)
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_data_page_size_limit(PAGE_BYTES)
        .set_write_batch_size(WRITE_ROWS)
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .build();
    let mut file = Vec::new();
    let mut w = ArrowWriter::try_new(&mut file, batch.schema(), Some(props)).map_err(pq)?;
    w.write(&batch).map_err(pq)?;
    w.close().map_err(pq)?;
    let file = Bytes::from(file);
    let meta = ParquetMetaDataReader::new()
        .with_page_index_policy(PageIndexPolicy::Required)
        .parse_and_finish(&file)
        .map_err(pq)?;
    let mut footer = Vec::new();
    ParquetMetaDataWriter::new(&mut footer, &meta)
        .finish()
        .map_err(pq)?;
    Ok((file.to_vec(), footer))
}

/// A column chunk's `(start, length)` in its file, or `None` when its metadata gives a
/// negative one (Parquet's own `byte_range` panics on those).
fn chunk_range(c: &parquet::file::metadata::ColumnChunkMetaData) -> Option<(u64, u64)> {
    let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
    Some((
        u64::try_from(start).ok()?,
        u64::try_from(c.compressed_size()).ok()?,
    ))
}

fn pq(e: ParquetError) -> Error {
    Error::internal(format!("parquet: {e}"))
}

/// A generation's cold rows, ready to be read by row.
#[derive(Debug, Clone)]
pub(crate) struct ColdRows {
    object: ColdObject,
    /// Where the Parquet file starts in the object.
    offset: u64,
    metadata: ArrowReaderMetadata,
    /// The Parquet column of each stored column (`None`: the vector column, not stored here).
    columns: Vec<Option<usize>>,
    rows: usize,
    /// The Parquet file's length.
    len: u64,
}

impl ColdRows {
    /// The rows stored at `range` of `object`, described by `footer` (as [`encode`] wrote it),
    /// holding the columns of `stored` but `skip`. A footer that does not describe such rows
    /// is a `Data` error.
    pub(crate) fn open(
        object: ColdObject,
        range: Range<u64>,
        footer: &Bytes,
        stored: &SchemaRef,
        skip: Option<usize>,
        rows: usize,
    ) -> Result<ColdRows> {
        let bad = |m: String| Error::data(object.path(), format!("generation rows: {m}"));
        let meta = ParquetMetaDataReader::new()
            .with_page_index_policy(PageIndexPolicy::Required)
            .parse_and_finish(footer)
            .map_err(|e| bad(e.to_string()))?;
        let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Required);
        let metadata = ArrowReaderMetadata::try_new(Arc::new(meta), options)
            .map_err(|e| bad(e.to_string()))?;
        let mut columns = Vec::with_capacity(stored.fields().len());
        let mut next = 0;
        for c in 0..stored.fields().len() {
            if Some(c) == skip {
                columns.push(None);
            } else {
                columns.push(Some(next));
                next += 1;
            }
        }
        let found = metadata.schema();
        let expected: Vec<_> = (0..stored.fields().len())
            .filter(|c| Some(*c) != skip)
            .map(|c| stored.field(c))
            .collect();
        let same = found.fields().len() == expected.len()
            && found
                .fields()
                .iter()
                .zip(&expected)
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
        if !same {
            return Err(bad(format!(
                "its columns are not the index's stored columns: {found:?}"
            )));
        }
        let held = metadata.metadata().file_metadata().num_rows();
        let pages_end = metadata
            .metadata()
            .row_groups()
            .iter()
            .flat_map(|g| g.columns())
            .map(|c| chunk_range(c).map_or(u64::MAX, |(start, len)| start.saturating_add(len)))
            .max()
            .unwrap_or(0);
        if held != rows as i64 || pages_end > range.end - range.start {
            return Err(bad(format!(
                "{held} rows in {} bytes where the generation holds {rows} in {}",
                pages_end,
                range.end - range.start
            )));
        }
        Ok(ColdRows {
            object,
            offset: range.start,
            metadata,
            columns,
            rows,
            len: range.end - range.start,
        })
    }

    /// Columns `cols` (of the stored schema, none the vector column) of rows `ords`, in the
    /// order given (repeats allowed). The pages holding them are fetched at once, then decoded.
    pub(crate) async fn read(&self, ords: &[usize], cols: &[usize]) -> Result<Vec<ArrayRef>> {
        let mut sorted = ords.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.last().is_some_and(|r| *r >= self.rows) {
            return Err(Error::internal(format!(
                "row {:?} of a generation of {} rows",
                sorted.last(),
                self.rows
            )));
        }
        let runs = runs(&sorted);
        let selection = RowSelection::from_consecutive_ranges(runs.iter().cloned(), self.rows);
        let batch = self.decode(cols, Read::Rows(selection), &runs).await?;
        let at: UInt32Array = ords
            .iter()
            .map(|r| sorted.binary_search(r).map(|i| i as u32).unwrap_or(0))
            .collect();
        Ok(batch
            .columns()
            .iter()
            .map(|c| arrow::compute::take(c.as_ref(), &at, None))
            .collect::<std::result::Result<_, _>>()?)
    }

    /// Columns `cols` of every row, in row order: through the block cache when `cached` (a
    /// filter's columns, read again by the next query), else straight from the store (a
    /// compaction's, read once, which would flush what queries keep in the cache).
    pub(crate) async fn read_all(&self, cols: &[usize], cached: bool) -> Result<Vec<ArrayRef>> {
        let all = std::iter::once(0..self.rows).collect::<Vec<_>>();
        let how = if cached { Read::Cached } else { Read::Direct };
        Ok(self.decode(cols, how, &all).await?.columns().to_vec())
    }

    /// Decode columns `cols` of the rows `runs` selects (all of them without a selection),
    /// after fetching their pages concurrently.
    async fn decode(
        &self,
        cols: &[usize],
        how: Read,
        runs: &[Range<usize>],
    ) -> Result<RecordBatch> {
        let leaves: Vec<usize> = cols
            .iter()
            .map(|c| {
                self.columns.get(*c).copied().flatten().ok_or_else(|| {
                    Error::internal(format!("stored column {c} is not in the cold rows"))
                })
            })
            .collect::<Result<_>>()?;
        // The order of the output columns: Parquet returns them in file order.
        let mut order: Vec<usize> = leaves.clone();
        order.sort_unstable();
        order.dedup();
        // Some rows: their pages through the block cache, fetched at once before the reader
        // asks for them row group by row group. Every row: the column chunks, through the
        // cache (`Cached`) or straight from the store (not through the cache, which they
        // would flush). Either way what was fetched is kept for the reader, which would
        // otherwise fetch again what the cache could not keep.
        let (local, selection) = match how {
            Read::Rows(selection) => {
                let pages = self.page_ranges(&order, runs)?;
                let read = self.object.read_ranges(&pages).await?;
                (pages.into_iter().zip(read).collect(), Some(selection))
            }
            Read::Cached => {
                let chunks = self.chunk_ranges(&order)?;
                let read = self.object.read_ranges(&chunks).await?;
                (chunks.into_iter().zip(read).collect(), None)
            }
            Read::Direct => {
                let chunks = self.chunk_ranges(&order)?;
                let mut read: Vec<Bytes> = Vec::with_capacity(chunks.len());
                for some in chunks.chunks(self.object.concurrency()) {
                    read.extend(
                        futures::future::try_join_all(
                            some.iter().map(|r| self.object.read_direct(r.clone())),
                        )
                        .await?,
                    );
                }
                (chunks.into_iter().zip(read).collect(), None)
            }
        };
        let reader = Reader {
            object: self.object.clone(),
            offset: self.offset,
            metadata: self.metadata.metadata().clone(),
            local: Arc::new(local),
        };
        let mask = ProjectionMask::roots(
            self.metadata.metadata().file_metadata().schema_descr(),
            order.iter().copied(),
        );
        let mut builder =
            ParquetRecordBatchStreamBuilder::new_with_metadata(reader, self.metadata.clone())
                .with_projection(mask)
                .with_batch_size(runs.iter().map(|r| r.len()).sum::<usize>().max(1));
        if let Some(s) = selection {
            builder = builder.with_row_selection(s);
        }
        let batches: Vec<RecordBatch> = builder
            .build()
            .map_err(|e| self.error(e))?
            .try_collect()
            .await
            .map_err(|e| self.error(e))?;
        let schema = match batches.first() {
            Some(b) => b.schema(),
            None => Arc::new(self.metadata.schema().project(&order)?),
        };
        let all = arrow::compute::concat_batches(&schema, &batches)?;
        let selected: usize = runs.iter().map(|r| r.len()).sum();
        if all.num_rows() != selected {
            return Err(self.bad(&format!(
                "{} rows decoded where {selected} were selected",
                all.num_rows()
            )));
        }
        let pick: Vec<usize> = leaves
            .iter()
            .map(|l| order.binary_search(l).expect("a projected column"))
            .collect();
        Ok(all.project(&pick)?)
    }

    /// The byte ranges (in the object) of the column chunks of columns `leaves`, adjacent
    /// ones merged; a chunk outside the rows section is a `Data` error.
    fn chunk_ranges(&self, leaves: &[usize]) -> Result<Vec<Range<u64>>> {
        let mut out: Vec<Range<u64>> = Vec::new();
        for group in self.metadata.metadata().row_groups() {
            for &leaf in leaves {
                let Some(c) = group.columns().get(leaf) else {
                    continue;
                };
                let end = chunk_range(c)
                    .and_then(|(start, len)| Some((start, start.checked_add(len)?)))
                    .filter(|(_, e)| *e <= self.len);
                let Some((start, end)) = end else {
                    return Err(self.bad("a column chunk lies outside its section"));
                };
                let range = self.offset + start..self.offset + end;
                match out.last_mut() {
                    Some(last) if last.end == range.start => last.end = range.end,
                    _ => out.push(range),
                }
            }
        }
        Ok(out)
    }

    /// The byte ranges (in the object) of the pages of columns `leaves` holding rows `runs`
    /// (sorted and disjoint, as [`runs`] makes them). Pages are found by their first rows, which
    /// the offset index keeps in order; metadata that does not (a damaged file) may leave a
    /// page out, which the reader then reads on its own.
    fn page_ranges(&self, leaves: &[usize], runs: &[Range<usize>]) -> Result<Vec<Range<u64>>> {
        let meta = self.metadata.metadata();
        let Some(index) = meta.offset_index() else {
            return Ok(Vec::new());
        };
        debug_assert!(
            runs.windows(2).all(|w| w[0].end <= w[1].start),
            "runs {runs:?}"
        );
        let mut out: Vec<Range<u64>> = Vec::new();
        let mut first = 0usize;
        for (g, group) in meta.row_groups().iter().enumerate() {
            let n = group.num_rows() as usize;
            let span = first..first + n;
            first += n;
            let inside: Vec<Range<usize>> = runs
                .iter()
                .filter(|r| r.start < span.end && r.end > span.start)
                .map(|r| r.start.max(span.start) - span.start..r.end.min(span.end) - span.start)
                .collect();
            if inside.is_empty() {
                continue;
            }
            for &leaf in leaves {
                let Some(pages) = index.get(g).and_then(|cols| cols.get(leaf)) else {
                    continue;
                };
                let pages = pages.page_locations();
                // The pages each run overlaps, found by their first rows (in order): the runs
                // are sorted, so the pages come in order, a page two runs share once.
                let mut last_page = None;
                for run in &inside {
                    let from = pages
                        .partition_point(|p| p.first_row_index as usize <= run.start)
                        .saturating_sub(1);
                    for (p, page) in pages.iter().enumerate().skip(from) {
                        let start = page.first_row_index as usize;
                        let end = pages.get(p + 1).map_or(n, |q| q.first_row_index as usize);
                        if start >= run.end {
                            break;
                        }
                        if end <= run.start || last_page.is_some_and(|l| p <= l) {
                            continue;
                        }
                        last_page = Some(p);
                        let (Ok(at), Ok(size)) = (
                            u64::try_from(page.offset),
                            u64::try_from(page.compressed_page_size),
                        ) else {
                            return Err(self.bad("a page with a negative offset or size"));
                        };
                        if at.checked_add(size).is_none_or(|e| e > self.len) {
                            return Err(self.bad("a page lies outside its section"));
                        }
                        let at = self.offset + at;
                        let range = at..at + size;
                        match out.last_mut() {
                            Some(last) if last.end == range.start => last.end = range.end,
                            _ => out.push(range),
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// A `Data` error about these rows.
    fn bad(&self, what: &str) -> Error {
        Error::data(self.object.path(), format!("generation rows: {what}"))
    }

    /// One of our errors back from a Parquet stream, or a `Data` error naming the object.
    fn error(&self, e: ParquetError) -> Error {
        if let ParquetError::External(inner) = &e {
            if let Some(ours) = inner.downcast_ref::<Error>() {
                return ours.clone();
            }
        }
        Error::data(self.object.path(), format!("generation rows: {e}"))
    }

    /// The object the rows are read from.
    pub(crate) fn object(&self) -> &ColdObject {
        &self.object
    }

    /// Bytes of Parquet metadata held in memory (an estimate: its in-memory size).
    pub(crate) fn resident_bytes(&self) -> usize {
        self.metadata.metadata().memory_size()
    }
}

/// How [`ColdRows::decode`] reads.
enum Read {
    /// The rows selected: their pages through the block cache.
    Rows(RowSelection),
    /// Every row, through the block cache.
    Cached,
    /// Every row, straight from the store.
    Direct,
}

/// Sorted distinct rows as runs of consecutive rows.
fn runs(sorted: &[usize]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for &r in sorted {
        match out.last_mut() {
            Some(last) if last.end == r => last.end = r + 1,
            _ => out.push(r..r + 1),
        }
    }
    out
}

/// The Parquet reader's view of the cold rows: ranges of the file, from the bytes a
/// whole-column read fetched beforehand or through the block cache (where the pages a read
/// of some rows needs were fetched just before), and the metadata in memory.
struct Reader {
    object: ColdObject,
    offset: u64,
    metadata: Arc<ParquetMetaData>,
    /// Ranges of the object read beforehand (a whole-column read), served from here.
    local: Arc<Vec<(Range<u64>, Bytes)>>,
}

impl Reader {
    /// Bytes `range` of the object, from the ranges read beforehand or through the cache.
    async fn bytes(
        object: &ColdObject,
        local: &[(Range<u64>, Bytes)],
        range: Range<u64>,
    ) -> Result<Bytes> {
        let at = local.partition_point(|(r, _)| r.end <= range.start);
        match local.get(at) {
            Some((r, b)) if r.start <= range.start && range.end <= r.end => {
                let from = (range.start - r.start) as usize;
                Ok(b.slice(from..from + (range.end - range.start) as usize))
            }
            _ => object.read(range).await,
        }
    }
}

impl AsyncFileReader for Reader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        let at = self.offset + range.start..self.offset + range.end;
        async move {
            Reader::bytes(&self.object, &self.local, at)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        let object = self.object.clone();
        let offset = self.offset;
        let local = self.local.clone();
        async move {
            let ranges: Vec<Range<u64>> = ranges
                .into_iter()
                .map(|r| offset + r.start..offset + r.end)
                .collect();
            let result = if local.is_empty() {
                object.read_ranges(&ranges).await
            } else {
                futures::future::try_join_all(
                    ranges
                        .into_iter()
                        .map(|r| Reader::bytes(&object, &local, r)),
                )
                .await
            };
            result.map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        let m = self.metadata.clone();
        async move { Ok(m) }.boxed()
    }
}
