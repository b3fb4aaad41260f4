//! Compaction: a run of adjacent generations merged into one, published by one manifest version
//! that replaces the run.
//!
//! - [`policy`]: which run to merge (size-tiered, with a cap on the generation count);
//! - [`merge`]: the merged rows and the merged generation's graph;
//! - [`job`]: one compaction, pick → build → upload → publish, or give up;
//! - [`schedule`]: the background compactor;
//! - [`urgency`]: the priority a compaction runs at, raised when it becomes urgent.
//!
//! The replaced generations stay in memory as long as a query holds them, and their objects
//! are deleted once [`crate::Settings::compaction_grace_ms`] has passed and no query of this
//! handle reads them ([`crate::gc::replaced`]).

pub(crate) mod job;
pub(crate) mod merge;
pub(crate) mod policy;
pub(crate) mod schedule;
pub(crate) mod urgency;

use serde::Serialize;

/// What one compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CompactionReport {
    /// Generations before.
    pub generations_before: usize,
    /// Generations after.
    pub generations_after: usize,
    /// Rows (versions and tombstones) of the generations merged.
    pub rows_in: u64,
    /// Rows of the merged generation: superseded versions and dropped tombstones are gone.
    pub rows_out: u64,
    /// Bytes of the objects replaced.
    pub bytes_in: u64,
    /// Bytes of the merged generation's object.
    pub bytes_out: u64,
    /// Milliseconds the compaction took.
    pub millis: u64,
}
