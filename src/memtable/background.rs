//! The memtable's background work: a thread that inserts the rows the vector graph lags
//! behind on, and between its chunks tokenizes the rows past the text index's last commit and
//! commits it when due, so that neither appends nor searches pay for indexing.

use super::Memtable;
use std::sync::{Arc, RwLock};

/// A memtable shared by the writer, the flusher and searches.
pub(crate) type SharedMemtable = Arc<RwLock<Memtable>>;

/// Read access to a shared memtable (a panic elsewhere never poisons it for good).
pub(crate) fn read_memtable(m: &SharedMemtable) -> std::sync::RwLockReadGuard<'_, Memtable> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

/// Write access to a shared memtable.
pub(crate) fn write_memtable(m: &SharedMemtable) -> std::sync::RwLockWriteGuard<'_, Memtable> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// When the memtable's vector graph lags behind its rows and no inserter runs, start one on
/// a thread of its own: it inserts the rows in chunks until it has caught up (catching the
/// text index up between chunks), and stops early once the memtable is gone (flushed and
/// dropped by every search).
pub(crate) fn catch_up(mem: &SharedMemtable) {
    let Some(graph) = read_memtable(mem).graph_behind() else {
        return;
    };
    if graph.running() {
        return;
    }
    let weak = Arc::downgrade(mem);
    let spawned = std::thread::Builder::new()
        .name("lsmsearch-memgraph".into())
        .spawn(move || {
            crate::priority::nice_priority();
            loop {
                let Some(_role) = graph.try_start() else {
                    return;
                };
                let Some(mem) = weak.upgrade() else {
                    return;
                };
                let (batches, offsets, rows) = read_memtable(&mem).batches();
                let text = read_memtable(&mem).text();
                drop(mem);
                // Between graph chunks the text index catches up with every row applied so far
                // once full-text searches read this memtable and enough rows wait for it, so a
                // search rarely finds more than a few thousand rows past the last commit.
                let between = || {
                    let Some(mem) = weak.upgrade() else {
                        return false;
                    };
                    if let Some(text) = text.as_ref().filter(|t| t.searched()) {
                        let (batches, _, rows) = read_memtable(&mem).batches();
                        // Rows past the commit are tokenized here, off the searches' path.
                        let caught_up = text
                            .commit_due(&batches, rows)
                            .and_then(|()| text.extend_tail(&batches, rows));
                        if let Err(e) = caught_up {
                            tracing::warn!("memtable text index catch-up failed: {e}");
                        }
                    }
                    true
                };
                graph.catch_up(&batches, &offsets, rows, &between);
                drop(_role);
                // Rows applied while this pass ran: go on unless another inserter takes over.
                let behind = weak
                    .upgrade()
                    .is_some_and(|m| graph.coverable(read_memtable(&m).rows()) > graph.indexed());
                if !behind {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("could not start the memtable graph inserter: {e}");
    }
}
