//! Sharded searches through workers: three workers on localhost (in this process, then as
//! `lsmsearch worker` processes) over three shards with updates and deletes return exactly
//! what the same searches return in one process (which `tests/sharded.rs` proves equal to
//! one index, one tantivy index, brute force and the reference fusion), and full text ranks
//! as one tantivy index. A worker killed between searches gives a clear error, never fewer
//! rows without saying so.

mod common;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Float32Type;
use common::fts::{assert_same_ranking, Reference};
use common::{batch, schema, Row};
use lsmsearch::shard::distributed::{serve, DistributedIndex};
use lsmsearch::shard::ShardedIndex;
use lsmsearch::{
    ErrorKind, Fusion, Highlight, HybridSearchOptions, Key, Location, SearchOptions, Settings,
    VectorSearchOptions,
};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const WORDS: &[&str] = &[
    "wing", "flow", "shock", "layer", "heat", "plate", "mach", "drag",
];

fn settings() -> Settings {
    Settings {
        memtable_max_rows: 1_000_000,
        compaction: false,
        vector_exact_below: 4,
        ..Settings::default()
    }
}

fn row(i: usize, version: usize) -> Row {
    let words: Vec<&str> = (0..(i + version) % 6 + 1)
        .map(|w| WORDS[(i * 5 + w * 3 + version) % 8])
        .collect();
    let x = ((i * 7 + version) % 11) as f32;
    Row {
        id: format!("d{i:03}"),
        body: words.join(" "),
        year: version as i64,
        emb: [x, 1.0 - x, x / 3.0, 0.5],
    }
}

/// A sharded index of 3 shards at `dir`: rows written, updated and deleted across flushes
/// (each shard split into generations and a memtable), and its live rows.
async fn build(dir: &std::path::Path) -> (String, BTreeMap<String, Row>) {
    let location = dir.join("idx").display().to_string();
    let s = schema();
    let index = ShardedIndex::create(
        Location::parse(&location).unwrap(),
        s.clone(),
        3,
        settings(),
    )
    .await
    .unwrap();
    let mut live = BTreeMap::new();
    for version in 0..4 {
        let rows: Vec<Row> = (0..120)
            .filter(|i| (i + version) % (version + 2) == 0)
            .map(|i| row(i, version))
            .collect();
        index.append(&batch(&s, &rows)).await.unwrap();
        for r in rows {
            live.insert(r.id.clone(), r);
        }
        let gone: Vec<Key> = (0..120)
            .filter(|i| i % 17 == version)
            .map(|i| Key::from(format!("d{i:03}").as_str()))
            .collect();
        index.delete(&gone).await.unwrap();
        for k in &gone {
            if let Key::Str(k) = k {
                live.remove(k);
            }
        }
        if version < 3 {
            index.flush().await.unwrap();
        }
    }
    index.close().await.unwrap();
    (location, live)
}

fn ranked(batches: &[RecordBatch]) -> Vec<(String, f32)> {
    let mut out = Vec::new();
    for b in batches {
        let keys = b.column(0).as_string::<i32>();
        let values = b.column(1).as_primitive::<Float32Type>();
        for i in 0..b.num_rows() {
            out.push((keys.value(i).to_string(), values.value(i)));
        }
    }
    out
}

fn one(batches: &[RecordBatch]) -> Option<RecordBatch> {
    let first = batches.first()?;
    let all = arrow::compute::concat_batches(&first.schema(), batches).unwrap();
    (all.num_rows() > 0).then_some(all)
}

/// Every search of the equivalence cases through `remote`, against the same search of
/// `local` (every shard read in this process) and one tantivy index of `live`.
async fn same_results(
    remote: &DistributedIndex,
    local: &ShardedIndex,
    live: &BTreeMap<String, Row>,
) {
    let docs = live
        .iter()
        .map(|(k, r)| (k.clone(), vec![Some(r.body.clone())]))
        .collect();
    let reference = Reference::new(&["body"], &docs);
    for (q, k, offset) in [
        ("wing", 5, 0),
        ("shock layer", 7, 3),
        ("+flow heat", 4, 1),
        ("\"shock layer\"", 10, 0),
        ("mach OR drag -plate", 6, 2),
    ] {
        let ctx = format!("{q:?} k {k} offset {offset}");
        let opts = SearchOptions {
            k,
            offset,
            highlight: Some(Highlight::default()),
            explain: true,
            ..SearchOptions::default()
        };
        let got = remote.search_fts(q, &opts).await.unwrap();
        let all = reference.search(q, false);
        let want: Vec<(String, f32)> = all.iter().skip(offset).cloned().collect();
        assert_same_ranking(&ranked(&got), &want, k, &ctx);
        assert_eq!(
            one(&got),
            one(&local.search_fts(q, &opts).await.unwrap()),
            "{ctx}"
        );
        let (rows, n) = remote.search_and_count_fts(q, &opts).await.unwrap();
        assert_eq!(n, all.len() as u64, "{ctx}: count");
        assert_eq!(one(&rows), one(&got), "{ctx}: counted");
        let floor = SearchOptions {
            min_score: all.get(all.len() / 2).map(|r| r.1),
            ..SearchOptions::with_k(1)
        };
        assert_eq!(
            remote.count_fts(q, &floor).await.unwrap(),
            local.count_fts(q, &floor).await.unwrap(),
            "{ctx}: count with min_score"
        );
    }
    for (v, k, offset) in [([1.0, 0.0, 0.5, 0.5], 6, 0), ([4.0, -3.0, 1.0, 0.5], 5, 2)] {
        let opts = VectorSearchOptions {
            k,
            offset,
            exact: true,
            ..VectorSearchOptions::default()
        };
        let got = remote.search_vector(&v, &opts).await.unwrap();
        assert_eq!(ranked(&got).len(), k, "{v:?}");
        assert_eq!(
            one(&got),
            one(&local.search_vector(&v, &opts).await.unwrap()),
            "{v:?}"
        );
        for fusion in [
            Fusion::Rrf { k: 60.0 },
            Fusion::Weighted {
                text: 0.3,
                vector: 0.7,
            },
        ] {
            let opts = HybridSearchOptions {
                k,
                offset,
                fusion,
                exact: true,
                ..HybridSearchOptions::default()
            };
            let got = remote.search_hybrid("flow wing", &v, &opts).await.unwrap();
            assert_eq!(
                one(&got),
                one(&local.search_hybrid("flow wing", &v, &opts).await.unwrap()),
                "{v:?} {fusion:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_in_this_process_search_as_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let (location, live) = build(dir.path()).await;
    let mut addrs = Vec::new();
    for _ in 0..3 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap().to_string());
        tokio::spawn(serve(listener, Settings::default()));
    }
    let local = ShardedIndex::open_read_only(Location::parse(&location).unwrap(), settings())
        .await
        .unwrap();
    let remote = DistributedIndex::open(&location, &addrs).await.unwrap();
    same_results(&remote, &local, &live).await;

    // The plan shows a stage of three tasks, one shard each, on the three workers.
    let plan = remote
        .explain_fts("wing", &SearchOptions::with_k(5))
        .await
        .unwrap();
    assert!(plan.contains("Stage"), "{plan}");
    for (shard, addr) in addrs.iter().enumerate() {
        assert!(plan.contains(&format!("shards=[{shard}] of 3")), "{plan}");
        let task = format!("t{shard} on {addr}: shards [{shard}]");
        assert!(plan.contains(&task), "{plan}");
    }

    // With two workers, one of them reads two shards in one task; with one worker, its
    // shards are one task, on the worker: the same results.
    for (workers, tasks) in [
        (2, vec!["shards=[0, 2] of 3", "shards=[1] of 3"]),
        (1, vec!["shards=[0, 1, 2] of 3"]),
    ] {
        let fewer = DistributedIndex::open(&location, &addrs[..workers])
            .await
            .unwrap();
        same_results(&fewer, &local, &live).await;
        let plan = fewer
            .explain_fts("wing", &SearchOptions::with_k(5))
            .await
            .unwrap();
        assert!(plan.contains("Stage"), "{workers} workers: {plan}");
        for task in tasks {
            assert!(plan.contains(task), "{workers} workers: {plan}");
        }
        // A task a worker, each on its own.
        let routed: Vec<&str> = plan.lines().filter(|l| l.starts_with("  t")).collect();
        assert_eq!(routed.len(), workers, "{plan}");
        for (w, line) in routed.iter().enumerate() {
            assert!(line.contains(&format!("on {}:", addrs[w])), "{plan}");
        }
    }
    local.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_searched_again_takes_one_round_until_its_statistics_change() {
    let dir = tempfile::tempdir().unwrap();
    let (location, mut live) = build(dir.path()).await;
    let addrs = workers_here(3).await;
    let remote = DistributedIndex::open(&location, &addrs).await.unwrap();
    let uncached = DistributedIndex::open(&location, &addrs)
        .await
        .unwrap()
        .with_statistics_cache(0);
    let root = Location::parse(&location).unwrap();
    let opts = SearchOptions {
        k: 6,
        offset: 1,
        explain: true,
        ..SearchOptions::default()
    };
    let hybrid = HybridSearchOptions {
        k: 5,
        exact: true,
        ..HybridSearchOptions::default()
    };
    let v = [1.0, 0.0, 0.5, 0.5];
    // Rounds a search took, and its rows.
    async fn counted<F: std::future::Future<Output = lsmsearch::Result<Vec<RecordBatch>>>>(
        remote: &DistributedIndex,
        search: F,
    ) -> (u64, Option<RecordBatch>) {
        let before = remote.rounds();
        let rows = search.await.unwrap();
        (remote.rounds() - before, one(&rows))
    }
    for step in 0..3 {
        let local = ShardedIndex::open_read_only(root.clone(), settings())
            .await
            .unwrap();
        let docs = live
            .iter()
            .map(|(k, r)| (k.clone(), vec![Some(r.body.clone())]))
            .collect();
        let reference = Reference::new(&["body"], &docs);
        for q in ["shock layer", "+flow heat", "mach OR drag -plate"] {
            let ctx = format!("step {step}: {q:?}");
            let want = one(&local.search_fts(q, &opts).await.unwrap());
            let all: Vec<(String, f32)> = reference.search(q, false).into_iter().skip(1).collect();
            // First search of a query since its statistics changed: two rounds (with the
            // statistics kept: scored and checked, then scored again).
            let (rounds, got) = counted(&remote, remote.search_fts(q, &opts)).await;
            assert_eq!(rounds, 2, "{ctx}");
            assert_eq!(got, want, "{ctx}");
            assert_same_ranking(&ranked(got.as_slice()), &all, 6, &ctx);
            // Searched again: one round, the same rows.
            let (rounds, got) = counted(&remote, remote.search_fts(q, &opts)).await;
            assert_eq!(rounds, 1, "{ctx}: again");
            assert_eq!(got, want, "{ctx}: again");
            // Keeping no statistics: always two.
            let (rounds, got) = counted(&uncached, uncached.search_fts(q, &opts)).await;
            assert_eq!(rounds, 2, "{ctx}: uncached");
            assert_eq!(got, want, "{ctx}: uncached");
            // A hybrid search's text part keeps them too: one round a part.
            let want = one(&local.search_hybrid(q, &v, &hybrid).await.unwrap());
            let (_, got) = counted(&remote, remote.search_hybrid(q, &v, &hybrid)).await;
            assert_eq!(got, want, "{ctx}: hybrid");
            let (rounds, got) = counted(&remote, remote.search_hybrid(q, &v, &hybrid)).await;
            assert_eq!(rounds, 2, "{ctx}: hybrid again");
            assert_eq!(got, want, "{ctx}: hybrid again");
        }
        local.close().await.unwrap();
        // New rows and deletes in every shard change every query's statistics.
        let writer = ShardedIndex::open(root.clone(), settings()).await.unwrap();
        let s = schema();
        let fresh: Vec<Row> = (200 + step * 40..240 + step * 40)
            .map(|i| row(i, step + 5))
            .collect();
        writer.append(&batch(&s, &fresh)).await.unwrap();
        for r in fresh {
            live.insert(r.id.clone(), r);
        }
        let gone: Vec<Key> = live
            .keys()
            .step_by(7)
            .map(|k| Key::from(k.as_str()))
            .collect();
        writer.delete(&gone).await.unwrap();
        for k in &gone {
            if let Key::Str(k) = k {
                live.remove(k);
            }
        }
        if step == 1 {
            writer.flush().await.unwrap();
        }
        writer.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_kept_before_a_shard_outgrew_them_are_found_again() {
    let dir = tempfile::tempdir().unwrap();
    let (location, _) = build(dir.path()).await;
    let remote = DistributedIndex::open(&location, &workers_here(3).await)
        .await
        .unwrap();
    let root = Location::parse(&location).unwrap();
    let opts = SearchOptions::with_k(5);
    // No row holds the term: the sums kept count none.
    assert!(one(&remote.search_fts("zebra", &opts).await.unwrap()).is_none());
    // Rows holding it, in one shard: that shard alone counts more than the sums kept.
    let writer = ShardedIndex::open(root.clone(), settings()).await.unwrap();
    let layout = remote.layout().clone();
    let zebras: Vec<Row> = (900..960)
        .map(|i| Row {
            body: format!("zebra {}", WORDS[i % 8]),
            ..row(i, 7)
        })
        .filter(|r| layout.shard_of(&Key::Str(r.id.clone())) == 0)
        .take(3)
        .collect();
    writer.append(&batch(&schema(), &zebras)).await.unwrap();
    writer.close().await.unwrap();
    let local = ShardedIndex::open_read_only(root, settings())
        .await
        .unwrap();
    for _ in 0..2 {
        let got = remote.search_fts("zebra", &opts).await.unwrap();
        assert_eq!(ranked(&got).len(), 3);
        assert_eq!(
            one(&got),
            one(&local.search_fts("zebra", &opts).await.unwrap())
        );
    }
    local.close().await.unwrap();
}

/// Worker processes, killed (and continued first, if stopped) when dropped: a failing test
/// leaves none behind.
struct Workers(Vec<(Child, String)>);

impl Drop for Workers {
    fn drop(&mut self) {
        for (child, _) in &mut self.0 {
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-CONT", &pid]).status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A `lsmsearch worker` process and the address it listens on.
fn start_worker() -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lsmsearch"))
        .args(["worker", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Read on a thread of its own: a worker that never says where it listens fails the
    // test within a minute instead of holding it up for good.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(60)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the worker did not say where it listens within 60 s");
    };
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("worker said {line:?}"))
        .to_string();
    (child, addr)
}

#[test]
fn a_worker_with_settings_out_of_range_says_so_and_never_listens() {
    let out = Command::new(env!("CARGO_BIN_EXE_lsmsearch"))
        .args([
            "worker",
            "--listen",
            "127.0.0.1:0",
            "--settings",
            r#"{"hnsw_m": 1}"#,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!stdout.contains("listening"), "{stdout}");
    assert!(stderr.contains("hnsw_m"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_processes_search_as_one_process_and_a_dead_one_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (location, live) = build(dir.path()).await;
    let mut workers = Workers((0..3).map(|_| start_worker()).collect());
    let addrs: Vec<String> = workers.0.iter().map(|w| w.1.clone()).collect();
    let local = ShardedIndex::open_read_only(Location::parse(&location).unwrap(), settings())
        .await
        .unwrap();
    let remote = DistributedIndex::open(&location, &addrs).await.unwrap();
    same_results(&remote, &local, &live).await;

    // The command line: the same rows with --workers as without.
    let cli = |extra: &[&str]| {
        let mut args = vec![
            "--json",
            "search",
            location.as_str(),
            "--fts",
            "shock layer",
            "--k",
            "5",
        ];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_lsmsearch"))
            .args(&args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let joined = addrs.join(",");
    let (ok, with, err) = cli(&["--workers", &joined]);
    assert!(ok, "{err}");
    let (ok, without, err) = cli(&[]);
    assert!(ok, "{err}");
    assert_eq!(with, without);

    // The distributed plan: a stage of one task a worker (here, a shard each).
    let out = Command::new(env!("CARGO_BIN_EXE_lsmsearch"))
        .args(["explain", &location, "--fts", "wing", "--workers", &joined])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(plan.contains("Stage"), "{plan}");
    for shard in 0..3 {
        assert!(plan.contains(&format!("shards=[{shard}] of 3")), "{plan}");
    }

    // A location relative to the command's directory: the workers (started elsewhere)
    // read the same index.
    let out = Command::new(env!("CARGO_BIN_EXE_lsmsearch"))
        .current_dir(dir.path())
        .args([
            "--json",
            "search",
            "idx",
            "--fts",
            "shock layer",
            "--k",
            "5",
            "--workers",
            &joined,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), without);

    // A worker that stops answering: the search fails Unavailable past the task deadline.
    let stopped = workers.0[2].0.id().to_string();
    Command::new("kill")
        .args(["-STOP", &stopped])
        .status()
        .unwrap();
    let patient = DistributedIndex::open(&location, &addrs)
        .await
        .unwrap()
        .with_task_timeout(std::time::Duration::from_secs(2));
    let e = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        patient.search_fts("wing", &SearchOptions::with_k(5)),
    )
    .await
    .expect("the search returns past its task deadline")
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    Command::new("kill")
        .args(["-CONT", &stopped])
        .status()
        .unwrap();

    // A worker killed: the search runs again on the workers left, with every row.
    workers.0[1].0.kill().unwrap();
    workers.0[1].0.wait().unwrap();
    let want = one(&local
        .search_fts("wing", &SearchOptions::with_k(50))
        .await
        .unwrap());
    for _ in 0..3 {
        let rows = remote
            .search_fts("wing", &SearchOptions::with_k(50))
            .await
            .unwrap();
        assert_eq!(one(&rows), want, "a retried search returns every row");
    }
    let (ok, out, err) = cli(&["--workers", &joined]);
    assert!(ok, "{err}");
    assert_eq!(out, without);
    // No worker left: an Unavailable error naming them; with --json a JSON line.
    for w in [0, 2] {
        workers.0[w].0.kill().unwrap();
        workers.0[w].0.wait().unwrap();
    }
    let e = remote
        .search_fts("wing", &SearchOptions::with_k(50))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let (ok, out, _) = cli(&["--workers", &joined]);
    assert!(!ok);
    let e: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(e["kind"], "Unavailable", "{out}");
    // The last attempt had one worker left, with every shard's task.
    assert!(
        e["error"].as_str().unwrap().contains("shards [0, 1, 2]"),
        "{out}"
    );
    local.close().await.unwrap();
}

/// A worker killed while searches run: each search returns every row (run again on the
/// workers left) or fails with an `Unavailable` error; none returns fewer rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_query_never_costs_a_row() {
    let dir = tempfile::tempdir().unwrap();
    let (location, _) = build(dir.path()).await;
    let mut workers = Workers((0..3).map(|_| start_worker()).collect());
    let addrs: Vec<String> = workers.0.iter().map(|w| w.1.clone()).collect();
    let local = ShardedIndex::open_read_only(Location::parse(&location).unwrap(), settings())
        .await
        .unwrap();
    let fts = SearchOptions::with_k(50);
    let knn = VectorSearchOptions {
        exact: true,
        ..VectorSearchOptions::with_k(20)
    };
    let v = [1.0, 0.0, 0.5, 0.5];
    let want_fts = one(&local.search_fts("wing flow", &fts).await.unwrap());
    let want_knn = one(&local.search_vector(&v, &knn).await.unwrap());
    let remote = std::sync::Arc::new(DistributedIndex::open(&location, &addrs).await.unwrap());
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..3)
        .map(|c| {
            let (remote, done) = (remote.clone(), done.clone());
            let (fts, knn) = (fts.clone(), knn.clone());
            let (want_fts, want_knn) = (want_fts.clone(), want_knn.clone());
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0, 0);
                for i in 0..60 {
                    let got = match (i + c) % 2 {
                        0 => remote
                            .search_fts("wing flow", &fts)
                            .await
                            .map(|r| (one(&r), &want_fts)),
                        _ => remote
                            .search_vector(&v, &knn)
                            .await
                            .map(|r| (one(&r), &want_knn)),
                    };
                    match got {
                        Ok((rows, want)) => {
                            assert_eq!(&rows, want, "search {i} of client {c}");
                            ok += 1;
                        }
                        Err(e) => {
                            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
                            failed += 1;
                        }
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                (ok, failed)
            })
        })
        .collect();
    while done.load(std::sync::atomic::Ordering::SeqCst) < 30 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    workers.0[0].0.kill().unwrap();
    workers.0[0].0.wait().unwrap();
    let (mut ok, mut failed) = (0, 0);
    for c in clients {
        let (o, f) = c.await.unwrap();
        ok += o;
        failed += f;
    }
    // Searches run again without the dead worker: at most those in flight could fail.
    assert_eq!(ok + failed, 180);
    assert!(failed <= 3, "{failed} searches failed");
    local.close().await.unwrap();
}

/// A process that writes a shard serves that shard's tasks: searches see its memtable rows
/// the moment an append returns (here rows not yet in the WAL, which no other worker sees),
/// and when it goes the other workers read the shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_serves_its_shards_tasks() {
    use lsmsearch::shard::distributed::serve_writer;
    use lsmsearch::{Durability, WriteOptions};
    let dir = tempfile::tempdir().unwrap();
    let (location, mut live) = build(dir.path()).await;
    let workers = Workers((0..2).map(|_| start_worker()).collect());
    let addrs: Vec<String> = workers.0.iter().map(|w| w.1.clone()).collect();
    let writer = std::sync::Arc::new(
        ShardedIndex::open_shards(
            Location::parse(&location).unwrap(),
            &[1],
            Settings {
                wal_buffer_interval_ms: 600_000,
                ..settings()
            },
        )
        .await
        .unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let here = listener.local_addr().unwrap().to_string();
    let serving = {
        let writer = writer.clone();
        tokio::spawn(async move { serve_writer(listener, Settings::default(), &writer).await })
    };
    let plain = DistributedIndex::open(&location, &addrs).await.unwrap();
    let remote = DistributedIndex::open(&location, &addrs)
        .await
        .unwrap()
        .with_writer(1, &here)
        .unwrap();
    // New rows of shard 1, acknowledged once in the writer's memtable.
    let s = schema();
    let layout = remote.layout().clone();
    let fresh: Vec<Row> = (500..700)
        .map(|i| row(i, 9))
        .filter(|r| layout.shard_of(&Key::Str(r.id.clone())) == 1)
        .take(20)
        .collect();
    assert_eq!(fresh.len(), 20);
    writer
        .append_with(
            &batch(&s, &fresh),
            WriteOptions::with_durability(Durability::Buffered),
        )
        .await
        .unwrap();
    for r in &fresh {
        live.insert(r.id.clone(), r.clone());
    }
    // Shard 1's tasks read the writer: every row, as the writer itself searches them.
    same_results(&remote, &writer, &live).await;
    let every = SearchOptions::with_k(10);
    let all = WORDS.join(" OR ");
    assert_eq!(
        remote.count_fts(&all, &every).await.unwrap(),
        live.len() as u64
    );
    // Workers reading shard 1 from its WAL do not have them yet.
    assert_eq!(
        plain.count_fts(&all, &every).await.unwrap(),
        live.len() as u64 - 20
    );
    // The writer gone (its buffered rows written by its close): the other workers read its
    // shard, every row still there.
    serving.abort();
    let _ = serving.await;
    writer.close().await.unwrap();
    let everyone = ShardedIndex::open_read_only(Location::parse(&location).unwrap(), settings())
        .await
        .unwrap();
    same_results(&remote, &everyone, &live).await;
    // A shard past the index's is refused.
    let e = DistributedIndex::open(&location, &addrs)
        .await
        .unwrap()
        .with_writer(3, &here)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    everyone.close().await.unwrap();
    drop(workers);
}

/// A writer replaced by a newer one (which fenced it) does not serve its shard's tasks from
/// what it last held: its worker reads the shard as the newer writer left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_writer_does_not_serve_its_old_rows() {
    use lsmsearch::shard::distributed::serve_writer;
    let dir = tempfile::tempdir().unwrap();
    let (location, mut live) = build(dir.path()).await;
    let workers = Workers((0..2).map(|_| start_worker()).collect());
    let addrs: Vec<String> = workers.0.iter().map(|w| w.1.clone()).collect();
    let root = || Location::parse(&location).unwrap();
    let old = std::sync::Arc::new(
        ShardedIndex::open_shards(root(), &[1], settings())
            .await
            .unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let here = listener.local_addr().unwrap().to_string();
    let serving = {
        let old = old.clone();
        tokio::spawn(async move { serve_writer(listener, Settings::default(), &old).await })
    };
    let remote = DistributedIndex::open(&location, &addrs)
        .await
        .unwrap()
        .with_writer(1, &here)
        .unwrap();
    // Searched once through the old writer, which then loses its shard to a new one.
    remote
        .search_fts("wing", &SearchOptions::with_k(5))
        .await
        .unwrap();
    let new = ShardedIndex::open_shards(root(), &[1], settings())
        .await
        .unwrap();
    let layout = remote.layout().clone();
    let gone = live
        .keys()
        .find(|k| layout.shard_of(&Key::Str((*k).clone())) == 1)
        .unwrap()
        .clone();
    new.delete(&[Key::Str(gone.clone())]).await.unwrap();
    live.remove(&gone);
    let added = (800..900)
        .map(|i| row(i, 5))
        .find(|r| layout.shard_of(&Key::Str(r.id.clone())) == 1)
        .unwrap();
    new.append(&batch(&schema(), std::slice::from_ref(&added)))
        .await
        .unwrap();
    live.insert(added.id.clone(), added);
    same_results(&remote, &new, &live).await;
    serving.abort();
    let _ = serving.await;
    new.close().await.unwrap();
    drop(workers);
}

/// `n` workers in this process, and their addresses.
async fn workers_here(n: usize) -> Vec<String> {
    let mut addrs = Vec::new();
    for _ in 0..n {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap().to_string());
        tokio::spawn(serve(listener, Settings::default()));
    }
    addrs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_at_once_through_one_worker_never_meet() {
    // Every round through one worker is one task on it, named by its search's own query: 24
    // searches at once (full text in two phases, and vector) each get their own rows.
    let dir = tempfile::tempdir().unwrap();
    let (location, _) = build(dir.path()).await;
    let local = ShardedIndex::open_read_only(Location::parse(&location).unwrap(), settings())
        .await
        .unwrap();
    let remote = DistributedIndex::open(&location, &workers_here(1).await)
        .await
        .unwrap()
        .with_statistics_cache(0);
    let queries = [
        "wing",
        "shock layer",
        "+flow heat",
        "mach OR drag",
        "plate",
        "layer",
    ];
    let vectors = [
        [1.0, 0.0, 0.5, 0.5],
        [4.0, -3.0, 1.0, 0.5],
        [0.0, 1.0, 0.0, -1.0],
    ];
    let mut want = Vec::new();
    for i in 0..24 {
        let opts = SearchOptions::with_k(3 + i % 5);
        let vopts = VectorSearchOptions::with_k(3 + i % 4);
        want.push(match i % 2 {
            0 => one(&local.search_fts(queries[i % 6], &opts).await.unwrap()),
            _ => one(&local.search_vector(&vectors[i % 3], &vopts).await.unwrap()),
        });
    }
    let got = futures::future::join_all((0..24).map(|i| {
        let remote = &remote;
        async move {
            let opts = SearchOptions::with_k(3 + i % 5);
            let vopts = VectorSearchOptions::with_k(3 + i % 4);
            match i % 2 {
                0 => remote.search_fts(queries[i % 6], &opts).await,
                _ => remote.search_vector(&vectors[i % 3], &vopts).await,
            }
        }
    }))
    .await;
    for (i, (got, want)) in got.into_iter().zip(want).enumerate() {
        assert_eq!(one(&got.unwrap()), want, "search {i}");
    }
    local.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_that_cannot_be_reached_is_an_error_not_a_local_search() {
    let dir = tempfile::tempdir().unwrap();
    let (location, _) = build(dir.path()).await;
    // Nothing listens on port 1: the search must not quietly run in this process.
    let remote = DistributedIndex::open(&location, &["127.0.0.1:1".to_string()])
        .await
        .unwrap();
    let e = remote
        .search_fts("wing", &SearchOptions::with_k(5))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let e = remote
        .search_vector(&[1.0, 0.0, 0.5, 0.5], &VectorSearchOptions::with_k(5))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_a_worker_cannot_be_sent_are_invalid_as_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let (location, _) = build(dir.path()).await;
    let remote = DistributedIndex::open(&location, &workers_here(2).await)
        .await
        .unwrap();
    let local = ShardedIndex::open_read_only(Location::parse(&location).unwrap(), settings())
        .await
        .unwrap();
    for floor in [f32::INFINITY, f32::NAN, -1.0] {
        let opts = SearchOptions {
            min_score: Some(floor),
            ..SearchOptions::with_k(5)
        };
        let want = local.search_fts("wing", &opts).await.unwrap_err();
        let got = remote.search_fts("wing", &opts).await.unwrap_err();
        assert_eq!(
            (got.kind(), want.kind()),
            (ErrorKind::Invalid, ErrorKind::Invalid),
            "{floor}: {got}"
        );
    }
    for v in [[f32::NAN, 0.0, 0.0, 0.0], [f32::INFINITY, 1.0, 0.0, 0.0]] {
        let got = remote
            .search_vector(&v, &VectorSearchOptions::with_k(5))
            .await
            .unwrap_err();
        assert_eq!(got.kind(), ErrorKind::Invalid, "{v:?}: {got}");
    }
    let radius = VectorSearchOptions {
        max_distance: Some(f32::NAN),
        ..VectorSearchOptions::with_k(5)
    };
    let got = remote
        .search_vector(&[1.0, 0.0, 0.5, 0.5], &radius)
        .await
        .unwrap_err();
    assert_eq!(got.kind(), ErrorKind::Invalid, "{got}");
    local.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hybrid_search_naming_score_returns_what_one_process_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (location, _) = build(dir.path()).await;
    let remote = DistributedIndex::open(&location, &workers_here(2).await)
        .await
        .unwrap();
    let local = ShardedIndex::open_read_only(Location::parse(&location).unwrap(), settings())
        .await
        .unwrap();
    // A hybrid search naming _score among its columns, as one index allows.
    let opts = HybridSearchOptions {
        columns: Some(vec!["_score".into(), "year".into()]),
        exact: true,
        ..HybridSearchOptions::with_k(5)
    };
    let want = local
        .search_hybrid("wing", &[1.0, 0.0, 0.5, 0.5], &opts)
        .await
        .unwrap();
    let got = remote
        .search_hybrid("wing", &[1.0, 0.0, 0.5, 0.5], &opts)
        .await
        .unwrap();
    assert_eq!(one(&got), one(&want));
    local.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_of_another_schema_is_an_invalid_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (location, _) = build(dir.path()).await;
    // Shard 1 replaced by an index of another schema, behind the descriptor's back.
    let shard1 = dir.path().join("idx").join("shard-1");
    std::fs::remove_dir_all(&shard1).unwrap();
    let other =
        lsmsearch::IndexSchema::from_json(r#"{"primary_key": "id", "text": ["body"]}"#).unwrap();
    lsmsearch::Index::create(
        Location::parse(shard1.to_str().unwrap()).unwrap(),
        other,
        settings(),
    )
    .await
    .unwrap()
    .close()
    .await
    .unwrap();
    let remote = DistributedIndex::open(&location, &workers_here(3).await)
        .await
        .unwrap();
    let e = remote
        .search_fts("wing", &SearchOptions::with_k(5))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("shard 1"), "{e}");
    assert!(
        !e.to_string().contains("invalid input: invalid input"),
        "{e}"
    );
}

/// SQL through workers: the search functions return what they return in one process, and
/// the table itself is not scanned (a clear error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_search_functions_run_on_the_workers() {
    let dir = tempfile::tempdir().unwrap();
    let (location, _) = build(dir.path()).await;
    let remote = std::sync::Arc::new(
        DistributedIndex::open(&location, &workers_here(3).await)
            .await
            .unwrap(),
    );
    let local = std::sync::Arc::new(
        ShardedIndex::open_read_only(Location::parse(&location).unwrap(), settings())
            .await
            .unwrap(),
    );
    let (a, b) = (
        datafusion::prelude::SessionContext::new(),
        datafusion::prelude::SessionContext::new(),
    );
    lsmsearch::sql::register_distributed(&a, "docs", remote).unwrap();
    lsmsearch::sql::register_sharded(&b, "docs", local.clone()).unwrap();
    for statement in [
        "SELECT id, _score, year FROM fts('docs', 'shock layer', 7) ORDER BY _score DESC, id",
        "SELECT year, count(*) AS n FROM fts('docs', 'flow OR wing', 1000) GROUP BY year \
         ORDER BY year",
        "SELECT id, _distance FROM knn('docs', [1.0, 0.0, 0.5, 0.5], 5) ORDER BY _distance, id",
        "SELECT id, _score FROM hybrid('docs', 'heat', [1.0, 0.0, 0.5, 0.5], 6) \
         ORDER BY _score DESC, id",
    ] {
        let got = lsmsearch::sql::query(&a, statement).await.unwrap();
        let want = lsmsearch::sql::query(&b, statement).await.unwrap();
        assert!(
            want.iter().map(|b| b.num_rows()).sum::<usize>() > 0,
            "{statement}"
        );
        let pretty = |r: &[RecordBatch]| {
            arrow::util::pretty::pretty_format_batches(r)
                .unwrap()
                .to_string()
        };
        assert_eq!(pretty(&got), pretty(&want), "{statement}");
    }
    let e = lsmsearch::sql::query(&a, "SELECT count(*) FROM docs")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("cannot be scanned"), "{e}");
    local.close().await.unwrap();
}
