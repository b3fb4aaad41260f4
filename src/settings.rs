//! Settings (plain data with documented defaults) and per-call options.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Tuning knobs of an index handle. Every field has a default; see each field for its cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Freeze and flush the memtable once it holds this many rows (every version and tombstone
    /// counts). Larger memtables mean fewer generations but more memory and a longer replay after a
    /// crash. Default 100,000.
    pub memtable_max_rows: usize,
    /// Freeze and flush the memtable once its Arrow buffers reach this many bytes. Default 64 MiB.
    pub memtable_max_bytes: usize,
    /// How many frozen memtables may wait for their flush before appends wait (backpressure).
    /// Each costs up to one memtable of memory. Default 2.
    pub max_frozen_memtables: usize,
    /// Appends slow down once more than this many memtable rows wait for the vector graph
    /// (searches scan them exactly): each group commit waits in proportion to the excess,
    /// so that at twice this many rows appends go as fast as the graph is built, and the
    /// unindexed rows stay below about twice this. Raising it trades query latency (more
    /// rows scanned exactly) for burst ingest. Default 10,000.
    pub max_unindexed_rows: usize,
    /// Upper bound, in milliseconds, on how long a `Buffered` write stays only in memory before
    /// its WAL object is written. Default 100 ms.
    pub wal_buffer_interval_ms: u64,
    /// At most this many `Buffered` rows are acknowledged from memory alone. Past it, an append
    /// writes the WAL object itself (as a `Durable` one would) and fails if that write fails,
    /// which bounds what a WAL outage, or a takeover by a newer writer, can lose and holds
    /// writers back while the store is down. Default 100,000.
    pub wal_buffer_max_rows: usize,
    /// A group commit stops collecting further requests once it holds this many rows, so one WAL
    /// object stays bounded. Default 100,000.
    pub max_commit_rows: usize,
    /// How many old manifest versions are kept behind the latest one. Default 10.
    pub manifest_retention: u64,
    /// How many object-store requests a handle issues concurrently when it loads generations,
    /// replays WAL objects or deletes them. Default 64: a cold open of up to 64 generations
    /// fetches them all in one round trip.
    pub io_concurrency: usize,
    /// HNSW: maximum connections per node and layer of a generation's vector graph. Larger
    /// means better recall, bigger graphs and slower flushes. Default 16.
    pub hnsw_m: usize,
    /// HNSW: candidate list size while inserting into a graph (a memtable's, which its flush
    /// turns into the generation's, or one built at flush). Larger means better recall and
    /// slower inserts. Default 100 (`docs/performance.md`, "How the defaults were chosen").
    pub hnsw_ef_construction: usize,
    /// HNSW: default candidate list size of a graph search (a query's `ef` overrides it). A
    /// compaction's merged generation is walked with this times one more than the flushes
    /// whose rows it holds (`GenerationMeta::flushes`; the total list of the graphs it
    /// replaced did not find as much in one graph), the flushes bounded by its rows in units of
    /// half `memtable_max_rows`, and divided by how much longer a list built its graph
    /// ([`Settings::compaction_ef_construction`]). Larger means better recall and slower
    /// searches. Default 400 (`docs/performance.md`, "How the defaults were chosen").
    pub hnsw_ef_search: usize,
    /// A vector arm scans instead of walking its graph when its live rows and filter leave
    /// fewer candidate rows than this (a walk over a sparse filter can come back short; a
    /// scan of few rows is cheap). A version-3 generation of at most this many rows is opened
    /// from its whole object and keeps its f32 vectors in memory: a search scans their 8-bit
    /// codes, proposes its best by them to the query's round (`vector_rerank`) and ranks
    /// those chosen exactly from those vectors; an `exact` one scans the vectors. Larger ones
    /// keep the codes and read vectors by range. Default 2,048.
    pub vector_exact_below: usize,
    /// The active memtable gets a vector graph, filled in the background, once it holds this
    /// many rows; below it (and for `dot`) memtables are scanned exactly. Default 2,048, near
    /// the measured crossover of a scan and a walk, and equal to `vector_exact_below`, under
    /// which an arm scans anyway (`docs/performance.md`, "How the defaults were chosen"). The
    /// graph costs background CPU: raise it (or set `usize::MAX`) for ingest-bound workloads.
    pub memtable_graph_above: usize,
    /// A walk over a generation whose vectors stay in its object (format version 3) ranks
    /// its candidate list by 8-bit codes of the vectors, and a scan of a small generation's
    /// codes ranks its rows by them; of the candidates of every such generation together,
    /// this many of the best by their codes (at least offset + k) are re-ranked from their
    /// exact vectors, read by range in one round (or from memory, for a small generation).
    /// More finds more of the true nearest rows at the cost of reading more vectors (512
    /// bytes each at 128-d), whatever the number of generations. Default 100.
    pub vector_rerank: usize,
    /// Budget, in bytes, of the memory a handle keeps of what queries read by range from
    /// generation objects: the memory tier of its block cache (the blocks of the rows
    /// queries return, the columns their filters read, the postings their terms need), and
    /// the postings and decoded columns kept for reuse, whose budgets
    /// ([`Settings::postings_cache_bytes`], [`Settings::column_cache_bytes`], each at most a
    /// quarter of this) come out of it. Within it, warm queries do no object-store I/O; beyond
    /// it, the least used blocks leave memory (for the disk tier, when there is one). At least
    /// 68 KiB. Default 384 MiB: 256 MiB of blocks, 64 MiB of postings, 64 MiB of columns.
    pub cache_bytes: u64,
    /// Budget, in bytes, of the disk tier of the block cache, in [`Settings::cache_dir`]; 0
    /// (the default) or no directory: no disk tier. At least 2 MiB when there is one. A
    /// process that opens the same directory again finds the blocks an earlier one left there
    /// (each is checked again when read). A sharded handle splits it evenly between its
    /// shards, each getting 2 MiB at least.
    pub cache_disk_bytes: u64,
    /// Directory of the block cache's disk tier (created when missing). A handle holds it
    /// (a lock file in it) until it is closed, or dropped and its tier closed: a handle that
    /// finds it held by another, of this process or another, uses the first free of
    /// `<dir>.1` to `<dir>.8` beside it, each with a budget of its own and kept on disk for
    /// the next handle (none free: an error). Close a handle to hand its directory on: a
    /// handle opened after another was closed finds its blocks. One dropped without a close
    /// holds it until its last reader and task are gone and its tier has closed; an open in
    /// the same process meanwhile waits for that close (35 s at most) once the tier is
    /// closing, and takes a sibling while it is not yet. On a file system without locks the
    /// directory is used unlocked (a warning says so). Default none.
    pub cache_dir: Option<std::path::PathBuf>,
    /// Budget, in bytes, of a handle's cache of opened generations: what each keeps in memory
    /// (for a version-3 generation its hot part, its vectors and its text index; for an older
    /// one its whole object). Queries open the generations that are not held (concurrently)
    /// and evict the least used beyond the budget. Default 4 GiB.
    pub hot_cache_bytes: u64,
    /// Budget, in bytes, of the decoded columns a handle keeps for filters, and of the rows
    /// of each generation that each filter passes: a filter on a version-3 generation reads
    /// the columns it names by range and decodes them, the next filter on them finds them
    /// decoded, and the next with the same text (calling no volatile or stable function,
    /// such as `random()` or `now()`) finds which rows pass (one byte per row, with the
    /// filter's text). Part of [`Settings::cache_bytes`] (at most a quarter of it). Default
    /// 64 MiB.
    pub column_cache_bytes: u64,
    /// Budget, in bytes, of a handle's cache of the postings and positions full-text
    /// searches read from generations' cold parts (version 4), one entry per term and
    /// generation as tantivy reads it: a warm search finds them there without a lookup per
    /// block or a copy. Beyond it, the least used leave (their blocks may still be in the
    /// block cache); an entry above a quarter of one of its shards (an eighth of the budget
    /// from 8 MiB) is not kept; 0 keeps nothing. Part of [`Settings::cache_bytes`] (at most a
    /// quarter of it). Default 64 MiB.
    pub postings_cache_bytes: u64,
    /// Budget, in bytes, of the terms of superseded rows a handle keeps for its full-text
    /// searches, beside [`Settings::cache_bytes`]. BM25 over the live rows takes away what
    /// superseded versions held, which the first search after an append would read from the
    /// generations' cold parts; a writer that ran a full-text search in the last 10 seconds
    /// reads the rows each append supersedes in the background instead and keeps their terms
    /// (about 40 bytes per distinct term of a row, 160 per row) for the searches that count
    /// them, at most half the budget waiting. Any handle also keeps the rows its searches
    /// read after their first count (a search with an older view uncounts them). Rows used
    /// leave first, oldest first; 0 keeps nothing and reads nothing ahead. Default 16 MiB.
    pub dead_row_terms_bytes: u64,
    /// Merge generations in the writer's background (see `docs/architecture.md`,
    /// "Compaction"). Off, generations accumulate until [`crate::Index::compact`] is called.
    /// Default on.
    pub compaction: bool,
    /// Compaction policy: looking from the newest generation back, a generation joins the run
    /// while it holds at most 1.5 times the rows of the run so far, and a run of at least this
    /// many generations is merged into one. The count stays within `max(fanout - 1, 2 log2(flushes))`
    /// and each row is rewritten about `log_fanout(flushes)` times. Default 4.
    pub compaction_fanout: usize,
    /// At most this many generations: a flush that would exceed it waits until a compaction
    /// brings the count down (appends slow down meanwhile, through the frozen-memtable queue),
    /// and at the cap compaction merges the `compaction_fanout` adjacent generations holding the
    /// fewest rows even where the policy would wait. It bounds the count when appends outrun
    /// compaction (the policy alone keeps it near `2 log2(flushes)`). Default 16.
    pub compaction_max_generations: usize,
    /// No compaction makes a generation of more than this many rows (as Lucene caps merged
    /// segments): a merge holds its merged rows and one input's, and builds the merged
    /// generation in memory, so this bounds a compaction's memory by the setting, not by the
    /// index (`docs/performance.md`, "Format 4: postings by range, and a 2,000,000-row
    /// index": with the default, `lsmsearch ingest` of 2,000,000 rows of the benchmark corpus
    /// peaked at 1.92 GB, `compact` at 1.65 GB; a merge holds about 10 KB a merged row).
    /// Generations of at least half of it are full: the cap on the count
    /// ([`Settings::compaction_max_generations`]) applies to the others, so a large index
    /// holds up to `2 × rows / compaction_max_rows` full generations beside them. `compact()`
    /// merges into generations of at most this many rows. Keep it at least
    /// `compaction_fanout` flushes' worth of rows, or the policy merges fewer at a time.
    /// Default 200,000.
    pub compaction_max_rows: usize,
    /// A compaction's merged graph continues the graph of its largest input (its nodes keep
    /// their links; only the other rows are inserted) instead of being built afresh. Cheaper in
    /// proportion to the largest input's share of the rows, but it found less on clustered
    /// vectors (near-duplicate documents) in the benchmarks (`docs/performance.md`, "How the
    /// defaults were chosen"). Default off.
    pub compaction_continue_graph: bool,
    /// Cores one compaction may use to build the merged generation's vector graph (the CPU
    /// budget that keeps compaction from starving appends and queries; a compaction also reads
    /// and writes one generation at a time). Default 1.
    pub compaction_threads: usize,
    /// HNSW: candidate list size while a compaction builds its merged generation's graph. A
    /// merged graph is walked with a list [`Settings::hnsw_ef_construction`] /
    /// `compaction_ef_construction` times the one its flushes would need (see
    /// [`Settings::hnsw_ef_search`]). Larger builds a graph that finds as much with a shorter
    /// list, but takes longer to build. Default 100, as flushes (`docs/performance.md`, "How
    /// the defaults were chosen").
    pub compaction_ef_construction: usize,
    /// Milliseconds a generation object replaced by a compaction is kept before it is deleted
    /// (and never while a query of this handle still reads it), so that queries and read-only
    /// handles that planned with the older manifest finish. Default 60,000.
    pub compaction_grace_ms: u64,
    /// Threads of the query pool, which runs every search's arms (one per source) and its
    /// per-source planning: searches start no thread of their own, whatever the number of
    /// generations. The shards of one sharded index opened in a process (by a
    /// `ShardedIndex`, or by a worker serving them) with the same `query_threads` and
    /// `query_piece_docs` share one pool. 0 (the default): one per core.
    pub query_threads: usize,
    /// Documents of a generation's text segment that one query thread scores at least: a
    /// full-text search scores a segment of twice as many or more in pieces of consecutive
    /// documents, one per query thread at most, so that a search over one large generation
    /// uses every core rather than one (a generation of 99,000 rows took 3 ms of one of two
    /// threads). Only queries of terms, phrases and their boolean combinations are cut (other
    /// scorers read the whole segment's matches when built), and only while the query pool
    /// holds no more jobs than threads (concurrent queries keep every thread busy already).
    /// 0 scores each segment on one thread. Default 32,768.
    pub query_piece_docs: usize,
}

/// The smallest [`Settings::cache_bytes`]: two 16 KiB blocks of a generation's cold part with
/// their keys (the block cache refuses a budget that holds fewer).
const MIN_CACHE_BYTES: u64 = 2 * ((16 << 10) + 1024);

/// The least disk budget of the block cache's disk tier: two of its disk blocks, which are at
/// least 1 MiB (see `BlockCache::open`).
const MIN_CACHE_DISK_BYTES: u64 = 2 << 20;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            memtable_max_rows: 100_000,
            memtable_max_bytes: 64 << 20,
            max_frozen_memtables: 2,
            max_unindexed_rows: 10_000,
            wal_buffer_interval_ms: 100,
            wal_buffer_max_rows: 100_000,
            max_commit_rows: 100_000,
            manifest_retention: 10,
            io_concurrency: 64,
            hnsw_m: 16,
            hnsw_ef_construction: 100,
            hnsw_ef_search: 400,
            vector_exact_below: 2048,
            memtable_graph_above: 2048,
            vector_rerank: 100,
            cache_bytes: 384 << 20,
            cache_disk_bytes: 0,
            cache_dir: None,
            hot_cache_bytes: 4 << 30,
            column_cache_bytes: 64 << 20,
            postings_cache_bytes: 64 << 20,
            dead_row_terms_bytes: 16 << 20,
            compaction: true,
            compaction_fanout: 4,
            compaction_max_generations: 16,
            compaction_max_rows: 200_000,
            compaction_continue_graph: false,
            compaction_threads: 1,
            compaction_ef_construction: 100,
            compaction_grace_ms: 60_000,
            query_threads: 0,
            query_piece_docs: 32_768,
        }
    }
}

/// Parameters of an HNSW graph build (from [`Settings::hnsw_m`] and
/// [`Settings::hnsw_ef_construction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GraphParams {
    /// Maximum connections per node and layer (hnsw M).
    pub(crate) m: usize,
    /// Candidate list size while building.
    pub(crate) ef_construction: usize,
    /// Threads inserting into a graph built at once; 0 = every core.
    pub(crate) threads: usize,
}

impl Settings {
    pub(crate) fn graph_params(&self) -> GraphParams {
        GraphParams {
            m: self.hnsw_m,
            ef_construction: self.hnsw_ef_construction,
            threads: 0,
        }
    }

    pub(crate) fn wal_buffer_interval(&self) -> Duration {
        Duration::from_millis(self.wal_buffer_interval_ms.max(1))
    }

    /// How [`Settings::cache_bytes`] is shared: `(blocks, postings, columns)`, the postings and
    /// columns each at most a quarter, the blocks' memory tier the rest.
    pub(crate) fn cache_budgets(&self) -> (u64, u64, u64) {
        let postings = self.postings_cache_bytes.min(self.cache_bytes / 4);
        let columns = self.column_cache_bytes.min(self.cache_bytes / 4);
        (self.cache_bytes - postings - columns, postings, columns)
    }

    /// Check every setting's range: an `Invalid` error names the first out of range. Opening
    /// an index checks them; a program taking settings from its user can check them first.
    pub fn validate(&self) -> crate::error::Result<()> {
        let check = |ok: bool, name: &str| {
            if ok {
                Ok(())
            } else {
                Err(crate::error::Error::invalid(format!(
                    "setting '{name}' is out of range (see its documentation)"
                )))
            }
        };
        check(self.memtable_max_rows > 0, "memtable_max_rows")?;
        check(self.memtable_max_bytes > 0, "memtable_max_bytes")?;
        check(self.max_frozen_memtables > 0, "max_frozen_memtables")?;
        check(self.max_unindexed_rows > 0, "max_unindexed_rows")?;
        check(self.max_commit_rows > 0, "max_commit_rows")?;
        check(self.io_concurrency > 0, "io_concurrency")?;
        check(self.hnsw_m > 1, "hnsw_m")?;
        check(self.hnsw_ef_construction > 0, "hnsw_ef_construction")?;
        check(self.hnsw_ef_search > 0, "hnsw_ef_search")?;
        check(self.cache_bytes >= 2 * MIN_CACHE_BYTES, "cache_bytes")?;
        check(self.hot_cache_bytes > 0, "hot_cache_bytes")?;
        check(self.compaction_fanout >= 2, "compaction_fanout")?;
        check(self.compaction_max_rows > 0, "compaction_max_rows")?;
        check(self.compaction_threads > 0, "compaction_threads")?;
        check(
            self.compaction_ef_construction > 0,
            "compaction_ef_construction",
        )?;
        check(
            self.compaction_max_generations > self.compaction_fanout,
            "compaction_max_generations",
        )?;
        Ok(())
    }
}

impl Settings {
    /// These settings for one of `parts` handles that share them (the shards of one sharded
    /// handle): each cache budget split evenly (none below its least), and the disk tier in a
    /// directory of its own, `name` under [`Settings::cache_dir`] (two handles cannot share
    /// one).
    pub(crate) fn share(&self, parts: u64, name: &str) -> Settings {
        let parts = parts.max(1);
        Settings {
            cache_bytes: (self.cache_bytes / parts).max(2 * MIN_CACHE_BYTES),
            cache_disk_bytes: match self.cache_disk_bytes {
                0 => 0,
                d => (d / parts).max(MIN_CACHE_DISK_BYTES),
            },
            hot_cache_bytes: (self.hot_cache_bytes / parts).max(1),
            cache_dir: self.cache_dir.as_ref().map(|d| d.join(name)),
            ..self.clone()
        }
    }
}

/// How durable a write must be before the call returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Return once the WAL object holding the write is on the object store (on local disk: the
    /// file and its directory are fsynced). Survives a crash of the process and of the machine.
    #[default]
    Durable,
    /// Return once the write is in the memtable (visible to searches); its WAL object is written
    /// in the background within [`Settings::wal_buffer_interval_ms`]. A crash, or a newer
    /// writer taking the index over, may lose it. At most [`Settings::wal_buffer_max_rows`]
    /// rows are acknowledged this way; past that, the write waits for its WAL object.
    Buffered,
}

impl std::str::FromStr for Durability {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        match s {
            "durable" => Ok(Durability::Durable),
            "buffered" => Ok(Durability::Buffered),
            other => Err(crate::error::Error::invalid(format!(
                "unknown durability '{other}' (expected 'durable' or 'buffered')"
            ))),
        }
    }
}

/// Options of one `append` or `delete` call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// See [`Durability`]. Default [`Durability::Durable`].
    pub durability: Durability,
}

impl WriteOptions {
    /// Options with the given durability.
    pub fn with_durability(durability: Durability) -> Self {
        WriteOptions { durability }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_bytes_holds_the_postings_and_columns_budgets() {
        let s = Settings::default();
        assert_eq!(s.cache_budgets(), (256 << 20, 64 << 20, 64 << 20));
        // Each at most a quarter of the whole; the blocks take the rest.
        let small = Settings {
            cache_bytes: 64 << 20,
            ..Settings::default()
        };
        assert_eq!(small.cache_budgets(), (32 << 20, 16 << 20, 16 << 20));
        let none = Settings {
            postings_cache_bytes: 0,
            ..Settings::default()
        };
        assert_eq!(none.cache_budgets(), (320 << 20, 0, 64 << 20));
        let least = Settings {
            cache_bytes: 2 * MIN_CACHE_BYTES,
            ..Settings::default()
        };
        least.validate().unwrap();
        assert!(least.cache_budgets().0 >= MIN_CACHE_BYTES);
        let fewer = Settings {
            cache_bytes: 2 * MIN_CACHE_BYTES - 1,
            ..Settings::default()
        };
        assert!(fewer.validate().is_err());
    }

    /// A disk budget split between the shards of a sharded handle leaves each at least what
    /// a disk tier needs (two of its 1 MiB disk blocks: see `BlockCache::open`), as the
    /// memory budget does: a user's 4 MiB over three shards is not an error about 1.3 MiB
    /// they never set.
    #[test]
    fn a_shared_disk_budget_leaves_each_part_what_a_disk_tier_needs() {
        let s = Settings {
            cache_disk_bytes: 4 << 20,
            cache_dir: Some("cache".into()),
            ..Settings::default()
        };
        let part = s.share(3, "shard-0");
        assert!(
            part.cache_disk_bytes >= 2 << 20,
            "{}",
            part.cache_disk_bytes
        );
        assert_eq!(
            part.cache_dir,
            Some(std::path::PathBuf::from("cache/shard-0"))
        );
        // No disk tier stays none.
        assert_eq!(Settings::default().share(3, "shard-0").cache_disk_bytes, 0);
        // A large budget is split evenly.
        let large = Settings {
            cache_disk_bytes: 3 << 30,
            ..s
        };
        assert_eq!(large.share(3, "shard-0").cache_disk_bytes, 1 << 30);
    }
}
