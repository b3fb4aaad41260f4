//! Sharded indexes: N ordinary indexes under one root, each row in the shard its key hashes
//! to, searched as one index.
//!
//! ```text
//! <root>/shards               the descriptor: shard count, routing hash, schema (docs/format.md)
//! <root>/shard-0/ ...         an ordinary index (manifest/, wal/, generations/)
//! <root>/shard-{N-1}/
//! ```
//!
//! A row goes to shard `xxh3_64(key, seed) mod N` ([`ShardLayout::shard_of`]), so every
//! process that reads the descriptor routes a key alike, and each shard has its own writer,
//! which may live in a process of its own ([`ShardedIndex::open_shards`]).
//!
//! Searches are exact: the results equal those of one index holding every shard's live rows.
//! A full-text search runs in two phases on one point in time of every shard: each shard's
//! share of the query's BM25 statistics (live rows, tokens per text column, rows holding each
//! term), summed; then each shard scores with the sums and returns its best `offset + k`,
//! merged by score then key. A vector search merges each shard's best `offset + k` by exact
//! distance, and a hybrid search fuses the merged candidates of both parts.

pub mod distributed;

use crate::query::hybrid::{self, Parts as Ranks};
use crate::query::{
    result_window, within_deadline, FtsStatistics, HybridSearchOptions, SearchOptions,
    VectorSearchOptions, DISTANCE_COLUMN, SCORE_COLUMN,
};
use crate::{
    CompactionReport, Error, Index, IndexSchema, IndexStats, Key, Location, PointInTime,
    ReadOnlyIndex, Result, Settings, WriteOptions, WriteReceipt,
};
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use arrow::compute::{SortColumn, SortOptions};
use arrow::datatypes::Float32Type;
use futures::future::try_join_all;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// Seed of the hash that routes a key to its shard. It differs from
/// [`crate::PK_HASH_SEED`], so that the keys of one shard do not share bits of the key
/// hashes their generations store. Part of the descriptor: fixed for an index's life.
pub const SHARD_HASH_SEED: u64 = 0x6c73_6d73_6861_7264; // "lsmshard"

/// The most shards an index may have.
pub const MAX_SHARDS: u32 = 1024;

/// The routing hash this build knows.
const HASH: &str = "xxh3-64";

/// The descriptor's object name under the root.
const DESCRIPTOR: &str = "shards";

/// What every process using a sharded index agrees on, read from `<root>/shards`: how many
/// shards, how a key picks its shard, and the schema every shard has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLayout {
    /// The number of shards, 1 to [`MAX_SHARDS`].
    pub shards: u32,
    /// The routing hash (`xxh3-64`: xxh3's 64-bit hash of the key's bytes, as
    /// [`Key::hash_with_seed`]).
    pub hash: String,
    /// The hash's seed.
    pub seed: u64,
    /// The schema of every shard.
    pub schema: IndexSchema,
}

impl ShardLayout {
    /// `shards` shards of `schema`, routed by xxh3 with [`SHARD_HASH_SEED`].
    pub fn new(shards: u32, schema: IndexSchema) -> Result<ShardLayout> {
        let layout = ShardLayout {
            shards,
            hash: HASH.to_string(),
            seed: SHARD_HASH_SEED,
            schema,
        };
        layout.check()?;
        Ok(layout)
    }

    /// An `Invalid` error naming what this build cannot route or open.
    fn check(&self) -> Result<()> {
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(Error::invalid(format!(
                "a sharded index has 1 to {MAX_SHARDS} shards, not {}",
                self.shards
            )));
        }
        if self.hash != HASH {
            return Err(Error::invalid(format!(
                "shards are routed by '{}', a hash this build does not know (it knows {HASH})",
                self.hash
            )));
        }
        self.schema.check()
    }

    /// The shard holding `key`.
    pub fn shard_of(&self, key: &Key) -> usize {
        (key.hash_with_seed(self.seed) % self.modulus()) as usize
    }

    /// The shard count as a divisor: at least 1 (the fields are public, and a layout built
    /// by hand may say 0; one read from a descriptor never does).
    fn modulus(&self) -> u64 {
        u64::from(self.shards.max(1))
    }

    /// The shard of the key at `row` of a key column; `None` for a null key.
    fn shard_at(&self, keys: &dyn Array, row: usize) -> Option<usize> {
        Key::hash_at_with_seed(keys, row, self.seed).map(|h| (h % self.modulus()) as usize)
    }

    /// Where shard `shard` lives under `root`: `<root>/shard-<shard>`.
    pub fn shard_location(&self, root: &Location, shard: usize) -> Result<Location> {
        if shard >= self.shards as usize {
            return Err(Error::invalid(match self.shards {
                0 => format!("shard {shard} does not exist: the layout has no shard"),
                n => format!(
                    "shard {shard} does not exist: the index has {n} shards (0 to {})",
                    n - 1
                ),
            }));
        }
        root.child(&format!("shard-{shard}"))
    }

    /// The descriptor at `root`; an `Invalid` error when there is none (no sharded index
    /// there), a `Data` error when it is damaged.
    pub async fn read(root: &Location) -> Result<ShardLayout> {
        let path = root.root.clone().join(DESCRIPTOR);
        let bytes = match root.store.get(&path).await {
            Ok(got) => got.bytes().await.map_err(|e| Error::store(&path, e))?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::invalid(format!(
                    "no sharded index at {}: it has no descriptor '{DESCRIPTOR}'",
                    root.display
                )))
            }
            Err(e) => return Err(Error::store(&path, e)),
        };
        let layout: ShardLayout = crate::format::decode_json(
            crate::format::ObjectKind::Shards,
            &bytes,
            &format!("{}/{DESCRIPTOR}", root.display),
        )?;
        layout.check().map_err(|e| {
            Error::data(
                format!("{}/{DESCRIPTOR}", root.display),
                format!("shard descriptor: {}", e.message()),
            )
        })?;
        Ok(layout)
    }

    /// Write the descriptor at `root` if there is none: the step that makes a sharded index
    /// exist. Another one there is an `Invalid` error.
    async fn write(&self, root: &Location) -> Result<()> {
        let path = root.root.clone().join(DESCRIPTOR);
        let bytes = crate::format::encode_json(crate::format::ObjectKind::Shards, self)?;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match root
            .store
            .put_opts(&path, PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => Err(Error::invalid(format!(
                "a sharded index already exists at {}",
                root.display
            ))),
            Err(e) => Err(Error::store(&path, e)),
        }
    }

    /// `batch`'s rows by shard: each shard's rows in their order, for the shards that have
    /// some. A null key is an `Invalid` error naming its row.
    fn split(&self, batch: &RecordBatch) -> Result<Vec<(usize, RecordBatch)>> {
        let keys = batch.column(0);
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); self.shards as usize];
        for row in 0..batch.num_rows() {
            let shard = self.shard_at(keys.as_ref(), row).ok_or_else(|| {
                Error::invalid(format!(
                    "row {row}: the primary key '{}' is null",
                    self.schema.primary_key
                ))
            })?;
            rows[shard].push(row as u32);
        }
        let mut out = Vec::new();
        for (shard, rows) in rows.into_iter().enumerate() {
            match rows.len() {
                0 => {}
                n if n == batch.num_rows() => out.push((shard, batch.clone())),
                _ => out.push((
                    shard,
                    arrow::compute::take_record_batch(batch, &UInt32Array::from(rows))?,
                )),
            }
        }
        Ok(out)
    }
}

/// A handle on one shard: its writer, or a read-only handle when another process writes it.
#[derive(Clone)]
enum ShardHandle {
    Writer(Arc<Index>),
    Reader(Arc<ReadOnlyIndex>),
}

impl ShardHandle {
    async fn point_in_time(&self) -> Result<PointInTime> {
        match self {
            ShardHandle::Writer(w) => w.point_in_time().await,
            ShardHandle::Reader(r) => r.point_in_time().await,
        }
    }

    fn stats(&self) -> IndexStats {
        match self {
            ShardHandle::Writer(w) => w.stats(),
            ShardHandle::Reader(r) => r.stats(),
        }
    }

    async fn cache_stats(&self) -> crate::CacheStats {
        match self {
            ShardHandle::Writer(w) => w.cache_stats().await,
            ShardHandle::Reader(r) => r.cache_stats().await,
        }
    }
}

/// A sharded index: N ordinary indexes under one root (see the module documentation),
/// searched as one. A handle holds the writer of some shards (all of them, by default) and
/// reads the others; appends and deletes go to the shard of each key, and searches see
/// every shard: what the shards it writes hold at once, the others' acknowledged writes
/// after [`ShardedIndex::refresh`].
pub struct ShardedIndex {
    layout: ShardLayout,
    root: Location,
    shards: Vec<ShardHandle>,
}

impl std::fmt::Debug for ShardedIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedIndex")
            .field("root", &self.root.display)
            .field("shards", &self.layout.shards)
            .field("writes", &self.written_shards())
            .finish()
    }
}

impl ShardedIndex {
    /// Create a sharded index of `shards` shards of `schema` at `root`, and open it as the
    /// writer of every shard. The shards are created first and the descriptor last, so an
    /// index exists once it is whole; a create cut off before that is resumed by the next
    /// (a shard it left, still empty and of the same schema, is taken over).
    pub async fn create(
        root: Location,
        schema: IndexSchema,
        shards: u32,
        settings: Settings,
    ) -> Result<ShardedIndex> {
        let layout = ShardLayout::new(shards, schema)?;
        settings.validate()?;
        match ShardLayout::read(&root).await {
            Ok(_) => {
                return Err(Error::invalid(format!(
                    "a sharded index already exists at {}",
                    root.display
                )))
            }
            Err(e) if e.kind() == crate::ErrorKind::Invalid => {}
            Err(e) => return Err(e),
        }
        if crate::db::index_exists(&root).await? {
            return Err(Error::invalid(format!(
                "an index (not sharded) exists at {}",
                root.display
            )));
        }
        let handles = try_join_all((0..shards as usize).map(|i| {
            let settings = settings.share(shards.into(), &format!("shard-{i}"));
            let layout = &layout;
            let root = &root;
            async move {
                let loc = layout.shard_location(root, i)?;
                let index = match crate::db::index_exists(&loc).await? {
                    false => Index::create(loc, layout.schema.clone(), settings).await?,
                    true => Self::take_over(loc, layout, settings).await?,
                };
                Ok::<_, Error>(ShardHandle::Writer(Arc::new(index)))
            }
        }))
        .await?;
        layout.write(&root).await?;
        Ok(ShardedIndex {
            layout,
            root,
            shards: handles,
        })
    }

    /// A shard an interrupted create left: opened when it is empty and of `layout`'s schema.
    async fn take_over(loc: Location, layout: &ShardLayout, settings: Settings) -> Result<Index> {
        let index = Index::open(loc, settings).await?;
        let stats = index.stats();
        if index.schema() != &layout.schema || stats.last_seq > 0 {
            let display = stats.location;
            index.close().await?;
            return Err(Error::invalid(format!(
                "an index that is not an empty shard of this schema exists at {display}"
            )));
        }
        Ok(index)
    }

    /// Open the sharded index at `root` as the writer of every shard.
    pub async fn open(root: Location, settings: Settings) -> Result<ShardedIndex> {
        let layout = ShardLayout::read(&root).await?;
        let all: Vec<usize> = (0..layout.shards as usize).collect();
        Self::open_with(root, layout, &all, settings).await
    }

    /// Open the sharded index at `root` as the writer of the shards `writes` (fencing any
    /// other writer of them) and a reader of the others, written by other processes.
    pub async fn open_shards(
        root: Location,
        writes: &[usize],
        settings: Settings,
    ) -> Result<ShardedIndex> {
        let layout = ShardLayout::read(&root).await?;
        Self::open_with(root, layout, writes, settings).await
    }

    /// Open the sharded index at `root` to search it, writing no shard.
    pub async fn open_read_only(root: Location, settings: Settings) -> Result<ShardedIndex> {
        Self::open_shards(root, &[], settings).await
    }

    async fn open_with(
        root: Location,
        layout: ShardLayout,
        writes: &[usize],
        settings: Settings,
    ) -> Result<ShardedIndex> {
        settings.validate()?;
        for w in writes {
            layout.shard_location(&root, *w)?;
        }
        let shards = try_join_all((0..layout.shards as usize).map(|i| {
            let settings = settings.share(layout.shards.into(), &format!("shard-{i}"));
            let (layout, root) = (&layout, &root);
            let write = writes.contains(&i);
            async move {
                let loc = layout.shard_location(root, i)?;
                let missing = |e: Error| e.context(format!("shard {i} of {}", layout.shards));
                let handle = match write {
                    true => ShardHandle::Writer(Arc::new(
                        Index::open(loc.clone(), settings).await.map_err(missing)?,
                    )),
                    false => ShardHandle::Reader(Arc::new(
                        Index::open_read_only(loc.clone(), settings)
                            .await
                            .map_err(missing)?,
                    )),
                };
                let schema = match &handle {
                    ShardHandle::Writer(w) => w.schema().clone(),
                    ShardHandle::Reader(r) => r.schema().clone(),
                };
                if schema != layout.schema {
                    return Err(Error::invalid(format!(
                        "shard {i} at {} has another schema than the index's descriptor",
                        loc.display
                    )));
                }
                Ok(handle)
            }
        }))
        .await?;
        Ok(ShardedIndex {
            layout,
            root,
            shards,
        })
    }

    /// The layout: shard count, routing and schema.
    pub fn layout(&self) -> &ShardLayout {
        &self.layout
    }

    /// The index schema (every shard's).
    pub fn schema(&self) -> &IndexSchema {
        &self.layout.schema
    }

    /// The shards this handle writes.
    pub fn written_shards(&self) -> Vec<usize> {
        (0..self.shards.len())
            .filter(|i| matches!(self.shards[*i], ShardHandle::Writer(_)))
            .collect()
    }

    /// The writers of the shards this handle writes.
    pub(crate) fn writer_handles(&self) -> Vec<(usize, Arc<Index>)> {
        (0..self.shards.len())
            .filter_map(|i| match &self.shards[i] {
                ShardHandle::Writer(w) => Some((i, w.clone())),
                ShardHandle::Reader(_) => None,
            })
            .collect()
    }

    /// Where the index is.
    pub(crate) fn root(&self) -> &Location {
        &self.root
    }

    /// The writer of `shard`, or an `Invalid` error when this handle does not write it.
    fn writer(&self, shard: usize) -> Result<&Arc<Index>> {
        match &self.shards[shard] {
            ShardHandle::Writer(w) => Ok(w),
            ShardHandle::Reader(_) => Err(Error::invalid(format!(
                "shard {shard} is written by another process: this handle writes shards {:?}",
                self.written_shards()
            ))),
        }
    }

    /// Append (upsert by key) the rows of `batch`, each to its key's shard; durable when it
    /// returns (see [`Index::append`]).
    pub async fn append(&self, batch: &RecordBatch) -> Result<WriteReceipt> {
        self.append_with(batch, WriteOptions::default()).await
    }

    /// [`ShardedIndex::append`] with `options`. The batch is checked against the schema and
    /// every row's shard must be one this handle writes, before anything is written. The
    /// shards' parts are then written at once, each atomic on its shard: when one fails, the
    /// error names the shards whose parts were written (appends are upserts: writing the
    /// batch again is safe).
    pub async fn append_with(
        &self,
        batch: &RecordBatch,
        options: WriteOptions,
    ) -> Result<WriteReceipt> {
        let batch = self.layout.schema.validate_batch(batch)?;
        let parts = self.layout.split(&batch)?;
        for (shard, _) in &parts {
            self.writer(*shard)?;
        }
        let writes = parts.iter().map(|(shard, part)| async move {
            let written = match self.writer(*shard) {
                Ok(w) => w.append_with(part, options).await,
                Err(e) => Err(e),
            };
            (*shard, written)
        });
        self.gather_writes(futures::future::join_all(writes).await)
    }

    /// Delete the rows of `keys` from their shards (see [`Index::delete`]).
    pub async fn delete(&self, keys: &[Key]) -> Result<WriteReceipt> {
        self.delete_with(keys, WriteOptions::default()).await
    }

    /// [`ShardedIndex::delete`] with `options`; as [`ShardedIndex::append_with`], every key's
    /// shard must be one this handle writes.
    pub async fn delete_with(&self, keys: &[Key], options: WriteOptions) -> Result<WriteReceipt> {
        // Every key of the index's type, checked before any shard deletes.
        self.layout.schema.key_column(keys)?;
        let mut by_shard: Vec<Vec<Key>> = vec![Vec::new(); self.shards.len()];
        for key in keys {
            by_shard[self.layout.shard_of(key)].push(key.clone());
        }
        for (shard, keys) in by_shard.iter().enumerate() {
            if !keys.is_empty() {
                self.writer(shard)?;
            }
        }
        let writes = by_shard
            .iter()
            .enumerate()
            .filter(|(_, keys)| !keys.is_empty())
            .map(|(shard, keys)| async move {
                let written = match self.writer(shard) {
                    Ok(w) => w.delete_with(keys, options).await,
                    Err(e) => Err(e),
                };
                (shard, written)
            });
        self.gather_writes(futures::future::join_all(writes).await)
    }

    /// One receipt for the shards' writes (rows summed, the highest sequence number), or
    /// the first error, naming the shards whose parts were written.
    fn gather_writes(&self, done: Vec<(usize, Result<WriteReceipt>)>) -> Result<WriteReceipt> {
        let written: Vec<usize> = done
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(s, _)| *s)
            .collect();
        let mut receipt = WriteReceipt {
            last_seq: 0,
            rows: 0,
        };
        for (shard, r) in done {
            match r {
                Ok(r) => {
                    receipt.rows += r.rows;
                    receipt.last_seq = receipt.last_seq.max(r.last_seq);
                }
                Err(e) => {
                    let kept = match written.is_empty() {
                        true => "no shard's part was written".to_string(),
                        false => format!("the parts of shards {written:?} were written"),
                    };
                    return Err(e.context(format!("shard {shard} ({kept})")));
                }
            }
        }
        Ok(receipt)
    }

    /// Flush every shard this handle writes (see [`Index::flush`]).
    pub async fn flush(&self) -> Result<()> {
        self.on_writers(|w| async move { w.flush().await }).await?;
        Ok(())
    }

    /// Flush shard `shard`, which this handle must write.
    pub async fn flush_shard(&self, shard: usize) -> Result<()> {
        self.layout.shard_location(&self.root, shard)?;
        self.writer(shard)?.flush().await
    }

    /// Compact every shard this handle writes (see [`Index::compact`]): each shard's report.
    pub async fn compact(&self) -> Result<Vec<(usize, Option<CompactionReport>)>> {
        let reports = self
            .on_writers(|w| async move { w.compact().await })
            .await?;
        Ok(self.written_shards().into_iter().zip(reports).collect())
    }

    /// Read what the other processes' writers published and acknowledged (see
    /// [`ReadOnlyIndex::refresh`]).
    pub async fn refresh(&self) -> Result<()> {
        try_join_all(self.shards.iter().map(|s| async move {
            match s {
                ShardHandle::Reader(r) => r.refresh().await,
                ShardHandle::Writer(_) => Ok(()),
            }
        }))
        .await?;
        Ok(())
    }

    /// Close every shard (see [`Index::close`]).
    pub async fn close(&self) -> Result<()> {
        try_join_all(self.shards.iter().map(|s| async move {
            match s {
                ShardHandle::Writer(w) => w.close().await,
                ShardHandle::Reader(r) => r.close().await,
            }
        }))
        .await?;
        Ok(())
    }

    async fn on_writers<T, F>(&self, work: impl Fn(Arc<Index>) -> F) -> Result<Vec<T>>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        try_join_all(self.shards.iter().enumerate().filter_map(|(i, s)| match s {
            ShardHandle::Writer(w) => {
                let run = work(w.clone());
                Some(async move { run.await.map_err(|e| e.context(format!("shard {i}"))) })
            }
            ShardHandle::Reader(_) => None,
        }))
        .await
    }

    /// Each shard's statistics, by shard.
    pub fn stats(&self) -> Vec<IndexStats> {
        self.shards.iter().map(ShardHandle::stats).collect()
    }

    /// What each shard's handle holds in memory and has fetched, by shard (see
    /// [`crate::Index::cache_stats`]).
    pub async fn cache_stats(&self) -> Vec<crate::CacheStats> {
        futures::future::join_all(self.shards.iter().map(ShardHandle::cache_stats)).await
    }

    /// A point in time of every shard: searches of it see the same rows, whatever is written
    /// after.
    pub async fn point_in_time(&self) -> Result<ShardedPointInTime> {
        let pits = try_join_all(self.shards.iter().map(ShardHandle::point_in_time)).await?;
        Ok(ShardedPointInTime {
            schema: self.layout.schema.clone(),
            pits,
        })
    }

    /// Full-text search of every shard, ranked as one index of all their live rows (see
    /// [`ShardedPointInTime::search_fts`]).
    pub async fn search_fts(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        within_deadline("full-text", options.timeout, async {
            self.point_in_time().await?.search_fts(query, options).await
        })
        .await
    }

    /// The exact number of live rows of every shard matching a full-text query.
    pub async fn count_fts(&self, query: &str, options: &SearchOptions) -> Result<u64> {
        within_deadline("full-text count", options.timeout, async {
            self.point_in_time().await?.count_fts(query, options).await
        })
        .await
    }

    /// Vector search of every shard (see [`ShardedPointInTime::search_vector`]).
    pub async fn search_vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        within_deadline("vector", options.timeout, async {
            self.point_in_time()
                .await?
                .search_vector(query, options)
                .await
        })
        .await
    }

    /// Hybrid search of every shard (see [`ShardedPointInTime::search_hybrid`]).
    pub async fn search_hybrid(
        &self,
        query: &str,
        vector: &[f32],
        options: &HybridSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        within_deadline("hybrid", options.timeout, async {
            self.point_in_time()
                .await?
                .search_hybrid(query, vector, options)
                .await
        })
        .await
    }
}

/// One point in time of every shard of a sharded index.
#[derive(Debug, Clone)]
pub struct ShardedPointInTime {
    schema: IndexSchema,
    pits: Vec<PointInTime>,
}

impl ShardedPointInTime {
    /// The point in time of each shard.
    pub fn shards(&self) -> &[PointInTime] {
        &self.pits
    }

    /// The full-text statistics of `query` over every shard's live rows: the shards'
    /// shares ([`PointInTime::fts_statistics`]) summed.
    pub async fn fts_statistics(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> Result<FtsStatistics> {
        Parts::statistics(self, query, options).await
    }

    /// Full-text search, exact: the shards' statistics summed, each shard's best
    /// `offset + k` scored with the sums, merged by score then key; the rows, columns,
    /// highlights and explanations one index of every shard's live rows would return.
    pub async fn search_fts(
        &self,
        query: &str,
        options: &SearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        search_fts(self, query, options).await
    }

    /// The exact number of live rows matching a full-text query and its filter (and its
    /// `min_score`, over scores computed with every shard's statistics).
    pub async fn count_fts(&self, query: &str, options: &SearchOptions) -> Result<u64> {
        count_fts(self, query, options).await
    }

    /// Vector search: each shard's best `offset + k`, merged by distance then key.
    pub async fn search_vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        search_vector(self, query, options).await
    }

    /// Hybrid search: each part's candidates merged over the shards (full text scored with
    /// every shard's statistics), then fused as [`crate::Search::search_hybrid`] fuses them:
    /// the rows one index of every shard's live rows would return.
    pub async fn search_hybrid(
        &self,
        query: &str,
        vector: &[f32],
        options: &HybridSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        search_hybrid(self, &self.schema, query, vector, options).await
    }
}

/// Where the shards' parts of a search run: on points in time in this process
/// ([`ShardedPointInTime`]), or on workers ([`distributed`]). One value serves one search:
/// every call sees the same point in time of each shard.
#[async_trait::async_trait]
pub(crate) trait Parts: Send + Sync {
    /// The shards' statistics of `query`, summed.
    async fn statistics(&self, query: &str, options: &SearchOptions) -> Result<FtsStatistics>;

    /// Each shard's best `options.k` rows (`options.offset` is 0) scored with `statistics`,
    /// merged by score then key.
    async fn fts(
        &self,
        query: &str,
        options: &SearchOptions,
        statistics: &FtsStatistics,
    ) -> Result<Vec<RecordBatch>>;

    /// Each shard's best `options.k` rows (`options.offset` is 0) scored with the shards'
    /// statistics of `query` summed, merged by score then key: the statistics first, then the
    /// rows scored with them. Both read the same point in time of each shard.
    async fn ranked_fts(&self, query: &str, options: &SearchOptions) -> Result<Vec<RecordBatch>> {
        let statistics = self.statistics(query, options).await?;
        self.fts(query, options, &statistics).await
    }

    /// The shards' counts, summed; scores (for `min_score`) with `statistics` when given.
    async fn count(
        &self,
        query: &str,
        options: &SearchOptions,
        statistics: Option<&FtsStatistics>,
    ) -> Result<u64>;

    /// Each shard's best `options.k` rows (`options.offset` is 0), merged by distance then
    /// key.
    async fn vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> Result<Vec<RecordBatch>>;
}

#[async_trait::async_trait]
impl Parts for ShardedPointInTime {
    async fn statistics(&self, query: &str, options: &SearchOptions) -> Result<FtsStatistics> {
        let shares =
            try_join_all(self.pits.iter().map(|p| p.fts_statistics(query, options))).await?;
        Ok(FtsStatistics::sum(&shares))
    }

    async fn fts(
        &self,
        query: &str,
        options: &SearchOptions,
        statistics: &FtsStatistics,
    ) -> Result<Vec<RecordBatch>> {
        let ranked = try_join_all(
            self.pits
                .iter()
                .map(|p| p.search_fts_with_statistics(query, options, statistics)),
        )
        .await?;
        merge(ranked, SCORE_COLUMN, true, 0, options.k)
    }

    async fn count(
        &self,
        query: &str,
        options: &SearchOptions,
        statistics: Option<&FtsStatistics>,
    ) -> Result<u64> {
        let counts = match statistics {
            None => try_join_all(self.pits.iter().map(|p| p.count_fts(query, options))).await?,
            Some(stats) => {
                try_join_all(
                    self.pits
                        .iter()
                        .map(|p| p.count_fts_with_statistics(query, options, stats)),
                )
                .await?
            }
        };
        Ok(counts.iter().sum())
    }

    async fn vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> Result<Vec<RecordBatch>> {
        let ranked =
            try_join_all(self.pits.iter().map(|p| p.search_vector(query, options))).await?;
        merge(ranked, DISTANCE_COLUMN, false, 0, options.k)
    }
}

/// Full-text search over `parts`: statistics summed, then each shard's best `offset + k`
/// scored with the sums, merged by score then key, the page `options` asks for.
pub(crate) async fn search_fts(
    parts: &dyn Parts,
    query: &str,
    options: &SearchOptions,
) -> Result<Vec<RecordBatch>> {
    within_deadline("full-text", options.timeout, async {
        let window = result_window(options.k, options.offset)?;
        let each = SearchOptions {
            k: window,
            offset: 0,
            timeout: None,
            ..options.clone()
        };
        let ranked = parts.ranked_fts(query, &each).await?;
        merge(vec![ranked], SCORE_COLUMN, true, options.offset, options.k)
    })
    .await
}

/// The exact number of live rows of `parts` matching a full-text query.
pub(crate) async fn count_fts(
    parts: &dyn Parts,
    query: &str,
    options: &SearchOptions,
) -> Result<u64> {
    within_deadline("full-text count", options.timeout, async {
        let each = SearchOptions {
            timeout: None,
            ..options.clone()
        };
        match options.min_score {
            None => parts.count(query, &each, None).await,
            Some(_) => {
                let stats = parts.statistics(query, options).await?;
                parts.count(query, &each, Some(&stats)).await
            }
        }
    })
    .await
}

/// Vector search over `parts`: each shard's best `offset + k`, merged by distance then key.
pub(crate) async fn search_vector(
    parts: &dyn Parts,
    query: &[f32],
    options: &VectorSearchOptions,
) -> Result<Vec<RecordBatch>> {
    within_deadline("vector", options.timeout, async {
        let window = result_window(options.k, options.offset)?;
        let each = VectorSearchOptions {
            k: window,
            offset: 0,
            timeout: None,
            ..options.clone()
        };
        let ranked = parts.vector(query, &each).await?;
        merge(
            vec![ranked],
            DISTANCE_COLUMN,
            false,
            options.offset,
            options.k,
        )
    })
    .await
}

/// Hybrid search over `parts`: each part's candidates merged over the shards, fused.
pub(crate) async fn search_hybrid(
    parts: &dyn Parts,
    schema: &IndexSchema,
    query: &str,
    vector: &[f32],
    options: &HybridSearchOptions,
) -> Result<Vec<RecordBatch>> {
    within_deadline("hybrid", options.timeout, async {
        let window = result_window(options.k, options.offset)?;
        let candidates = hybrid::candidates(options, window)?;
        hybrid::check_fusion(options.fusion)?;
        // The hybrid's own columns (its `_score` included) are always returned: the parts
        // read the user columns named.
        let columns: Option<Vec<String>> = options.columns.as_ref().map(|c| {
            c.iter()
                .filter(|n| !hybrid::OWN_COLUMNS.contains(&n.as_str()) && *n != SCORE_COLUMN)
                .cloned()
                .collect()
        });
        let text_opts = SearchOptions {
            k: candidates,
            offset: 0,
            filter: options.filter.clone(),
            conjunction: options.conjunction,
            columns: columns.clone(),
            ..SearchOptions::default()
        };
        let vector_opts = VectorSearchOptions {
            k: candidates,
            offset: 0,
            filter: options.filter.clone(),
            ef: options.ef,
            exact: options.exact,
            columns,
            ..VectorSearchOptions::default()
        };
        let text = parts.ranked_fts(query, &text_opts);
        let near = parts.vector(vector, &vector_opts);
        let (text, near) = futures::future::try_join(text, near).await?;
        fuse(schema, &text, &near, options)
    })
    .await
}

/// The rows `offset..offset + k` of every shard's ranked `batches` (each ordered by `value`
/// then key), ordered by `value` (descending when `descending`) then key ascending.
fn merge(
    batches: Vec<Vec<RecordBatch>>,
    value: &str,
    descending: bool,
    offset: usize,
    k: usize,
) -> Result<Vec<RecordBatch>> {
    let batches: Vec<RecordBatch> = batches.into_iter().flatten().collect();
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let all = arrow::compute::concat_batches(&first.schema(), &batches)?;
    let order = order_by(&all, value, descending)?;
    let page: Vec<u32> = order.iter().skip(offset).take(k).copied().collect();
    if page.is_empty() {
        return Ok(Vec::new());
    }
    Ok(vec![arrow::compute::take_record_batch(
        &all,
        &UInt32Array::from(page),
    )?])
}

/// The rows of `batch` ordered by `value` (descending when `descending`) then key (column 0)
/// ascending.
fn order_by(batch: &RecordBatch, value: &str, descending: bool) -> Result<Vec<u32>> {
    let values = batch.column_by_name(value).ok_or_else(|| {
        Error::internal(format!("a shard's ranked rows have no column '{value}'"))
    })?;
    let sorted = arrow::compute::lexsort_to_indices(
        &[
            SortColumn {
                values: values.clone(),
                options: Some(SortOptions {
                    descending,
                    nulls_first: false,
                }),
            },
            SortColumn {
                values: batch.column(0).clone(),
                options: Some(SortOptions {
                    descending: false,
                    nulls_first: false,
                }),
            },
        ],
        None,
    )?;
    Ok(sorted.values().to_vec())
}

/// Fuse the merged candidates of the full-text part (`text`: key, `_score`, columns) and
/// of the vector part (`near`: key, `_distance`, columns), each best first, into the page
/// `options` asks for, with the columns of a hybrid search.
fn fuse(
    schema: &IndexSchema,
    text: &[RecordBatch],
    near: &[RecordBatch],
    options: &HybridSearchOptions,
) -> Result<Vec<RecordBatch>> {
    // Every row either part ranked, once, in the order first ranked: where its columns are
    // (part batch, row) and what each part said of it.
    let mut at: HashMap<Key, usize> = HashMap::new();
    let mut rows: Vec<(usize, usize)> = Vec::new();
    let mut parts: Vec<Ranks> = Vec::new();
    let sources: Vec<&RecordBatch> = text.iter().chain(near).collect();
    let (mut text_rank, mut near_rank) = (0u32, 0u32);
    for (b, batch) in sources.iter().enumerate() {
        let values = batch.column(1).as_primitive::<Float32Type>();
        for row in 0..batch.num_rows() {
            let key = Key::from_array(batch.column(0).as_ref(), row)
                .ok_or_else(|| Error::internal("a shard ranked a row without a key"))?;
            let n = *at.entry(key).or_insert_with(|| {
                rows.push((b, row));
                parts.push(Ranks::default());
                parts.len() - 1
            });
            // Ranks count from 1 in each part's merged order (text's batches come first).
            let value = values.value(row);
            match b < text.len() {
                true => {
                    text_rank += 1;
                    parts[n].fts = Some((text_rank, value));
                }
                false => {
                    near_rank += 1;
                    parts[n].vector = Some((near_rank, value));
                }
            }
        }
    }
    let fused = hybrid::fuse(options.fusion, &parts);
    // The keys of the rows, in `rows` order, to order ties.
    let refs: Vec<&dyn Array> = sources.iter().map(|b| b.column(0).as_ref()).collect();
    let keys: ArrayRef = match refs.is_empty() {
        true => return Ok(Vec::new()),
        false => arrow::compute::interleave(&refs, &rows)?,
    };
    let page = hybrid::page_by(&fused, &keys, options.offset, options.k)?;
    if page.is_empty() {
        return Ok(Vec::new());
    }
    // The page's columns, from the part batch that ranked each row first.
    let picked: Vec<(usize, usize)> = page.iter().map(|i| rows[*i]).collect();
    let width = sources[0].num_columns();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(width.saturating_sub(2));
    for c in 2..width {
        let of: Vec<&dyn Array> = sources.iter().map(|b| b.column(c).as_ref()).collect();
        columns.push(arrow::compute::interleave(&of, &picked)?);
    }
    let key_col = arrow::compute::interleave(
        &sources
            .iter()
            .map(|b| b.column(0).as_ref())
            .collect::<Vec<_>>(),
        &picked,
    )?;
    let user_fields: Vec<arrow::datatypes::FieldRef> = sources[0]
        .schema()
        .fields()
        .iter()
        .skip(2)
        .cloned()
        .collect();
    hybrid::output_batch(schema, key_col, &page, &fused, &parts, user_fields, columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> ShardLayout {
        let schema = IndexSchema::from_json(
            r#"{"primary_key": "id", "text": ["body"],
                "vector": {"column": "emb", "dim": 4, "metric": "l2"},
                "payload": [{"name": "year", "type": "int64"}]}"#,
        )
        .expect("schema");
        ShardLayout::new(3, schema).expect("layout")
    }

    #[test]
    fn descriptor_round_trip_and_corruption() {
        use crate::format::{decode_json, encode_json, ObjectKind};
        let l = layout();
        let b = encode_json(ObjectKind::Shards, &l).expect("encode");
        let back: ShardLayout = decode_json(ObjectKind::Shards, &b, &"d").expect("decode");
        assert_eq!(back, l);
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(
                decode_json::<ShardLayout>(ObjectKind::Shards, &c, &"d").is_err(),
                "flip at {i}"
            );
        }
        assert!(decode_json::<ShardLayout>(ObjectKind::Shards, &b[..b.len() - 1], &"d").is_err());
    }

    #[test]
    fn rows_split_by_shard_in_their_order() {
        let l = layout();
        let keys: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
        let batch = RecordBatch::try_new(
            Arc::new(arrow::datatypes::Schema::new(vec![
                arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Utf8, false),
            ])),
            vec![Arc::new(arrow::array::StringArray::from(keys.clone()))],
        )
        .expect("batch");
        let parts = l.split(&batch).expect("split");
        let mut seen = 0;
        for (shard, part) in &parts {
            let ks = part.column(0).as_string::<i32>();
            let mut last = None;
            for i in 0..part.num_rows() {
                let k = ks.value(i);
                assert_eq!(l.shard_of(&Key::from(k)), *shard);
                let at = keys.iter().position(|x| x == k);
                assert!(at > last, "rows keep their order");
                last = at;
            }
            seen += part.num_rows();
        }
        assert_eq!(seen, keys.len());
    }

    /// Writes `tests/fixtures/sharded/shards`, the version-1 descriptor fixture:
    /// `cargo test --lib write_descriptor_fixture -- --ignored`.
    #[test]
    #[ignore]
    fn write_descriptor_fixture() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sharded");
        std::fs::create_dir_all(&dir).expect("dir");
        let b = crate::format::encode_json(crate::format::ObjectKind::Shards, &layout())
            .expect("encode");
        std::fs::write(dir.join(DESCRIPTOR), b).expect("write");
    }
}
