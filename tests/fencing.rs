//! Two writers on one location: the first is fenced, acknowledges nothing more, and nothing it
//! appends after fencing is ever visible; no acknowledged row of the second is lost.

mod common;

use common::*;
use lsmsearch::{Durability, ErrorKind, Index, Location, Settings, WriteOptions};

pub async fn fencing_scenario(loc: Location) {
    let s = schema();
    let a = Index::create(loc.clone(), s.clone(), small_settings()).await.unwrap();
    a.append(&batch(&s, &[Row::new("a1", 1)])).await.unwrap();
    a.append_with(
        &batch(&s, &[Row::new("a2", 1)]),
        WriteOptions::with_durability(Durability::Buffered),
    )
    .await
    .unwrap();
    a.flush().await.unwrap();
    a.append(&batch(&s, &[Row::new("a3", 1)])).await.unwrap();

    let b = Index::open(loc.clone(), small_settings()).await.unwrap();
    assert!(b.epoch() > a.epoch());
    assert_eq!(
        live(&b).await.keys().cloned().collect::<Vec<_>>(),
        vec!["a1", "a2", "a3"],
        "the new writer sees every row the old one acknowledged"
    );

    // The old writer's next append fails as fenced and is never visible.
    let e = a.append(&batch(&s, &[Row::new("zombie", 1)])).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    assert!(a.is_fenced());
    let e = a.append(&batch(&s, &[Row::new("zombie2", 1)])).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced);
    let e = a.delete(&["a1".into()]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced);
    let e = a.flush().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced);

    b.append(&batch(&s, &[Row::new("b1", 2)])).await.unwrap();
    b.flush().await.unwrap();
    b.append(&batch(&s, &[Row::new("b2", 2)])).await.unwrap();
    b.close().await.unwrap();

    let c = Index::open_read_only(loc.clone(), Settings::default()).await.unwrap();
    let keys: Vec<String> = to_model(&c.scan(Default::default()).await.unwrap())
        .into_keys()
        .collect();
    assert_eq!(keys, vec!["a1", "a2", "a3", "b1", "b2"]);
}

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
    let a = Index::create(loc.clone(), s.clone(), small_settings()).await.unwrap();
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
        let r = w.append(&batch(&s, &[Row::new(format!("e{}", w.epoch()), 1)])).await;
        if std::ptr::eq(w, newest) {
            r.unwrap();
        } else {
            assert_eq!(r.unwrap_err().kind(), ErrorKind::Fenced);
        }
    }
    assert_eq!(live(newest).await.len(), 1);
}
