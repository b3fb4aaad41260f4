//! Many tasks append, delete and flush concurrently; ordering the acknowledged operations by the
//! sequence numbers they were given and replaying them on a model gives exactly the live rows,
//! before and after a reopen.

mod common;

use common::*;
use lsmsearch::{Durability, Index, Key, WriteOptions};
use proptest::prelude::*;
use std::sync::Arc;

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<(u8, i64)>, bool),
    Delete(Vec<u8>),
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop::collection::vec((0u8..60, 0i64..1000), 1..12), any::<bool>())
            .prop_map(|(rows, durable)| Op::Append(rows, durable)),
        2 => prop::collection::vec(0u8..60, 1..5).prop_map(Op::Delete),
        1 => Just(Op::Flush),
    ]
}

fn key(k: u8) -> String {
    format!("key{k:02}")
}

async fn run(tasks: Vec<Vec<Op>>, memtable_rows: usize) {
    let loc = memory();
    let settings = lsmsearch::Settings {
        memtable_max_rows: memtable_rows,
        max_frozen_memtables: 1,
        wal_buffer_interval_ms: 5,
        ..Default::default()
    };
    let index = Arc::new(
        Index::create(loc.clone(), schema(), settings.clone())
            .await
            .unwrap(),
    );
    let handles: Vec<_> = tasks
        .into_iter()
        .map(|ops| {
            let index = index.clone();
            tokio::spawn(async move {
                let s = schema();
                let mut log = Vec::new();
                for op in ops {
                    match &op {
                        Op::Append(rows, durable) => {
                            let rows: Vec<Row> =
                                rows.iter().map(|(k, v)| Row::new(key(*k), *v)).collect();
                            let d = if *durable {
                                Durability::Durable
                            } else {
                                Durability::Buffered
                            };
                            let r = index
                                .append_with(&batch(&s, &rows), WriteOptions::with_durability(d))
                                .await
                                .unwrap();
                            log.push((r.last_seq, op.clone()));
                        }
                        Op::Delete(keys) => {
                            let k: Vec<Key> = keys.iter().map(|k| Key::from(key(*k))).collect();
                            let r = index.delete(&k).await.unwrap();
                            log.push((r.last_seq, op.clone()));
                        }
                        Op::Flush => index.flush().await.unwrap(),
                    }
                }
                log
            })
        })
        .collect();
    let mut log = Vec::new();
    for h in handles {
        log.extend(h.await.unwrap());
    }
    log.sort_by_key(|(seq, _)| *seq);
    let mut model = Model::new();
    for (_, op) in log {
        match op {
            Op::Append(rows, _) => {
                for (k, v) in rows {
                    model.insert(key(k), Row::new(key(k), v));
                }
            }
            Op::Delete(keys) => {
                for k in keys {
                    model.remove(&key(k));
                }
            }
            Op::Flush => {}
        }
    }
    assert_eq!(live(&index).await, model);
    index.close().await.unwrap();
    let reopened = Index::open(loc, settings).await.unwrap();
    assert_eq!(live(&reopened).await, model, "after reopen");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn concurrent_writers_match_the_model(
        tasks in prop::collection::vec(prop::collection::vec(op(), 1..30), 2..8),
        memtable_rows in 5usize..80,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run(tasks, memtable_rows));
    }
}
