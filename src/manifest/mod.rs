//! Manifests: immutable, versioned descriptions of an index. Publishing version v+1 with a
//! conditional PUT is the visibility point of every flush (and, later, of every compaction).
//!
//! Object `manifest/{version:020}.manifest` (little-endian):
//!
//! ```text
//! "LSMM"          4-byte magic
//! version  u32    format version (1)
//! body_len u64
//! body            JSON: Manifest (version, epoch, schema, generations, wal_replay_from, ...)
//! crc32    u32    CRC32 of all preceding bytes
//! ```
//!
//! Finding the newest version costs one GET and one short LIST: the `LATEST` object holds a
//! recent version number (written after each publish, never ahead of the truth), and a LIST that
//! starts after it (`list_with_offset`; S3's `StartAfter`) returns only the few newer versions.
//! Old versions are pruned beyond `Settings::manifest_retention`, so no LIST grows with history.

use crate::generation::GenerationMeta;
use crate::schema::IndexSchema;
use crate::storage::paths::{parse_manifest, Paths};
use crate::{Error, Result};
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

/// Magic bytes opening a manifest.
pub const MANIFEST_MAGIC: &[u8; 4] = b"LSMM";
/// Current manifest format version.
pub const MANIFEST_FORMAT_VERSION: u32 = 1;

/// One version of the index's description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// This manifest's version (its object name).
    pub version: u64,
    /// Epoch of the writer that wrote it; a writer claims epoch + 1 when it opens.
    pub epoch: u64,
    /// The index schema, fixed at creation.
    pub schema: IndexSchema,
    /// Flushed generations, oldest first. A compaction replaces a run of adjacent entries by one
    /// merged generation in a single new version.
    pub generations: Vec<GenerationMeta>,
    /// First WAL id not covered by the generations: recovery replays from here.
    pub wal_replay_from: u64,
    /// Highest sequence number stored in the generations.
    pub last_seq: u64,
    /// Id the next generation gets.
    pub next_generation_id: u64,
}

impl Manifest {
    /// Encode the object bytes.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let body =
            serde_json::to_vec(self).map_err(|e| Error::internal(format!("manifest: {e}")))?;
        let mut out = Vec::with_capacity(body.len() + 20);
        out.extend_from_slice(MANIFEST_MAGIC);
        out.extend_from_slice(&MANIFEST_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    /// Decode and verify; any defect is an error of kind `Data` naming `object`.
    pub fn decode(bytes: &[u8], object: &dyn std::fmt::Display) -> Result<Manifest> {
        let bad = |m: String| Error::data(object, format!("manifest {m}"));
        if bytes.len() < 20 || &bytes[..4] != MANIFEST_MAGIC {
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
        if version != MANIFEST_FORMAT_VERSION {
            return Err(bad(format!(
                "has format version {version}; this build reads version {MANIFEST_FORMAT_VERSION}"
            )));
        }
        serde_json::from_slice(&bytes[16..body_end]).map_err(|e| bad(format!("body: {e}")))
    }
}

/// Outcome of a conditional manifest write.
#[derive(Debug)]
pub enum WriteOutcome {
    /// The version was created.
    Written,
    /// Another writer created this version first.
    Conflict,
}

/// Reads and writes manifests of one index.
#[derive(Debug, Clone)]
pub struct ManifestStore {
    store: std::sync::Arc<dyn ObjectStore>,
    paths: Paths,
}

impl ManifestStore {
    /// Manifests of the index at `paths` in `store`.
    pub fn new(store: std::sync::Arc<dyn ObjectStore>, paths: Paths) -> Self {
        ManifestStore { store, paths }
    }

    /// Read one version.
    pub async fn read(&self, version: u64) -> Result<Manifest> {
        let p = self.paths.manifest(version);
        let bytes = crate::storage::read_object(self.store.as_ref(), &p).await?;
        let m = Manifest::decode(&bytes, &p)?;
        if m.version != version {
            return Err(Error::data(
                &p,
                format!("manifest says it is version {}", m.version),
            ));
        }
        Ok(m)
    }

    /// The newest version, if the index exists.
    pub async fn latest_version(&self) -> Result<Option<u64>> {
        let hint_path = self.paths.latest_hint();
        let hint = match self.store.get(&hint_path).await {
            Ok(r) => {
                let b = r.bytes().await.map_err(|e| Error::store(&hint_path, e))?;
                std::str::from_utf8(&b)
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
            }
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(Error::store(&hint_path, e)),
        };
        let dir = self.paths.manifest_dir();
        let listing: Vec<_> = match hint {
            Some(h) => self
                .store
                .list_with_offset(Some(&dir), &self.paths.manifest(h))
                .try_collect()
                .await
                .map_err(|e| Error::store(&dir, e))?,
            None => self
                .store
                .list(Some(&dir))
                .try_collect()
                .await
                .map_err(|e| Error::store(&dir, e))?,
        };
        let newest = listing
            .iter()
            .filter_map(|m| parse_manifest(&m.location))
            .max();
        Ok(match (hint, newest) {
            (Some(h), Some(n)) => Some(h.max(n)),
            (h, n) => h.or(n),
        })
    }

    /// The newest manifest, if the index exists. Retries if the version it found was pruned
    /// between the LIST and the GET by a writer that moved on.
    pub async fn load_latest(&self) -> Result<Option<Manifest>> {
        let mut attempt = 0;
        loop {
            let Some(v) = self.latest_version().await? else {
                return Ok(None);
            };
            match self.read(v).await {
                Ok(m) => return Ok(Some(m)),
                Err(e) if attempt < 3 && e.message().contains("not found") => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Create `m.version` if nobody has.
    pub async fn write(&self, m: &Manifest) -> Result<WriteOutcome> {
        let p = self.paths.manifest(m.version);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&p, PutPayload::from(m.encode()?), opts)
            .await
        {
            Ok(_) => Ok(WriteOutcome::Written),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(WriteOutcome::Conflict),
            Err(e) => Err(Error::store(&p, e)),
        }
    }

    /// Record `version` in the `LATEST` hint (best effort: a stale hint only costs a longer LIST).
    pub async fn publish_hint(&self, version: u64) {
        let p = self.paths.latest_hint();
        if let Err(e) = self.store.put(&p, version.to_string().into()).await {
            tracing::warn!("could not update {p}: {e}");
        }
    }

    /// Delete versions older than `latest - retention` (best effort).
    pub async fn prune(&self, latest: u64, retention: u64, concurrency: usize) {
        let keep_from = latest.saturating_sub(retention);
        let dir = self.paths.manifest_dir();
        let old: Vec<_> = match self.store.list(Some(&dir)).try_collect::<Vec<_>>().await {
            Ok(l) => l
                .into_iter()
                .filter(|m| parse_manifest(&m.location).is_some_and(|v| v < keep_from))
                .map(|m| m.location)
                .collect(),
            Err(e) => {
                tracing::warn!("could not list {dir}: {e}");
                return;
            }
        };
        delete_all(&self.store, old, concurrency).await;
    }
}

/// Delete objects concurrently, ignoring ones already gone (best effort, logged).
pub(crate) async fn delete_all(
    store: &std::sync::Arc<dyn ObjectStore>,
    paths: Vec<object_store::path::Path>,
    concurrency: usize,
) {
    use futures::StreamExt;
    futures::stream::iter(paths)
        .map(|p| async move {
            match store.delete(&p).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => tracing::warn!("could not delete {p}: {e}"),
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect::<Vec<_>>()
        .await;
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

    #[tokio::test]
    async fn latest_version_is_found_from_a_stale_hint_or_none() {
        use object_store::path::Path;
        let store: std::sync::Arc<dyn ObjectStore> =
            std::sync::Arc::new(object_store::memory::InMemory::new());
        let ms = ManifestStore::new(store.clone(), Paths::new(Path::from("i")));
        assert_eq!(ms.latest_version().await.unwrap(), None);
        let mut m = Manifest {
            version: 0,
            epoch: 0,
            schema: IndexSchema::from_json(r#"{"primary_key": "id"}"#).unwrap(),
            generations: vec![],
            wal_replay_from: 1,
            last_seq: 0,
            next_generation_id: 1,
        };
        for v in 1..=30 {
            m.version = v;
            assert!(matches!(ms.write(&m).await.unwrap(), WriteOutcome::Written));
        }
        // A second create of an existing version loses.
        assert!(matches!(
            ms.write(&m).await.unwrap(),
            WriteOutcome::Conflict
        ));
        assert_eq!(
            ms.latest_version().await.unwrap(),
            Some(30),
            "no hint: full list"
        );
        ms.publish_hint(5).await;
        assert_eq!(ms.latest_version().await.unwrap(), Some(30), "stale hint");
        ms.publish_hint(30).await;
        ms.prune(30, 3, 4).await;
        assert_eq!(ms.load_latest().await.unwrap().unwrap().version, 30);
        use futures::TryStreamExt;
        let left: Vec<_> = store
            .list(Some(&Path::from("i/manifest")))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(left.len(), 4, "versions 27..=30 are kept");
    }
}
