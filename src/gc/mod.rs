//! Garbage collection: deleting the objects no manifest version needs any more.
//!
//! - [`leaks`]: what crashes, failed deletes and failed or fenced flushes left behind, collected
//!   once by each writer right after its open;
//! - [`replaced`]: the generations a compaction replaced, deleted once their grace period has
//!   passed and no query of the handle reads them;
//! - [`wal`]: the WAL objects a flush covered;
//! - [`discard`]: a merged generation that no manifest names, nor may.
//!
//! Collection is given the store, the paths, the manifests and the generation cache it works on
//! (a [`Scope`]), never a writer's state: the writer decides when it runs.

pub(crate) mod leaks;
pub(crate) mod replaced;
pub(crate) mod wal;

use crate::generation::cache::GenerationCache;
use crate::manifest::{delete_all, ManifestStore};
use crate::storage::paths::Paths;
use crate::storage::Location;

/// What a collection works on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scope<'a> {
    pub(crate) loc: &'a Location,
    pub(crate) paths: &'a Paths,
    pub(crate) manifests: &'a ManifestStore,
    /// The epoch of the writer collecting: its own generations are never touched.
    pub(crate) epoch: u64,
    /// Deletes in flight at once.
    pub(crate) concurrency: usize,
}

/// Delete generation `(id, epoch)` now, and drop it from `cache`: a merged generation of a
/// compaction that published nothing, which no manifest names, nor may. (Left alone, the next
/// open would collect it as a leak.)
pub(crate) async fn discard(
    loc: &Location,
    paths: &Paths,
    cache: &GenerationCache,
    (id, epoch): (u64, u64),
) {
    cache.remove(id, epoch).await;
    delete_all(&loc.store, vec![paths.generation(id, epoch)], 1).await;
}
