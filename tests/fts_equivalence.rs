//! Generation invariance of full-text search: random documents with updates and deletes, split
//! randomly into a memtable and 0..20 generations, rank exactly as one tantivy index built over
//! the live rows alone (keys, and scores within 1e-5 relative).

mod common;

use arrow::array::{AsArray, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::Float32Type;
use common::fts::{assert_same_ranking, Reference};
use common::memory;
use lsmsearch::{Conjunction, Index, IndexSchema, Key, SearchOptions, Settings};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const WORDS: &[&str] = &[
    "wing", "flow", "shock", "layer", "heat", "plate", "mach", "drag", "lift", "jet", "wake",
    "nozzle",
];

fn schema() -> IndexSchema {
    IndexSchema::from_json(
        r#"{"primary_key": "id", "text": ["title", "body"],
            "payload": [{"name": "year", "type": "int64"}]}"#,
    )
    .unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    Upsert(Vec<(u8, Vec<u8>, Vec<u8>, bool)>),
    Delete(Vec<u8>),
    Flush,
    /// `compact()`: every generation into one.
    Compact,
    /// Query number `n` (mod the list) now, against the reference of the rows so far.
    Query(usize),
}

fn words(idx: &[u8]) -> String {
    idx.iter()
        .map(|i| WORDS[*i as usize % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

fn op() -> impl Strategy<Value = Op> {
    let row = (
        0u8..40,
        prop::collection::vec(0u8..12, 0..4),
        prop::collection::vec(0u8..12, 0..20),
        any::<bool>(),
    );
    prop_oneof![
        6 => prop::collection::vec(row, 1..8).prop_map(Op::Upsert),
        2 => prop::collection::vec(0u8..40, 1..4).prop_map(Op::Delete),
        2 => Just(Op::Flush),
        1 => Just(Op::Compact),
        2 => (0usize..100).prop_map(Op::Query),
    ]
}

pub const QUERIES: &[&str] = &[
    "wing",
    "shock layer",
    "+flow heat",
    "flow -heat",
    "\"shock layer\"",
    "title:mach",
    "body:drag^2 lift",
    "wing OR (jet AND wake)",
    "\"flow heat plate\"",
    "nozzle AND NOT flow",
];

fn batch(s: &IndexSchema, rows: &[(String, Option<String>, Option<String>, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        s.arrow_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0.clone()),
            )),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1.clone()))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2.clone()))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
        ],
    )
    .unwrap()
}

pub fn results(batches: &[RecordBatch]) -> Vec<(String, f32)> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column(0).as_string::<i32>();
        let scores = b.column(1).as_primitive::<Float32Type>();
        for i in 0..b.num_rows() {
            out.push((ids.value(i).to_string(), scores.value(i)));
        }
    }
    let _ = Float32Array::from(vec![0.0]);
    out
}

async fn run(ops: Vec<Op>, ks: Vec<usize>) {
    let s = schema();
    // Background compaction merges runs of two generations while operations and queries go on.
    // Generations' segments are scored in pieces of two documents and more, on three threads
    // (the other tests score theirs whole).
    let settings = Settings {
        memtable_max_rows: 1_000_000,
        compaction_fanout: 2,
        compaction_grace_ms: 0,
        query_threads: 3,
        query_piece_docs: 2,
        ..Settings::default()
    };
    let index = Index::create(memory(), s.clone(), settings).await.unwrap();
    let mut live: BTreeMap<String, (Vec<Option<String>>, i64)> = BTreeMap::new();
    let mut flushes = 0;
    for (n, op) in ops.into_iter().enumerate() {
        match op {
            Op::Upsert(rows) => {
                let rows: Vec<_> = rows
                    .into_iter()
                    .map(|(k, t, b, null_title)| {
                        let title = (!null_title).then(|| words(&t));
                        (format!("k{k:02}"), title, Some(words(&b)), n as i64)
                    })
                    .collect();
                index.append(&batch(&s, &rows)).await.unwrap();
                for r in rows {
                    live.insert(r.0.clone(), (vec![r.1, r.2], r.3));
                }
            }
            Op::Delete(keys) => {
                let keys: Vec<String> = keys.iter().map(|k| format!("k{k:02}")).collect();
                let k: Vec<Key> = keys.iter().map(|k| Key::from(k.as_str())).collect();
                index.delete(&k).await.unwrap();
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
                let q = QUERIES[i % QUERIES.len()];
                let k = ks[i % ks.len()];
                let docs: BTreeMap<String, Vec<Option<String>>> =
                    live.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect();
                let reference = Reference::new(&["title", "body"], &docs);
                let ours = results(
                    &index
                        .search_fts(q, &SearchOptions::with_k(k))
                        .await
                        .unwrap(),
                );
                let ctx = format!("after operation {n}: query {q:?}, k {k}");
                assert_same_ranking(&ours, &reference.search(q, false), k, &ctx);
            }
        }
    }
    let docs: BTreeMap<String, Vec<Option<String>>> =
        live.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect();
    let reference = Reference::new(&["title", "body"], &docs);
    for (qi, q) in QUERIES.iter().enumerate() {
        let k = ks[qi % ks.len()];
        let ours = results(
            &index
                .search_fts(q, &SearchOptions::with_k(k))
                .await
                .unwrap(),
        );
        let all = reference.search(q, false);
        let ctx = format!(
            "query {q:?}, k {k}, {flushes} generations; docs: {:?}",
            ours.iter()
                .map(|(k, _)| (k.clone(), docs.get(k).cloned()))
                .collect::<Vec<_>>()
        );
        assert_same_ranking(&ours, &all, k, &ctx);
    }
    // AND as the default conjunction.
    let opts = SearchOptions {
        k: 10,
        conjunction: Conjunction::And,
        ..Default::default()
    };
    let ours = results(&index.search_fts("shock layer", &opts).await.unwrap());
    assert_same_ranking(&ours, &reference.search("shock layer", true), 10, "AND");
}

/// Cases of the property test: 32, or `PROPTEST_CASES` (the long mode).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn any_split_ranks_like_one_index(
        ops in prop::collection::vec(op(), 1..60),
        ks in prop::collection::vec(1usize..15, 1..4),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(ops, ks));
    }
}
