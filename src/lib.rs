//! # lsmsearch
//!
//! A real-time search index built as an LSM tree on object storage. Applications append rows
//! (a primary key, text, an optional embedding vector, payload columns) and read them back the
//! moment the call returns; the data lives durably on a local disk, in memory or on S3.
//!
//! ```no_run
//! use lsmsearch::{Index, IndexSchema, Location, ScanOptions, Settings};
//! use arrow::array::{RecordBatch, StringArray};
//! use std::sync::Arc;
//!
//! # async fn demo() -> lsmsearch::Result<()> {
//! let schema = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["body"]}"#)?;
//! let index = Index::create(Location::parse("/tmp/my-index")?, schema, Settings::default()).await?;
//! let batch = RecordBatch::try_new(
//!     index.arrow_schema(),
//!     vec![
//!         Arc::new(StringArray::from(vec!["a", "b"])),
//!         Arc::new(StringArray::from(vec!["hello world", "goodbye"])),
//!     ],
//! )?;
//! index.append(&batch).await?;            // durable: in the WAL, and visible
//! let rows = index.scan(ScanOptions::default()).await?;
//! index.flush().await?;                   // memtable -> generation, new manifest
//! index.close().await?;
//! # Ok(()) }
//! ```
//!
//! ## Core concepts
//!
//! - **WAL**: every group commit is one immutable, checksummed object; acknowledged means
//!   written (and fsynced on local disk) with [`Durability::Durable`].
//! - **Memtable**: the rows since the last flush, newest version per key, with a full-text
//!   index and a vector graph of their own.
//! - **Generation**: a flushed memtable, one bundle object with the rows, the set of
//!   primary-key hashes, a tantivy index and a vector graph ([`GenerationMeta`]).
//! - **Manifest**: versioned, conditionally created descriptions of the index; publishing one
//!   is the visibility point of a flush.
//! - **Epochs**: opening a writer claims a new epoch and fences the previous writer.
//! - **Snapshot and live rows**: a read fixes its sources (memtables and generations) when it
//!   starts; a row is live when it is the newest version of its key and no newer source holds
//!   the key, so each key is seen once, newest.
//! - **Locations** ([`Location`]): a local directory, `memory://` or `s3://`; [`LatencyStore`]
//!   adds an object store's latency to any store and counts requests and round trips.
//!
//! The module layers, the read and write paths and the persisted formats are described in
//! `docs/architecture.md` and `docs/format.md`.
//!
//! ## Features
//!
//! - `cli` (default): the `lsmsearch` command line and its benchmark harness ([`mod@bench`]), with
//!   their plots and progress bars. `default-features = false` builds the library alone.

#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![deny(clippy::unwrap_used)]

// Layers, lowest first; a module uses only modules of lower layers (tests/layers.rs):
// error ← key, settings ← schema ← storage ← format ← text, vector ← memtable, generation,
// wal, manifest ← read ← query ← db ← bench, ingest (and the fuzz tests).
#[cfg(feature = "cli")]
pub mod bench;
mod compaction;
mod db;
mod error;
mod flags;
mod format;
#[cfg(all(test, feature = "cli"))]
mod fuzz;
mod gc;
mod generation;
#[cfg(feature = "cli")]
pub mod ingest;
mod key;
mod manifest;
mod memtable;
mod priority;
mod query;
mod read;
mod schema;
mod settings;
pub mod shard;
pub mod sql;
mod storage;
mod text;
mod vector;
mod wal;
mod writer;

pub use compaction::CompactionReport;
pub use db::{Index, IndexStats, ReadOnlyIndex, Search, WriteReceipt};
pub use error::{Error, ErrorKind, Result};
pub use format::ipc::IpcReader;
pub use format::GenerationMeta;
pub use generation::cache::CacheStats;
pub use generation::Resident;
pub use key::{Key, KeyType, PK_HASH_SEED};
pub use query::reader::PointInTime;
pub use query::{
    Conjunction, FtsStatistics, Highlight, ScanOptions, SearchOptions, VectorSearchOptions,
    DISTANCE_COLUMN, EXPLANATION_COLUMN, HIGHLIGHT_PREFIX, MAX_RESULT_WINDOW, SCORE_COLUMN,
};
pub use query::{
    Fusion, HybridSearchOptions, DEFAULT_CANDIDATES, FTS_RANK_COLUMN, FTS_SCORE_COLUMN,
    VECTOR_RANK_COLUMN,
};
pub use schema::{
    IndexSchema, Metric, PayloadColumn, PayloadType, VectorColumn, DELETED_COLUMN, SEQ_COLUMN,
    TOKENIZERS,
};
pub use settings::{Durability, Settings, WriteOptions};
pub use storage::{LatencyConfig, LatencyStore, Location, StoreCounters, SyncedLocalStore};
pub use vector::distance;
