//! Search planning and execution over a snapshot ([`crate::read`]): global BM25 statistics,
//! one arm per source with its live rows and filter applied inside, and the DataFusion plan
//! (one leaf with a partition per arm → `SortPreservingMergeExec(fetch = k)`).

pub(crate) mod exec;
pub(crate) mod fts;
pub(crate) mod reader;
pub(crate) mod rerank;
pub(crate) mod vector;

pub use vector::VectorSearchOptions;

use serde::{Deserialize, Serialize};

/// How the terms of a full-text query combine when no operator is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Conjunction {
    /// Any term may match (tantivy's query-parser default).
    #[default]
    Or,
    /// Every term must match.
    And,
}

/// Options of a scan.
#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    /// A SQL predicate over the index's columns, e.g. `year >= 2020 AND lang = 'en'`.
    pub filter: Option<String>,
}

/// Options of a search.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchOptions {
    /// How many rows to return (at least 1). Default 10.
    pub k: usize,
    /// A SQL predicate over payload columns, applied inside every arm before its top k.
    pub filter: Option<String>,
    /// Default operator between query terms. Default [`Conjunction::Or`].
    pub conjunction: Conjunction,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            k: 10,
            filter: None,
            conjunction: Conjunction::Or,
        }
    }
}

impl SearchOptions {
    /// Options returning the top `k` rows.
    pub fn with_k(k: usize) -> Self {
        SearchOptions {
            k,
            ..Default::default()
        }
    }
}

/// Name of the score column of full-text results.
pub const SCORE_COLUMN: &str = "_score";
/// Name of the distance column of vector results.
pub const DISTANCE_COLUMN: &str = "_distance";
