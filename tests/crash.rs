//! Crash soak: a child process (`lsmsearch ingest --json`) appends in Durable mode and prints
//! every acknowledged append; once it has acknowledged its first batch it is killed with SIGKILL
//! at a random moment of its ingest; the index must reopen cleanly with every acknowledged row
//! (newest version of each key), and nothing that was never in a file.
//!
//! The child compacts in the background as it flushes, so kills also land mid-compaction; a
//! second test kills `lsmsearch compact` itself and checks that no generation object is left
//! that no manifest names.
//!
//! `LSMSEARCH_CRASH_CYCLES` sets the number of cycles (default 20; the soak runs 1,000),
//! `LSMSEARCH_CRASH_SEED` the seed. Every 50 cycles the soak starts a new index, so that
//! verification times stay flat. `LSMSEARCH_BIN` runs another build of the command line (a soak
//! can run from a copy while the tree is rebuilt).

mod common;

use common::*;
use lsmsearch::{Index, Location, Settings};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ROWS_PER_FILE: usize = 3_000;
const CYCLES_PER_INDEX: usize = 50;

/// Rows of cycle `cycle`; a third of the keys update a key of the previous cycle.
fn write_rows(path: &std::path::Path, cycle: usize, n: usize) -> Vec<Row> {
    let rows: Vec<Row> = (0..n)
        .map(|i| {
            // Cycle c - 1 wrote `c{c-1}-{i+1}` itself (i + 1 is not a multiple of 3).
            let id = if i % 3 == 0 && cycle > 0 && i + 1 < n {
                format!("c{:04}-{:05}", cycle - 1, i + 1)
            } else {
                format!("c{cycle:04}-{i:05}")
            };
            Row::new(id, cycle as i64)
        })
        .collect();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for r in &rows {
        let v = serde_json::json!({"id": r.id, "body": r.body, "year": r.year, "emb": r.emb});
        writeln!(f, "{v}").unwrap();
    }
    rows
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_never_loses_an_acknowledged_row() {
    let cycles = env_usize("LSMSEARCH_CRASH_CYCLES").unwrap_or(20);
    let seed = env_usize("LSMSEARCH_CRASH_SEED").unwrap_or(7) as u64;
    let bin = std::env::var("LSMSEARCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_lsmsearch").to_string());
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut acknowledged = Model::new();
    let mut location = String::new();
    let (mut total_acked, mut mid_ingest) = (0, 0);
    let started = Instant::now();
    for cycle in 0..cycles {
        if cycle % CYCLES_PER_INDEX == 0 {
            location = dir.path().join(format!("idx{cycle}")).display().to_string();
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
            acknowledged = Model::new();
        }
        let file = dir.path().join("rows.jsonl");
        let rows = write_rows(&file, cycle, ROWS_PER_FILE);
        let batch_size = rng.random_range(1..60).to_string();
        let flush_every = rng.random_range(100..2_000).to_string();
        let mut child = Command::new(&bin)
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
        let (first_tx, first_rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut acked = 0usize;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                let n = v["acked_rows"].as_u64().unwrap() as usize;
                assert!(n >= acked);
                if acked == 0 {
                    let _ = first_tx.send(());
                }
                acked = n;
            }
            acked
        });
        // Kill at a random moment once the ingest is under way.
        let _ = first_rx.recv_timeout(Duration::from_secs(30));
        let wait = rng.random_range(0..120);
        std::thread::sleep(Duration::from_millis(wait));
        let finished = child.try_wait().unwrap().is_some();
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let acked = reader.join().unwrap();
        if acked > 0 && acked < rows.len() && !finished {
            mid_ingest += 1;
        }
        total_acked += acked;
        for r in &rows[..acked] {
            acknowledged.insert(r.id.clone(), r.clone());
        }

        let index = Index::open(Location::parse(&location).unwrap(), Settings::default())
            .await
            .unwrap_or_else(|e| panic!("cycle {cycle}: the index does not reopen: {e}"));
        let found = live(&index).await;
        // Rows past the last acknowledgement may have landed too (their WAL write finished,
        // the kill came before the ack was printed): whole batches, from this file.
        let landed_unacked = |f: &Row| rows[acked..].iter().any(|x| x == f);
        let replay = format!(
            "replay: LSMSEARCH_CRASH_SEED={seed} LSMSEARCH_CRASH_CYCLES={cycles} cargo test --test crash"
        );
        for (k, r) in &acknowledged {
            let f = found.get(k);
            assert!(
                f == Some(r) || f.is_some_and(landed_unacked),
                "cycle {cycle} (killed {wait} ms after the first ack, {acked} rows acknowledged): \
                 acknowledged row {k} lost or stale: found {f:?} ({replay})"
            );
        }
        for (k, f) in &found {
            assert!(
                acknowledged.get(k) == Some(f) || landed_unacked(f),
                "cycle {cycle}: row {k} was never acknowledged in this form: {f:?} ({replay})"
            );
        }
        // What landed is durable from now on.
        for (k, f) in &found {
            if landed_unacked(f) {
                acknowledged.insert(k.clone(), f.clone());
            }
        }
        index.close().await.unwrap();
    }
    assert!(
        total_acked > 0,
        "no child acknowledged anything: the test proved nothing"
    );
    let share = mid_ingest as f64 / cycles as f64;
    println!(
        "{cycles} SIGKILL cycles in {:.0} s: {mid_ingest} ({:.1}%) landed mid-ingest, \
         {total_acked} acknowledged rows, 0 lost",
        started.elapsed().as_secs_f64(),
        share * 100.0
    );
    assert!(
        share >= 0.9,
        "only {mid_ingest} of {cycles} kills landed mid-ingest"
    );
}

/// Generation objects in the index directory (staging files of PUTs a kill cut off are not
/// objects: the store never lists them, and an open removes them once they are stale).
fn generation_files(dir: &std::path::Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(dir.join("generations"))
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.contains('#'))
                .collect()
        })
        .unwrap_or_default()
}

/// A child process (`lsmsearch compact`) merging every generation is killed with SIGKILL at a
/// random moment; the index must reopen with every row, and once the reopening writer's
/// collection has run, the generation objects are exactly those its manifest names.
///
/// `LSMSEARCH_CRASH_COMPACT_CYCLES` sets the number of cycles (default 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_compaction_loses_nothing_and_leaves_nothing() {
    let cycles = env_usize("LSMSEARCH_CRASH_COMPACT_CYCLES").unwrap_or(6);
    let seed = env_usize("LSMSEARCH_CRASH_SEED").unwrap_or(7) as u64;
    let bin = std::env::var("LSMSEARCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_lsmsearch").to_string());
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().display().to_string();
    let loc = || Location::parse(&location).unwrap();
    // In this process: generations as flushed, deleted objects gone at once.
    let settings = Settings {
        compaction: false,
        compaction_grace_ms: 0,
        ..Settings::default()
    };
    let s = schema();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model::new();
    Index::create(loc(), s.clone(), settings.clone())
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let mut full_run = Duration::from_millis(500);
    let (mut killed_mid_way, mut completed) = (0, 0);
    for cycle in 0..cycles {
        // Six more generations, a third of each updating keys of the previous cycle.
        let index = Index::open(loc(), settings.clone()).await.unwrap();
        for g in 0..6 {
            let rows: Vec<Row> = (0..400)
                .map(|i| {
                    let c = if i % 3 == 0 && cycle > 0 {
                        cycle - 1
                    } else {
                        cycle
                    };
                    Row::new(format!("c{c}-{g}-{i}"), (cycle * 10 + g) as i64)
                })
                .collect();
            index.append(&batch(&s, &rows)).await.unwrap();
            index.flush().await.unwrap();
            for r in rows {
                model.insert(r.id.clone(), r);
            }
        }
        index.close().await.unwrap();

        // The first cycle runs to completion and times it; the others are killed within that.
        let started = Instant::now();
        let mut child = Command::new(&bin)
            .args(["compact", &location])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if cycle == 0 {
            assert!(child.wait().unwrap().success());
            full_run = started.elapsed();
            completed += 1;
        } else {
            let wait = rng.random_range(0..full_run.as_millis() as u64);
            std::thread::sleep(Duration::from_millis(wait));
            if child.try_wait().unwrap().is_some() {
                completed += 1;
            } else {
                killed_mid_way += 1;
            }
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
        }

        let index = Index::open(loc(), settings.clone())
            .await
            .unwrap_or_else(|e| panic!("cycle {cycle}: the index does not reopen: {e}"));
        assert_eq!(
            live(&index).await,
            model,
            "cycle {cycle}: rows lost or changed"
        );
        let named = |index: &Index| -> std::collections::BTreeSet<String> {
            index
                .stats()
                .generations
                .iter()
                .map(|g| format!("{:020}-{:010}.gen", g.id, g.epoch))
                .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while generation_files(dir.path()) != named(&index) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            generation_files(dir.path()),
            named(&index),
            "cycle {cycle}: generation objects no manifest names are left"
        );
        index.close().await.unwrap();
    }
    println!(
        "{cycles} compaction cycles (a full one takes {full_run:?}): {killed_mid_way} killed \
         mid-way, {completed} completed; 0 rows lost, 0 objects left"
    );
    assert!(
        killed_mid_way > 0 || cycles < 3,
        "no kill landed mid-compaction"
    );
}
