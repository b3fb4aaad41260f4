//! `lsmsearch bench shards`: one index against the same rows in N shards, searched in this
//! process and through worker processes (`lsmsearch worker`) over loopback: warm p50 of
//! full-text and vector searches, queries/s with several clients, and peak RSS.
//!
//! The configurations take turns: every query is searched by each configuration in turn, one
//! right after another, in an order drawn anew for each search, so that a machine whose speed
//! drifts over minutes (a virtual machine's does, by 10-20%) favours none of them. The
//! overhead of a distributed configuration is the median over the queries of its latency
//! less that of the same query over the same shards in this process, measured back to back:
//! a paired figure, steadier than the difference of two p50s.

use lsmsearch::bench::corpus::Corpus;
use lsmsearch::shard::distributed::DistributedIndex;
use lsmsearch::shard::ShardedIndex;
use lsmsearch::{
    Error, Index, Location, ReadOnlyIndex, SearchOptions, Settings, VectorSearchOptions,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

/// The flags of `lsmsearch bench shards`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ShardsOptions {
    /// Rows of the benchmark corpus (`bench corpus`).
    #[arg(long, default_value_t = 100_000)]
    docs: usize,
    /// Dimensions of its vectors.
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Shards of the sharded index.
    #[arg(long, default_value_t = 3)]
    shards: u32,
    /// Numbers of worker processes to measure, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    workers: Vec<usize>,
    /// Searches measured per kind and configuration (cycling over the corpus queries), after
    /// a round that warms the caches.
    #[arg(long, default_value_t = 300)]
    queries: usize,
    /// Clients searching at once for the queries/s figure.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Where the corpus and the two indexes are written.
    #[arg(long, default_value = "bench-out/shards")]
    out: PathBuf,
    /// Reuse the corpus and indexes a previous run left in OUT.
    #[arg(long)]
    reuse: bool,
    /// Settings of the shards' handles, as JSON (`lsmsearch worker --settings`): of the
    /// worker processes and of the shards searched in this process they are compared with
    /// (whose cache budgets are per shard there too), e.g. '{"query_threads":1}'.
    #[arg(long, value_parser = crate::settings_json, default_value = "{}")]
    shard_settings: Settings,
}

/// What one configuration measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    /// `one index`, `N shards, this process` or `N shards, W workers`.
    pub config: String,
    pub fts_p50_ms: f64,
    pub vector_p50_ms: f64,
    /// Median over the queries of this configuration's full-text latency less the same
    /// query's over the shards in this process (the distribution's overhead), ms; none for
    /// the configurations in this process.
    pub fts_overhead_ms: Option<f64>,
    /// The same for vector searches.
    pub vector_overhead_ms: Option<f64>,
    /// Searches per second with `clients` clients, full text and vector alternating.
    pub queries_per_s: f64,
    /// Peak RSS of this process (the coordinator, which also ran the in-process
    /// configurations) at the end, MiB.
    pub coordinator_peak_mib: f64,
    /// Peak RSS of each worker process the configuration used, at the end (a worker serves
    /// every configuration with at least as many workers), MiB.
    pub worker_peak_mib: Vec<f64>,
}

/// What the benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ShardsReport {
    pub docs: usize,
    pub shards: u32,
    /// Ingest of the corpus in 1,000-row batches: one index, then the sharded one (rows/s).
    pub ingest_rows_per_s: (f64, f64),
    pub rows: Vec<Row>,
}

impl ShardsReport {
    pub(crate) fn table(&self) -> String {
        let mut out = format!(
            "{} rows; ingest {:.0} rows/s into one index, {:.0} into {} shards\n",
            self.docs, self.ingest_rows_per_s.0, self.ingest_rows_per_s.1, self.shards
        );
        out += &format!(
            "{:<26} {:>10} {:>13} {:>12} {:>15} {:>10} {:>15} {:>16}\n",
            "",
            "fts p50 ms",
            "fts overhead",
            "vector p50 ms",
            "vector overhead",
            "queries/s",
            "coordinator MiB",
            "workers MiB"
        );
        let overhead = |o: Option<f64>| o.map(|o| format!("{o:+.3}")).unwrap_or_default();
        for r in &self.rows {
            let workers: Vec<String> = r
                .worker_peak_mib
                .iter()
                .map(|m| format!("{m:.0}"))
                .collect();
            out += &format!(
                "{:<26} {:>10.3} {:>13} {:>12.3} {:>15} {:>10.1} {:>15.0} {:>16}\n",
                r.config,
                r.fts_p50_ms,
                overhead(r.fts_overhead_ms),
                r.vector_p50_ms,
                overhead(r.vector_overhead_ms),
                r.queries_per_s,
                r.coordinator_peak_mib,
                workers.join(",")
            );
        }
        out
    }
}

/// What a configuration searches.
enum Target {
    One(Box<ReadOnlyIndex>),
    Sharded(ShardedIndex),
    Distributed(DistributedIndex),
}

impl Target {
    /// One search of `kind` (`fts` or `vector`); the rows it returned.
    async fn search(&self, fts: bool, q: &(String, Vec<f32>)) -> lsmsearch::Result<usize> {
        let (t, v) = (SearchOptions::with_k(10), VectorSearchOptions::with_k(10));
        let rows = match (self, fts) {
            (Target::One(i), true) => i.search_fts(&q.0, &t).await?,
            (Target::One(i), false) => i.search_vector(&q.1, &v).await?,
            (Target::Sharded(i), true) => i.search_fts(&q.0, &t).await?,
            (Target::Sharded(i), false) => i.search_vector(&q.1, &v).await?,
            (Target::Distributed(i), true) => i.search_fts(&q.0, &t).await?,
            (Target::Distributed(i), false) => i.search_vector(&q.1, &v).await?,
        };
        Ok(rows.iter().map(|b| b.num_rows()).sum())
    }
}

/// Peak RSS of process `pid` ("self" for this one), MiB, from /proc (0 elsewhere).
fn peak_mib(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Append the corpus's rows to `append` in 1,000-row batches: rows/s.
async fn ingest<F, Fut>(
    docs: &Path,
    schema: &lsmsearch::IndexSchema,
    append: F,
) -> lsmsearch::Result<f64>
where
    F: Fn(arrow::array::RecordBatch) -> Fut,
    Fut: std::future::Future<Output = lsmsearch::Result<()>>,
{
    let started = Instant::now();
    let mut rows = 0;
    for batch in lsmsearch::ingest::read_rows(docs, &schema.arrow_schema(), 1000)? {
        let batch = batch?;
        rows += batch.num_rows();
        append(batch).await?;
    }
    Ok(rows as f64 / started.elapsed().as_secs_f64())
}

/// Build the corpus and both indexes under `out` (unless reused): ingest rows/s of each.
async fn build(o: &ShardsOptions) -> lsmsearch::Result<(f64, f64)> {
    let (corpus, one, sharded) = (
        o.out.join("corpus"),
        o.out.join("one"),
        o.out.join("sharded"),
    );
    if o.reuse && one.exists() && sharded.exists() {
        return Ok((0.0, 0.0));
    }
    for d in [&one, &sharded] {
        let _ = std::fs::remove_dir_all(d);
    }
    Corpus::load(None)?.export(o.docs, o.dim, &corpus)?;
    let schema = Corpus::schema(Some(o.dim));
    let docs = corpus.join("docs.parquet");
    let index = Index::create(
        Location::parse(&path(&one)?)?,
        schema.clone(),
        Settings::default(),
    )
    .await?;
    let one_rate = ingest(&docs, &schema, |b| {
        let index = &index;
        async move { index.append(&b).await.map(drop) }
    })
    .await?;
    index.close().await?;
    let index = ShardedIndex::create(
        Location::parse(&path(&sharded)?)?,
        schema.clone(),
        o.shards,
        Settings::default(),
    )
    .await?;
    let sharded_rate = ingest(&docs, &schema, |b| {
        let index = &index;
        async move { index.append(&b).await.map(drop) }
    })
    .await?;
    index.close().await?;
    Ok((one_rate, sharded_rate))
}

fn path(p: &Path) -> lsmsearch::Result<String> {
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| Error::invalid(format!("{} is not UTF-8", p.display())))
}

/// The median of `v` (0 when empty).
fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// What [`measure`] found of one target: p50 of each kind, the paired overhead of each kind
/// over the target `PAIRED_WITH` (none for the targets in this process), and queries/s.
type Measured = (f64, f64, Option<f64>, Option<f64>, f64);

/// The target a distributed one is compared with query by query: the shards in this process.
const PAIRED_WITH: usize = 1;

/// Warm p50 of each kind for every target, every query searched by each target in turn (see
/// the module documentation), then queries/s with `clients` clients, one target after
/// another: a row each. Targets from `PAIRED_WITH + 1` on are distributed.
async fn measure(
    targets: &[(String, Arc<Target>)],
    queries: &Arc<Vec<(String, Vec<f32>)>>,
    o: &ShardsOptions,
) -> lsmsearch::Result<Vec<Measured>> {
    let n = o.queries.max(1);
    for (_, target) in targets {
        for q in queries.iter().take(n) {
            target.search(true, q).await?;
            target.search(false, q).await?;
        }
    }
    // ms[target][kind][query]
    let mut ms: Vec<[Vec<f64>; 2]> = vec![[vec![0.0; n], vec![0.0; n]]; targets.len()];
    // A new order for every search: each target follows each other one as often (a fixed
    // rotation would put the same target before it nearly every time, and what that one
    // left behind, in the caches or still winding down, would weigh on it alone).
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let mut order: Vec<usize> = (0..targets.len()).collect();
    for i in 0..n {
        for (slot, fts) in [(0, true), (1, false)] {
            order.shuffle(&mut rng);
            for &t in &order {
                let started = Instant::now();
                targets[t]
                    .1
                    .search(fts, &queries[i % queries.len()])
                    .await?;
                ms[t][slot][i] = started.elapsed().as_secs_f64() * 1e3;
            }
        }
    }
    let mut out = Vec::with_capacity(targets.len());
    for (t, (_, target)) in targets.iter().enumerate() {
        let overhead = |slot: usize| {
            (t > PAIRED_WITH).then(|| {
                let mut d: Vec<f64> = (0..n)
                    .map(|i| ms[t][slot][i] - ms[PAIRED_WITH][slot][i])
                    .collect();
                p50(&mut d)
            })
        };
        let (fts_overhead, vector_overhead) = (overhead(0), overhead(1));
        let (fts, vector) = (p50(&mut ms[t][0].clone()), p50(&mut ms[t][1].clone()));
        let qps = throughput(target, queries, o).await?;
        out.push((fts, vector, fts_overhead, vector_overhead, qps));
    }
    Ok(out)
}

/// Searches per second of `target` with `clients` clients, full text and vector alternating.
async fn throughput(
    target: &Arc<Target>,
    queries: &Arc<Vec<(String, Vec<f32>)>>,
    o: &ShardsOptions,
) -> lsmsearch::Result<f64> {
    let started = Instant::now();
    let clients = o.clients.max(1);
    let per = o.queries.max(1).div_ceil(clients);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (target, queries) = (target.clone(), queries.clone());
            tokio::spawn(async move {
                for i in 0..per {
                    let q = &queries[(c * per + i) % queries.len()];
                    target.search(i % 2 == 0, q).await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await
            .map_err(|e| Error::invalid(format!("a client: {e}")))??;
    }
    Ok((per * clients) as f64 / started.elapsed().as_secs_f64())
}

/// A worker process over loopback, and its address.
fn start_worker(settings: &Settings) -> lsmsearch::Result<(Child, String)> {
    let settings = serde_json::to_string(settings)
        .map_err(|e| Error::invalid(format!("the shards' settings: {e}")))?;
    let exe = std::env::current_exe().map_err(|e| Error::invalid(format!("this program: {e}")))?;
    let mut child = Command::new(exe)
        .args(["worker", "--listen", "127.0.0.1:0", "--settings", &settings])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Error::invalid(format!("cannot start a worker: {e}")))?;
    // Read on a thread of its own, for a minute at most: a worker that hangs before it says
    // where it listens is an error, not a bench that never ends.
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
    }
    let said = rx.recv_timeout(std::time::Duration::from_secs(60));
    if let Ok(Some(addr)) = said
        .as_deref()
        .map(|l| l.trim().strip_prefix("listening on "))
    {
        return Ok((child, addr.to_string()));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(Error::invalid(match said {
        Ok(line) => format!("a worker said {line:?}"),
        Err(_) => "a worker did not say where it listens within 60 s".to_string(),
    }))
}

/// Run the benchmark.
pub(crate) async fn run(o: &ShardsOptions, print: bool) -> lsmsearch::Result<ShardsReport> {
    if o.docs == 0 || o.dim == 0 || o.workers.contains(&0) {
        return Err(Error::invalid(
            "--docs, --dim and --workers need at least 1",
        ));
    }
    // Before minutes of building: a worker given settings out of range would exit unheard.
    o.shard_settings.validate()?;
    // A sharded handle splits its budgets among its shards; a worker gives each shard it
    // opens the whole: the same budgets per shard in this process as on a worker.
    let shard = &o.shard_settings;
    let times_shards = |bytes: u64, name: &str| {
        bytes.checked_mul(u64::from(o.shards)).ok_or_else(|| {
            Error::invalid(format!(
                "--shard-settings: {name} times {} shards is too large",
                o.shards
            ))
        })
    };
    let per_shard = Settings {
        cache_bytes: times_shards(shard.cache_bytes, "cache_bytes")?,
        hot_cache_bytes: times_shards(shard.hot_cache_bytes, "hot_cache_bytes")?,
        ..shard.clone()
    };
    let ingest = build(o).await?;
    let queries = Arc::new(lsmsearch::bench::queries::read_queries(
        &o.out.join("corpus").join("queries.parquet"),
    )?);
    if queries.is_empty() {
        return Err(Error::invalid("the corpus has no queries"));
    }
    let (one, sharded) = (path(&o.out.join("one"))?, path(&o.out.join("sharded"))?);
    let most = o.workers.iter().copied().max().unwrap_or(0);
    let mut started: Vec<(Child, String)> = Vec::new();
    for _ in 0..most {
        match start_worker(&o.shard_settings) {
            Ok(w) => started.push(w),
            Err(e) => {
                for (mut c, _) in started {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(e);
            }
        }
    }
    let addrs: Vec<String> = started.iter().map(|s| s.1.clone()).collect();
    let mut children: Vec<Child> = started.into_iter().map(|s| s.0).collect();
    let measured = async {
        let mut targets = vec![
            (
                "one index".to_string(),
                Arc::new(Target::One(Box::new(
                    Index::open_read_only(Location::parse(&one)?, Settings::default()).await?,
                ))),
            ),
            (
                format!("{} shards, this process", o.shards),
                // A sharded handle splits its budgets among its shards; a worker gives each
                // shard it opens the whole: the same budgets per shard here as on a worker.
                Arc::new(Target::Sharded(
                    ShardedIndex::open_read_only(Location::parse(&sharded)?, per_shard.clone())
                        .await?,
                )),
            ),
        ];
        for &w in &o.workers {
            targets.push((
                format!("{} shards, {w} workers", o.shards),
                Arc::new(Target::Distributed(
                    DistributedIndex::open(&sharded, &addrs[..w]).await?,
                )),
            ));
        }
        let figures = measure(&targets, &queries, o).await?;
        for (_, target) in &targets {
            match target.as_ref() {
                Target::One(i) => i.close().await?,
                Target::Sharded(i) => i.close().await?,
                Target::Distributed(_) => {}
            }
        }
        Ok::<_, Error>((targets, figures))
    }
    .await;
    let worker_peaks: Vec<f64> = children
        .iter()
        .map(|w| peak_mib(&w.id().to_string()))
        .collect();
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let (targets, figures) = measured?;
    let coordinator = peak_mib("self");
    let mut rows = Vec::new();
    let figures = targets.iter().zip(figures).enumerate();
    for (t, ((config, target), (fts, vector, fts_overhead, vector_overhead, qps))) in figures {
        let workers = match target.as_ref() {
            Target::Distributed(_) => worker_peaks[..o.workers[t - 2]].to_vec(),
            _ => Vec::new(),
        };
        let row = Row {
            config: config.clone(),
            fts_p50_ms: fts,
            vector_p50_ms: vector,
            fts_overhead_ms: fts_overhead,
            vector_overhead_ms: vector_overhead,
            queries_per_s: qps,
            coordinator_peak_mib: coordinator,
            worker_peak_mib: workers,
        };
        if print {
            eprintln!(
                "{}: fts {:.3} ms, vector {:.3} ms, {:.1} queries/s",
                row.config, row.fts_p50_ms, row.vector_p50_ms, row.queries_per_s
            );
        }
        rows.push(row);
    }
    Ok(ShardsReport {
        docs: o.docs,
        shards: o.shards,
        ingest_rows_per_s: ingest,
        rows,
    })
}
