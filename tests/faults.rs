//! Faults injected through a store wrapper: a slow flush does not block appends (until the
//! frozen-memtable bound), a failed WAL write acknowledges nothing, a failed manifest write fails
//! the flush and loses nothing.

mod common;

use common::faulty::{Action, FaultyStore};
use common::*;
use lsmsearch::{
    Durability, ErrorKind, Index, Key, Location, ScanOptions, SearchOptions, Settings,
    VectorSearchOptions, WriteOptions,
};
use object_store::memory::InMemory;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

fn faulty() -> (Arc<FaultyStore>, Location) {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let loc = Location::from_store(store.clone(), "idx");
    (store, loc)
}

fn settings() -> Settings {
    Settings {
        memtable_max_rows: 10,
        max_frozen_memtables: 2,
        ..Settings::default()
    }
}

fn rows(prefix: &str, n: usize) -> Vec<Row> {
    (0..n)
        .map(|i| Row::new(format!("{prefix}{i:03}"), 1))
        .collect()
}

#[tokio::test]
async fn appends_continue_while_a_flush_is_held_then_wait_at_the_bound() {
    let (store, loc) = faulty();
    let s = schema();
    let index = Arc::new(Index::create(loc, s.clone(), settings()).await.unwrap());
    let gate = Arc::new(Semaphore::new(0));
    store.on("put", "generations/", Action::Hold(gate.clone()));

    // 10 rows fill the memtable: it freezes and its flush hangs on the held PUT.
    index.append(&batch(&s, &rows("a", 10))).await.unwrap();
    // Appends go on and are visible; the frozen memtable stays searchable.
    index.append(&batch(&s, &rows("b", 10))).await.unwrap();
    assert_eq!(live(&index).await.len(), 20);
    let st = index.stats();
    assert_eq!(st.frozen_memtables, 2, "{st:?}");
    assert_eq!(st.generations.len(), 0);

    // A third full memtable is acknowledged (it is in the WAL and the memtable), but freezing it
    // must wait for a flush slot: the next append waits behind it (backpressure, not an error).
    index.append(&batch(&s, &rows("c", 10))).await.unwrap();
    let blocked = {
        let index = index.clone();
        let b = batch(&s, &rows("d", 1));
        tokio::spawn(async move { index.append(&b).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !blocked.is_finished(),
        "the append should wait for a flush slot"
    );
    assert_eq!(live(&index).await.len(), 30);

    // Release the flushes: everything lands, nothing is lost or doubled.
    gate.add_permits(100);
    blocked.await.unwrap().unwrap();
    index.flush().await.unwrap();
    let m = live(&index).await;
    assert_eq!(m.len(), 31);
    assert_eq!(index.stats().frozen_memtables, 0);
    assert_eq!(index.stats().generations.len(), 4);
}

/// Ids and years of every row a search returns (a key twice fails).
fn hits(batches: &[arrow::array::RecordBatch]) -> std::collections::BTreeMap<String, i64> {
    use arrow::array::AsArray;
    let mut out = std::collections::BTreeMap::new();
    for b in batches {
        let ids = b.column_by_name("id").unwrap().as_string::<i32>();
        let years = b
            .column_by_name("year")
            .unwrap()
            .as_primitive::<arrow::datatypes::Int64Type>();
        for r in 0..b.num_rows() {
            let dup = out.insert(ids.value(r).to_string(), years.value(r));
            assert!(dup.is_none(), "{} returned twice", ids.value(r));
        }
    }
    out
}

#[tokio::test]
async fn versions_across_frozen_memtables_and_the_active_one_show_only_the_newest() {
    // Flushes are held: the rows stay in two frozen memtables and the active one, and each
    // newer memtable hides the versions it replaces in the older ones, for scans and both
    // searches, before and after the flushes land.
    let (store, loc) = faulty();
    let s = schema();
    let index = Index::create(loc, s.clone(), settings()).await.unwrap();
    let gate = Arc::new(Semaphore::new(0));
    store.on("put", "generations/", Action::Hold(gate.clone()));
    let mut model = Model::new();
    let mut put = |rows: Vec<Row>| {
        for r in &rows {
            model.insert(r.id.clone(), r.clone());
        }
        batch(&s, &rows)
    };
    index.append(&put(rows("a", 10))).await.unwrap();
    let mut second: Vec<Row> = (0..5).map(|i| Row::new(format!("a{i:03}"), 2)).collect();
    second.extend(rows("b", 5));
    index.append(&put(second)).await.unwrap();
    let third: Vec<Row> = [1, 5, 7]
        .iter()
        .map(|i| Row::new(format!("a{i:03}"), 3))
        .collect();
    index.append(&put(third)).await.unwrap();
    index
        .delete(&[Key::from("a000"), Key::from("b001")])
        .await
        .unwrap();
    model.remove("a000");
    model.remove("b001");
    assert_eq!(index.stats().frozen_memtables, 2);
    let expect: std::collections::BTreeMap<String, i64> =
        model.values().map(|r| (r.id.clone(), r.year)).collect();
    for stage in ["held", "flushed"] {
        assert_eq!(live(&index).await, model, "{stage}");
        let fts = index
            .search_fts("body", &SearchOptions::with_k(100))
            .await
            .unwrap();
        assert_eq!(hits(&fts), expect, "full text, {stage}");
        for exact in [false, true] {
            let opts = VectorSearchOptions {
                k: 100,
                exact,
                ..Default::default()
            };
            let v = index.search_vector(&[0.0; DIM], &opts).await.unwrap();
            assert_eq!(hits(&v), expect, "vector, exact = {exact}, {stage}");
        }
        gate.add_permits(100);
        index.flush().await.unwrap();
    }
}

#[tokio::test]
async fn a_failed_wal_write_acknowledges_nothing_and_changes_nothing() {
    let (store, loc) = faulty();
    let s = schema();
    let index = Index::create(loc.clone(), s.clone(), Settings::default())
        .await
        .unwrap();
    index.append(&batch(&s, &rows("ok", 3))).await.unwrap();
    store.on("put", "wal/", Action::Fail);
    let e = index
        .append(&batch(&s, &rows("lost", 3)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert_eq!(
        live(&index).await.len(),
        3,
        "an unacknowledged row is not visible"
    );
    // Buffered writes are acknowledged from memory and retried in the background.
    index
        .append_with(
            &batch(&s, &rows("buf", 2)),
            WriteOptions::with_durability(Durability::Buffered),
        )
        .await
        .unwrap();
    assert_eq!(live(&index).await.len(), 5);
    store.clear();
    index.append(&batch(&s, &rows("more", 1))).await.unwrap();
    index.close().await.unwrap();
    let reopened = Index::open(loc, Settings::default()).await.unwrap();
    let keys: Vec<String> = live(&reopened).await.into_keys().collect();
    assert_eq!(keys.len(), 6, "{keys:?}");
    assert!(keys.iter().all(|k| !k.starts_with("lost")));
}

#[tokio::test]
async fn a_failed_manifest_write_fails_the_flush_and_a_retry_succeeds() {
    let (store, loc) = faulty();
    let s = schema();
    let index = Index::create(loc.clone(), s.clone(), Settings::default())
        .await
        .unwrap();
    index.append(&batch(&s, &rows("x", 5))).await.unwrap();
    store.on("put", "manifest/", Action::Fail);
    let e = index.flush().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert_eq!(
        live(&index).await.len(),
        5,
        "the frozen memtable stays searchable"
    );
    store.clear();
    // The flusher retries on its own; a new flush() waits for it.
    index.append(&batch(&s, &rows("y", 1))).await.unwrap();
    let mut tries = 0;
    while index.flush().await.is_err() {
        tries += 1;
        assert!(tries < 50, "the flush never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(index.stats().frozen_memtables, 0);
    assert_eq!(live(&index).await.len(), 6);
    index.close().await.unwrap();
    let ro = Index::open_read_only(loc, Settings::default())
        .await
        .unwrap();
    assert_eq!(
        to_model(&ro.scan(ScanOptions::default()).await.unwrap()).len(),
        6
    );
}

#[tokio::test]
async fn buffered_writes_reach_the_wal_without_further_calls() {
    let loc = memory();
    let s = schema();
    let settings = Settings {
        wal_buffer_interval_ms: 20,
        ..Settings::default()
    };
    let index = Index::create(loc.clone(), s.clone(), settings)
        .await
        .unwrap();
    index
        .append_with(
            &batch(&s, &rows("b", 4)),
            WriteOptions::with_durability(Durability::Buffered),
        )
        .await
        .unwrap();
    // Another handle sees them only once their WAL object exists.
    let ro = Index::open_read_only(loc, Settings::default())
        .await
        .unwrap();
    let mut seen = 0;
    for _ in 0..200 {
        ro.refresh().await.unwrap();
        seen = to_model(&ro.scan(ScanOptions::default()).await.unwrap()).len();
        if seen == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen, 4, "buffered rows never reached the WAL");
    drop(index);
}

#[tokio::test]
async fn wal_objects_and_old_manifests_are_cleaned_up() {
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(InMemory::new());
    let loc = Location::from_store(store.clone(), "idx");
    let s = schema();
    // Without compaction: each flush leaves its own generation object.
    let settings = Settings {
        manifest_retention: 3,
        compaction: false,
        ..Settings::default()
    };
    let index = Index::create(loc, s.clone(), settings).await.unwrap();
    for i in 0..12 {
        index
            .append(&batch(&s, &rows(&format!("g{i}-"), 3)))
            .await
            .unwrap();
        index.flush().await.unwrap();
    }
    use futures::TryStreamExt;
    let list = |p: &'static str| {
        let store = store.clone();
        async move {
            store
                .list(Some(&object_store::path::Path::from(p)))
                .try_collect::<Vec<_>>()
                .await
                .unwrap()
                .len()
        }
    };
    assert_eq!(
        list("idx/wal").await,
        2,
        "flushed WAL objects are deleted but the writer's fence and the last flush's last \
         object (kept until the next flush, for readers of the previous manifest)"
    );
    assert!(list("idx/manifest").await <= 4, "old manifests are pruned");
    assert_eq!(list("idx/generations").await, 12);
    assert_eq!(live(&index).await.len(), 36);
}

/// An index on a faulty store holding 5 rows in a memtable that only `flush()` freezes.
async fn five_rows_to_flush() -> (Arc<FaultyStore>, Location, Settings, Index) {
    let (store, loc) = faulty();
    let s = schema();
    let big = Settings {
        memtable_max_rows: 1_000,
        ..Settings::default()
    };
    let index = Index::create(loc.clone(), s.clone(), big.clone())
        .await
        .unwrap();
    index.append(&batch(&s, &rows("a", 5))).await.unwrap();
    (store, loc, big, index)
}

#[tokio::test]
async fn a_manifest_put_that_landed_but_reported_an_error_is_not_redone() {
    // The manifest naming the new generation is published, but the writer sees an error (a
    // timeout, an fsync error after the link, a 5xx retried into 412). The retry must find its
    // own manifest and finish the flush, without rebuilding and overwriting the generation
    // object the published manifest names, and without failing forever as a conflict.
    let (store, loc, big, index) = five_rows_to_flush().await;
    let s = schema();
    store.on("put", "manifest/", Action::SucceedThenFailOnce);
    let first = index.flush().await;
    let second = tokio::time::timeout(Duration::from_secs(20), index.flush())
        .await
        .expect("the retried flush finishes");
    assert!(first.is_ok() || second.is_ok(), "{first:?} then {second:?}");
    second.unwrap();
    assert_eq!(
        store.puts("generations/"),
        1,
        "the generation object is written once"
    );
    assert_eq!(index.stats().generations.len(), 1);
    index.append(&batch(&s, &rows("b", 5))).await.unwrap();
    index.flush().await.unwrap();
    index.close().await.unwrap();
    let reopened = Index::open(loc, big).await.unwrap();
    assert_eq!(reopened.stats().generations.len(), 2);
    assert_eq!(live(&reopened).await.len(), 10);
}

#[tokio::test]
async fn close_returns_while_flushes_keep_failing() {
    // Every generation PUT fails: frozen memtables pile up to the bound and the committer waits
    // for a flush slot that never comes. close() must still return, and every acknowledged row
    // must be replayed from the WAL by the next open.
    let (store, loc) = faulty();
    let s = schema();
    let tight = Settings {
        memtable_max_rows: 5,
        max_frozen_memtables: 1,
        ..Settings::default()
    };
    let index = Arc::new(
        Index::create(loc.clone(), s.clone(), tight.clone())
            .await
            .unwrap(),
    );
    store.on("put", "generations/", Action::Fail);
    let mut acked = 0;
    let writer = {
        let index = index.clone();
        let s = s.clone();
        tokio::spawn(async move {
            for i in 0..5 {
                if index
                    .append(&batch(&s, &rows(&format!("r{i}-"), 5)))
                    .await
                    .is_err()
                {
                    break;
                }
                acked += 5;
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::time::timeout(Duration::from_secs(10), index.close())
        .await
        .expect("close returns")
        .ok();
    let acked = writer.await.unwrap();
    assert!(acked >= 5, "some appends were acknowledged: {acked}");
    store.clear();
    let reopened = Index::open(loc, tight).await.unwrap();
    assert!(
        live(&reopened).await.len() >= acked,
        "every acknowledged row is back"
    );
}

#[tokio::test]
async fn close_reports_buffered_rows_it_could_not_write() {
    // Buffered rows are acknowledged before their WAL object is written. If that write still
    // fails when the handle closes, close() must say so (the rows are lost), not return Ok.
    let (store, loc) = faulty();
    let s = schema();
    let slow = Settings {
        wal_buffer_interval_ms: 60_000,
        ..settings()
    };
    let index = Index::create(loc, s.clone(), slow).await.unwrap();
    index
        .append_with(
            &batch(&s, &rows("b", 3)),
            WriteOptions::with_durability(Durability::Buffered),
        )
        .await
        .unwrap();
    store.on("put", "wal/", Action::Fail);
    let e = index.close().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}

#[tokio::test]
async fn the_wal_object_a_closed_writer_kept_is_deleted_by_the_next_writer() {
    // Each flush keeps the last WAL object it covered until the next flush (for readers of the
    // previous manifest); a writer that closes leaves it behind. The next writer's first flush
    // must delete it: only fence objects (one per open) and the newest kept object remain.
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(InMemory::new());
    let loc = Location::from_store(store.clone(), "idx");
    let s = schema();
    let index = Index::create(loc.clone(), s.clone(), Settings::default())
        .await
        .unwrap();
    for round in 0..3 {
        if round > 0 {
            let index = Index::open(loc.clone(), Settings::default()).await.unwrap();
            index
                .append(&batch(&s, &rows(&format!("r{round}-"), 2)))
                .await
                .unwrap();
            index.flush().await.unwrap();
            index.close().await.unwrap();
        } else {
            index.append(&batch(&s, &rows("r0-", 2))).await.unwrap();
            index.flush().await.unwrap();
            index.close().await.unwrap();
        }
    }
    use futures::TryStreamExt;
    let wal: Vec<_> = store
        .list(Some(&object_store::path::Path::from("idx/wal")))
        .try_collect()
        .await
        .unwrap();
    assert_eq!(
        wal.len(),
        3 + 1,
        "three fences and the last kept object: {wal:?}"
    );
}

#[tokio::test]
async fn a_retried_flush_never_overwrites_a_generation_object() {
    // The generation PUT lands but reports an error; the retry must not rebuild and overwrite
    // the object (a manifest published late by the first attempt could name it, and a rebuilt
    // graph differs from the one it describes): it reads back what landed.
    let (store, loc, big, index) = five_rows_to_flush().await;
    store.on("put", "generations/", Action::SucceedThenFailOnce);
    let _ = index.flush().await;
    tokio::time::timeout(Duration::from_secs(20), index.flush())
        .await
        .expect("the retried flush finishes")
        .unwrap();
    assert_eq!(
        store.landed("generations/"),
        1,
        "the generation object is written once"
    );
    index.close().await.unwrap();
    let reopened = Index::open(loc, big).await.unwrap();
    assert_eq!(live(&reopened).await.len(), 5);
}

#[tokio::test]
async fn buffered_acks_stop_at_a_bound_while_the_wal_is_down() {
    // During a WAL outage, buffered writes are acknowledged from memory only up to
    // `wal_buffer_max_rows`; past it an append must write the WAL itself, and fails while the
    // WAL is down, changing nothing. Once the WAL is back the buffer drains and nothing is lost.
    let (store, loc) = faulty();
    let s = schema();
    let settings = Settings {
        wal_buffer_interval_ms: 60_000,
        wal_buffer_max_rows: 10,
        memtable_max_rows: 1_000,
        ..settings()
    };
    let index = Index::create(loc.clone(), s.clone(), settings.clone())
        .await
        .unwrap();
    store.on("put", "wal/", Action::Fail);
    let buffered = WriteOptions::with_durability(Durability::Buffered);
    let all = rows("b", 20);
    let mut acked = 0;
    for (i, r) in all.iter().enumerate() {
        match index
            .append_with(&batch(&s, std::slice::from_ref(r)), buffered)
            .await
        {
            Ok(_) => {
                assert_eq!(acked, i, "an append succeeded after one was refused");
                acked += 1;
            }
            Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
        }
    }
    assert_eq!(acked, 10, "buffered acks must stop at wal_buffer_max_rows");
    assert_eq!(
        live(&index).await.len(),
        10,
        "a refused append changed the memtable"
    );
    store.clear();
    index
        .append_with(&batch(&s, &all[10..11]), buffered)
        .await
        .unwrap();
    index.close().await.unwrap();
    let reopened = Index::open(loc, settings).await.unwrap();
    assert_eq!(live(&reopened).await, to_model(&[batch(&s, &all[..11])]));
}

#[tokio::test]
async fn appends_do_not_wait_forever_behind_flushes_that_keep_failing() {
    // With the frozen-memtable bound reached and every flush failing, an append waiting for
    // room must get an answer (the flush error, or its ack once the freeze gives up), not hang.
    let (store, loc) = faulty();
    let s = schema();
    let settings = Settings {
        memtable_max_rows: 5,
        max_frozen_memtables: 1,
        ..Settings::default()
    };
    let index = Index::create(loc, s.clone(), settings).await.unwrap();
    store.on("put", "generations/", Action::Fail);
    for round in 0..4 {
        let rows = rows(&format!("r{round}-"), 5);
        let r = tokio::time::timeout(Duration::from_secs(20), index.append(&batch(&s, &rows)))
            .await
            .unwrap_or_else(|_| panic!("append {round} hung behind failing flushes"));
        if let Err(e) = r {
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        }
    }
    store.clear();
    index.flush().await.unwrap();
}

/// Settings where only `compact()` merges and only `flush()` freezes.
fn manual_compaction() -> Settings {
    Settings {
        memtable_max_rows: 1_000_000,
        compaction: false,
        ..Settings::default()
    }
}

/// An index on a faulty store holding `n` generations of 5 rows (`g0-...`, `g1-...`, ...),
/// flushed one by one.
async fn flushed_generations(n: usize, settings: &Settings) -> (Arc<FaultyStore>, Location, Index) {
    let (store, loc) = faulty();
    let s = schema();
    let index = Index::create(loc.clone(), s.clone(), settings.clone())
        .await
        .unwrap();
    for g in 0..n {
        index
            .append(&batch(&s, &rows(&format!("g{g}-"), 5)))
            .await
            .unwrap();
        index.flush().await.unwrap();
    }
    (store, loc, index)
}

/// After a compact() of four such generations whose manifest the writer is unsure of: the
/// next flush installs the merged generation and publishes its own after it; nothing is lost
/// or shown twice, before and after a reopen.
async fn a_flush_installs_the_merge_then_publishes(
    index: Index,
    loc: Location,
    settings: Settings,
) {
    index
        .append(&batch(&schema(), &rows("after-", 5)))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), index.flush())
        .await
        .expect("the flush after it finishes")
        .unwrap();
    assert_eq!(
        index.stats().generations.len(),
        2,
        "the merged generation (installed) and the new one"
    );
    assert_eq!(live(&index).await.len(), 25);
    index.close().await.unwrap();
    let reopened = Index::open(loc, settings).await.unwrap();
    assert_eq!(reopened.stats().generations.len(), 2);
    assert_eq!(live(&reopened).await.len(), 25);
}

/// Generation objects in the store.
async fn generation_objects(store: &FaultyStore) -> usize {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    store
        .list(Some(&object_store::path::Path::from("idx/generations")))
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .len()
}

#[tokio::test]
async fn a_compaction_manifest_that_landed_but_reported_an_error_does_not_wedge_the_writer() {
    // compact()'s manifest lands but the writer sees an error: the next publish (a flush) must
    // find it, install it and go on, and nothing is lost or shown twice.
    let settings = manual_compaction();
    let (store, loc, index) = flushed_generations(4, &settings).await;
    store.on("put", "manifest/", Action::SucceedThenFailOnce);
    assert!(index.compact().await.is_err(), "the PUT reported an error");
    store.clear();
    a_flush_installs_the_merge_then_publishes(index, loc, settings).await;
}

#[tokio::test]
async fn a_failed_compact_at_the_cap_does_not_stop_the_writer() {
    // compact() merges while a flush brings the generations to the cap; its manifest PUT then
    // fails without landing. The background compactor and the flusher (waiting at the cap)
    // must not wait for each other forever: once the store is healthy again, an append and a
    // flush complete and the generations go back under the cap.
    let (store, loc) = faulty();
    let s = schema();
    let settings = Settings {
        memtable_max_rows: 1_000_000,
        compaction_fanout: 2,
        compaction_max_generations: 3,
        ..Settings::default()
    };
    let index = Arc::new(
        Index::create(loc.clone(), s.clone(), settings.clone())
            .await
            .unwrap(),
    );
    // 20 rows, then 5: the policy merges neither (20 > 1.5 × 5), and two are under the cap.
    index.append(&batch(&s, &rows("g0-", 20))).await.unwrap();
    index.flush().await.unwrap();
    index.append(&batch(&s, &rows("g1-", 5))).await.unwrap();
    index.flush().await.unwrap();
    assert_eq!(index.stats().generations.len(), 2);

    let held = Arc::new(Semaphore::new(0));
    store.on("put", "generations/", Action::HoldOnce(held.clone()));
    let compacting = {
        let index = index.clone();
        tokio::spawn(async move { index.compact().await })
    };
    // The merged generation's PUT is held.
    while store.puts("generations/") < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A flush meanwhile: the generations reach the cap.
    index.append(&batch(&s, &rows("g2-", 2))).await.unwrap();
    index.flush().await.unwrap();
    assert_eq!(index.stats().generations.len(), 3);
    // The compaction's manifest PUT fails without landing.
    store.on("put", "manifest/", Action::Fail);
    held.add_permits(1);
    let failed = compacting.await.unwrap();
    assert!(failed.is_err(), "the manifest PUT failed: {failed:?}");
    store.clear();

    index.append(&batch(&s, &rows("after-", 3))).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), index.flush())
        .await
        .expect("a flush completes once the store is healthy again")
        .unwrap();
    // The background compactor brings the count back under the cap.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while index.stats().generations.len() >= 3 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = index.stats();
    assert!(
        stats.generations.len() < 3,
        "the generations go back under the cap: {}",
        stats.generations.len()
    );
    assert!(stats.compactions >= 1, "a compaction was published");
    assert_eq!(live(&index).await.len(), 30);
    index.close().await.unwrap();
    let reopened = Index::open(loc, settings).await.unwrap();
    assert_eq!(live(&reopened).await.len(), 30);
}

#[tokio::test]
async fn a_compaction_manifest_installed_late_has_its_run_collected() {
    // compact()'s manifest lands but the writer sees an error; the next flush installs it.
    // The generations it replaced are then this writer's to delete after the grace period,
    // as after any compaction, not left to the next open.
    let settings = Settings {
        compaction_grace_ms: 0,
        ..manual_compaction()
    };
    let (store, loc, index) = flushed_generations(4, &settings).await;
    let s = schema();
    store.on("put", "manifest/", Action::SucceedThenFailOnce);
    assert!(index.compact().await.is_err(), "the PUT reported an error");
    store.clear();
    index.append(&batch(&s, &rows("after-", 5))).await.unwrap();
    index.flush().await.unwrap();
    assert_eq!(index.stats().generations.len(), 2);
    let objects = || generation_objects(&store);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while objects().await > 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        objects().await,
        2,
        "the four replaced objects are deleted: only the merged and the new generation remain"
    );
    assert_eq!(index.stats().bytes_reclaimable, 0);
    assert_eq!(live(&index).await.len(), 25);
    index.close().await.unwrap();
    let reopened = Index::open(loc, settings).await.unwrap();
    assert_eq!(live(&reopened).await.len(), 25);
}

#[tokio::test]
async fn a_compact_dropped_while_its_manifest_lands_does_not_wedge_the_writer() {
    // The caller gives up on compact() (a timeout) while its manifest PUT is in flight; the
    // PUT lands. The writer must account for that version: the next flush installs the
    // compaction and publishes after it, instead of failing on it forever.
    let settings = manual_compaction();
    let (store, loc, index) = flushed_generations(4, &settings).await;
    let held = Arc::new(Semaphore::new(0));
    store.on("put", "manifest/", Action::LandThenHoldOnce(held.clone()));
    let cancelled = tokio::time::timeout(Duration::from_secs(2), index.compact()).await;
    assert!(cancelled.is_err(), "compact() was given up: {cancelled:?}");
    held.add_permits(1);
    a_flush_installs_the_merge_then_publishes(index, loc, settings).await;
}

#[tokio::test]
async fn a_compaction_yields_the_version_a_flushs_earlier_attempt_holds() {
    // A flush's manifest PUT lands but reports an error; a compaction waiting for the publish
    // lock gets it before the flush's retry and finds the version taken by that manifest. It
    // must give up (and delete its merged object), and the flush's retry adopt its manifest:
    // nothing is stuck, lost or leaked.
    let settings = manual_compaction();
    let (store, loc, index) = flushed_generations(3, &settings).await;
    let index = Arc::new(index);
    let s = schema();
    index.append(&batch(&s, &rows("f-", 5))).await.unwrap();
    let held = Arc::new(Semaphore::new(0));
    store.on(
        "put",
        "manifest/",
        Action::LandThenHoldThenFailOnce(held.clone()),
    );
    let flushing = {
        let index = index.clone();
        tokio::spawn(async move { index.flush().await })
    };
    // The flush holds the publish lock while its PUT hangs; the compaction queues for it.
    while store.puts("manifest/") < 6 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let compacting = {
        let index = index.clone();
        tokio::spawn(async move { index.compact().await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    held.add_permits(1);
    let compacted = compacting.await.unwrap();
    assert!(
        matches!(compacted, Ok(None)),
        "the compaction gives the version up: {compacted:?}"
    );
    let first = flushing.await.unwrap();
    assert!(first.is_err(), "the PUT reported an error");
    tokio::time::timeout(Duration::from_secs(20), index.flush())
        .await
        .expect("the retried flush finishes")
        .unwrap();
    assert_eq!(index.stats().generations.len(), 4);
    assert_eq!(live(&index).await.len(), 20);
    assert_eq!(
        generation_objects(&store).await,
        4,
        "the merged object no manifest names is deleted"
    );
    index.close().await.unwrap();
    let reopened = Index::open(loc, settings).await.unwrap();
    assert_eq!(live(&reopened).await.len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_of_postings_fails_the_search_and_a_retry_succeeds() {
    let (store, loc) = faulty();
    let s = schema();
    let index = Index::create(loc.clone(), s.clone(), settings())
        .await
        .unwrap();
    let all = rows("k", 40);
    for part in all.chunks(10) {
        index.append(&batch(&s, part)).await.unwrap();
        index.flush().await.unwrap();
    }
    index.close().await.unwrap();
    // Generations this small are read whole (and hold their postings) unless they keep no
    // vectors in memory.
    let hot_parts_only = Settings {
        vector_exact_below: 0,
        ..Settings::default()
    };
    let ro = Index::open_read_only(loc, hot_parts_only).await.unwrap();
    assert!(ro.stats().generations.len() >= 2);
    // Postings are read by range when a query needs them: fetched before the search for the
    // query's terms, or while it runs for the terms a range expands to.
    store.on("get", "generations/", Action::Fail);
    for q in ["version", "body:[k000 TO k010]"] {
        let e = ro
            .search_fts(q, &SearchOptions::with_k(5))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{q}: {e}");
        assert!(e.message().contains(".gen"), "{q}: names the object: {e}");
    }
    store.clear();
    for q in ["version", "body:[k000 TO k010]"] {
        let hits = ro.search_fts(q, &SearchOptions::with_k(5)).await.unwrap();
        assert_eq!(hits.iter().map(|b| b.num_rows()).sum::<usize>(), 5, "{q}");
    }
}

#[tokio::test]
async fn a_close_that_cuts_a_compactions_clean_up_still_prunes_old_manifests() {
    // The background compactor publishes its manifest, then prunes older versions. A close()
    // that stops it in between (here: the prune's deletes held) must not leave the version
    // before it behind: a retention of 0 keeps the newest version only.
    let (store, loc, settings, index) = keeping_one_version().await;
    for g in 0..3 {
        flush_generation(&index, g).await;
    }
    // flush() returns before the flusher cleans up: its prune is done before deletes are held.
    eventually("the third flush prunes the versions before it", || async {
        manifest_versions(&store).await.len() == 1
    })
    .await;
    let gate = Arc::new(Semaphore::new(0));
    store.on("delete", "manifest/", Action::Hold(gate.clone()));
    // The fourth flush: the compactor merges the four generations.
    flush_generation(&index, 3).await;
    eventually("the compactor merges the four generations", || async {
        index.stats().generations.len() == 1
    })
    .await;
    // close() stops the compactor at once, then waits for the flusher, whose prune is held
    // too: let the deletes through once close() has begun.
    let release = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        gate.add_permits(1_000);
    };
    let (closed, ()) = tokio::join!(index.close(), release);
    closed.unwrap();
    store.clear();
    let versions = manifest_versions(&store).await;
    assert_eq!(versions.len(), 1, "{versions:?}");
    let reopened = Index::open(loc, settings).await.unwrap();
    assert_eq!(live(&reopened).await.len(), 20);
}

#[tokio::test]
async fn a_close_that_cuts_a_compaction_after_its_manifest_landed_settles_it() {
    // The compactor's manifest PUT lands, but its answer is held: the compactor has neither
    // installed that version nor cleaned up after it when close() stops it. close() settles
    // the version (as the next publish would) and cleans up after it: a retention of 0
    // keeps one version, the compaction's, and nothing is lost.
    let (store, loc, settings, index) = keeping_one_version().await;
    // Version 1 is the index's creation, 2 its writer's, 3 to 6 the four flushes, 7 the
    // compaction's.
    let compaction = "idx/manifest/00000000000000000007.manifest";
    let gate = Arc::new(Semaphore::new(0));
    store.on("put", compaction, Action::LandThenHoldOnce(gate.clone()));
    for g in 0..4 {
        flush_generation(&index, g).await;
    }
    eventually("the compactor's manifest lands", || async {
        manifest_versions(&store).await.last().map(String::as_str) == Some(compaction)
    })
    .await;
    assert_eq!(index.stats().generations.len(), 4, "not installed yet");
    index.close().await.unwrap();
    store.clear();
    gate.add_permits(1);
    assert_eq!(
        manifest_versions(&store).await,
        vec![compaction.to_string()]
    );
    let reopened = Index::open(loc, settings).await.unwrap();
    assert_eq!(reopened.stats().generations.len(), 1);
    assert_eq!(live(&reopened).await.len(), 20);
}

/// An index on a faulty store that keeps one manifest version (a retention of 0), compacts in
/// the background and freezes only on `flush()`.
async fn keeping_one_version() -> (Arc<FaultyStore>, Location, Settings, Index) {
    let (store, loc) = faulty();
    let settings = Settings {
        memtable_max_rows: 1_000_000,
        manifest_retention: 0,
        ..Settings::default()
    };
    let index = Index::create(loc.clone(), schema(), settings.clone())
        .await
        .unwrap();
    (store, loc, settings, index)
}

/// Five rows `g{g}-...`, flushed as a generation of their own.
async fn flush_generation(index: &Index, g: usize) {
    index
        .append(&batch(&schema(), &rows(&format!("g{g}-"), 5)))
        .await
        .unwrap();
    index.flush().await.unwrap();
}

/// Wait until `done` says so, for at most 30 seconds (then fail, saying `what` did not happen).
async fn eventually<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let wait = async {
        while !done().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .is_err()
    {
        panic!("{what}: not within 30 s");
    }
}

/// The manifest versions in the store, oldest first.
async fn manifest_versions(store: &FaultyStore) -> Vec<String> {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let mut versions: Vec<String> = store
        .list(Some(&object_store::path::Path::from("idx/manifest")))
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.location.to_string())
        .filter(|p| p.ends_with(".manifest"))
        .collect();
    versions.sort();
    versions
}
