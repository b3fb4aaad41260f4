//! The generation cache of a handle: decoded generations (rows, key hashes, text index,
//! vector graph) by id, within a byte budget
//! ([`crate::Settings::cache_bytes`]).
//!
//! Every generation a query needs is fetched through [`GenerationCache::get_all`]: hits cost
//! nothing, misses are fetched and decoded concurrently (at most
//! [`crate::Settings::io_concurrency`] at once, all issued before any is awaited), and two
//! queries missing the same generation share one fetch. A flush puts the generation it built
//! into the cache, so a writer never reads back what it wrote while the budget holds it. When
//! the decoded generations outgrow the budget, the least recently and least frequently used
//! are dropped; a query holding one keeps it alive until it finishes.

use super::{Generation, IndexSpec};
use crate::format::GenerationMeta;
use crate::schema::Metric;
use crate::settings::GraphParams;
use crate::storage::paths::Paths;
use crate::storage::Location;
use crate::text::TextSchema;
use crate::{Error, Result};
use arrow::datatypes::SchemaRef;
use futures::{StreamExt, TryStreamExt};
use std::sync::Arc;

/// What a cache holds right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Generations held.
    pub generations: u64,
    /// Their weight in bytes (see [`Generation::weight`]).
    pub bytes: u64,
    /// The budget.
    pub budget: u64,
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
    cache: moka::future::Cache<(u64, u64), Arc<Generation>>,
}

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
        concurrency: usize,
        budget: u64,
    ) -> Self {
        let cache = moka::future::Cache::builder()
            .max_capacity(budget)
            .weigher(|_, g: &Arc<Generation>| g.weight().min(u32::MAX as u64) as u32)
            .build();
        GenerationCache {
            inner: Arc::new(Loader {
                loc,
                paths,
                schema,
                text,
                vector,
                concurrency: concurrency.max(1),
                budget,
                cache,
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
        let loader = self.inner.clone();
        self.inner
            .cache
            .try_get_with(key, async move { loader.load(meta).await })
            .await
            .map_err(|e| (*e).clone())
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

    /// Put a generation this handle built in the cache.
    pub(crate) async fn insert(&self, g: Arc<Generation>) {
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

    /// What the cache holds (after applying pending evictions).
    pub(crate) async fn stats(&self) -> CacheStats {
        self.inner.cache.run_pending_tasks().await;
        CacheStats {
            generations: self.inner.cache.entry_count(),
            bytes: self.inner.cache.weighted_size(),
            budget: self.inner.budget,
        }
    }
}

impl Loader {
    async fn load(&self, meta: GenerationMeta) -> Result<Arc<Generation>> {
        let p = self.paths.generation(meta.id, meta.epoch);
        let bytes = crate::storage::read_object(self.loc.store.as_ref(), &p).await?;
        let schema = self.schema.clone();
        let text = self.text.clone();
        let vector = self.vector;
        let p2 = p.clone();
        let g = tokio::task::spawn_blocking(move || {
            let spec = IndexSpec {
                text: text.as_deref(),
                vector,
            };
            Generation::decode(bytes, &schema, spec, &p2)
        })
        .await??;
        if g.meta() != &meta {
            return Err(Error::data(
                &p,
                "generation statistics differ from the manifest's record of it",
            ));
        }
        Ok(Arc::new(g))
    }
}
