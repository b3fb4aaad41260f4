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
use serde::{Deserialize, Serialize};
use std::fmt::Display;

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
}

impl ObjectKind {
    /// Every kind.
    #[cfg(test)]
    pub(crate) const ALL: [ObjectKind; 4] = [
        ObjectKind::Generation,
        ObjectKind::GraphSection,
        ObjectKind::Wal,
        ObjectKind::Manifest,
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
        }
    }

    /// The magic number opening an object of this kind (`None`: a section has none).
    pub(crate) const fn magic(self) -> Option<&'static [u8; 4]> {
        match self {
            ObjectKind::Generation => Some(b"LSMG"),
            ObjectKind::Wal => Some(b"LSMW"),
            ObjectKind::Manifest => Some(b"LSMM"),
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
