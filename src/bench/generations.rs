//! The generations benchmark (`lsmsearch bench generations`): how query latency and object-store
//! round trips grow with the number of generations, on a local directory seen through a
//! [`LatencyStore`] that adds an object store's per-request latency.
//!
//! For each generation count G it builds an index of N documents ([`super::corpus`]) split into G
//! generations plus a 1,000-row memtable (left in the WAL), then runs full-text, vector and
//! filtered full-text queries: **cold** (a new read-only handle over the latency store, nothing
//! cached: open plus one query) and **warm** (the same handle again and again). It prints
//! p50/p95/p99, GETs and sequential round trips per query, fits the slope of p50 against G,
//! and writes `results.json` and `latency.png` into the output directory.

use super::corpus::{Corpus, Embedder};
use crate::{
    Durability, Error, Index, IndexSchema, LatencyConfig, LatencyStore, Location, Result,
    SearchOptions, Settings, VectorSearchOptions, WriteOptions,
};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to build and measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// N Cranfield-derived documents with 128-d vectors in G generations (G from the list).
    Generations,
    /// 400,000 rows in 800 generations of 500 rows, 128-d vectors, brute-force vector search.
    ManySmall,
    /// 40 generations of 50 rows with 768-d vectors, exact scan.
    WideVectors,
}

/// Options of the benchmark: the flags of `lsmsearch bench generations`, and their defaults
/// ([`Default`] is what the flags declare).
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Documents per index (Cranfield text replicated, with 128-d vectors).
    #[arg(long, default_value_t = 100_000)]
    pub docs: usize,
    /// Generation counts, comma-separated.
    #[arg(long, default_value = "1,2,5,10,18,32,64", value_delimiter = ',')]
    pub gens: Vec<usize>,
    /// Latency added to every GET, HEAD and LIST, in milliseconds.
    #[arg(long = "get-latency-ms", default_value = "10", value_parser = super::options::millis)]
    pub get_latency: Duration,
    /// Latency added to every PUT and DELETE, in milliseconds.
    #[arg(long = "put-latency-ms", default_value = "20", value_parser = super::options::millis)]
    pub put_latency: Duration,
    /// Output directory (indexes are built here and removed after use).
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// A Cranfield collection directory (default: the collection this binary carries,
    /// `tests/data/cranfield` of the repository).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Warm queries per kind.
    #[arg(long, default_value_t = 200)]
    pub warm_queries: usize,
    /// The query kinds measured (the default shape), comma-separated: `fts`, `vector`,
    /// `filtered`, `fts+text`, `hybrid`, `fts@100`, `vector@100`. The query surface's costs
    /// are measured together over the kinds given among theirs (all of them by default).
    #[arg(
        long,
        default_value = "fts,vector,filtered,fts+text,hybrid,fts@100,vector@100",
        value_delimiter = ','
    )]
    pub kinds: Vec<String>,
    /// Cold queries (a new handle each) per kind.
    #[arg(long, default_value_t = 7)]
    pub cold_queries: usize,
    /// Vector dimension of the default shape.
    #[arg(skip = 128usize)]
    pub dim: usize,
    /// `generations`, `many-small` (800 generations of 500 rows, brute-force vector search)
    /// or `wide-vectors` (40 generations of 50 rows, 768-d, exact scan).
    #[arg(long, value_enum, default_value = "generations")]
    pub shape: Shape,
    /// Show progress bars (the command line: on a terminal, without `--json`).
    #[arg(skip = false)]
    pub progress: bool,
    /// Print the table as rows are measured (the command line: without `--json`).
    #[arg(skip = true)]
    pub print: bool,
    /// Keep the built indexes in OUT and reuse one built with the same parameters (its
    /// `bench-build.json` matches) instead of building it again.
    #[arg(long)]
    pub reuse: bool,
    /// Build with compaction on: each of the G flushes may be merged, and the index is
    /// measured once compaction has nothing left to do (the table's generation column still
    /// counts flushes; the count left is printed). Default off: exactly G generations.
    #[arg(long)]
    pub compaction: bool,
}

impl Default for Options {
    fn default() -> Self {
        super::options::defaults()
    }
}

impl Options {
    /// Refuse options the benchmark cannot run with, naming the flag.
    pub fn check(&self) -> Result<()> {
        if self.gens.is_empty() || self.gens.contains(&0) || self.docs <= 1000 {
            return Err(Error::invalid(
                "--gens needs counts of at least 1 and --docs more than 1,000 (the memtable)",
            ));
        }
        if let Some(k) = self.kinds.iter().find(|k| !KINDS.contains(&k.as_str())) {
            return Err(Error::invalid(format!(
                "--kinds: no query kind '{k}' (kinds: {})",
                KINDS.join(", ")
            )));
        }
        if self.warm_queries == 0 || self.cold_queries == 0 {
            return Err(Error::invalid(
                "--warm-queries and --cold-queries need at least 1",
            ));
        }
        Ok(())
    }
}

/// One measured (generations, query kind, mode).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Run {
    /// Generations in the index (plus a memtable).
    pub generations: usize,
    /// `fts`, `vector`, `filtered`, `fts+text` (the text of the rows returned too),
    /// `hybrid`, or `fts@100` and `vector@100` (a hybrid search's two parts run alone).
    pub query: String,
    /// `cold` or `warm`.
    pub mode: String,
    /// Latency percentiles in milliseconds (cold: open plus query).
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// GET requests per query (median).
    pub gets: u64,
    /// All requests per query (median).
    pub requests: u64,
    /// Sequential round trips per query (median).
    pub round_trips: u64,
    /// Most requests in flight at once (median).
    pub peak_concurrency: u64,
    /// Bytes fetched from the object store per query (median; cold: the open included).
    #[serde(default)]
    pub bytes_read: u64,
    /// Queries measured.
    pub samples: usize,
}

/// Everything the benchmark measured.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Report {
    /// Documents per index.
    pub docs: usize,
    /// `generations`, `many-small` or `wide-vectors`.
    pub shape: String,
    /// Latency added to every GET.
    pub get_latency_ms: f64,
    /// One entry per (generations, query, mode).
    pub runs: Vec<Run>,
    /// Least-squares slope of p50 against G, per `query/mode` (e.g. `fts/warm`).
    pub slope_ms_per_generation: std::collections::BTreeMap<String, f64>,
    /// Seconds spent building each index, by generation count.
    pub build_seconds: std::collections::BTreeMap<usize, f64>,
    /// Per generation count: the share of a hybrid search's top 10 (graphs walked) that the
    /// same search with exact vectors returns, over the corpus's queries.
    #[serde(default)]
    pub hybrid_overlap: std::collections::BTreeMap<usize, f64>,
    /// Per generation count: warm p50 (ms) of the query kinds the query surface's costs
    /// compare (`fts`, `fts+text`, `vector`, `hybrid`, `fts@100`, `vector@100`), measured
    /// together: one handle, each query of each kind in turn, so the machine's drift over
    /// the run weighs on every kind alike.
    #[serde(default)]
    pub together_p50_ms: std::collections::BTreeMap<usize, std::collections::BTreeMap<String, f64>>,
    /// Per generation count: warm p50 of a full-text search returning its rows' text, less
    /// that of the same search without it (ms; measured together).
    #[serde(default)]
    pub text_cost_ms: std::collections::BTreeMap<usize, f64>,
    /// Per generation count: warm p50 of a hybrid search over the slower of its two parts
    /// run alone (`fts@100`, `vector@100`; measured together).
    #[serde(default)]
    pub hybrid_ratio: std::collections::BTreeMap<usize, f64>,
    /// Per generation count: warm p50 of a hybrid search over the slower of a full-text and
    /// a vector search of 10 rows (measured together).
    #[serde(default)]
    pub hybrid_over_top10: std::collections::BTreeMap<usize, f64>,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Least-squares slope of `y` against `x`.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

/// A query the benchmark runs.
#[derive(Debug, Clone)]
enum Query {
    Fts(String, Option<String>),
    /// A full-text search returning the text of its rows too.
    FtsText(String),
    Vector(Vec<f32>, bool),
    /// A hybrid search (reciprocal rank fusion, 100 candidates a part, the graphs walked).
    Hybrid(String, Vec<f32>),
    /// The full-text part of a hybrid search, run alone: its candidates, no columns.
    FtsPart(String),
    /// The vector part of a hybrid search, run alone: its candidates, no columns.
    VectorPart(Vec<f32>),
}

impl Query {
    async fn run(&self, index: &crate::ReadOnlyIndex) -> Result<usize> {
        let batches = match self {
            Query::Fts(q, filter) => {
                let opts = SearchOptions {
                    filter: filter.clone(),
                    columns: Some(index.schema().payload_names()),
                    ..SearchOptions::with_k(10)
                };
                index.search_fts(q, &opts).await?
            }
            Query::FtsText(q) => {
                let mut columns = index.schema().text.clone();
                columns.extend(index.schema().payload_names());
                let opts = SearchOptions {
                    columns: Some(columns),
                    ..SearchOptions::with_k(10)
                };
                index.search_fts(q, &opts).await?
            }
            Query::Vector(v, exact) => {
                let opts = VectorSearchOptions {
                    exact: *exact,
                    columns: Some(index.schema().payload_names()),
                    ..VectorSearchOptions::with_k(10)
                };
                index.search_vector(v, &opts).await?
            }
            Query::Hybrid(q, v) => {
                let opts = crate::HybridSearchOptions {
                    columns: Some(index.schema().payload_names()),
                    ..crate::HybridSearchOptions::with_k(10)
                };
                index.search_hybrid(q, v, &opts).await?
            }
            Query::FtsPart(q) => {
                let opts = SearchOptions {
                    columns: Some(Vec::new()),
                    ..SearchOptions::with_k(crate::query::hybrid::DEFAULT_CANDIDATES)
                };
                index.search_fts(q, &opts).await?
            }
            Query::VectorPart(v) => {
                let opts = VectorSearchOptions {
                    columns: Some(Vec::new()),
                    ..VectorSearchOptions::with_k(crate::query::hybrid::DEFAULT_CANDIDATES)
                };
                index.search_vector(v, &opts).await?
            }
        };
        Ok(batches.iter().map(|b| b.num_rows()).sum())
    }
}

/// How an index of the benchmark is filled.
struct Build<'a> {
    schema: IndexSchema,
    total: usize,
    /// Rows per generation, oldest first; the rest stays in the memtable.
    generations: Vec<usize>,
    rows: Box<dyn FnMut(usize, usize) -> Result<arrow::array::RecordBatch> + 'a>,
}

fn progress(show: bool, len: u64, what: String) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>28} [{bar:40}] {pos}/{len} rows ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what);
    bar
}

/// Build the index in `dir` (plain local disk: building is not what is measured). With
/// `reuse`, an index already in `dir` built with the same parameters is kept (0 seconds).
async fn build(
    dir: &Path,
    mut b: Build<'_>,
    show: bool,
    reuse: bool,
    compaction: bool,
) -> Result<f64> {
    let marker = dir.join("bench-build.json");
    let params = serde_json::json!({
        "schema": b.schema,
        "total": b.total,
        "generations": b.generations,
        "compaction": compaction,
        "format": 2,
    })
    .to_string();
    if reuse && std::fs::read_to_string(&marker).is_ok_and(|m| m == params) {
        return Ok(0.0);
    }
    let _ = std::fs::remove_dir_all(dir);
    let loc = Location::parse(&dir.display().to_string())?;
    // Exactly the generations asked for, unless compaction is to merge them.
    let settings = Settings {
        memtable_max_rows: usize::MAX / 2,
        memtable_max_bytes: usize::MAX / 2,
        memtable_graph_above: usize::MAX,
        compaction,
        ..Settings::default()
    };
    let started = Instant::now();
    let index = Index::create(loc, b.schema.clone(), settings).await?;
    let bar = progress(
        show,
        b.total as u64,
        format!("{} generations", b.generations.len()),
    );
    let buffered = WriteOptions::with_durability(Durability::Buffered);
    let mut at = 0;
    let mut bounds: Vec<usize> = b
        .generations
        .iter()
        .scan(0, |s, n| {
            *s += n;
            Some(*s)
        })
        .collect();
    bounds.push(b.total);
    for (g, end) in bounds.iter().enumerate() {
        while at < *end {
            let n = 2000.min(end - at);
            index.append_with(&(b.rows)(at, n)?, buffered).await?;
            at += n;
            bar.set_position(at as u64);
        }
        if g < b.generations.len() {
            index.flush().await?;
        }
    }
    if compaction {
        // Measured once compaction has nothing left to do.
        let deadline = Instant::now() + Duration::from_secs(1800);
        while index.stats().compaction_debt_rows > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let st = index.stats();
        eprintln!(
            "{} flushes: {} generations after {} compactions",
            b.generations.len(),
            st.generations.len(),
            st.compactions
        );
    }
    index.close().await?;
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    std::fs::write(&marker, params)
        .map_err(|e| Error::invalid(format!("cannot write {}: {e}", marker.display())))?;
    Ok(secs)
}

async fn measure(
    loc: &Location,
    store: &Arc<LatencyStore>,
    g: usize,
    name: &str,
    queries: &[Query],
    o: &Options,
) -> Result<[Run; 2]> {
    let run = |mode: &str, mut ms: Vec<f64>, counts: Vec<crate::StoreCounters>| {
        ms.sort_by(f64::total_cmp);
        Run {
            generations: g,
            query: name.to_string(),
            mode: mode.to_string(),
            p50_ms: pct(&ms, 0.5),
            p95_ms: pct(&ms, 0.95),
            p99_ms: pct(&ms, 0.99),
            gets: median(counts.iter().map(|c| c.gets).collect()),
            requests: median(
                counts
                    .iter()
                    .map(|c| c.gets + c.heads + c.lists + c.puts + c.deletes)
                    .collect(),
            ),
            round_trips: median(counts.iter().map(|c| c.round_trips).collect()),
            peak_concurrency: median(counts.iter().map(|c| c.peak_concurrency).collect()),
            bytes_read: median(counts.iter().map(|c| c.bytes_read).collect()),
            samples: ms.len(),
        }
    };
    // Cold: a new handle per query, nothing cached.
    let (mut ms, mut counts) = (Vec::new(), Vec::new());
    for q in queries.iter().cycle().take(o.cold_queries) {
        store.reset();
        let t = Instant::now();
        let ro = Index::open_read_only(loc.clone(), Settings::default()).await?;
        q.run(&ro).await?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        counts.push(store.counters());
    }
    let cold = run("cold", ms, counts);
    // Warm: one handle, queries after a warm-up pass.
    let ro = Index::open_read_only(loc.clone(), Settings::default()).await?;
    let sample: Vec<&Query> = queries.iter().cycle().take(o.warm_queries).collect();
    for q in &sample {
        q.run(&ro).await?;
    }
    let (mut ms, mut counts) = (Vec::new(), Vec::new());
    for q in &sample {
        store.reset();
        let t = Instant::now();
        q.run(&ro).await?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        counts.push(store.counters());
    }
    Ok([cold, run("warm", ms, counts)])
}

/// The query kinds of the default shape.
const KINDS: [&str; 7] = [
    "fts",
    "vector",
    "filtered",
    "fts+text",
    "hybrid",
    "fts@100",
    "vector@100",
];

/// The query kinds whose warm p50s the query surface's costs compare.
const COST_KINDS: [&str; 6] = [
    "fts",
    "fts+text",
    "vector",
    "hybrid",
    "fts@100",
    "vector@100",
];

/// Warm p50 (ms) of each of `kinds` measured together: one handle, a warm-up pass, then the
/// i-th query of every kind in turn (the order rotating with i), so that what the machine does
/// over the run weighs on every kind alike (kinds measured one after another drift apart by
/// more than the differences the costs look for).
async fn measure_together(
    loc: &Location,
    kinds: &[(&str, &Vec<Query>)],
    o: &Options,
) -> Result<std::collections::BTreeMap<String, f64>> {
    let ro = Index::open_read_only(loc.clone(), Settings::default()).await?;
    for (_, qs) in kinds {
        for q in qs.iter().cycle().take(o.warm_queries) {
            q.run(&ro).await?;
        }
    }
    let mut ms: Vec<Vec<f64>> = vec![Vec::with_capacity(o.warm_queries); kinds.len()];
    for i in 0..o.warm_queries {
        for turn in 0..kinds.len() {
            let k = (i + turn) % kinds.len();
            let qs = kinds[k].1;
            if qs.is_empty() {
                continue;
            }
            let t = Instant::now();
            qs[i % qs.len()].run(&ro).await?;
            ms[k].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(kinds
        .iter()
        .zip(ms)
        .filter(|(_, ms)| !ms.is_empty())
        .map(|((name, _), mut ms)| {
            ms.sort_by(f64::total_cmp);
            (name.to_string(), pct(&ms, 0.5))
        })
        .collect())
}

fn random_unit(seed: u64, dim: usize) -> Vec<f32> {
    // An empty text embeds to zero: the jitter alone gives a random unit vector.
    Embedder::new(dim).embed("", seed, 1.0)
}

fn vector_batch(
    schema: &IndexSchema,
    dim: usize,
    from: usize,
    n: usize,
) -> Result<arrow::array::RecordBatch> {
    use arrow::array::{FixedSizeListArray, Float32Array, Int64Array};
    let values: Vec<f32> = (from..from + n)
        .flat_map(|i| random_unit(i as u64, dim))
        .collect();
    Ok(arrow::array::RecordBatch::try_new(
        schema.arrow_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(
                (from..from + n).map(|i| i as i64),
            )),
            Arc::new(FixedSizeListArray::try_new(
                Arc::new(arrow::datatypes::Field::new(
                    "item",
                    arrow::datatypes::DataType::Float32,
                    true,
                )),
                dim as i32,
                Arc::new(Float32Array::from(values)),
                None,
            )?),
        ],
    )?)
}

fn vector_schema(dim: usize) -> IndexSchema {
    IndexSchema::from_json(&format!(
        r#"{{"primary_key": "id", "primary_key_type": "int64",
            "vector": {{"column": "emb", "dim": {dim}, "metric": "l2"}}}}"#
    ))
    .expect("the benchmark schema is valid")
}

/// The slope of p50 latency against the generation count, per query kind and mode
/// (`fts/warm`, ...).
fn slopes(runs: &[Run]) -> std::collections::BTreeMap<String, f64> {
    let keys: std::collections::BTreeSet<String> = runs
        .iter()
        .map(|r| format!("{}/{}", r.query, r.mode))
        .collect();
    keys.into_iter()
        .map(|k| {
            let pts: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| format!("{}/{}", r.query, r.mode) == k)
                .map(|r| (r.generations as f64, r.p50_ms))
                .collect();
            let s = slope(&pts);
            (k, s)
        })
        .collect()
}

impl Run {
    /// The run as a line of the printed table.
    fn line(&self) -> String {
        format!(
            "{:>5} {:>9} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>6} {:>6} {:>6} {:>9.1}",
            self.generations,
            self.query,
            self.mode,
            self.p50_ms,
            self.p95_ms,
            self.p99_ms,
            self.gets,
            self.round_trips,
            self.peak_concurrency,
            self.bytes_read as f64 / 1e6
        )
    }
}

/// The vector-only shapes: many small generations of 128-d vectors, or few of 768-d ones;
/// records the build time and rows in `report`, returns the runs measured.
async fn vector_shape(
    o: &Options,
    report: &mut Report,
    latency: LatencyConfig,
) -> Result<Vec<Run>> {
    let (g, per, dim) = if o.shape == Shape::ManySmall {
        (800, 500, 128)
    } else {
        (40, 50, 768)
    };
    let schema = vector_schema(dim);
    let dir = o.out.join(format!("index-{}", report.shape));
    let b = Build {
        schema: schema.clone(),
        total: g * per,
        generations: vec![per; g],
        rows: Box::new(|from, n| vector_batch(&schema, dim, from, n)),
    };
    let secs = build(&dir, b, o.progress, o.reuse, o.compaction).await?;
    report.build_seconds.insert(g, secs);
    report.docs = g * per;
    let (loc, store) = Location::parse(&dir.display().to_string())?.with_latency(latency);
    let queries: Vec<Query> = (0..100)
        .map(|i| Query::Vector(random_unit(1 << 40 | i, dim), true))
        .collect();
    let runs = measure(&loc, &store, g, "vector", &queries, o).await?;
    if !o.reuse {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(runs.into())
}

/// Run the benchmark; prints the table as it goes and writes `results.json` and
/// `latency.png` into `o.out`.
pub async fn run(o: &Options) -> Result<Report> {
    o.check()?;
    std::fs::create_dir_all(&o.out)
        .map_err(|e| Error::invalid(format!("cannot create {}: {e}", o.out.display())))?;
    let latency = LatencyConfig {
        read: o.get_latency,
        write: o.put_latency,
        bytes_per_second: None,
    };
    let mut report = Report {
        docs: o.docs,
        shape: match o.shape {
            Shape::Generations => "generations",
            Shape::ManySmall => "many-small",
            Shape::WideVectors => "wide-vectors",
        }
        .to_string(),
        get_latency_ms: o.get_latency.as_secs_f64() * 1e3,
        runs: Vec::new(),
        slope_ms_per_generation: Default::default(),
        build_seconds: Default::default(),
        hybrid_overlap: Default::default(),
        together_p50_ms: Default::default(),
        text_cost_ms: Default::default(),
        hybrid_ratio: Default::default(),
        hybrid_over_top10: Default::default(),
    };
    let say = |line: String| {
        if o.print {
            println!("{line}");
        }
    };
    say(format!(
        "{:>5} {:>9} {:>5} {:>9} {:>9} {:>9} {:>6} {:>6} {:>6} {:>9}",
        "gens", "query", "mode", "p50 ms", "p95 ms", "p99 ms", "GETs", "trips", "peak", "MB read"
    ));
    let print = |r: &Run| say(r.line());
    match o.shape {
        Shape::Generations => generations_shape(o, &mut report, latency, &say).await?,
        Shape::ManySmall | Shape::WideVectors => {
            for r in vector_shape(o, &mut report, latency).await? {
                print(&r);
                report.runs.push(r);
            }
        }
    }
    query_surface_costs(&mut report, &say);
    report.slope_ms_per_generation = slopes(&report.runs);
    say(String::new());
    say("slope of p50 against generations (ms per generation):".to_string());
    for (k, s) in &report.slope_ms_per_generation {
        say(format!("  {k:<16} {s:>8.4}"));
    }
    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| Error::internal(format!("results.json: {e}")))?;
    let path = o.out.join("results.json");
    std::fs::write(&path, json)
        .map_err(|e| Error::invalid(format!("cannot write {}: {e}", path.display())))?;
    say(format!("wrote {}", path.display()));
    if o.shape == Shape::Generations {
        let png = o.out.join("latency.png");
        match plot_latency(&report, &png) {
            Ok(()) => say(format!("wrote {}", png.display())),
            Err(e) => say(format!("no plot: {e}")),
        }
    }
    Ok(report)
}

/// The default shape: the corpus in G generations for each G of `o.gens`, every query kind
/// measured cold and warm, with the hybrid search's overlap with exact vectors.
async fn generations_shape(
    o: &Options,
    report: &mut Report,
    latency: LatencyConfig,
    say: &dyn Fn(String),
) -> Result<()> {
    let corpus = Corpus::load(o.data.as_deref())?;
    let mut embedder = Embedder::new(o.dim);
    let fts: Vec<Query> = corpus
        .queries()
        .iter()
        .map(|q| Query::Fts(q.clone(), None))
        .collect();
    let filtered: Vec<Query> = corpus
        .queries()
        .iter()
        .map(|q| Query::Fts(q.clone(), Some("bucket < 10".into())))
        .collect();
    let vector: Vec<Query> = corpus
        .queries()
        .iter()
        .map(|q| Query::Vector(embedder.embed(q, 0, 0.0), false))
        .collect();
    let fts_text: Vec<Query> = corpus
        .queries()
        .iter()
        .map(|q| Query::FtsText(q.clone()))
        .collect();
    let hybrid: Vec<Query> = corpus
        .queries()
        .iter()
        .map(|q| Query::Hybrid(q.clone(), embedder.embed(q, 0, 0.0)))
        .collect();
    let fts_part: Vec<Query> = corpus
        .queries()
        .iter()
        .map(|q| Query::FtsPart(q.clone()))
        .collect();
    let vector_part: Vec<Query> = corpus
        .queries()
        .iter()
        .map(|q| Query::VectorPart(embedder.embed(q, 0, 0.0)))
        .collect();
    for &g in &o.gens {
        let dir = o.out.join(format!("index-{g}"));
        let flushed = o.docs.saturating_sub(1000);
        let generations = (0..g)
            .map(|i| (i + 1) * flushed / g - i * flushed / g)
            .collect();
        let b = Build {
            schema: Corpus::schema(Some(o.dim)),
            total: o.docs,
            generations,
            rows: Box::new(|from, n| corpus.batch(Some(&mut embedder), from, n)),
        };
        let secs = build(&dir, b, o.progress, o.reuse, o.compaction).await?;
        report.build_seconds.insert(g, secs);
        let (loc, store) = Location::parse(&dir.display().to_string())?.with_latency(latency);
        let kinds: Vec<(&str, &Vec<Query>)> = KINDS
            .iter()
            .filter_map(|name| {
                let queries = match *name {
                    "fts" => &fts,
                    "vector" => &vector,
                    "filtered" => &filtered,
                    "fts+text" => &fts_text,
                    "hybrid" => &hybrid,
                    "fts@100" => &fts_part,
                    "vector@100" => &vector_part,
                    _ => return None,
                };
                Some((*name, queries))
            })
            .collect();
        let asked = |name: &str| o.kinds.iter().any(|k| k == name);
        for (name, qs) in kinds.iter().filter(|(name, _)| asked(name)) {
            for r in measure(&loc, &store, g, name, qs, o).await? {
                say(r.line());
                report.runs.push(r);
            }
        }
        let costs: Vec<(&str, &Vec<Query>)> = kinds
            .iter()
            .filter(|(name, _)| COST_KINDS.contains(name) && asked(name))
            .map(|(name, qs)| (*name, *qs))
            .collect();
        if !costs.is_empty() {
            let together = measure_together(&loc, &costs, o).await?;
            report.together_p50_ms.insert(g, together);
        }
        if asked("hybrid") {
            let overlap = hybrid_overlap(&loc, &hybrid).await?;
            say(format!(
                "{g:>5} hybrid overlap@10, graphs walked against exact vectors: {overlap:.3}"
            ));
            report.hybrid_overlap.insert(g, overlap);
        }
        if !o.reuse {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(())
}

/// The share of each hybrid query's top 10 (the graphs walked) that the same search with
/// exact vector search returns, averaged over `queries`.
async fn hybrid_overlap(loc: &Location, queries: &[Query]) -> Result<f64> {
    let ro = Index::open_read_only(loc.clone(), Settings::default()).await?;
    let keys = |batches: Vec<arrow::array::RecordBatch>| -> Result<Vec<String>> {
        let mut out = Vec::new();
        for b in batches {
            let k = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8)?;
            let k = arrow::array::AsArray::as_string::<i32>(&k);
            out.extend(k.iter().flatten().map(str::to_string));
        }
        Ok(out)
    };
    let (mut sum, mut n) = (0.0, 0usize);
    for q in queries {
        let Query::Hybrid(text, v) = q else { continue };
        let opts = |exact| crate::HybridSearchOptions {
            exact,
            columns: Some(Vec::new()),
            ..crate::HybridSearchOptions::with_k(10)
        };
        let graph = keys(ro.search_hybrid(text, v, &opts(false)).await?)?;
        let exact = keys(ro.search_hybrid(text, v, &opts(true)).await?)?;
        if exact.is_empty() {
            continue;
        }
        let shared = graph.iter().filter(|k| exact.contains(k)).count();
        sum += shared as f64 / exact.len() as f64;
        n += 1;
    }
    Ok(match n {
        0 => 1.0,
        n => sum / n as f64,
    })
}

/// What the query surface costs, from the kinds measured together ([`measure_together`]): the
/// text of the top 10 over a full-text search without it, and a hybrid search over the slower
/// of its two parts.
fn query_surface_costs(report: &mut Report, say: &dyn Fn(String)) {
    let p50 = |g: usize, q: &str| report.together_p50_ms.get(&g)?.get(q).copied();
    let gens: std::collections::BTreeSet<usize> = report.together_p50_ms.keys().copied().collect();
    let mut lines = Vec::new();
    for g in gens {
        let (Some(fts), Some(text), Some(vector), Some(hybrid), Some(fp), Some(vp)) = (
            p50(g, "fts"),
            p50(g, "fts+text"),
            p50(g, "vector"),
            p50(g, "hybrid"),
            p50(g, "fts@100"),
            p50(g, "vector@100"),
        ) else {
            continue;
        };
        let ratio = hybrid / fp.max(vp).max(1e-9);
        let top10 = hybrid / fts.max(vector).max(1e-9);
        report.text_cost_ms.insert(g, text - fts);
        report.hybrid_ratio.insert(g, ratio);
        report.hybrid_over_top10.insert(g, top10);
        lines.push(format!(
            "{g:>5} {fts:>8.2} {text:>8.2} {vector:>8.2} {hybrid:>8.2} {fp:>8.2} {vp:>8.2} {:>+12.3} {ratio:>14.2} {top10:>14.2}",
            text - fts
        ));
    }
    if !lines.is_empty() {
        say(String::new());
        say("warm p50, measured together: text of the top 10 (ms added); hybrid over the slower of its parts (100 candidates each) and of the top-10 searches".to_string());
        say(format!(
            "{:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>12} {:>14} {:>14}",
            "gens",
            "fts",
            "fts+text",
            "vector",
            "hybrid",
            "fts@100",
            "vec@100",
            "text ms",
            "hybrid/parts",
            "hybrid/top10"
        ));
        lines.into_iter().for_each(say);
    }
}

/// `latency.png`: draw the report's p50 latencies against G into `path` (PNG, log-scaled G axis).
fn plot_latency(report: &Report, path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    super::plot::register_font()?;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let max_g = report.runs.iter().map(|r| r.generations).max().unwrap_or(1) as f64;
    // Ticks at the measured generation counts only.
    let ticks: Vec<f64> = report
        .runs
        .iter()
        .map(|r| r.generations)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|g| g as f64)
        .collect();
    let panels = [
        ("cold", "cold: new handle + query"),
        ("warm", "warm: loaded handle"),
    ];
    let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let areas = root.split_evenly((1, 2));
    let colors = super::plot::PALETTE;
    for ((mode, title), area) in panels.iter().zip(areas.iter()) {
        let runs: Vec<&Run> = report.runs.iter().filter(|r| r.mode == *mode).collect();
        let max_ms = runs.iter().map(|r| r.p50_ms).fold(0.0f64, f64::max) * 1.15 + 0.1;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{title}, {} docs, {} ms per GET",
                    report.docs, report.get_latency_ms
                ),
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (1f64..max_g.max(2.0))
                    .log_scale()
                    .with_key_points(ticks.clone()),
                0f64..max_ms,
            )
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("generations")
            .x_label_formatter(&|g| format!("{g:.0}"))
            .y_desc("p50 latency (ms)")
            .draw()
            .map_err(|e| err(&e))?;
        for (query, color) in ["fts", "vector", "filtered"].iter().zip(colors) {
            let mut pts: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| r.query == *query)
                .map(|r| (r.generations as f64, r.p50_ms))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if pts.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(*query)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_is_its_gradient() {
        let pts: Vec<(f64, f64)> = [1.0, 2.0, 5.0, 64.0]
            .iter()
            .map(|x| (*x, 3.0 + 0.5 * x))
            .collect();
        assert!((slope(&pts) - 0.5).abs() < 1e-12);
        assert_eq!(slope(&[(1.0, 2.0)]), 0.0);
    }
}
