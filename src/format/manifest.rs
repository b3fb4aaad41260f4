//! The manifest codec: one version of the index's description (JSON) between a header with
//! the format version and a CRC32. Layout: `docs/format.md`, "Manifests".

use super::{GenerationMeta, ObjectKind};
use crate::schema::IndexSchema;
use crate::Result;
use serde::{Deserialize, Serialize};

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
        super::encode_json(ObjectKind::Manifest, self)
    }

    /// Decode and verify; any defect is an error of kind `Data` naming `object`.
    pub(crate) fn decode(bytes: &[u8], object: &dyn std::fmt::Display) -> Result<Manifest> {
        super::decode_json(ObjectKind::Manifest, bytes, object)
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
