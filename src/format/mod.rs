//! Persisted formats: the generation bundle container, the WAL and manifest codecs, the Arrow
//! IPC helpers they share, and the one registry of format versions.
//!
//! Every persisted object carries a magic number, a format version and CRC32s. For every kind
//! of object, [`ObjectKind::written`] is the version this build writes and
//! [`ObjectKind::oldest_read`] the oldest it still reads; `tests/fixtures/` holds an object of
//! every version the build claims to read, and `tests/format_compat.rs` opens them. The byte
//! layouts are documented once, in `docs/format.md`.
//!
//! This layer only turns bytes into checked values and back: it does no I/O (object names live
//! in `storage::paths`, reads and conditional writes in `wal`, `manifest` and `generation`).

pub(crate) mod bundle;
pub(crate) mod ipc;
pub(crate) mod manifest;
pub(crate) mod wal;

use crate::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt::Display;

/// The bytes of an object of `kind` holding `value` as JSON: its magic number, the version
/// this build writes (u32), the body's length (u64), the body, and a CRC32 of all of it.
pub(crate) fn encode_json<T: Serialize>(kind: ObjectKind, value: &T) -> Result<Vec<u8>> {
    let magic = kind
        .magic()
        .ok_or_else(|| Error::internal(format!("a {} has no magic number", kind.name())))?;
    let body =
        serde_json::to_vec(value).map_err(|e| Error::internal(format!("{}: {e}", kind.name())))?;
    let mut out = Vec::with_capacity(body.len() + 20);
    out.extend_from_slice(magic);
    out.extend_from_slice(&kind.written().to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// The value an object of `kind` holds ([`encode_json`]), checked: any defect (length, magic
/// number, CRC, version, body) is an error of kind `Data` naming `object`.
pub(crate) fn decode_json<T: DeserializeOwned>(
    kind: ObjectKind,
    bytes: &[u8],
    object: &dyn Display,
) -> Result<T> {
    let name = kind.name();
    let bad = |m: String| Error::data(object, format!("{name} {m}"));
    if bytes.len() < 20 || kind.magic().is_none_or(|m| &bytes[..4] != m) {
        return Err(bad(format!(
            "is truncated or not a {name} ({} bytes)",
            bytes.len()
        )));
    }
    let body_end = bytes.len() - 4;
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let crc = word(body_end);
    let version = word(4);
    let len = u64::from(word(8)) | (u64::from(word(12)) << 32);
    if len != (body_end - 16) as u64 {
        return Err(bad(format!(
            "is truncated: header says {len} body bytes, found {}",
            body_end - 16
        )));
    }
    if crc32fast::hash(&bytes[..body_end]) != crc {
        return Err(bad("fails its CRC32 check".into()));
    }
    kind.check_version(u64::from(version), object)?;
    serde_json::from_slice(&bytes[16..body_end]).map_err(|e| bad(format!("body: {e}")))
}

/// A kind of persisted object (or of versioned section inside one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ObjectKind {
    /// `generations/{id}-{epoch}.gen`: one bundle per flushed generation.
    Generation,
    /// The `vector/graph` section of a generation bundle (versioned on its own).
    GraphSection,
    /// `wal/{id}.wal`: one group commit or epoch fence.
    Wal,
    /// `manifest/{version}.manifest`: one version of the index's description.
    Manifest,
    /// `shards`: the descriptor of a sharded index (its shard count, key hash and schema).
    Shards,
}

impl ObjectKind {
    /// Every kind.
    #[cfg(test)]
    pub(crate) const ALL: [ObjectKind; 5] = [
        ObjectKind::Generation,
        ObjectKind::GraphSection,
        ObjectKind::Wal,
        ObjectKind::Manifest,
        ObjectKind::Shards,
    ];

    /// `(written, oldest read)`: the registry.
    const fn versions(self) -> (u32, u32) {
        match self {
            // 3: a cold part read by range (rows as Parquet, vectors as raw f32) checked by
            // block CRCs, and a hot part fetched whole; 2: the vector graph as flat adjacency
            // arrays (`vector/graph`); 1: hnsw_rs dump files in `hnsw/graph`, `hnsw/data`,
            // `hnsw/meta`.
            ObjectKind::Generation => (4, 1),
            ObjectKind::GraphSection => (1, 1),
            ObjectKind::Wal => (1, 1),
            ObjectKind::Manifest => (1, 1),
            ObjectKind::Shards => (1, 1),
        }
    }

    /// The version this build writes.
    pub(crate) const fn written(self) -> u32 {
        self.versions().0
    }

    /// The oldest version this build reads.
    pub(crate) const fn oldest_read(self) -> u32 {
        self.versions().1
    }

    /// How messages name the kind.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            ObjectKind::Generation => "generation",
            ObjectKind::GraphSection => "vector graph section",
            ObjectKind::Wal => "WAL object",
            ObjectKind::Manifest => "manifest",
            ObjectKind::Shards => "shard descriptor",
        }
    }

    /// The magic number opening an object of this kind (`None`: a section has none).
    pub(crate) const fn magic(self) -> Option<&'static [u8; 4]> {
        match self {
            ObjectKind::Generation => Some(b"LSMG"),
            ObjectKind::Wal => Some(b"LSMW"),
            ObjectKind::Manifest => Some(b"LSMM"),
            ObjectKind::Shards => Some(b"LSMS"),
            ObjectKind::GraphSection => None,
        }
    }

    /// `Ok(version)` when this build reads `version`; otherwise a `Data` error naming `object`.
    pub(crate) fn check_version(self, version: u64, object: &dyn Display) -> Result<u32> {
        if (u64::from(self.oldest_read())..=u64::from(self.written())).contains(&version) {
            Ok(version as u32)
        } else {
            Err(Error::unsupported_version(
                object,
                self.name(),
                version,
                u64::from(self.oldest_read()),
                u64::from(self.written()),
            ))
        }
    }
}

/// What the manifest records about a generation (also kept in the bundle's directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationMeta {
    /// Generation id (unique; a flush's is larger than every earlier one's, and a compaction's
    /// merged generation gets a new id but keeps its run's place in the manifest's list,
    /// which alone orders generations by age).
    pub id: u64,
    /// Epoch of the writer that wrote it (part of the object name).
    pub epoch: u64,
    /// Rows stored (live and tombstones).
    pub rows: u64,
    /// Tombstones among them.
    pub tombstones: u64,
    /// Size of the object in bytes.
    pub bytes: u64,
    /// Smallest sequence number stored.
    pub min_seq: u64,
    /// Largest sequence number stored.
    pub max_seq: u64,
    /// Flushes whose rows it holds: 1 for a flushed generation, the sum of its inputs' for a
    /// compaction's. Vector search walks a generation's graph with a candidate list this many
    /// times as long, so merging generations does not lower recall. Absent (1) in objects and
    /// manifests written before it existed.
    #[serde(default = "one")]
    pub flushes: u64,
    /// Where the object's hot part starts (format version 3): a reader opening the
    /// generation fetches bytes `[hot_offset, bytes)` in one request. Absent before version 3,
    /// whose objects are read whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot_offset: Option<u64>,
}

fn one() -> u64 {
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_reads_what_it_writes() {
        for k in ObjectKind::ALL {
            assert!(
                k.oldest_read() >= 1 && k.oldest_read() <= k.written(),
                "{k:?}"
            );
            assert!(k.check_version(k.written().into(), &"x").is_ok());
            let e = k
                .check_version(u64::from(k.written()) + 1, &"obj")
                .unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Data);
            assert!(e.message().contains("obj"), "{e}");
            assert!(k.check_version(0, &"x").is_err());
        }
    }
}
