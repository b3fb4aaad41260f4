//! Compaction: a merged generation holds the newest version of each key (tombstones dropped
//! once nothing older remains), answers do not change, queries never fail, go stale or come
//! back short while compactions replace and delete generations, read-only handles follow, a
//! fenced writer publishes nothing, and the generation count stays bounded under a stream.

mod common;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Float32Type;
use common::*;
use lsmsearch::{
    ErrorKind, Index, Key, Location, SearchOptions, Settings, VectorSearchOptions, DISTANCE_COLUMN,
    SCORE_COLUMN,
};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUERIES: [&str; 4] = ["body", "version 3", "k1 k7 k30", "\"of k4\""];
const PROBES: [[f32; 4]; 3] = [[1.0, 2.0, -1.0, 0.5], [5.0, 6.0, -5.0, 0.5], [0.0; 4]];

/// `(key, score or distance)` of each row of a search's answer.
fn ranked(batches: &[RecordBatch], column: &str) -> Vec<(String, f32)> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column(0).as_string::<i32>();
        let v = b
            .column_by_name(column)
            .unwrap()
            .as_primitive::<Float32Type>();
        for r in 0..b.num_rows() {
            out.push((ids.value(r).to_string(), v.value(r)));
        }
    }
    out
}

/// Every answer the tests compare: the live rows, full-text and exact vector searches.
#[derive(Debug, PartialEq)]
struct Answers {
    rows: Model,
    fts: Vec<Vec<(String, f32)>>,
    vector: Vec<Vec<(String, f32)>>,
}

async fn answers(index: &Index) -> Answers {
    let mut fts = Vec::new();
    for q in QUERIES {
        let got = index
            .search_fts(q, &SearchOptions::with_k(12))
            .await
            .unwrap();
        fts.push(ranked(&got, SCORE_COLUMN));
    }
    let mut vector = Vec::new();
    for p in PROBES {
        let opts = VectorSearchOptions {
            k: 12,
            exact: true,
            ..VectorSearchOptions::default()
        };
        let got = index.search_vector(&p, &opts).await.unwrap();
        vector.push(ranked(&got, DISTANCE_COLUMN));
    }
    Answers {
        rows: live(index).await,
        fts,
        vector,
    }
}

fn settings(compaction: bool) -> Settings {
    Settings {
        memtable_max_rows: 1_000_000,
        compaction,
        compaction_grace_ms: 0,
        ..Settings::default()
    }
}

/// Append `rows` to `index` and record them in `model`.
async fn append(index: &Index, rows: Vec<Row>, model: &mut Model) {
    index.append(&batch(&schema(), &rows)).await.unwrap();
    for r in rows {
        model.insert(r.id.clone(), r);
    }
}

/// Six generations with overlapping keys (updates) and deletes, flushed one by one.
async fn six_generations(index: &Index) -> Model {
    let mut model = Model::new();
    for g in 0..6i64 {
        let rows: Vec<Row> = (g * 20..g * 20 + 30)
            .map(|i| Row::new(format!("k{i}"), g))
            .collect();
        append(index, rows, &mut model).await;
        let gone = format!("k{}", g * 7);
        index.delete(&[Key::from(gone.as_str())]).await.unwrap();
        model.remove(&gone);
        index.flush().await.unwrap();
    }
    model
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_keeps_every_answer_and_drops_superseded_rows_and_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::parse(&dir.path().display().to_string()).unwrap();
    let index = Index::create(loc.clone(), schema(), settings(false))
        .await
        .unwrap();
    let model = six_generations(&index).await;
    assert_eq!(index.stats().generations.len(), 6);
    let before = answers(&index).await;
    assert_eq!(before.rows, model);

    let report = index
        .compact()
        .await
        .unwrap()
        .expect("six generations merge");
    let stats = index.stats();
    assert_eq!(stats.generations.len(), 1);
    assert_eq!(report.generations_before, 6);
    assert_eq!(report.generations_after, 1);
    assert_eq!(
        report.rows_out,
        model.len() as u64,
        "superseded versions and tombstones are gone"
    );
    assert_eq!(stats.generations[0].tombstones, 0);
    assert_eq!(
        stats.generations[0].flushes, 6,
        "it holds the rows of six flushes"
    );
    assert!(report.rows_in > report.rows_out);
    assert_eq!(answers(&index).await, before, "answers changed");
    assert_eq!(stats.compactions, 1);
    assert_eq!(
        index.compact().await.unwrap(),
        None,
        "one generation without tombstones: nothing to do"
    );
    index.close().await.unwrap();

    let reopened = Index::open(loc, settings(false)).await.unwrap();
    assert_eq!(
        answers(&reopened).await,
        before,
        "answers changed on reopen"
    );
    // The replaced objects are deleted (grace 0, no query holds them) by the next writer's
    // collection, if the first writer's compactor did not get to it before closing.
    let gens = || {
        std::fs::read_dir(dir.path().join("generations"))
            .unwrap()
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while gens() > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gens(), 1, "replaced generation objects are left");
    reopened.close().await.unwrap();
}

/// Wait until the background compactor has nothing left to do (at most 20 s).
async fn settled(index: &Index) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while index.stats().compaction_debt_rows > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        index.stats().compaction_debt_rows,
        0,
        "compaction never caught up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_above_older_generations_keeps_its_tombstones() {
    let index = Index::create(memory(), schema(), settings(true))
        .await
        .unwrap();
    let s = schema();
    // A big old generation holding k1, then four small ones deleting it: the policy merges the
    // four (not the big one), and must keep the tombstone, or the old k1 would come back.
    let old: Vec<Row> = (0..40).map(|i| Row::new(format!("k{i}"), 1)).collect();
    index.append(&batch(&s, &old)).await.unwrap();
    index.flush().await.unwrap();
    let mut model: Model = old.into_iter().map(|r| (r.id.clone(), r)).collect();
    model.remove("k1");
    for g in 0..4 {
        let row = Row::new(format!("n{g}"), 2);
        index
            .append(&batch(&s, std::slice::from_ref(&row)))
            .await
            .unwrap();
        model.insert(row.id.clone(), row);
        index.delete(&[Key::from("k1")]).await.unwrap();
        index.flush().await.unwrap();
    }
    settled(&index).await;
    let stats = index.stats();
    assert!(stats.compactions >= 1, "nothing was compacted");
    assert_eq!(stats.generations.len(), 2, "{:?}", stats.generations);
    assert_eq!(
        stats.generations[0].rows, 40,
        "the big generation was left alone"
    );
    assert_eq!(
        (stats.generations[1].rows, stats.generations[1].tombstones),
        (5, 1),
        "four new rows and the newest tombstone of k1"
    );
    assert_eq!(live(&index).await, model, "a deleted row came back");
    // A full compaction now has nothing older below it: the tombstone goes too.
    index.compact().await.unwrap().unwrap();
    let stats = index.stats();
    assert_eq!(stats.generations.len(), 1);
    assert_eq!(stats.generations[0].tombstones, 0);
    assert_eq!(live(&index).await, model);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_compaction_bounds_the_generations_of_a_stream() {
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let loc = Location::from_store(store.clone(), "idx");
    let index = Index::create(loc, schema(), settings(true)).await.unwrap();
    let mut model = Model::new();
    let flushes = 64u32;
    let mut most = 0;
    for f in 0..flushes {
        // 40 new keys, 4 updates of earlier keys, one delete.
        let mut rows: Vec<Row> = (0..40)
            .map(|i| Row::new(format!("f{f}-{i}"), i64::from(f)))
            .collect();
        if f > 0 {
            rows.extend((0..4).map(|i| Row::new(format!("f{}-{i}", f / 2), i64::from(f))));
        }
        append(&index, rows, &mut model).await;
        let gone = format!("f{}-39", f / 3);
        index.delete(&[Key::from(gone.as_str())]).await.unwrap();
        model.remove(&gone);
        index.flush().await.unwrap();
        most = most.max(index.stats().generations.len());
    }
    settled(&index).await;
    let stats = index.stats();
    let bound = (2.0 * f64::from(flushes).log2()) as usize;
    println!(
        "{flushes} flushes: at most {most} generations seen, {} at the end, {} compactions",
        stats.generations.len(),
        stats.compactions
    );
    assert!(stats.compactions > 0);
    assert!(
        most <= Settings::default().compaction_max_generations,
        "{most} generations at once: above the cap"
    );
    assert!(
        stats.generations.len() <= bound,
        "{} generations after {flushes} flushes (bound {bound})",
        stats.generations.len()
    );
    assert_eq!(live(&index).await, model);
    // Replaced objects are deleted (grace 0): only the listed generations remain.
    use futures::TryStreamExt;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let objects: Vec<_> = store
            .list(Some(&object_store::path::Path::from("idx/generations")))
            .try_collect()
            .await
            .unwrap();
        if objects.len() == index.stats().generations.len() || Instant::now() > deadline {
            assert_eq!(objects.len(), index.stats().generations.len());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(index.stats().bytes_reclaimable, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_never_fail_go_stale_or_come_back_short_while_compactions_run() {
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::parse(&dir.path().display().to_string()).unwrap();
    // Aggressive compaction (runs of 2), objects deleted as soon as no query holds them, and a
    // reader whose cache holds nothing, so it loads every generation it plans with.
    let writer_settings = Settings {
        memtable_max_rows: 100,
        compaction_fanout: 2,
        ..settings(true)
    };
    let index = Arc::new(
        Index::create(loc.clone(), schema(), writer_settings)
            .await
            .unwrap(),
    );
    let s = schema();
    const KEYS: usize = 60;
    // Round 0 puts every key in; `acked` is the last round every key has been written at.
    let all = |v: i64| -> Vec<Row> { (0..KEYS).map(|i| Row::new(format!("k{i}"), v)).collect() };
    index.append(&batch(&s, &all(0))).await.unwrap();
    let acked = Arc::new(AtomicI64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let ro = Arc::new(
        Index::open_read_only(
            loc.clone(),
            Settings {
                hot_cache_bytes: 1,
                ..Settings::default()
            },
        )
        .await
        .unwrap(),
    );
    let mut readers = Vec::new();
    for r in 0..2 {
        let (index, acked, done) = (index.clone(), acked.clone(), done.clone());
        readers.push(tokio::spawn(async move {
            let mut n = 0;
            while !done.load(Ordering::SeqCst) {
                let floor = acked.load(Ordering::SeqCst);
                let rows = live(&index).await;
                assert_eq!(rows.len(), KEYS, "reader {r}: a key is missing");
                for row in rows.values() {
                    assert!(
                        row.year >= floor,
                        "reader {r}: stale {row:?} (acked {floor})"
                    );
                }
                let fts = index.search_fts("body", &SearchOptions::with_k(10)).await;
                let fts = ranked(&fts.unwrap(), SCORE_COLUMN);
                assert_eq!(
                    fts.len(),
                    10,
                    "reader {r}: a full-text answer came back short"
                );
                let opts = VectorSearchOptions {
                    k: 10,
                    ..VectorSearchOptions::default()
                };
                let v = index.search_vector(&PROBES[0], &opts).await.unwrap();
                assert_eq!(ranked(&v, DISTANCE_COLUMN).len(), 10, "reader {r}: short");
                n += 1;
            }
            n
        }));
    }
    {
        let (ro, done) = (ro.clone(), done.clone());
        readers.push(tokio::spawn(async move {
            let mut n = 0;
            while !done.load(Ordering::SeqCst) {
                ro.refresh().await.unwrap();
                let got = ro.search_fts("body", &SearchOptions::with_k(10)).await;
                assert_eq!(
                    ranked(&got.unwrap(), SCORE_COLUMN).len(),
                    10,
                    "read-only: short"
                );
                n += 1;
            }
            n
        }));
    }
    for v in 1..=40i64 {
        // Each round in three appends (more generations than rounds), then acknowledged.
        let rows = all(v);
        for part in rows.chunks(KEYS / 3) {
            index.append(&batch(&s, part)).await.unwrap();
        }
        acked.store(v, Ordering::SeqCst);
        if v % 2 == 0 {
            index.flush().await.unwrap();
        }
    }
    done.store(true, Ordering::SeqCst);
    let mut queries = 0;
    for r in readers {
        queries += r.await.unwrap();
    }
    let stats = index.stats();
    println!(
        "{queries} query rounds during {} compactions",
        stats.compactions
    );
    assert!(
        stats.compactions >= 5,
        "only {} compactions",
        stats.compactions
    );
    assert!(queries >= 10, "only {queries} query rounds ran");
}

/// Wait (at most 10 s) until `index` has deleted the objects its compactions replaced (with a
/// grace period of 0, within the compactor's next tick); `what` says what failed otherwise.
async fn replaced_objects_deleted(index: &Index, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while index.stats().bytes_reclaimable > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(index.stats().bytes_reclaimable, 0, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_handle_reads_on_after_its_generations_are_compacted_away() {
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::parse(&dir.path().display().to_string()).unwrap();
    let index = Index::create(loc.clone(), schema(), settings(false))
        .await
        .unwrap();
    six_generations(&index).await;
    let want = answers(&index).await;
    // Nothing cached: every query loads the generations of the view it planned with.
    let ro = Index::open_read_only(
        loc,
        Settings {
            hot_cache_bytes: 1,
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(ro.stats().generations.len(), 6);
    index.compact().await.unwrap().unwrap();
    // Grace 0: the compactor deletes the six objects within its next tick.
    replaced_objects_deleted(&index, "the replaced objects are still there").await;
    let got = ro
        .search_fts(QUERIES[1], &SearchOptions::with_k(12))
        .await
        .unwrap();
    assert_eq!(ranked(&got, SCORE_COLUMN), want.fts[1]);
    assert_eq!(ro.stats().generations.len(), 1, "the view moved on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_writer_publishes_no_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::parse(&dir.path().display().to_string()).unwrap();
    let old = Index::create(loc.clone(), schema(), settings(false))
        .await
        .unwrap();
    let model = six_generations(&old).await;
    let new = Index::open(loc.clone(), settings(false)).await.unwrap();
    let version = new.stats().manifest_version;
    let e = old.compact().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    assert_eq!(new.stats().generations.len(), 6);
    new.close().await.unwrap();
    let reopened = Index::open(loc, settings(false)).await.unwrap();
    assert_eq!(
        reopened.stats().manifest_version,
        version + 1,
        "only the reopen's claim"
    );
    assert_eq!(reopened.stats().generations.len(), 6);
    assert_eq!(live(&reopened).await, model);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generations_a_compaction_replaced_leave_the_caches() {
    // The writer deletes the replaced objects after the grace period, and a read-only handle
    // refreshes past them: neither cache keeps them (only the byte budget would evict them).
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::parse(&dir.path().display().to_string()).unwrap();
    let index = Index::create(loc.clone(), schema(), settings(false))
        .await
        .unwrap();
    six_generations(&index).await;
    let ro = Index::open_read_only(loc, Settings::default())
        .await
        .unwrap();
    assert_eq!(ro.cache_stats().await.generations, 6);
    index.compact().await.unwrap().unwrap();
    replaced_objects_deleted(&index, "the replaced objects are still there").await;
    assert_eq!(
        index.cache_stats().await.generations,
        1,
        "the writer's cache"
    );
    ro.refresh().await.unwrap();
    ro.scan(lsmsearch::ScanOptions::default()).await.unwrap();
    assert_eq!(
        ro.cache_stats().await.generations,
        1,
        "the read-only handle's cache"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_deletes_no_object_a_stream_still_reads() {
    // Nothing cached (`hot_cache_bytes` 1): the stream opened copies of the generations of its
    // own, not the ones the compaction merged, and reads their rows by range as it is polled.
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::parse(&dir.path().display().to_string()).unwrap();
    let s = Settings {
        hot_cache_bytes: 1,
        ..settings(false)
    };
    let index = Index::create(loc, schema(), s).await.unwrap();
    let model = six_generations(&index).await;
    let stream = index
        .scan_stream(lsmsearch::ScanOptions::default())
        .await
        .unwrap();
    index.compact().await.unwrap().unwrap();
    let objects = || {
        std::fs::read_dir(dir.path().join("generations"))
            .unwrap()
            .count()
    };
    // Grace 0, and the compactor deletes what is due every second: past its next tick, the
    // six objects the stream reads are still there.
    let deadline = Instant::now() + Duration::from_millis(2_500);
    while objects() == 7 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(objects(), 7, "an object the stream reads was deleted");
    let batches: Vec<RecordBatch> = futures::TryStreamExt::try_collect(stream).await.unwrap();
    assert_eq!(to_model(&batches), model);
    // The stream is gone: so are they. The writer stops counting an object as reclaimable
    // when it issues its delete, which may land a little later.
    replaced_objects_deleted(&index, "objects a finished stream read are left").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while objects() > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(objects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_that_loses_a_generation_to_a_compaction_starts_over() {
    // A second writer opens while the running one compacts: it read the list before the
    // compaction, and the replaced objects are deleted (grace 0) before it fetches them. The
    // open must start over on the newer list, not fail as if the index were corrupt.
    use common::faulty::{Action, FaultyStore};
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let running = Index::create(
        Location::from_store(inner.clone(), "idx"),
        schema(),
        settings(false),
    )
    .await
    .unwrap();
    let model = six_generations(&running).await;
    let faulty = FaultyStore::new(inner.clone());
    let held = Arc::new(tokio::sync::Semaphore::new(0));
    faulty.on("get", "generations/", Action::HoldOnce(held.clone()));
    let opening = tokio::spawn(Index::open(
        Location::from_store(faulty.clone(), "idx"),
        settings(false),
    ));
    // It has read the list and waits for its first generation.
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.compact().await.unwrap().unwrap();
    replaced_objects_deleted(&running, "the run is deleted").await;
    held.add_permits(1);
    let opened = opening.await.unwrap().expect("the open starts over");
    assert_eq!(opened.stats().generations.len(), 1);
    assert_eq!(live(&opened).await, model);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_merged_generation_passes_compaction_max_rows() {
    // Six generations of 30 rows (with updates and deletes) under a cap of 70 rows a merged
    // generation: compact() merges the oldest runs that fit, answers unchanged.
    let capped = Settings {
        compaction_max_rows: 70,
        memtable_max_rows: 35,
        ..settings(false)
    };
    let index = Index::create(memory(), schema(), capped.clone())
        .await
        .unwrap();
    let model = six_generations(&index).await;
    let before = answers(&index).await;
    let report = index.compact().await.unwrap().expect("runs merge");
    let gens = index.stats().generations;
    println!(
        "{report:?}: {:?}",
        gens.iter().map(|g| g.rows).collect::<Vec<_>>()
    );
    assert!(gens.len() > 1 && gens.len() < 6, "{gens:?}");
    assert!(gens.iter().all(|g| g.rows <= 70), "{gens:?}");
    assert_eq!(report.generations_before, 6);
    assert_eq!(report.generations_after, gens.len());
    assert_eq!(answers(&index).await, before, "answers changed");
    assert_eq!(live(&index).await, model);
    // Nothing fits together any more: nothing to do.
    assert_eq!(index.compact().await.unwrap(), None);
    index.close().await.unwrap();

    // A stream under the same cap with background compaction: no merge passes it, and
    // flushes at the generation cap do not wait for merges that cannot happen.
    let index = Index::create(
        memory(),
        schema(),
        Settings {
            compaction: true,
            compaction_max_generations: 6,
            ..capped
        },
    )
    .await
    .unwrap();
    let s = schema();
    for f in 0..40 {
        let rows: Vec<Row> = (0..30).map(|i| Row::new(format!("f{f}-{i}"), 1)).collect();
        index.append(&batch(&s, &rows)).await.unwrap();
        tokio::time::timeout(Duration::from_secs(20), index.flush())
            .await
            .expect("a flush waits for a merge that cannot happen")
            .unwrap();
    }
    settled(&index).await;
    let gens = index.stats().generations;
    assert!(gens.iter().all(|g| g.rows <= 70), "{gens:?}");
    // The cap of 6 applies to the open generations (under 35 rows, half the cap on merged
    // rows); the full ones are beside them.
    let open = gens.iter().filter(|g| g.rows * 2 < 70).count();
    assert!(open <= 6, "{gens:?}");
    assert_eq!(live(&index).await.len(), 40 * 30);
    index.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn superseded_rows_of_a_full_generation_are_reclaimed() {
    // A generation of 60 rows is full under a cap of 70 merged rows: it never merges with
    // another of 30. When every one of its keys is written again, its rows are dead and must
    // still go (a rewrite of it alone), or an update workload's bytes grow without bound.
    let capped = Settings {
        compaction_max_rows: 70,
        memtable_max_rows: 35,
        ..settings(false)
    };
    let index = Index::create(memory(), schema(), capped).await.unwrap();
    let mut model = Model::new();
    for version in 1..=2i64 {
        for half in 0..2 {
            let rows: Vec<Row> = (half * 30..half * 30 + 30)
                .map(|i| Row::new(format!("k{i}"), version))
                .collect();
            append(&index, rows, &mut model).await;
            index.flush().await.unwrap();
        }
        while index.compact().await.unwrap().is_some() {}
    }
    let before = answers(&index).await;
    assert_eq!(before.rows, model);
    let gens = index.stats().generations;
    let stored: u64 = gens.iter().map(|g| g.rows).sum();
    assert_eq!(
        stored,
        60,
        "every superseded version is reclaimed: {:?}",
        gens.iter().map(|g| g.rows).collect::<Vec<_>>()
    );
    assert_eq!(live(&index).await, model);
    index.close().await.unwrap();
}
