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

/// An index of three generations and a memtable (keys updated across them), its generations
/// read by range (their vectors too), and the live rows.
async fn spread() -> (Index, Model) {
    let s = schema();
    let index = Index::create(
        Location::from_store(Arc::new(object_store::memory::InMemory::new()), "idx"),
        s.clone(),
        Settings {
            memtable_max_rows: 10_000,
            vector_exact_below: 16,
            compaction: false,
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    let mut model = Model::new();
    for g in 0..4i64 {
        let rows: Vec<Row> = (0..300)
            .map(|i| Row::new(format!("k{:04}", g * 200 + i), g * 10 + i % 7))
            .collect();
        index.append(&batch(&s, &rows)).await.unwrap();
        for r in rows {
            model.insert(r.id.clone(), r);
        }
        if g < 3 {
            index.flush().await.unwrap();
        }
    }
    assert_eq!(index.stats().generations.len(), 3);
    (index, model)
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
    let (index, model) = spread().await;
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
    let (index, _) = spread().await;
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
    let (index, model) = spread().await;
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
    let (index, _) = spread().await;
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
    let (index, model) = spread().await;
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
