//! Vector benchmark on Fashion-MNIST (Debian package `dataset-fashion-mnist`: 60,000 train
//! vectors of 784 dimensions as the corpus, test vectors as queries), l2, k = 10, local disk.
//!
//! 1. Recall@10 (against exact search) and queries/s against `ef`, for 1, 10 and 50 generations
//!    plus a 1,000-row memtable, over 1,000 queries; the flush time of the HNSW build per 10,000
//!    rows.
//! 2. p50/p99 latency, warm (open writer) and cold (new read-only handle per query), for
//!    1, 2, 5, 10, 18, 32, 64 generations.
//!
//! ```text
//! cargo bench --bench vector
//! LSMSEARCH_BENCH_DOCS=10000 LSMSEARCH_BENCH_QUERIES=200 LSMSEARCH_BENCH_GENS=1,10 cargo bench --bench vector
//! ```

use arrow::array::{AsArray, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field};
use lsmsearch::{
    Durability, Index, IndexSchema, Location, Settings, VectorSearchOptions, WriteOptions,
};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DIR: &str = "/usr/share/datasets/fashion-mnist";

fn load(file: &str, n: usize) -> Vec<Vec<f32>> {
    let path = format!("{DIR}/{file}");
    let out = std::process::Command::new("gzip")
        .args(["-dc", &path])
        .output()
        .unwrap_or_else(|e| panic!("gzip -dc {path}: {e} (apt-get install dataset-fashion-mnist)"));
    assert!(
        out.status.success(),
        "{path}: apt-get install dataset-fashion-mnist"
    );
    let b = out.stdout;
    let be = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4")) as usize;
    let (count, dim) = (be(4), be(8) * be(12));
    (0..count.min(n))
        .map(|i| {
            b[16 + i * dim..16 + (i + 1) * dim]
                .iter()
                .map(|x| *x as f32)
                .collect()
        })
        .collect()
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn list(s: &str) -> Vec<usize> {
    s.split(',').filter_map(|x| x.trim().parse().ok()).collect()
}

fn batch(s: &IndexSchema, from: usize, vs: &[Vec<f32>]) -> RecordBatch {
    let values: Vec<f32> = vs.iter().flatten().copied().collect();
    RecordBatch::try_new(
        s.arrow_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                (from..from + vs.len()).map(|i| format!("{i:06}")),
            )),
            Arc::new(
                FixedSizeListArray::try_new(
                    Arc::new(Field::new("item", DataType::Float32, true)),
                    784,
                    Arc::new(Float32Array::from(values)),
                    None,
                )
                .expect("vectors"),
            ),
        ],
    )
    .expect("batch")
}

fn keys(b: &[RecordBatch]) -> Vec<String> {
    b.iter()
        .flat_map(|b| {
            let ids = b.column(0).as_string::<i32>();
            (0..b.num_rows())
                .map(|i| ids.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e3
}

/// Build an index of `corpus` as `g` generations plus a 1,000-row memtable; returns the index
/// and the total flush time.
async fn build(
    loc: &Location,
    s: &IndexSchema,
    corpus: &[Vec<f32>],
    g: usize,
) -> (Index, Duration) {
    // The 1,000-row memtable is scanned; no memtable graph competes with the flushes timed here.
    let settings = Settings {
        memtable_max_rows: usize::MAX / 2,
        memtable_max_bytes: usize::MAX / 2,
        memtable_graph_above: usize::MAX,
        ..Settings::default()
    };
    let index = Index::create(loc.clone(), s.clone(), settings)
        .await
        .expect("create");
    let flushed = corpus.len().saturating_sub(1000);
    let mut flush_time = Duration::ZERO;
    let append = |from: usize, to: usize| {
        let index = &index;
        async move {
            let mut at = from;
            while at < to {
                let n = 1000.min(to - at);
                index
                    .append_with(
                        &batch(s, at, &corpus[at..at + n]),
                        WriteOptions::with_durability(Durability::Buffered),
                    )
                    .await
                    .expect("append");
                at += n;
            }
        }
    };
    for gi in 0..g {
        append(gi * flushed / g, (gi + 1) * flushed / g).await;
        let t = Instant::now();
        index.flush().await.expect("flush");
        flush_time += t.elapsed();
    }
    append(flushed, corpus.len()).await;
    (index, flush_time)
}

/// Memtable search: exact scan against the memtable's graph, by memtable size (all rows in
/// the memtable, in memory). Prints p50 of both, the graph's recall@10 against the scan, and
/// how fast the background inserter filled the graph.
fn memtable_crossover(
    rt: &tokio::runtime::Runtime,
    s: &IndexSchema,
    corpus: &[Vec<f32>],
    queries: &[Vec<f32>],
    sizes: &[usize],
) {
    println!(
        "{:>7} {:>10} {:>10} {:>10} {:>14}",
        "rows", "scan p50", "graph p50", "recall@10", "graph rows/s"
    );
    let sample = &queries[..queries.len().min(200)];
    for &n in sizes.iter().filter(|n| **n <= corpus.len()) {
        rt.block_on(async {
            let open = |above: usize| {
                Index::create(
                    Location::parse("memory://").expect("memory"),
                    s.clone(),
                    Settings {
                        memtable_graph_above: above,
                        memtable_max_rows: usize::MAX / 2,
                        memtable_max_bytes: usize::MAX / 2,
                        vector_exact_below: 0,
                        ..Settings::default()
                    },
                )
            };
            let scan = open(usize::MAX).await.expect("create");
            let graph = open(0).await.expect("create");
            let t = Instant::now();
            for at in (0..n).step_by(1000) {
                let b = batch(s, at, &corpus[at..n.min(at + 1000)]);
                let buffered = WriteOptions::with_durability(Durability::Buffered);
                scan.append_with(&b, buffered).await.expect("append");
                graph.append_with(&b, buffered).await.expect("append");
            }
            while graph.stats().memtable_graph_rows < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let fill = n as f64 / t.elapsed().as_secs_f64();
            let opts = VectorSearchOptions::with_k(10);
            let (mut ts, mut tg, mut found) = (Vec::new(), Vec::new(), 0);
            for q in sample {
                let t = Instant::now();
                let want: HashSet<String> =
                    keys(&scan.search_vector(q, &opts).await.expect("scan"))
                        .into_iter()
                        .collect();
                ts.push(t.elapsed());
                let t = Instant::now();
                let got = keys(&graph.search_vector(q, &opts).await.expect("graph"));
                tg.push(t.elapsed());
                found += got.iter().filter(|k| want.contains(*k)).count();
            }
            ts.sort();
            tg.sort();
            println!(
                "{:>7} {:>10.2} {:>10.2} {:>10.4} {:>14.0}",
                n,
                pct(&ts, 0.5),
                pct(&tg, 0.5),
                found as f64 / (10 * sample.len()) as f64,
                fill
            );
            scan.close().await.expect("close");
            graph.close().await.expect("close");
        });
    }
}

fn main() {
    let docs: usize = env("LSMSEARCH_BENCH_DOCS", "60000").parse().expect("docs");
    let nq: usize = env("LSMSEARCH_BENCH_QUERIES", "1000")
        .parse()
        .expect("queries");
    let recall_gens = list(&env("LSMSEARCH_BENCH_RECALL_GENS", "1,10,50"));
    let efs = list(&env("LSMSEARCH_BENCH_EFS", "10,20,40,80,160"));
    let gens = list(&env("LSMSEARCH_BENCH_GENS", "1,2,5,10,18,32,64"));
    let cold_runs: usize = env("LSMSEARCH_BENCH_COLD", "5").parse().expect("cold");
    let mem_sizes = list(&env(
        "LSMSEARCH_BENCH_MEMTABLE_ROWS",
        "1000,2000,5000,10000,20000,50000",
    ));
    let corpus = load("train-images-idx3-ubyte.gz", docs);
    let queries = load("t10k-images-idx3-ubyte.gz", nq);
    let s = IndexSchema::from_json(
        r#"{"primary_key": "id", "vector": {"column": "v", "dim": 784, "metric": "l2"}}"#,
    )
    .expect("schema");
    let base =
        std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-vector"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let defaults = Settings::default();
    println!(
        "Fashion-MNIST: {} vectors x 784, {} queries, l2, k = 10, hnsw M = {}, ef_construction = {}",
        corpus.len(),
        queries.len(),
        defaults.hnsw_m,
        defaults.hnsw_ef_construction
    );
    println!();
    memtable_crossover(&rt, &s, &corpus, &queries, &mem_sizes);
    println!();
    println!(
        "{:>5} {:>6} {:>10} {:>10} {:>14}",
        "gens", "ef", "recall@10", "queries/s", "flush s/10k"
    );
    for &g in &recall_gens {
        let _ = std::fs::remove_dir_all(&base);
        let loc = Location::parse(&base.display().to_string()).expect("location");
        rt.block_on(async {
            let (index, flush) = build(&loc, &s, &corpus, g).await;
            let per10k =
                flush.as_secs_f64() / (corpus.len().saturating_sub(1000) as f64 / 10_000.0);
            let exact_opts = VectorSearchOptions {
                k: 10,
                exact: true,
                ..Default::default()
            };
            let mut truth = Vec::new();
            for q in &queries {
                let r = index.search_vector(q, &exact_opts).await.expect("exact");
                truth.push(keys(&r).into_iter().collect::<HashSet<_>>());
            }
            for &ef in &efs {
                let opts = VectorSearchOptions {
                    k: 10,
                    ef: Some(ef),
                    ..Default::default()
                };
                let t = Instant::now();
                let mut found = 0;
                for (q, want) in queries.iter().zip(&truth) {
                    let got = keys(&index.search_vector(q, &opts).await.expect("ann"));
                    found += got.iter().filter(|k| want.contains(*k)).count();
                }
                let qps = queries.len() as f64 / t.elapsed().as_secs_f64();
                println!(
                    "{:>5} {:>6} {:>10.4} {:>10.1} {:>14.2}",
                    g,
                    ef,
                    found as f64 / (10 * queries.len()) as f64,
                    qps,
                    per10k
                );
            }
            index.close().await.expect("close");
        });
    }
    println!();
    println!(
        "{:>5} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "gens", "warm p50", "warm p99", "cold p50", "cold p99", "open p50"
    );
    for &g in &gens {
        let _ = std::fs::remove_dir_all(&base);
        let loc = Location::parse(&base.display().to_string()).expect("location");
        let warm = rt.block_on(async {
            let (index, _) = build(&loc, &s, &corpus, g).await;
            let opts = VectorSearchOptions::with_k(10);
            let sample = &queries[..queries.len().min(200)];
            for q in sample {
                index.search_vector(q, &opts).await.expect("warm-up");
            }
            let mut warm = Vec::new();
            for q in sample {
                let t = Instant::now();
                index.search_vector(q, &opts).await.expect("search");
                warm.push(t.elapsed());
            }
            index.close().await.expect("close");
            warm.sort();
            warm
        });
        let (cold, open) = rt.block_on(async {
            let (mut cold, mut open) = (Vec::new(), Vec::new());
            for q in queries.iter().take(cold_runs) {
                let t = Instant::now();
                let ro = Index::open_read_only(loc.clone(), Settings::default())
                    .await
                    .expect("open");
                open.push(t.elapsed());
                ro.search_vector(q, &VectorSearchOptions::with_k(10))
                    .await
                    .expect("search");
                cold.push(t.elapsed());
            }
            cold.sort();
            open.sort();
            (cold, open)
        });
        println!(
            "{:>5} {:>10.2} {:>10.2} {:>10.1} {:>10.1} {:>10.1}",
            g,
            pct(&warm, 0.5),
            pct(&warm, 0.99),
            pct(&cold, 0.5),
            pct(&cold, 0.99),
            pct(&open, 0.5)
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}
