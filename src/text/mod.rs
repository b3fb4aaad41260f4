//! Full-text indexes: one tantivy index per source, all with the same tantivy schema, analyzers
//! and `_row` fast field, so one parsed query runs on every source and BM25 can be fed global
//! statistics.
//!
//! Every source also keeps the exact token count of each row and text field (the analyzer's
//! output, as tantivy counts it for fieldnorms) so that the snapshot's total token count can be
//! computed over live rows only.

mod cold;
mod index;
mod memtable;
mod schema;
mod tail;

pub(crate) use cold::{hot_pieces, missing, ColdPiece, ColdRead, PostingsCache, TermAt, TextFile};
pub(crate) use index::{DocRows, TextIndex};
pub(crate) use memtable::MemTextIndex;
pub(crate) use schema::TextSchema;
pub(crate) use tail::TailQuery;

use crate::{Error, Result};
use tantivy::{IndexReader, ReloadPolicy};

/// The files of a tantivy index: `(name, bytes)`.
pub(crate) type IndexFiles = Vec<(String, Vec<u8>)>;

/// Name of the fast field mapping a tantivy document to its row in the source.
pub(crate) const ROW_FIELD: &str = "_row";
/// Writer heap of a memtable's text index (tantivy's minimum per thread is 15 MB).
const MEMTABLE_WRITER_HEAP: usize = 20_000_000;

/// Whether tantivy indexes `token`: it leaves one over `MAX_TOKEN_LEN` bytes out of the
/// postings and out of the field's length (its fieldnorm and token totals).
pub(crate) fn in_postings(token: &str) -> bool {
    token.len() <= tantivy::tokenizer::MAX_TOKEN_LEN
}

/// Tokens per field over row-major `counts` of `nfields` fields.
pub(crate) fn token_totals(counts: &[u32], nfields: usize) -> Vec<u64> {
    let mut t = vec![0u64; nfields];
    for row in counts.chunks_exact(nfields.max(1)) {
        for (f, c) in row.iter().enumerate() {
            t[f] += u64::from(*c);
        }
    }
    t
}

pub(crate) fn open_reader(index: &tantivy::Index) -> Result<IndexReader> {
    index
        .reader_builder()
        .reload_policy(ReloadPolicy::Manual)
        .try_into()
        .map_err(Error::from)
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
