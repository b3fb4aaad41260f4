//! The stream benchmark (see `lsmsearch::bench::stream`), also reachable as
//! `lsmsearch bench stream`. It runs the two shapes the live-stream targets are stated for, one
//! after the other: one writer of 1,000-row Durable batches at its maximum rate with no
//! readers, then an app server's stream (one writer at 2,000 rows/s in 100-row batches, two
//! readers alternating full-text and vector queries at 20 queries/s in total).
//!
//! ```text
//! cargo bench --bench stream
//! LSMSEARCH_BENCH_SECONDS=60 cargo bench --bench stream     # each shape runs 60 s
//! ```

use lsmsearch::bench::stream::{run, StreamOptions};
use std::time::Duration;

fn main() {
    let seconds = std::env::var("LSMSEARCH_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(Duration::from_secs(180));
    let out = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-stream"));
    let max_rate = StreamOptions {
        readers: 0,
        duration: seconds,
        out: out.join("max-rate"),
        ..StreamOptions::default()
    };
    let paced = StreamOptions {
        batch: 100,
        rate: 2000.0,
        readers: 2,
        kinds: vec!["fts".into(), "vector".into()],
        qps: 20.0,
        duration: seconds,
        out: out.join("paced"),
        ..StreamOptions::default()
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for (name, o) in [("max rate", max_rate), ("paced", paced)] {
        println!("== {name}");
        rt.block_on(run(&o)).expect("the stream benchmark");
    }
}
