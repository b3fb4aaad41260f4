//! Ingest benchmark: append latency (p50/p99) and rows/s for 1-row and 1000-row batches,
//! Durable and Buffered, on local disk, next to the fsync latency of the same disk; group commit
//! under concurrent writers; flush rows/s and MB/s.
//!
//! Rows: ~100 words of Cranfield text, a 128-d vector and two payload columns.
//!
//! ```text
//! cargo bench --bench ingest                      # release build
//! LSMSEARCH_BENCH_DIR=/path/on/disk cargo bench --bench ingest
//! ```

use arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field};
use lsmsearch::{Durability, Index, IndexSchema, Location, Settings, WriteOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DIM: usize = 128;

fn schema() -> IndexSchema {
    IndexSchema::from_json(&format!(
        r#"{{"primary_key": "id", "text": ["title", "body"],
            "vector": {{"column": "emb", "dim": {DIM}, "metric": "cosine"}},
            "payload": [{{"name": "year", "type": "int64"}}, {{"name": "lang", "type": "utf8"}}]}}"#
    ))
    .expect("valid schema")
}

struct Corpus {
    words: Vec<String>,
    titles: Vec<String>,
}

fn corpus() -> Corpus {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/cranfield/docs.jsonl"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let mut words = Vec::new();
    let mut titles = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("valid JSON line");
        titles.push(v["title"].as_str().unwrap_or("").to_string());
        words.extend(
            v["text"]
                .as_str()
                .unwrap_or("")
                .split_whitespace()
                .map(str::to_string),
        );
    }
    Corpus { words, titles }
}

fn make_batch(
    schema: &IndexSchema,
    corpus: &Corpus,
    rng: &mut StdRng,
    first_key: usize,
    n: usize,
) -> RecordBatch {
    let ids: Vec<String> = (first_key..first_key + n)
        .map(|i| format!("doc-{i:09}"))
        .collect();
    let titles: Vec<&str> = (0..n)
        .map(|_| corpus.titles[rng.random_range(0..corpus.titles.len())].as_str())
        .collect();
    let bodies: Vec<String> = (0..n)
        .map(|_| {
            let start = rng.random_range(0..corpus.words.len() - 100);
            corpus.words[start..start + 100].join(" ")
        })
        .collect();
    let values: Vec<f32> = (0..n * DIM).map(|_| rng.random_range(-1.0..1.0)).collect();
    let emb = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        DIM as i32,
        Arc::new(Float32Array::from(values)),
        None,
    )
    .expect("valid vectors");
    RecordBatch::try_new(
        schema.arrow_schema(),
        vec![
            Arc::new(StringArray::from(ids)),
            Arc::new(StringArray::from(titles)),
            Arc::new(StringArray::from(bodies)),
            Arc::new(emb),
            Arc::new(Int64Array::from_iter_values(
                (0..n).map(|i| 1950 + (i % 70) as i64),
            )),
            Arc::new(StringArray::from_iter_values((0..n).map(|i| {
                if i % 3 == 0 {
                    "fr"
                } else {
                    "en"
                }
            }))),
        ],
    )
    .expect("batch matches schema")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Latency of writing a small new file and fsyncing it and its directory: what a durable WAL
/// object costs at least.
fn fsync_latency(dir: &std::path::Path, n: usize) -> (Duration, Duration, Duration) {
    let d = dir.join("fsync-probe");
    std::fs::create_dir_all(&d).expect("probe dir");
    let payload = vec![7u8; 4096];
    let mut file_only = Vec::new();
    let mut file_and_dir = Vec::new();
    for i in 0..n {
        let p = d.join(format!("{i}.tmp"));
        let t = Instant::now();
        let mut f = std::fs::File::create(&p).expect("create");
        f.write_all(&payload).expect("write");
        f.sync_all().expect("fsync");
        file_only.push(t.elapsed());
        std::fs::File::open(&d)
            .expect("dir")
            .sync_all()
            .expect("dir fsync");
        file_and_dir.push(t.elapsed());
    }
    file_only.sort();
    file_and_dir.sort();
    let _ = std::fs::remove_dir_all(&d);
    (
        percentile(&file_only, 0.5),
        percentile(&file_and_dir, 0.5),
        percentile(&file_and_dir, 0.99),
    )
}

struct Run {
    name: String,
    rows: usize,
    appends: usize,
    elapsed: Duration,
    lat: Vec<Duration>,
}

async fn sequential(
    dir: &std::path::Path,
    corpus: &Corpus,
    batch_rows: usize,
    appends: usize,
    durability: Durability,
) -> Run {
    let loc = Location::parse(&dir.display().to_string()).expect("location");
    let s = schema();
    let index = Index::create(loc, s.clone(), Settings::default())
        .await
        .expect("create");
    let mut rng = StdRng::seed_from_u64(1);
    let batches: Vec<RecordBatch> = (0..appends)
        .map(|i| make_batch(&s, corpus, &mut rng, i * batch_rows, batch_rows))
        .collect();
    let opts = WriteOptions::with_durability(durability);
    let mut lat = Vec::with_capacity(appends);
    let started = Instant::now();
    for b in &batches {
        let t = Instant::now();
        index.append_with(b, opts).await.expect("append");
        lat.push(t.elapsed());
    }
    let elapsed = started.elapsed();
    index.close().await.expect("close");
    lat.sort();
    Run {
        name: format!("{batch_rows}-row {durability:?}"),
        rows: batch_rows * appends,
        appends,
        elapsed,
        lat,
    }
}

async fn concurrent(
    dir: &std::path::Path,
    corpus: &Corpus,
    writers: usize,
    per_writer: usize,
) -> Run {
    let loc = Location::parse(&dir.display().to_string()).expect("location");
    let s = schema();
    let index = Arc::new(
        Index::create(loc, s.clone(), Settings::default())
            .await
            .expect("create"),
    );
    let mut rng = StdRng::seed_from_u64(2);
    let work: Vec<Vec<RecordBatch>> = (0..writers)
        .map(|w| {
            (0..per_writer)
                .map(|i| make_batch(&s, corpus, &mut rng, (w * per_writer + i) * 10, 1))
                .collect()
        })
        .collect();
    let started = Instant::now();
    let tasks: Vec<_> = work
        .into_iter()
        .map(|batches| {
            let index = index.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                for b in batches {
                    let t = Instant::now();
                    index.append(&b).await.expect("append");
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("task"));
    }
    let elapsed = started.elapsed();
    let wal_objects = index.stats().wal_objects_pending;
    index.close().await.expect("close");
    lat.sort();
    Run {
        name: format!("1-row Durable, {writers} writers ({wal_objects} WAL objects)"),
        rows: writers * per_writer,
        appends: writers * per_writer,
        elapsed,
        lat,
    }
}

async fn flush_speed(
    dir: &std::path::Path,
    corpus: &Corpus,
    rows: usize,
) -> (usize, u64, Duration) {
    let loc = Location::parse(&dir.display().to_string()).expect("location");
    let s = schema();
    let settings = Settings {
        memtable_max_rows: rows * 2,
        memtable_max_bytes: 1 << 34,
        ..Settings::default()
    };
    let index = Index::create(loc, s.clone(), settings)
        .await
        .expect("create");
    let mut rng = StdRng::seed_from_u64(3);
    for i in 0..rows / 1000 {
        let b = make_batch(&s, corpus, &mut rng, i * 1000, 1000);
        index
            .append_with(&b, WriteOptions::with_durability(Durability::Buffered))
            .await
            .expect("append");
    }
    let t = Instant::now();
    index.flush().await.expect("flush");
    let elapsed = t.elapsed();
    let bytes = index.stats().generations.iter().map(|g| g.bytes).sum();
    index.close().await.expect("close");
    (rows, bytes, elapsed)
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let base = std::env::var("LSMSEARCH_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-ingest"))
        });
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).expect("bench dir");
    let corpus = corpus();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (f50, fd50, fd99) = fsync_latency(&base, 300);
    println!("disk: {}", base.display());
    println!(
        "fsync of a new 4 KiB file: p50 {:.3} ms; file + directory: p50 {:.3} ms, p99 {:.3} ms",
        ms(f50),
        ms(fd50),
        ms(fd99)
    );
    println!();
    println!(
        "{:<44} {:>8} {:>9} {:>10} {:>10} {:>12}",
        "append", "appends", "rows", "p50 ms", "p99 ms", "rows/s"
    );
    let mut runs = Vec::new();
    let cases = [
        (1, 500, Durability::Durable),
        (1, 2000, Durability::Buffered),
        (1000, 150, Durability::Durable),
        (1000, 150, Durability::Buffered),
    ];
    for (i, (rows, appends, d)) in cases.into_iter().enumerate() {
        let dir = base.join(format!("seq-{i}"));
        runs.push(rt.block_on(sequential(&dir, &corpus, rows, appends, d)));
    }
    runs.push(rt.block_on(concurrent(&base.join("concurrent"), &corpus, 16, 100)));
    for r in &runs {
        println!(
            "{:<44} {:>8} {:>9} {:>10.3} {:>10.3} {:>12.0}",
            r.name,
            r.appends,
            r.rows,
            ms(percentile(&r.lat, 0.5)),
            ms(percentile(&r.lat, 0.99)),
            r.rows as f64 / r.elapsed.as_secs_f64()
        );
    }
    let durable_1 = &runs[0];
    println!();
    println!(
        "1-row Durable p50 / fsync(file + dir) p50 = {:.2}x",
        ms(percentile(&durable_1.lat, 0.5)) / ms(fd50).max(1e-9)
    );
    let (rows, bytes, t) = rt.block_on(flush_speed(&base.join("flush"), &corpus, 50_000));
    println!(
        "flush of a {rows}-row memtable: {:.0} ms, {:.0} rows/s, {:.1} MB/s ({:.1} MB generation)",
        ms(t),
        rows as f64 / t.as_secs_f64(),
        bytes as f64 / 1e6 / t.as_secs_f64(),
        bytes as f64 / 1e6
    );
    let _ = std::fs::remove_dir_all(&base);
}
