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

/// Decode an Arrow IPC stream and check it has the expected schema.
pub(crate) fn ipc_decode(
    bytes: bytes::Bytes,
    expect: &SchemaRef,
    object: &dyn Display,
) -> Result<Vec<RecordBatch>> {
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
        .map_err(|e| Error::data(object, format!("bad Arrow IPC stream: {e}")))?;
    if reader.schema().fields() != expect.fields() {
        return Err(Error::data(
            object,
            format!(
                "rows have schema {:?}, the index schema is {:?}",
                reader.schema(),
                expect
            ),
        ));
    }
    let mut batches = Vec::new();
    for b in reader {
        let b = b.map_err(|e| Error::data(object, format!("bad Arrow IPC batch: {e}")))?;
        // Re-attach the canonical schema (drops any metadata differences).
        batches.push(RecordBatch::try_new(expect.clone(), b.columns().to_vec())?);
    }
    Ok(batches)
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
