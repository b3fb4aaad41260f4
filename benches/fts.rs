//! Full-text benchmark: Cranfield text replicated (with variations) to N documents (default
//! 100,000), split into G generations plus a memtable on local disk; p50/p99 latency of the 225
//! Cranfield queries, warm (open writer handle, everything loaded) and cold (a new read-only
//! handle per query: manifest, generations and WAL loaded from disk, then the query).
//!
//! ```text
//! cargo bench --bench fts
//! LSMSEARCH_BENCH_DOCS=20000 LSMSEARCH_BENCH_GENS=1,2,5 cargo bench --bench fts
//! ```

use lsmsearch::bench::corpus::Corpus;
use lsmsearch::{Durability, Index, Location, SearchOptions, Settings, WriteOptions};
use std::time::{Duration, Instant};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/cranfield");

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e3
}

fn main() {
    let docs: usize = std::env::var("LSMSEARCH_BENCH_DOCS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let gens: Vec<usize> = std::env::var("LSMSEARCH_BENCH_GENS")
        .unwrap_or_else(|_| "1,2,5,10,18,32,64".into())
        .split(',')
        .filter_map(|g| g.trim().parse().ok())
        .collect();
    let cold_runs: usize = std::env::var("LSMSEARCH_BENCH_COLD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let base = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-fts"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let c = Corpus::cranfield(std::path::Path::new(DATA)).expect("the Cranfield collection");
    let qs = c.queries().to_vec();
    let s = Corpus::schema(None);
    println!("{docs} documents (Cranfield replicated), 225 queries, k = 10, local disk");
    println!(
        "{:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "gens", "warm p50", "warm p99", "cold p50", "cold p99", "open p50", "build s"
    );
    for &g in &gens {
        let _ = std::fs::remove_dir_all(&base);
        let loc = Location::parse(&base.display().to_string()).expect("location");
        let settings = Settings {
            memtable_max_rows: usize::MAX / 2,
            memtable_max_bytes: usize::MAX / 2,
            ..Settings::default()
        };
        let started = Instant::now();
        let (warm, built) = rt.block_on(async {
            let index = Index::create(loc.clone(), s.clone(), settings)
                .await
                .expect("create");
            // G generations, then 1,000 documents left in the memtable.
            let flushed = docs.saturating_sub(1000);
            let append = |from: usize, to: usize| {
                let index = &index;
                let c = &c;
                async move {
                    let mut at = from;
                    while at < to {
                        let n = 1000.min(to - at);
                        index
                            .append_with(
                                &c.batch(None, at, n).expect("batch"),
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
                index.flush().await.expect("flush");
            }
            append(flushed, docs).await;
            let built = started.elapsed();
            let opts = SearchOptions::with_k(10);
            for q in &qs {
                index.search_fts(q, &opts).await.expect("search");
            }
            let mut warm = Vec::new();
            for q in &qs {
                let t = Instant::now();
                index.search_fts(q, &opts).await.expect("search");
                warm.push(t.elapsed());
            }
            assert_eq!(index.stats().generations.len(), g, "generation count");
            index.close().await.expect("close");
            warm.sort();
            (warm, built)
        });
        let (cold, open) = rt.block_on(async {
            let mut cold = Vec::new();
            let mut open = Vec::new();
            for q in qs.iter().take(cold_runs) {
                let t = Instant::now();
                let ro = Index::open_read_only(loc.clone(), Settings::default())
                    .await
                    .expect("open");
                open.push(t.elapsed());
                ro.search_fts(q, &SearchOptions::with_k(10))
                    .await
                    .expect("search");
                cold.push(t.elapsed());
            }
            cold.sort();
            open.sort();
            (cold, open)
        });
        println!(
            "{:>5} {:>10.2} {:>10.2} {:>10.1} {:>10.1} {:>10.1} {:>12.1}",
            g,
            pct(&warm, 0.5),
            pct(&warm, 0.99),
            pct(&cold, 0.5),
            pct(&cold, 0.99),
            pct(&open, 0.5),
            built.as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}
