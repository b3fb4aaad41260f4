//! A generation's tantivy files as searches read them from a version-4 bundle: the postings
//! (`.idx`) and positions (`.pos`) files stay in the object's cold part and are read by byte
//! range, the rest (term dictionaries, fieldnorms, fast fields, `meta.json`) is held.
//!
//! What tantivy reads of a postings or positions file when it opens a segment and each text
//! field's inverted index (the file footers, each field's token total) is recorded when the
//! generation is built ([`hot_pieces`]) and stored in the hot part as that file's *pieces*,
//! as Quickwit's hotcache does, so opening a generation reads nothing more. A query's terms
//! then name the rest: [`ColdText::ranges`] gives the byte ranges of their postings and
//! positions in the object, which the query fetches in one concurrent round before tantivy
//! runs its unchanged, synchronous search over them; a read the round did not cover (a
//! prefix or range query's terms) is made when tantivy asks ([`ColdRead`]). What was read is
//! kept, as tantivy asks for it (one entry per term's postings or positions), in the handle's
//! [`PostingsCache`], so a warm search reads it without a lookup per block or a copy.

use super::open_reader;
use super::schema::TextSchema;
use crate::{Error, Result};
use bytes::Bytes;
use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tantivy::directory::error::{DeleteError, OpenReadError, OpenWriteError};
use tantivy::directory::{
    CompositeFile, Directory, FileHandle, FileSlice, OwnedBytes, WatchCallback, WatchHandle,
    WritePtr,
};
use tantivy::schema::Field;
use tantivy::{HasLen, Term};

/// Whether tantivy file `name` is read by range (postings and positions); every other file of
/// a generation's index is held.
pub(crate) fn is_cold_file(name: &str) -> bool {
    name.ends_with(".idx") || name.ends_with(".pos")
}

/// Reads of a generation's cold part from a query thread (the generation layer's block
/// cache), each block checked.
pub(crate) trait ColdRead: Send + Sync + std::fmt::Debug + 'static {
    /// Bytes `range` of the object, the calling thread waiting for them.
    fn read_blocking(&self, range: Range<u64>) -> Result<Bytes>;
    /// The handle's cache of what searches read.
    fn postings(&self) -> &PostingsCache;
}

/// A handle's cache of the postings and positions its searches read from generations' cold
/// parts, one entry per range tantivy asks for (a term's postings, or its positions), within
/// a byte budget ([`crate::Settings::postings_cache_bytes`]).
///
/// foyer's in-memory cache with FIFO eviction, whose lookups cost a fraction of moka's: a
/// warm search makes one per term and generation, twice (ahead of the search, and in it).
#[derive(Clone)]
pub(crate) struct PostingsCache {
    /// `None` with a budget of 0: nothing is kept.
    cache: Option<foyer::Cache<(u64, u64, u64), OwnedBytes>>,
    /// The largest entry kept (a quarter of a shard: foyer would let a heavier one in and
    /// empty its shard for it).
    max_entry: usize,
    /// Entries that left (evicted, replaced or removed) since the cache was made: while it
    /// stays the same, every entry found kept is still kept. foyer counts a leave just after
    /// the entry has gone, so a query in between may skip a lookup and have its search read
    /// that range itself (correct, one read of its own); the queries after it look again.
    left: Arc<std::sync::atomic::AtomicU64>,
}

/// Counts the entries leaving a [`PostingsCache`].
struct Leaving(Arc<std::sync::atomic::AtomicU64>);

impl foyer::EventListener for Leaving {
    type Key = (u64, u64, u64);
    type Value = OwnedBytes;

    fn on_leave(&self, _reason: foyer::Event, _key: &Self::Key, _value: &Self::Value) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Release);
    }
}

impl std::fmt::Debug for PostingsCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostingsCache({} bytes)", self.bytes())
    }
}

/// What an entry of the postings cache weighs beside its bytes: its key and bookkeeping.
const ENTRY_OVERHEAD: usize = 96;

impl PostingsCache {
    /// An empty cache of at most `bytes` bytes (0: none).
    pub(crate) fn new(bytes: u64) -> Self {
        let capacity = usize::try_from(bytes).unwrap_or(usize::MAX);
        // Shards split the budget evenly: each holds at least 1 MiB.
        let shards = (bytes >> 20).clamp(1, 8) as usize;
        let left = Arc::new(std::sync::atomic::AtomicU64::new(0));
        PostingsCache {
            cache: (bytes > 0).then(|| {
                // FIFO eviction: a lookup changes no eviction state (no lock to take).
                foyer::CacheBuilder::new(capacity)
                    .with_shards(shards)
                    .with_eviction_config(foyer::FifoConfig::default())
                    .with_weighter(|_: &(u64, u64, u64), v: &OwnedBytes| v.len() + ENTRY_OVERHEAD)
                    .with_event_listener(Arc::new(Leaving(left.clone())))
                    .build()
            }),
            max_entry: capacity / shards / 4,
            left,
        }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.cache.as_ref().map_or(0, |c| c.usage() as u64)
    }

    fn get(&self, key: &(u64, u64, u64)) -> Option<OwnedBytes> {
        self.cache.as_ref()?.get(key).map(|e| e.value().clone())
    }

    /// How many entries left so far (see [`PostingsCache::left`]'s field).
    fn left(&self) -> u64 {
        self.left.load(std::sync::atomic::Ordering::Acquire)
    }

    fn contains(&self, key: &(u64, u64, u64)) -> bool {
        self.cache.as_ref().is_some_and(|c| c.contains(key))
    }

    fn insert(&self, key: (u64, u64, u64), value: OwnedBytes) {
        if let Some(c) = &self.cache {
            if value.len() + ENTRY_OVERHEAD <= self.max_entry {
                c.insert(key, value);
            }
        }
    }
}

/// Numbers cold files for the keys of [`PostingsCache`].
static NEXT_FILE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// One file of a generation's tantivy index as a bundle holds it.
pub(crate) enum TextFile {
    /// Held whole.
    Hot(Bytes),
    /// In the cold part at `at..at + len` of the object; `pieces` are what tantivy reads of
    /// it when it opens a segment (a [`hot_pieces`] section).
    Cold { at: u64, len: u64, pieces: Bytes },
}

/// Encode the pieces of a file (ranges of `file`, sorted and disjoint): their count (u32),
/// each one's offset (u64) and length (u32), then their bytes, all little-endian.
fn encode_pieces(file: &[u8], ranges: &[Range<usize>]) -> Vec<u8> {
    let mut out = (ranges.len() as u32).to_le_bytes().to_vec();
    for r in ranges {
        out.extend_from_slice(&(r.start as u64).to_le_bytes());
        out.extend_from_slice(&((r.end - r.start) as u32).to_le_bytes());
    }
    for r in ranges {
        out.extend_from_slice(&file[r.clone()]);
    }
    out
}

/// Decode the pieces of a file of `len` bytes; `None` when they are malformed.
fn decode_pieces(bytes: &Bytes, len: u64) -> Option<Vec<(Range<u64>, OwnedBytes)>> {
    let count = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let head = count.checked_mul(12)?.checked_add(4)?;
    // The count is the object's word: nothing is allocated for more entries than it holds.
    if head > bytes.len() {
        return None;
    }
    let mut at = head;
    let mut prev_end = 0u64;
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let e = bytes.get(4 + i * 12..4 + (i + 1) * 12)?;
        let offset = u64::from_le_bytes(e[..8].try_into().ok()?);
        let n = u64::from(u32::from_le_bytes(e[8..].try_into().ok()?));
        let end = offset.checked_add(n)?;
        if offset < prev_end || end > len || n == 0 {
            return None;
        }
        prev_end = end;
        let piece = bytes.get(at..at.checked_add(n as usize)?)?;
        out.push((offset..end, OwnedBytes::new(piece.to_vec())));
        at += n as usize;
    }
    (at == bytes.len()).then_some(out)
}

/// A postings or positions file in the cold part: its pieces held, the rest read through
/// `read` when tantivy asks (or fetched ahead, see [`ColdPiece`]) and kept in the handle's
/// [`PostingsCache`].
#[derive(Debug)]
pub(crate) struct ColdFile {
    /// Its key in the postings cache.
    id: u64,
    name: String,
    /// Where the file starts in the object, and its length.
    at: u64,
    len: u64,
    pieces: Vec<(Range<u64>, OwnedBytes)>,
    read: Arc<dyn ColdRead>,
}

impl HasLen for ColdFile {
    fn len(&self) -> usize {
        self.len as usize
    }
}

impl FileHandle for ColdFile {
    fn read_bytes(&self, range: Range<usize>) -> io::Result<OwnedBytes> {
        let r = range.start as u64..range.end as u64;
        if r.start > r.end || r.end > self.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "text file '{}': bytes {r:?} lie past its {} bytes",
                    self.name, self.len
                ),
            ));
        }
        if r.is_empty() {
            return Ok(OwnedBytes::empty());
        }
        if let Some(held) = self.read.postings().get(&(self.id, r.start, r.end)) {
            return Ok(held);
        }
        let i = self.pieces.partition_point(|(p, _)| p.start <= r.start);
        if let Some((p, bytes)) = i.checked_sub(1).map(|i| &self.pieces[i]) {
            if r.end <= p.end {
                let from = (r.start - p.start) as usize;
                return Ok(bytes.slice(from..from + (r.end - r.start) as usize));
            }
        }
        let bytes = self
            .read
            .read_blocking(self.at + r.start..self.at + r.end)
            .map_err(io::Error::other)?;
        Ok(self.keep(r, &bytes))
    }
}

impl ColdFile {
    /// Keep `bytes`, the file's bytes `r`, in the postings cache.
    fn keep(&self, r: Range<u64>, bytes: &Bytes) -> OwnedBytes {
        let owned = OwnedBytes::new(bytes.to_vec());
        self.read
            .postings()
            .insert((self.id, r.start, r.end), owned.clone());
        owned
    }

    fn is_kept(&self, r: &Range<u64>) -> bool {
        self.read.postings().contains(&(self.id, r.start, r.end))
    }
}

/// A range of a cold file a search will read: fetch its object range, then [`ColdPiece::fill`].
pub(crate) struct ColdPiece {
    file: Arc<ColdFile>,
    range: Range<u64>,
}

impl ColdPiece {
    /// Its bytes in the object.
    pub(crate) fn object_range(&self) -> Range<u64> {
        self.file.at + self.range.start..self.file.at + self.range.end
    }

    /// Keep its bytes (those of [`ColdPiece::object_range`]) for the search that reads it.
    pub(crate) fn fill(&self, bytes: &Bytes) {
        self.file.keep(self.range.clone(), bytes);
    }
}

/// A file held whole (read without a copy, as tantivy's own directories do), or one whose
/// reads are recorded (at build, to find its pieces).
#[derive(Debug)]
struct HeldFile {
    bytes: OwnedBytes,
    /// The ranges read, when recording.
    seen: Option<Mutex<Vec<Range<usize>>>>,
}

impl HasLen for HeldFile {
    fn len(&self) -> usize {
        self.bytes.len()
    }
}

impl FileHandle for HeldFile {
    fn read_bytes(&self, range: Range<usize>) -> io::Result<OwnedBytes> {
        if range.start > range.end || range.end > self.bytes.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bytes {range:?} lie past a text file's {}",
                    self.bytes.len()
                ),
            ));
        }
        if let Some(seen) = &self.seen {
            seen.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(range.clone());
        }
        Ok(self.bytes.slice(range))
    }
}

/// A read-only tantivy directory over a generation's files (`meta.json` and the segment
/// files), each held or read by range.
#[derive(Clone, Debug, Default)]
pub(super) struct GenDirectory {
    files: Arc<HashMap<PathBuf, Arc<dyn FileHandle>>>,
    /// The cold files, by name.
    cold: Arc<HashMap<String, Arc<ColdFile>>>,
}

fn read_only(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("a generation's text file '{}' is read-only", path.display()),
    )
}

impl Directory for GenDirectory {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        self.files
            .get(path)
            .cloned()
            .ok_or_else(|| OpenReadError::FileDoesNotExist(path.to_path_buf()))
    }

    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        Err(DeleteError::IoError {
            io_error: Arc::new(read_only(path)),
            filepath: path.to_path_buf(),
        })
    }

    fn exists(&self, path: &Path) -> Result<bool, OpenReadError> {
        Ok(self.files.contains_key(path))
    }

    fn open_write(&self, path: &Path) -> Result<WritePtr, OpenWriteError> {
        Err(OpenWriteError::IoError {
            io_error: Arc::new(read_only(path)),
            filepath: path.to_path_buf(),
        })
    }

    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        let handle = self.get_file_handle(path)?;
        handle
            .read_bytes(0..handle.len())
            .map(|b| b.as_slice().to_vec())
            .map_err(|e| OpenReadError::IoError {
                io_error: Arc::new(e),
                filepath: path.to_path_buf(),
            })
    }

    fn atomic_write(&self, path: &Path, _data: &[u8]) -> io::Result<()> {
        Err(read_only(path))
    }

    fn sync_directory(&self) -> io::Result<()> {
        Ok(())
    }

    /// Nothing writes a generation's files: a lock (a reader's, while it loads the segment
    /// list) excludes nobody.
    fn acquire_lock(
        &self,
        _lock: &tantivy::directory::Lock,
    ) -> Result<tantivy::directory::DirectoryLock, tantivy::directory::error::LockError> {
        Ok(tantivy::directory::DirectoryLock::from(Box::new(())))
    }

    fn watch(&self, _cb: WatchCallback) -> tantivy::Result<WatchHandle> {
        Ok(WatchHandle::empty())
    }
}

impl GenDirectory {
    /// The directory of `files`; cold ones read through `read` (which must be given if any
    /// file is cold). Malformed pieces are a `Data`-worthy internal error the caller names.
    pub(super) fn open(
        files: Vec<(String, TextFile)>,
        read: Option<Arc<dyn ColdRead>>,
    ) -> Result<Self> {
        let mut map: HashMap<PathBuf, Arc<dyn FileHandle>> = HashMap::new();
        let mut cold = HashMap::new();
        for (name, file) in files {
            let handle: Arc<dyn FileHandle> = match file {
                // One copy, at open: reads then slice it.
                TextFile::Hot(bytes) => Arc::new(HeldFile {
                    bytes: OwnedBytes::new(bytes.to_vec()),
                    seen: None,
                }),
                TextFile::Cold { at, len, pieces } => {
                    let pieces = decode_pieces(&pieces, len).ok_or_else(|| {
                        Error::internal(format!(
                            "the held pieces of text file '{name}' are malformed"
                        ))
                    })?;
                    let read = read.clone().ok_or_else(|| {
                        Error::internal(format!("text file '{name}' is cold but nothing reads it"))
                    })?;
                    let file = Arc::new(ColdFile {
                        id: NEXT_FILE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                        name: name.clone(),
                        at,
                        len,
                        pieces,
                        read,
                    });
                    cold.insert(name.clone(), file.clone());
                    file
                }
            };
            map.insert(PathBuf::from(name), handle);
        }
        Ok(GenDirectory {
            files: Arc::new(map),
            cold: Arc::new(cold),
        })
    }

    /// Whether file `name` is read by range.
    pub(super) fn is_cold(&self, name: &Path) -> bool {
        name.to_str().is_some_and(|n| self.cold.contains_key(n))
    }
}

/// For each cold file of a finished index's `files` (see [`is_cold_file`]), its pieces: what
/// tantivy reads of it when it opens the index's segments and every text field's inverted
/// index, recorded by opening them over the files. Returns `(name, pieces section)`.
pub(crate) fn hot_pieces(
    ts: &TextSchema,
    files: &[(String, OwnedBytes)],
) -> Result<Vec<(String, Vec<u8>)>> {
    let mut map: HashMap<PathBuf, Arc<dyn FileHandle>> = HashMap::new();
    let mut recorders = Vec::new();
    for (name, bytes) in files {
        let file = Arc::new(HeldFile {
            bytes: bytes.clone(),
            seen: is_cold_file(name).then(Mutex::default),
        });
        if is_cold_file(name) {
            recorders.push((name.clone(), file.clone()));
        }
        map.insert(PathBuf::from(name), file);
    }
    let dir = GenDirectory {
        files: Arc::new(map),
        cold: Arc::default(),
    };
    {
        let index = tantivy::Index::open(dir)?;
        let searcher = open_reader(&index)?.searcher();
        for seg in searcher.segment_readers() {
            for f in ts.fields() {
                seg.inverted_index(*f)?;
            }
        }
    }
    let mut out = Vec::new();
    for (name, file) in recorders {
        let mut seen = std::mem::take(
            &mut *file
                .seen
                .as_ref()
                .expect("recording")
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        seen.retain(|r| !r.is_empty());
        seen.sort_by_key(|r| (r.start, r.end));
        let mut merged: Vec<Range<usize>> = Vec::new();
        for r in seen {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        out.push((name, encode_pieces(file.bytes.as_slice(), &merged)));
    }
    Ok(out)
}

/// Where each text field's postings body and positions start in the object, per segment of a
/// generation whose postings and positions are cold: what [`ColdText::term`] adds to a term's
/// ranges.
#[derive(Debug, Default)]
pub(crate) struct ColdText {
    /// Which opening of a generation's index this is: the files a term's ranges name are the
    /// files of one opening (see [`ColdText::id`]).
    id: u64,
    /// Per segment (in the searcher's order), per field.
    segments: Vec<HashMap<Field, FieldAt>>,
}

/// Ranges of cold files a search of one term reads, in segment order.
pub(crate) type TermRanges = Arc<[(Arc<ColdFile>, Range<u64>)]>;

/// What a search of one term reads of a generation's index: its document frequency (every
/// segment's, summed), and the ranges of its postings and of its positions in the cold part
/// (empty when they are held).
#[derive(Debug, Clone)]
pub(crate) struct TermAt {
    pub(crate) doc_freq: u64,
    pub(crate) postings: TermRanges,
    pub(crate) positions: TermRanges,
}

/// Where a field's postings body and positions start in their cold files.
#[derive(Debug, Clone, Default)]
struct FieldAt {
    postings: Option<(Arc<ColdFile>, u64)>,
    positions: Option<(Arc<ColdFile>, u64)>,
}

/// A handle over a cold file that notes where the last read started: tantivy does not expose
/// where a slice of a composite file lies, so an empty read of the slice tells it.
#[derive(Debug)]
struct Probe {
    file: Arc<dyn FileHandle>,
    last: Mutex<usize>,
}

impl HasLen for Probe {
    fn len(&self) -> usize {
        self.file.len()
    }
}

impl FileHandle for Probe {
    fn read_bytes(&self, range: Range<usize>) -> io::Result<OwnedBytes> {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = range.start;
        self.file.read_bytes(range)
    }
}

/// Where each of `fields` starts in composite file `file` (from its footer, held).
fn field_offsets(file: Arc<dyn FileHandle>, fields: &[Field]) -> Result<HashMap<Field, u64>> {
    let probe = Arc::new(Probe {
        file,
        last: Mutex::new(0),
    });
    let (_, body) = tantivy::directory::footer::Footer::extract_footer(FileSlice::new(
        probe.clone() as Arc<dyn FileHandle>,
    ))
    .map_err(tantivy::TantivyError::from)?;
    let composite = CompositeFile::open(&body).map_err(tantivy::TantivyError::from)?;
    let mut out = HashMap::new();
    for f in fields {
        if let Some(slice) = composite.open_read(*f) {
            slice
                .read_bytes_slice(0..0)
                .map_err(tantivy::TantivyError::from)?;
            out.insert(
                *f,
                *probe.last.lock().unwrap_or_else(|e| e.into_inner()) as u64,
            );
        }
    }
    Ok(out)
}

impl ColdText {
    /// The field offsets of every segment of `searcher` over `dir`; `None` when no file of
    /// `dir` is cold.
    pub(super) fn locate(
        ts: &TextSchema,
        searcher: &tantivy::Searcher,
        dir: &GenDirectory,
    ) -> Result<Option<ColdText>> {
        if dir.cold.is_empty() {
            return Ok(None);
        }
        let mut segments = Vec::new();
        for seg in searcher.segment_readers() {
            let id = seg.segment_id().uuid_string();
            let mut fields: HashMap<Field, FieldAt> = HashMap::new();
            for (ext, postings) in [("idx", true), ("pos", false)] {
                let name = format!("{id}.{ext}");
                let Some(file) = dir.cold.get(&name) else {
                    continue;
                };
                for (f, off) in field_offsets(file.clone(), ts.fields())? {
                    let e = fields.entry(f).or_default();
                    // A field's postings start with its token total (8 bytes), which ranges
                    // of terms do not count.
                    if postings {
                        e.postings = Some((file.clone(), off + 8));
                    } else {
                        e.positions = Some((file.clone(), off));
                    }
                }
            }
            segments.push(fields);
        }
        Ok(Some(ColdText {
            id: NEXT_FILE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            segments,
        }))
    }

    /// A number no other opening of a generation's index has (a generation pushed out of a
    /// handle's cache and opened again gets new files): ranges found in one opening name files
    /// that searches of another do not read.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// What a search of `term` reads in every segment of `searcher` (the one
    /// [`ColdText::locate`] saw): one term-dictionary lookup a segment.
    pub(crate) fn term(&self, searcher: &tantivy::Searcher, term: &Term) -> Result<TermAt> {
        let (mut doc_freq, mut postings, mut positions) = (0u64, Vec::new(), Vec::new());
        let want = |out: &mut Vec<_>, at: &Option<(Arc<ColdFile>, u64)>, r: &Range<usize>| {
            if let Some((file, base)) = at {
                let range = base + r.start as u64..base + r.end as u64;
                if !range.is_empty() {
                    out.push((file.clone(), range));
                }
            }
        };
        for (seg, fields) in searcher.segment_readers().iter().zip(&self.segments) {
            let inv = seg.inverted_index(term.field())?;
            let Some(ti) = inv
                .get_term_info(term)
                .map_err(tantivy::TantivyError::from)?
            else {
                continue;
            };
            doc_freq += u64::from(ti.doc_freq);
            if let Some(at) = fields.get(&term.field()) {
                want(&mut postings, &at.postings, &ti.postings_range);
                want(&mut positions, &at.positions, &ti.positions_range);
            }
        }
        Ok(TermAt {
            doc_freq,
            postings: postings.into(),
            positions: positions.into(),
        })
    }
}

/// The pieces of `ranges` (a term's postings, and its positions when a search reads them)
/// that the postings cache does not hold. `kept_at` is the count of entries that had left
/// the cache when all of them were last found kept: while it is still the count, they still
/// are, and nothing is looked up. It is set when all are found kept now.
pub(crate) fn missing(ranges: &[&TermRanges], kept_at: &mut Option<u64>) -> Vec<ColdPiece> {
    // Counted before looking: an entry leaving meanwhile makes the next query look (see
    // `PostingsCache::left` for the moment a leave is counted).
    let Some(left) = ranges
        .iter()
        .find_map(|r| r.first())
        .map(|(f, _)| f.read.postings().left())
    else {
        return Vec::new();
    };
    if *kept_at == Some(left) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (file, range) in ranges.iter().flat_map(|r| r.iter()) {
        if !file.is_kept(range) {
            out.push(ColdPiece {
                file: file.clone(),
                range: range.clone(),
            });
        }
    }
    if out.is_empty() {
        *kept_at = Some(left);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_postings_cache_counts_the_entries_that_leave_it() {
        // 1 MiB: one shard, entries of at most 256 KiB.
        let cache = PostingsCache::new(1 << 20);
        let entry = || OwnedBytes::new(vec![0u8; 250 << 10]);
        for i in 0..4 {
            cache.insert((1, i, i + 1), entry());
        }
        assert_eq!(cache.left(), 0, "four entries fit");
        assert!((0..4).all(|i| cache.contains(&(1, i, i + 1))));
        // A fifth pushes one out: what was found kept may no longer be.
        cache.insert((1, 4, 5), entry());
        assert!(cache.left() >= 1);
        let kept = (0..5).filter(|i| cache.contains(&(1, *i, i + 1))).count() as u64;
        assert_eq!(kept + cache.left(), 5);
        // An entry put again under its key replaces the one kept: counted as leaving too.
        let left = cache.left();
        cache.insert((1, 4, 5), entry());
        assert!(cache.left() > left);
        assert!(cache.contains(&(1, 4, 5)));
    }

    #[test]
    fn pieces_round_trip_and_malformed_ones_are_refused() {
        let file: Vec<u8> = (0..200u8).collect();
        let ranges = [3..10, 50..51, 190..200];
        let enc = Bytes::from(encode_pieces(&file, &ranges));
        let dec = decode_pieces(&enc, 200).expect("pieces");
        assert_eq!(dec.len(), 3);
        for ((r, b), want) in dec.iter().zip(&ranges) {
            assert_eq!(r.start as usize..r.end as usize, *want);
            assert_eq!(b.as_slice(), &file[want.clone()]);
        }
        // Every shorter prefix, a file too short for them, a count far beyond the section.
        for n in 0..enc.len() {
            assert!(decode_pieces(&enc.slice(..n), 200).is_none(), "{n} bytes");
        }
        assert!(decode_pieces(&enc, 199).is_none());
        let mut huge = enc.to_vec();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_pieces(&Bytes::from(huge), 200).is_none());
        // Overlapping or empty pieces.
        let bad = Bytes::from(encode_pieces(&file, &[3..10, 9..12]));
        assert!(decode_pieces(&bad, 200).is_none());
        let empty = Bytes::from(encode_pieces(&file, std::slice::from_ref(&(3..3))));
        assert!(decode_pieces(&empty, 200).is_none());
    }

    #[test]
    fn the_postings_cache_keeps_nothing_at_zero_and_no_entry_above_a_shard_quarter() {
        let none = PostingsCache::new(0);
        none.insert((1, 0, 4), OwnedBytes::new(vec![1u8; 4]));
        assert!(!none.contains(&(1, 0, 4)) && none.bytes() == 0);
        let some = PostingsCache::new(4 << 20);
        some.insert((1, 0, 4), OwnedBytes::new(vec![1u8; 4]));
        assert_eq!(some.get(&(1, 0, 4)).map(|b| b.len()), Some(4));
        some.insert((1, 4, 2 << 20), OwnedBytes::new(vec![0u8; 2 << 20]));
        assert!(
            !some.contains(&(1, 4, 2 << 20)),
            "bigger than a quarter of a shard"
        );
        assert!(some.bytes() < 1 << 20);
    }
}
