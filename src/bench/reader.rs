//! The reader benchmark (`lsmsearch bench reader LOCATION`): what a new process needs to open
//! an existing index read-only and answer queries, behind a [`crate::LatencyStore`] that adds an
//! object store's per-request latency.
//!
//! It measures, each on a new handle: the first full-text query and the first vector query
//! (sequential round trips and bytes, the open included), and a cold query of an open handle
//! (nothing cached: a three-term full-text query, then a vector query). Then one handle answers
//! `--queries` mixed full-text and vector queries (the corpus's queries and their
//! embeddings), and the benchmark reports their latency, what the handle holds in memory by
//! kind (per row of the index), its block cache, and the process's peak resident memory
//! beside the index's bytes on disk. Last (after the peak is taken), `--recall-queries`
//! vector queries measure recall@10 against exact search, on a handle without added latency.

use super::corpus::{Corpus, Embedder};
use super::stream::{peak_rss_mib, rss_mib};
use crate::{
    Error, Index, Key, LatencyConfig, ReadOnlyIndex, Result, SearchOptions, Settings,
    StoreCounters, VectorSearchOptions,
};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Options of the benchmark: the flags of `lsmsearch bench reader`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReaderOptions {
    /// The index (a local path, or s3://bucket/prefix), built beforehand (for example with
    /// `lsmsearch ingest` of `lsmsearch bench corpus`).
    pub location: String,
    /// Mixed queries one handle answers (full-text and vector, alternately).
    #[arg(long, default_value_t = 1000)]
    pub queries: usize,
    /// Latency added to every GET, HEAD and LIST, in milliseconds.
    #[arg(long = "get-latency-ms", default_value = "10", value_parser = super::options::millis)]
    pub get_latency: Duration,
    /// Memory budget of what queries read (`cache_bytes`: blocks, postings and columns).
    #[arg(long, default_value_t = 256 << 20)]
    pub cache_bytes: u64,
    /// Disk budget of the block cache (`cache_disk_bytes`), in `--out`/cache.
    #[arg(long, default_value_t = 1 << 30)]
    pub cache_disk_bytes: u64,
    /// Vector dimension of the index (the queries are embedded with it).
    #[arg(long, default_value_t = 128)]
    pub dim: usize,
    /// Output directory (the disk cache, results.json).
    #[arg(long, default_value = "bench-out/reader")]
    pub out: PathBuf,
    /// A Cranfield collection directory for the queries (default: the collection this binary
    /// carries).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Vector queries whose top 10 is compared with exact search's (each exact search reads
    /// every vector of the index).
    #[arg(long, default_value_t = 20)]
    pub recall_queries: usize,
    /// Print a table as it goes.
    #[arg(skip = true)]
    pub print: bool,
}

/// One query's object-store traffic and time.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// What was asked.
    pub what: String,
    /// Milliseconds, open included when it is.
    pub ms: f64,
    /// Sequential round trips to the store.
    pub round_trips: u64,
    /// Requests made.
    pub requests: u64,
    /// Bytes read from the store.
    pub bytes_read: u64,
    /// `bytes_read` as a share of the index's bytes.
    pub share_of_index: f64,
}

/// What the benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct ReaderReport {
    /// Rows (versions and tombstones) in the index's generations.
    pub rows: u64,
    /// Generations.
    pub generations: usize,
    /// Bytes of the generations' objects.
    pub index_bytes: u64,
    /// First queries of new handles and cold queries of open ones.
    pub probes: Vec<Probe>,
    /// Mixed queries answered by one handle.
    pub queries: usize,
    /// Their latency percentiles, ms.
    pub p50_ms: f64,
    /// 95th percentile, ms.
    pub p95_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Bytes the mixed queries read from the store.
    pub bytes_read: u64,
    /// Requests the mixed queries made.
    pub requests: u64,
    /// What the handle holds, by kind.
    pub resident: crate::Resident,
    /// What the handle holds per row of the index.
    pub resident_bytes_per_row: f64,
    /// Block cache: bytes in memory.
    pub block_bytes: u64,
    /// Blocks found in memory.
    pub block_memory_hits: u64,
    /// Blocks read back from the disk tier.
    pub block_disk_hits: u64,
    /// Blocks fetched from the store.
    pub blocks_fetched: u64,
    /// Decoded columns kept for filters and payload.
    pub column_bytes: u64,
    /// Peak resident memory of the process, MiB: the highest of the opens (each a new handle
    /// decoding its hot parts) and the queries.
    pub peak_rss_mib: f64,
    /// Resident memory once the mixed queries are answered (the handle and its filled
    /// caches), MiB.
    pub rss_after_queries_mib: f64,
    /// The peak as a share of the index's bytes.
    pub peak_rss_share_of_index: f64,
    /// Vector queries compared with exact search.
    pub recall_queries: usize,
    /// Recall@10 of the default vector search against exact search over them.
    pub recall_at_10: Option<f64>,
}

enum Query {
    Fts(String),
    Vector(Vec<f32>),
}

impl Query {
    async fn run(&self, index: &ReadOnlyIndex) -> Result<usize> {
        let columns = Some(index.schema().payload_names());
        let batches = match self {
            Query::Fts(q) => {
                let opts = SearchOptions {
                    columns,
                    ..SearchOptions::with_k(10)
                };
                index.search_fts(q, &opts).await?
            }
            Query::Vector(v) => {
                let opts = VectorSearchOptions {
                    columns,
                    ..VectorSearchOptions::with_k(10)
                };
                index.search_vector(v, &opts).await?
            }
        };
        Ok(batches.iter().map(|b| b.num_rows()).sum())
    }
}

/// The keys of a search's rows, as text.
fn keys(batches: &[arrow::array::RecordBatch]) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            (0..b.num_rows())
                .map(|r| {
                    Key::from_array(b.column(0).as_ref(), r)
                        .map_or(String::new(), |k| k.to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn requests(c: &StoreCounters) -> u64 {
    c.gets + c.heads + c.lists + c.puts + c.deletes
}

/// What the benchmark reads the index through.
struct Setup {
    loc: crate::Location,
    store: std::sync::Arc<crate::LatencyStore>,
    settings: Settings,
    cache_dir: PathBuf,
    index_bytes: u64,
}

impl Setup {
    /// A new handle, its cache empty (the disk tier is emptied too).
    async fn fresh(&self) -> Result<ReadOnlyIndex> {
        let _ = std::fs::remove_dir_all(&self.cache_dir);
        Index::open_read_only(self.loc.clone(), self.settings.clone()).await
    }

    fn probe(&self, what: &str, ms: f64, c: StoreCounters) -> Probe {
        Probe {
            what: what.to_string(),
            ms,
            round_trips: c.round_trips,
            requests: requests(&c),
            bytes_read: c.bytes_read,
            share_of_index: c.bytes_read as f64 / self.index_bytes.max(1) as f64,
        }
    }

    /// The first full-text and vector queries of new handles (the open included), then cold
    /// queries of open handles.
    async fn probes(&self, texts: &[String], embedder: &mut Embedder) -> Result<Vec<Probe>> {
        let first_fts = Query::Fts(texts[0].clone());
        let first_vector = Query::Vector(embedder.embed(&texts[1], 0, 0.0));
        let cold_fts = Query::Fts("boundary layer flow".to_string());
        let cold_vector = Query::Vector(embedder.embed(&texts[2], 0, 0.0));
        let mut probes = Vec::new();
        for (what, q) in [
            ("open + first full-text query", &first_fts),
            ("open + first vector query", &first_vector),
        ] {
            self.store.reset();
            let t = Instant::now();
            let ro = self.fresh().await?;
            q.run(&ro).await?;
            probes.push(self.probe(what, t.elapsed().as_secs_f64() * 1e3, self.store.counters()));
            ro.close().await?;
        }
        for (what, q) in [
            ("cold full-text query 'boundary layer flow'", &cold_fts),
            ("cold vector query", &cold_vector),
        ] {
            let ro = self.fresh().await?;
            self.store.reset();
            let t = Instant::now();
            q.run(&ro).await?;
            probes.push(self.probe(what, t.elapsed().as_secs_f64() * 1e3, self.store.counters()));
            ro.close().await?;
        }
        Ok(probes)
    }
}

/// Run the benchmark.
pub async fn run(o: &ReaderOptions) -> Result<ReaderReport> {
    if o.queries == 0 {
        return Err(Error::invalid("--queries must be at least 1"));
    }
    let cache_dir = o.out.join("cache");
    std::fs::create_dir_all(&cache_dir)
        .map_err(|e| Error::invalid(format!("cannot create {}: {e}", cache_dir.display())))?;
    let settings = Settings {
        cache_bytes: o.cache_bytes,
        cache_disk_bytes: o.cache_disk_bytes,
        cache_dir: Some(cache_dir.clone()),
        ..Settings::default()
    };
    let base = crate::Location::parse(&o.location)?;
    let (loc, store) = base.with_latency(LatencyConfig {
        read: o.get_latency,
        write: Duration::ZERO,
        bytes_per_second: None,
    });
    // Only the queries are kept: the documents are not the reader's to hold.
    let texts = Corpus::load(o.data.as_deref())?.queries().to_vec();
    let mut embedder = Embedder::new(o.dim);
    let mut setup = Setup {
        loc,
        store,
        settings,
        cache_dir,
        index_bytes: 0,
    };
    let (rows, generations) = {
        let ro = setup.fresh().await?;
        let s = ro.stats();
        setup.index_bytes = s.generations.iter().map(|g| g.bytes).sum::<u64>();
        let r = (
            s.generations.iter().map(|g| g.rows).sum::<u64>(),
            s.generations.len(),
        );
        ro.close().await?;
        r
    };
    let probes = setup.probes(&texts, &mut embedder).await?;
    // Mixed queries on one handle.
    let ro = setup.fresh().await?;
    setup.store.reset();
    let mut ms = Vec::with_capacity(o.queries);
    for i in 0..o.queries {
        let text = &texts[(i / 2) % texts.len()];
        let q = match i % 2 {
            0 => Query::Fts(text.clone()),
            _ => Query::Vector(embedder.embed(text, 0, 0.0)),
        };
        let t = Instant::now();
        q.run(&ro).await?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
    let c = setup.store.counters();
    let cache = ro.cache_stats().await;
    let r = cache.resident;
    let held = r.total();
    let peak = peak_rss_mib();
    let after = rss_mib();
    let index_bytes = setup.index_bytes;
    let report = ReaderReport {
        rows,
        generations,
        index_bytes,
        probes,
        queries: o.queries,
        p50_ms: pct(0.5),
        p95_ms: pct(0.95),
        p99_ms: pct(0.99),
        bytes_read: c.bytes_read,
        requests: requests(&c),
        resident: r,
        resident_bytes_per_row: held as f64 / rows.max(1) as f64,
        block_bytes: cache.block_bytes,
        block_memory_hits: cache.block_memory_hits,
        block_disk_hits: cache.block_disk_hits,
        blocks_fetched: cache.blocks_fetched,
        column_bytes: cache.column_bytes,
        peak_rss_mib: peak,
        rss_after_queries_mib: after,
        peak_rss_share_of_index: peak * (1 << 20) as f64 / index_bytes.max(1) as f64,
        recall_queries: o.recall_queries,
        recall_at_10: None,
    };
    ro.close().await?;
    let mut report = report;
    if o.recall_queries > 0 {
        let ro = Index::open_read_only(base.clone(), setup.settings.clone()).await?;
        let (mut found, mut wanted) = (0, 0);
        for i in 0..o.recall_queries {
            let v = embedder.embed(&texts[(i * 7 + 3) % texts.len()], 0, 0.0);
            let ann = keys(
                &ro.search_vector(&v, &VectorSearchOptions::with_k(10))
                    .await?,
            );
            let exact = VectorSearchOptions {
                exact: true,
                ..VectorSearchOptions::with_k(10)
            };
            let want = keys(&ro.search_vector(&v, &exact).await?);
            found += ann.iter().filter(|k| want.contains(k)).count();
            wanted += want.len();
        }
        // An index without a vector to find has no recall to report.
        report.recall_at_10 = (wanted > 0).then(|| found as f64 / wanted as f64);
        ro.close().await?;
    }
    if o.print {
        print!("{}", report.table());
    }
    let json = serde_json::to_string_pretty(&report).map_err(|e| Error::internal(e.to_string()))?;
    let path = o.out.join("results.json");
    std::fs::write(&path, json)
        .map_err(|e| Error::invalid(format!("cannot write {}: {e}", path.display())))?;
    Ok(report)
}

impl ReaderReport {
    /// The report as a table.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} rows in {} generations, {:.1} MB on disk",
            self.rows,
            self.generations,
            self.index_bytes as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "{:<44} {:>9} {:>6} {:>5} {:>10} {:>8}",
            "", "ms", "trips", "reqs", "MB read", "% index"
        );
        for p in &self.probes {
            let _ = writeln!(
                out,
                "{:<44} {:>9.1} {:>6} {:>5} {:>10.2} {:>8.3}",
                p.what,
                p.ms,
                p.round_trips,
                p.requests,
                p.bytes_read as f64 / 1e6,
                p.share_of_index * 100.0
            );
        }
        let _ = writeln!(
            out,
            "{} mixed queries: p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms; {:.1} MB read in {} requests",
            self.queries,
            self.p50_ms,
            self.p95_ms,
            self.p99_ms,
            self.bytes_read as f64 / 1e6,
            self.requests
        );
        let _ = writeln!(
            out,
            "held: {:.1} B/row ({})",
            self.resident_bytes_per_row,
            self.resident.per_row(self.rows)
        );
        let _ = writeln!(
            out,
            "block cache {:.1} MB: {} memory hits, {} disk hits, {} fetched; columns {:.1} MB",
            self.block_bytes as f64 / 1e6,
            self.block_memory_hits,
            self.block_disk_hits,
            self.blocks_fetched,
            self.column_bytes as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "peak RSS {:.0} MiB ({:.1}% of the index's bytes on disk); {:.0} MiB after the queries",
            self.peak_rss_mib,
            self.peak_rss_share_of_index * 100.0,
            self.rss_after_queries_mib
        );
        if let Some(r) = self.recall_at_10 {
            let _ = writeln!(
                out,
                "recall@10 against exact search: {r:.4} over {} vector queries",
                self.recall_queries
            );
        }
        out
    }
}
