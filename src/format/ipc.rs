//! Helpers shared by the codecs: Arrow IPC streams and a little-endian field reader.

use crate::{Error, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use std::fmt::Display;

/// Encode batches as an Arrow IPC stream.
pub(crate) fn ipc_encode(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    {
        let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut out, schema)?;
        for b in batches {
            w.write(b)?;
        }
        w.finish()?;
    }
    Ok(out)
}

/// Decode an Arrow IPC stream and check it has the expected schema. Every length in the
/// stream is checked against the input before anything is allocated by it (see
/// [`IpcReader`]); any defect is an error of kind `Data` naming `object`.
pub(crate) fn ipc_decode(
    bytes: bytes::Bytes,
    expect: &SchemaRef,
    object: &dyn Display,
) -> Result<Vec<RecordBatch>> {
    let reader = IpcReader {
        source: Box::new(SliceSource { bytes, pos: 0 }),
        schema: None,
        dictionaries: Default::default(),
        expect: Some(expect.clone()),
        object: object.to_string(),
        trusted_store: true,
        done: false,
    };
    let mut batches = Vec::new();
    for b in reader {
        // Re-attach the canonical schema (drops any metadata differences).
        batches.push(RecordBatch::try_new(expect.clone(), b?.columns().to_vec())?);
    }
    Ok(batches)
}

/// Where an [`IpcReader`] takes its bytes from.
trait Source: Send {
    /// Bytes left.
    fn remaining(&self) -> u64;
    /// The next `n` bytes (`n <= remaining()`, checked by the caller).
    fn take(&mut self, n: usize) -> std::io::Result<arrow::buffer::Buffer>;
}

struct SliceSource {
    bytes: bytes::Bytes,
    pos: usize,
}

impl Source for SliceSource {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: usize) -> std::io::Result<arrow::buffer::Buffer> {
        let b = self.bytes.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(b.into())
    }
}

struct ReadSource<R> {
    reader: R,
    remaining: u64,
}

impl<R: std::io::Read + Send> Source for ReadSource<R> {
    fn remaining(&self) -> u64 {
        self.remaining
    }

    fn take(&mut self, n: usize) -> std::io::Result<arrow::buffer::Buffer> {
        let mut v = vec![0u8; n];
        self.reader.read_exact(&mut v)?;
        self.remaining -= n as u64;
        Ok(v.into())
    }
}

/// Reads the record batches of an Arrow IPC stream, or of an Arrow IPC file (`.arrow`, Feather
/// v2), from untrusted bytes. Unlike arrow's readers, which allocate the metadata and body
/// lengths a message announces before reading them, it checks every length against the bytes
/// actually left (and every buffer of a batch against its body) first, refuses compressed
/// bodies, and turns a panic of the decoder into an error: a crafted file costs at most its
/// own size in memory and never aborts the process.
pub struct IpcReader {
    source: Box<dyn Source>,
    schema: Option<SchemaRef>,
    dictionaries: std::collections::HashMap<i64, arrow::array::ArrayRef>,
    expect: Option<SchemaRef>,
    object: String,
    /// Errors are `Data` (a stored object) rather than `Invalid` (an input file).
    trusted_store: bool,
    done: bool,
}

impl std::fmt::Debug for IpcReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcReader({})", self.object)
    }
}

/// The magic number opening (and closing) an Arrow IPC file.
const FILE_MAGIC: &[u8; 6] = b"ARROW1";

impl IpcReader {
    /// Read the file at `path` (an IPC stream or an IPC file: the footer of a file is not
    /// needed, its messages are read in order). Errors are of kind `Invalid` and name the file.
    pub fn open(path: &std::path::Path) -> Result<IpcReader> {
        let name = path.display().to_string();
        let bad = |e: &dyn Display| Error::invalid(format!("cannot read '{name}': {e}"));
        let mut file = std::fs::File::open(path).map_err(|e| bad(&e))?;
        let mut remaining = file.metadata().map_err(|e| bad(&e))?.len();
        let mut head = [0u8; 8];
        use std::io::{Read, Seek};
        let n = file.read(&mut head).map_err(|e| bad(&e))?;
        if n >= 6 && &head[..6] == FILE_MAGIC {
            // "ARROW1" and two bytes of padding, then the messages as in a stream.
            file.seek(std::io::SeekFrom::Start(8))
                .map_err(|e| bad(&e))?;
            remaining = remaining.saturating_sub(8);
        } else {
            file.seek(std::io::SeekFrom::Start(0))
                .map_err(|e| bad(&e))?;
        }
        Ok(IpcReader {
            source: Box::new(ReadSource {
                reader: std::io::BufReader::new(file),
                remaining,
            }),
            schema: None,
            dictionaries: Default::default(),
            expect: None,
            object: name,
            trusted_store: false,
            done: false,
        })
    }

    /// The schema, once the first message has been read.
    pub fn schema(&self) -> Option<SchemaRef> {
        self.schema.clone()
    }

    fn error(&self, detail: impl Display) -> Error {
        if self.trusted_store {
            Error::data(&self.object, format!("bad Arrow IPC stream: {detail}"))
        } else {
            Error::invalid(format!(
                "cannot read '{}': bad Arrow IPC data: {detail}",
                self.object
            ))
        }
    }

    fn take(&mut self, n: usize) -> Result<arrow::buffer::Buffer> {
        if n as u64 > self.source.remaining() {
            return Err(self.error(format!(
                "{n} bytes announced, {} left",
                self.source.remaining()
            )));
        }
        self.source.take(n).map_err(|e| self.error(e))
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(
            b.as_slice().try_into().expect("4 bytes"),
        ))
    }

    /// The next message (its metadata and body), checked, or `None` at the end of the stream.
    fn next_message(&mut self) -> Result<Option<(arrow::buffer::Buffer, arrow::buffer::Buffer)>> {
        if self.source.remaining() == 0 {
            return Ok(None);
        }
        let mut len = self.u32()?;
        if len == 0xFFFF_FFFF {
            len = self.u32()?;
        }
        if len == 0 {
            return Ok(None);
        }
        let meta = self.take(len as usize)?;
        let message = arrow::ipc::root_as_message(meta.as_slice())
            .map_err(|e| self.error(format!("bad message metadata: {e}")))?;
        let body = message.bodyLength();
        let left = self.source.remaining();
        if body < 0 || body as u64 > left {
            return Err(self.error(format!("body of {body} bytes announced, {left} left")));
        }
        use arrow::ipc::MessageHeader;
        let batch = match message.header_type() {
            MessageHeader::Schema => None,
            MessageHeader::RecordBatch => Some(message.header_as_record_batch()),
            MessageHeader::DictionaryBatch => {
                Some(message.header_as_dictionary_batch().and_then(|d| d.data()))
            }
            other => return Err(self.error(format!("unexpected message {other:?}"))),
        };
        if let Some(batch) = batch {
            let batch = batch.ok_or_else(|| self.error("message without its batch"))?;
            if batch.compression().is_some() {
                return Err(self.error("compressed bodies are not supported"));
            }
            if batch.length() < 0 {
                return Err(self.error("negative row count"));
            }
            for b in batch.buffers().iter().flatten() {
                let end = b.offset().checked_add(b.length());
                if b.offset() < 0 || b.length() < 0 || end.is_none_or(|e| e > body) {
                    return Err(self.error(format!(
                        "buffer at {} of {} bytes outside a body of {body} bytes",
                        b.offset(),
                        b.length()
                    )));
                }
            }
            for n in batch.nodes().iter().flatten() {
                if n.length() < 0 || n.null_count() < 0 || n.null_count() > n.length() {
                    return Err(self.error("bad array length or null count"));
                }
            }
        }
        let body = self.take(body as usize)?;
        Ok(Some((meta, body)))
    }

    /// Run arrow's decoding of one checked message, turning a panic into an error.
    fn guarded<T>(
        &self,
        f: impl FnOnce() -> std::result::Result<T, arrow::error::ArrowError>,
    ) -> Result<T> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.error(e)),
            Err(_) => Err(self.error("the decoder failed on malformed data")),
        }
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        use arrow::ipc::MessageHeader;
        while let Some((meta, body)) = self.next_message()? {
            let message = arrow::ipc::root_as_message(meta.as_slice())
                .map_err(|e| self.error(format!("bad message metadata: {e}")))?;
            let version = message.version();
            match message.header_type() {
                MessageHeader::Schema => {
                    if self.schema.is_some() {
                        return Err(self.error("a second schema message"));
                    }
                    let fb = message
                        .header_as_schema()
                        .ok_or_else(|| self.error("schema message without its schema"))?;
                    let got = self.guarded(|| Ok(arrow::ipc::convert::fb_to_schema(fb)))?;
                    if let Some(expect) = &self.expect {
                        if got.fields() != expect.fields() {
                            return Err(self.error(format!(
                                "rows have schema {got:?}, the index schema is {expect:?}"
                            )));
                        }
                    }
                    self.schema = Some(std::sync::Arc::new(got));
                }
                MessageHeader::DictionaryBatch => {
                    let schema = self
                        .schema
                        .clone()
                        .ok_or_else(|| self.error("a dictionary before the schema"))?;
                    let d = message
                        .header_as_dictionary_batch()
                        .ok_or_else(|| self.error("dictionary message without its batch"))?;
                    let mut dictionaries = std::mem::take(&mut self.dictionaries);
                    let r = self.guarded(|| {
                        arrow::ipc::reader::read_dictionary(
                            &body,
                            d,
                            &schema,
                            &mut dictionaries,
                            &version,
                        )
                    });
                    self.dictionaries = dictionaries;
                    r?;
                }
                MessageHeader::RecordBatch => {
                    let schema = self
                        .schema
                        .clone()
                        .ok_or_else(|| self.error("a record batch before the schema"))?;
                    let b = message
                        .header_as_record_batch()
                        .ok_or_else(|| self.error("record batch message without its batch"))?;
                    let batch = self.guarded(|| {
                        arrow::ipc::reader::read_record_batch(
                            &body,
                            b,
                            schema,
                            &self.dictionaries,
                            None,
                            &version,
                        )
                    })?;
                    return Ok(Some(batch));
                }
                other => return Err(self.error(format!("unexpected message {other:?}"))),
            }
        }
        Ok(None)
    }
}

impl Iterator for IpcReader {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_batch() {
            Ok(Some(b)) => Some(Ok(b)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// A cursor over a byte slice reading little-endian fields.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    fn sample() -> (SchemaRef, Vec<u8>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["a", "bb", "ccc"])),
                Arc::new(Int64Array::from(vec![Some(1), None, Some(3)])),
            ],
        )
        .unwrap();
        let bytes = ipc_encode(&schema, &[batch]).unwrap();
        (schema, bytes)
    }

    /// Offsets of the messages of a stream: (metadata start, metadata length, body length).
    fn messages(bytes: &[u8]) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at + 8 <= bytes.len() {
            let len = i32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            if len == 0 {
                break;
            }
            let meta = &bytes[at + 8..at + 8 + len];
            let body = arrow::ipc::root_as_message(meta).unwrap().bodyLength() as usize;
            out.push((at + 8, len, body));
            at += 8 + len + body;
        }
        out
    }

    #[test]
    fn lengths_beyond_the_input_are_data_errors_not_allocations() {
        let (schema, bytes) = sample();
        assert_eq!(
            ipc_decode(bytes.clone().into(), &schema, &"x")
                .unwrap()
                .len(),
            1
        );
        let msgs = messages(&bytes);
        assert_eq!(msgs.len(), 2, "a schema and a batch");
        // A metadata length far beyond the input.
        let mut b = bytes.clone();
        b[4..8].copy_from_slice(&0x7fff_fff0i32.to_le_bytes());
        let e = ipc_decode(b.into(), &schema, &"x").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
        // A record batch whose body length says 2^50 bytes.
        let (start, len, body) = msgs[1];
        let mut b = bytes.clone();
        let pat = (body as i64).to_le_bytes();
        let at = b[start..start + len]
            .windows(8)
            .position(|w| w == pat)
            .expect("body length in the metadata");
        b[start + at..start + at + 8].copy_from_slice(&(1i64 << 50).to_le_bytes());
        let e = ipc_decode(b.into(), &schema, &"x").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
    }
}
