//! Leaks are collected: a writer's open deletes what crashes, failed deletes and failed or
//! fenced flushes left behind (WAL objects below the replay point, generation objects no kept
//! manifest names, stale probes, local staging files), and nothing live.

mod common;

use common::*;
use lsmsearch::{Index, Location};

use std::path::Path;
use std::time::{Duration, SystemTime};

fn plant(path: &Path, bytes: &[u8], age: Duration) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
}

fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for sub in ["wal", "generations", "manifest", "probe"] {
        if let Ok(rd) = std::fs::read_dir(dir.join(sub)) {
            for e in rd {
                out.push(format!(
                    "{sub}/{}",
                    e.unwrap().file_name().to_string_lossy()
                ));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn a_writer_open_collects_leaked_objects_and_keeps_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let loc = Location::parse(&root.display().to_string()).unwrap();
    let s = schema();
    let index = Index::create(loc.clone(), s.clone(), small_settings())
        .await
        .unwrap();
    let first: Vec<Row> = (0..5).map(|i| Row::new(format!("a{i}"), 1)).collect();
    index.append(&batch(&s, &first)).await.unwrap();
    index.flush().await.unwrap();
    let second: Vec<Row> = (0..3).map(|i| Row::new(format!("b{i}"), 1)).collect();
    index.append(&batch(&s, &second)).await.unwrap();
    index.close().await.unwrap();
    let before = files(root);
    let expected = to_model(&[batch(&s, &first), batch(&s, &second)]);

    let old = Duration::from_secs(3 * 3600);
    // A rows object (the largest; fences are 52 bytes).
    let wal_sample = before
        .iter()
        .filter(|f| f.starts_with("wal/"))
        .map(|f| std::fs::read(root.join(f)).unwrap())
        .max_by_key(Vec::len)
        .unwrap();
    let garbage = [
        // A WAL object whose delete was cut off, far below the replay point.
        "wal/00000000000000000000.wal",
        // The generation of a flush that never published (an older epoch).
        "generations/00000000000000000007-0000000001.gen",
        // A probe whose writer crashed while opening.
        "probe/crashed",
        // Local staging files of PUTs cut off by a crash.
        "generations/00000000000000000008-0000000001.gen#1234",
        "wal/00000000000000000099.wal#77",
    ];
    for g in garbage {
        plant(&root.join(g), &wal_sample, old);
    }
    // A probe of a writer opening right now is not garbage.
    plant(&root.join("probe/opening"), b"probe", Duration::ZERO);

    let writer = Index::open(loc.clone(), small_settings()).await.unwrap();
    let mut left = garbage.to_vec();
    for _ in 0..200 {
        left.retain(|g| root.join(g).exists());
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(left.is_empty(), "not collected: {left:?}");
    assert!(
        root.join("probe/opening").exists(),
        "a young probe was deleted"
    );
    assert_eq!(live(&writer).await, expected);
    writer.close().await.unwrap();
    let reopened = Index::open(loc, small_settings()).await.unwrap();
    assert_eq!(live(&reopened).await, expected);
}

#[tokio::test]
async fn probes_are_aged_by_the_stores_clock_not_this_machines() {
    // The store's clock runs an hour behind this machine's (or this one runs ahead): every
    // object looks an hour older than it is. A probe written just now by an open in progress
    // must survive the collection; one written an hour earlier by a crashed open must not.
    use common::faulty::FaultyStore;
    use object_store::{ObjectStoreExt, PutPayload};
    let store = FaultyStore::new(std::sync::Arc::new(object_store::memory::InMemory::new()));
    store.skew("", 3600);
    store.skew("probe/crashed", 3600);
    let loc = Location::from_store(store.clone(), "idx");
    let s = schema();
    let index = Index::create(loc.clone(), s.clone(), small_settings())
        .await
        .unwrap();
    index.close().await.unwrap();
    for name in ["idx/probe/opening", "idx/probe/crashed"] {
        store
            .put(&name.into(), PutPayload::from_static(b"probe"))
            .await
            .unwrap();
    }
    let exists = |name: &'static str| {
        let store = store.clone();
        async move { store.head(&name.into()).await.is_ok() }
    };
    let writer = Index::open(loc, small_settings()).await.unwrap();
    for _ in 0..200 {
        if !exists("idx/probe/crashed").await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !exists("idx/probe/crashed").await,
        "an hour-old probe is collected"
    );
    assert!(
        exists("idx/probe/opening").await,
        "a probe written just now (by the store's clock) was deleted"
    );
    writer.close().await.unwrap();
}

#[tokio::test]
async fn probes_are_collected_when_the_opens_manifest_is_pruned_first() {
    // Retention 0: the writer's first flush prunes the manifest version its open created,
    // before the collection (held here) reads that version's time as the store's clock.
    // Stale probes must be collected all the same.
    use common::faulty::{Action, FaultyStore};
    use object_store::{ObjectStoreExt, PutPayload};
    let store = FaultyStore::new(std::sync::Arc::new(object_store::memory::InMemory::new()));
    store.skew("probe/crashed", 3600);
    let loc = Location::from_store(store.clone(), "idx");
    let s = schema();
    let settings = lsmsearch::Settings {
        manifest_retention: 0,
        ..small_settings()
    };
    let index = Index::create(loc.clone(), s.clone(), settings.clone())
        .await
        .unwrap();
    index.close().await.unwrap();
    store
        .put(
            &"idx/probe/crashed".into(),
            PutPayload::from_static(b"probe"),
        )
        .await
        .unwrap();
    // Create wrote version 1 and its open claimed 2; this open claims 3.
    let held = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    store.on(
        "get",
        "manifest/00000000000000000003",
        Action::HoldOnce(held.clone()),
    );
    let writer = Index::open(loc, settings).await.unwrap();
    writer
        .append(&batch(&s, &[Row::new("a", 1)]))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    held.add_permits(1);
    let exists = || async { store.head(&"idx/probe/crashed".into()).await.is_ok() };
    for _ in 0..200 {
        if !exists().await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!exists().await, "an hour-old probe is collected");
    writer.close().await.unwrap();
}
