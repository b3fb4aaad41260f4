//! The generation cache of a handle: opened generations (a version-3 generation's hot part,
//! an older one whole) by id, within a byte budget ([`crate::Settings::hot_cache_bytes`]).
//!
//! Every generation a query needs is fetched through [`GenerationCache::get_all`]: hits cost
//! nothing, misses are opened concurrently (at most [`crate::Settings::io_concurrency`] at
//! once, all issued before any is awaited), and two queries missing the same generation share
//! one open. A flush or a compaction puts the generation it built into the cache, opened from
//! the bytes it wrote; what a version-3 generation leaves in its object (rows, large
//! generations' vectors) is read by range through the handle's block cache, the writer's own
//! generations included. When the opened generations outgrow the budget, the least recently
//! and least frequently used are dropped; a query holding one keeps it alive until it
//! finishes.

use super::pins::{Pinned, Pins};
use super::{Generation, Held, IndexSpec, Resident};
use crate::format::bundle::Bundle;
use crate::format::GenerationMeta;
use crate::generation::cold::{ColdObject, ColdStore};
use crate::schema::Metric;
use crate::settings::{GraphParams, Settings};
use crate::storage::blocks::BlockCache;
use crate::storage::paths::Paths;
use crate::storage::Location;
use crate::text::{PostingsCache, TextSchema};
use crate::{Error, Result};
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use std::sync::Arc;

/// What a cache holds right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Generations held.
    pub generations: u64,
    /// Rows stored in the generations held (every version, tombstones too): what
    /// [`CacheStats::resident`] is held for.
    pub rows: u64,
    /// Their weight in bytes: what each opened generation holds in memory (see
    /// [`crate::Settings::hot_cache_bytes`]).
    pub bytes: u64,
    /// The budget of opened generations.
    pub budget: u64,
    /// Bytes of cold blocks held in memory by the block cache (see
    /// [`crate::Settings::cache_bytes`]).
    pub block_bytes: u64,
    /// Blocks asked of the block cache since the handle opened.
    pub blocks_read: u64,
    /// Of them, blocks found in memory.
    pub block_memory_hits: u64,
    /// Of them, blocks read back from the disk tier.
    pub block_disk_hits: u64,
    /// Of them, blocks fetched from the object store, and their bytes.
    pub blocks_fetched: u64,
    /// Bytes of blocks fetched from the object store.
    pub block_bytes_fetched: u64,
    /// Bytes of decoded columns kept for filters and payload, and of filters' passing rows
    /// (see [`crate::Settings::column_cache_bytes`]).
    pub column_bytes: u64,
    /// Bytes of postings and positions kept for full-text searches (see
    /// [`crate::Settings::postings_cache_bytes`]).
    pub postings_bytes: u64,
    /// Superseded rows whose terms are kept, read ahead of the searches that count them (see
    /// [`crate::Settings::dead_row_terms_bytes`]), and their bytes.
    pub dead_row_terms_rows: u64,
    /// Bytes of the terms of those rows.
    pub dead_row_terms_bytes: u64,
    /// Rows and entries of the table of what full-text searches looked up of their terms in
    /// generations: a row per term, an entry per term and generation (about 150 bytes each
    /// with its ranges; the table starts over at 65,536).
    pub term_entries: u64,
    /// What the opened generations hold, by kind.
    pub resident: Resident,
}

/// Decoded generations of one index, within a byte budget. Cheap to clone (shared).
#[derive(Clone)]
pub(crate) struct GenerationCache {
    inner: Arc<Loader>,
}

struct Loader {
    loc: Location,
    paths: Paths,
    schema: SchemaRef,
    text: Option<Arc<TextSchema>>,
    vector: Option<(usize, Metric, GraphParams)>,
    concurrency: usize,
    budget: u64,
    /// Where version-3 generations read their cold parts.
    cold: ColdStore,
    /// Version-3 generations of at most this many rows keep their f32 vectors in memory:
    /// vector search scans them exactly ([`crate::Settings::vector_exact_below`]).
    small_rows: u64,
    cache: moka::future::Cache<(u64, u64), Arc<Generation>>,
    /// Decodes and opens under way at once: one per core. The parts fetched concurrently wait
    /// their turn, so a generation's decoded structures replace its fetched bytes before the
    /// next one's are built beside them (14 hot parts of 2,000,000 rows opened together
    /// peaked at their 475 MB plus all 404 MB decoded from them).
    decoding: Arc<tokio::sync::Semaphore>,
    /// Generations no list of this handle will name again (see [`GenerationCache::retire`]).
    retired: std::sync::Mutex<Retired>,
    /// Generations points in time hold, by `(id, epoch)`, with how many hold each: not
    /// deleted while held, whichever copy of them the cache holds (see [`Pins`]).
    pinned: Pinned,
}

/// The most recent [`RETIRED`] retired generations, oldest first. Ids are never reused, so a
/// retired generation stays retired; the bound only has to outlast the fetches under way.
#[derive(Debug, Default)]
struct Retired {
    keys: std::collections::HashSet<(u64, u64)>,
    order: std::collections::VecDeque<(u64, u64)>,
}

/// Retired generations a cache remembers.
const RETIRED: usize = 4096;

impl std::fmt::Debug for GenerationCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GenerationCache({} generations, budget {} bytes)",
            self.inner.cache.entry_count(),
            self.inner.budget
        )
    }
}

impl GenerationCache {
    /// An empty cache of generations stored under `paths` at `loc`.
    pub(crate) fn new(
        loc: Location,
        paths: Paths,
        schema: SchemaRef,
        text: Option<Arc<TextSchema>>,
        vector: Option<(usize, Metric, GraphParams)>,
        settings: &Settings,
        blocks: BlockCache,
    ) -> Self {
        let (concurrency, budget) = (settings.io_concurrency, settings.hot_cache_bytes);
        let small_rows = settings.vector_exact_below as u64;
        let cache = moka::future::Cache::builder()
            .max_capacity(budget)
            .weigher(|_, g: &Arc<Generation>| g.weight().min(u32::MAX as u64) as u32)
            .build();
        GenerationCache {
            inner: Arc::new(Loader {
                loc: loc.clone(),
                paths,
                schema,
                text,
                vector,
                concurrency: concurrency.max(1),
                budget,
                cold: ColdStore {
                    store: loc.store.clone(),
                    store_name: loc.display.clone(),
                    cache: blocks,
                    runtime: tokio::runtime::Handle::current(),
                    concurrency,
                    postings: PostingsCache::new(settings.cache_budgets().1),
                },
                small_rows,
                cache,
                decoding: Arc::new(tokio::sync::Semaphore::new(
                    std::thread::available_parallelism().map_or(1, |n| n.get()),
                )),
                retired: Default::default(),
                pinned: Default::default(),
            }),
        }
    }

    /// The generations `metas` describes, in the same order: from the cache, or fetched and
    /// decoded concurrently. A generation whose object is missing, corrupt or disagrees with
    /// its `meta` is an error naming the object.
    pub(crate) async fn get_all(&self, metas: &[GenerationMeta]) -> Result<Vec<Arc<Generation>>> {
        let missed = std::sync::atomic::AtomicBool::new(false);
        let out = futures::stream::iter(metas.iter().cloned())
            .map(|meta| self.get(meta, &missed))
            .buffered(self.inner.concurrency)
            .try_collect()
            .await;
        if missed.load(std::sync::atomic::Ordering::Relaxed) {
            // Apply the evictions the new entries call for now, not at some later write.
            self.inner.cache.run_pending_tasks().await;
        }
        out
    }

    async fn get(
        &self,
        meta: GenerationMeta,
        missed: &std::sync::atomic::AtomicBool,
    ) -> Result<Arc<Generation>> {
        let key = (meta.id, meta.epoch);
        if let Some(g) = self.inner.cache.get(&key).await {
            return Ok(g);
        }
        missed.store(true, std::sync::atomic::Ordering::Relaxed);
        if self.is_retired(key) {
            // A query of an older list: it gets the generation, the cache does not keep it.
            return self.inner.load(meta).await;
        }
        let loader = self.inner.clone();
        let g = self
            .inner
            .cache
            .try_get_with(key, async move { loader.load(meta).await })
            .await
            .map_err(|e| (*e).clone())?;
        // Retired while it was fetched: out again.
        if self.is_retired(key) {
            self.inner.cache.invalidate(&key).await;
        }
        Ok(g)
    }

    /// Hold the generations `keys` (`(id, epoch)`) until the returned pins are dropped.
    pub(crate) fn pin(&self, keys: Vec<(u64, u64)>) -> Pins {
        Pins::new(&self.inner.pinned, keys)
    }

    /// Whether a point in time, or an opened copy of it that a query, a stream or the cache
    /// still holds, holds generation `id` of `epoch`.
    pub(crate) fn is_pinned(&self, id: u64, epoch: u64) -> bool {
        self.inner
            .pinned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains_key(&(id, epoch))
    }

    fn is_retired(&self, key: (u64, u64)) -> bool {
        self.inner
            .retired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys
            .contains(&key)
    }

    /// Those of the generations `metas` describes that the cache holds (nothing is fetched).
    pub(crate) async fn held(&self, metas: &[GenerationMeta]) -> Vec<Arc<Generation>> {
        let mut out = Vec::with_capacity(metas.len());
        for m in metas {
            if let Some(g) = self.inner.cache.get(&(m.id, m.epoch)).await {
                out.push(g);
            }
        }
        out
    }

    /// The generations `metas` describes when the cache holds every one of them (nothing is
    /// fetched).
    pub(crate) async fn cached(&self, metas: &[GenerationMeta]) -> Option<Vec<Arc<Generation>>> {
        let mut out = Vec::with_capacity(metas.len());
        for m in metas {
            out.push(self.inner.cache.get(&(m.id, m.epoch)).await?);
        }
        Some(out)
    }

    /// Put a generation this handle built and wrote (`object`, its bytes, checked again
    /// here) in the cache (unless it is retired), opened as a reader opens it (from its hot
    /// part, nothing fetched), and return it. A flush's (`flushed`) seeds its vectors too.
    pub(crate) async fn insert_built(
        &self,
        object: Bytes,
        flushed: bool,
    ) -> Result<Arc<Generation>> {
        let whole = Bundle::open(object.clone(), &"a generation just built")?;
        let meta = whole.stats().clone();
        // Its postings and positions (version 4), which the first searches of it will read,
        // and its vectors, which they re-rank from.
        let text: Vec<std::ops::Range<u64>> = Generation::cold_text(&whole)
            .filter_map(|n| whole.cold_range(n).ok())
            .collect();
        let vectors: Vec<std::ops::Range<u64>> = Generation::cold_vectors(&whole)
            .filter_map(|n| whole.cold_range(n).ok())
            .collect();
        let p = self.inner.paths.generation(meta.id, meta.epoch);
        let g = match meta.hot_offset {
            // Checked above, block by block: opened from that check.
            Some(_) => self.inner.open_checked(whole, &object, &p).await?,
            None => {
                drop(whole);
                self.inner.decode_whole(object.clone(), &p).await?
            }
        };
        // Its postings go to the block cache's memory, as written: a search of rows just
        // appended reads them without a request. Not when they would take more than a
        // quarter of its budget (a large merge's). A flush's vectors follow, within the same
        // quarter (a merge's would push out what searches use, for rows already searched).
        if let Some(cold) = g.cold_object() {
            let quarter = cold.cache_budget() / 4;
            let bytes = |ranges: &[std::ops::Range<u64>]| -> u64 {
                ranges.iter().map(|r| r.end - r.start).sum()
            };
            let (text_bytes, vector_bytes) = (bytes(&text), bytes(&vectors));
            if text_bytes <= quarter {
                for r in text {
                    cold.seed(&object, r);
                }
                if flushed && text_bytes + vector_bytes <= quarter {
                    for r in vectors {
                        cold.seed(&object, r);
                    }
                }
            }
        }
        // Held from deletion while it lives, as every copy the loader opens is.
        let pin = Pins::new(&self.inner.pinned, vec![(meta.id, meta.epoch)]);
        let g = Arc::new(g.holding(pin));
        self.insert(g.clone()).await;
        Ok(g)
    }

    /// Put a generation in the cache (unless it is retired).
    pub(crate) async fn insert(&self, g: Arc<Generation>) {
        if self.is_retired((g.meta().id, g.meta().epoch)) {
            return;
        }
        self.inner
            .cache
            .insert((g.meta().id, g.meta().epoch), g)
            .await;
        self.inner.cache.run_pending_tasks().await;
    }

    /// Drop a generation from the cache (queries holding it keep it).
    pub(crate) async fn remove(&self, id: u64, epoch: u64) {
        self.inner.cache.invalidate(&(id, epoch)).await;
        // The cache's bookkeeping holds the value until its pending tasks run.
        self.inner.cache.run_pending_tasks().await;
    }

    /// Drop a generation from the cache for good: no list of this handle will name it again
    /// (a compaction replaced it). A query of an older list that still asks for it fetches it
    /// without caching it, and a fetch under way when it is retired does not keep it either:
    /// otherwise it would stay until the byte budget evicts it.
    pub(crate) async fn retire(&self, id: u64, epoch: u64) {
        {
            let mut r = self.inner.retired.lock().unwrap_or_else(|e| e.into_inner());
            if r.keys.insert((id, epoch)) {
                r.order.push_back((id, epoch));
                if r.order.len() > RETIRED {
                    if let Some(old) = r.order.pop_front() {
                        r.keys.remove(&old);
                    }
                }
            }
        }
        self.remove(id, epoch).await;
    }

    /// What the cache holds (after applying pending evictions).
    pub(crate) async fn stats(&self) -> CacheStats {
        self.inner.cache.run_pending_tasks().await;
        let blocks = &self.inner.cold.cache;
        let b = blocks.stats();
        let (resident, rows) = self
            .inner
            .cache
            .iter()
            .fold((Resident::default(), 0u64), |(sum, rows), (_, g)| {
                (sum.add(g.resident()), rows + g.meta().rows)
            });
        CacheStats {
            generations: self.inner.cache.entry_count(),
            rows,
            bytes: self.inner.cache.weighted_size(),
            budget: self.inner.budget,
            block_bytes: blocks.memory_bytes(),
            blocks_read: b.blocks,
            block_memory_hits: b.blocks.saturating_sub(b.fetched + b.disk_hits),
            block_disk_hits: b.disk_hits,
            blocks_fetched: b.fetched,
            block_bytes_fetched: b.fetched_bytes,
            column_bytes: 0,
            postings_bytes: self.inner.cold.postings.bytes(),
            dead_row_terms_rows: 0,
            dead_row_terms_bytes: 0,
            term_entries: 0,
            resident,
        }
    }

    /// Stop the block cache, writing what its memory tier holds to its disk tier (when it
    /// has one) so that the next process finds it.
    pub(crate) async fn close(&self) -> Result<()> {
        self.inner.cold.cache.close().await
    }
}

impl Loader {
    async fn load(&self, meta: GenerationMeta) -> Result<Arc<Generation>> {
        let p = self.paths.generation(meta.id, meta.epoch);
        let g = match meta.hot_offset {
            Some(hot) => self.open_hot(&meta, hot, &p).await?,
            None => {
                let bytes = crate::storage::read_object(self.loc.store.as_ref(), &p).await?;
                self.decode_whole(bytes, &p).await?
            }
        };
        if g.meta() != &meta {
            return Err(Error::data(
                &p,
                "generation statistics differ from the manifest's record of it",
            ));
        }
        // Every copy holds its object until dropped: the cache may drop it while a query or a
        // stream reads on, and the writer only knows the copies its compactions read.
        let pin = Pins::new(&self.pinned, vec![(meta.id, meta.epoch)]);
        Ok(Arc::new(g.holding(pin)))
    }

    /// Whether a generation of `rows` rows keeps its vectors in memory.
    fn keeps_vectors(&self, rows: u64) -> bool {
        self.vector.is_some() && rows <= self.small_rows
    }

    /// A generation of version 1 or 2 decoded from its whole object, every row held, on a
    /// blocking thread.
    async fn decode_whole(&self, object: Bytes, p: &Path) -> Result<Generation> {
        self.on_blocking_thread(p, move |schema, spec, p| {
            Generation::decode(object, schema, spec, p)
        })
        .await
    }

    /// Run `make` (a decode or an open of the generation at `p`) with the index's schema and
    /// index specification on a blocking thread, once one of the cores is free of others.
    async fn on_blocking_thread(
        &self,
        p: &Path,
        make: impl FnOnce(&SchemaRef, IndexSpec<'_>, &Path) -> Result<Generation> + Send + 'static,
    ) -> Result<Generation> {
        let (schema, text, vector, p) = (
            self.schema.clone(),
            self.text.clone(),
            self.vector,
            p.clone(),
        );
        // The turn goes with the decode, which runs to its end even when the open that
        // waits for it is dropped.
        let turn = self
            .decoding
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::internal("the generation cache is closed"))?;
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let spec = IndexSpec {
                text: text.as_deref(),
                vector,
            };
            make(&schema, spec, &p)
        })
        .await?
    }

    /// Open a version-3 generation: its hot part in one ranged read (a small one that keeps
    /// its vectors: the whole object in one read).
    async fn open_hot(&self, meta: &GenerationMeta, hot: u64, p: &Path) -> Result<Generation> {
        if self.keeps_vectors(meta.rows) {
            let whole = crate::storage::read_object(self.loc.store.as_ref(), p).await?;
            return self.open_whole(whole, p).await;
        }
        if hot > meta.bytes {
            return Err(Error::data(
                p,
                "the manifest places the hot part past the object's end",
            ));
        }
        let bytes = self
            .loc
            .store
            .get_range(p, hot..meta.bytes)
            .await
            .map_err(|e| Error::store(p, e))?;
        if bytes.len() as u64 != meta.bytes - hot {
            return Err(Error::data(
                p,
                format!(
                    "generation is shorter than the {} bytes the manifest records",
                    meta.bytes
                ),
            ));
        }
        let bundle = Bundle::open_hot(bytes, meta.bytes, p)?;
        self.open_bundle(bundle, p, Held::default()).await
    }

    /// A version-3 generation from its whole object in memory: its hot part (copied, so that
    /// the object is not held), and its vectors when it keeps them.
    async fn open_whole(&self, object: Bytes, p: &Path) -> Result<Generation> {
        let whole = Bundle::open(object.clone(), p)?;
        self.open_checked(whole, &object, p).await
    }

    /// [`Loader::open_whole`] of `object` once [`Bundle::open`] has checked it (`whole`).
    async fn open_checked(&self, whole: Bundle, object: &Bytes, p: &Path) -> Result<Generation> {
        let meta = whole.stats().clone();
        let Some(hot) = meta.hot_offset else {
            return Err(Error::data(p, "generation has no hot part"));
        };
        let held = match self.keeps_vectors(meta.rows) {
            true => Generation::held_parts(&whole)?,
            false => Held::default(),
        };
        drop(whole);
        let part = Bytes::copy_from_slice(&object[hot as usize..]);
        let bundle = Bundle::open_hot(part, meta.bytes, p)?;
        self.open_bundle(bundle, p, held).await
    }

    /// The generation of a checked hot part (nothing else is read), holding `held` of its
    /// cold part.
    async fn open_bundle(&self, bundle: Bundle, p: &Path, held: Held) -> Result<Generation> {
        let cold = ColdObject::new(
            &self.cold,
            p.clone(),
            bundle.len() as u64,
            bundle.hot_offset(),
            bundle.block_crcs().into(),
        );
        self.on_blocking_thread(p, move |schema, spec, p| {
            Generation::open(&bundle, cold, held, schema, spec, p)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::IndexSchema;
    use crate::storage::latency::{LatencyConfig, LatencyStore};
    use arrow::array::{ArrayRef, RecordBatch, StringArray};
    use object_store::ObjectStoreExt;
    use std::time::Duration;

    /// A cache over a store answering every read after 200 ms, holding generation 1.
    async fn cache_with_one_generation() -> (GenerationCache, GenerationMeta) {
        let s = IndexSchema::from_json(r#"{"primary_key": "id"}"#).unwrap();
        let keys: ArrayRef = Arc::new(StringArray::from(vec!["a", "b"]));
        let user = RecordBatch::try_new(s.arrow_schema(), vec![keys]).unwrap();
        let rows = s.to_stored(&user, 1).unwrap();
        let spec = IndexSpec {
            text: None,
            vector: None,
        };
        let (g, bytes) = Generation::build(1, 1, rows, &s.stored_schema(), spec, None, 1).unwrap();
        let memory: Arc<dyn object_store::ObjectStore> =
            Arc::new(object_store::memory::InMemory::new());
        let slow = LatencyStore::new(
            memory,
            LatencyConfig {
                read: Duration::from_millis(200),
                write: Duration::ZERO,
                bytes_per_second: None,
            },
        );
        let loc = Location::from_store(slow, "idx");
        let paths = Paths::new(loc.root.clone());
        loc.store
            .put(&paths.generation(1, 1), bytes.into())
            .await
            .unwrap();
        let blocks = BlockCache::open(&crate::storage::blocks::BlockCacheConfig {
            memory_bytes: 1 << 20,
            disk_bytes: 0,
            disk_dir: None,
            block_bytes: crate::format::bundle::BLOCK_BYTES,
            concurrency: 4,
        })
        .await
        .unwrap();
        let cache = GenerationCache::new(
            loc,
            paths,
            s.stored_schema(),
            None,
            None,
            &crate::Settings {
                io_concurrency: 4,
                hot_cache_bytes: 1 << 30,
                ..Default::default()
            },
            blocks,
        );
        (cache, g.meta().clone())
    }

    #[tokio::test]
    async fn a_retired_generation_is_fetched_but_never_cached_again() {
        let (cache, meta) = cache_with_one_generation().await;
        cache.get_all(std::slice::from_ref(&meta)).await.unwrap();
        assert_eq!(cache.stats().await.generations, 1);
        cache.retire(meta.id, meta.epoch).await;
        assert_eq!(cache.stats().await.generations, 0);
        // A query of an older list asks for it again.
        let again = cache.get_all(std::slice::from_ref(&meta)).await.unwrap();
        assert_eq!(again[0].meta(), &meta);
        assert_eq!(cache.stats().await.generations, 0, "not cached again");
    }

    #[tokio::test]
    async fn a_generation_retired_while_it_is_fetched_is_not_kept() {
        let (cache, meta) = cache_with_one_generation().await;
        let fetching = {
            let cache = cache.clone();
            let meta = meta.clone();
            tokio::spawn(async move { cache.get_all(&[meta]).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        cache.retire(meta.id, meta.epoch).await;
        let fetched = fetching.await.unwrap().unwrap();
        assert_eq!(fetched[0].meta(), &meta, "the query gets its generation");
        assert_eq!(
            cache.stats().await.generations,
            0,
            "the cache does not keep it"
        );
    }
}
