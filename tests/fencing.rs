//! Two writers on one location: the first is fenced, acknowledges nothing more, and nothing it
//! appends after fencing is ever visible; no acknowledged row of the second is lost.

mod common;

use common::scenarios::fencing_scenario;
use common::*;
use lsmsearch::{ErrorKind, Index, Location};

#[tokio::test]
async fn second_writer_fences_the_first_memory() {
    fencing_scenario(memory()).await;
}

#[tokio::test]
async fn second_writer_fences_the_first_local() {
    let dir = tempfile::tempdir().unwrap();
    fencing_scenario(Location::parse(&dir.path().display().to_string()).unwrap()).await;
}

#[tokio::test]
async fn a_fenced_writer_cannot_publish_its_flush() {
    let loc = memory();
    let s = schema();
    let a = Index::create(loc.clone(), s.clone(), small_settings())
        .await
        .unwrap();
    a.append(&batch(&s, &[Row::new("a1", 1)])).await.unwrap();
    let b = Index::open(loc.clone(), small_settings()).await.unwrap();
    // a's flush reaches the manifest after b claimed its epoch: it must fail as fenced.
    let e = a.flush().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    assert_eq!(b.stats().generations.len(), 0);
    b.flush().await.unwrap();
    assert_eq!(live(&b).await.len(), 1);
}

#[tokio::test]
async fn racing_writers_get_distinct_epochs_and_only_the_newest_writes() {
    let loc = memory();
    Index::create(loc.clone(), schema(), small_settings())
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let loc = loc.clone();
            tokio::spawn(async move { Index::open(loc, small_settings()).await.unwrap() })
        })
        .collect();
    let mut writers = Vec::new();
    for h in handles {
        writers.push(h.await.unwrap());
    }
    let mut epochs: Vec<u64> = writers.iter().map(|w| w.epoch()).collect();
    epochs.sort_unstable();
    epochs.dedup();
    assert_eq!(epochs.len(), 8, "every writer claimed its own epoch");
    let s = schema();
    let newest = writers.iter().max_by_key(|w| w.epoch()).unwrap();
    for w in &writers {
        let r = w
            .append(&batch(&s, &[Row::new(format!("e{}", w.epoch()), 1)]))
            .await;
        if std::ptr::eq(w, newest) {
            r.unwrap();
        } else {
            assert_eq!(r.unwrap_err().kind(), ErrorKind::Fenced);
        }
    }
    assert_eq!(live(newest).await.len(), 1);
}

/// The rolling-restart scenario: writer B takes over while A still runs, and B flushes (which
/// deletes the WAL objects its generation covers). A's next append must fail as fenced, not
/// land on a WAL id below B's replay point (acknowledged, then never replayed), and A must
/// never fence B. Run on memory and on local disk.
async fn zombie_after_the_new_writers_flush(loc: Location) {
    let s = schema();
    let a = Index::create(loc.clone(), s.clone(), small_settings())
        .await
        .unwrap();
    a.append(&batch(&s, &[Row::new("a0", 1)])).await.unwrap();
    let b = Index::open(loc.clone(), small_settings()).await.unwrap();
    b.append(&batch(&s, &[Row::new("b1", 1)])).await.unwrap();
    b.flush().await.unwrap();
    let mut acked = vec!["a0", "b1"];
    for (key, r) in [
        ("a1", a.append(&batch(&s, &[Row::new("a1", 1)])).await),
        ("a2", a.append(&batch(&s, &[Row::new("a2", 1)])).await),
    ] {
        match r {
            Ok(_) => acked.push(key),
            Err(e) => assert_eq!(e.kind(), ErrorKind::Fenced, "{key}: {e}"),
        }
    }
    assert_eq!(
        acked,
        ["a0", "b1"],
        "the fenced writer acknowledged nothing"
    );
    b.append(&batch(&s, &[Row::new("b2", 1)]))
        .await
        .expect("the newer writer is never fenced by the older one");
    acked.push("b2");
    b.close().await.unwrap();
    let reopened = Index::open(loc, small_settings()).await.unwrap();
    let keys: Vec<String> = live(&reopened).await.into_keys().collect();
    let mut want: Vec<String> = acked.iter().map(|k| k.to_string()).collect();
    want.sort();
    assert_eq!(keys, want, "every acknowledged row, nothing else");
}

#[tokio::test]
async fn a_zombie_writer_is_fenced_after_the_new_writer_flushes_memory() {
    zombie_after_the_new_writers_flush(memory()).await;
}

#[tokio::test]
async fn a_zombie_writer_is_fenced_after_the_new_writer_flushes_local() {
    let dir = tempfile::tempdir().unwrap();
    zombie_after_the_new_writers_flush(Location::parse(&dir.path().display().to_string()).unwrap())
        .await;
}

#[tokio::test]
async fn a_failed_open_does_not_fence_the_running_writer() {
    // A writer runs; a second open finds a corrupt generation and fails. It must fail before
    // claiming the epoch, so the running writer keeps writing.
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::parse(&dir.path().display().to_string()).unwrap();
    let s = schema();
    let a = Index::create(loc.clone(), s.clone(), small_settings())
        .await
        .unwrap();
    a.append(&batch(&s, &[Row::new("a0", 1)])).await.unwrap();
    a.flush().await.unwrap();
    let gens = dir.path().join("generations");
    let gen = std::fs::read_dir(&gens)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&gen).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&gen, bytes).unwrap();
    let e = Index::open(loc.clone(), small_settings())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Data, "{e}");
    a.append(&batch(&s, &[Row::new("a1", 1)]))
        .await
        .expect("the running writer was not fenced by the failed open");
    a.flush()
        .await
        .expect("the running writer still publishes manifests");
    assert!(!a.is_fenced());
}

#[tokio::test]
async fn an_open_failing_on_a_bad_wal_object_does_not_fence_the_running_writer() {
    // The running writer holds rows whose WAL object is damaged (here: the first of two); a
    // second open must fail on it before claiming the epoch, so that the writer, which still
    // has those rows in memory, keeps writing and its flush makes them safe again.
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::parse(&dir.path().display().to_string()).unwrap();
    let s = schema();
    let a = Index::create(loc.clone(), s.clone(), small_settings())
        .await
        .unwrap();
    a.append(&batch(&s, &[Row::new("a0", 1)])).await.unwrap();
    a.append(&batch(&s, &[Row::new("a1", 1)])).await.unwrap();
    let mut wal: Vec<_> = std::fs::read_dir(dir.path().join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    wal.sort();
    let first_rows = &wal[wal.len() - 2];
    let mut bytes = std::fs::read(first_rows).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(first_rows, bytes).unwrap();
    let e = Index::open(loc.clone(), small_settings())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Data, "{e}");
    a.append(&batch(&s, &[Row::new("a2", 1)]))
        .await
        .expect("the running writer was not fenced by the failed open");
    a.flush()
        .await
        .expect("the running writer still publishes manifests");
    a.close().await.unwrap();
    let reopened = Index::open(loc, small_settings()).await.unwrap();
    let keys: Vec<String> = live(&reopened).await.into_keys().collect();
    assert_eq!(keys, ["a0", "a1", "a2"]);
}

#[tokio::test]
async fn opens_do_not_pile_up_manifest_versions() {
    let store: std::sync::Arc<dyn object_store::ObjectStore> =
        std::sync::Arc::new(object_store::memory::InMemory::new());
    let loc = Location::from_store(store.clone(), "idx");
    let settings = lsmsearch::Settings {
        manifest_retention: 3,
        ..small_settings()
    };
    Index::create(loc.clone(), schema(), settings.clone())
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    for _ in 0..20 {
        Index::open(loc.clone(), settings.clone())
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
    }
    use futures::TryStreamExt;
    let manifests: Vec<_> = store
        .list(Some(&object_store::path::Path::from("idx/manifest")))
        .try_collect()
        .await
        .unwrap();
    assert!(
        manifests.len() <= 4,
        "{} manifest versions",
        manifests.len()
    );
}

#[tokio::test]
async fn a_store_that_ignores_conditional_creates_is_refused() {
    // Fencing rests on conditional creates. A store that overwrites instead would let two
    // writers overwrite each other's acknowledged WAL objects: refuse it when a writer opens.
    use common::faulty::{Action, FaultyStore};
    let inner = std::sync::Arc::new(object_store::memory::InMemory::new());
    let ok = Location::from_store(inner.clone(), "idx");
    Index::create(ok, schema(), small_settings())
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let faulty = FaultyStore::new(inner.clone());
    faulty.on("put", "", Action::IgnoreCreate);
    let bad = Location::from_store(faulty.clone(), "idx");
    let e = Index::open(bad.clone(), small_settings())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("conditional"), "{e}");
    let e = Index::create(
        Location::from_store(faulty, "other"),
        schema(),
        small_settings(),
    )
    .await
    .unwrap_err();
    assert!(e.message().contains("conditional"), "{e}");
}

/// Writer A, created through a fault-injecting wrapper of a memory store; the store itself;
/// and a location for other writers that reach the store directly.
async fn writer_behind_faults() -> (
    std::sync::Arc<object_store::memory::InMemory>,
    std::sync::Arc<common::faulty::FaultyStore>,
    Index,
    Location,
) {
    let inner = std::sync::Arc::new(object_store::memory::InMemory::new());
    let faulty = common::faulty::FaultyStore::new(inner.clone());
    let a_loc = Location::from_store(faulty.clone(), "idx");
    let b_loc = Location::from_store(inner.clone(), "idx");
    let a = Index::create(a_loc, schema(), small_settings())
        .await
        .unwrap();
    (inner, faulty, a, b_loc)
}

#[tokio::test]
async fn a_zombie_whose_last_wal_put_was_ambiguous_is_fenced() {
    // A's WAL PUT at id N lands but reports an error. B opens: it replays N and fences at N+1.
    // B's flush deletes N. A's retry at N finds the id free: it must not acknowledge rows
    // written below B's replay point, where nobody will ever read them.
    use common::faulty::Action;
    let (_, faulty, a, b_loc) = writer_behind_faults().await;
    let s = schema();
    faulty.on("put", "wal/", Action::SucceedThenFailOnce);
    a.append(&batch(&s, &[Row::new("a0", 1)]))
        .await
        .expect_err("the ambiguous PUT is reported");
    let b = Index::open(b_loc.clone(), small_settings()).await.unwrap();
    b.append(&batch(&s, &[Row::new("b1", 1)])).await.unwrap();
    b.flush().await.unwrap();
    let r = a.append(&batch(&s, &[Row::new("a1", 1)])).await;
    let e = r.expect_err("a fenced writer acknowledges nothing");
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    b.close().await.unwrap();
    let keys: Vec<String> = live(&Index::open(b_loc, small_settings()).await.unwrap())
        .await
        .into_keys()
        .collect();
    assert_eq!(
        keys,
        ["a0", "b1"],
        "a0 landed and was replayed by B; a1 was refused"
    );
}

#[tokio::test]
async fn a_zombie_stays_suspicious_until_its_superseded_check_succeeds() {
    // As above, but the zombie's check of the id after its re-landed PUT fails (a GET error):
    // that PUT wrote rows below B's replay point. Once they are collected too, the zombie's
    // next PUT at that id lands again: it must still check, and find itself fenced.
    use common::faulty::Action;
    use object_store::ObjectStoreExt;
    let (inner, faulty, a, b_loc) = writer_behind_faults().await;
    let s = schema();
    a.append(&batch(&s, &[Row::new("a0", 1)])).await.unwrap();
    // WAL: 1 fence (A), 2 a0; the PUT of 3 lands and reports an error.
    faulty.on("put", "wal/", Action::SucceedThenFailOnce);
    a.append(&batch(&s, &[Row::new("a1", 1)]))
        .await
        .expect_err("the ambiguous PUT is reported");
    // B replays 2 and 3, fences at 4, writes 5, and its flush deletes 2 and 3.
    let b = Index::open(b_loc.clone(), small_settings()).await.unwrap();
    b.append(&batch(&s, &[Row::new("b1", 1)])).await.unwrap();
    b.flush().await.unwrap();
    // A's retry re-lands at 3; its look at 4 fails.
    faulty.on("get", "wal/00000000000000000004.wal", Action::Fail);
    a.append(&batch(&s, &[Row::new("a2", 1)]))
        .await
        .expect_err("the superseded check failed: nothing is acknowledged");
    faulty.clear();
    b.close().await.unwrap();
    // C's open collects 3 (a rows object below its replay point).
    let c = Index::open(b_loc.clone(), small_settings()).await.unwrap();
    for _ in 0..200 {
        let gone = inner
            .get(&object_store::path::Path::from(
                "idx/wal/00000000000000000003.wal",
            ))
            .await
            .is_err();
        if gone {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let r = a.append(&batch(&s, &[Row::new("a3", 1)])).await;
    let e = r.expect_err("a fenced writer acknowledges nothing");
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_zombie_cannot_recreate_a_pruned_manifest_version() {
    // B opens and flushes with retention 0, pruning the version A's flush would create next.
    // A's flush must fail as fenced instead of re-creating that version (and moving LATEST
    // backwards).
    let store: std::sync::Arc<dyn object_store::ObjectStore> =
        std::sync::Arc::new(object_store::memory::InMemory::new());
    let loc = Location::from_store(store.clone(), "idx");
    let s = schema();
    let settings = lsmsearch::Settings {
        manifest_retention: 0,
        ..small_settings()
    };
    let a = Index::create(loc.clone(), s.clone(), settings.clone())
        .await
        .unwrap();
    a.append(&batch(&s, &[Row::new("a0", 1)])).await.unwrap();
    let b = Index::open(loc.clone(), settings.clone()).await.unwrap();
    b.append(&batch(&s, &[Row::new("b1", 1)])).await.unwrap();
    b.flush().await.unwrap();
    let latest = || async {
        use object_store::ObjectStoreExt;
        let bytes = store
            .get(&object_store::path::Path::from("idx/LATEST"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        bytes.to_vec()
    };
    let before = latest().await;
    let e = a.flush().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    assert_eq!(latest().await, before, "LATEST never moves backwards");
    b.close().await.unwrap();
    let keys: Vec<String> = live(&Index::open(loc, settings).await.unwrap())
        .await
        .into_keys()
        .collect();
    assert_eq!(keys, ["a0", "b1"]);
}

#[tokio::test]
async fn a_fenced_writer_stops_retrying_its_buffered_writes() {
    // A's buffered rows cannot reach the WAL once B fenced it. A learns it is fenced at its
    // next WAL write and must then stop (its later calls fail as fenced), not retry forever.
    use common::faulty::FaultyStore;
    use lsmsearch::{Durability, WriteOptions};
    let inner = std::sync::Arc::new(object_store::memory::InMemory::new());
    let faulty = FaultyStore::new(inner.clone());
    let s = schema();
    let a = Index::create(
        Location::from_store(faulty.clone(), "idx"),
        s.clone(),
        small_settings(),
    )
    .await
    .unwrap();
    let _b = Index::open(Location::from_store(inner.clone(), "idx"), small_settings())
        .await
        .unwrap();
    a.append_with(
        &batch(&s, &[Row::new("a1", 1)]),
        WriteOptions::with_durability(Durability::Buffered),
    )
    .await
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let attempts = faulty.puts("wal/");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        faulty.puts("wal/"),
        attempts,
        "no more WAL writes once fenced ({attempts} before)"
    );
    assert!(a.is_fenced());
    let e = a
        .append_with(
            &batch(&s, &[Row::new("a2", 1)]),
            WriteOptions::with_durability(Durability::Buffered),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
}

#[tokio::test]
async fn a_fenced_writers_retried_flush_never_adopts_a_manifest_it_recreated() {
    // A holds a0 and a1 in its WAL. B and C open in turn (retention 0: each prunes the version
    // before its own), so the version A's flush creates next is free again. A's manifest PUT
    // re-creates it and reports an error; the retry must find a newer version and give up as
    // fenced, not adopt that manifest and delete the WAL objects C still replays from.
    use common::faulty::{Action, FaultyStore};
    let inner: std::sync::Arc<dyn object_store::ObjectStore> =
        std::sync::Arc::new(object_store::memory::InMemory::new());
    let faulty = FaultyStore::new(inner.clone());
    let s = schema();
    let settings = lsmsearch::Settings {
        manifest_retention: 0,
        memtable_max_rows: 1_000,
        ..small_settings()
    };
    let a = Index::create(
        Location::from_store(faulty.clone(), "idx"),
        s.clone(),
        settings.clone(),
    )
    .await
    .unwrap();
    a.append(&batch(&s, &[Row::new("a0", 1)])).await.unwrap();
    a.append(&batch(&s, &[Row::new("a1", 1)])).await.unwrap();
    let direct = Location::from_store(inner.clone(), "idx");
    let b = Index::open(direct.clone(), settings.clone()).await.unwrap();
    b.close().await.unwrap();
    let c = Index::open(direct.clone(), settings.clone()).await.unwrap();

    faulty.on("put", "manifest/", Action::SucceedThenFailOnce);
    let first = a.flush().await;
    assert!(first.is_err(), "the PUT reported an error: {first:?}");
    let retried = tokio::time::timeout(std::time::Duration::from_secs(20), a.flush())
        .await
        .expect("the retried flush ends");
    let e = retried.expect_err("a newer version exists: A is fenced");
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");

    // C's rows are whole: a new writer replays a0 and a1.
    drop(c);
    let d = Index::open(direct, settings).await.unwrap();
    let keys: Vec<String> = live(&d).await.into_keys().collect();
    assert_eq!(keys, ["a0", "a1"]);
}
