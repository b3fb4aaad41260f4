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
//! prefix or range query's terms) is made when tantivy asks ([`ColdRead`]).

use super::schema::TextSchema;
use super::{open_reader, IndexFiles};
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
}

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
fn decode_pieces(bytes: &Bytes, len: u64) -> Option<Vec<(Range<u64>, Bytes)>> {
    let count = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let head = count.checked_mul(12)?.checked_add(4)?;
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
        out.push((offset..end, bytes.slice_ref(piece)));
        at += n as usize;
    }
    (at == bytes.len()).then_some(out)
}

/// A postings or positions file in the cold part: its pieces held, the rest read through
/// `read` when tantivy asks.
#[derive(Debug)]
struct ColdFile {
    name: String,
    /// Where the file starts in the object, and its length.
    at: u64,
    len: u64,
    pieces: Vec<(Range<u64>, Bytes)>,
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
        let i = self.pieces.partition_point(|(p, _)| p.start <= r.start);
        if let Some((p, bytes)) = i.checked_sub(1).map(|i| &self.pieces[i]) {
            if r.end <= p.end {
                let from = (r.start - p.start) as usize;
                return Ok(OwnedBytes::new(
                    bytes[from..from + (r.end - r.start) as usize].to_vec(),
                ));
            }
        }
        let bytes = self
            .read
            .read_blocking(self.at + r.start..self.at + r.end)
            .map_err(io::Error::other)?;
        Ok(OwnedBytes::new(bytes.to_vec()))
    }
}

/// A file held whole, or one whose reads are recorded (at build, to find its pieces).
#[derive(Debug)]
struct HeldFile {
    bytes: Bytes,
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
        let bytes = self.bytes.get(range.clone()).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bytes {range:?} lie past a text file's {}",
                    self.bytes.len()
                ),
            )
        })?;
        if let Some(seen) = &self.seen {
            seen.lock().unwrap_or_else(|e| e.into_inner()).push(range);
        }
        Ok(OwnedBytes::new(bytes.to_vec()))
    }
}

/// A read-only tantivy directory over a generation's files (`meta.json` and the segment
/// files), each held or read by range.
#[derive(Clone, Debug, Default)]
pub(super) struct GenDirectory {
    files: Arc<HashMap<PathBuf, Arc<dyn FileHandle>>>,
    /// The cold files and where each starts in the object.
    cold: Arc<HashMap<String, u64>>,
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
                TextFile::Hot(bytes) => Arc::new(HeldFile { bytes, seen: None }),
                TextFile::Cold { at, len, pieces } => {
                    cold.insert(name.clone(), at);
                    let pieces = decode_pieces(&pieces, len).ok_or_else(|| {
                        Error::internal(format!(
                            "the held pieces of text file '{name}' are malformed"
                        ))
                    })?;
                    let read = read.clone().ok_or_else(|| {
                        Error::internal(format!("text file '{name}' is cold but nothing reads it"))
                    })?;
                    Arc::new(ColdFile {
                        name: name.clone(),
                        at,
                        len,
                        pieces,
                        read,
                    })
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
pub(crate) fn hot_pieces(ts: &TextSchema, files: &IndexFiles) -> Result<Vec<(String, Vec<u8>)>> {
    let mut map: HashMap<PathBuf, Arc<dyn FileHandle>> = HashMap::new();
    let mut recorders = Vec::new();
    for (name, bytes) in files {
        let file = Arc::new(HeldFile {
            bytes: Bytes::copy_from_slice(bytes),
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
        out.push((name, encode_pieces(&file.bytes, &merged)));
    }
    Ok(out)
}

/// Where each text field's postings body and positions start in the object, per segment of a
/// generation whose postings and positions are cold: what [`ColdText::ranges`] adds to a
/// term's ranges.
#[derive(Debug, Default)]
pub(crate) struct ColdText {
    /// Per segment (in the searcher's order), per field.
    segments: Vec<HashMap<Field, FieldAt>>,
}

#[derive(Debug, Clone, Copy)]
struct FieldAt {
    postings: Option<u64>,
    positions: Option<u64>,
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
        let at = &dir.cold;
        if at.is_empty() {
            return Ok(None);
        }
        let mut segments = Vec::new();
        for seg in searcher.segment_readers() {
            let id = seg.segment_id().uuid_string();
            let mut fields: HashMap<Field, FieldAt> = HashMap::new();
            for (ext, postings) in [("idx", true), ("pos", false)] {
                let name = format!("{id}.{ext}");
                let Some(base) = at.get(&name) else { continue };
                let file = dir.get_file_handle(Path::new(&name))?;
                for (f, off) in field_offsets(file, ts.fields())? {
                    let e = fields.entry(f).or_insert(FieldAt {
                        postings: None,
                        positions: None,
                    });
                    // A field's postings start with its token total (8 bytes), which ranges
                    // of terms do not count.
                    if postings {
                        e.postings = Some(base + off + 8);
                    } else {
                        e.positions = Some(base + off);
                    }
                }
            }
            segments.push(fields);
        }
        Ok(Some(ColdText { segments }))
    }

    /// The byte ranges of the object holding `terms`' postings (and their positions where
    /// the flag asks), in every segment of `searcher` (the one [`ColdText::locate`] saw).
    pub(crate) fn ranges(
        &self,
        searcher: &tantivy::Searcher,
        terms: &[(Term, bool)],
    ) -> Result<Vec<Range<u64>>> {
        let mut out = Vec::new();
        for (seg, fields) in searcher.segment_readers().iter().zip(&self.segments) {
            for (term, positions) in terms {
                let Some(at) = fields.get(&term.field()) else {
                    continue;
                };
                let inv = seg.inverted_index(term.field())?;
                let Some(ti) = inv
                    .get_term_info(term)
                    .map_err(tantivy::TantivyError::from)?
                else {
                    continue;
                };
                if let Some(p) = at.postings {
                    let r = &ti.postings_range;
                    out.push(p + r.start as u64..p + r.end as u64);
                }
                if let (true, Some(p)) = (*positions, at.positions) {
                    let r = &ti.positions_range;
                    if !r.is_empty() {
                        out.push(p + r.start as u64..p + r.end as u64);
                    }
                }
            }
        }
        Ok(out)
    }
}
