//! Object storage: where an index lives, object names, and store wrappers.
//!
//! A location is a local directory (the default: embedded, no server), `memory://` (tests and
//! demos, one process) or `s3://bucket/prefix` (endpoint and credentials from the standard AWS
//! environment variables: `AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, `AWS_ALLOW_HTTP`).

pub(crate) mod blocks;
pub(crate) mod latency;
pub(crate) mod paths;

pub use latency::{LatencyConfig, LatencyStore, StoreCounters};

use crate::{Error, Result};
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// The whole object at `path`; an error names the object.
pub(crate) async fn read_object(store: &dyn ObjectStore, path: &Path) -> Result<Bytes> {
    object_store::ObjectStoreExt::get(store, path)
        .await
        .map_err(|e| Error::store(path, e))?
        .bytes()
        .await
        .map_err(|e| Error::store(path, e))
}

/// Check that `store` honours conditional creates (`PutMode::Create`: S3's `If-None-Match: *`),
/// on which fencing rests, by creating the object at `probe` twice: the second create must
/// fail. A store that overwrites instead is refused (`Invalid`: the location is unusable as
/// given, retrying will not help). The probe is deleted.
pub(crate) async fn check_conditional_create(store: &dyn ObjectStore, probe: &Path) -> Result<()> {
    use object_store::{PutMode, PutOptions};
    let create = || PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    let first = store
        .put_opts(probe, PutPayload::from_static(b"probe"), create())
        .await;
    let second = match first {
        Ok(_) => {
            store
                .put_opts(probe, PutPayload::from_static(b"probe"), create())
                .await
        }
        Err(e) => return Err(Error::store(probe, e)),
    };
    let _ = object_store::ObjectStoreExt::delete(store, probe).await;
    match second {
        Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
        Ok(_) => Err(Error::invalid(format!(
            "the object store overwrote '{probe}' on a conditional create (If-None-Match: *): \
             it does not honour conditional creates, on which fencing rests; refusing to write"
        ))),
        Err(e) => Err(Error::store(probe, e)),
    }
}

/// An object store and the root of an index inside it.
#[derive(Debug, Clone)]
pub struct Location {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// The index root inside the store (may be empty).
    pub root: Path,
    /// The location as the user wrote it (for messages).
    pub display: String,
    /// The directory behind a local location, where cut-off PUTs leave staging files that the
    /// store's LIST does not show.
    pub(crate) local_dir: Option<std::path::PathBuf>,
}

impl Location {
    /// Parse `memory://`, `s3://bucket/prefix`, `file:///path` or a plain local path. A local
    /// directory is created if it does not exist.
    pub fn parse(location: &str) -> Result<Location> {
        if location.starts_with("memory://") {
            let root = location.trim_start_matches("memory://").trim_matches('/');
            return Ok(Location {
                store: Arc::new(InMemory::new()),
                root: Path::from(root),
                display: location.to_string(),
                local_dir: None,
            });
        }
        if let Some(rest) = location.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(Error::invalid(format!(
                    "location '{location}': no bucket name after s3://"
                )));
            }
            let store = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| {
                    Error::invalid(format!("location '{location}': {e}")).with_source(e)
                })?;
            return Ok(Location {
                store: Arc::new(store),
                root: Path::from(prefix.trim_matches('/')),
                display: location.to_string(),
                local_dir: None,
            });
        }
        if location.contains("://") && !location.starts_with("file://") {
            return Err(Error::invalid(format!(
                "location '{location}': unsupported scheme (use a local path, file://, memory:// or s3://)"
            )));
        }
        let dir = location.strip_prefix("file://").unwrap_or(location);
        let store = SyncedLocalStore::new(dir)?;
        Ok(Location {
            local_dir: Some(store.dir.clone()),
            store: Arc::new(store),
            root: Path::default(),
            display: location.to_string(),
        })
    }

    /// The same location seen through a [`LatencyStore`] that adds `config`'s latency to every
    /// request and counts them; returns the wrapper too, to read its counters.
    pub fn with_latency(&self, config: latency::LatencyConfig) -> (Location, Arc<LatencyStore>) {
        let wrapped = LatencyStore::new(self.store.clone(), config);
        let loc = Location {
            store: wrapped.clone(),
            root: self.root.clone(),
            display: self.display.clone(),
            local_dir: self.local_dir.clone(),
        };
        (loc, wrapped)
    }

    /// The location `name` inside this one, in the same store (a shard of a sharded index:
    /// `<root>/shard-0`). `name` is one path segment.
    pub fn child(&self, name: &str) -> Result<Location> {
        let part = object_store::path::PathPart::parse(name)
            .ok()
            .filter(|p| !name.is_empty() && p.as_ref() == name)
            .ok_or_else(|| {
                Error::invalid(format!("'{name}' is not one segment of a location's path"))
            })?;
        let root: Path = self.root.parts().chain(std::iter::once(part)).collect();
        Ok(Location {
            store: self.store.clone(),
            root,
            display: format!("{}/{name}", self.display.trim_end_matches('/')),
            local_dir: self.local_dir.clone(),
        })
    }

    /// A location over an existing store (for embedding and tests).
    pub fn from_store(store: Arc<dyn ObjectStore>, root: impl Into<String>) -> Location {
        let root: String = root.into();
        Location {
            display: format!("{store}/{root}"),
            store,
            root: Path::from(root.as_str()),
            local_dir: None,
        }
    }
}

/// The local file system, made durable: after every PUT the file and its directory are fsynced,
/// so a PUT that returned survives a power loss. (`object_store`'s `LocalFileSystem` renames or
/// hard-links a staged file into place but never fsyncs.)
#[derive(Debug)]
pub struct SyncedLocalStore {
    inner: LocalFileSystem,
    dir: std::path::PathBuf,
}

impl SyncedLocalStore {
    /// Open (and create if needed) a local directory.
    pub fn new(dir: &str) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("cannot create directory '{dir}': {e}")))?;
        let dir = std::fs::canonicalize(dir)
            .map_err(|e| Error::io(format!("cannot open directory '{dir}': {e}")))?;
        let inner = LocalFileSystem::new_with_prefix(&dir)
            .map_err(|e| Error::store(dir.display(), e))?
            .with_automatic_cleanup(true);
        Ok(SyncedLocalStore { inner, dir })
    }

    async fn sync(&self, location: &Path) -> object_store::Result<()> {
        let file = self.inner.path_to_filesystem(location)?;
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::File::open(&file)?.sync_all()?;
            if let Some(parent) = file.parent() {
                std::fs::File::open(parent)?.sync_all()?;
            }
            Ok(())
        })
        .await
        .map_err(|e| object_store::Error::Generic {
            store: "SyncedLocalStore",
            source: Box::new(e),
        })?
        .map_err(|e| object_store::Error::Generic {
            store: "SyncedLocalStore",
            source: Box::new(e),
        })
    }
}

impl fmt::Display for SyncedLocalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SyncedLocalStore({})", self.dir.display())
    }
}

#[async_trait]
impl ObjectStore for SyncedLocalStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let r = self.inner.put_opts(location, payload, opts).await?;
        self.sync(location).await?;
        Ok(r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await?;
        self.sync(to).await
    }
}
