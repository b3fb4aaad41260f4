//! `lsmsearch bench stream`: writers and readers on one index at the same time, as an app
//! server uses it.
//!
//! W writers append Durable (or Buffered) batches of B rows (new keys, 10% updates of earlier
//! keys, and deletes of 1% of a batch's size), at their maximum rate or at a target rate
//! (rows/s in total, each batch sent on a fixed schedule so a slow append delays no later
//! one's start). R readers run full-text, vector and filtered vector queries (the Cranfield
//! queries, cycled) at their maximum rate or paced (queries/s in total). Every interval a
//! row is printed: acknowledged rows/s, append and per-kind query latency (p50/p99/max),
//! generations, compactions done and rows due for one, memtable and unindexed rows, resident
//! memory. At every checkpoint the writers
//! pause while a snapshot is read (its live rows, ten full-text and fifty vector queries
//! with graphs and exactly); after the stream, the full-text answers are compared with one
//! tantivy index over the snapshot's rows and the vector answers with the exact ones
//! (recall@10). Writes `results.json` and `stream.png` into the output directory.

use super::corpus::{Corpus, Embedder};
use crate::{
    Durability, Index, IndexSchema, Key, Location, Result, ScanOptions, SearchOptions, Settings,
    VectorSearchOptions, WriteOptions,
};
use arrow::array::{Array, AsArray, Float32Array, Int64Array, RecordBatch};
use arrow::datatypes::Int64Type;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What `bench stream` runs: the flags of `lsmsearch bench stream`, and their defaults
/// ([`Default`] is what the flags declare).
#[derive(Debug, Clone, clap::Args)]
pub struct StreamOptions {
    /// Writers.
    #[arg(long, default_value_t = 1)]
    pub writers: usize,
    /// Rows per append (new keys, 10% updates; deletes of 1% of it follow each append).
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Target rows/s of all writers together (0 = as fast as they can).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Durability of the appends: durable or buffered.
    #[arg(long, default_value = "durable")]
    pub durability: Durability,
    /// Readers.
    #[arg(long, default_value_t = 2)]
    pub readers: usize,
    /// Query kinds the readers cycle through (fts, vector, filtered), comma-separated.
    #[arg(long, default_value = "fts,vector,filtered", value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Target queries/s of all readers together (0 = as fast as they can).
    #[arg(long, default_value_t = 0.0)]
    pub qps: f64,
    /// Seconds the stream runs.
    #[arg(long = "seconds", default_value = "180", value_parser = super::options::seconds)]
    pub duration: Duration,
    /// Seconds between printed rows (at least 0.1).
    #[arg(long, default_value = "10", value_parser = super::options::seconds)]
    pub interval: Duration,
    /// Seconds between snapshot checks (recall, full-text equivalence; 0 = none).
    #[arg(long, default_value = "60", value_parser = super::options::seconds)]
    pub checkpoint: Duration,
    /// Output directory (the index is built in OUT/index and removed afterwards).
    #[arg(long, default_value = "bench-out/stream")]
    pub out: PathBuf,
    /// A Cranfield collection directory (default: the bundled one).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Vector dimension.
    #[arg(long, default_value_t = 128)]
    pub dim: usize,
    /// Index settings as JSON (fields of `Settings`; the rest keep their defaults).
    #[arg(long, default_value = "{}", value_parser = settings_json)]
    pub settings: Settings,
    /// Print the table (the command line: without `--json`).
    #[arg(skip = true)]
    pub print: bool,
    /// After the stream, merge every generation into one and report the space amplification
    /// (bytes of the generations ÷ bytes of one generation of the live rows).
    #[arg(long)]
    pub compact_at_end: bool,
}

impl Default for StreamOptions {
    fn default() -> Self {
        super::options::defaults()
    }
}

/// `--settings`: a JSON object of `Settings` fields.
fn settings_json(v: &str) -> std::result::Result<Settings, String> {
    serde_json::from_str(v).map_err(|e| e.to_string())
}

/// Latency percentiles of one kind of call, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    /// Calls.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Latency {
    fn of(mut v: Vec<f64>) -> Latency {
        if v.is_empty() {
            return Latency::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
        Latency {
            count: v.len(),
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: v[v.len() - 1],
        }
    }
}

/// One printed row.
#[derive(Debug, Clone, Serialize)]
pub struct Interval {
    /// Seconds since the start, at the end of the interval.
    pub t: f64,
    /// Rows acknowledged per second during the interval.
    pub rows_per_s: f64,
    /// Appends and deletes.
    pub append: Latency,
    /// Per query kind.
    pub queries: std::collections::BTreeMap<String, Latency>,
    /// Generations at the end of the interval.
    pub generations: usize,
    /// Rows in the active and frozen memtables.
    pub memtable_rows: usize,
    /// Memtable rows not yet in their vector graph or text index.
    pub unindexed_rows: usize,
    /// Compactions finished since the start.
    pub compactions: u64,
    /// Rows of the generations the compaction policy would merge now (0: nothing due).
    pub compaction_debt_rows: u64,
    /// Resident memory of the process, MiB.
    pub rss_mib: f64,
}

/// What a checkpoint found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Checkpoint {
    /// Seconds since the start.
    pub t: f64,
    /// Live rows of the snapshot.
    pub live_rows: usize,
    /// Mean recall@10 of graph searches against exact searches of the same snapshot.
    pub recall_at_10: f64,
    /// Full-text queries compared with one tantivy index over the snapshot's rows.
    pub fts_queries: usize,
    /// Of those, queries whose top 10 differ (keys, or scores beyond 1e-5 relative).
    pub fts_mismatches: usize,
}

/// Everything `bench stream` measured.
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    /// Writers, batch size, target rate (0 = max).
    pub writers: usize,
    /// Rows per append.
    pub batch: usize,
    /// Target rows/s (0 = max).
    pub rate: f64,
    /// Readers and their target queries/s (0 = max).
    pub readers: usize,
    /// Target queries/s (0 = max).
    pub qps: f64,
    /// Seconds the stream ran (pauses for checkpoints excluded).
    pub seconds: f64,
    /// Rows acknowledged.
    pub rows: usize,
    /// Rows acknowledged per second.
    pub rows_per_s: f64,
    /// Every append and delete.
    pub append: Latency,
    /// Every query, per kind.
    pub queries: std::collections::BTreeMap<String, Latency>,
    /// The rows printed.
    pub intervals: Vec<Interval>,
    /// The snapshot checks.
    pub checkpoints: Vec<Checkpoint>,
    /// Highest resident memory seen, MiB.
    pub peak_rss_mib: f64,
    /// Rows in the index at the end (live keys).
    pub live_rows: usize,
    /// Peak resident memory per 100,000 acknowledged rows, MiB.
    pub peak_rss_mib_per_100k_rows: f64,
    /// The most generations the index had at once (sampled every 100 ms).
    pub max_generations: usize,
    /// Generations, their rows (versions and tombstones) and bytes after the final flush.
    pub generations_at_end: usize,
    /// Rows stored in the generations after the final flush.
    pub generation_rows: u64,
    /// Bytes of the generations after the final flush.
    pub generation_bytes: u64,
    /// Compactions published during the stream.
    pub compactions: u64,
    /// `generation_bytes` ÷ the bytes of one generation of the live rows (with
    /// `compact_at_end`).
    pub space_amplification: Option<f64>,
}

/// Resident memory of this process, MiB (0 where /proc is unavailable).
pub fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Calls measured since the last interval and since the start.
#[derive(Default)]
struct Samples {
    append: Vec<f64>,
    queries: std::collections::BTreeMap<String, Vec<f64>>,
}

struct Shared {
    index: Index,
    /// Writers hold it (shared) around each call; a checkpoint takes it exclusively.
    pause: tokio::sync::RwLock<()>,
    interval: Mutex<Samples>,
    total: Mutex<Samples>,
    acked: AtomicUsize,
    next_key: AtomicUsize,
    stop: AtomicBool,
    pool: Vec<RecordBatch>,
    /// The text vector (no jitter) of each pool row.
    bases: Vec<Vec<f32>>,
    dim: usize,
    queries: Vec<String>,
    query_vectors: Vec<Vec<f32>>,
}

impl Shared {
    fn record_append(&self, ms: f64) {
        self.interval
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .append
            .push(ms);
        self.total
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .append
            .push(ms);
    }

    fn record_query(&self, kind: &str, ms: f64) {
        for s in [&self.interval, &self.total] {
            s.lock()
                .unwrap_or_else(|e| e.into_inner())
                .queries
                .entry(kind.to_string())
                .or_default()
                .push(ms);
        }
    }
}

/// Rows with keys `keys`: the text and payload of the pool's rows from `from` on (cycled),
/// and vectors made as the benchmark corpus makes them (the text's vector jittered by the
/// key, see [`Embedder::jitter`]), so no two keys share a vector.
fn rows_with_keys(s: &Shared, keys: &[i64], from: usize) -> Result<RecordBatch> {
    let pool = &s.pool;
    let per = pool[0].num_rows();
    let total = per * pool.len();
    let idx: Vec<(usize, usize)> = (0..keys.len())
        .map(|i| {
            let r = (from + i) % total;
            (r / per, r % per)
        })
        .collect();
    let schema = pool[0].schema();
    let mut columns = vec![Arc::new(Int64Array::from(keys.to_vec())) as arrow::array::ArrayRef];
    for c in 1..schema.fields().len() {
        if pool[0].column(c).as_fixed_size_list_opt().is_some() {
            let mut values = Vec::with_capacity(keys.len() * s.dim);
            for (i, key) in keys.iter().enumerate() {
                let base = &s.bases[(from + i) % total];
                values.extend(Embedder::jitter(base, *key as u64, 0.2));
            }
            columns.push(Arc::new(arrow::array::FixedSizeListArray::try_new(
                Arc::new(arrow::datatypes::Field::new(
                    "item",
                    arrow::datatypes::DataType::Float32,
                    true,
                )),
                s.dim as i32,
                Arc::new(Float32Array::from(values)),
                None,
            )?));
            continue;
        }
        let arrays: Vec<&dyn Array> = pool.iter().map(|b| b.column(c).as_ref()).collect();
        columns.push(arrow::compute::interleave(&arrays, &idx)?);
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

async fn writer(s: Arc<Shared>, o: StreamOptions, w: usize) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(17 + w as u64);
    let opts = WriteOptions::with_durability(o.durability);
    let every = (o.rate > 0.0)
        .then(|| Duration::try_from_secs_f64(o.batch as f64 * o.writers as f64 / o.rate).ok())
        .flatten();
    let mut next_at = Instant::now();
    let mut sent = 0usize;
    while !s.stop.load(Ordering::Relaxed) {
        if let Some(every) = every {
            next_at += every;
            let now = Instant::now();
            if next_at > now {
                tokio::time::sleep(next_at - now).await;
            }
        }
        let known = s.next_key.load(Ordering::Relaxed);
        let mut keys = Vec::with_capacity(o.batch);
        for _ in 0..o.batch {
            if known > 0 && rng.random_bool(0.1) {
                keys.push(rng.random_range(0..known) as i64);
            } else {
                keys.push(s.next_key.fetch_add(1, Ordering::Relaxed) as i64);
            }
        }
        let rows = rows_with_keys(&s, &keys, sent)?;
        sent += o.batch;
        // 1% of the batch size, the fraction carried over between batches.
        let deletes =
            (o.batch / 100) + usize::from(rng.random_bool((o.batch % 100) as f64 / 100.0));
        let doomed: Vec<Key> = (0..deletes)
            .filter(|_| known > 0)
            .map(|_| Key::I64(rng.random_range(0..known) as i64))
            .collect();
        let _held = s.pause.read().await;
        let t = Instant::now();
        s.index.append_with(&rows, opts).await?;
        s.record_append(t.elapsed().as_secs_f64() * 1e3);
        s.acked.fetch_add(rows.num_rows(), Ordering::Relaxed);
        if !doomed.is_empty() {
            let t = Instant::now();
            s.index.delete_with(&doomed, opts).await?;
            s.record_append(t.elapsed().as_secs_f64() * 1e3);
            s.acked.fetch_add(doomed.len(), Ordering::Relaxed);
        }
    }
    Ok(())
}

async fn run_query(s: &Shared, kind: &str, i: usize) -> Result<()> {
    let q = i % s.queries.len();
    match kind {
        "fts" => {
            s.index
                .search_fts(&s.queries[q], &SearchOptions::with_k(10))
                .await?;
        }
        "vector" => {
            s.index
                .search_vector(&s.query_vectors[q], &VectorSearchOptions::default())
                .await?;
        }
        _ => {
            let opts = VectorSearchOptions {
                filter: Some("bucket < 10".into()),
                ..Default::default()
            };
            s.index.search_vector(&s.query_vectors[q], &opts).await?;
        }
    }
    Ok(())
}

async fn reader(s: Arc<Shared>, o: StreamOptions, r: usize) -> Result<()> {
    let every = (o.qps > 0.0)
        .then(|| Duration::try_from_secs_f64(o.readers as f64 / o.qps).ok())
        .flatten();
    let mut next_at =
        Instant::now() + every.map_or(Duration::ZERO, |e| e.mul_f64(r as f64 / o.readers as f64));
    let mut i = r;
    while !s.stop.load(Ordering::Relaxed) {
        if let Some(every) = every {
            let now = Instant::now();
            if next_at > now {
                tokio::time::sleep(next_at - now).await;
            }
            next_at += every;
        }
        let kind = &o.kinds[i % o.kinds.len()];
        let t = Instant::now();
        run_query(&s, kind, i / o.kinds.len()).await?;
        s.record_query(kind, t.elapsed().as_secs_f64() * 1e3);
        i += o.readers;
    }
    Ok(())
}

/// Keys and scores (or distances) of a search result, in its order.
type Ranked = Vec<(i64, f32)>;

/// [`Ranked`] of a search result.
fn ranked(batches: &[RecordBatch]) -> Ranked {
    let mut out = Vec::new();
    for b in batches {
        let keys = b.column(0).as_primitive::<Int64Type>();
        let scores = b
            .column(1)
            .as_any()
            .downcast_ref::<Float32Array>()
            .cloned()
            .unwrap_or_else(|| Float32Array::from(vec![0.0; b.num_rows()]));
        for r in 0..b.num_rows() {
            out.push((keys.value(r), scores.value(r)));
        }
    }
    out
}

/// Vector queries a checkpoint compares with exact search.
const VECTOR_PROBES: usize = 50;

/// What a checkpoint reads while the writers wait.
struct Snapshot {
    t: f64,
    rows: Vec<RecordBatch>,
    fts: Vec<(String, Ranked)>,
    /// `(graph, exact)` answers: keys and distances.
    vector: Vec<(Ranked, Ranked)>,
}

async fn snapshot(s: &Shared, t: f64, n: usize) -> Result<Snapshot> {
    let _all = s.pause.write().await;
    let rows = s.index.scan(ScanOptions::default()).await?;
    let mut fts = Vec::new();
    for i in 0..10 {
        let q = &s.queries[(n * 10 + i) % s.queries.len()];
        let got = s.index.search_fts(q, &SearchOptions::with_k(10)).await?;
        fts.push((q.clone(), ranked(&got)));
    }
    let mut vector = Vec::new();
    for i in 0..VECTOR_PROBES {
        let q = &s.query_vectors[(n * VECTOR_PROBES + i) % s.query_vectors.len()];
        let graph = s
            .index
            .search_vector(q, &VectorSearchOptions::default())
            .await?;
        let exact = VectorSearchOptions {
            exact: true,
            ..Default::default()
        };
        let truth = s.index.search_vector(q, &exact).await?;
        vector.push((ranked(&graph), ranked(&truth)));
    }
    Ok(Snapshot {
        t,
        rows,
        fts,
        vector,
    })
}

/// Compare a snapshot's answers with the independent references.
fn check(snap: &Snapshot, schema: &IndexSchema) -> Result<Checkpoint> {
    let live_rows = snap.rows.iter().map(RecordBatch::num_rows).sum();
    let mut recall = 0.0;
    for (got, want) in &snap.vector {
        // A graph answer counts when it is as near as the exact k-th: rows with equal
        // vectors (the stream reuses its pool's vectors under new keys) tie, whichever key.
        match want.last() {
            Some((_, kth)) => {
                let bound = kth + 1e-5 * kth.abs().max(1e-3);
                let hits = got
                    .iter()
                    .filter(|(_, d)| *d <= bound)
                    .count()
                    .min(want.len());
                recall += hits as f64 / want.len() as f64;
            }
            None => recall += 1.0,
        }
    }
    let reference = reference::Reference::new(schema, &snap.rows)?;
    let mut mismatches = 0;
    for (q, ours) in &snap.fts {
        let all = reference.search(q)?;
        if !reference::same_ranking(ours, &all, 10) {
            mismatches += 1;
        }
    }
    Ok(Checkpoint {
        t: snap.t,
        live_rows,
        recall_at_10: recall / snap.vector.len().max(1) as f64,
        fts_queries: snap.fts.len(),
        fts_mismatches: mismatches,
    })
}

mod reference {
    //! One tantivy index over a snapshot's live rows, with tantivy's own statistics.
    use crate::{Error, IndexSchema, Result};
    use arrow::array::{Array, AsArray, RecordBatch};
    use arrow::datatypes::Int64Type;
    use tantivy::collector::TopDocs;
    use tantivy::query::QueryParser;
    use tantivy::schema::{Field, Value, FAST, STORED, TEXT};
    use tantivy::TantivyDocument;

    pub(super) struct Reference {
        index: tantivy::Index,
        fields: Vec<Field>,
        id: Field,
    }

    impl Reference {
        pub(super) fn new(schema: &IndexSchema, rows: &[RecordBatch]) -> Result<Reference> {
            let mut b = tantivy::schema::Schema::builder();
            let id = b.add_i64_field("id", STORED | FAST);
            let fields: Vec<Field> = schema
                .text
                .iter()
                .map(|c| b.add_text_field(c, TEXT))
                .collect();
            let index = tantivy::Index::create_in_ram(b.build());
            let mut w: tantivy::IndexWriter = index.writer_with_num_threads(1, 100_000_000)?;
            for batch in rows {
                let keys = batch.column(0).as_primitive::<Int64Type>();
                for r in 0..batch.num_rows() {
                    let mut d = TantivyDocument::default();
                    d.add_i64(id, keys.value(r));
                    for (f, name) in fields.iter().zip(&schema.text) {
                        let col = batch
                            .column_by_name(name)
                            .ok_or_else(|| Error::internal("scan without a text column"))?
                            .as_string::<i32>();
                        if !col.is_null(r) {
                            d.add_text(*f, col.value(r));
                        }
                    }
                    w.add_document(d)?;
                }
            }
            w.commit()?;
            Ok(Reference { index, fields, id })
        }

        /// Every match, by score descending then key.
        pub(super) fn search(&self, query: &str) -> Result<Vec<(i64, f32)>> {
            let parser = QueryParser::for_index(&self.index, self.fields.clone());
            let q = parser.parse_query(query)?;
            let searcher = self.index.reader()?.searcher();
            let n = (searcher.num_docs() as usize).max(1);
            let hits = searcher.search(&q, &TopDocs::with_limit(n).order_by_score())?;
            let mut out = Vec::with_capacity(hits.len());
            for (score, addr) in hits {
                let d: TantivyDocument = searcher.doc(addr)?;
                let key = d
                    .get_first(self.id)
                    .and_then(|v| v.as_i64())
                    .ok_or_else(|| Error::internal("reference document without key"))?;
                out.push((key, score));
            }
            out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            Ok(out)
        }
    }

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1e-6)
    }

    /// `ours` (top k) against every reference match: as many rows, scores equal within 1e-5
    /// relative at every rank, the same keys except among rows tied with the k-th score.
    pub(super) fn same_ranking(ours: &[(i64, f32)], all: &[(i64, f32)], k: usize) -> bool {
        let n = k.min(all.len());
        if ours.len() != n {
            return false;
        }
        for (i, (key, score)) in ours.iter().enumerate() {
            if !close(*score, all[i].1) {
                return false;
            }
            let tied_with_last = close(*score, all[n - 1].1);
            if !tied_with_last && *key != all[i].0 {
                return false;
            }
            if tied_with_last && !all.iter().any(|(k2, s2)| k2 == key && close(*s2, *score)) {
                return false;
            }
        }
        true
    }
}

impl StreamOptions {
    /// Refuse options the benchmark cannot run with.
    fn check(&self) -> Result<()> {
        let o = self;
        let rate_ok = |r: f64| r.is_finite() && r >= 0.0;
        if o.writers == 0 || o.batch == 0 || o.dim == 0 || !rate_ok(o.rate) || !rate_ok(o.qps) {
            return Err(crate::Error::invalid(
                "writers, batch and dim must be at least 1, rate and qps at least 0",
            ));
        }
        if o.readers > 0 && o.kinds.is_empty() {
            return Err(crate::Error::invalid("readers need query kinds"));
        }
        if let Some(k) = o
            .kinds
            .iter()
            .find(|k| !["fts", "vector", "filtered"].contains(&k.as_str()))
        {
            return Err(crate::Error::invalid(format!(
                "unknown query kind '{k}' (fts, vector, filtered)"
            )));
        }
        Ok(())
    }
}

/// The corpus, its pools of rows and vectors, and a new index in `<out>/index` with the
/// benchmark's schema.
async fn prepare(o: &StreamOptions) -> Result<(Arc<Shared>, IndexSchema, PathBuf)> {
    let corpus = Corpus::load(o.data.as_deref())?;
    let mut embedder = Embedder::new(o.dim);
    let pool_rows = 20_000usize;
    let mut pool = Vec::new();
    for from in (0..pool_rows).step_by(o.batch.max(1).min(pool_rows)) {
        let n = o.batch.max(1).min(pool_rows - from);
        pool.push(corpus.batch(Some(&mut embedder), from, n)?);
    }
    // Equal-sized pool batches: `rows_with_keys` indexes them by position.
    let per = pool[0].num_rows();
    pool.retain(|b| b.num_rows() == per);
    let bases = (0..per * pool.len())
        .map(|i| {
            let (title, text) = corpus.document(i);
            embedder.embed(&format!("{title} {text}"), 0, 0.0)
        })
        .collect();
    let queries = corpus.queries().to_vec();
    let query_vectors = queries.iter().map(|q| embedder.embed(q, 0, 0.0)).collect();
    let dir = o.out.join("index");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| crate::Error::invalid(format!("cannot create {}: {e}", dir.display())))?;
    let schema = Corpus::schema(Some(o.dim));
    let index = Index::create(
        Location::parse(&dir.display().to_string())?,
        schema.clone(),
        o.settings.clone(),
    )
    .await?;
    let s = Arc::new(Shared {
        index,
        pause: tokio::sync::RwLock::new(()),
        interval: Mutex::default(),
        total: Mutex::default(),
        acked: AtomicUsize::new(0),
        next_key: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        pool,
        bases,
        dim: o.dim,
        queries,
        query_vectors,
    });
    Ok((s, schema, dir))
}

/// A latency as `p50/p99/max` milliseconds (`-` without samples).
fn p50_p99_max(l: Option<&Latency>) -> String {
    l.map_or("-".to_string(), |l| {
        format!("{:.1}/{:.1}/{:.0}", l.p50_ms, l.p99_ms, l.max_ms)
    })
}

impl Interval {
    /// The interval as a line of the printed table.
    fn line(&self) -> String {
        format!(
            "{:>6.0} {:>8.0} {:>19} {:>19} {:>19} {:>19} {:>5} {:>4} {:>8} {:>8} {:>9} {:>7.0}",
            self.t,
            self.rows_per_s,
            p50_p99_max(Some(&self.append)),
            p50_p99_max(self.queries.get("fts")),
            p50_p99_max(self.queries.get("vector")),
            p50_p99_max(self.queries.get("filtered")),
            self.generations,
            self.compactions,
            self.compaction_debt_rows,
            self.memtable_rows,
            self.unindexed_rows,
            self.rss_mib
        )
    }
}

impl StreamReport {
    /// The lines printed after the run.
    fn summary(&self) -> Vec<String> {
        let mut out = Vec::new();
        out.push(format!(
            "total: {} rows in {:.1} s = {:.0} rows/s; append p50 {:.1} ms, p99 {:.1} ms, max {:.0} ms",
            self.rows,
            self.seconds,
            self.rows_per_s,
            self.append.p50_ms,
            self.append.p99_ms,
            self.append.max_ms
        ));
        for (k, l) in &self.queries {
            out.push(format!(
                "       {k}: {} queries, p50 {:.2} ms, p99 {:.2} ms, max {:.0} ms",
                l.count, l.p50_ms, l.p99_ms, l.max_ms
            ));
        }
        for c in &self.checkpoints {
            out.push(format!(
                "checkpoint at {:.0} s: {} live rows, recall@10 {:.3}, full-text {} of {} queries differ from one tantivy index",
                c.t, c.live_rows, c.recall_at_10, c.fts_mismatches, c.fts_queries
            ));
        }
        out.push(format!(
            "peak RSS {:.0} MiB = {:.0} MiB per 100,000 rows acknowledged; {} live rows at the end",
            self.peak_rss_mib, self.peak_rss_mib_per_100k_rows, self.live_rows
        ));
        out.push(format!(
            "generations: at most {} at once, {} after the final flush ({} rows, {} bytes), {} compactions{}",
            self.max_generations,
            self.generations_at_end,
            self.generation_rows,
            self.generation_bytes,
            self.compactions,
            self
                .space_amplification
                .map(|a| format!("; space amplification {a:.2}"))
                .unwrap_or_default()
        ));
        out
    }
}

/// What the sampling loop of a stream run gathered.
struct Sampled {
    intervals: Vec<Interval>,
    snapshots: Vec<Snapshot>,
    peak_rss: f64,
    /// Seconds the run lasted, checkpoints left out.
    seconds: f64,
}

/// Sample the run every interval (printing a line with `say`) and take the checkpoints, until
/// the duration has passed; fails when a task of `tasks` ends early.
async fn sample(
    o: &StreamOptions,
    s: &Arc<Shared>,
    tasks: &mut tokio::task::JoinSet<Result<()>>,
    say: &dyn Fn(String),
) -> Result<Sampled> {
    say(format!(
        "{:>6} {:>8} {:>19} {:>19} {:>19} {:>19} {:>5} {:>4} {:>8} {:>8} {:>9} {:>7}",
        "t(s)",
        "rows/s",
        "append p50/p99/max",
        "fts p50/p99/max",
        "vector p50/p99/max",
        "filtered p50/p99/max",
        "gens",
        "cmp",
        "debt",
        "mem",
        "unindexed",
        "RSS MiB"
    ));
    let started = Instant::now();
    let mut paused = Duration::ZERO;
    let mut intervals = Vec::new();
    let mut snapshots = Vec::new();
    let mut last_acked = 0;
    let mut last_t = 0.0;
    let mut peak_rss = rss_mib();
    let mut next_checkpoint = o.checkpoint;
    loop {
        let running = started.elapsed() - paused;
        if running >= o.duration {
            break;
        }
        let next_print =
            Duration::from_secs_f64(last_t) + o.interval.max(Duration::from_millis(100));
        let wake = next_print.min(o.duration);
        tokio::select! {
            _ = tokio::time::sleep(wake.saturating_sub(running)) => {}
            Some(r) = tasks.join_next() => {
                s.stop.store(true, Ordering::SeqCst);
                r.map_err(|e| crate::Error::internal(format!("stream task: {e}")))??;
                return Err(crate::Error::internal("a stream task ended early"));
            }
        }
        let running = started.elapsed() - paused;
        let t = running.as_secs_f64();
        let acked = s.acked.load(Ordering::Relaxed);
        let samples = std::mem::take(&mut *s.interval.lock().unwrap_or_else(|e| e.into_inner()));
        let st = s.index.stats();
        let rss = rss_mib();
        peak_rss = peak_rss.max(rss);
        let row = Interval {
            t,
            rows_per_s: (acked - last_acked) as f64 / (t - last_t).max(1e-9),
            append: Latency::of(samples.append),
            queries: samples
                .queries
                .into_iter()
                .map(|(k, v)| (k, Latency::of(v)))
                .collect(),
            generations: st.generations.len(),
            memtable_rows: st.memtable_rows + st.frozen_rows,
            unindexed_rows: st.unindexed_rows,
            compactions: st.compactions,
            compaction_debt_rows: st.compaction_debt_rows,
            rss_mib: rss,
        };
        say(row.line());
        intervals.push(row);
        last_acked = acked;
        last_t = t;
        if !o.checkpoint.is_zero() && running >= next_checkpoint {
            next_checkpoint += o.checkpoint;
            let p = Instant::now();
            snapshots.push(snapshot(s, t, snapshots.len()).await?);
            paused += p.elapsed();
        }
    }
    Ok(Sampled {
        intervals,
        snapshots,
        peak_rss,
        seconds: (started.elapsed() - paused).as_secs_f64(),
    })
}

/// Run the stream (see the module documentation).
pub async fn run(o: &StreamOptions) -> Result<StreamReport> {
    o.check()?;
    let (s, schema, dir) = prepare(o).await?;
    let mut tasks = tokio::task::JoinSet::new();
    let max_generations = Arc::new(AtomicUsize::new(0));
    {
        let (s, most) = (s.clone(), max_generations.clone());
        tasks.spawn(async move {
            while !s.stop.load(Ordering::SeqCst) {
                most.fetch_max(s.index.stats().generations.len(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(())
        });
    }
    for w in 0..o.writers {
        tasks.spawn(writer(s.clone(), o.clone(), w));
    }
    for r in 0..o.readers {
        tasks.spawn(reader(s.clone(), o.clone(), r));
    }
    let say = |line: String| {
        if o.print {
            println!("{line}");
        }
    };
    let sampled = sample(o, &s, &mut tasks, &say).await?;
    let (intervals, snapshots, peak_rss) = (sampled.intervals, sampled.snapshots, sampled.peak_rss);
    s.stop.store(true, Ordering::SeqCst);
    let seconds = sampled.seconds;
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| crate::Error::internal(format!("stream task: {e}")))??;
    }
    let acked = s.acked.load(Ordering::Relaxed);
    let live_rows = s
        .index
        .scan(ScanOptions::default())
        .await?
        .iter()
        .map(RecordBatch::num_rows)
        .sum();
    let mut checkpoints = Vec::new();
    for snap in &snapshots {
        checkpoints.push(check(snap, &schema)?);
    }
    s.index.flush().await?;
    let end = s.index.stats();
    let generation_bytes: u64 = end.generations.iter().map(|g| g.bytes).sum();
    let space_amplification = if o.compact_at_end {
        let one = match s.index.compact().await? {
            Some(r) => r.bytes_out,
            None => generation_bytes,
        };
        Some(generation_bytes as f64 / one.max(1) as f64)
    } else {
        None
    };
    s.index.close().await?;
    let total = std::mem::take(&mut *s.total.lock().unwrap_or_else(|e| e.into_inner()));
    let report = StreamReport {
        writers: o.writers,
        batch: o.batch,
        rate: o.rate,
        readers: o.readers,
        qps: o.qps,
        seconds,
        rows: acked,
        rows_per_s: acked as f64 / seconds.max(1e-9),
        append: Latency::of(total.append),
        queries: total
            .queries
            .into_iter()
            .map(|(k, v)| (k, Latency::of(v)))
            .collect(),
        intervals,
        checkpoints,
        peak_rss_mib: peak_rss,
        live_rows,
        peak_rss_mib_per_100k_rows: peak_rss / (acked.max(1) as f64 / 100_000.0),
        max_generations: max_generations.load(Ordering::Relaxed),
        generations_at_end: end.generations.len(),
        generation_rows: end.generations.iter().map(|g| g.rows).sum(),
        generation_bytes,
        compactions: end.compactions,
        space_amplification,
    };
    for line in report.summary() {
        say(line);
    }
    let path = o.out.join("results.json");
    let json = serde_json::to_vec_pretty(&report)
        .map_err(|e| crate::Error::internal(format!("results.json: {e}")))?;
    std::fs::write(&path, json)
        .map_err(|e| crate::Error::invalid(format!("cannot write {}: {e}", path.display())))?;
    let png = o.out.join("stream.png");
    match plot_stream(&report, &png) {
        Ok(()) => say(format!(
            "wrote {} and {}",
            o.out.join("results.json").display(),
            png.display()
        )),
        Err(e) => say(format!("no plot: {e}")),
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}
/// `stream.png`: three panels against time: acknowledged rows/s; append and query p99
/// latency (log scale); generations, memtable and unindexed rows.
fn plot_stream(report: &StreamReport, path: &std::path::Path) -> Result<(), String> {
    use plotters::prelude::*;
    super::plot::register_font()?;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let rows = &report.intervals;
    let t_max = rows.last().map_or(1.0, |r| r.t).max(1.0);
    let root = BitMapBackend::new(path, (1500, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let areas = root.split_evenly((1, 3));
    let colors = super::plot::PALETTE;
    type Series = (String, Vec<(f64, f64)>);
    let draw = |area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
                title: &str,
                y_desc: &str,
                log: bool,
                series: Vec<Series>|
     -> Result<(), String> {
        let y_max = series
            .iter()
            .flat_map(|s| s.1.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            * 1.15
            + 1.0;
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(65);
        macro_rules! body {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc("seconds")
                    .y_desc(y_desc)
                    .draw()
                    .map_err(|e| err(&e))?;
                for ((name, pts), color) in series.into_iter().zip(colors) {
                    chart
                        .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                        .map_err(|e| err(&e))?
                        .label(name)
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                        });
                }
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .position(SeriesLabelPosition::UpperLeft)
                    .draw()
                    .map_err(|e| err(&e))?;
            }};
        }
        if log {
            body!(builder
                .build_cartesian_2d(0f64..t_max, (0.1f64..y_max).log_scale())
                .map_err(|e| err(&e))?);
        } else {
            body!(builder
                .build_cartesian_2d(0f64..t_max, 0f64..y_max)
                .map_err(|e| err(&e))?);
        }
        Ok(())
    };
    draw(
        &areas[0],
        "acknowledged rows/s",
        "rows/s",
        false,
        vec![(
            "rows/s".into(),
            rows.iter().map(|r| (r.t, r.rows_per_s)).collect(),
        )],
    )?;
    let mut latency = vec![(
        "append".to_string(),
        rows.iter()
            .map(|r| (r.t, r.append.p99_ms.max(0.1)))
            .collect(),
    )];
    for kind in ["fts", "vector", "filtered"] {
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|r| r.queries.get(kind).map(|l| (r.t, l.p99_ms.max(0.1))))
            .collect();
        if !pts.is_empty() {
            latency.push((kind.to_string(), pts));
        }
    }
    draw(&areas[1], "p99 latency", "ms", true, latency)?;
    draw(
        &areas[2],
        "index shape",
        "count",
        false,
        vec![
            (
                "generations x1000".into(),
                rows.iter()
                    .map(|r| (r.t, r.generations as f64 * 1000.0))
                    .collect(),
            ),
            (
                "memtable rows".into(),
                rows.iter().map(|r| (r.t, r.memtable_rows as f64)).collect(),
            ),
            (
                "unindexed rows".into(),
                rows.iter()
                    .map(|r| (r.t, r.unindexed_rows as f64))
                    .collect(),
            ),
        ],
    )?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
