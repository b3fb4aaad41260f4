//! Generation invariance of hybrid search: random rows with updates and deletes, split
//! randomly into a memtable and generations; with exact vector search, the fused ranking
//! equals fusing one tantivy index's ranking with brute force over the live rows (reciprocal
//! rank fusion and the weighted sum), whatever the split.

mod common;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, UInt32Type};
use common::fusion::{brute_force, reference_fusion};
use common::{batch, memory, schema, Row};
use lsmsearch::{Fusion, HybridSearchOptions, Index, Key, Settings};
use proptest::prelude::*;
use std::collections::BTreeMap;

const WORDS: &[&str] = &[
    "wing", "flow", "shock", "layer", "heat", "plate", "mach", "drag",
];

const QUERIES: &[&str] = &[
    "wing",
    "shock layer",
    "+flow heat",
    "\"shock layer\"",
    "mach OR drag",
];

#[derive(Debug, Clone)]
enum Op {
    Upsert(Vec<(u8, Vec<u8>, [i8; 4])>),
    Delete(Vec<u8>),
    Flush,
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    let row = (
        0u8..40,
        prop::collection::vec(0u8..8, 0..8),
        prop::array::uniform4(-3i8..4),
    );
    prop_oneof![
        6 => prop::collection::vec(row, 1..10).prop_map(Op::Upsert),
        2 => prop::collection::vec(0u8..40, 1..4).prop_map(Op::Delete),
        2 => Just(Op::Flush),
        1 => Just(Op::Compact),
    ]
}

/// Each row of a hybrid search: key, fused score, text rank, vector rank.
fn fused_rows(batches: &[RecordBatch]) -> Vec<(String, f32, Option<usize>, Option<usize>)> {
    let mut out = Vec::new();
    for b in batches {
        let keys = b.column(0).as_string::<i32>();
        let scores = b.column(1).as_primitive::<Float32Type>();
        let tr = b
            .column_by_name("_fts_rank")
            .unwrap()
            .as_primitive::<UInt32Type>();
        let vr = b
            .column_by_name("_vector_rank")
            .unwrap()
            .as_primitive::<UInt32Type>();
        let rank =
            |a: &arrow::array::UInt32Array, i: usize| a.is_valid(i).then(|| a.value(i) as usize);
        for i in 0..b.num_rows() {
            out.push((
                keys.value(i).to_string(),
                scores.value(i),
                rank(tr, i),
                rank(vr, i),
            ));
        }
    }
    out
}

async fn run(ops: Vec<Op>, searches: Vec<(usize, [i8; 4], usize, usize, usize)>) {
    let s = schema();
    let settings = Settings {
        memtable_max_rows: 1_000_000,
        compaction: false,
        ..Settings::default()
    };
    let index = Index::create(memory(), s.clone(), settings).await.unwrap();
    let mut live: BTreeMap<String, Row> = BTreeMap::new();
    let mut flushes = 0;
    for (n, op) in ops.into_iter().enumerate() {
        match op {
            Op::Upsert(rows) => {
                let rows: Vec<Row> = rows
                    .into_iter()
                    .map(|(k, words, e)| Row {
                        id: format!("k{k:02}"),
                        body: words
                            .iter()
                            .map(|w| WORDS[*w as usize])
                            .collect::<Vec<_>>()
                            .join(" "),
                        year: n as i64,
                        emb: e.map(f32::from),
                    })
                    .collect();
                index.append(&batch(&s, &rows)).await.unwrap();
                for r in rows {
                    live.insert(r.id.clone(), r);
                }
            }
            Op::Delete(keys) => {
                let keys: Vec<String> = keys.iter().map(|k| format!("k{k:02}")).collect();
                let k: Vec<Key> = keys.iter().map(|k| Key::from(k.as_str())).collect();
                index.delete(&k).await.unwrap();
                keys.iter().for_each(|k| {
                    live.remove(k);
                });
            }
            Op::Flush if flushes < 12 => {
                index.flush().await.unwrap();
                flushes += 1;
            }
            Op::Flush => {}
            Op::Compact => {
                index.compact().await.unwrap();
            }
        }
    }
    let docs = live
        .iter()
        .map(|(k, r)| (k.clone(), vec![Some(r.body.clone())]))
        .collect();
    let reference = common::fts::Reference::new(&["body"], &docs);
    for (qi, v, k, offset, extra) in searches {
        let q = QUERIES[qi % QUERIES.len()];
        let v = v.map(|x| f32::from(x) + 0.5);
        let texts = reference.search(q, false);
        let nearest = brute_force(live.values().map(|r| (&r.id, r.emb.as_slice())), &v);
        let candidates = offset + k + extra;
        let fusions = [
            Fusion::Rrf { k: 60.0 },
            Fusion::Weighted {
                text: 0.4,
                vector: 0.6,
            },
        ];
        for fusion in fusions {
            let opts = HybridSearchOptions {
                k,
                offset,
                fusion,
                candidates: Some(candidates),
                exact: true,
                columns: Some(Vec::new()),
                ..HybridSearchOptions::default()
            };
            let got = fused_rows(&index.search_hybrid(q, &v, &opts).await.unwrap());
            let want = reference_fusion(&texts, &nearest, fusion, candidates, offset, k);
            let ctx = format!(
                "{q:?}, {v:?}, {fusion:?}, k {k}, offset {offset}, candidates {candidates}, {flushes} flushes"
            );
            let keys = |r: &[(String, f32, Option<usize>, Option<usize>)]| {
                r.iter().map(|x| x.0.clone()).collect::<Vec<_>>()
            };
            assert_eq!(keys(&got), keys(&want), "{ctx}");
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g.1 - w.1).abs() <= 1e-5 * w.1.abs().max(1e-3),
                    "{ctx}: {g:?} against {w:?}"
                );
                assert_eq!((g.2, g.3), (w.2, w.3), "{ctx}: {}'s ranks", g.0);
            }
        }
    }
}

/// Cases of the property test: 24, or `PROPTEST_CASES` (the long mode).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn any_split_fuses_like_one_index_and_brute_force(
        ops in prop::collection::vec(op(), 1..50),
        searches in prop::collection::vec(
            (0usize..5, prop::array::uniform4(-3i8..4), 1usize..12, 0usize..6, 0usize..20),
            1..4,
        ),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(ops, searches));
    }
}
