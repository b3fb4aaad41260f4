//! The handles the commands open: one index, or a sharded index (`lsmsearch init --shards`)
//! searched and written as one.

use arrow::array::RecordBatch;
use lsmsearch::shard::{ShardLayout, ShardedIndex};
use lsmsearch::{
    CacheStats, CompactionReport, ErrorKind, HybridSearchOptions, Index, IndexSchema, IndexStats,
    Key, Location, ReadOnlyIndex, SearchOptions, Settings, VectorSearchOptions, WriteOptions,
    WriteReceipt,
};

/// The layout of the sharded index at `loc`, or `None` when it holds no descriptor (an
/// index that is not sharded, or nothing yet).
pub(crate) async fn layout(loc: &Location) -> lsmsearch::Result<Option<ShardLayout>> {
    match ShardLayout::read(loc).await {
        Ok(layout) => Ok(Some(layout)),
        Err(e) if e.kind() == ErrorKind::Invalid => Ok(None),
        Err(e) => Err(e),
    }
}

/// The schema of the index, sharded or not, at `loc`, without opening it.
pub(crate) async fn schema(loc: &Location) -> lsmsearch::Result<IndexSchema> {
    match layout(loc).await? {
        Some(layout) => Ok(layout.schema),
        None => Index::read_schema(loc).await,
    }
}

/// A writer: of one index, or of every shard of a sharded index.
pub(crate) enum Writer {
    One(Index),
    Sharded(Box<ShardedIndex>),
}

impl Writer {
    /// Open the index at `location` as its writer (every shard's, when it is sharded).
    pub(crate) async fn open(location: &str, settings: Settings) -> lsmsearch::Result<Writer> {
        let loc = Location::parse(location)?;
        Ok(match layout(&loc).await? {
            Some(_) => Writer::Sharded(Box::new(ShardedIndex::open(loc, settings).await?)),
            None => Writer::One(Index::open(loc, settings).await?),
        })
    }

    pub(crate) async fn append_with(
        &self,
        batch: &RecordBatch,
        options: WriteOptions,
    ) -> lsmsearch::Result<WriteReceipt> {
        match self {
            Writer::One(i) => i.append_with(batch, options).await,
            Writer::Sharded(s) => s.append_with(batch, options).await,
        }
    }

    pub(crate) async fn delete(&self, keys: &[Key]) -> lsmsearch::Result<WriteReceipt> {
        match self {
            Writer::One(i) => i.delete(keys).await,
            Writer::Sharded(s) => s.delete(keys).await,
        }
    }

    pub(crate) async fn flush(&self) -> lsmsearch::Result<()> {
        match self {
            Writer::One(i) => i.flush().await,
            Writer::Sharded(s) => s.flush().await,
        }
    }

    /// Compact: each shard's report (shard 0 alone for an index that is not sharded).
    pub(crate) async fn compact(
        &self,
    ) -> lsmsearch::Result<Vec<(usize, Option<CompactionReport>)>> {
        match self {
            Writer::One(i) => Ok(vec![(0, i.compact().await?)]),
            Writer::Sharded(s) => s.compact().await,
        }
    }

    /// The statistics of each shard (one for an index that is not sharded).
    pub(crate) fn stats(&self) -> Vec<IndexStats> {
        match self {
            Writer::One(i) => vec![i.stats()],
            Writer::Sharded(s) => s.stats(),
        }
    }

    pub(crate) async fn close(&self) -> lsmsearch::Result<()> {
        match self {
            Writer::One(i) => i.close().await,
            Writer::Sharded(s) => s.close().await,
        }
    }
}

/// A reader: a read-only handle of one index, or of every shard of a sharded index.
pub(crate) enum Reader {
    One(Box<ReadOnlyIndex>),
    Sharded(Box<ShardedIndex>),
}

impl Reader {
    /// Open the index at `location` read-only (every shard, when it is sharded).
    pub(crate) async fn open(location: &str, settings: Settings) -> lsmsearch::Result<Reader> {
        let loc = Location::parse(location)?;
        Ok(match layout(&loc).await? {
            Some(_) => {
                Reader::Sharded(Box::new(ShardedIndex::open_read_only(loc, settings).await?))
            }
            None => Reader::One(Box::new(Index::open_read_only(loc, settings).await?)),
        })
    }

    /// Full-text search, and with `count` the number of live rows matching, both of one
    /// point in time.
    pub(crate) async fn search_fts(
        &self,
        query: &str,
        options: &SearchOptions,
        count: bool,
    ) -> lsmsearch::Result<(Vec<RecordBatch>, Option<u64>)> {
        match self {
            Reader::One(i) => {
                let pit = i.point_in_time().await?;
                let n = match count {
                    true => Some(pit.count_fts(query, options).await?),
                    false => None,
                };
                Ok((pit.search_fts(query, options).await?, n))
            }
            Reader::Sharded(s) => {
                let pit = s.point_in_time().await?;
                let n = match count {
                    true => Some(pit.count_fts(query, options).await?),
                    false => None,
                };
                Ok((pit.search_fts(query, options).await?, n))
            }
        }
    }

    pub(crate) async fn search_vector(
        &self,
        query: &[f32],
        options: &VectorSearchOptions,
    ) -> lsmsearch::Result<Vec<RecordBatch>> {
        match self {
            Reader::One(i) => i.search_vector(query, options).await,
            Reader::Sharded(s) => s.search_vector(query, options).await,
        }
    }

    pub(crate) async fn search_hybrid(
        &self,
        query: &str,
        vector: &[f32],
        options: &HybridSearchOptions,
    ) -> lsmsearch::Result<Vec<RecordBatch>> {
        match self {
            Reader::One(i) => i.search_hybrid(query, vector, options).await,
            Reader::Sharded(s) => s.search_hybrid(query, vector, options).await,
        }
    }

    /// The statistics of each shard (one for an index that is not sharded).
    pub(crate) fn stats(&self) -> Vec<IndexStats> {
        match self {
            Reader::One(i) => vec![i.stats()],
            Reader::Sharded(s) => s.stats(),
        }
    }

    /// What each shard's handle holds in memory and has fetched (one for an index that is
    /// not sharded).
    pub(crate) async fn cache_stats(&self) -> Vec<CacheStats> {
        match self {
            Reader::One(i) => vec![i.cache_stats().await],
            Reader::Sharded(s) => s.cache_stats().await,
        }
    }

    pub(crate) async fn close(&self) -> lsmsearch::Result<()> {
        match self {
            Reader::One(i) => i.close().await,
            Reader::Sharded(s) => s.close().await,
        }
    }
}

/// A read-only handle of the index at `location` for `command`, which does not yet take a
/// sharded index: for one, an `Invalid` error saying so.
pub(crate) async fn one_read_only(
    location: &str,
    settings: Settings,
    command: &str,
) -> lsmsearch::Result<ReadOnlyIndex> {
    let loc = Location::parse(location)?;
    if let Some(layout) = layout(&loc).await? {
        return Err(lsmsearch::Error::invalid(format!(
            "{location} is a sharded index ({} shards): `lsmsearch {command}` reads one index; \
             search it with `lsmsearch search`, or give it a shard ({location}/shard-0, ...)",
            layout.shards
        )));
    }
    Index::open_read_only(loc, settings).await
}
