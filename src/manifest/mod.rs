//! Manifest versions on the object store: publishing version v+1 with a conditional PUT is the
//! visibility point of every flush (and, later, of every compaction).
//!
//! Finding the newest version costs one GET and one short LIST: the `LATEST` object holds a
//! recent version number (written after each publish, never ahead of the truth), and a LIST that
//! starts after it (`list_with_offset`; S3's `StartAfter`) returns only the few newer versions.
//! Old versions are pruned beyond `Settings::manifest_retention`, so no LIST grows with history.
//!
//! `LATEST` also carries that version's manifest, so that a reader ([`ManifestStore::load_latest`])
//! finds the newest manifest in one round: it GETs `LATEST` while it LISTs the (pruned)
//! manifest folder, and reads a manifest object only when the LIST shows a version newer than
//! the hint's.

use crate::format::manifest::Manifest;
use crate::storage::paths::{parse_manifest, Paths};
use crate::{Error, Result};
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

/// Outcome of a conditional manifest write.
#[derive(Debug)]
pub(crate) enum WriteOutcome {
    /// The version was created.
    Written,
    /// Another writer created this version first.
    Conflict,
}

/// Reads and writes manifests of one index.
#[derive(Debug, Clone)]
pub(crate) struct ManifestStore {
    store: std::sync::Arc<dyn ObjectStore>,
    paths: Paths,
}

impl ManifestStore {
    /// Manifests of the index at `paths` in `store`.
    pub(crate) fn new(store: std::sync::Arc<dyn ObjectStore>, paths: Paths) -> Self {
        ManifestStore { store, paths }
    }

    /// Read one version.
    pub(crate) async fn read(&self, version: u64) -> Result<Manifest> {
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
    pub(crate) async fn latest_version(&self) -> Result<Option<u64>> {
        let (hint, _) = self.hint().await?;
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

    /// What `LATEST` says: a version, and that version's manifest when it carries a whole one
    /// (a hint an older build wrote carries none, and a damaged one is ignored: the manifest
    /// object is read instead).
    async fn hint(&self) -> Result<(Option<u64>, Option<Manifest>)> {
        let hint_path = self.paths.latest_hint();
        let bytes = match self.store.get(&hint_path).await {
            Ok(r) => r.bytes().await.map_err(|e| Error::store(&hint_path, e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok((None, None)),
            Err(e) => return Err(Error::store(&hint_path, e)),
        };
        let line = bytes
            .iter()
            .position(|b| *b == b'\n')
            .unwrap_or(bytes.len());
        let version = std::str::from_utf8(&bytes[..line])
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        let manifest = match (version, bytes.get(line + 1..)) {
            (Some(v), Some(body)) if !body.is_empty() => Manifest::decode(body, &hint_path)
                .ok()
                .filter(|m| m.version == v),
            _ => None,
        };
        Ok((version, manifest))
    }

    /// The newest manifest, if the index exists, read from its object (a writer's view: the
    /// object it builds on). Retries if the version it found was pruned between the LIST and
    /// the GET by a writer that moved on.
    pub(crate) async fn load_latest(&self) -> Result<Option<Manifest>> {
        self.load(false).await
    }

    /// [`ManifestStore::load_latest`] for a reader: in one round when `LATEST` is current and
    /// carries its manifest (checked by its CRC), which is then taken instead of the object.
    pub(crate) async fn load_latest_for_reading(&self) -> Result<Option<Manifest>> {
        self.load(true).await
    }

    /// The newest version from `LATEST`'s GET beside a LIST of the manifest folder, and its
    /// manifest (`LATEST`'s copy when `carried` allows it, else its object).
    async fn load(&self, carried: bool) -> Result<Option<Manifest>> {
        let mut attempt = 0;
        loop {
            let dir = self.paths.manifest_dir();
            let listing = async {
                self.store
                    .list(Some(&dir))
                    .try_collect::<Vec<_>>()
                    .await
                    .map_err(|e| Error::store(&dir, e))
            };
            let ((hint, copy), listed) = futures::try_join!(self.hint(), listing)?;
            let newest = listed
                .iter()
                .filter_map(|m| parse_manifest(&m.location))
                .max();
            let Some(v) = hint.max(newest) else {
                return Ok(None);
            };
            if let Some(m) = copy.filter(|m| carried && m.version == v) {
                return Ok(Some(m));
            }
            match self.read(v).await {
                Ok(m) => return Ok(Some(m)),
                Err(e) if attempt < 3 && e.is_not_found() => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Create `m.version` if nobody has.
    pub(crate) async fn write(&self, m: &Manifest) -> Result<WriteOutcome> {
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

    /// Record `m` in the `LATEST` hint: its version (a line of ASCII digits) and its manifest
    /// object's bytes (best effort: a stale hint only costs a longer LIST and a GET).
    pub(crate) async fn publish_hint(&self, m: &Manifest) {
        let p = self.paths.latest_hint();
        let mut body = format!("{}\n", m.version).into_bytes();
        match m.encode() {
            Ok(b) => body.extend_from_slice(&b),
            Err(e) => tracing::warn!("{p} carries no manifest: {e}"),
        }
        if let Err(e) = self.store.put(&p, body.into()).await {
            tracing::warn!("could not update {p}: {e}");
        }
    }

    /// Delete versions older than `latest - retention` (best effort).
    pub(crate) async fn prune(&self, latest: u64, retention: u64, concurrency: usize) {
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
    use crate::schema::IndexSchema;

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
        m.version = 5;
        ms.publish_hint(&m).await;
        assert_eq!(ms.latest_version().await.unwrap(), Some(30), "stale hint");
        assert_eq!(ms.load_latest().await.unwrap().unwrap().version, 30);
        m.version = 30;
        ms.publish_hint(&m).await;
        ms.prune(30, 3, 4).await;
        assert_eq!(ms.load_latest().await.unwrap().unwrap().version, 30);
        // A hint an older build wrote (the version alone), or a damaged one, is still a hint.
        for hint in [&b"30"[..], b"30\ngarbage", b"29\n"] {
            store
                .put(&Path::from("i/LATEST"), hint.to_vec().into())
                .await
                .unwrap();
            assert_eq!(ms.latest_version().await.unwrap(), Some(30));
            assert_eq!(ms.load_latest().await.unwrap().unwrap().version, 30);
        }
        use futures::TryStreamExt;
        let left: Vec<_> = store
            .list(Some(&Path::from("i/manifest")))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(left.len(), 4, "versions 27..=30 are kept");
    }
}
