//! Scenarios run against several stores (memory, local disk, S3).

use super::*;
use lsmsearch::{Durability, ErrorKind, Index, Key, Location, Settings, WriteOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Apply a random workload to `index` and to the model.
pub async fn workload(index: &Index, model: &mut Model, seed: u64, steps: usize) {
    let s = schema();
    let mut rng = StdRng::seed_from_u64(seed);
    for step in 0..steps {
        match rng.random_range(0..10) {
            0..=6 => {
                let n = rng.random_range(1..40);
                let rows: Vec<Row> = (0..n)
                    .map(|_| Row::new(format!("k{:03}", rng.random_range(0..300)), step as i64))
                    .collect();
                let durability = if rng.random_bool(0.3) {
                    Durability::Buffered
                } else {
                    Durability::Durable
                };
                index
                    .append_with(&batch(&s, &rows), WriteOptions::with_durability(durability))
                    .await
                    .unwrap();
                for r in rows {
                    model.insert(r.id.clone(), r); // last row of the batch wins
                }
            }
            7..=8 => {
                let keys: Vec<String> = (0..rng.random_range(1..10))
                    .map(|_| format!("k{:03}", rng.random_range(0..300)))
                    .collect();
                let k: Vec<Key> = keys.iter().map(|k| Key::from(k.as_str())).collect();
                index.delete(&k).await.unwrap();
                for k in keys {
                    model.remove(&k);
                }
            }
            _ => index.flush().await.unwrap(),
        }
        if step % 25 == 0 {
            assert_eq!(&live(index).await, model, "live rows differ at step {step}");
        }
    }
}

/// Write, close, reopen as writer and as read-only handle: the live rows equal the model.
pub async fn round_trip_scenario(loc: Location) {
    let mut model = Model::new();
    let index = Index::create(loc.clone(), schema(), small_settings())
        .await
        .unwrap();
    workload(&index, &mut model, 11, 120).await;
    index.close().await.unwrap();
    let index = Index::open(loc.clone(), small_settings()).await.unwrap();
    assert_eq!(live(&index).await, model, "after reopen");
    workload(&index, &mut model, 12, 60).await;
    index.close().await.unwrap();
    let ro = Index::open_read_only(loc, Settings::default())
        .await
        .unwrap();
    assert_eq!(to_model(&ro.scan(Default::default()).await.unwrap()), model);
}

pub async fn fencing_scenario(loc: Location) {
    let s = schema();
    let a = Index::create(loc.clone(), s.clone(), small_settings())
        .await
        .unwrap();
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
    let e = a
        .append(&batch(&s, &[Row::new("zombie", 1)]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    assert!(a.is_fenced());
    let e = a
        .append(&batch(&s, &[Row::new("zombie2", 1)]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced);
    let e = a.delete(&["a1".into()]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced);
    let e = a.flush().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced);

    b.append(&batch(&s, &[Row::new("b1", 2)])).await.unwrap();
    b.flush().await.unwrap();
    b.append(&batch(&s, &[Row::new("b2", 2)])).await.unwrap();
    b.close().await.unwrap();

    let c = Index::open_read_only(loc.clone(), Settings::default())
        .await
        .unwrap();
    let keys: Vec<String> = to_model(&c.scan(Default::default()).await.unwrap())
        .into_keys()
        .collect();
    assert_eq!(keys, vec!["a1", "a2", "a3", "b1", "b2"]);
}
