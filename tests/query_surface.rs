//! What a search returns: the columns it names (the text and the vector included), read for
//! the top k only, whatever the source of each row; and pages, which equal one larger search.

mod common;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, Int64Type};
use common::{batch, schema, Model, Row};
use lsmsearch::{
    ErrorKind, Index, Location, SearchOptions, Settings, VectorSearchOptions, MAX_RESULT_WINDOW,
};
use std::sync::Arc;

/// [`common::spread`] with a key deleted in every source, and one tantivy index of the live rows.
async fn spread_with_deletes() -> (Index, Model, common::fts::Reference) {
    let (index, mut model) = common::spread().await;
    for id in ["k0003", "k0250", "k0420", "k0610", "k0777"] {
        index.delete(&[lsmsearch::Key::from(id)]).await.unwrap();
        model.remove(id);
    }
    let docs = model
        .iter()
        .map(|(k, r)| (k.clone(), vec![Some(r.body.clone())]))
        .collect();
    let reference = common::fts::Reference::new(&["body"], &docs);
    (index, model, reference)
}

/// The keys of a search's rows, in order.
fn keys(batches: &[RecordBatch]) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let k = b.column(0).as_string::<i32>();
            (0..b.num_rows())
                .map(|i| k.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The column names of a search's rows.
fn names(batches: &[RecordBatch]) -> Vec<String> {
    batches[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect()
}

/// Each row's named columns equal the live row of its key.
fn check_values(batches: &[RecordBatch], model: &Model) {
    for b in batches {
        let k = b.column(0).as_string::<i32>();
        for i in 0..b.num_rows() {
            let want = &model[k.value(i)];
            if let Some(body) = b.column_by_name("body") {
                assert_eq!(body.as_string::<i32>().value(i), want.body, "{}", want.id);
            }
            if let Some(year) = b.column_by_name("year") {
                assert_eq!(year.as_primitive::<Int64Type>().value(i), want.year);
            }
            if let Some(emb) = b.column_by_name("emb") {
                let emb = emb.as_fixed_size_list();
                assert!(emb.is_valid(i));
                let v = emb.value(i);
                let v: Vec<f32> = v.as_primitive::<Float32Type>().values().to_vec();
                assert_eq!(v, want.emb.to_vec(), "{}", want.id);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_returns_the_columns_it_names_from_every_source() {
    let (index, model) = common::spread().await;
    let query = [20.0, 21.0, -20.0, 0.5];
    // Default: every column but the vector, the text included.
    let fts = index
        .search_fts("body", &SearchOptions::with_k(40))
        .await
        .unwrap();
    assert_eq!(names(&fts), ["id", "_score", "body", "year"]);
    check_values(&fts, &model);
    let vector = index
        .search_vector(&query, &VectorSearchOptions::with_k(40))
        .await
        .unwrap();
    assert_eq!(names(&vector), ["id", "_distance", "body", "year"]);
    check_values(&vector, &model);
    // Named, in the order given, each once; the vector when named; the key and the score
    // change nothing. Rows of the memtable and of every generation among them.
    let columns = Some(vec![
        "year".to_string(),
        "emb".to_string(),
        "id".to_string(),
        "year".to_string(),
        "_score".to_string(),
    ]);
    let opts = SearchOptions {
        columns: columns.clone(),
        ..SearchOptions::with_k(1_000)
    };
    let named = index.search_fts("body", &opts).await.unwrap();
    assert_eq!(names(&named), ["id", "_score", "year", "emb"]);
    assert_eq!(keys(&named).len(), model.len());
    check_values(&named, &model);
    let opts = VectorSearchOptions {
        columns: Some(vec!["emb".into(), "body".into(), "_distance".into()]),
        ..VectorSearchOptions::with_k(1_000)
    };
    let named = index.search_vector(&query, &opts).await.unwrap();
    assert_eq!(names(&named), ["id", "_distance", "emb", "body"]);
    assert_eq!(keys(&named).len(), model.len());
    check_values(&named, &model);
    // Only the key and the score.
    let opts = SearchOptions {
        columns: Some(Vec::new()),
        ..SearchOptions::with_k(5)
    };
    let bare = index.search_fts("body", &opts).await.unwrap();
    assert_eq!(names(&bare), ["id", "_score"]);
    assert_eq!(keys(&bare), keys(&fts)[..5]);
}

#[tokio::test]
async fn an_unknown_column_is_an_error_naming_it() {
    let (index, _) = common::spread().await;
    let opts = SearchOptions {
        columns: Some(vec!["year".into(), "colour".into()]),
        ..SearchOptions::default()
    };
    let e = index.search_fts("body", &opts).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("'colour'"), "{e}");
    let opts = VectorSearchOptions {
        columns: Some(vec!["_score".into()]),
        ..VectorSearchOptions::default()
    };
    let e = index.search_vector(&[0.0; 4], &opts).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("'_score'"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consecutive_pages_equal_one_larger_search() {
    let (index, model) = common::spread().await;
    let query = [20.0, 21.0, -20.0, 0.5];
    // Many ties (the same version gives the same text length and the same vector): the key
    // orders them, the same way in every page.
    for k in [1, 7, 50] {
        let all = keys(
            &index
                .search_fts("body version", &SearchOptions::with_k(4 * k))
                .await
                .unwrap(),
        );
        let mut paged = Vec::new();
        for page in 0..4 {
            let opts = SearchOptions {
                offset: page * k,
                ..SearchOptions::with_k(k)
            };
            let rows = index.search_fts("body version", &opts).await.unwrap();
            check_values(&rows, &model);
            paged.extend(keys(&rows));
        }
        assert_eq!(paged, all, "full text, pages of {k}");
        for exact in [true, false] {
            let all = keys(
                &index
                    .search_vector(
                        &query,
                        &VectorSearchOptions {
                            exact,
                            ..VectorSearchOptions::with_k(4 * k)
                        },
                    )
                    .await
                    .unwrap(),
            );
            let mut paged = Vec::new();
            for page in 0..4 {
                let opts = VectorSearchOptions {
                    exact,
                    offset: page * k,
                    ..VectorSearchOptions::with_k(k)
                };
                paged.extend(keys(&index.search_vector(&query, &opts).await.unwrap()));
            }
            assert_eq!(paged, all, "vector (exact: {exact}), pages of {k}");
        }
    }
    // Past the last match: no rows.
    let opts = SearchOptions {
        offset: model.len(),
        ..SearchOptions::with_k(10)
    };
    assert!(keys(&index.search_fts("body", &opts).await.unwrap()).is_empty());
}

#[tokio::test]
async fn a_page_past_the_bound_is_an_error_naming_it() {
    let (index, _) = common::spread().await;
    for (offset, k) in [
        (MAX_RESULT_WINDOW, 1),
        (1, MAX_RESULT_WINDOW),
        (usize::MAX, 10),
    ] {
        let opts = SearchOptions {
            offset,
            ..SearchOptions::with_k(k)
        };
        let e = index.search_fts("body", &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
        assert!(e.message().contains("offset + k"), "{e}");
        let opts = VectorSearchOptions {
            offset,
            ..VectorSearchOptions::with_k(k)
        };
        let e = index.search_vector(&[0.0; 4], &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
        assert!(e.message().contains("offset + k"), "{e}");
    }
    // At the bound: answered.
    let opts = SearchOptions {
        offset: MAX_RESULT_WINDOW - 10,
        ..SearchOptions::with_k(10)
    };
    assert!(index.search_fts("body", &opts).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_a_point_in_time_ignore_the_writes_between_them() {
    let (index, model) = common::spread().await;
    let s = schema();
    let query = [20.0, 21.0, -20.0, 0.5];
    let pit = index.point_in_time().await.unwrap();
    let k = 25;
    let fts_all = keys(
        &index
            .search_fts("body version", &SearchOptions::with_k(4 * k))
            .await
            .unwrap(),
    );
    let exact = |offset, k| VectorSearchOptions {
        exact: true,
        offset,
        ..VectorSearchOptions::with_k(k)
    };
    let vector_all = keys(&index.search_vector(&query, &exact(0, 4 * k)).await.unwrap());
    let (mut fts, mut vector) = (Vec::new(), Vec::new());
    for page in 0..4 {
        let opts = SearchOptions {
            offset: page * k,
            ..SearchOptions::with_k(k)
        };
        let rows = pit.search_fts("body version", &opts).await.unwrap();
        check_values(&rows, &model);
        fts.extend(keys(&rows));
        let rows = pit
            .search_vector(&query, &exact(page * k, k))
            .await
            .unwrap();
        check_values(&rows, &model);
        vector.extend(keys(&rows));
        // Between pages: the rows ranked first updated, the last one deleted, a new row, a
        // flush, and once a compaction of every generation.
        let updated: Vec<Row> = fts
            .iter()
            .chain(&vector)
            .take(5)
            .map(|id| Row::new(id.clone(), 99))
            .collect();
        index.append(&batch(&s, &updated)).await.unwrap();
        let last = lsmsearch::Key::from(fts.last().unwrap().as_str());
        index.delete(&[last]).await.unwrap();
        index
            .append(&batch(&s, &[Row::new(format!("new{page}"), 20)]))
            .await
            .unwrap();
        index.flush().await.unwrap();
        if page == 1 {
            index.compact().await.unwrap();
        }
    }
    assert_eq!(fts, fts_all, "full-text pages");
    assert_eq!(vector, vector_all, "vector pages");
    // The handle sees the writes, the point in time does not.
    let now = keys(
        &index
            .search_fts("body version", &SearchOptions::with_k(4 * k))
            .await
            .unwrap(),
    );
    assert_ne!(now, fts_all);
    let scanned = common::to_model(&pit.scan(Default::default()).await.unwrap());
    assert_eq!(scanned, model);
    assert_ne!(common::live(&index).await, model);
}

/// `(key, value)` of a hybrid result's rows for column `column` (nulls as NaN).
fn column_of(batches: &[RecordBatch], column: &str) -> Vec<f64> {
    batches
        .iter()
        .flat_map(|b| {
            let c = b.column_by_name(column).unwrap();
            (0..b.num_rows())
                .map(|i| match c.is_null(i) {
                    true => f64::NAN,
                    false => match c.data_type() {
                        arrow::datatypes::DataType::Float32 => {
                            f64::from(c.as_primitive::<Float32Type>().value(i))
                        }
                        _ => f64::from(c.as_primitive::<arrow::datatypes::UInt32Type>().value(i)),
                    },
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_search_equals_fusing_one_tantivy_index_and_brute_force() {
    use lsmsearch::{Fusion, HybridSearchOptions};
    let (index, model, reference) = spread_with_deletes().await;
    for (q, x) in [("version 13", 13.0f32), ("k0150 OR 21 OR 2", 21.0)] {
        let v = [x, x + 1.0, -x, 0.5];
        let texts = reference.search(q, false);
        // Squared distances of small integers and halves: exact, so ties are exact.
        let nearest =
            common::fusion::brute_force(model.values().map(|r| (&r.id, r.emb.as_slice())), &v);
        let fusions = [
            Fusion::Rrf { k: 60.0 },
            Fusion::Rrf { k: 0.0 },
            Fusion::Weighted {
                text: 0.3,
                vector: 0.7,
            },
        ];
        for fusion in fusions {
            for (k, offset, candidates) in [(10, 0, 50), (7, 5, 30), (40, 0, 200)] {
                let ctx = format!("{q}, {fusion:?}, k {k}, offset {offset}, {candidates}");
                let opts = HybridSearchOptions {
                    k,
                    offset,
                    fusion,
                    candidates: Some(candidates),
                    exact: true,
                    ..HybridSearchOptions::default()
                };
                let got = index.search_hybrid(q, &v, &opts).await.unwrap();
                check_values(&got, &model);
                // The reference: each part's best `candidates`, fused as documented.
                let want = common::fusion::reference_fusion(
                    &texts, &nearest, fusion, candidates, offset, k,
                );
                let got_keys = keys(&got);
                let want_keys: Vec<String> = want.iter().map(|w| w.0.clone()).collect();
                assert_eq!(got_keys, want_keys, "{ctx}");
                let scores = column_of(&got, "_score");
                let text_ranks = column_of(&got, "_fts_rank");
                let vector_ranks = column_of(&got, "_vector_rank");
                for (i, w) in want.iter().enumerate() {
                    assert!(
                        (scores[i] - f64::from(w.1)).abs() <= 1e-5 * f64::from(w.1).abs().max(1e-3),
                        "{ctx}: row {i} fused {} against {}",
                        scores[i],
                        w.1
                    );
                    let rank = |r: f64| (!r.is_nan()).then_some(r as usize);
                    assert_eq!(rank(text_ranks[i]), w.2, "{ctx}: row {i}'s text rank");
                    assert_eq!(rank(vector_ranks[i]), w.3, "{ctx}: row {i}'s vector rank");
                }
            }
        }
    }
}

#[tokio::test]
async fn bad_hybrid_options_are_errors_naming_them() {
    use lsmsearch::{Fusion, HybridSearchOptions};
    let (index, _) = common::spread().await;
    let cases = [
        (
            HybridSearchOptions {
                fusion: Fusion::Weighted {
                    text: 0.0,
                    vector: 0.0,
                },
                ..Default::default()
            },
            "sum to 0",
        ),
        (
            HybridSearchOptions {
                fusion: Fusion::Weighted {
                    text: f32::NAN,
                    vector: 1.0,
                },
                ..Default::default()
            },
            "weights",
        ),
        (
            HybridSearchOptions {
                fusion: Fusion::Rrf { k: -1.0 },
                ..Default::default()
            },
            "k is -1",
        ),
        (
            HybridSearchOptions {
                candidates: Some(0),
                ..Default::default()
            },
            "candidates",
        ),
        (
            HybridSearchOptions {
                candidates: Some(25),
                offset: 20,
                ..Default::default()
            },
            "below offset + k (30)",
        ),
        (
            HybridSearchOptions {
                candidates: Some(MAX_RESULT_WINDOW + 1),
                ..Default::default()
            },
            "each part ranks at most",
        ),
        (
            HybridSearchOptions {
                columns: Some(vec!["nope".into()]),
                ..Default::default()
            },
            "'nope'",
        ),
        (
            HybridSearchOptions {
                offset: MAX_RESULT_WINDOW,
                ..Default::default()
            },
            "offset + k",
        ),
    ];
    for (opts, says) in cases {
        let e = index
            .search_hybrid("body", &[0.0; 4], &opts)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
        assert!(e.message().contains(says), "{says}: {e}");
    }
    // A wrong vector or a malformed query: the part's own error.
    let e = index
        .search_hybrid("body", &[0.0; 3], &HybridSearchOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let e = index
        .search_hybrid("body AND (", &[0.0; 4], &HybridSearchOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_point_in_time_keeps_what_it_reads_until_it_goes() {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let s = schema();
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    // A hot cache of less than a generation: a compaction opens copies of its own of the
    // generations the point in time reads, and replaced objects go at once.
    let index = Index::create(
        Location::from_store(store.clone(), "idx"),
        s.clone(),
        Settings {
            memtable_max_rows: 10_000,
            vector_exact_below: 16,
            compaction: false,
            compaction_grace_ms: 0,
            hot_cache_bytes: 1,
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    let mut model = Model::new();
    for g in 0..3i64 {
        let rows: Vec<Row> = (0..300)
            .map(|i| Row::new(format!("k{:04}", g * 300 + i), g))
            .collect();
        index.append(&batch(&s, &rows)).await.unwrap();
        model.extend(rows.into_iter().map(|r| (r.id.clone(), r)));
        index.flush().await.unwrap();
    }
    let objects = || async {
        store
            .list(Some(&object_store::path::Path::from("idx/generations")))
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .len()
    };
    assert_eq!(objects().await, 3);
    let pit = index.point_in_time().await.unwrap();
    let keys_only = SearchOptions {
        columns: Some(Vec::new()),
        ..SearchOptions::with_k(1_000)
    };
    let want = keys(&pit.search_fts("body", &keys_only).await.unwrap());
    assert_eq!(want.len(), 900);
    index.compact().await.unwrap();
    // The compactor deletes what is due every second.
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    assert_eq!(
        objects().await,
        4,
        "the replaced generations stay while held"
    );
    // Their rows, read by range now.
    let rows = pit
        .search_fts("body", &SearchOptions::with_k(1_000))
        .await
        .unwrap();
    assert_eq!(keys(&rows), want);
    check_values(&rows, &model);
    drop((pit, rows));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while objects().await > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the replaced generations stayed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_pages_equal_one_larger_hybrid_search() {
    use lsmsearch::{Fusion, HybridSearchOptions};
    let (index, _) = common::spread().await;
    let v = [20.0, 21.0, -20.0, 0.5];
    let fusions = [
        Fusion::Rrf { k: 60.0 },
        Fusion::Weighted {
            text: 0.4,
            vector: 0.6,
        },
    ];
    for fusion in fusions {
        for exact in [true, false] {
            let k = 20;
            let all = keys(
                &index
                    .search_hybrid(
                        "body version 21",
                        &v,
                        &HybridSearchOptions {
                            fusion,
                            exact,
                            ..HybridSearchOptions::with_k(4 * k)
                        },
                    )
                    .await
                    .unwrap(),
            );
            let mut paged = Vec::new();
            for page in 0..4 {
                let opts = HybridSearchOptions {
                    fusion,
                    exact,
                    offset: page * k,
                    ..HybridSearchOptions::with_k(k)
                };
                paged.extend(keys(
                    &index
                        .search_hybrid("body version 21", &v, &opts)
                        .await
                        .unwrap(),
                ));
            }
            assert_eq!(paged, all, "{fusion:?}, exact {exact}");
        }
    }
}

/// `(key, value of column)` of every row, in order.
fn valued(batches: &[RecordBatch], column: &str) -> Vec<(String, f32)> {
    batches
        .iter()
        .flat_map(|b| {
            let k = b.column(0).as_string::<i32>();
            let v = b
                .column_by_name(column)
                .unwrap()
                .as_primitive::<Float32Type>();
            (0..b.num_rows())
                .map(|i| (k.value(i).to_string(), v.value(i)))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thresholds_keep_the_rows_within_them_before_the_top_k() {
    let (index, model) = common::spread().await;
    let bare = |k| SearchOptions {
        columns: Some(Vec::new()),
        ..SearchOptions::with_k(k)
    };
    let all = valued(
        &index
            .search_fts("version 13 body", &bare(5_000))
            .await
            .unwrap(),
        "_score",
    );
    // The best score: the rows of version 13 (the others tie below them).
    let t = all[0].1;
    let within: Vec<(String, f32)> = all.iter().filter(|r| r.1 >= t).cloned().collect();
    assert!(
        within.len() > 20 && within.len() < all.len(),
        "{}",
        within.len()
    );
    for (k, offset) in [(1_000, 0), (5, 0), (5, 3), (30, 20)] {
        let opts = SearchOptions {
            min_score: Some(t),
            offset,
            ..bare(k)
        };
        let got = valued(
            &index.search_fts("version 13 body", &opts).await.unwrap(),
            "_score",
        );
        let want: Vec<_> = within.iter().skip(offset).take(k).cloned().collect();
        assert_eq!(got, want, "min_score {t}, k {k}, offset {offset}");
    }
    // A radius: the rows at most that far, as brute force counts them.
    let v = [20.0, 21.0, -20.0, 0.5];
    let exact = |k| VectorSearchOptions {
        exact: true,
        columns: Some(Vec::new()),
        ..VectorSearchOptions::with_k(k)
    };
    let all = valued(
        &index.search_vector(&v, &exact(5_000)).await.unwrap(),
        "_distance",
    );
    let r = all[60].1;
    let brute = model
        .values()
        .filter(|row| {
            let d: f32 = row
                .emb
                .iter()
                .zip(&v)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                .sqrt();
            d <= r
        })
        .count();
    for (k, offset) in [(1_000, 0), (7, 4)] {
        let opts = VectorSearchOptions {
            max_distance: Some(r),
            offset,
            ..exact(k)
        };
        let got = valued(&index.search_vector(&v, &opts).await.unwrap(), "_distance");
        let want: Vec<_> = all
            .iter()
            .filter(|d| d.1 <= r)
            .skip(offset)
            .take(k)
            .cloned()
            .collect();
        assert_eq!(got, want, "max_distance {r}, k {k}, offset {offset}");
        if k == 1_000 {
            assert_eq!(got.len(), brute, "the rows within the radius");
        }
    }
    let opts = VectorSearchOptions {
        max_distance: Some(r),
        ..VectorSearchOptions::with_k(1_000)
    };
    let graph = valued(&index.search_vector(&v, &opts).await.unwrap(), "_distance");
    assert!(!graph.is_empty() && graph.iter().all(|d| d.1 <= r));
    // Thresholds that are not numbers, or below what a score or a distance can be.
    for t in [f32::NAN, f32::INFINITY, -1.0] {
        let opts = SearchOptions {
            min_score: Some(t),
            ..SearchOptions::default()
        };
        let e = index.search_fts("body", &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
        assert!(e.message().contains("min_score"), "{e}");
        let opts = VectorSearchOptions {
            max_distance: Some(t),
            ..VectorSearchOptions::default()
        };
        let e = index.search_vector(&v, &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
        assert!(e.message().contains("max_distance"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_equal_a_brute_force_count_of_the_live_rows() {
    let (index, model, reference) = spread_with_deletes().await;
    // A row matches when its body holds any of the terms (every one, for `all`).
    let brute = |terms: &[&str], all: bool, min_year: Option<i64>| {
        model
            .values()
            .filter(|r| {
                let words: Vec<String> = r.body.split(' ').map(|w| w.to_lowercase()).collect();
                let has = |t: &&str| words.iter().any(|w| w == t);
                let text = match all {
                    true => terms.iter().all(has),
                    false => terms.iter().any(has),
                };
                text && min_year.is_none_or(|y| r.year >= y)
            })
            .count() as u64
    };
    let pit = index.point_in_time().await.unwrap();
    let cases: [(&str, &[&str], bool, Option<i64>); 5] = [
        ("version", &["version"], false, None),
        ("13 OR 21 OR 2", &["13", "21", "2"], false, None),
        ("13 21 2", &["13", "21", "2"], false, Some(20)),
        ("version k0150", &["version", "k0150"], true, None),
        ("nothing", &["nothing"], false, None),
    ];
    for (q, terms, all, min_year) in cases {
        let opts = SearchOptions {
            k: 1,
            conjunction: match all {
                true => lsmsearch::Conjunction::And,
                false => lsmsearch::Conjunction::Or,
            },
            filter: min_year.map(|y| format!("year >= {y}")),
            ..SearchOptions::default()
        };
        let want = brute(terms, all, min_year);
        assert_eq!(index.count_fts(q, &opts).await.unwrap(), want, "{q}");
        assert_eq!(
            pit.count_fts(q, &opts).await.unwrap(),
            want,
            "{q} (point in time)"
        );
    }
    // With min_score: the rows the reference scores at least it.
    let all = reference.search("13 OR 21 OR 2", false);
    let t = all[all.len() / 2].1;
    let want = all.iter().filter(|r| r.1 >= t).count() as u64;
    let opts = SearchOptions {
        min_score: Some(t),
        ..SearchOptions::default()
    };
    assert_eq!(index.count_fts("13 OR 21 OR 2", &opts).await.unwrap(), want);
    // Writes after a point in time change the handle's count, not the point in time's.
    let before = pit
        .count_fts("version", &SearchOptions::default())
        .await
        .unwrap();
    index
        .append(&batch(&schema(), &[Row::new("new-row", 1)]))
        .await
        .unwrap();
    index.flush().await.unwrap();
    let opts = SearchOptions::default();
    assert_eq!(index.count_fts("version", &opts).await.unwrap(), before + 1);
    assert_eq!(pit.count_fts("version", &opts).await.unwrap(), before);
    // A count's k and offset play no part.
    let unpaged = SearchOptions {
        k: 0,
        offset: 50_000,
        ..SearchOptions::default()
    };
    assert_eq!(
        index.count_fts("version", &unpaged).await.unwrap(),
        before + 1
    );
    // Bad input: the same errors as a search.
    let bad = SearchOptions {
        min_score: Some(f32::NAN),
        ..SearchOptions::default()
    };
    let e = index.count_fts("version", &bad).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let e = index.count_fts("nope:x", &opts).await.unwrap_err();
    assert!(e.message().contains("nope"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_past_its_timeout_stops_with_an_error_saying_so() {
    use lsmsearch::{HybridSearchOptions, LatencyConfig, LatencyStore};
    use std::time::{Duration, Instant};
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let s = schema();
    let index = Index::create(
        Location::from_store(inner.clone(), "idx"),
        s.clone(),
        Settings {
            compaction: false,
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    for g in 0..3 {
        let rows: Vec<Row> = (0..50).map(|i| Row::new(format!("k{g}-{i}"), i)).collect();
        index.append(&batch(&s, &rows)).await.unwrap();
        index.flush().await.unwrap();
    }
    index.close().await.unwrap();
    // Every read of the store takes 400 ms: a cold search takes longer than its timeout.
    let slow = LatencyStore::new(
        inner,
        LatencyConfig {
            read: Duration::from_millis(400),
            ..LatencyConfig::default()
        },
    );
    // A new handle for each search: nothing of the index in memory yet.
    let open = || async {
        Index::open_read_only(
            Location::from_store(slow.clone(), "idx"),
            Settings::default(),
        )
        .await
        .unwrap()
    };
    let timeout = Some(Duration::from_millis(30));
    let v = [1.0f32, 2.0, -1.0, 0.5];
    let check = |e: lsmsearch::Error, what: &str, t: Instant| {
        assert_eq!(e.kind(), ErrorKind::Timeout, "{what}: {e}");
        assert!(e.message().contains(what), "{what}: {e}");
        assert!(e.message().contains("30.0 ms"), "{what}: {e}");
        // Stopped at its deadline, not after the reads it was waiting for.
        assert!(
            t.elapsed() < Duration::from_millis(390),
            "{what}: {:?}",
            t.elapsed()
        );
    };
    let fts = SearchOptions {
        timeout,
        ..SearchOptions::default()
    };
    let ro = open().await;
    let t = Instant::now();
    check(
        ro.search_fts("version", &fts).await.unwrap_err(),
        "full-text",
        t,
    );
    let ro = open().await;
    let t = Instant::now();
    // A count reads no rows, but a filter's column.
    let filtered = SearchOptions {
        filter: Some("year >= 0".into()),
        ..fts.clone()
    };
    let e = ro.count_fts("version", &filtered).await.unwrap_err();
    check(e, "full-text count", t);
    let vopts = VectorSearchOptions {
        timeout,
        exact: true,
        ..VectorSearchOptions::default()
    };
    let ro = open().await;
    let t = Instant::now();
    check(ro.search_vector(&v, &vopts).await.unwrap_err(), "vector", t);
    let hopts = HybridSearchOptions {
        timeout,
        ..HybridSearchOptions::default()
    };
    let ro = open().await;
    let t = Instant::now();
    check(
        ro.search_hybrid("version", &v, &hopts).await.unwrap_err(),
        "hybrid",
        t,
    );
    let ro = open().await;
    let t = Instant::now();
    let e = match ro.search_fts_stream("version", &fts).await {
        Err(e) => e,
        Ok(stream) => {
            let mut stream = stream;
            let mut err = None;
            while let Some(b) = futures::StreamExt::next(&mut stream).await {
                if let Err(e) = b {
                    err = Some(lsmsearch::Error::from(e));
                    break;
                }
            }
            err.expect("the stream ended before its timeout")
        }
    };
    check(e, "full-text", t);
    // A timeout of 0 is refused; with time enough, the same searches answer.
    let zero = SearchOptions {
        timeout: Some(Duration::ZERO),
        ..SearchOptions::default()
    };
    let e = ro.search_fts("version", &zero).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("timeout"), "{e}");
    let ample = SearchOptions {
        timeout: Some(Duration::from_secs(60)),
        ..SearchOptions::default()
    };
    let got = ro.search_fts("version", &ample).await.unwrap();
    assert_eq!(got.iter().map(|b| b.num_rows()).sum::<usize>(), 10);
    assert_eq!(ro.count_fts("version", &ample).await.unwrap(), 150);
}

/// Whether two tantivy explanations (as JSON) say the same: the same descriptions and
/// contexts (but for the number of a term's field: the reference index has a key field
/// first), values equal within 1e-5 relative.
fn same_explanation(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    let unnumbered = |s: &str| -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some(at) = rest.find("field=") {
            out.push_str(&rest[..at + 6]);
            rest = rest[at + 6..].trim_start_matches(|c: char| c.is_ascii_digit());
        }
        out + rest
    };
    match (a, b) {
        (Value::String(x), Value::String(y)) => unnumbered(x) == unnumbered(y),
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-5 * x.abs().max(y.abs()).max(1.0)
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_explanation(v, w)))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| same_explanation(v, w))
        }
        _ => a == b,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn highlights_and_explanations_equal_one_tantivy_index_of_the_live_rows() {
    let (index, model, reference) = spread_with_deletes().await;
    let queries = [
        "version 13",
        "k0150 OR 21 OR 2",
        "\"version 13\"",
        "body +of 5",
    ];
    for q in queries {
        for (max_chars, tags) in [(150, ("<b>", "</b>")), (12, ("[", "]"))] {
            let opts = SearchOptions {
                k: 30,
                columns: Some(vec!["year".into()]),
                highlight: Some(lsmsearch::Highlight {
                    max_chars,
                    pre_tag: tags.0.into(),
                    post_tag: tags.1.into(),
                    ..lsmsearch::Highlight::default()
                }),
                explain: true,
                ..SearchOptions::default()
            };
            let got = index.search_fts(q, &opts).await.unwrap();
            assert_eq!(
                names(&got),
                ["id", "_score", "year", "_highlight_body", "_explanation"],
                "{q}: the text read for snippets is not returned"
            );
            let rows = keys(&got);
            assert_eq!(rows.len(), 30.min(reference.search(q, false).len()), "{q}");
            let scores = column_of(&got, "_score");
            let mut i = 0;
            for b in &got {
                let h = b
                    .column_by_name("_highlight_body")
                    .unwrap()
                    .as_string::<i32>();
                let e = b.column_by_name("_explanation").unwrap().as_string::<i32>();
                for j in 0..b.num_rows() {
                    let key = &rows[i];
                    let want = reference.snippet(q, 0, &model[key].body, max_chars, tags);
                    let got_snippet = h.is_valid(j).then(|| h.value(j).to_string());
                    assert_eq!(got_snippet, want, "{q}: {key}'s snippet");
                    let ours: serde_json::Value = serde_json::from_str(e.value(j)).unwrap();
                    let value = ours["value"].as_f64().unwrap();
                    assert!(
                        (value - scores[i]).abs() <= 1e-5 * scores[i].abs().max(1.0),
                        "{q}: {key} explained as {value}, scored {}",
                        scores[i]
                    );
                    let theirs = reference.explain(q, key).unwrap();
                    assert!(
                        same_explanation(&ours, &theirs),
                        "{q}: {key}: {ours} against {theirs}"
                    );
                    i += 1;
                }
            }
        }
    }
    // Bad input: a highlighted column that is no text column, a snippet of 0 characters.
    for (h, what) in [
        (
            lsmsearch::Highlight {
                columns: Some(vec!["year".into()]),
                ..lsmsearch::Highlight::default()
            },
            "year",
        ),
        (
            lsmsearch::Highlight {
                max_chars: 0,
                ..lsmsearch::Highlight::default()
            },
            "max_chars",
        ),
    ] {
        let opts = SearchOptions {
            highlight: Some(h),
            ..SearchOptions::default()
        };
        let e = index.search_fts("version", &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
        assert!(e.message().contains(what), "{e}");
    }
}
