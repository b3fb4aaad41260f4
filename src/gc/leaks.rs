//! Leaks: what crashes, failed deletes and failed or fenced flushes leave behind.
//!
//! A writer runs one collection in the background right after its open has claimed the epoch.
//! At that point no older writer can publish anything again (every manifest version it could
//! write either exists or is detected as superseded), so the following are garbage:
//!
//! - rows objects of the WAL below the one the last flush kept (`wal_replay_from - 1`): their
//!   rows are in generations; the flush that freed them was cut off or its delete failed. Fence
//!   objects (52 bytes) are never deleted: a writer that stalled through any number of takeovers
//!   must still collide with the fence at the id it writes next;
//! - generation objects of an older epoch that no kept manifest version names: flushes and
//!   compactions that failed, crashed or were fenced before they published;
//! - generation objects of an older epoch that only older kept versions name (a compaction
//!   replaced them, and its writer closed or crashed before deleting them): deleted after
//!   [`crate::Settings::compaction_grace_ms`], as a compaction's replaced objects are;
//! - probe objects older than [`STALE`] by the store's clock: writers that crashed while
//!   opening (a young probe may belong to an open in progress);
//! - on a local directory, staging files (`<name>#<digits>`) older than [`STALE`]: PUTs cut off
//!   by a crash, which the store's LIST never shows.
//!
//! Generations of this writer's epoch are never touched (its flushes may be under way), nor is
//! anything a kept manifest version names (read-only handles may be reading it). Failures are
//! logged and left for the next open.

use super::Scope;
use crate::format::manifest::Manifest;
use crate::format::wal::FENCE_LEN;
use crate::manifest::delete_all;
use crate::storage::paths::{parse_generation, parse_manifest, parse_wal};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// Age past which a probe or a staging file is taken as left by a crash.
pub(crate) const STALE: Duration = Duration::from_secs(10 * 60);

/// A generation object only older kept manifest versions name: `(id, epoch, bytes)`.
pub(crate) type ReplacedObject = (u64, u64, u64);

/// Collect the leaks of an index whose writer (of epoch `scope.epoch`) just opened on
/// `manifest`. Returns the generation objects a compaction of an earlier writer replaced: they
/// are deleted after the grace period (see [`super::replaced`]).
pub(crate) async fn collect(scope: Scope<'_>, manifest: &Manifest) -> Vec<ReplacedObject> {
    let store = &scope.loc.store;
    let concurrency = scope.concurrency;
    let mut replaced = Vec::new();
    let mut doomed: Vec<Path> = Vec::new();

    let keep_wal_from = manifest.wal_replay_from.saturating_sub(1);
    match list(store, &scope.paths.wal_dir()).await {
        Ok(objects) => doomed.extend(
            objects
                .into_iter()
                // Fences are kept: a stalled writer's next PUT at that id must collide.
                .filter(|m| m.size > FENCE_LEN)
                .filter(|m| parse_wal(&m.location).is_some_and(|id| id < keep_wal_from))
                .map(|m| m.location),
        ),
        Err(e) => tracing::warn!("garbage collection: {e}"),
    }

    match named_generations(&scope, manifest).await {
        Ok(named) => match list(store, &scope.paths.generations_dir()).await {
            Ok(objects) => {
                let latest: HashSet<(u64, u64)> = manifest
                    .generations
                    .iter()
                    .map(|g| (g.id, g.epoch))
                    .collect();
                for m in objects {
                    let Some((id, epoch)) = parse_generation(&m.location) else {
                        continue;
                    };
                    if latest.contains(&(id, epoch)) || epoch >= scope.epoch {
                        continue;
                    }
                    if named.contains(&(id, epoch)) {
                        // Named by older kept versions only: replaced by a compaction whose
                        // writer closed or crashed before deleting it. It goes after the
                        // grace period, as the replaced generations of this writer do.
                        replaced.push((id, epoch, m.size));
                    } else {
                        doomed.push(m.location);
                    }
                }
            }
            Err(e) => tracing::warn!("garbage collection: {e}"),
        },
        Err(e) => tracing::warn!("garbage collection: cannot read the kept manifests: {e}"),
    }

    // Probes are aged by the store's clock, never this machine's: a local clock running ahead
    // would take a concurrent open's probe for a stale one, and that open would fail.
    let probes = match store_now(&scope, manifest).await {
        Ok(now) => list(store, &scope.paths.probe_dir())
            .await
            .map(|objects| (now.last_modified, objects)),
        Err(e) => Err(e),
    };
    match probes {
        Ok((now, objects)) => doomed.extend(
            objects
                .into_iter()
                .filter(|m| {
                    (now - m.last_modified)
                        .to_std()
                        .is_ok_and(|age| age > STALE)
                })
                .map(|m| m.location),
        ),
        Err(e) => tracing::warn!("garbage collection: {e}"),
    }

    if !doomed.is_empty() {
        tracing::info!("collecting {} leaked objects", doomed.len());
    }
    delete_all(store, doomed, concurrency).await;

    if let Some(dir) = scope.loc.local_dir.clone() {
        let root = scope.loc.root.parts().fold(dir, |d, p| d.join(p.as_ref()));
        let removed = tokio::task::spawn_blocking(move || remove_staging(&root)).await;
        match removed {
            Ok(0) => {}
            Ok(n) => tracing::info!("removed {n} stale local staging files"),
            Err(e) => tracing::warn!("garbage collection of staging files: {e}"),
        }
    }
    replaced
}

/// An object whose `last_modified` is the store's "now", by its own clock: the manifest
/// version this open created, or, when that version was pruned already (a retention of 0, a
/// flush or a newer writer moving on), the newest version.
async fn store_now(scope: &Scope<'_>, claimed: &Manifest) -> crate::Result<ObjectMeta> {
    let store = &scope.loc.store;
    let path = scope.paths.manifest(claimed.version);
    match store.head(&path).await {
        Ok(meta) => return Ok(meta),
        Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(crate::Error::store(&path, e)),
    }
    let latest = scope
        .manifests
        .latest_version()
        .await?
        .ok_or_else(|| crate::Error::internal("the index has no manifest version left"))?;
    let path = scope.paths.manifest(latest);
    store
        .head(&path)
        .await
        .map_err(|e| crate::Error::store(&path, e))
}

async fn list(store: &Arc<dyn ObjectStore>, dir: &Path) -> crate::Result<Vec<ObjectMeta>> {
    store
        .list(Some(dir))
        .try_collect()
        .await
        .map_err(|e| crate::Error::store(dir, e))
}

/// The (id, epoch) of every generation a kept manifest version names.
async fn named_generations(
    scope: &Scope<'_>,
    latest: &Manifest,
) -> crate::Result<HashSet<(u64, u64)>> {
    let mut named: HashSet<(u64, u64)> =
        latest.generations.iter().map(|g| (g.id, g.epoch)).collect();
    let versions: Vec<u64> = list(&scope.loc.store, &scope.paths.manifest_dir())
        .await?
        .iter()
        .filter_map(|m| parse_manifest(&m.location))
        .filter(|v| *v != latest.version)
        .collect();
    for v in versions {
        match scope.manifests.read(v).await {
            Ok(m) => named.extend(m.generations.iter().map(|g| (g.id, g.epoch))),
            // Pruned meanwhile.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(named)
}

/// Remove staging files older than [`STALE`] in the index's folders; returns how many.
fn remove_staging(root: &std::path::Path) -> usize {
    let mut removed = 0;
    let dirs = ["", "wal", "generations", "manifest", "probe"];
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(root.join(d)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let staging = name
                .rsplit_once('#')
                .is_some_and(|(_, s)| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
            if !staging {
                continue;
            }
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE);
            if old && std::fs::remove_file(e.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}
