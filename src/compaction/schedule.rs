//! Scheduling: the background compactor, which merges what the policy picks after each flush
//! and deletes replaced generations once they are due.

use super::job::{compact_once, Pick};
use crate::writer::{is_fenced, Writer};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Delete the objects of replaced generations whose grace period has passed and that no query
/// of this handle still reads.
pub(crate) async fn delete_replaced(w: &Writer) {
    let s = &w.reader.settings;
    w.compaction
        .replaced
        .delete_due(
            &w.loc,
            &w.paths,
            &w.reader.generations,
            Duration::from_millis(s.compaction_grace_ms),
            s.io_concurrency,
        )
        .await;
}

/// The background compactor: after each flush (and every second, for deletions due), merge
/// what the policy picks, one compaction at a time.
pub(crate) async fn run_compactor(w: Arc<Writer>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let woken = w.compaction.wake.notified();
        if w.fenced.load(Ordering::SeqCst) || w.closed.load(Ordering::SeqCst) {
            return;
        }
        delete_replaced(&w).await;
        if w.reader.settings.compaction {
            match compact_once(&w, Pick::Policy).await {
                // More may be due (a merge can complete a run one level up).
                Ok(Some(_)) => continue,
                Ok(None) => backoff = Duration::from_secs(1),
                Err(e) => {
                    tracing::warn!("compaction failed: {e}");
                    if is_fenced(&e) {
                        w.mark_fenced();
                        return;
                    }
                    w.compaction.telemetry().last_error = Some(e);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            }
        }
        tokio::select! {
            _ = woken => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
