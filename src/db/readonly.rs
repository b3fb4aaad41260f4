//! Read-only handles: any number of them, in any process, beside the one writer.

use super::{IndexStats, ScanOptions};
use crate::generation::cache::GenerationCache;
use crate::index::text::TextSchema;
use crate::manifest::{Manifest, ManifestStore};
use crate::memtable::Memtable;
use crate::query::fts;
use crate::query::source::Source;
use crate::query::vector::{self, VectorSearchOptions};
use crate::query::SearchOptions;
use crate::read::{filter_rows, Snapshot};
use crate::schema::IndexSchema;
use crate::settings::Settings;
use crate::storage::paths::Paths;
use crate::storage::Location;
use crate::wal::replay::{replay, Mode};
use crate::{Error, ErrorKind, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::{collect, ExecutionPlan};
use std::sync::Arc;

#[derive(Debug)]
struct View {
    manifest: Manifest,
    /// Rows of the WAL objects not yet covered by a generation.
    wal: Memtable,
    wal_objects: u64,
}

/// A read-only view of an index: the flushed generations of the newest manifest plus the rows
/// of the WAL objects written since. It never writes; [`ReadOnlyIndex::refresh`] moves it to the
/// newest manifest and WAL.
#[derive(Debug)]
pub struct ReadOnlyIndex {
    loc: Location,
    paths: Paths,
    manifests: ManifestStore,
    settings: Settings,
    schema: IndexSchema,
    user_schema: SchemaRef,
    stored_schema: SchemaRef,
    text_schema: Option<Arc<TextSchema>>,
    generations: GenerationCache,
    view: tokio::sync::RwLock<View>,
}

impl ReadOnlyIndex {
    pub(crate) async fn open(loc: Location, settings: Settings) -> Result<Self> {
        settings.validate()?;
        let started = std::time::Instant::now();
        let paths = Paths::new(loc.root.clone());
        let manifests = ManifestStore::new(loc.store.clone(), paths.clone());
        let m = manifests
            .load_latest()
            .await?
            .ok_or_else(|| Error::invalid(format!("no index at {}", loc.display)))?;
        let schema = m.schema.clone();
        let stored_schema = schema.stored_schema();
        let text_schema = TextSchema::new(&schema);
        let generations = GenerationCache::new(
            loc.clone(),
            paths.clone(),
            stored_schema.clone(),
            text_schema.clone(),
            schema.vector_spec(&settings),
            settings.io_concurrency,
            settings.cache_bytes,
        );
        let view = Self::load_view(
            &loc,
            &paths,
            &manifests,
            &stored_schema,
            text_schema.as_ref(),
            &settings,
            Some(m),
            &generations,
        )
        .await?;
        tracing::debug!(
            "opened {} read-only in {:?}: {} generations, {} rows from the WAL",
            loc.display,
            started.elapsed(),
            view.manifest.generations.len(),
            view.wal.rows()
        );
        Ok(ReadOnlyIndex {
            user_schema: schema.arrow_schema(),
            stored_schema,
            text_schema,
            schema,
            loc,
            paths,
            manifests,
            settings,
            generations,
            view: tokio::sync::RwLock::new(view),
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn load_view(
        loc: &Location,
        paths: &Paths,
        manifests: &ManifestStore,
        stored_schema: &SchemaRef,
        text_schema: Option<&Arc<TextSchema>>,
        settings: &Settings,
        mut manifest: Option<Manifest>,
        cache: &GenerationCache,
    ) -> Result<View> {
        let mut attempts = 0;
        loop {
            let m = match manifest.take() {
                Some(m) => m,
                None => manifests
                    .load_latest()
                    .await?
                    .ok_or_else(|| Error::invalid(format!("no index at {}", loc.display)))?,
            };
            let r = futures::try_join!(
                cache.get_all(&m.generations),
                replay(
                    &loc.store,
                    paths,
                    stored_schema,
                    m.wal_replay_from,
                    Mode::ReadOnly,
                    settings.io_concurrency
                )
            );
            match r {
                Ok((_, replayed)) => {
                    let mut wal = Memtable::new(0, stored_schema.clone(), text_schema, None)?;
                    for (id, e) in replayed.entries {
                        if let Some(rows) = e.rows {
                            wal.apply(rows)?;
                        }
                        wal.set_last_wal_id(id);
                    }
                    return Ok(View {
                        wal_objects: replayed.next_id.saturating_sub(m.wal_replay_from),
                        manifest: m,
                        wal,
                    });
                }
                // A flush published a new manifest and deleted WAL objects (or the writer
                // pruned what we were reading) between our LIST and GET: start over.
                Err(e) if e.kind() == ErrorKind::Data && is_not_found(&e) && attempts < 5 => {
                    attempts += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Move to the newest manifest and WAL. Cached generations are reused.
    pub async fn refresh(&self) -> Result<()> {
        let view = Self::load_view(
            &self.loc,
            &self.paths,
            &self.manifests,
            &self.stored_schema,
            self.text_schema.as_ref(),
            &self.settings,
            None,
            &self.generations,
        )
        .await?;
        *self.view.write().await = view;
        Ok(())
    }

    /// The sources of a search, newest first: the WAL's rows, then the generations.
    async fn sources(&self) -> Result<Vec<Source>> {
        let (wal, metas) = {
            let v = self.view.read().await;
            (v.wal.search_view(), v.manifest.generations.clone())
        };
        let generations = self.generations.get_all(&metas).await?;
        let mut s = vec![Source::from_memtable("wal".into(), wal)];
        s.extend(generations.iter().rev().map(Source::from_generation));
        Ok(s)
    }

    /// The index schema.
    pub fn schema(&self) -> &IndexSchema {
        &self.schema
    }

    /// Every live row of the view, optionally filtered.
    pub async fn scan(&self, options: ScanOptions) -> Result<Vec<RecordBatch>> {
        let (memtables, metas) = {
            let v = self.view.read().await;
            (vec![v.wal.newest_rows()?], v.manifest.generations.clone())
        };
        let mut generations = self.generations.get_all(&metas).await?;
        generations.reverse();
        let snapshot = Snapshot {
            memtables,
            generations,
        };
        let rows = snapshot.live_rows(&self.user_schema)?;
        match &options.filter {
            Some(f) => filter_rows(rows, &self.user_schema, f).await,
            None => Ok(rows),
        }
    }

    /// The physical plan of a full-text search over the view (see [`crate::Index::plan_fts`]).
    pub async fn plan_fts(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let sources = self.sources().await?;
        let schema = self.schema.clone();
        let text = self.text_schema.clone();
        let query = query.to_string();
        let options = options.clone();
        tokio::task::spawn_blocking(move || {
            fts::plan(&schema, text.as_ref(), sources, &query, &options)
        })
        .await?
    }

    /// Full-text search over the view, collected.
    pub async fn search_fts(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        let plan = self.plan_fts(query, options).await?;
        Ok(collect(plan, Arc::new(TaskContext::default())).await?)
    }

    /// The physical plan of an exact vector search over the view (see
    /// [`crate::Index::plan_vector`]).
    pub async fn plan_vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let sources = self.sources().await?;
        let schema = self.schema.clone();
        let settings = self.settings.clone();
        let query = query.to_vec();
        let options = options.clone();
        tokio::task::spawn_blocking(move || {
            vector::plan(&schema, &settings, sources, &query, &options)
        })
        .await?
    }

    /// Vector search over the view, collected.
    pub async fn search_vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        let plan = self.plan_vector(query, options).await?;
        Ok(collect(plan, Arc::new(TaskContext::default())).await?)
    }

    /// What this handle's generation cache holds (see [`Settings::cache_bytes`]).
    pub async fn cache_stats(&self) -> crate::CacheStats {
        self.generations.stats().await
    }

    /// Figures of the view.
    pub async fn stats(&self) -> IndexStats {
        let v = self.view.read().await;
        IndexStats {
            location: self.loc.display.clone(),
            epoch: v.manifest.epoch,
            manifest_version: v.manifest.version,
            generations: v.manifest.generations.clone(),
            memtable_rows: v.wal.rows(),
            memtable_graph_rows: 0,
            frozen_rows: 0,
            frozen_memtables: 0,
            wal_objects_pending: v.wal_objects,
            last_seq: v.manifest.last_seq.max(v.wal.max_seq()),
        }
    }
}

fn is_not_found(e: &Error) -> bool {
    let m = e.message();
    // A WAL object deleted by a concurrent flush shows up as a failed GET or as a gap at the
    // start of the listing; real damage persists and is reported after the retries.
    m.contains("not found")
        || m.contains("NotFound")
        || m.contains("No such file")
        || m.contains("is missing")
}
