//! Exact vector search: equals brute force over the live rows for any split into memtable and
//! generations and every metric; never short with superseded rows and a 1%-selective filter; bad
//! query vectors get clear errors.

mod common;

use arrow::array::{
    AsArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Float32Type};
use common::fts::assert_same_ranking_with;
use lsmsearch::{ErrorKind, Index, IndexSchema, Key, Settings, VectorSearchOptions};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

fn schema(metric: &str, dim: usize) -> IndexSchema {
    IndexSchema::from_json(&format!(
        r#"{{"primary_key": "id", "vector": {{"column": "v", "dim": {dim}, "metric": "{metric}"}},
            "payload": [{{"name": "year", "type": "int64"}}]}}"#
    ))
    .unwrap()
}

fn batch(s: &IndexSchema, rows: &[(String, Vec<f32>, i64)]) -> RecordBatch {
    let dim = s.vector.as_ref().unwrap().dim;
    let values: Vec<f32> = rows.iter().flat_map(|r| r.1.clone()).collect();
    RecordBatch::try_new(
        s.arrow_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0.clone()),
            )),
            Arc::new(
                FixedSizeListArray::try_new(
                    Arc::new(Field::new("item", DataType::Float32, true)),
                    dim as i32,
                    Arc::new(Float32Array::from(values)),
                    None,
                )
                .unwrap(),
            ),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
        ],
    )
    .unwrap()
}

/// (key, -distance): the full-text ranking checker then orders nearest first.
fn results(batches: &[RecordBatch]) -> Vec<(String, f32)> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column(0).as_string::<i32>();
        let d = b.column(1).as_primitive::<Float32Type>();
        for i in 0..b.num_rows() {
            out.push((ids.value(i).to_string(), -d.value(i)));
        }
    }
    out
}

/// Independent brute force in f64: every live row, nearest first, as (key, -distance).
fn brute_force(
    metric: &str,
    live: &BTreeMap<String, (Vec<f32>, i64)>,
    q: &[f32],
) -> Vec<(String, f32)> {
    let mut all: Vec<(String, f32)> = live
        .iter()
        .map(|(k, (v, _))| {
            let dot: f64 = v.iter().zip(q).map(|(a, b)| *a as f64 * *b as f64).sum();
            let d = match metric {
                "l2" => v
                    .iter()
                    .zip(q)
                    .map(|(a, b)| ((a - b) as f64).powi(2))
                    .sum::<f64>()
                    .sqrt(),
                "dot" => -dot,
                _ => {
                    let na: f64 = v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
                    let nb: f64 = q.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
                    if na == 0.0 || nb == 0.0 {
                        1.0
                    } else {
                        1.0 - dot / (na * nb)
                    }
                }
            };
            (k.clone(), -(d as f32))
        })
        .collect();
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all
}

#[derive(Debug, Clone)]
enum Op {
    Upsert(Vec<(u8, Vec<i8>)>),
    Delete(Vec<u8>),
    Flush,
    /// `compact()`: every generation into one.
    Compact,
    /// Search now (with query number `n`, mod the list), against brute force over the rows so far.
    Query(usize),
}

fn op(dim: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec((0u8..50, prop::collection::vec(-8i8..8, dim)), 1..10).prop_map(Op::Upsert),
        2 => prop::collection::vec(0u8..50, 1..4).prop_map(Op::Delete),
        2 => Just(Op::Flush),
        1 => Just(Op::Compact),
        2 => (0usize..100).prop_map(Op::Query),
    ]
}

async fn run(metric: &str, ops: Vec<Op>, queries: Vec<Vec<i8>>, k: usize) {
    let dim = queries[0].len();
    let s = schema(metric, dim);
    // Background compaction merges runs of two generations while operations and queries go on.
    let settings = Settings {
        compaction_fanout: 2,
        compaction_grace_ms: 0,
        ..Settings::default()
    };
    let index = Index::create(common::memory(), s.clone(), settings)
        .await
        .unwrap();
    let mut live = BTreeMap::new();
    let mut flushes = 0;
    let search = |q: &[i8]| {
        let q: Vec<f32> = q.iter().map(|x| *x as f32 / 4.0).collect();
        let opts = VectorSearchOptions {
            k,
            ..Default::default()
        };
        let index = &index;
        async move { (results(&index.search_vector(&q, &opts).await.unwrap()), q) }
    };
    for (n, op) in ops.into_iter().enumerate() {
        match op {
            Op::Upsert(rows) => {
                let rows: Vec<(String, Vec<f32>, i64)> = rows
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            format!("k{k:02}"),
                            v.iter().map(|x| *x as f32 / 4.0).collect(),
                            k as i64,
                        )
                    })
                    .collect();
                index.append(&batch(&s, &rows)).await.unwrap();
                for r in rows {
                    live.insert(r.0, (r.1, r.2));
                }
            }
            Op::Delete(keys) => {
                let keys: Vec<String> = keys.iter().map(|k| format!("k{k:02}")).collect();
                index
                    .delete(
                        &keys
                            .iter()
                            .map(|k| Key::from(k.as_str()))
                            .collect::<Vec<_>>(),
                    )
                    .await
                    .unwrap();
                for k in keys {
                    live.remove(&k);
                }
            }
            Op::Flush => {
                if flushes < 20 {
                    index.flush().await.unwrap();
                    flushes += 1;
                }
            }
            Op::Compact => {
                index.compact().await.unwrap();
            }
            Op::Query(i) => {
                let (ours, q) = search(&queries[i % queries.len()]).await;
                let all = brute_force(metric, &live, &q);
                let ctx = format!("{metric}, after operation {n}: q {q:?}, k {k}");
                assert_same_ranking_with(&ours, &all, k, &ctx, 1.0);
            }
        }
    }
    for q in &queries {
        let (ours, q) = search(q).await;
        let all = brute_force(metric, &live, &q);
        let ctx = format!("{metric}, q {q:?}, k {k}, {flushes} generations");
        assert_same_ranking_with(&ours, &all, k, &ctx, 1.0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn exact_search_equals_brute_force(
        metric in prop::sample::select(vec!["l2", "cosine", "dot"]),
        ops in prop::collection::vec(op(5), 1..50),
        queries in prop::collection::vec(prop::collection::vec(-8i8..8, 5), 1..4),
        k in 1usize..12,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(metric, ops, queries, k));
    }
}

#[tokio::test]
async fn never_short_with_superseded_rows_and_a_one_percent_filter() {
    // Default settings scan arms with few candidates; the second run forces graph walks, which
    // come back short under the 1% filter and fall back to a scan.
    // The third run also walks the memtable's graph.
    for (exact_below, graph_above) in [(2048, 20_000), (1, 20_000), (1, 0)] {
        never_short(Settings {
            vector_exact_below: exact_below,
            memtable_graph_above: graph_above,
            ..Settings::default()
        })
        .await;
    }
}

async fn never_short(settings: Settings) {
    let s = schema("l2", 2);
    let index = Index::create(common::memory(), s.clone(), settings)
        .await
        .unwrap();
    // 2,000 rows over 4 generations; year = i % 100 so "year = 7" keeps 1%.
    for g in 0..4 {
        let rows: Vec<(String, Vec<f32>, i64)> = (g * 500..(g + 1) * 500)
            .map(|i| (format!("r{i:04}"), vec![i as f32, 0.0], (i % 100) as i64))
            .collect();
        index.append(&batch(&s, &rows)).await.unwrap();
        index.flush().await.unwrap();
    }
    // The nearest rows to the origin move far away (superseded) or are deleted.
    let moved: Vec<(String, Vec<f32>, i64)> = (0..300)
        .step_by(2)
        .map(|i| (format!("r{i:04}"), vec![1e6, 0.0], (i % 100) as i64))
        .collect();
    index.append(&batch(&s, &moved)).await.unwrap();
    index.flush().await.unwrap();
    let gone: Vec<Key> = (1..300)
        .step_by(2)
        .map(|i| Key::from(format!("r{i:04}")))
        .collect();
    index.delete(&gone).await.unwrap();

    let opts = VectorSearchOptions {
        k: 10,
        filter: None,
        ..Default::default()
    };
    let got = results(&index.search_vector(&[0.0, 0.0], &opts).await.unwrap());
    let keys: Vec<&str> = got.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        keys,
        (300..310).map(|i| format!("r{i:04}")).collect::<Vec<_>>()
    );

    let opts = VectorSearchOptions {
        k: 10,
        filter: Some("year = 7".into()),
        ..Default::default()
    };
    let got = results(&index.search_vector(&[0.0, 0.0], &opts).await.unwrap());
    // Rows with year 7 below 300 were moved (even) or deleted (odd): 307, 407, ..., 1907 remain,
    // plus the moved 7+100j for even ones (none: 7 is odd, so 107, 207 are odd too).
    let want: Vec<String> = (0..20)
        .map(|j| 7 + 100 * j)
        .filter(|i| *i >= 300)
        .take(10)
        .map(|i| format!("r{i:04}"))
        .collect();
    assert_eq!(got.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), want);
    assert_eq!(got.len(), 10, "never short");
}

/// A small deterministic generator (xorshift) for reproducible vectors.
struct Rng(u64);

impl Rng {
    fn f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }

    fn vector(&mut self, dim: usize) -> Vec<f32> {
        (0..dim).map(|_| self.f32()).collect()
    }
}

async fn wait_for_memtable_graph(index: &Index) {
    for _ in 0..6000 {
        let st = index.stats();
        if st.memtable_graph_rows == st.memtable_rows {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the memtable graph did not catch up: {:?}", index.stats());
}

#[tokio::test]
async fn memtable_graph_walks_find_what_the_scan_finds() {
    for metric in ["l2", "cosine"] {
        let s = schema(metric, 16);
        let settings = Settings {
            memtable_graph_above: 1000,
            ..Settings::default()
        };
        let index = Index::create(common::memory(), s.clone(), settings)
            .await
            .unwrap();
        let mut rng = Rng(0x9e3779b97f4a7c15);
        let mut live: BTreeMap<String, (Vec<f32>, i64)> = BTreeMap::new();
        for chunk in 0..10 {
            let rows: Vec<(String, Vec<f32>, i64)> = (chunk * 400..(chunk + 1) * 400)
                .map(|i| (format!("r{i:05}"), rng.vector(16), (i % 100) as i64))
                .collect();
            for r in &rows {
                live.insert(r.0.clone(), (r.1.clone(), r.2));
            }
            index.append(&batch(&s, &rows)).await.unwrap();
        }
        // Updates and deletes: older versions stay in the graph and must be hidden.
        let updates: Vec<(String, Vec<f32>, i64)> = (0..4000)
            .step_by(7)
            .map(|i| (format!("r{i:05}"), rng.vector(16), (i % 100) as i64))
            .collect();
        for r in &updates {
            live.insert(r.0.clone(), (r.1.clone(), r.2));
        }
        index.append(&batch(&s, &updates)).await.unwrap();
        let gone: Vec<String> = (3..4000).step_by(11).map(|i| format!("r{i:05}")).collect();
        for k in &gone {
            live.remove(k);
        }
        let gone: Vec<Key> = gone.into_iter().map(Key::from).collect();
        index.delete(&gone).await.unwrap();
        wait_for_memtable_graph(&index).await;
        assert_eq!(
            index.stats().generations.len(),
            0,
            "all rows in the memtable"
        );

        let k = 10;
        let (mut found, mut wanted) = (0, 0);
        for _ in 0..40 {
            let q = rng.vector(16);
            let plan = index
                .plan_vector(&q, &VectorSearchOptions::with_k(k))
                .await
                .unwrap();
            let shown = datafusion::physical_plan::displayable(plan.as_ref())
                .indent(true)
                .to_string();
            assert!(shown.contains("exact tail"), "{shown}");
            let got = results(
                &index
                    .search_vector(&q, &VectorSearchOptions::with_k(k))
                    .await
                    .unwrap(),
            );
            assert_eq!(got.len(), k, "never short");
            let truth = brute_force(metric, &live, &q);
            for (key, d) in &got {
                // Every returned row is live, with its exact distance.
                let exact = truth.iter().find(|t| &t.0 == key).expect("a live row");
                assert!(
                    (exact.1 - d).abs() <= 1e-5 * (1.0 + d.abs()),
                    "{key}: {d} vs {}",
                    exact.1
                );
            }
            let top: Vec<&String> = truth.iter().take(k).map(|t| &t.0).collect();
            found += got.iter().filter(|g| top.contains(&&g.0)).count();
            wanted += k;
        }
        let recall = found as f64 / wanted as f64;
        assert!(recall >= 0.95, "{metric}: recall@10 {recall}");

        // Rows appended now are found at once, before the graph has them.
        let q = rng.vector(16);
        let fresh = vec![("fresh".to_string(), q.clone(), 1)];
        index.append(&batch(&s, &fresh)).await.unwrap();
        let got = results(
            &index
                .search_vector(&q, &VectorSearchOptions::with_k(1))
                .await
                .unwrap(),
        );
        assert_eq!(got[0].0, "fresh");
    }
}

#[tokio::test]
async fn bad_query_vectors_get_clear_errors() {
    let s = schema("cosine", 3);
    let index = Index::create(common::memory(), s.clone(), Settings::default())
        .await
        .unwrap();
    index
        .append(&batch(&s, &[("a".into(), vec![1.0, 0.0, 0.0], 1)]))
        .await
        .unwrap();
    let opts = VectorSearchOptions::default();
    let check = |r: lsmsearch::Result<Vec<RecordBatch>>, mention: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
        assert!(
            e.to_string().contains(mention),
            "'{e}' should mention '{mention}'"
        );
    };
    check(index.search_vector(&[1.0, 0.0], &opts).await, "dimension 2");
    check(
        index.search_vector(&[1.0, f32::NAN, 0.0], &opts).await,
        "NaN",
    );
    check(
        index.search_vector(&[1.0, 0.0, f32::INFINITY], &opts).await,
        "component 2",
    );
    check(
        index
            .search_vector(
                &[1.0, 0.0, 0.0],
                &VectorSearchOptions {
                    k: 0,
                    ..Default::default()
                },
            )
            .await,
        "k must be",
    );
    check(
        index
            .search_vector(
                &[1.0, 0.0, 0.0],
                &VectorSearchOptions {
                    k: 1,
                    filter: Some("nope > 1".into()),
                    ..Default::default()
                },
            )
            .await,
        "nope",
    );
    let text_only = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t"]}"#).unwrap();
    let no_vec = Index::create(common::memory(), text_only, Settings::default())
        .await
        .unwrap();
    check(
        no_vec.search_vector(&[1.0], &opts).await,
        "without a vector column",
    );
    assert_eq!(
        results(&index.search_vector(&[1.0, 0.0, 0.0], &opts).await.unwrap()).len(),
        1
    );
}
