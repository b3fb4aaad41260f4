//! What both handles read with: the schemas, settings, generation cache and the caches of live rows, and
//! the one implementation of scan, search planning and execution over a snapshot.

use super::vector::VectorSearchOptions;
use super::{fts, vector, FtsStatistics, SearchOptions};
use crate::format::bundle::BLOCK_BYTES;
use crate::format::GenerationMeta;
use crate::generation::cache::{CacheStats, GenerationCache};
use crate::read::pool::QueryPool;
use crate::read::{
    compile_filter, ColumnCache, DeadRowCache, ReadCaches, ScanCursor, Snapshot, Source,
};
use crate::schema::IndexSchema;
use crate::settings::Settings;
use crate::storage::blocks::{BlockCache, BlockCacheConfig};
use crate::storage::paths::Paths;
use crate::storage::Location;
use crate::text::{TextIndex, TextSchema};
use crate::Result;
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{collect, execute_stream, ExecutionPlan};
use std::sync::Arc;

/// The read side of a handle.
#[derive(Debug)]
pub(crate) struct Reader {
    pub(crate) schema: IndexSchema,
    /// The Arrow schema of appended and returned rows.
    pub(crate) user_schema: SchemaRef,
    /// The Arrow schema of stored rows (user columns, `_seq`, `_deleted`).
    pub(crate) stored_schema: SchemaRef,
    pub(crate) text_schema: Option<Arc<TextSchema>>,
    pub(crate) settings: Settings,
    /// Decoded generations.
    pub(crate) generations: GenerationCache,
    /// The live rows and dead-row statistics kept between queries.
    pub(crate) caches: Arc<ReadCaches>,
    /// Runs search arms and per-source planning.
    pub(crate) pool: Arc<QueryPool>,
}

impl Reader {
    pub(crate) async fn new(
        loc: &Location,
        paths: &Paths,
        schema: IndexSchema,
        settings: Settings,
    ) -> Result<Self> {
        let stored_schema = schema.stored_schema();
        let dead_row_terms = settings.dead_row_terms_bytes;
        let text_schema = TextSchema::new(&schema);
        let (block_budget, postings_budget, column_budget) = settings.cache_budgets();
        // Only budgets a user set: the defaults are capped quietly under a small cache_bytes.
        let defaults = Settings::default();
        if (postings_budget < settings.postings_cache_bytes
            && settings.postings_cache_bytes != defaults.postings_cache_bytes)
            || (column_budget < settings.column_cache_bytes
                && settings.column_cache_bytes != defaults.column_cache_bytes)
        {
            tracing::warn!(
                "postings_cache_bytes and column_cache_bytes are each capped at a quarter of cache_bytes ({}): {postings_budget} and {column_budget} bytes",
                settings.cache_bytes
            );
        }
        let blocks = BlockCache::open(&BlockCacheConfig {
            memory_bytes: block_budget,
            disk_bytes: settings.cache_disk_bytes,
            disk_dir: settings.cache_dir.clone(),
            block_bytes: BLOCK_BYTES,
            concurrency: settings.io_concurrency,
        })
        .await?;
        let generations = GenerationCache::new(
            loc.clone(),
            paths.clone(),
            stored_schema.clone(),
            text_schema.clone(),
            schema.vector_spec(&settings),
            &settings,
            blocks,
        );
        Ok(Reader {
            user_schema: schema.arrow_schema(),
            stored_schema,
            text_schema,
            pool: QueryPool::shared(
                settings.query_threads,
                settings.query_piece_docs,
                crate::read::pool::pool_group(&loc.display),
            )?,
            schema,
            settings,
            generations,
            caches: Arc::new(ReadCaches {
                columns: ColumnCache::new(column_budget),
                dead: DeadRowCache::new(dead_row_terms),
                ..ReadCaches::default()
            }),
        })
    }

    /// A snapshot of `memtables` (newest first) and the generations `metas` lists (oldest
    /// first, as a manifest does), fetched through the cache.
    pub(crate) async fn snapshot(
        &self,
        memtables: Vec<Source>,
        metas: &[GenerationMeta],
    ) -> Result<Snapshot> {
        Ok(Snapshot::new(
            self.sources(memtables, metas).await?,
            self.caches.clone(),
            self.pool.clone(),
        ))
    }

    /// `memtables` and the generations `metas` lists, newest first.
    async fn sources(
        &self,
        memtables: Vec<Source>,
        metas: &[GenerationMeta],
    ) -> Result<Vec<Source>> {
        let generations = self.generations.get_all(metas).await?;
        let mut sources = memtables;
        sources.extend(generations.into_iter().rev().map(Source::Generation));
        Ok(sources)
    }

    /// [`Reader::snapshot`] without dropping what the caches keep for other sources (see
    /// [`Snapshot::keeping`]).
    pub(crate) async fn snapshot_keeping(
        &self,
        memtables: Vec<Source>,
        metas: &[GenerationMeta],
    ) -> Result<Snapshot> {
        Ok(Snapshot::keeping(
            self.sources(memtables, metas).await?,
            self.caches.clone(),
            self.pool.clone(),
        ))
    }

    /// Compute ahead the live rows (and dead-row statistics) of the generation list `metas`
    /// (oldest first, as a manifest lists them) when the cache holds all of them, under
    /// `memtables` (see [`crate::read::ReadCaches::compute_ahead`]), as part of the background
    /// work `lower` (at the foreground's priority without it); best effort.
    pub(crate) async fn compute_ahead(
        &self,
        metas: &[GenerationMeta],
        memtables: Vec<crate::memtable::MemtableView>,
        lower: Option<Arc<crate::priority::Raisable>>,
    ) {
        let Some(gens) = self.generations.cached(metas).await else {
            return;
        };
        let caches = self.caches.clone();
        let ts = self.text_schema.clone();
        let background = lower.is_some();
        let computed = crate::priority::in_background_thread("lsmsearch-ahead", lower, move || {
            let gens: Vec<&Arc<crate::generation::Generation>> = gens.iter().collect();
            caches.compute_ahead(&gens, &memtables, ts.as_deref(), background)
        })
        .await;
        if let Err(e) = computed {
            tracing::warn!("computing the live rows of a new generation list failed: {e}");
        }
    }

    /// Read ahead the text of the rows of `snapshot`'s generations that its view supersedes
    /// and no full-text search counted yet, and keep their terms for the searches that will
    /// (see [`crate::Settings::dead_row_terms_bytes`]): a search after an append then reads
    /// nothing of them. Its live rows are computed as a search's, and kept for the next.
    /// Nothing without full-text search, or before one counted statistics; nothing is read
    /// once `stopped` says so (the handle closed while the live rows were computed).
    pub(crate) async fn read_dead_rows_ahead(
        &self,
        snapshot: Snapshot,
        stopped: impl Fn() -> bool + Send + 'static,
    ) -> Result<()> {
        let Some(ts) = self.text_schema.clone() else {
            return Ok(());
        };
        if !self.caches.dead.reads_ahead() {
            return Ok(());
        }
        // A generation whose text index is read by range, with it.
        fn cold_text(s: &Source) -> Option<(&Arc<crate::generation::Generation>, &TextIndex)> {
            match s {
                Source::Generation(g) if g.reads_by_range() => Some((g, g.text()?)),
                _ => None,
            }
        }
        // Nothing to read without one.
        if !snapshot.sources.iter().any(|s| cold_text(s).is_some()) {
            return Ok(());
        }
        let caches = self.caches.clone();
        crate::priority::in_background_thread("lsmsearch-ahead", None, move || {
            let live = snapshot.live();
            let wanted: Vec<(&Arc<crate::generation::Generation>, &TextIndex, Vec<usize>)> =
                snapshot
                    .sources
                    .iter()
                    .zip(&live)
                    .filter_map(|(s, live)| {
                        let (g, ti) = cold_text(s)?;
                        let rows = caches.dead.pending(s, ti.rows(), live);
                        (!rows.is_empty()).then_some((g, ti, rows))
                    })
                    .collect();
            if wanted.is_empty() || stopped() {
                return Ok(());
            }
            let reads = futures::future::try_join_all(
                wanted
                    .iter()
                    .map(|(g, ti, rows)| caches.dead.read_ahead(&ts, g, ti, rows)),
            );
            crate::generation::Generation::block_on_any(wanted.iter().map(|w| w.0), reads)
                .unwrap_or(Ok(Vec::new()))
                .map(drop)
        })
        .await
    }

    /// Every live row of the snapshot, optionally filtered.
    pub(crate) async fn scan(
        &self,
        snapshot: Snapshot,
        filter: Option<&str>,
    ) -> Result<Vec<RecordBatch>> {
        collect_scan(&self.user_schema, snapshot, filter).await
    }

    /// Every live row of the snapshot, optionally filtered, as a stream of batches of at most
    /// [`SCAN_BATCH_ROWS`] rows, each built when the stream is polled for it (on a blocking
    /// thread): a scan holds one batch at a time beside the snapshot.
    pub(crate) fn scan_stream(
        &self,
        snapshot: Snapshot,
        filter: Option<&str>,
    ) -> Result<SendableRecordBatchStream> {
        Ok(cursor_stream(scan_cursor(
            &self.user_schema,
            snapshot,
            filter,
        )?))
    }

    /// The physical plan of a full-text search over the snapshot.
    pub(crate) async fn plan_fts(
        &self,
        snapshot: Snapshot,
        query: &str,
        options: &SearchOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.point_in_time(snapshot).plan_fts(query, options).await
    }

    /// The physical plan of a vector search over the snapshot.
    pub(crate) async fn plan_vector(
        &self,
        snapshot: Snapshot,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.point_in_time(snapshot)
            .plan_vector(query, options)
            .await
    }

    /// The reads of `snapshot`, for one search.
    pub(crate) fn point_in_time(&self, snapshot: Snapshot) -> PointInTime {
        PointInTime {
            schema: self.schema.clone(),
            user_schema: self.user_schema.clone(),
            text_schema: self.text_schema.clone(),
            settings: self.settings.clone(),
            snapshot,
            _pins: None,
        }
    }

    /// The reads of `snapshot`, for as long as they are wanted: its generations are held
    /// until the last clone goes (see [`crate::generation::pins::Pins`]).
    pub(crate) fn pinned_point_in_time(&self, snapshot: Snapshot) -> PointInTime {
        let keys = snapshot
            .sources
            .iter()
            .filter_map(|s| match s {
                Source::Generation(g) => Some((g.meta().id, g.meta().epoch)),
                Source::Memtable(_) => None,
            })
            .collect();
        let pins = Arc::new(self.generations.pin(keys));
        PointInTime {
            _pins: Some(pins),
            ..self.point_in_time(snapshot)
        }
    }

    /// What the caches hold and fetched.
    pub(crate) async fn cache_stats(&self) -> CacheStats {
        let (dead_row_terms_rows, dead_row_terms_bytes) = self.caches.dead.ahead_held();
        CacheStats {
            column_bytes: self.caches.columns.bytes(),
            dead_row_terms_rows,
            dead_row_terms_bytes,
            term_entries: self.caches.terms.entries(),
            ..self.generations.stats().await
        }
    }
}

/// A point in time of an index: one snapshot that any number of searches and scans share,
/// so that the pages of a search (see [`SearchOptions::offset`]), or a search and a scan, see
/// the same rows whatever is appended, deleted, flushed or compacted after it was taken (by
/// [`crate::Index::point_in_time`] or [`crate::ReadOnlyIndex::point_in_time`]). Cheap to
/// clone; it outlives the handle that took it only as long as what it reads stays in the
/// store.
///
/// It holds what it saw: the memtable rows (a flushed memtable's with it: its rows, text
/// index and graph, which no cache budget counts), and the generations (their hot parts stay
/// in memory while it lives, whatever the cache's budget). The writer does not delete a
/// generation a compaction replaced while one of its points in time holds it. A read-only
/// handle's point in time reads what the writer, in another process, deletes
/// [`crate::Settings::compaction_grace_ms`] after a compaction replaced it: a read of it by
/// range after that fails with a `Data` error saying the object is gone, and a new point in
/// time reads the generations that replaced it.
#[derive(Debug, Clone)]
pub struct PointInTime {
    schema: IndexSchema,
    user_schema: SchemaRef,
    text_schema: Option<Arc<TextSchema>>,
    settings: Settings,
    snapshot: Snapshot,
    /// The generations held while it lives (a point in time a user took).
    _pins: Option<Arc<crate::generation::pins::Pins>>,
}

impl PointInTime {
    /// The index schema.
    pub fn schema(&self) -> &IndexSchema {
        &self.schema
    }

    /// The live rows of this point in time, reading the user columns `columns` only (see
    /// [`Snapshot::scan_columns`]), as a stream of batches built as it is polled.
    pub(crate) fn scan_columns(
        &self,
        columns: Vec<usize>,
        keep: usize,
        filter: Option<Arc<dyn datafusion::physical_expr::PhysicalExpr>>,
    ) -> SendableRecordBatchStream {
        let cursor = self.snapshot.clone().scan_columns(
            &self.user_schema,
            columns,
            keep,
            filter,
            SCAN_BATCH_ROWS,
        );
        cursor_stream(cursor)
    }

    /// The physical plan of a full-text search (see [`crate::Search::plan_fts`]).
    pub async fn plan_fts(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.fts_blocking(query, options, |schema, text, snapshot, query, options| {
            fts::plan(schema, text, snapshot, query, options, None)
        })
        .await
    }

    /// The BM25 statistics of a full-text query over this point in time's live rows: one
    /// shard's share of a sharded index's statistics, the first phase of its exact
    /// full-text search. Only `options.conjunction` plays a part (the statistics count every
    /// live row, whatever the filter).
    pub async fn fts_statistics(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> Result<FtsStatistics> {
        self.fts_blocking(query, options, |_, text, snapshot, query, options| {
            fts::statistics(text, snapshot, query, options)
        })
        .await
    }

    /// The physical plan of a full-text search of this point in time's rows scored with
    /// `statistics` (the sum of every shard's [`PointInTime::fts_statistics`] for the same
    /// query), as one index over all the shards' rows would score them. Statistics that
    /// cannot include this point in time's own are an `Invalid` error.
    pub async fn plan_fts_with_statistics(
        &self,
        query: &str,
        options: &SearchOptions,
        statistics: &FtsStatistics,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let global = self.global_stats(statistics)?;
        self.fts_blocking(
            query,
            options,
            move |schema, text, snapshot, query, options| {
                fts::plan(schema, text, snapshot, query, options, Some(&global))
            },
        )
        .await
    }

    /// Full-text search of this point in time's rows scored with `statistics` (see
    /// [`PointInTime::plan_fts_with_statistics`]).
    pub async fn search_fts_with_statistics(
        &self,
        query: &str,
        options: &SearchOptions,
        statistics: &FtsStatistics,
    ) -> Result<Vec<RecordBatch>> {
        super::within_deadline("full-text", options.timeout, async {
            run(self
                .plan_fts_with_statistics(query, options, statistics)
                .await?)
            .await
        })
        .await
    }

    /// The exact number of live rows matching a full-text query (see
    /// [`crate::Search::count_fts`]), with `min_score` applied to scores computed with
    /// `statistics` (see [`PointInTime::plan_fts_with_statistics`]).
    pub async fn count_fts_with_statistics(
        &self,
        query: &str,
        options: &SearchOptions,
        statistics: &FtsStatistics,
    ) -> Result<u64> {
        let global = self.global_stats(statistics)?;
        self.count(query, options, Some(global)).await
    }

    /// `statistics` checked against this point in time's text columns.
    fn global_stats(&self, statistics: &FtsStatistics) -> Result<fts::GlobalStats> {
        let ts = self.text_schema.as_ref().ok_or_else(|| {
            crate::Error::invalid("full-text search on an index without text columns")
        })?;
        fts::GlobalStats::from_public(statistics, ts)
    }

    /// [`PointInTime::count_fts`], scored with `global` when given.
    async fn count(
        &self,
        query: &str,
        options: &SearchOptions,
        global: Option<fts::GlobalStats>,
    ) -> Result<u64> {
        super::within_deadline("full-text count", options.timeout, async {
            let (stop, _guard) = crate::read::pool::Stop::with_guard();
            let count = move |schema: &IndexSchema,
                              text: Option<&Arc<TextSchema>>,
                              snapshot: Snapshot,
                              query: &str,
                              options: &SearchOptions| {
                fts::count(
                    schema,
                    text,
                    snapshot,
                    query,
                    options,
                    global.as_ref(),
                    &stop,
                )
            };
            self.fts_blocking(query, options, count).await
        })
        .await
    }

    /// `work` of this point in time's schemas and snapshot, `query` and `options`, on a
    /// blocking thread (a full-text plan or count reads and computes).
    async fn fts_blocking<T: Send + 'static>(
        &self,
        query: &str,
        options: &SearchOptions,
        work: impl FnOnce(
                &IndexSchema,
                Option<&Arc<TextSchema>>,
                Snapshot,
                &str,
                &SearchOptions,
            ) -> Result<T>
            + Send
            + 'static,
    ) -> Result<T> {
        let (schema, text, snapshot) = (
            self.schema.clone(),
            self.text_schema.clone(),
            self.snapshot.clone(),
        );
        let query = query.to_string();
        let options = options.clone();
        tokio::task::spawn_blocking(move || {
            work(&schema, text.as_ref(), snapshot, &query, &options)
        })
        .await?
    }

    /// Full-text search (see [`crate::Search::search_fts`]) over this point in time.
    pub async fn search_fts(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        super::within_deadline("full-text", options.timeout, async {
            run(self.plan_fts(query, options).await?).await
        })
        .await
    }

    /// The exact number of live rows matching a full-text query (see
    /// [`crate::Search::count_fts`]) at this point in time.
    pub async fn count_fts(&self, query: &str, options: &SearchOptions) -> Result<u64> {
        self.count(query, options, None).await
    }

    /// The physical plan of a vector search (see [`crate::Search::plan_vector`]).
    pub async fn plan_vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let (schema, settings, snapshot) = (
            self.schema.clone(),
            self.settings.clone(),
            self.snapshot.clone(),
        );
        let query = query.to_vec();
        let options = options.clone();
        tokio::task::spawn_blocking(move || {
            vector::plan(&schema, &settings, snapshot, &query, &options)
        })
        .await?
    }

    /// Vector search (see [`crate::Search::search_vector`]) over this point in time.
    pub async fn search_vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        super::within_deadline("vector", options.timeout, async {
            run(self.plan_vector(query, options).await?).await
        })
        .await
    }

    /// Hybrid search (see [`crate::Search::search_hybrid`]) over this point in time.
    pub async fn search_hybrid(
        &self,
        query: &str,
        vector: &[f32],
        options: &super::HybridSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        let search = super::hybrid::search(
            &self.schema,
            self.text_schema.clone(),
            &self.settings,
            self.snapshot.clone(),
            query,
            vector,
            options,
        );
        super::within_deadline("hybrid", options.timeout, search).await
    }

    /// Every live row of this point in time, optionally filtered (see [`crate::Search::scan`]).
    pub async fn scan(&self, options: super::ScanOptions) -> Result<Vec<RecordBatch>> {
        collect_scan(
            &self.user_schema,
            self.snapshot.clone(),
            options.filter.as_deref(),
        )
        .await
    }
}

/// A cursor over `snapshot`'s live rows that pass `filter` (compiled here against `user`, the
/// Arrow schema of returned rows).
fn scan_cursor(user: &SchemaRef, snapshot: Snapshot, filter: Option<&str>) -> Result<ScanCursor> {
    let filter = filter.map(|f| compile_filter(user, f)).transpose()?;
    Ok(snapshot.scan(user.clone(), filter.map(|f| f.expr), SCAN_BATCH_ROWS))
}

/// The batches of `cursor` as a stream, each built on a blocking thread when the stream is
/// polled for it.
fn cursor_stream(cursor: ScanCursor) -> SendableRecordBatchStream {
    let schema = cursor.schema();
    let batches = futures::stream::try_unfold(cursor, |mut cursor| async move {
        let (next, cursor) = tokio::task::spawn_blocking(move || {
            let next = cursor.next();
            (next, cursor)
        })
        .await
        .map_err(crate::Error::from)?;
        match next {
            Some(Ok(batch)) => Ok(Some((batch, cursor))),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    });
    let batches = futures::TryStreamExt::map_err(batches, |e: crate::Error| {
        datafusion::error::DataFusionError::External(Box::new(e))
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, batches))
}

/// Every live row of `snapshot` that passes `filter`, collected on a blocking thread.
async fn collect_scan(
    user: &SchemaRef,
    snapshot: Snapshot,
    filter: Option<&str>,
) -> Result<Vec<RecordBatch>> {
    let cursor = scan_cursor(user, snapshot, filter)?;
    tokio::task::spawn_blocking(move || cursor.collect()).await?
}

/// Rows per batch of a scan.
pub(crate) const SCAN_BATCH_ROWS: usize = 8192;

/// Run a plan to completion.
pub(crate) async fn run(plan: Arc<dyn ExecutionPlan>) -> Result<Vec<RecordBatch>> {
    Ok(collect(plan, Arc::new(TaskContext::default())).await?)
}

/// Run a plan as a stream of batches.
pub(crate) fn stream(plan: Arc<dyn ExecutionPlan>) -> Result<SendableRecordBatchStream> {
    Ok(execute_stream(plan, Arc::new(TaskContext::default()))?)
}
