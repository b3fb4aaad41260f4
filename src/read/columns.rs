//! Decoded columns of generations that filters read, and which rows of a generation each
//! filter passes, kept between queries within a byte budget
//! ([`crate::Settings::column_cache_bytes`]): a filtered query over a version-3 generation
//! reads the columns its filter names from the object (through the block cache) and decodes
//! them; the next query with a filter on the same columns finds them decoded, and the next
//! with the same filter finds which rows pass (a generation never changes, so neither do
//! they), as Lucene's query cache keeps a filter's matches per segment.

use super::source::{key_of, SourceKey};
use crate::generation::Generation;
use crate::Result;
use arrow::array::{Array, ArrayRef};
use std::sync::Arc;

/// Bytes a kept filter result costs besides its rows and text (its key, value and the
/// cache's bookkeeping).
const ENTRY_BYTES: usize = 128;

/// What is kept of a generation `(id, epoch)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Kept {
    /// A stored column, decoded.
    Column(u64, u64, usize),
    /// Which rows a filter (its text, see [`super::Filter`]) passes.
    Passes(u64, u64, Arc<str>),
}

impl Kept {
    fn generation(&self) -> (u64, u64) {
        match self {
            Kept::Column(id, epoch, _) | Kept::Passes(id, epoch, _) => (*id, *epoch),
        }
    }
}

/// A kept value.
#[derive(Debug, Clone)]
enum Held {
    Column(ArrayRef),
    Passes(Arc<Vec<bool>>),
}

/// Decoded columns by (generation, stored column) and filters' passing rows by (generation,
/// filter), within a byte budget.
pub(crate) struct ColumnCache {
    cache: moka::sync::Cache<Kept, Held>,
}

impl std::fmt::Debug for ColumnCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ColumnCache({} entries)", self.cache.entry_count())
    }
}

impl Default for ColumnCache {
    fn default() -> Self {
        ColumnCache::new(crate::Settings::default().column_cache_bytes)
    }
}

impl ColumnCache {
    /// Whether a column of `bytes` decoded, summed over every generation a query reads it
    /// of, is small enough to be read whole and kept: at most a quarter of the budget, so
    /// that a few such columns fit beside each other. A larger one would be read whole again
    /// at every query the cache could not keep it for.
    pub(crate) fn keeps_whole(&self, bytes: u64) -> bool {
        self.cache
            .policy()
            .max_capacity()
            .is_some_and(|budget| bytes <= budget / 4)
    }

    /// A cache of at most `budget` bytes of decoded columns and passing rows.
    pub(crate) fn new(budget: u64) -> Self {
        ColumnCache {
            cache: moka::sync::Cache::builder()
                .max_capacity(budget)
                .weigher(|k: &Kept, h: &Held| {
                    // A filter's text counts with each generation's entry it keys: a long one
                    // (a list of thousands of ids) may outweigh the rows it passes.
                    let bytes = match (k, h) {
                        (_, Held::Column(a)) => a.get_array_memory_size(),
                        (Kept::Passes(.., text), Held::Passes(p)) => {
                            p.capacity() + text.len() + ENTRY_BYTES
                        }
                        (Kept::Column(..), Held::Passes(p)) => p.capacity() + ENTRY_BYTES,
                    };
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .build(),
        }
    }

    /// The rows of generation `g` that the filter `key` passes, when kept.
    pub(crate) fn passes(&self, g: &Generation, key: &Arc<str>) -> Option<Arc<Vec<bool>>> {
        let (id, epoch) = key_of(g);
        match self.cache.get(&Kept::Passes(id, epoch, key.clone())) {
            Some(Held::Passes(p)) => Some(p),
            _ => None,
        }
    }

    /// Keep `passes`, the rows of generation `g` that the filter `key` passes.
    pub(crate) fn keep_passes(&self, g: &Generation, key: &Arc<str>, passes: Arc<Vec<bool>>) {
        let (id, epoch) = key_of(g);
        self.cache
            .insert(Kept::Passes(id, epoch, key.clone()), Held::Passes(passes));
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
            Kept::Column(id, epoch, c)
        };
        let cached: Vec<Option<Vec<ArrayRef>>> = gens
            .iter()
            .map(|g| {
                cols.iter()
                    .map(|c| match self.cache.get(&key(g, *c)) {
                        Some(Held::Column(a)) => Some(a),
                        _ => None,
                    })
                    .collect()
            })
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
                            self.cache.insert(key(g, *c), Held::Column(a.clone()));
                        }
                    }
                    out.push(columns);
                }
            }
        }
        Ok(out)
    }

    /// Drop what is kept of generations other than `gens` (sorted).
    pub(crate) fn retain(&self, gens: &[SourceKey]) {
        let gone: Vec<Kept> = self
            .cache
            .iter()
            .map(|(k, _)| (*k).clone())
            .filter(|k| {
                let (id, epoch) = k.generation();
                gens.binary_search(&SourceKey::Generation(id, epoch))
                    .is_err()
            })
            .collect();
        for k in gone {
            self.cache.invalidate(&k);
        }
    }

    /// Bytes of decoded columns and passing rows held.
    pub(crate) fn bytes(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.weighted_size()
    }
}
