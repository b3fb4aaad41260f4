//! Crash test: a child process appends in Durable mode and prints every acknowledged append; it
//! is killed with SIGKILL at a random moment; the index must reopen cleanly with every
//! acknowledged row. `LSMSEARCH_CRASH_CYCLES` sets the number of cycles (default 20).

mod common;

use common::*;
use lsmsearch::{Index, Location, Settings};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

fn write_rows(path: &std::path::Path, cycle: usize, n: usize) -> Vec<Row> {
    let rows: Vec<Row> = (0..n)
        .map(|i| Row::new(format!("c{cycle:03}-{i:05}"), cycle as i64))
        .collect();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for r in &rows {
        let v = serde_json::json!({"id": r.id, "body": r.body, "year": r.year, "emb": r.emb});
        writeln!(f, "{v}").unwrap();
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_never_loses_an_acknowledged_row() {
    let cycles: usize = std::env::var("LSMSEARCH_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().join("idx").display().to_string();
    Index::create(
        Location::parse(&location).unwrap(),
        schema(),
        Settings::default(),
    )
    .await
    .unwrap()
    .close()
    .await
    .unwrap();
    let seed = std::env::var("LSMSEARCH_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut acknowledged = Model::new();
    let mut total_acked = 0;
    for cycle in 0..cycles {
        let file = dir.path().join(format!("rows-{cycle}.jsonl"));
        let rows = write_rows(&file, cycle, 20_000);
        let batch_size = rng.random_range(1..60).to_string();
        let flush_every = rng.random_range(100..2_000).to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_lsmsearch"))
            .args(["ingest", &location])
            .arg(&file)
            .args([
                "--json",
                "--batch-size",
                &batch_size,
                "--flush-every",
                &flush_every,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut acked = 0usize;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                let n = v["acked_rows"].as_u64().unwrap() as usize;
                assert!(n >= acked);
                acked = n;
            }
            acked
        });
        let wait = rng.random_range(30..400);
        std::thread::sleep(Duration::from_millis(wait));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let acked = reader.join().unwrap();
        total_acked += acked;
        for r in &rows[..acked] {
            acknowledged.insert(r.id.clone(), r.clone());
        }

        let index = Index::open(Location::parse(&location).unwrap(), Settings::default())
            .await
            .unwrap_or_else(|e| panic!("cycle {cycle}: the index does not reopen: {e}"));
        let found = live(&index).await;
        for (k, r) in &acknowledged {
            assert_eq!(
                found.get(k),
                Some(r),
                "cycle {cycle} (killed after {wait} ms, {acked} rows acknowledged): acknowledged row {k} lost"
            );
        }
        // Nothing appears that was never in a file; unacknowledged rows are whole batches.
        for k in found.keys() {
            assert!(k.starts_with('c'), "unexpected key {k}");
        }
        index.close().await.unwrap();
    }
    assert!(
        total_acked > 0,
        "no child acknowledged anything: the test proved nothing"
    );
    println!("{cycles} crash cycles, {total_acked} acknowledged rows, all present");
}
