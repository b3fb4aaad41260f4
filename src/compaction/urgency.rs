//! Urgency: the priority a compaction runs at.
//!
//! A compaction runs at the background's priority ([`crate::priority`]) unless it is urgent:
//! asked for by `compact()`, or started one flush short of
//! [`crate::Settings::compaction_max_generations`] (where flushes, and then appends, wait for
//! it). One that became urgent while it ran is raised to the foreground's priority from where
//! it is ([`raise_if_due`]).

use crate::priority::Raisable;
use crate::writer::Writer;
use std::sync::Arc;

/// The raisable priority of the compaction under way, for as long as it runs.
pub(crate) struct Running<'a> {
    w: &'a Writer,
}

impl<'a> Running<'a> {
    /// The compaction under way runs at `lower` (the foreground's priority without it).
    pub(crate) fn new(w: &'a Writer, lower: Option<Arc<Raisable>>) -> Running<'a> {
        *w.compaction
            .priority
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = lower;
        Running { w }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        *self
            .w
            .compaction
            .priority
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Raise the compaction under way to the foreground's priority when it became urgent: `gens`
/// open generations (see [`super::policy::open`]) are one flush short of the cap (where flushes wait for compaction), or
/// `compact()` waits for it (`None`).
pub(crate) fn raise_if_due(w: &Writer, gens: Option<usize>) {
    let due = gens.is_none_or(|n| n + 1 >= w.reader.settings.compaction_max_generations);
    if !due {
        return;
    }
    let running = w
        .compaction
        .priority
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(r) = running.filter(|r| !r.raised()) {
        tracing::debug!(
            "the compaction under way became urgent: raised to the foreground's priority"
        );
        r.raise();
    }
}
