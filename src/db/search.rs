//! The read surface both handles share: [`Search`], written once (the `read_methods!` macro
//! gives [`crate::Index`] and [`crate::ReadOnlyIndex`] the same inherent methods over their
//! own snapshot, and `impl_search!` implements the trait with them), as slatedb's `DbReadOps`
//! serves its writer, its reader and its snapshots.

use super::stats::IndexStats;
use crate::generation::cache::CacheStats;
use crate::query::vector::VectorSearchOptions;
use crate::query::ScanOptions;
use crate::query::SearchOptions;
use crate::schema::IndexSchema;
use crate::Result;
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use std::future::Future;
use std::sync::Arc;

/// The reads every handle offers: the writer ([`crate::Index`]) and any read-only handle
/// ([`crate::ReadOnlyIndex`]) answer them the same way over what they see, so code that only
/// reads can take either (`impl Search`). Each handle also has them as inherent methods.
///
/// The trait is sealed (only this crate's handles implement it, and later releases may add
/// methods), and its methods return futures, so it is used as a bound (`impl Search`, `T:
/// Search`), not as `dyn Search`.
pub trait Search: sealed::Sealed {
    /// The index schema.
    fn schema(&self) -> &IndexSchema;

    /// The Arrow schema of appended and returned rows.
    fn arrow_schema(&self) -> SchemaRef;

    /// Every live row (newest version of each key, deleted keys excluded), optionally filtered.
    fn scan(&self, options: ScanOptions) -> impl Future<Output = Result<Vec<RecordBatch>>> + Send;

    /// Every live row, optionally filtered, as a stream of batches built as it is polled, so
    /// a scan of any size holds one batch at a time beside the snapshot it reads. Newest
    /// source first; the rows of [`Search::scan`], in the same order.
    fn scan_stream(
        &self,
        options: ScanOptions,
    ) -> impl Future<Output = Result<SendableRecordBatchStream>> + Send;

    /// The physical plan of a full-text search: one `FtsArmExec` leaf with a partition per
    /// source (each arm's top k, with its live rows and the filter applied inside) under a
    /// `SortPreservingMergeExec(fetch = offset + k)` ordered by `_score` descending then key,
    /// a `GlobalLimitExec` skipping `offset` rows (when there is one) and a `TakeExec`
    /// reading the columns asked for.
    fn plan_fts(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> impl Future<Output = Result<Arc<dyn ExecutionPlan>>> + Send;

    /// Full-text search with BM25 over global statistics of the snapshot's live rows: the top
    /// `k` rows as a stream of batches (key, `_score`, the columns asked for).
    fn search_fts_stream(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> impl Future<Output = Result<SendableRecordBatchStream>> + Send;

    /// Full-text search, collected (see [`Search::search_fts_stream`]).
    fn search_fts(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> impl Future<Output = Result<Vec<RecordBatch>>> + Send;

    /// The physical plan of a vector search: one `VectorArmExec` leaf with an arm per source
    /// (each arm's top k by exact distance among its live rows that pass the filter), its
    /// arms gathered in one partition unless the search is exact or deep (more than 1,000
    /// rows), under a `SortPreservingMergeExec(fetch = offset + k)` ordered by `_distance`
    /// ascending then key, a `GlobalLimitExec` skipping `offset` rows (when there is one) and
    /// a `TakeExec` reading the columns asked for.
    fn plan_vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> impl Future<Output = Result<Arc<dyn ExecutionPlan>>> + Send;

    /// Vector k-nearest-neighbour search: the `k` live rows nearest to `query` (key,
    /// `_distance`, the columns asked for), with exact f32 distances under the schema's metric.
    fn search_vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> impl Future<Output = Result<Vec<RecordBatch>>> + Send;

    /// Hybrid search: a full-text part (`query`) and a vector part (`vector`) over one
    /// snapshot, each ranking its best candidates as its own search would, fused (see
    /// [`crate::Fusion`]): the top `k` rows by fused `_score` then key, with each part's score
    /// (`_fts_score`, `_distance`) and rank (`_fts_rank`, `_vector_rank`) and the columns
    /// asked for.
    fn search_hybrid(
        &self,
        query: &str,
        vector: &[f32],
        options: &crate::HybridSearchOptions,
    ) -> impl Future<Output = Result<Vec<RecordBatch>>> + Send;

    /// The exact number of live rows matching a full-text query, its filter and its
    /// `min_score` (its `k`, `offset` and `columns` play no part). Counted over one snapshot:
    /// to count the rows of a search's pages, count on its [`crate::PointInTime`].
    fn count_fts(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// A point in time of what the handle sees: searches and scans of it see the same rows,
    /// whatever is written after (see [`crate::PointInTime`]).
    fn point_in_time(&self) -> impl Future<Output = Result<crate::PointInTime>> + Send;

    /// What the handle's generation cache holds (see [`crate::Settings::cache_bytes`]).
    fn cache_stats(&self) -> impl Future<Output = CacheStats> + Send;

    /// Generations, memtable and WAL figures of what the handle sees.
    fn stats(&self) -> IndexStats;
}

pub(super) mod sealed {
    /// Implemented by this crate's handles only.
    pub trait Sealed {}
}

/// The inherent read methods of a handle, over `self.snapshot()` (an `async fn` giving the
/// [`crate::read::Snapshot`] a read starts from) and the handle's `Reader` at `self.$path`.
macro_rules! read_methods {
    ($($path:ident).+) => {
        /// The index schema.
        pub fn schema(&self) -> &crate::schema::IndexSchema {
            &self.$($path).+.schema
        }

        /// The Arrow schema of appended and returned rows.
        pub fn arrow_schema(&self) -> arrow::datatypes::SchemaRef {
            self.$($path).+.user_schema.clone()
        }

        /// Every live row (newest version of each key, deleted keys excluded), optionally
        /// filtered.
        pub async fn scan(
            &self,
            options: crate::query::ScanOptions,
        ) -> crate::Result<Vec<arrow::array::RecordBatch>> {
            let mut attempts = 0;
            loop {
                let snapshot = self.snapshot().await?;
                match self.$($path).+.scan(snapshot, options.filter.as_deref()).await {
                    Err(e) if self.retry_gone(&e, &mut attempts).await? => {}
                    other => return other,
                }
            }
        }

        /// Every live row, optionally filtered, as a stream of batches (see
        /// [`crate::Search::scan_stream`]).
        pub async fn scan_stream(
            &self,
            options: crate::query::ScanOptions,
        ) -> crate::Result<datafusion::execution::SendableRecordBatchStream> {
            let snapshot = self.snapshot().await?;
            self.$($path).+.scan_stream(snapshot, options.filter.as_deref())
        }

        /// The physical plan of a full-text search (see [`crate::Search::plan_fts`]).
        pub async fn plan_fts(
            &self,
            query: &str,
            options: &crate::query::SearchOptions,
        ) -> crate::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            let snapshot = self.snapshot().await?;
            self.$($path).+.plan_fts(snapshot, query, options).await
        }

        /// Full-text search with BM25 over global statistics of the snapshot's live rows: the
        /// top `k` rows as a stream of batches (key, `_score`, the columns asked for).
        pub async fn search_fts_stream(
            &self,
            query: &str,
            options: &crate::query::SearchOptions,
        ) -> crate::Result<datafusion::execution::SendableRecordBatchStream> {
            let started = tokio::time::Instant::now();
            let plan = crate::query::within_deadline(
                "full-text",
                options.timeout,
                self.plan_fts(query, options),
            )
            .await?;
            Ok(crate::query::stream_within(
                crate::query::reader::stream(plan)?,
                "full-text",
                options.timeout,
                started,
            ))
        }

        /// Full-text search, collected (see [`crate::Search::search_fts_stream`]).
        pub async fn search_fts(
            &self,
            query: &str,
            options: &crate::query::SearchOptions,
        ) -> crate::Result<Vec<arrow::array::RecordBatch>> {
            self.run_search("full-text", options.timeout, |snapshot| {
                self.$($path).+.plan_fts(snapshot, query, options)
            })
            .await
        }

        /// The physical plan of a vector search (see [`crate::Search::plan_vector`]).
        pub async fn plan_vector(
            &self,
            query: &[f32],
            options: &crate::query::VectorSearchOptions,
        ) -> crate::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            let snapshot = self.snapshot().await?;
            self.$($path).+.plan_vector(snapshot, query, options).await
        }

        /// Vector k-nearest-neighbour search: the `k` live rows nearest to `query` (key,
        /// `_distance`, the columns asked for), with exact f32 distances under the schema's metric.
        pub async fn search_vector(
            &self,
            query: &[f32],
            options: &crate::query::VectorSearchOptions,
        ) -> crate::Result<Vec<arrow::array::RecordBatch>> {
            self.run_search("vector", options.timeout, |snapshot| {
                self.$($path).+.plan_vector(snapshot, query, options)
            })
            .await
        }

        /// Hybrid search over what this handle sees (see [`crate::Search::search_hybrid`]).
        pub async fn search_hybrid(
            &self,
            query: &str,
            vector: &[f32],
            options: &crate::HybridSearchOptions,
        ) -> crate::Result<Vec<arrow::array::RecordBatch>> {
            crate::query::within_deadline(
                "hybrid",
                options.timeout,
                self.on_point_in_time(|pit| async move { pit.search_hybrid(query, vector, options).await }),
            )
            .await
        }

        /// The exact number of live rows matching a full-text query (see
        /// [`crate::Search::count_fts`]).
        pub async fn count_fts(
            &self,
            query: &str,
            options: &crate::query::SearchOptions,
        ) -> crate::Result<u64> {
            crate::query::within_deadline(
                "full-text count",
                options.timeout,
                self.on_point_in_time(|pit| async move { pit.count_fts(query, options).await }),
            )
            .await
        }

        /// A point in time of what this handle sees: searches and scans of it see the same
        /// rows, whatever is written after (see [`crate::PointInTime`]).
        pub async fn point_in_time(&self) -> crate::Result<crate::PointInTime> {
            let snapshot = self.snapshot().await?;
            Ok(self.$($path).+.pinned_point_in_time(snapshot))
        }

        /// What this handle's caches hold and fetched: opened generations (see
        /// [`crate::Settings::hot_cache_bytes`]) and blocks (see
        /// [`crate::Settings::cache_bytes`]).
        pub async fn cache_stats(&self) -> crate::generation::cache::CacheStats {
            self.$($path).+.cache_stats().await
        }

        /// A search: a snapshot, the plan `plan` makes of it, run to completion within
        /// `timeout` (see [`crate::SearchOptions::timeout`]). One slower
        /// than 20 ms is logged at debug level (target `lsmsearch::slow`) with the time it took
        /// to take its snapshot, to plan and to run.
        async fn run_search<F>(
            &self,
            kind: &str,
            timeout: Option<std::time::Duration>,
            plan: impl Fn(crate::read::Snapshot) -> F,
        ) -> crate::Result<Vec<arrow::array::RecordBatch>>
        where
            F: std::future::Future<
                Output = crate::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
            >,
        {
            crate::query::within_deadline(kind, timeout, async {
                let mut attempts = 0;
                loop {
                    match self.run_search_once(kind, &plan).await {
                        Err(e) if self.retry_gone(&e, &mut attempts).await? => {}
                        other => return other,
                    }
                }
            })
            .await
        }

        /// `read` of a point in time of a new snapshot, tried again (on a new snapshot) when
        /// what it read was gone (see `retry_gone`).
        async fn on_point_in_time<T, F, Fut>(&self, read: F) -> crate::Result<T>
        where
            F: Fn(crate::PointInTime) -> Fut,
            Fut: std::future::Future<Output = crate::Result<T>>,
        {
            let mut attempts = 0;
            loop {
                let snapshot = self.snapshot().await?;
                match read(self.$($path).+.point_in_time(snapshot)).await {
                    Err(e) if self.retry_gone(&e, &mut attempts).await? => {}
                    other => return other,
                }
            }
        }

        /// One attempt of [`Self::run_search`].
        async fn run_search_once<F>(
            &self,
            kind: &str,
            plan: &impl Fn(crate::read::Snapshot) -> F,
        ) -> crate::Result<Vec<arrow::array::RecordBatch>>
        where
            F: std::future::Future<
                Output = crate::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
            >,
        {
            let t = std::time::Instant::now();
            let snapshot = self.snapshot().await?;
            let t_snap = t.elapsed();
            let plan = plan(snapshot).await?;
            let t_plan = t.elapsed();
            let out = crate::query::reader::run(plan).await;
            let total = t.elapsed();
            if total >= std::time::Duration::from_millis(20) {
                tracing::debug!(
                    target: "lsmsearch::slow",
                    "{kind} search took {:.1} ms: snapshot {:.1}, plan {:.1}, run {:.1}",
                    total.as_secs_f64() * 1e3,
                    t_snap.as_secs_f64() * 1e3,
                    (t_plan - t_snap).as_secs_f64() * 1e3,
                    (total - t_plan).as_secs_f64() * 1e3
                );
            }
            out
        }
    };
}

/// `impl Search for $handle`, with the handle's inherent methods (written by
/// `read_methods!`: without them these calls would name the trait's own methods).
macro_rules! impl_search {
    ($handle:ty) => {
        impl crate::db::search::sealed::Sealed for $handle {}

        impl crate::db::search::Search for $handle {
            fn schema(&self) -> &crate::schema::IndexSchema {
                <$handle>::schema(self)
            }

            fn arrow_schema(&self) -> arrow::datatypes::SchemaRef {
                <$handle>::arrow_schema(self)
            }

            fn scan(
                &self,
                options: crate::query::ScanOptions,
            ) -> impl std::future::Future<Output = crate::Result<Vec<arrow::array::RecordBatch>>>
                   + Send {
                <$handle>::scan(self, options)
            }

            fn scan_stream(
                &self,
                options: crate::query::ScanOptions,
            ) -> impl std::future::Future<
                Output = crate::Result<datafusion::execution::SendableRecordBatchStream>,
            > + Send {
                <$handle>::scan_stream(self, options)
            }

            fn plan_fts(
                &self,
                query: &str,
                options: &crate::query::SearchOptions,
            ) -> impl std::future::Future<
                Output = crate::Result<
                    std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
                >,
            > + Send {
                <$handle>::plan_fts(self, query, options)
            }

            fn search_fts_stream(
                &self,
                query: &str,
                options: &crate::query::SearchOptions,
            ) -> impl std::future::Future<
                Output = crate::Result<datafusion::execution::SendableRecordBatchStream>,
            > + Send {
                <$handle>::search_fts_stream(self, query, options)
            }

            fn search_fts(
                &self,
                query: &str,
                options: &crate::query::SearchOptions,
            ) -> impl std::future::Future<Output = crate::Result<Vec<arrow::array::RecordBatch>>>
                   + Send {
                <$handle>::search_fts(self, query, options)
            }

            fn plan_vector(
                &self,
                query: &[f32],
                options: &crate::query::VectorSearchOptions,
            ) -> impl std::future::Future<
                Output = crate::Result<
                    std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
                >,
            > + Send {
                <$handle>::plan_vector(self, query, options)
            }

            fn search_vector(
                &self,
                query: &[f32],
                options: &crate::query::VectorSearchOptions,
            ) -> impl std::future::Future<Output = crate::Result<Vec<arrow::array::RecordBatch>>>
                   + Send {
                <$handle>::search_vector(self, query, options)
            }

            fn search_hybrid(
                &self,
                query: &str,
                vector: &[f32],
                options: &crate::HybridSearchOptions,
            ) -> impl std::future::Future<Output = crate::Result<Vec<arrow::array::RecordBatch>>>
                   + Send {
                <$handle>::search_hybrid(self, query, vector, options)
            }

            fn count_fts(
                &self,
                query: &str,
                options: &crate::query::SearchOptions,
            ) -> impl std::future::Future<Output = crate::Result<u64>> + Send {
                <$handle>::count_fts(self, query, options)
            }

            fn point_in_time(
                &self,
            ) -> impl std::future::Future<Output = crate::Result<crate::PointInTime>> + Send {
                <$handle>::point_in_time(self)
            }

            fn cache_stats(
                &self,
            ) -> impl std::future::Future<Output = crate::generation::cache::CacheStats> + Send
            {
                <$handle>::cache_stats(self)
            }

            fn stats(&self) -> crate::db::stats::IndexStats {
                <$handle>::stats(self)
            }
        }
    };
}

// Both expand to paths that resolve only inside the crate.
pub(super) use {impl_search, read_methods};
