//! A cache of immutable objects' bytes in fixed-size blocks, in memory and on local disk, so
//! that a read of a byte range fetches only the blocks it lacks.
//!
//! Objects a generation is made of are created once and never overwritten, so a block is
//! valid for as long as its object exists. A read of `range` in an object of `len` bytes asks
//! the cache for every block the range touches at once: hits cost nothing, misses are fetched
//! concurrently with one ranged GET each, concurrent misses of one block share one GET
//! (foyer's `get_or_fetch`), and every fetched block passes the caller's check (its CRC) before
//! it is cached, so a block is verified once, on arrival. The memory tier holds at most its
//! byte budget; the disk tier (optional) holds at most its own in a directory a restarted
//! process finds again.
//!
//! A block's key names the object by the store's location, its path and its length. A block
//! cached on disk is checked again when it is read back (the object at the same name may be
//! another one after an index was deleted and created again).
//!
//! A handle has one: its version-3 generations read their cold parts (rows, vectors) through
//! it ([`crate::Settings::cache_bytes`], [`crate::Settings::cache_disk_bytes`]).

use crate::{Error, Result};
use bytes::{Bytes, BytesMut};
use foyer::{
    BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder,
    RecoverMode, Spawner,
};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The largest block a [`BlockCache`] takes: foyer writes an entry to disk through buffers of
/// 16 MiB, and random reads want small blocks anyway.
pub(crate) const MAX_BLOCK_BYTES: u64 = 8 << 20;

/// The budgets and block size of a [`BlockCache`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockCacheConfig {
    /// Bytes of blocks held in memory.
    pub(crate) memory_bytes: u64,
    /// Bytes of blocks held on local disk, in `disk_dir` (none without a directory or at 0).
    pub(crate) disk_bytes: u64,
    pub(crate) disk_dir: Option<PathBuf>,
    /// Bytes per block (the last block of an object is shorter).
    pub(crate) block_bytes: u64,
    /// Blocks one read asks for at once (misses become that many concurrent GETs at most).
    pub(crate) concurrency: usize,
}

/// What a [`BlockCache`] served, since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BlockCacheStats {
    /// Blocks asked for.
    pub(crate) blocks: u64,
    /// Blocks fetched from the object store (misses of both tiers).
    pub(crate) fetched: u64,
    /// Bytes fetched from the object store.
    pub(crate) fetched_bytes: u64,
    /// Blocks read back from the disk tier.
    pub(crate) disk_hits: u64,
}

#[derive(Debug, Default)]
struct Counters {
    blocks: AtomicU64,
    fetched: AtomicU64,
    fetched_bytes: AtomicU64,
    disk_hits: AtomicU64,
}

/// A cached block: its bytes, and whether they passed their check in this process (a block
/// read back from the disk tier has not, until a reader checks it: then no reader checks it
/// again while it stays in memory).
pub(crate) struct Block {
    bytes: Bytes,
    checked: std::sync::atomic::AtomicBool,
}

impl foyer::Code for Block {
    // Bytes' own encoding (its length, then its bytes).
    fn encode(&self, writer: &mut impl std::io::Write) -> foyer::Result<()> {
        self.bytes.encode(writer)
    }

    fn decode(reader: &mut impl std::io::Read) -> foyer::Result<Self> {
        Ok(Block {
            bytes: Bytes::decode(reader)?,
            checked: false.into(),
        })
    }

    fn estimated_size(&self) -> usize {
        self.bytes.estimated_size()
    }
}

/// The key of block `b` of an object: the object's name hashed (its store, path and length:
/// see [`BlockCache::read`]) above the block's index. Two objects whose names share a hash
/// would share keys: each block is checked against its object's CRC, so a stranger's block is
/// refused and fetched again.
fn block_key(object: u64, b: u64) -> u128 {
    (u128::from(object) << 64) | u128::from(b)
}

/// The name of an object in block keys: its store, path and length hashed.
fn object_name(store_name: &str, path: &Path, len: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64(format!("{store_name}/{path}@{len}").as_bytes())
}

/// Checks a block on arrival: `(block index, its bytes)`; an error refuses it.
pub(crate) type Verify = Arc<dyn Fn(u64, &Bytes) -> Result<()> + Send + Sync>;

/// Blocks of immutable objects, in memory and on local disk.
#[derive(Clone)]
pub(crate) struct BlockCache {
    cache: HybridCache<u128, Block>,
    block: u64,
    concurrency: usize,
    counters: Arc<Counters>,
    /// The disk tier's runtime, when there is a disk tier, held for its drop (after
    /// `cache`'s), which closes the tier and shuts the runtime.
    _tier: Option<Arc<TierRuntime>>,
    /// The runtime that opened the cache: foyer runs a miss on a runtime of its own (the disk
    /// tier's, or [`miss_spawner`]'s), and the object store is read on this one, where its
    /// client's connections live.
    fetch_on: Option<tokio::runtime::Handle>,
    /// The directory of its disk tier, when it has one.
    disk_dir: Option<PathBuf>,
}

/// The runtime a disk tier's tasks run on, shut down with every task on it when the last
/// clone of its cache goes. foyer's disk engine never ends its write tasks by itself (each
/// holds, through the engine, the sender of its own queue), so on the caller's runtime a
/// closed cache's tier stayed until that runtime ended: its files open, its write buffers
/// held (8 MiB), once per handle opened and closed.
struct TierRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    /// The cache whose tier runs here: closed (what its memory holds written, its writes
    /// finished) before the runtime shuts down.
    cache: Option<HybridCache<u128, Block>>,
    /// The tier's directory, held until the tier is closed: by [`BlockCache::close`], or
    /// when the runtime is shut after the last clone of the cache is dropped.
    lock: std::sync::Mutex<Option<DirLock>>,
}

/// The name of the file in a disk tier's directory whose lock ([`std::fs::File::try_lock`])
/// an open cache holds.
const LOCK_FILE: &str = "lsmsearch-cache.lock";
/// Directories beside a disk tier's (`<dir>.1` to `<dir>.8`) that an open takes, in turn,
/// when open caches hold it and the ones before.
const DISK_SIBLINGS: usize = 8;
/// How long an open waits, in all, for caches of this process that hold its directory and
/// are closing; past it, it takes a sibling. A close writes what memory held (at most
/// [`CLOSE_WRITES`]), then shuts its runtime (at most 30 s): usually a few milliseconds, at
/// worst 50 s, after which the directory is let go even if a write is still blocked (blocks
/// read back are checked, so such a write costs a fetch, never a wrong byte).
const CLOSING_WAIT: std::time::Duration = std::time::Duration::from_secs(35);
/// How long a dropped cache's close may write what its memory held to disk.
const CLOSE_WRITES: std::time::Duration = std::time::Duration::from_secs(20);

/// The directories whose caches this process dropped and is still closing, with how many
/// (a newer cache of a directory may close while an older one's lock is being let go).
fn closing() -> std::sync::MutexGuard<'static, std::collections::HashMap<PathBuf, usize>> {
    type Closing = std::sync::Mutex<std::collections::HashMap<PathBuf, usize>>;
    static CLOSING: std::sync::OnceLock<Closing> = std::sync::OnceLock::new();
    CLOSING
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// A disk tier's directory, held: two tiers over the same files would write over each other's
/// blocks, in one process or in two (an advisory lock: every cache takes it).
struct DirLock {
    dir: PathBuf,
    file: std::fs::File,
    /// Whether the directory is in [`closing`], left when this lock is let go.
    closing: bool,
}

impl DirLock {
    /// `wanted`, or when open caches (of this process or another) hold it, the first sibling
    /// none holds. A directory a cache of this process holds while it closes is waited for:
    /// a handle dropped and opened again finds its blocks.
    async fn take(wanted: &std::path::Path) -> Result<DirLock> {
        let wanted = wanted.to_path_buf();
        let take = move || DirLock::take_blocking(&wanted);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => rt
                .spawn_blocking(take)
                .await
                .map_err(|e| Error::internal(format!("locking the disk cache: {e}")))?,
            Err(_) => take(),
        }
    }

    fn take_blocking(wanted: &std::path::Path) -> Result<DirLock> {
        // Named as the file system names it, so that every spelling of one directory (a
        // trailing slash, `.`, a relative path, a link) is one, and its siblings are beside
        // it.
        let unusable = |dir: &std::path::Path, e: std::io::Error| {
            Error::invalid(format!("cannot use cache directory {}: {e}", dir.display()))
        };
        let named = |dir: &std::path::Path| {
            std::fs::create_dir_all(dir)
                .and_then(|_| dir.canonicalize())
                .map_err(|e| unusable(dir, e))
        };
        let first = named(wanted)?;
        let deadline = std::time::Instant::now() + CLOSING_WAIT;
        for i in 0..=DISK_SIBLINGS {
            let dir = match (i, first.file_name()) {
                (0, _) => first.clone(),
                (i, Some(name)) => {
                    let mut name = name.to_owned();
                    name.push(format!(".{i}"));
                    // A sibling that cannot be used is passed over for the next.
                    match named(&first.with_file_name(name)) {
                        Ok(dir) => dir,
                        Err(e) => {
                            tracing::warn!("{e}");
                            continue;
                        }
                    }
                }
                // The root directory has no name to put a sibling beside.
                (_, None) => break,
            };
            let file = match std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join(LOCK_FILE))
            {
                Ok(file) => file,
                Err(e) if i == 0 => return Err(unusable(&dir, e)),
                Err(e) => {
                    tracing::warn!("{}", unusable(&dir, e));
                    continue;
                }
            };
            let taken = loop {
                match file.try_lock() {
                    Ok(()) => break true,
                    Err(std::fs::TryLockError::WouldBlock) => {}
                    // A file system without locks (some network and FUSE mounts): the
                    // directory is used as before there were locks, one a handle.
                    Err(std::fs::TryLockError::Error(e)) => {
                        tracing::warn!(
                            "cache directory {}: cannot lock it ({e}); using it unlocked: \
                             give each open handle a cache_dir of its own",
                            dir.display()
                        );
                        break true;
                    }
                }
                if !closing().contains_key(&dir) {
                    // Let go between the failed lock and this look: take it.
                    break file.try_lock().is_ok();
                }
                if std::time::Instant::now() >= deadline {
                    break false;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            };
            if taken {
                if i > 0 {
                    tracing::warn!(
                        "cache directory {} is held by another handle: using {}",
                        first.display(),
                        dir.display()
                    );
                }
                return Ok(DirLock {
                    dir,
                    file,
                    closing: false,
                });
            }
        }
        Err(Error::invalid(format!(
            "the disk cache directory {} and its {DISK_SIBLINGS} siblings ({0}.1 to {0}.{DISK_SIBLINGS}) \
             are all held by open handles or cannot be used: give each handle a cache_dir of its own",
            first.display()
        )))
    }

    /// Mark the directory as held by a cache this process is closing.
    fn closing(&mut self) {
        *closing().entry(self.dir.clone()).or_default() += 1;
        self.closing = true;
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Let go of the lock first: an open that finds the directory no longer closing
        // then finds it free.
        let _ = self.file.unlock();
        if self.closing {
            let mut closing = closing();
            if let Some(n) = closing.get_mut(&self.dir) {
                *n -= 1;
                if *n == 0 {
                    closing.remove(&self.dir);
                }
            }
        }
    }
}

impl TierRuntime {
    fn new() -> Result<TierRuntime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
            .thread_name("lsmsearch-disk-cache")
            .enable_all()
            .build()
            .map(|rt| TierRuntime {
                runtime: Some(rt),
                cache: None,
                lock: std::sync::Mutex::new(None),
            })
            .map_err(|e| Error::internal(format!("cannot start the disk cache's runtime: {e}")))
    }

    fn handle(&self) -> Option<tokio::runtime::Handle> {
        self.runtime.as_ref().map(|rt| rt.handle().clone())
    }
}

/// The runtime foyer runs a memory-only cache's misses on: one for the process, never shut
/// down. foyer spawns a miss while it holds the lock of the misses in flight, and a
/// runtime that has shut down drops the task at once, on the spawning thread, whose drop takes
/// that lock again: on the runtime that opened the cache, a read made by a query thread after
/// that runtime ended (a process stopping mid-search) stopped its thread for good. The task
/// here only waits for the fetch, which runs on the opening runtime ([`BlockCache::fetch_on`])
/// and fails once that runtime is gone.
fn miss_spawner() -> Result<Spawner> {
    // Started by the first cache that needs it; a start that failed (no thread could be
    // made) is tried again by the next open instead of failing every open after it.
    static RUNTIME: std::sync::Mutex<Option<tokio::runtime::Runtime>> = std::sync::Mutex::new(None);
    let mut runtime = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if runtime.is_none() {
        // tokio panics when it cannot make a worker thread (and errs when it cannot make its
        // drivers): either is an error of this open, not a panic.
        let started = std::panic::catch_unwind(|| {
            tokio::runtime::Builder::new_multi_thread()
                // A miss's task waits for its fetch, then inserts its block (and evicts): a
                // thread per core, at most four, so that a burst of misses of many handles
                // does not queue behind one.
                .worker_threads(std::thread::available_parallelism().map_or(1, |n| n.get().min(4)))
                .thread_name("lsmsearch-cache-misses")
                .enable_all()
                .build()
        });
        let started = match started {
            Ok(Ok(rt)) => rt,
            Ok(Err(e)) => {
                return Err(Error::internal(format!(
                    "cannot start the block cache's runtime: {e}"
                )))
            }
            Err(_) => {
                return Err(Error::internal(
                    "cannot start the block cache's runtime: no thread could be made",
                ))
            }
        };
        *runtime = Some(started);
    }
    match runtime.as_ref() {
        Some(rt) => Ok(Spawner::from(rt.handle().clone())),
        None => Err(Error::internal("the block cache's runtime did not start")),
    }
}

/// A runtime shut down in the background if nothing shut it before it is dropped (a runtime
/// cannot be dropped where blocking is not allowed).
struct Shutting(Option<tokio::runtime::Runtime>);

impl Drop for Shutting {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for TierRuntime {
    fn drop(&mut self) {
        let mut runtime = Shutting(self.runtime.take());
        let cache = self.cache.take();
        // An open of the same directory in this process waits for this close to end.
        let mut lock = self
            .lock
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(l) = lock.as_mut() {
            l.closing();
        }
        // On a thread of its own, which may block: the cache closed first (a handle dropped
        // without close writes its memory to disk as close does), then the runtime shut once
        // its blocking reads and writes are done. A write under way when a runtime shuts in
        // the background goes on through a file number the device has closed, which another
        // open may have taken.
        let close = move || {
            let Some(rt) = runtime.0.take() else {
                return;
            };
            if let Some(cache) = cache {
                // The timer is made inside the runtime: this thread has none of its own.
                let closed =
                    rt.block_on(async { tokio::time::timeout(CLOSE_WRITES, cache.close()).await });
                match closed {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!("closing the disk cache: {e}"),
                    Err(_) => tracing::warn!(
                        "closing the disk cache: its writes did not end within {CLOSE_WRITES:?}"
                    ),
                }
                drop(cache);
            }
            rt.shutdown_timeout(std::time::Duration::from_secs(30));
            drop(lock);
        };
        // Without a thread, the runtime is shut in the background as the closure drops.
        let _ = std::thread::Builder::new()
            .name("lsmsearch-disk-cache-close".into())
            .spawn(close);
    }
}

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache")
            .field("block", &self.block)
            .field("disk_dir", &self.disk_dir)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl BlockCache {
    /// A cache with `config`'s budgets; with a disk directory, the blocks a previous process
    /// left there are found again.
    pub(crate) async fn open(config: &BlockCacheConfig) -> Result<BlockCache> {
        let block = config.block_bytes;
        if !(1..=MAX_BLOCK_BYTES).contains(&block) {
            return Err(Error::invalid(format!(
                "the cache's block size is {block} bytes; it must be 1 to {MAX_BLOCK_BYTES}"
            )));
        }
        // An entry weighs its block and its key (a store name and a path: under 1 KiB).
        let entry = block + 1024;
        if config.memory_bytes < 2 * entry {
            return Err(Error::invalid(format!(
                "the memory cache budget of {} bytes holds fewer than two blocks of {block} bytes with their keys",
                config.memory_bytes
            )));
        }
        let memory = usize::try_from(config.memory_bytes).unwrap_or(usize::MAX);
        // foyer splits the budget evenly between shards and lets an entry heavier than a
        // shard's share in anyway: each shard gets room for at least four blocks.
        let shards = (config.memory_bytes / (4 * entry)).clamp(1, 8) as usize;
        let builder = HybridCacheBuilder::new()
            .with_name("lsmsearch-blocks")
            .memory(memory)
            .with_shards(shards)
            .with_weighter(|_: &u128, value: &Block| 16 + value.bytes.len())
            .storage();
        let mut tier = None;
        let mut disk_dir = None;
        let builder = match &config.disk_dir {
            Some(wanted) if config.disk_bytes > 0 => {
                // Disk blocks holding a cache block with its key and headers (foyer drops an
                // entry bigger than a disk block less 4 KiB without a word), about a
                // sixteenth of the budget so that eviction frees space in steps of a few
                // percent, within 1 and 64 MiB; the budget holds at least two.
                let engine_block = (config.disk_bytes / 16)
                    .clamp(1 << 20, 64 << 20)
                    .max(block + (64 << 10));
                if config.disk_bytes < 2 * engine_block {
                    return Err(Error::invalid(format!(
                        "the disk cache budget of {} bytes is below {} bytes (two disk blocks)",
                        config.disk_bytes,
                        2 * engine_block
                    )));
                }
                let lock = DirLock::take(wanted).await?;
                let dir = &lock.dir.clone();
                disk_dir = Some(dir.clone());
                let capacity = usize::try_from(config.disk_bytes).unwrap_or(usize::MAX);
                let device = FsDeviceBuilder::new(dir)
                    .with_capacity(capacity)
                    .build()
                    .map_err(|e| cache_error(dir, e))?;
                let engine_block = engine_block as usize;
                // Its writes go through two buffers of 4 MiB each (foyer's default, 16 MiB
                // each, is an eighth of a 256 MiB budget), and inserts beyond twice that queued
                // for them are not cached on disk. A buffer holds at least two cache blocks and
                // their headers: foyer drops an entry that does not fit in what is left of the
                // buffer it is written to instead of starting the next one.
                let buffer = (4usize << 20).max(2 * block as usize + (64 << 10));
                let mut runtime = TierRuntime::new()?;
                runtime.lock = std::sync::Mutex::new(Some(lock));
                let spawner = runtime.handle().map(Spawner::from);
                tier = Some(runtime);
                let builder = match spawner {
                    Some(s) => builder.with_spawner(s),
                    None => builder,
                };
                builder
                    .with_engine_config(
                        BlockEngineConfig::new(device)
                            .with_block_size(engine_block)
                            .with_buffer_pool_size(buffer)
                            .with_submit_queue_size_threshold(2 * buffer),
                    )
                    .with_recover_mode(RecoverMode::Quiet)
            }
            _ => builder.with_spawner(miss_spawner()?),
        };
        let cache = builder
            .build()
            .await
            .map_err(|e| cache_error(config.disk_dir.as_deref().unwrap_or("memory".as_ref()), e))?;
        if let Some(tier) = tier.as_mut() {
            tier.cache = Some(cache.clone());
        }
        let fetch_on = tokio::runtime::Handle::try_current().ok();
        let tier = tier.map(Arc::new);
        Ok(BlockCache {
            cache,
            block: config.block_bytes,
            concurrency: config.concurrency.max(1),
            counters: Arc::default(),
            _tier: tier,
            fetch_on,
            disk_dir,
        })
    }

    /// The directory of the disk tier, when there is one.
    #[cfg(test)]
    pub(crate) fn disk_dir(&self) -> Option<&std::path::Path> {
        self.disk_dir.as_deref()
    }

    /// Bytes `range` of the immutable object at `path` in `store` (named `store_name`), which is
    /// `len` bytes long, read through the cache: every block the range touches, the missing
    /// ones fetched concurrently, each fetched block checked by `verify` before it is cached.
    pub(crate) async fn read(
        &self,
        store: &Arc<dyn ObjectStore>,
        store_name: &str,
        path: &Path,
        len: u64,
        range: Range<u64>,
        verify: &Verify,
    ) -> Result<Bytes> {
        let mut one = self
            .read_ranges(store, store_name, path, len, &[range], verify)
            .await?;
        one.pop()
            .ok_or_else(|| Error::internal("a read of one range returned none"))
    }

    /// Bytes of each of `ranges` of the object, as [`BlockCache::read`] reads one, with each
    /// block they touch asked for once, all at once: many small ranges (a generation's
    /// candidate vectors) cost one lookup or fetch per block, not per range.
    pub(crate) async fn read_ranges(
        &self,
        store: &Arc<dyn ObjectStore>,
        store_name: &str,
        path: &Path,
        len: u64,
        ranges: &[Range<u64>],
        verify: &Verify,
    ) -> Result<Vec<Bytes>> {
        if let Some(r) = ranges.iter().find(|r| r.start > r.end || r.end > len) {
            return Err(Error::data(
                path,
                format!("a read of bytes {r:?} past the object's {len} bytes"),
            ));
        }
        let wanted = self.blocks_of(ranges);
        let object = object_name(store_name, path, len);
        // Blocks in memory and checked (a warm read) are taken at once; the others are
        // asked for at most `concurrency` at once.
        let mut blocks: Vec<Option<Bytes>> = wanted
            .iter()
            .map(|b| {
                let bytes = self.in_memory(object, *b);
                if bytes.is_some() {
                    self.counters.blocks.fetch_add(1, Ordering::Relaxed);
                }
                bytes
            })
            .collect();
        let missing: Vec<usize> = (0..wanted.len()).filter(|i| blocks[*i].is_none()).collect();
        for some in missing.chunks(self.concurrency) {
            let read = futures::future::try_join_all(
                some.iter()
                    .map(|i| self.block_of(store, object, path, len, wanted[*i], verify)),
            )
            .await?;
            for (i, bytes) in some.iter().zip(read) {
                blocks[*i] = Some(bytes);
            }
        }
        let blocks: Vec<Bytes> = blocks
            .into_iter()
            .map(|b| b.ok_or_else(|| Error::internal("a block asked for and not read")))
            .collect::<Result<_>>()?;
        Ok(self.assemble(ranges, &wanted, &blocks))
    }

    /// Bytes of each of `ranges` of the object, as [`BlockCache::read_ranges`] reads them,
    /// when every block they touch is in memory and checked; `None` when one is not, with
    /// nothing asked for, fetched or counted (the caller reads them as it would have).
    pub(crate) fn read_ranges_in_memory(
        &self,
        store_name: &str,
        path: &Path,
        len: u64,
        ranges: &[Range<u64>],
    ) -> Option<Vec<Bytes>> {
        if ranges.iter().any(|r| r.start > r.end || r.end > len) {
            return None;
        }
        let wanted = self.blocks_of(ranges);
        let object = object_name(store_name, path, len);
        let blocks: Vec<Bytes> = wanted
            .iter()
            .map(|b| self.in_memory(object, *b))
            .collect::<Option<_>>()?;
        self.counters
            .blocks
            .fetch_add(blocks.len() as u64, Ordering::Relaxed);
        Some(self.assemble(ranges, &wanted, &blocks))
    }

    /// The blocks `ranges` touch, sorted, each once.
    fn blocks_of(&self, ranges: &[Range<u64>]) -> Vec<u64> {
        let mut wanted: Vec<u64> = ranges
            .iter()
            .filter(|r| !r.is_empty())
            .flat_map(|r| r.start / self.block..=(r.end - 1) / self.block)
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        wanted
    }

    /// The bytes of `ranges` from `blocks`, the bytes of blocks `wanted` (sorted, covering
    /// every range).
    fn assemble(&self, ranges: &[Range<u64>], wanted: &[u64], blocks: &[Bytes]) -> Vec<Bytes> {
        let block = |b: u64| &blocks[wanted.binary_search(&b).expect("a block asked for")];
        ranges
            .iter()
            .map(|r| {
                if r.is_empty() {
                    return Bytes::new();
                }
                let (first, last) = (r.start / self.block, (r.end - 1) / self.block);
                let start = (r.start - first * self.block) as usize;
                if first == last {
                    return block(first).slice(start..start + (r.end - r.start) as usize);
                }
                let mut out = BytesMut::with_capacity((r.end - r.start) as usize);
                for b in first..=last {
                    let bytes = block(b);
                    let from = if b == first { start } else { 0 };
                    let to = if b == last {
                        (r.end - last * self.block) as usize
                    } else {
                        bytes.len()
                    };
                    out.extend_from_slice(&bytes[from..to]);
                }
                out.freeze()
            })
            .collect()
    }

    /// Block `b` of the object (named `object`, see [`block_key`]) if it is in memory and
    /// checked (a warm read): taken at once, without preparing a fetch; not counted (its
    /// caller counts what it takes, and [`BlockCache::block_of`] what it asks for).
    fn in_memory(&self, object: u64, b: u64) -> Option<Bytes> {
        let entry = self.cache.memory().get(&block_key(object, b))?;
        let block = entry.value();
        block
            .checked
            .load(Ordering::Acquire)
            .then(|| block.bytes.clone())
    }

    /// Block `b` of the object (named `object`, see [`block_key`]), from either tier or
    /// fetched. A block is checked once in this process: when this call fetched it, or the
    /// first time a reader finds it unchecked (read back from disk: it may be another
    /// object's under the same name, and foyer makes a disk hit a memory entry before it
    /// reaches the caller); a refused one leaves the cache and is fetched again, once.
    async fn block_of(
        &self,
        store: &Arc<dyn ObjectStore>,
        object: u64,
        path: &Path,
        len: u64,
        b: u64,
        verify: &Verify,
    ) -> Result<Bytes> {
        self.counters.blocks.fetch_add(1, Ordering::Relaxed);
        let key = block_key(object, b);
        let mut refused = None;
        for _ in 0..2 {
            let entry = self.get_or_fetch(key, store, path, len, b, verify).await?;
            let block = entry.value();
            if entry.source() == foyer::Source::Disk {
                self.counters.disk_hits.fetch_add(1, Ordering::Relaxed);
            }
            if block.checked.load(Ordering::Acquire) {
                return Ok(block.bytes.clone());
            }
            // A block read back from disk must also have its block's exact length.
            let want = self
                .block
                .min(len.saturating_sub(b.saturating_mul(self.block)));
            let checked = if block.bytes.len() as u64 == want {
                verify(b, &block.bytes)
            } else {
                Err(Error::data(
                    path,
                    format!(
                        "cached block {b} has {} bytes, not {want}",
                        block.bytes.len()
                    ),
                ))
            };
            match checked {
                Ok(()) => {
                    block.checked.store(true, Ordering::Release);
                    return Ok(block.bytes.clone());
                }
                Err(e) => {
                    self.cache.remove(&key);
                    refused = Some(e);
                }
            }
        }
        Err(refused.unwrap_or_else(|| Error::internal("a block refused without an error")))
    }

    /// The cached block under `key`, or block `b` fetched, checked and cached.
    async fn get_or_fetch(
        &self,
        key: u128,
        store: &Arc<dyn ObjectStore>,
        path: &Path,
        len: u64,
        b: u64,
        verify: &Verify,
    ) -> Result<foyer::HybridCacheEntry<u128, Block>> {
        let start = b.saturating_mul(self.block);
        let range = start..start.saturating_add(self.block).min(len);
        let name = format!("{path}#{b}");
        let (store, path, verify) = (store.clone(), path.clone(), verify.clone());
        let counters = self.counters.clone();
        let caller = self.fetch_on.clone();
        let block = name.clone();
        let fetch = async move {
            let want = range.end - range.start;
            let bytes = store
                .get_range(&path, range)
                .await
                .map_err(|e| Error::store(&path, e))?;
            counters.fetched.fetch_add(1, Ordering::Relaxed);
            counters
                .fetched_bytes
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            // A store clamps a range past the object's end: a short block means the
            // object is not `len` bytes long.
            if bytes.len() as u64 != want {
                return Err(Error::data(
                    &path,
                    format!(
                        "block {b}: {} bytes where {want} were expected",
                        bytes.len()
                    ),
                ));
            }
            verify(b, &bytes)?;
            Ok::<_, Error>(Block {
                bytes,
                checked: true.into(),
            })
        };
        self.cache
            .get_or_fetch(&key, move || async move {
                match caller {
                    Some(caller) => caller.spawn(fetch).await.map_err(|e| match e.is_panic() {
                        // A fault of ours, which no retry mends.
                        true => Error::internal(format!(
                            "block {block}: its fetch panicked: {}",
                            crate::error::panic_text(&*e.into_panic())
                        )),
                        // Cancelled: the runtime that opened the cache has shut down.
                        false => Error::io(format!("block {block}: its fetch did not finish: {e}")),
                    })?,
                    None => fetch.await,
                }
            })
            .await
            .map_err(|e| fetch_error(&name, e))
    }

    /// Put the blocks of `object` (the whole object, `len` bytes, at hand: one this handle
    /// has just written) that cover `range` in the memory tier, each checked by `verify` as
    /// a fetched one would be (a block failing it is left out).
    pub(crate) fn seed(
        &self,
        store_name: &str,
        path: &Path,
        object: &Bytes,
        range: Range<u64>,
        verify: &Verify,
    ) {
        let len = object.len() as u64;
        if range.is_empty() || range.end > len {
            return;
        }
        let name = object_name(store_name, path, len);
        for b in range.start / self.block..=(range.end - 1) / self.block {
            let start = b * self.block;
            let end = start.saturating_add(self.block).min(len);
            // A copy: the block must not keep the whole object alive.
            let bytes = Bytes::copy_from_slice(&object[start as usize..end as usize]);
            if verify(b, &bytes).is_ok() {
                self.cache.insert(
                    block_key(name, b),
                    Block {
                        bytes,
                        checked: true.into(),
                    },
                );
            }
        }
    }

    /// What the cache served since it was opened.
    pub(crate) fn stats(&self) -> BlockCacheStats {
        let c = &self.counters;
        BlockCacheStats {
            blocks: c.blocks.load(Ordering::Relaxed),
            fetched: c.fetched.load(Ordering::Relaxed),
            fetched_bytes: c.fetched_bytes.load(Ordering::Relaxed),
            disk_hits: c.disk_hits.load(Ordering::Relaxed),
        }
    }

    /// The memory tier's budget in bytes.
    pub(crate) fn memory_budget(&self) -> u64 {
        self.cache.memory().capacity() as u64
    }

    /// Bytes the memory tier holds.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.cache.memory().usage() as u64
    }

    /// Write what the memory tier holds to disk (when there is a disk tier) and stop; the
    /// disk tier's directory is then free for the next cache to open, even while clones of
    /// this one are still held (a closed handle not yet dropped).
    pub(crate) async fn close(&self) -> Result<()> {
        self.cache
            .close()
            .await
            .map_err(|e| Error::internal(format!("closing the block cache: {e}")))?;
        if let Some(tier) = &self._tier {
            drop(tier.lock.lock().unwrap_or_else(|e| e.into_inner()).take());
        }
        Ok(())
    }
}

fn cache_error(dir: impl AsRef<std::path::Path>, e: impl std::fmt::Display) -> Error {
    Error::invalid(format!(
        "cannot open the block cache in {}: {e}",
        dir.as_ref().display()
    ))
}

/// A fetch's error as foyer hands it back: ours when it is ours, else the cache's.
fn fetch_error(key: &str, e: foyer::Error) -> Error {
    match e.downcast_ref::<Error>() {
        Some(ours) => ours.clone(),
        None => Error::internal(format!("block cache, block {key}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{LatencyConfig, LatencyStore};
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;
    use std::time::Duration;

    const BLOCK: u64 = 1024;

    fn accept() -> Verify {
        Arc::new(|_, _| Ok(()))
    }

    /// An object of `len` pseudo-random bytes at `o`, in a store that counts requests (and
    /// adds `latency` to each GET).
    async fn object(len: usize, latency: Duration) -> (Arc<LatencyStore>, Path, Vec<u8>) {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("o");
        inner.put(&path, bytes.clone().into()).await.unwrap();
        let store = LatencyStore::new(
            inner,
            LatencyConfig {
                read: latency,
                write: Duration::ZERO,
                bytes_per_second: None,
            },
        );
        (store, path, bytes)
    }

    fn config(memory: u64, disk: Option<&std::path::Path>) -> BlockCacheConfig {
        BlockCacheConfig {
            memory_bytes: memory,
            disk_bytes: if disk.is_some() { 64 << 20 } else { 0 },
            disk_dir: disk.map(|d| d.to_path_buf()),
            block_bytes: BLOCK,
            concurrency: 64,
        }
    }

    #[tokio::test]
    async fn a_range_reads_the_bytes_of_the_object_and_fetches_each_block_once() {
        let (store, path, bytes) = object(10_000, Duration::ZERO).await;
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let cache = BlockCache::open(&config(1 << 20, None)).await.unwrap();
        let len = bytes.len() as u64;
        let ranges = [
            0..1,
            0..1024,
            1000..1030,
            1023..1025,
            5000..9999,
            9999..10_000,
            0..10_000,
            42..42,
        ];
        for r in ranges.iter().cloned() {
            let got = cache
                .read(&dyn_store, "mem", &path, len, r.clone(), &accept())
                .await
                .unwrap();
            assert_eq!(&got[..], &bytes[r.start as usize..r.end as usize], "{r:?}");
        }
        // Ten blocks, each fetched once, in one GET each.
        assert_eq!(store.counters().gets, 10);
        assert_eq!(cache.stats().fetched, 10);
        assert_eq!(cache.stats().fetched_bytes, len);
        let again = cache
            .read(&dyn_store, "mem", &path, len, 0..len, &accept())
            .await
            .unwrap();
        assert_eq!(&again[..], &bytes[..]);
        assert_eq!(store.counters().gets, 10, "a warm read makes no request");
        // Many ranges at once (overlapping, across blocks, empty): each as read alone.
        let many = [3..5, 1000..3100, 4..4, 2048..2049, 0..10_000, 9000..9001];
        let got = cache
            .read_ranges(&dyn_store, "mem", &path, len, &many, &accept())
            .await
            .unwrap();
        for (r, g) in many.iter().zip(&got) {
            assert_eq!(&g[..], &bytes[r.start as usize..r.end as usize], "{r:?}");
        }
        // A block checked on arrival is not checked again while it stays in memory.
        let checks = Arc::new(AtomicU64::new(0));
        let counted: Verify = {
            let checks = checks.clone();
            Arc::new(move |_, _| {
                checks.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
        };
        cache
            .read(&dyn_store, "mem", &path, len, 0..len, &counted)
            .await
            .unwrap();
        assert_eq!(
            checks.load(Ordering::Relaxed),
            0,
            "memory hits are not checked again"
        );
        // Out of the object (a directory that disagrees with the object's length): a data
        // error naming the object, not a short read.
        let e = cache
            .read(&dyn_store, "mem", &path, len, 9_000..10_001, &accept())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
        assert!(e.to_string().contains(path.as_ref()), "{e}");
    }

    #[tokio::test]
    async fn a_read_in_memory_takes_every_block_or_asks_for_none() {
        let (store, path, bytes) = object(10_000, Duration::ZERO).await;
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let cache = BlockCache::open(&config(1 << 20, None)).await.unwrap();
        let len = bytes.len() as u64;
        let many = [3..5, 1000..3100, 4..4, 2048..2049, 9000..9001];
        // Blocks 0 to 3 in memory, block 8 not: nothing taken, asked for, fetched or counted.
        cache
            .read(&dyn_store, "mem", &path, len, 0..4096, &accept())
            .await
            .unwrap();
        let (asked, gets) = (cache.stats().blocks, store.counters().gets);
        assert!(cache
            .read_ranges_in_memory("mem", &path, len, &many)
            .is_none());
        assert_eq!(cache.stats().blocks, asked, "nothing counted");
        assert_eq!(store.counters().gets, gets, "nothing fetched");
        // Past the object: none, as the read would refuse it.
        let past = 0..len + 1;
        assert!(cache
            .read_ranges_in_memory("mem", &path, len, std::slice::from_ref(&past))
            .is_none());
        // Every block in memory: the read's bytes, each block counted once.
        let want = cache
            .read_ranges(&dyn_store, "mem", &path, len, &many, &accept())
            .await
            .unwrap();
        let asked = cache.stats().blocks;
        let got = cache
            .read_ranges_in_memory("mem", &path, len, &many)
            .expect("every block in memory");
        assert_eq!(got, want);
        for (r, g) in many.iter().zip(&got) {
            assert_eq!(&g[..], &bytes[r.start as usize..r.end as usize], "{r:?}");
        }
        assert_eq!(cache.stats().blocks, asked + 5, "blocks 0, 1, 2, 3 and 8");
        assert_eq!(store.counters().gets, gets + 1, "block 8, by the read");
    }

    #[tokio::test]
    async fn an_object_shorter_than_its_length_is_an_error_not_a_panic() {
        let (store, path, _) = object(3000, Duration::ZERO).await;
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let cache = BlockCache::open(&config(1 << 20, None)).await.unwrap();
        // Said to be 4,000 bytes long: its third block comes back short. (A read that also
        // touched the fourth, which starts past the end, would fail with whichever of the
        // two errors came first.)
        let e = cache
            .read(&dyn_store, "mem", &path, 4000, 2000..3000, &accept())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
        assert!(e.to_string().contains("block 2"), "{e}");
    }

    #[tokio::test]
    async fn concurrent_misses_of_a_block_share_one_get() {
        let (store, path, bytes) = object(4096, Duration::from_millis(30)).await;
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let cache = BlockCache::open(&config(1 << 20, None)).await.unwrap();
        let reads = (0..16).map(|i| {
            let (cache, store, path) = (cache.clone(), dyn_store.clone(), path.clone());
            async move {
                cache
                    .read(&store, "mem", &path, 4096, i..i + 100, &accept())
                    .await
            }
        });
        for (i, r) in futures::future::join_all(reads)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(&r.unwrap()[..], &bytes[i..i + 100]);
        }
        assert_eq!(
            store.counters().gets,
            1,
            "sixteen readers of one block, one GET"
        );
    }

    #[tokio::test]
    async fn a_block_failing_its_check_is_refused_and_not_cached() {
        let (store, path, bytes) = object(3000, Duration::ZERO).await;
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let cache = BlockCache::open(&config(1 << 20, None)).await.unwrap();
        let refuse_block_1: Verify = Arc::new(|b, _| {
            if b == 1 {
                Err(Error::data("o", "block 1 fails its CRC"))
            } else {
                Ok(())
            }
        });
        let e = cache
            .read(&dyn_store, "mem", &path, 3000, 500..2500, &refuse_block_1)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Data);
        assert!(e.to_string().contains("block 1 fails its CRC"), "{e}");
        // The read failed as soon as block 1 did; the fetches of blocks 0 and 2 go on (and
        // are cached): let them land before counting.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while store.counters().gets < 3 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Not cached: the next read fetches it again, and gets the right bytes.
        let gets = store.counters().gets;
        assert_eq!(gets, 3, "one GET for each of blocks 0, 1 and 2");
        let got = cache
            .read(&dyn_store, "mem", &path, 3000, 1024..2048, &accept())
            .await
            .unwrap();
        assert_eq!(&got[..], &bytes[1024..2048]);
        assert_eq!(store.counters().gets, gets + 1);
    }

    #[tokio::test]
    async fn the_memory_tier_stays_within_its_budget() {
        let (store, path, bytes) = object(1 << 20, Duration::ZERO).await;
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let budget = 64 << 10;
        let cache = BlockCache::open(&config(budget, None)).await.unwrap();
        let len = bytes.len() as u64;
        for start in (0..len).step_by(BLOCK as usize) {
            let got = cache
                .read(
                    &dyn_store,
                    "mem",
                    &path,
                    len,
                    start..start + BLOCK,
                    &accept(),
                )
                .await
                .unwrap();
            assert_eq!(&got[..], &bytes[start as usize..(start + BLOCK) as usize]);
            assert!(
                cache.memory_bytes() <= budget,
                "{} bytes held, budget {budget}",
                cache.memory_bytes()
            );
        }
    }

    #[tokio::test]
    async fn a_restarted_process_finds_its_disk_cache_and_checks_it() {
        let dir = tempfile::tempdir().unwrap();
        let (store, path, bytes) = object(20_000, Duration::ZERO).await;
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let len = bytes.len() as u64;
        {
            // A memory tier of a few blocks: the rest go to disk as they are evicted, and
            // what is left in memory at close.
            let cache = BlockCache::open(&config(4 * BLOCK, Some(dir.path())))
                .await
                .unwrap();
            cache
                .read(&dyn_store, "mem", &path, len, 0..len, &accept())
                .await
                .unwrap();
            cache.close().await.unwrap();
        }
        let gets = store.counters().gets;
        let cache = BlockCache::open(&config(4 * BLOCK, Some(dir.path())))
            .await
            .unwrap();
        let got = cache
            .read(&dyn_store, "mem", &path, len, 0..len, &accept())
            .await
            .unwrap();
        assert_eq!(&got[..], &bytes[..]);
        let fetched = store.counters().gets - gets;
        assert!(
            cache.stats().disk_hits >= 15 && fetched <= 5,
            "{} of 20 blocks read back from disk, {fetched} fetched",
            cache.stats().disk_hits
        );
        // Blocks read back from disk are checked: a refused one is an error, and leaves.
        let refuse: Verify = Arc::new(|_, _| Err(Error::data("o", "not this object")));
        cache.close().await.unwrap();
        let cache = BlockCache::open(&config(4 * BLOCK, Some(dir.path())))
            .await
            .unwrap();
        let e = cache
            .read(&dyn_store, "mem", &path, len, 0..BLOCK, &refuse)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
    }

    #[tokio::test]
    async fn a_stale_block_on_disk_is_fetched_again_from_the_store() {
        // An object cached on disk, then another object of the same length under the same name
        // (an index deleted and created again): the reader's check refuses the old blocks,
        // which are fetched again.
        let dir = tempfile::tempdir().unwrap();
        let (store, path, _) = object(8192, Duration::ZERO).await;
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        {
            let cache = BlockCache::open(&config(4 * BLOCK, Some(dir.path())))
                .await
                .unwrap();
            cache
                .read(&dyn_store, "mem", &path, 8192, 0..8192, &accept())
                .await
                .unwrap();
            cache.close().await.unwrap();
        }
        let new: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        dyn_store.put(&path, new.clone().into()).await.unwrap();
        let crcs: Vec<u32> = new.chunks(BLOCK as usize).map(crc32fast::hash).collect();
        let check: Verify = Arc::new(move |b, bytes| {
            if crc32fast::hash(bytes) == crcs[b as usize] {
                Ok(())
            } else {
                Err(Error::data("o", format!("block {b} fails its CRC")))
            }
        });
        let cache = BlockCache::open(&config(4 * BLOCK, Some(dir.path())))
            .await
            .unwrap();
        let got = cache
            .read(&dyn_store, "mem", &path, 8192, 0..8192, &check)
            .await
            .unwrap();
        assert_eq!(&got[..], &new[..]);
        assert!(
            cache.stats().disk_hits > 0,
            "the old blocks were found on disk"
        );
        assert_eq!(cache.stats().fetched, 8, "and all fetched again");
    }

    #[tokio::test]
    async fn budgets_that_cannot_hold_blocks_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(1 << 20, None);
        c.block_bytes = 0;
        assert!(BlockCache::open(&c)
            .await
            .unwrap_err()
            .to_string()
            .contains("block size"));
        c.block_bytes = MAX_BLOCK_BYTES + 1;
        assert!(BlockCache::open(&c)
            .await
            .unwrap_err()
            .to_string()
            .contains("block size"));
        let mut c = config(BLOCK, None);
        let e = BlockCache::open(&c).await.unwrap_err();
        assert!(e.to_string().contains("memory cache budget"), "{e}");
        let unmade = dir.path().join("unmade");
        c = config(1 << 20, Some(&unmade));
        c.disk_bytes = 1 << 20;
        let e = BlockCache::open(&c).await.unwrap_err();
        assert!(e.to_string().contains("disk cache budget"), "{e}");
        assert_eq!(e.kind(), crate::ErrorKind::Invalid);
        // Refused before anything is made or held.
        assert!(!unmade.exists(), "a refused open made its directory");
        // The largest block, with a memory budget of a few of them, and a disk tier.
        c = BlockCacheConfig {
            memory_bytes: 4 * (MAX_BLOCK_BYTES + 1024),
            disk_bytes: 64 << 20,
            disk_dir: Some(dir.path().to_path_buf()),
            block_bytes: MAX_BLOCK_BYTES,
            concurrency: 4,
        };
        BlockCache::open(&c).await.unwrap().close().await.unwrap();
    }

    /// A read from a thread outside any runtime after the runtime that opened the cache has
    /// shut down (a query thread finishing a search its process is stopping): an error, not
    /// a thread stuck for good. foyer spawns a miss's fetch while it holds the lock of the
    /// misses in flight, and a runtime that has shut down drops a spawned task at once, on
    /// the spawning thread, whose drop takes that lock again.
    #[test]
    fn a_read_after_the_opening_runtime_shut_down_ends() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (store, path, bytes) = rt.block_on(object(10_000, Duration::ZERO));
        let cache = rt
            .block_on(BlockCache::open(&config(1 << 20, None)))
            .unwrap();
        drop(rt);
        let dyn_store: Arc<dyn ObjectStore> = store;
        let len = bytes.len() as u64;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = futures::executor::block_on(cache.read(
                &dyn_store,
                "mem",
                &path,
                len,
                0..len,
                &accept(),
            ));
            let _ = tx.send(r.map(|b| b.len()));
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            // Either is fine: the bytes, or an error naming the block.
            Ok(Ok(n)) => assert_eq!(n as u64, len),
            Ok(Err(e)) => assert!(e.to_string().contains("o#"), "{e}"),
            Err(_) => panic!("the read did not end within 20 s"),
        }
    }

    /// Two caches open at once never share a disk directory: two disk tiers over the same
    /// files write over each other's blocks. The second takes a sibling directory, and the
    /// directory a dropped cache held is taken again once that cache has closed (a handle
    /// opened again finds its blocks), with no wait when no cache of this process holds it.
    #[tokio::test]
    async fn two_open_caches_never_share_a_disk_directory() {
        let root = tempfile::tempdir().unwrap();
        // As the cache names it (the temporary directory may be behind a link).
        let tier = root.path().canonicalize().unwrap().join("tier");
        let c = config(1 << 20, Some(&tier));
        let a = BlockCache::open(&c).await.unwrap();
        let b = BlockCache::open(&c).await.unwrap();
        assert_eq!(a.disk_dir(), Some(tier.as_path()));
        let other = b.disk_dir().unwrap().to_path_buf();
        assert_ne!(other, tier);
        assert_eq!(other.parent(), tier.parent());
        drop(a);
        let again = BlockCache::open(&c).await.unwrap();
        assert_eq!(again.disk_dir(), Some(tier.as_path()));
        // Closed, not dropped: the directory is free.
        again.close().await.unwrap();
        let after_close = BlockCache::open(&c).await.unwrap();
        assert_eq!(after_close.disk_dir(), Some(tier.as_path()));
        drop(again);
        let again = after_close;
        // A third while both are open: another sibling.
        let third = BlockCache::open(&c).await.unwrap();
        let dirs = [tier.as_path(), other.as_path(), third.disk_dir().unwrap()];
        assert!(dirs[2] != dirs[0] && dirs[2] != dirs[1], "{dirs:?}");
        drop((b, again, third));
    }

    /// A sibling directory is beside the held one however its path is spelled (a trailing
    /// slash, a `.`), never inside it.
    #[tokio::test]
    async fn a_sibling_disk_directory_is_beside_the_held_one() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path().canonicalize().unwrap();
        let tier = root.join("tier");
        let a = BlockCache::open(&config(1 << 20, Some(&tier)))
            .await
            .unwrap();
        let slash = PathBuf::from(format!("{}/", tier.display()));
        let b = BlockCache::open(&config(1 << 20, Some(&slash)))
            .await
            .unwrap();
        assert_eq!(b.disk_dir(), Some(root.join("tier.1").as_path()));
        let dot = tier.join(".");
        let c = BlockCache::open(&config(1 << 20, Some(&dot)))
            .await
            .unwrap();
        assert_eq!(c.disk_dir(), Some(root.join("tier.2").as_path()));
        // A sibling that cannot be a directory (a file of that name) is passed over.
        std::fs::write(root.join("tier.3"), b"not a directory").unwrap();
        let d = BlockCache::open(&config(1 << 20, Some(&tier)))
            .await
            .unwrap();
        assert_eq!(d.disk_dir(), Some(root.join("tier.4").as_path()));
        drop((a, b, c, d));
    }

    /// The least disk budget a handle may have (2 MiB: what `Settings::share` gives a shard
    /// at least) holds blocks of the production size on disk, and a new process finds them.
    #[tokio::test]
    async fn the_least_disk_budget_keeps_blocks_a_new_process_finds() {
        let dir = tempfile::tempdir().unwrap();
        let len = 64usize << 10;
        let (store, path, bytes) = object(len, Duration::ZERO).await;
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let block = 16u64 << 10;
        let c = BlockCacheConfig {
            memory_bytes: 4 * (block + 1024),
            disk_bytes: 2 << 20,
            disk_dir: Some(dir.path().to_path_buf()),
            block_bytes: block,
            concurrency: 4,
        };
        let len = len as u64;
        {
            let cache = BlockCache::open(&c).await.unwrap();
            let got = cache
                .read(&dyn_store, "mem", &path, len, 0..len, &accept())
                .await
                .unwrap();
            assert_eq!(&got[..], &bytes[..]);
            cache.close().await.unwrap();
        }
        let cache = BlockCache::open(&c).await.unwrap();
        let gets = store.counters().gets;
        let got = cache
            .read(&dyn_store, "mem", &path, len, 0..len, &accept())
            .await
            .unwrap();
        assert_eq!(&got[..], &bytes[..]);
        assert_eq!(cache.stats().disk_hits, 4, "{:?}", cache.stats());
        assert_eq!(store.counters().gets, gets, "read from disk, not the store");
        cache.close().await.unwrap();
    }
}
