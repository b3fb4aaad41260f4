//! The manifest codec: one version of the index's description (JSON) between a header with
//! the format version and a CRC32. Layout: `docs/format.md`, "Manifests".

use super::{GenerationMeta, ObjectKind};
use crate::schema::IndexSchema;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 4] = match ObjectKind::Manifest.magic() {
    Some(m) => m,
    None => panic!("manifests have a magic number"),
};

/// One version of the index's description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    /// This manifest's version (its object name).
    pub(crate) version: u64,
    /// Epoch of the writer that wrote it; a writer claims epoch + 1 when it opens.
    pub(crate) epoch: u64,
    /// The index schema, fixed at creation.
    pub(crate) schema: IndexSchema,
    /// Flushed generations, oldest first. A compaction replaces a run of adjacent entries by one
    /// merged generation in a single new version.
    pub(crate) generations: Vec<GenerationMeta>,
    /// First WAL id not covered by the generations: recovery replays from here.
    pub(crate) wal_replay_from: u64,
    /// Highest sequence number stored in the generations.
    pub(crate) last_seq: u64,
    /// Id the next generation gets.
    pub(crate) next_generation_id: u64,
}

impl Manifest {
    /// Encode the object bytes.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let body =
            serde_json::to_vec(self).map_err(|e| Error::internal(format!("manifest: {e}")))?;
        let mut out = Vec::with_capacity(body.len() + 20);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&ObjectKind::Manifest.written().to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    /// Decode and verify; any defect is an error of kind `Data` naming `object`.
    pub(crate) fn decode(bytes: &[u8], object: &dyn std::fmt::Display) -> Result<Manifest> {
        let bad = |m: String| Error::data(object, format!("manifest {m}"));
        if bytes.len() < 20 || &bytes[..4] != MAGIC {
            return Err(bad(format!(
                "is truncated or not a manifest ({} bytes)",
                bytes.len()
            )));
        }
        let body_end = bytes.len() - 4;
        let crc = u32::from_le_bytes(bytes[body_end..].try_into().expect("4"));
        let version = u32::from_le_bytes(bytes[4..8].try_into().expect("4"));
        let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8"));
        if len != (body_end - 16) as u64 {
            return Err(bad(format!(
                "is truncated: header says {len} body bytes, found {}",
                body_end - 16
            )));
        }
        if crc32fast::hash(&bytes[..body_end]) != crc {
            return Err(bad("fails its CRC32 check".into()));
        }
        ObjectKind::Manifest.check_version(u64::from(version), object)?;
        serde_json::from_slice(&bytes[16..body_end]).map_err(|e| bad(format!("body: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trip_and_corruption() {
        let m = Manifest {
            version: 7,
            epoch: 2,
            schema: IndexSchema::from_json(r#"{"primary_key": "id"}"#).unwrap(),
            generations: vec![],
            wal_replay_from: 4,
            last_seq: 99,
            next_generation_id: 3,
        };
        let b = m.encode().unwrap();
        assert_eq!(Manifest::decode(&b, &"m").unwrap(), m);
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(Manifest::decode(&c, &"m").is_err(), "flip at {i}");
        }
        assert!(Manifest::decode(&b[..b.len() - 1], &"m").is_err());
    }
}
