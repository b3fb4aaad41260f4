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
//! - **WAL** ([`wal`]): every group commit is one immutable, checksummed object; acknowledged
//!   means written (and fsynced on local disk) with [`Durability::Durable`].
//! - **Memtable** ([`memtable`]): the rows since the last flush, newest version per key.
//! - **Generation** ([`generation`]): a flushed memtable, one bundle object with the rows and
//!   the set of primary-key hashes.
//! - **Manifest** ([`manifest`]): versioned, conditionally created descriptions of the index;
//!   publishing one is the visibility point of a flush.
//! - **Epochs**: opening a writer claims a new epoch and fences the previous writer.
//! - **Storage** ([`storage`]): object names and store wrappers, among them
//!   [`LatencyStore`], which adds an object store's latency to any store and counts requests
//!   and sequential round trips.

#![warn(missing_docs)]
#![deny(clippy::unwrap_used)]

pub mod bench;
mod codec;
mod db;
mod error;
pub mod generation;
pub mod index;
mod key;
pub mod manifest;
pub mod memtable;
mod query;
mod read;
mod schema;
mod settings;
pub mod storage;
pub mod wal;

pub use db::{Index, IndexStats, ReadOnlyIndex, ScanOptions, WriteReceipt};
pub use error::{Error, ErrorKind, Result};
pub use generation::cache::CacheStats;
pub use key::{Key, KeyType, PK_HASH_SEED};
pub use query::{
    distance, Conjunction, SearchOptions, VectorSearchOptions, DISTANCE_COLUMN, SCORE_COLUMN,
};
pub use schema::{
    IndexSchema, Metric, PayloadColumn, PayloadType, VectorColumn, DELETED_COLUMN, SEQ_COLUMN,
};
pub use settings::{Durability, Settings, WriteOptions};
pub use storage::{LatencyConfig, LatencyStore, Location, StoreCounters};
