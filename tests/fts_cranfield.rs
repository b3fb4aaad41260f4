//! Cranfield (1,400 abstracts, 225 queries, relevance judgments): ingested across 12 generations
//! plus a memtable, with some documents superseded by newer versions; every query ranks exactly
//! like one tantivy index over the live rows, and nDCG@10 / recall@100 are equal for both.

mod common;

use arrow::array::{AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{Float32Type, Int64Type};
use common::fts::{assert_same_ranking, Reference};
use lsmsearch::{Index, IndexSchema, Key, SearchOptions, Settings};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/cranfield");

struct Doc {
    id: i64,
    title: String,
    author: String,
    text: String,
}

fn docs() -> Vec<Doc> {
    std::fs::read_to_string(format!("{DATA}/docs.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            Doc {
                id: v["id"].as_i64().unwrap(),
                title: v["title"].as_str().unwrap_or("").to_string(),
                author: v["author"].as_str().unwrap_or("").to_string(),
                text: v["text"].as_str().unwrap_or("").to_string(),
            }
        })
        .collect()
}

/// Queries as (seq, text with query-syntax characters replaced by spaces).
fn queries() -> Vec<(u64, String)> {
    std::fs::read_to_string(format!("{DATA}/queries.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let text: String = v["text"]
                .as_str()
                .unwrap()
                .chars()
                .map(|c| if c.is_alphanumeric() { c } else { ' ' })
                .collect();
            (v["seq"].as_u64().unwrap(), text)
        })
        .collect()
}

fn qrels() -> HashMap<u64, HashMap<String, f64>> {
    let mut m: HashMap<u64, HashMap<String, f64>> = HashMap::new();
    for l in std::fs::read_to_string(format!("{DATA}/qrels.tsv"))
        .unwrap()
        .lines()
        .skip(1)
    {
        let f: Vec<&str> = l.split('\t').collect();
        let rel: f64 = f[2].parse().unwrap();
        if rel > 0.0 {
            m.entry(f[0].parse().unwrap())
                .or_default()
                .insert(f[1].to_string(), rel);
        }
    }
    m
}

fn ndcg10(ranked: &[(String, f32)], rel: &HashMap<String, f64>) -> f64 {
    let dcg: f64 = ranked
        .iter()
        .take(10)
        .enumerate()
        .map(|(i, (k, _))| rel.get(k).copied().unwrap_or(0.0) / ((i + 2) as f64).log2())
        .sum();
    let mut ideal: Vec<f64> = rel.values().copied().collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    let idcg: f64 = ideal
        .iter()
        .take(10)
        .enumerate()
        .map(|(i, r)| r / ((i + 2) as f64).log2())
        .sum();
    if idcg == 0.0 {
        0.0
    } else {
        dcg / idcg
    }
}

fn recall100(ranked: &[(String, f32)], rel: &HashMap<String, f64>) -> f64 {
    if rel.is_empty() {
        return 0.0;
    }
    let hit = ranked
        .iter()
        .take(100)
        .filter(|(k, _)| rel.contains_key(k))
        .count();
    hit as f64 / rel.len() as f64
}

fn batch(s: &IndexSchema, docs: &[&Doc]) -> RecordBatch {
    RecordBatch::try_new(
        s.arrow_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(docs.iter().map(|d| d.id))),
            Arc::new(StringArray::from_iter_values(
                docs.iter().map(|d| d.title.clone()),
            )),
            Arc::new(StringArray::from_iter_values(
                docs.iter().map(|d| d.text.clone()),
            )),
            Arc::new(StringArray::from_iter_values(
                docs.iter().map(|d| d.author.clone()),
            )),
        ],
    )
    .unwrap()
}

fn results(batches: &[RecordBatch]) -> Vec<(String, f32)> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let scores = b.column(1).as_primitive::<Float32Type>();
        for i in 0..b.num_rows() {
            out.push((ids.value(i).to_string(), scores.value(i)));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cranfield_ranks_like_one_index_across_generations() {
    let s = IndexSchema::from_json(
        r#"{"primary_key": "id", "primary_key_type": "int64", "text": ["title", "text"],
            "payload": [{"name": "author", "type": "utf8"}]}"#,
    )
    .unwrap();
    // Twelve generations are kept as flushed (no compaction).
    let settings = Settings {
        memtable_max_rows: 1_000_000,
        compaction: false,
        ..Settings::default()
    };
    let index = Index::create(common::memory(), s.clone(), settings)
        .await
        .unwrap();
    let docs = docs();
    assert_eq!(docs.len(), 1400);
    let refs: Vec<&Doc> = docs.iter().collect();
    // 12 generations of 100 documents, then 200 in the memtable.
    for (i, chunk) in refs.chunks(100).enumerate() {
        index.append(&batch(&s, chunk)).await.unwrap();
        if i < 12 {
            index.flush().await.unwrap();
        }
    }
    // Supersede documents of old generations with new versions (same text) and delete others:
    // the old versions must neither score nor count in the statistics.
    let again: Vec<&Doc> = refs.iter().step_by(9).copied().collect();
    index.append(&batch(&s, &again)).await.unwrap();
    let dropped: Vec<i64> = (0..1400).step_by(97).map(|i| docs[i].id).collect();
    index
        .delete(&dropped.iter().map(|d| Key::I64(*d)).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(index.stats().generations.len(), 12);

    let live: BTreeMap<String, Vec<Option<String>>> = docs
        .iter()
        .filter(|d| !dropped.contains(&d.id))
        .map(|d| {
            (
                d.id.to_string(),
                vec![Some(d.title.clone()), Some(d.text.clone())],
            )
        })
        .collect();
    let reference = Reference::new(&["title", "text"], &live);
    let qrels = qrels();
    let queries = queries();
    assert_eq!(queries.len(), 225);
    let (mut ndcg_ours, mut ndcg_ref, mut rec_ours, mut rec_ref) = (0.0, 0.0, 0.0, 0.0);
    for (seq, q) in &queries {
        let ours = results(
            &index
                .search_fts(q, &SearchOptions::with_k(100))
                .await
                .unwrap(),
        );
        let all = reference.search(q, false);
        assert_same_ranking(&ours, &all, 100, &format!("query {seq}: {q}"));
        let want: Vec<(String, f32)> = all.into_iter().take(100).collect();
        let empty = HashMap::new();
        let rel = qrels.get(seq).unwrap_or(&empty);
        ndcg_ours += ndcg10(&ours, rel);
        ndcg_ref += ndcg10(&want, rel);
        rec_ours += recall100(&ours, rel);
        rec_ref += recall100(&want, rel);
    }
    let n = queries.len() as f64;
    println!(
        "Cranfield, 225 queries, 12 generations + memtable: nDCG@10 {:.4} (reference {:.4}), recall@100 {:.4} (reference {:.4})",
        ndcg_ours / n,
        ndcg_ref / n,
        rec_ours / n,
        rec_ref / n
    );
    assert!((ndcg_ours - ndcg_ref).abs() < 1e-3, "nDCG@10 differs");
    assert!((rec_ours - rec_ref).abs() < 1e-3, "recall@100 differs");
}
