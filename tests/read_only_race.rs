//! A read-only handle that read manifest version v, then listed the WAL after the writer
//! published v+1 and deleted the WAL objects v's replay point covered, must not show v's
//! generations without those WAL rows (deleted keys back, updates reverted): it either sees
//! the WAL objects it needs or starts over on the newer manifest. Refreshes never move a view
//! backwards.

mod common;

use common::faulty::{Action, FaultyStore};
use common::*;
use lsmsearch::{Index, Key, Location, ScanOptions, Settings};
use object_store::memory::InMemory;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

fn settings() -> Settings {
    Settings {
        memtable_max_rows: 1_000_000,
        ..Settings::default()
    }
}

/// A new index in memory (at root `idx`) and its writer.
async fn writer() -> (Arc<dyn object_store::ObjectStore>, Index) {
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(InMemory::new());
    let loc = Location::from_store(store.clone(), "idx");
    let writer = Index::create(loc, schema(), settings()).await.unwrap();
    (store, writer)
}

#[tokio::test]
async fn a_read_only_open_racing_a_flush_sees_the_newest_rows() {
    for extra in [0usize, 2] {
        let (store, writer) = writer().await;
        let s = schema();
        let mut model = Model::new();
        let first = [Row::new("k", 1), Row::new("d", 1), Row::new("x", 1)];
        writer.append(&batch(&s, &first)).await.unwrap();
        writer.flush().await.unwrap();
        model.extend(first.iter().map(|r| (r.id.clone(), r.clone())));
        // WAL rows after the flush: an update of k, a delete of d (and more objects).
        writer
            .append(&batch(&s, &[Row::new("k", 2)]))
            .await
            .unwrap();
        model.insert("k".into(), Row::new("k", 2));
        writer.delete(&[Key::from("d")]).await.unwrap();
        model.remove("d");
        for i in 0..extra {
            let r = Row::new(format!("w{i}"), 1);
            writer
                .append(&batch(&s, std::slice::from_ref(&r)))
                .await
                .unwrap();
            model.insert(r.id.clone(), r);
        }

        // The reader decides on the current manifest, then stalls before reading it...
        let faulty = FaultyStore::new(store.clone());
        let gate = Arc::new(Semaphore::new(0));
        faulty.on("get", "manifest/", Action::Hold(gate.clone()));
        let reader_loc = Location::from_store(faulty.clone(), "idx");
        let reader =
            tokio::spawn(async move { Index::open_read_only(reader_loc, settings()).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        // ...while the writer flushes: a new manifest, and the WAL objects it covers deleted.
        writer.flush().await.unwrap();
        gate.add_permits(1000);
        let reader = reader.await.unwrap().unwrap();
        let seen = to_model(&reader.scan(ScanOptions::default()).await.unwrap());
        assert_eq!(
            seen, model,
            "{extra} extra WAL objects: the newest rows, nothing stale"
        );
        faulty.clear();
        reader.refresh().await.unwrap();
        let seen = to_model(&reader.scan(ScanOptions::default()).await.unwrap());
        assert_eq!(seen, model, "after a refresh");
    }
}

#[tokio::test]
async fn a_slow_refresh_never_moves_the_view_backwards() {
    let (store, writer) = writer().await;
    let s = schema();
    writer
        .append(&batch(&s, &[Row::new("w0", 1)]))
        .await
        .unwrap();
    writer
        .append(&batch(&s, &[Row::new("w1", 1)]))
        .await
        .unwrap();
    let faulty = FaultyStore::new(store.clone());
    let reader = Arc::new(
        Index::open_read_only(Location::from_store(faulty.clone(), "idx"), settings())
            .await
            .unwrap(),
    );
    // Refresh A lists the WAL, then stalls fetching its last object...
    let last_wal = {
        use futures::TryStreamExt;
        let mut ids: Vec<String> = store
            .list(Some(&object_store::path::Path::from("idx/wal")))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        ids.sort();
        ids.pop().unwrap()
    };
    let gate = Arc::new(Semaphore::new(0));
    faulty.on("get", &last_wal, Action::HoldOnce(gate.clone()));
    let slow = {
        let reader = reader.clone();
        tokio::spawn(async move { reader.refresh().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // ...while a row is appended and refresh B sees it.
    writer
        .append(&batch(&s, &[Row::new("w2", 1)]))
        .await
        .unwrap();
    reader.refresh().await.unwrap();
    let keys = |m: Model| m.into_keys().collect::<Vec<_>>();
    let seen = to_model(&reader.scan(ScanOptions::default()).await.unwrap());
    assert_eq!(keys(seen), ["w0", "w1", "w2"]);
    gate.add_permits(1);
    slow.await.unwrap().unwrap();
    let seen = to_model(&reader.scan(ScanOptions::default()).await.unwrap());
    assert_eq!(
        keys(seen),
        ["w0", "w1", "w2"],
        "the slower, older refresh did not replace the newer view"
    );
}
