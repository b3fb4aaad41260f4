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
        assert_eq!(ipc_decode(bytes.clone().into(), &schema, &"x").unwrap().len(), 1);
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
