//! The cold part of a version-3 generation object, read by byte range through the handle's
//! block cache: each block is checked against the CRC32 the hot part lists for it before it is
//! cached or used.

use crate::format::bundle::{check_block, BLOCK_BYTES};
use crate::storage::blocks::{BlockCache, Verify};
use crate::text::PostingsCache;
use crate::{Error, Result};
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::ops::Range;
use std::sync::Arc;

/// Where a generation's cold bytes are and how to read them.
#[derive(Clone)]
pub(crate) struct ColdObject {
    store: Arc<dyn ObjectStore>,
    /// How block keys name the store (the index location).
    store_name: String,
    path: Path,
    /// The object's size in bytes.
    len: u64,
    cache: BlockCache,
    verify: Verify,
    runtime: tokio::runtime::Handle,
    concurrency: usize,
    postings: PostingsCache,
}

impl std::fmt::Debug for ColdObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColdObject")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// The block cache of a handle and the store it reads from, shared by its generations.
#[derive(Clone, Debug)]
pub(crate) struct ColdStore {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) store_name: String,
    pub(crate) cache: BlockCache,
    /// The runtime whose I/O serves reads made from query threads ([`ColdObject::block_on`]).
    pub(crate) runtime: tokio::runtime::Handle,
    /// Reads issued at once ([`crate::Settings::io_concurrency`]).
    pub(crate) concurrency: usize,
    /// Postings and positions searches read ([`crate::Settings::postings_cache_bytes`]).
    pub(crate) postings: PostingsCache,
}

impl ColdObject {
    /// The cold part (its first `cold_len` bytes) of the object at `path` (`len` bytes), whose
    /// blocks have the CRC32s `crcs` ([`BLOCK_BYTES`] bytes each, the last one shorter).
    pub(crate) fn new(
        at: &ColdStore,
        path: Path,
        len: u64,
        cold_len: u64,
        crcs: Arc<[u32]>,
    ) -> ColdObject {
        let object = path.to_string();
        let verify: Verify = Arc::new(move |b: u64, bytes: &Bytes| {
            check_block(&crcs, cold_len, b, bytes)
                .map_err(|m| Error::data(&object, format!("generation {m}")))
        });
        ColdObject {
            store: at.store.clone(),
            store_name: at.store_name.clone(),
            path,
            len,
            cache: at.cache.clone(),
            verify,
            runtime: at.runtime.clone(),
            concurrency: at.concurrency.max(1),
            postings: at.postings.clone(),
        }
    }

    /// Bytes `range` of the object, every block checked.
    pub(crate) async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        self.cache
            .read(
                &self.store,
                &self.store_name,
                &self.path,
                self.len,
                range,
                &self.verify,
            )
            .await
    }

    /// Bytes of each of `ranges` of the object, each block they touch checked and read once.
    pub(crate) async fn read_ranges(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.cache
            .read_ranges(
                &self.store,
                &self.store_name,
                &self.path,
                self.len,
                ranges,
                &self.verify,
            )
            .await
    }

    /// Bytes of each of `ranges` of the object when every block they touch is in memory
    /// (see [`BlockCache::read_ranges_in_memory`]); `None`, with nothing read, when not.
    pub(crate) fn read_ranges_in_memory(&self, ranges: &[Range<u64>]) -> Option<Vec<Bytes>> {
        self.cache
            .read_ranges_in_memory(&self.store_name, &self.path, self.len, ranges)
    }

    /// Bytes `range` of the object read straight from the store, not through the cache (a
    /// whole section read once, such as the vectors a generation keeps in memory): one ranged
    /// GET of the blocks it touches, each checked.
    pub(crate) async fn read_direct(&self, range: Range<u64>) -> Result<Bytes> {
        let block = BLOCK_BYTES;
        let first = range.start / block;
        let last = range.end.div_ceil(block).max(first);
        let span = first * block..(last * block).min(self.len);
        let bytes = self
            .store
            .get_range(&self.path, span.clone())
            .await
            .map_err(|e| Error::store(&self.path, e))?;
        if bytes.len() as u64 != span.end - span.start {
            return Err(Error::data(
                &self.path,
                format!(
                    "generation: {} bytes where {} were expected",
                    bytes.len(),
                    span.end - span.start
                ),
            ));
        }
        for (i, b) in bytes.chunks(block as usize).enumerate() {
            (self.verify)(first + i as u64, &bytes.slice_ref(b))?;
        }
        let from = (range.start - span.start) as usize;
        Ok(bytes.slice(from..from + (range.end - range.start) as usize))
    }

    /// Run `read` (reads of this object) to completion from a thread that is not one of the
    /// async runtime's (a query or blocking thread), the runtime serving its I/O.
    pub(crate) fn block_on<T>(&self, read: impl std::future::Future<Output = T>) -> T {
        self.runtime.block_on(read)
    }

    /// Put the blocks of `object` (this whole object, just written by this handle) covering
    /// `range` in the memory tier of the block cache.
    pub(crate) fn seed(&self, object: &Bytes, range: Range<u64>) {
        self.cache
            .seed(&self.store_name, &self.path, object, range, &self.verify);
    }

    /// The block cache's memory budget.
    pub(crate) fn cache_budget(&self) -> u64 {
        self.cache.memory_budget()
    }

    /// How many reads of whole ranges a reader issues at once.
    pub(crate) fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// The object's path (for messages).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl crate::text::ColdRead for ColdObject {
    fn read_blocking(&self, range: Range<u64>) -> Result<Bytes> {
        self.block_on(self.read(range))
    }

    fn postings(&self) -> &PostingsCache {
        &self.postings
    }
}
