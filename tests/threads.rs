//! Searches over many generations run on the handle's query pool: the process runs no thread
//! per arm, so its thread count does not grow with the number of generations.

mod common;

use common::*;
use lsmsearch::{Index, SearchOptions, Settings, VectorSearchOptions};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_over_many_generations_start_no_thread_per_arm() {
    if threads() == 0 {
        eprintln!("no /proc/self/task here: skipped");
        return;
    }
    const GENERATIONS: usize = 120;
    const QUERIES: usize = 6;
    let settings = Settings {
        compaction: false,
        query_threads: 2,
        ..Settings::default()
    };
    let index = Arc::new(Index::create(memory(), schema(), settings).await.unwrap());
    let s = schema();
    for g in 0..GENERATIONS {
        let rows: Vec<Row> = (0..3)
            .map(|i| Row::new(format!("g{g}-{i}"), g as i64))
            .collect();
        index.append(&batch(&s, &rows)).await.unwrap();
        index.flush().await.unwrap();
    }
    assert_eq!(index.stats().generations.len(), GENERATIONS);
    // Warm: every generation loaded, the pool and runtime threads started.
    index
        .search_fts("body", &SearchOptions::with_k(5))
        .await
        .unwrap();
    let before = threads();
    let most = Arc::new(AtomicUsize::new(before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (most, done) = (most.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                most.fetch_max(threads(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let mut tasks = Vec::new();
    for q in 0..QUERIES {
        let index = index.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let got = index
                    .search_fts("body version", &SearchOptions::with_k(10))
                    .await
                    .unwrap();
                assert_eq!(got.iter().map(|b| b.num_rows()).sum::<usize>(), 10);
                let opts = VectorSearchOptions {
                    k: 10,
                    ..VectorSearchOptions::default()
                };
                let got = index
                    .search_vector(&[q as f32, 1.0, 0.0, 0.5], &opts)
                    .await
                    .unwrap();
                assert_eq!(got.iter().map(|b| b.num_rows()).sum::<usize>(), 10);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    sampler.join().unwrap();
    let most = most.load(Ordering::SeqCst);
    println!(
        "{before} threads before, at most {most} during {QUERIES} concurrent searches over \
         {GENERATIONS} generations"
    );
    // Planning takes one blocking thread per search under way, and the sampler is one more;
    // arms take none.
    assert!(
        most <= before + QUERIES + 2,
        "{most} threads during the searches, {before} before"
    );
}
