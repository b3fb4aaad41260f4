//! Decoded columns of generations that filters read, kept between queries within a byte
//! budget ([`crate::Settings::column_cache_bytes`]): a filtered query over a version-3
//! generation reads the columns its filter names from the object (through the block cache)
//! and decodes them; the next query with a filter on the same columns finds them decoded.

use super::source::key_of;
use crate::generation::Generation;
use crate::Result;
use arrow::array::{Array, ArrayRef};
use std::sync::Arc;

/// Decoded columns by (generation, stored column), within a byte budget.
pub(crate) struct ColumnCache {
    cache: moka::sync::Cache<(u64, u64, usize), ArrayRef>,
}

impl std::fmt::Debug for ColumnCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ColumnCache({} columns)", self.cache.entry_count())
    }
}

impl Default for ColumnCache {
    fn default() -> Self {
        ColumnCache::new(crate::Settings::default().column_cache_bytes)
    }
}

impl ColumnCache {
    /// A cache of at most `budget` bytes of decoded columns.
    pub(crate) fn new(budget: u64) -> Self {
        ColumnCache {
            cache: moka::sync::Cache::builder()
                .max_capacity(budget)
                .weigher(|_, a: &ArrayRef| {
                    u32::try_from(a.get_array_memory_size()).unwrap_or(u32::MAX)
                })
                .build(),
        }
    }

    /// Columns `cols` of every row of each of `gens`, in order: decoded ones from the cache,
    /// the others read (every generation concurrently, driven from this query or blocking
    /// thread) and kept.
    pub(crate) fn read(
        &self,
        gens: &[&Arc<Generation>],
        cols: &[usize],
    ) -> Result<Vec<Vec<ArrayRef>>> {
        Generation::block_on_any(gens.iter().copied(), self.read_async(gens, cols))
            .unwrap_or(Ok(Vec::new()))
    }

    /// [`ColumnCache::read`], awaited.
    pub(crate) async fn read_async(
        &self,
        gens: &[&Arc<Generation>],
        cols: &[usize],
    ) -> Result<Vec<Vec<ArrayRef>>> {
        let key = |g: &Generation, c: usize| {
            let (id, epoch) = key_of(g);
            (id, epoch, c)
        };
        let cached: Vec<Option<Vec<ArrayRef>>> = gens
            .iter()
            .map(|g| cols.iter().map(|c| self.cache.get(&key(g, *c))).collect())
            .collect();
        let missing: Vec<&Arc<Generation>> = gens
            .iter()
            .zip(&cached)
            .filter(|(_, c)| c.is_none())
            .map(|(g, _)| *g)
            .collect();
        let mut read = futures::future::try_join_all(missing.iter().map(|g| g.read_all(cols)))
            .await?
            .into_iter();
        let mut out = Vec::with_capacity(gens.len());
        for (g, c) in gens.iter().zip(cached) {
            match c {
                Some(c) => out.push(c),
                None => {
                    let columns = read
                        .next()
                        .ok_or_else(|| crate::Error::internal("a generation's columns missing"))?;
                    // Only what reading by range costs is kept: a generation held whole has them.
                    if g.reads_by_range() {
                        for (c, a) in cols.iter().zip(&columns) {
                            self.cache.insert(key(g, *c), a.clone());
                        }
                    }
                    out.push(columns);
                }
            }
        }
        Ok(out)
    }

    /// Drop the columns of generations `keep` says no to.
    pub(crate) fn retain(&self, keep: impl Fn(u64, u64) -> bool) {
        let gone: Vec<(u64, u64, usize)> = self
            .cache
            .iter()
            .map(|(k, _)| *k)
            .filter(|(id, epoch, _)| !keep(*id, *epoch))
            .collect();
        for k in gone {
            self.cache.invalidate(&k);
        }
    }

    /// Bytes of decoded columns held.
    pub(crate) fn bytes(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.weighted_size()
    }
}
