//! Publication: the one way a flush or a compaction makes a new manifest version.
//!
//! Under [`super::Publisher::lock`], a publish computes the next version from the latest one
//! this writer installed, creates it with a conditional PUT ([`publish`]), installs it, and
//! then moves LATEST and prunes old versions ([`clean_up_manifests`]). A PUT that reports an
//! error may have landed, or may still: a flush's retry looks for its own earlier attempt, and
//! a compaction's manifest is recorded as [`super::Unsure`] and settled ([`settle`]) before anything
//! else is published.

use super::Writer;
use crate::format::manifest::Manifest;
use crate::manifest::WriteOutcome;
use crate::{Error, Result};
use std::sync::atomic::Ordering;

/// Fail as fenced when a manifest version newer than `version` (one this writer created)
/// exists. A newer writer claims a version when it opens and may prune the older ones; a
/// stalled writer's PUT can then re-create a pruned version, and succeed. Such a version is
/// not this writer's to build on: adopting it would delete WAL objects the newer writer
/// replays from, and installing a compaction's would delete generations its list names.
pub(crate) async fn fenced_if_superseded(w: &Writer, version: u64) -> Result<()> {
    if w.manifests
        .latest_version()
        .await?
        .is_some_and(|v| v > version)
    {
        return Err(w.fenced_error());
    }
    Ok(())
}

/// Before a publish (under the publish lock): settle the compaction manifest whose PUT
/// reported an error. While its version is the next one it may still land (a PUT completing
/// late), and nothing else may be published at that version meanwhile, so its outcome is made
/// certain here: it is written again (a conditional create: whichever of the two PUTs lands
/// first makes the version this manifest) and installed. A flush's earlier attempt of this
/// writer may hold the version instead (the compaction then published nothing); otherwise
/// only a newer writer can, and then this writer is fenced.
pub(crate) async fn settle(w: &Writer) -> Result<()> {
    let unsure = w.publisher.unsure().clone();
    let Some(unsure) = unsure else {
        return Ok(());
    };
    let m = unsure.manifest.clone();
    if m.version <= w.read_state().manifest.version {
        // That version is taken: this manifest can never land.
        *w.publisher.unsure() = None;
        return Ok(());
    }
    // Written again: a conditional create either makes the version this manifest or finds it
    // taken (by this manifest, its PUT having landed, or by another).
    let taker = match w.manifests.write(&m).await? {
        WriteOutcome::Written => Taker::Same,
        WriteOutcome::Conflict => taken_by(w, &m).await?,
    };
    if let Taker::ThisWriter = taker {
        // A flush's earlier attempt (its PUT reported an error, and landed) holds the version:
        // the compaction published nothing, and the flush's retry adopts that manifest.
        tracing::info!(
            "manifest {} of a compaction did not land: a flush's earlier attempt holds it",
            m.version
        );
        *w.publisher.unsure() = None;
        unsure.given_up(w).await;
        return Ok(());
    }
    fenced_if_superseded(w, m.version).await?;
    tracing::info!(
        "manifest {} of a compaction settled as published",
        m.version
    );
    install(w, m);
    *w.publisher.unsure() = None;
    // Its run is replaced like any compaction's: deleted after the grace period.
    unsure.published(w);
    Ok(())
}

/// How a publish of this writer ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Published {
    /// The version is this manifest.
    Ours,
    /// The version holds another manifest of this writer: an earlier attempt of a flush whose
    /// PUT reported an error and landed (its retry adopts it). Nothing was published.
    Taken,
}

/// Create manifest version `next.version` (the version after this writer's latest, with any
/// unsure compaction manifest settled). A fenced error when a newer writer owns the index; any
/// other error leaves the outcome unknown (the PUT may have landed, or may still).
pub(crate) async fn publish(w: &Writer, next: &Manifest) -> Result<Published> {
    match w.manifests.write(next).await? {
        // Created, but a newer version may exist: a newer writer pruned this one after moving
        // past it, and this writer (stalled) re-created it. Then it is fenced, and must neither
        // clean up nor move LATEST.
        WriteOutcome::Written => {
            fenced_if_superseded(w, next.version).await?;
            Ok(Published::Ours)
        }
        WriteOutcome::Conflict => match taken_by(w, next).await? {
            // A PUT retried inside the store client after its first try landed: ours.
            Taker::Same => {
                fenced_if_superseded(w, next.version).await?;
                Ok(Published::Ours)
            }
            Taker::ThisWriter => Ok(Published::Taken),
        },
    }
}

/// Make `m` (published) the manifest reads see.
pub(crate) fn install(w: &Writer, m: Manifest) {
    w.write_state().manifest = m;
}

/// Who holds version `m.version`, which a PUT of `m` found taken.
enum Taker {
    /// `m` itself.
    Same,
    /// Another manifest of this writer's epoch.
    ThisWriter,
}

/// Who holds version `m.version`: `m`, or another manifest of this writer; fenced when a newer
/// writer does.
async fn taken_by(w: &Writer, m: &Manifest) -> Result<Taker> {
    match w.manifests.read(m.version).await {
        Ok(held) if &held == m => return Ok(Taker::Same),
        // This writer's, unless a newer writer moved past it (and this writer, stalled,
        // re-created a version it had pruned).
        Ok(held) if held.epoch == w.epoch => {
            fenced_if_superseded(w, m.version).await?;
            return Ok(Taker::ThisWriter);
        }
        Ok(_) => {}
        // Pruned since the conflict: a newer writer moved on (the check below tells).
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    let latest = w.manifests.load_latest().await?;
    Err(match latest {
        Some(l) if l.epoch > w.epoch => w.fenced_error(),
        _ => Error::internal(format!(
            "manifest version {} was created by another handle than this writer (epoch {})",
            m.version, w.epoch
        )),
    })
}

/// At `close()`, once the compactor was stopped (maybe in the midst of publishing) and the
/// flusher has finished: what the next publish would do, best effort. A compaction's manifest
/// whose PUT may have landed is settled ([`settle`]), and the installed version is cleaned up
/// after ([`clean_up_manifests`]) when its clean-up did not run to its end. Nothing when a
/// newer writer took over, or while a `compact()` holds the publish lock.
pub(crate) async fn finish_cut_off(w: &Writer) {
    if w.fenced.load(Ordering::SeqCst) {
        return;
    }
    // A `compact()` under way holds the lock: it settles and cleans up after itself (or,
    // dropped, leaves both to the next publish or open). close() does not wait for it.
    let Ok(_publish) = w.publisher.lock.try_lock() else {
        return;
    };
    if let Err(e) = settle(w).await {
        tracing::warn!("closing: a compaction's manifest was not settled: {e}");
        return;
    }
    let installed = w.read_state().manifest.clone();
    if installed.version <= w.publisher.cleaned_up.load(Ordering::SeqCst) {
        return;
    }
    match fenced_if_superseded(w, installed.version).await {
        Ok(()) => clean_up_manifests(w, &installed).await,
        Err(e) => tracing::info!("closing: old manifests left to the newer writer: {e}"),
    }
}

/// Move LATEST to `m` and prune manifest versions beyond the retention (best effort).
pub(crate) async fn clean_up_manifests(w: &Writer, m: &Manifest) {
    let settings = &w.reader.settings;
    let version = m.version;
    w.manifests.publish_hint(m).await;
    if version > settings.manifest_retention {
        w.manifests
            .prune(
                version,
                settings.manifest_retention,
                settings.io_concurrency,
            )
            .await;
    }
    w.publisher.cleaned_up.fetch_max(version, Ordering::SeqCst);
}
