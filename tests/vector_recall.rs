//! ANN recall on a slice of Fashion-MNIST (784-d): graph search with re-scoring finds ≥ 95% of
//! the exact top 10, over 1 and 10 generations plus a memtable, for l2 and cosine, and so does
//! the scan of small generations' codes (of the top 100 too). The full corpus and ≥ 1,000
//! queries run in the `vector` benchmark.

mod common;

use arrow::array::{AsArray, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field};
use lsmsearch::{Index, IndexSchema, Settings, VectorSearchOptions};
use std::collections::HashSet;
use std::sync::Arc;

fn batch(s: &IndexSchema, from: usize, vs: &[Vec<f32>]) -> RecordBatch {
    let values: Vec<f32> = vs.iter().flatten().copied().collect();
    RecordBatch::try_new(
        s.arrow_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                (from..from + vs.len()).map(|i| format!("{i:05}")),
            )),
            Arc::new(
                FixedSizeListArray::try_new(
                    Arc::new(Field::new("item", DataType::Float32, true)),
                    784,
                    Arc::new(Float32Array::from(values)),
                    None,
                )
                .unwrap(),
            ),
        ],
    )
    .unwrap()
}

fn keys(b: &[RecordBatch]) -> Vec<String> {
    b.iter()
        .flat_map(|b| {
            let ids = b.column(0).as_string::<i32>();
            (0..b.num_rows())
                .map(|i| ids.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// How each generation's arm finds its candidates.
#[derive(Debug, Clone, Copy)]
enum Arms {
    /// A walk of its graph over codes.
    Walk,
    /// A scan of its codes (a generation small enough to hold its vectors).
    Scan,
}

async fn recall(
    metric: &str,
    corpus: &[Vec<f32>],
    queries: &[Vec<f32>],
    generations: usize,
    arms: Arms,
    k: usize,
) -> f64 {
    let s = IndexSchema::from_json(&format!(
        r#"{{"primary_key": "id", "vector": {{"column": "v", "dim": 784, "metric": "{metric}"}}}}"#
    ))
    .unwrap();
    let settings = match arms {
        Arms::Walk => Settings {
            vector_exact_below: 1, // always walk the graphs
            ..Settings::default()
        },
        // Generations of at most 2,048 rows hold their vectors and scan their codes.
        Arms::Scan => Settings::default(),
    };
    let index = Index::create(common::memory(), s.clone(), settings)
        .await
        .unwrap();
    let memtable = 300;
    let flushed = corpus.len() - memtable;
    for g in 0..generations {
        let (a, b) = (g * flushed / generations, (g + 1) * flushed / generations);
        index.append(&batch(&s, a, &corpus[a..b])).await.unwrap();
        index.flush().await.unwrap();
    }
    index
        .append(&batch(&s, flushed, &corpus[flushed..]))
        .await
        .unwrap();
    let plan = index
        .plan_vector(&queries[0], &VectorSearchOptions::with_k(10))
        .await
        .unwrap();
    let text = datafusion::physical_plan::displayable(plan.as_ref())
        .indent(true)
        .to_string();
    let shown = match arms {
        Arms::Walk => "hnsw ef=",
        Arms::Scan => "scan of codes",
    };
    assert_eq!(text.matches(shown).count(), generations, "{text}");
    // An exact search scans the vectors themselves, whatever the generations hold.
    let exact_plan = index
        .plan_vector(
            &queries[0],
            &VectorSearchOptions {
                exact: true,
                ..VectorSearchOptions::with_k(10)
            },
        )
        .await
        .unwrap();
    let text = datafusion::physical_plan::displayable(exact_plan.as_ref())
        .indent(true)
        .to_string();
    assert_eq!(text.matches("exact,").count(), generations + 1, "{text}");
    let mut found = 0;
    for q in queries {
        let ann = keys(
            &index
                .search_vector(q, &VectorSearchOptions::with_k(k))
                .await
                .unwrap(),
        );
        let exact_opts = VectorSearchOptions {
            k,
            exact: true,
            ..Default::default()
        };
        let exact: HashSet<String> = keys(&index.search_vector(q, &exact_opts).await.unwrap())
            .into_iter()
            .collect();
        assert_eq!(ann.len(), k);
        found += ann.iter().filter(|key| exact.contains(*key)).count();
    }
    found as f64 / (k * queries.len()) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_search_recall_at_10_is_at_least_95_percent() {
    let Some(corpus) = common::fashion::load("train-images-idx3-ubyte.gz", 2000) else {
        return;
    };
    let queries = common::fashion::load("t10k-images-idx3-ubyte.gz", 60).unwrap();
    // k = 100 as well: a hybrid search's vector part ranks 100 candidates by default, as
    // many as `vector_rerank` re-ranks.
    let cases = [
        ("l2", 1, Arms::Walk, 10),
        ("l2", 10, Arms::Walk, 10),
        ("cosine", 10, Arms::Walk, 10),
        ("dot", 10, Arms::Walk, 10),
        ("l2", 10, Arms::Scan, 10),
        ("cosine", 10, Arms::Scan, 10),
        ("dot", 10, Arms::Scan, 10),
        ("l2", 10, Arms::Scan, 100),
        ("cosine", 10, Arms::Scan, 100),
    ];
    for (metric, generations, arms, k) in cases {
        let r = recall(metric, &corpus, &queries, generations, arms, k).await;
        println!("Fashion-MNIST slice ({} vectors, {} queries), {metric}, {generations} generations + memtable, {arms:?}: recall@{k} {r:.4}", corpus.len(), queries.len());
        assert!(
            r >= 0.95,
            "{metric}, {generations} generations, {arms:?}: recall@{k} {r}"
        );
    }
}
