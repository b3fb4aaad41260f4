//! What a handle reports about itself.

use crate::format::GenerationMeta;
use serde::Serialize;

/// A point-in-time description of an index handle.
#[derive(Debug, Clone, Serialize)]
pub struct IndexStats {
    /// The index location.
    pub location: String,
    /// The epoch of the newest manifest this handle knows.
    pub epoch: u64,
    /// The newest manifest version this handle knows.
    pub manifest_version: u64,
    /// Flushed generations, oldest first.
    pub generations: Vec<GenerationMeta>,
    /// Rows (versions and tombstones) in the active memtable.
    pub memtable_rows: usize,
    /// Rows of the active memtable in its vector graph (searches scan the rest exactly).
    pub memtable_graph_rows: usize,
    /// Rows in frozen memtables waiting for their flush.
    pub frozen_rows: usize,
    /// Frozen memtables waiting for their flush.
    pub frozen_memtables: usize,
    /// WAL objects not yet covered by a generation.
    pub wal_objects_pending: u64,
    /// Highest sequence number assigned.
    pub last_seq: u64,
    /// Rows of the active and frozen memtables not yet in their vector graph: searches scan
    /// them exactly, and appends slow down once there are more than
    /// [`crate::Settings::max_unindexed_rows`].
    pub unindexed_rows: usize,
    /// Milliseconds the last successful flush took (0 before the first).
    pub last_flush_ms: u64,
    /// Milliseconds the last group commit waited because of the indexing debt.
    pub append_delay_ms: f64,
    /// Milliseconds group commits waited in total because of the indexing debt.
    pub append_delay_total_ms: f64,
    /// Rows of the generations the compaction policy would merge now (0 when none is due, or
    /// compaction is off and the policy would merge nothing).
    pub compaction_debt_rows: u64,
    /// Bytes of generation objects a compaction replaced, awaiting their deletion (see
    /// [`crate::Settings::compaction_grace_ms`]).
    pub bytes_reclaimable: u64,
    /// Milliseconds the last compaction took (0 before the first).
    pub last_compaction_ms: u64,
    /// Compactions this handle published.
    pub compactions: u64,
    /// The last compaction failure, if the compactions since have not succeeded.
    pub compaction_error: Option<String>,
}
