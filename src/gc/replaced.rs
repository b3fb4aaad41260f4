//! Generations a compaction replaced: kept for [`crate::Settings::compaction_grace_ms`] and as
//! long as a query of this handle reads them, then deleted. Read-only handles refresh onto the
//! new list when a generation they planned with is gone, and queries planned on an older
//! manifest finish.

use crate::format::GenerationMeta;
use crate::generation::cache::GenerationCache;
use crate::generation::Generation;
use crate::manifest::delete_all;
use crate::storage::paths::Paths;
use crate::storage::Location;
use std::sync::{Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// A generation a compaction replaced, waiting for its grace period and its last reader.
#[derive(Debug)]
struct Entry {
    meta: GenerationMeta,
    since: Instant,
    /// The decoded generation, while anything holds it.
    generation: Weak<Generation>,
}

/// The replaced generations awaiting deletion.
#[derive(Debug, Default)]
pub(crate) struct ReplacedGenerations {
    entries: Mutex<Vec<Entry>>,
}

impl ReplacedGenerations {
    fn entries(&self) -> MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Generations `run` (`inputs`, the decoded ones this handle holds) were replaced now.
    pub(crate) fn add(
        &self,
        run: &[GenerationMeta],
        inputs: impl Iterator<Item = Weak<Generation>>,
    ) {
        let now = Instant::now();
        self.entries()
            .extend(run.iter().zip(inputs).map(|(meta, g)| Entry {
                meta: meta.clone(),
                since: now,
                generation: g,
            }));
    }

    /// Objects an open found replaced by an earlier writer's compaction (`(id, epoch, bytes)`,
    /// see [`super::leaks::collect`]): deleted after the grace period, as this writer's are.
    pub(crate) fn add_found(&self, objects: &[super::leaks::ReplacedObject]) {
        let now = Instant::now();
        self.entries()
            .extend(objects.iter().map(|&(id, epoch, bytes)| Entry {
                meta: GenerationMeta {
                    id,
                    epoch,
                    rows: 0,
                    tombstones: 0,
                    bytes,
                    min_seq: 0,
                    max_seq: 0,
                    flushes: 1,
                    hot_offset: None,
                },
                since: now,
                generation: Weak::new(),
            }));
    }

    /// Bytes of the objects awaiting deletion.
    pub(crate) fn bytes(&self) -> u64 {
        self.entries().iter().map(|e| e.meta.bytes).sum()
    }

    /// Delete the objects whose grace period has passed and that no query of this handle
    /// still reads; they leave `cache` for good first.
    pub(crate) async fn delete_due(
        &self,
        loc: &Location,
        paths: &Paths,
        cache: &GenerationCache,
        grace: Duration,
        concurrency: usize,
    ) {
        let due: Vec<GenerationMeta> = self
            .entries()
            .iter()
            .filter(|r| r.since.elapsed() >= grace)
            .map(|r| r.meta.clone())
            .collect();
        if due.is_empty() {
            return;
        }
        // Out of the cache for good first: then only queries hold them.
        for m in &due {
            cache.retire(m.id, m.epoch).await;
        }
        let doomed: Vec<GenerationMeta> = {
            let mut entries = self.entries();
            let mut doomed = Vec::new();
            entries.retain(|r| {
                let free = r.since.elapsed() >= grace
                    && r.generation.strong_count() == 0
                    && !cache.is_pinned(r.meta.id, r.meta.epoch);
                if free {
                    doomed.push(r.meta.clone());
                }
                !free
            });
            doomed
        };
        let paths = doomed
            .iter()
            .map(|m| paths.generation(m.id, m.epoch))
            .collect();
        delete_all(&loc.store, paths, concurrency).await;
    }
}
