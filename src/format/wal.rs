//! The WAL object codec: one group commit (Arrow IPC rows with their sequence range and the
//! writer's epoch) or one epoch fence per object, with a CRC32. Layout: `docs/format.md`,
//! "WAL objects".

use super::ipc::{ipc_decode, ipc_encode, Reader};
use super::ObjectKind;
use crate::{Error, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use std::fmt::Display;

const WAL_MAGIC: &[u8; 4] = match ObjectKind::Wal.magic() {
    Some(m) => m,
    None => panic!("WAL objects have a magic number"),
};
const HEADER_LEN: usize = 48;

/// The size of a fence object (a header and a CRC, no payload); a rows object is larger.
pub(crate) const FENCE_LEN: u64 = HEADER_LEN as u64 + 4;

/// What a WAL object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WalKind {
    /// Rows of one group commit.
    Rows,
    /// A marker written by a new writer to claim the next id: any older writer's next WAL write
    /// collides with it and fails as fenced.
    Fence,
}

/// A decoded WAL object.
#[derive(Debug, Clone)]
pub(crate) struct WalEntry {
    /// Rows or fence.
    pub(crate) kind: WalKind,
    /// Epoch of the writer that wrote it.
    pub(crate) epoch: u64,
    /// First sequence number of the rows.
    pub(crate) first_seq: u64,
    /// Last sequence number of the rows (inclusive).
    pub(crate) last_seq: u64,
    /// The stored rows (one batch; empty for fences).
    pub(crate) rows: Option<RecordBatch>,
}

/// Encode a WAL object.
pub(crate) fn encode(entry: &WalEntry, schema: &SchemaRef) -> Result<Vec<u8>> {
    let (payload, rows) = match &entry.rows {
        Some(b) => (
            ipc_encode(schema, std::slice::from_ref(b))?,
            b.num_rows() as u64,
        ),
        None => (Vec::new(), 0),
    };
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + 4);
    out.extend_from_slice(WAL_MAGIC);
    out.extend_from_slice(&(ObjectKind::Wal.written() as u16).to_le_bytes());
    out.push(match entry.kind {
        WalKind::Rows => 0,
        WalKind::Fence => 1,
    });
    out.push(0);
    out.extend_from_slice(&entry.epoch.to_le_bytes());
    out.extend_from_slice(&entry.first_seq.to_le_bytes());
    out.extend_from_slice(&entry.last_seq.to_le_bytes());
    out.extend_from_slice(&rows.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Check only the header fields and the CRC (cheap; used to tell a fence from our own object).
pub(crate) fn decode_header(bytes: &[u8], object: &dyn Display) -> Result<WalEntry> {
    decode_inner(bytes, None, object)
}

/// Decode and verify a WAL object. Any defect (short, bad magic, CRC mismatch, unknown version,
/// bad rows) is an error of kind `Data` naming `object`.
pub(crate) fn decode(
    bytes: bytes::Bytes,
    schema: &SchemaRef,
    object: &dyn Display,
) -> Result<WalEntry> {
    decode_inner(&bytes.clone(), Some((bytes, schema)), object)
}

fn decode_inner(
    buf: &[u8],
    rows: Option<(bytes::Bytes, &SchemaRef)>,
    object: &dyn Display,
) -> Result<WalEntry> {
    let bad = |m: &str| Error::data(object, format!("WAL object {m}"));
    // Short, or failing the CRC: what an interrupted write leaves (recovery may drop it when
    // it is the last object). Anything else about a whole object is corruption.
    let torn = |m: &str| Error::torn(object, format!("WAL object {m}"));
    // Magic and version first (a PUT is atomic, so these bytes are whole even in a damaged
    // object): a later format may move the length and the CRC, and must never pass for torn.
    if buf.len() < 6 {
        return Err(torn(&format!("is truncated: {} bytes", buf.len())));
    }
    if &buf[0..4] != WAL_MAGIC {
        return Err(bad("has a bad magic number"));
    }
    ObjectKind::Wal.check_version(u64::from(u16::from_le_bytes([buf[4], buf[5]])), object)?;
    if buf.len() < HEADER_LEN + 4 {
        return Err(torn(&format!(
            "is truncated: {} bytes, shorter than the {}-byte header and CRC",
            buf.len(),
            HEADER_LEN + 4
        )));
    }
    let body = &buf[..buf.len() - 4];
    let stored_crc = u32::from_le_bytes(buf[buf.len() - 4..].try_into().expect("4 bytes"));
    let mut r = Reader::new(body);
    r.take(4);
    let version = u16::from_le_bytes(r.take(2).expect("header").try_into().expect("2"));
    let kind = r.u8().expect("header");
    r.u8();
    let epoch = r.u64().expect("header");
    let first_seq = r.u64().expect("header");
    let last_seq = r.u64().expect("header");
    let count = r.u64().expect("header");
    let plen = r.u64().expect("header");
    if plen != (body.len() - HEADER_LEN) as u64 {
        return Err(torn(&format!(
            "is truncated or padded: header says {plen} payload bytes, found {}",
            body.len() - HEADER_LEN
        )));
    }
    if crc32fast::hash(body) != stored_crc {
        return Err(torn("fails its CRC32 check"));
    }
    debug_assert!(ObjectKind::Wal
        .check_version(u64::from(version), object)
        .is_ok());
    let kind = match kind {
        0 => WalKind::Rows,
        1 => WalKind::Fence,
        k => return Err(bad(&format!("has unknown kind {k}"))),
    };
    let rows = match (kind, rows) {
        (WalKind::Rows, Some((bytes, schema))) => {
            let payload = bytes.slice(HEADER_LEN..HEADER_LEN + plen as usize);
            let batches = ipc_decode(payload, schema, object)?;
            let batch = arrow::compute::concat_batches(schema, &batches)?;
            if batch.num_rows() as u64 != count {
                return Err(bad(&format!(
                    "holds {} rows, its header says {count}",
                    batch.num_rows()
                )));
            }
            Some(batch)
        }
        _ => None,
    };
    Ok(WalEntry {
        kind,
        epoch,
        first_seq,
        last_seq,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::IndexSchema;
    use arrow::array::StringArray;
    use std::sync::Arc;

    fn schema() -> IndexSchema {
        IndexSchema::from_json(r#"{"primary_key": "id", "text": ["body"]}"#).unwrap()
    }

    #[test]
    fn round_trip_and_every_corruption_is_detected() {
        let s = schema();
        let user = RecordBatch::try_new(
            s.arrow_schema(),
            vec![
                Arc::new(StringArray::from(vec!["a", "b"])),
                Arc::new(StringArray::from(vec![Some("x"), None])),
            ],
        )
        .unwrap();
        let stored = s.to_stored(&user, 10).unwrap();
        let e = WalEntry {
            kind: WalKind::Rows,
            epoch: 3,
            first_seq: 10,
            last_seq: 11,
            rows: Some(stored.clone()),
        };
        let bytes = encode(&e, &s.stored_schema()).unwrap();
        let d = decode(bytes.clone().into(), &s.stored_schema(), &"w").unwrap();
        assert_eq!(d.rows.unwrap(), stored);
        assert_eq!((d.epoch, d.first_seq, d.last_seq), (3, 10, 11));
        for i in (0..bytes.len()).step_by(7) {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            let err = decode(b.into(), &s.stored_schema(), &"w").unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Data, "flip at {i}");
        }
        for len in [0, 10, bytes.len() - 1] {
            let err = decode(bytes[..len].to_vec().into(), &s.stored_schema(), &"w").unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Data);
        }
    }
}
