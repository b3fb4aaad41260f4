//! WAL objects a flush covered.
//!
//! Their rows are in the flushed generation once its manifest is published. Fence objects are
//! never deleted: a fenced writer's next WAL PUT targets the id of the fence that fenced it,
//! and must collide with it however long that writer stalls (deleting the fence would let it
//! write below the replay point: acknowledged, never replayed).
//!
//! The last object a flush covers is kept until the next flush: a reader that read the previous
//! manifest and lists the WAL from its replay point after this cleanup then finds a gap before
//! the kept object (or the kept object itself, at the replay point) and starts over on the new
//! manifest, instead of seeing the old generations without these rows.

use crate::manifest::delete_all;
use crate::storage::paths::Paths;
use crate::storage::Location;
use std::sync::Mutex;

/// The WAL object the previous flush kept.
#[derive(Debug)]
pub(crate) struct KeptWal {
    kept: Mutex<Option<u64>>,
}

impl KeptWal {
    /// `kept`: the object the previous writer's last flush kept (the last one below the replay
    /// point, always a rows object), deleted by this writer's first flush.
    pub(crate) fn new(kept: Option<u64>) -> KeptWal {
        KeptWal {
            kept: Mutex::new(kept),
        }
    }

    /// After a flush covering WAL objects `covered` (ascending) is published: delete them but
    /// the last, which is kept until the next flush, and the one the previous flush kept. Best
    /// effort: what is left is collected by the next open (see [`super::leaks`]).
    pub(crate) async fn after_flush(
        &self,
        loc: &Location,
        paths: &Paths,
        covered: &[u64],
        concurrency: usize,
    ) {
        let mut doomed: Vec<u64> = covered.split_last().map_or(&[][..], |(_, r)| r).to_vec();
        {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            doomed.extend(kept.take());
            *kept = covered.last().copied();
        }
        let wal = doomed.iter().map(|id| paths.wal(*id)).collect();
        delete_all(&loc.store, wal, concurrency).await;
    }
}
