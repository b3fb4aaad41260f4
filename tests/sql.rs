//! SQL over the live index: the table's scan (projection and filter pushed in) equals `scan`,
//! the search table functions equal the searches, and their rows join, filter and group.

mod common;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, Int64Type};
use common::Model;
use datafusion::prelude::SessionContext;
use lsmsearch::{
    ErrorKind, HybridSearchOptions, Index, ScanOptions, SearchOptions, VectorSearchOptions,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// [`common::spread`] with keys deleted across its sources, its live rows, and a context
/// where it is the table `docs`.
async fn docs() -> (Arc<Index>, Model, SessionContext) {
    let (index, mut model) = common::spread().await;
    for id in ["k0003", "k0250", "k0420", "k0610", "k0777"] {
        index.delete(&[lsmsearch::Key::from(id)]).await.unwrap();
        model.remove(id);
    }
    let index = Arc::new(index);
    let ctx = SessionContext::new();
    lsmsearch::sql::register(&ctx, "docs", index.clone()).unwrap();
    (index, model, ctx)
}

async fn sql(ctx: &SessionContext, statement: &str) -> Vec<RecordBatch> {
    lsmsearch::sql::query(ctx, statement)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"))
}

/// Each row as (key, value of `column` as text), in order.
fn rows_of(batches: &[RecordBatch], column: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for b in batches {
        let keys = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8).unwrap();
        let keys = keys.as_string::<i32>();
        let values = b
            .column_by_name(column)
            .unwrap_or_else(|| panic!("{column}"));
        let values = arrow::compute::cast(values, &arrow::datatypes::DataType::Utf8).unwrap();
        let values = values.as_string::<i32>();
        for i in 0..b.num_rows() {
            let v = match values.is_valid(i) {
                true => values.value(i).to_string(),
                false => "null".to_string(),
            };
            out.push((keys.value(i).to_string(), v));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_scans_the_live_rows_with_its_filter_and_columns_pushed_in() {
    let (index, model, ctx) = docs().await;
    // A filtered SELECT equals a scan with the same filter (as sets: both read newest source
    // first, but SQL promises no order without ORDER BY).
    for filter in [
        "year >= 25",
        "year = 3 OR body LIKE '%k0150%'",
        "id > 'k0700'",
    ] {
        let got = sql(&ctx, &format!("SELECT id, year FROM docs WHERE {filter}")).await;
        let want = index
            .scan(ScanOptions {
                filter: Some(filter.into()),
            })
            .await
            .unwrap();
        let mut got = rows_of(&got, "year");
        let mut want = rows_of(&want, "year");
        got.sort();
        want.sort();
        assert_eq!(got, want, "{filter}");
        assert!(!got.is_empty(), "{filter}");
    }
    let all = sql(&ctx, "SELECT count(*) AS n FROM docs").await;
    let n = all[0].column(0).as_primitive::<Int64Type>().value(0);
    assert_eq!(n as usize, model.len());
    let ordered = sql(&ctx, "SELECT id, body FROM docs ORDER BY id LIMIT 3").await;
    let want: Vec<(String, String)> = model
        .values()
        .take(3)
        .map(|r| (r.id.clone(), r.body.clone()))
        .collect();
    assert_eq!(rows_of(&ordered, "body"), want);
    // EXPLAIN shows the columns read and the filter applied by the scan itself.
    let plan = sql(&ctx, "EXPLAIN SELECT id FROM docs WHERE year > 5").await;
    let text = rows_of(&plan, "plan")
        .into_iter()
        .map(|r| r.1)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        text.contains("IndexScanExec: projection=[id], filter=docs.year > Int64(5)")
            || text.contains("IndexScanExec: projection=[id], filter=year > Int64(5)"),
        "{text}"
    );
    assert!(
        !text.contains("FilterExec"),
        "the filter is the scan's: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_functions_equal_the_searches() {
    let (index, _model, ctx) = docs().await;
    // fts(...) equals search_fts: keys, scores and columns, in order.
    let got = sql(&ctx, "SELECT * FROM fts('docs', 'version 13 OR k0150', 25)").await;
    let want = index
        .search_fts("version 13 OR k0150", &SearchOptions::with_k(25))
        .await
        .unwrap();
    for c in ["_score", "body", "year"] {
        assert_eq!(rows_of(&got, c), rows_of(&want, c), "fts {c}");
    }
    assert!(
        got[0].schema().column_with_name("emb").is_some(),
        "every column"
    );
    // With a filter, applied before the top k.
    let got = sql(
        &ctx,
        "SELECT id, _score FROM fts('docs', 'version', 10, 'year >= 31')",
    )
    .await;
    let opts = SearchOptions {
        filter: Some("year >= 31".into()),
        ..SearchOptions::with_k(10)
    };
    let want = index.search_fts("version", &opts).await.unwrap();
    assert_eq!(rows_of(&got, "_score"), rows_of(&want, "_score"));
    // knn(...) equals search_vector, the vector an array literal (negative numbers too).
    let got = sql(
        &ctx,
        "SELECT id, _distance, year FROM knn('docs', [13, 14, -13, 0.5], 12)",
    )
    .await;
    let want = index
        .search_vector(&[13.0, 14.0, -13.0, 0.5], &VectorSearchOptions::with_k(12))
        .await
        .unwrap();
    assert_eq!(rows_of(&got, "_distance"), rows_of(&want, "_distance"));
    assert_eq!(rows_of(&got, "year"), rows_of(&want, "year"));
    // hybrid(...) equals search_hybrid with its defaults.
    let got = sql(
        &ctx,
        "SELECT * FROM hybrid('docs', 'version 13', '[13, 14, -13, 0.5]', 8)",
    )
    .await;
    let want = index
        .search_hybrid(
            "version 13",
            &[13.0, 14.0, -13.0, 0.5],
            &HybridSearchOptions::with_k(8),
        )
        .await
        .unwrap();
    for c in ["_score", "_fts_rank", "_vector_rank", "year"] {
        assert_eq!(rows_of(&got, c), rows_of(&want, c), "hybrid {c}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_results_join_filter_and_group_in_sql() {
    let (index, model, ctx) = docs().await;
    // A facet count: the years of the top 1,000 full-text matches.
    let got = sql(
        &ctx,
        "SELECT year, count(*) AS n FROM fts('docs', 'version body', 1000) GROUP BY year ORDER BY year",
    )
    .await;
    let found = index
        .search_fts("version body", &SearchOptions::with_k(1000))
        .await
        .unwrap();
    let mut want: BTreeMap<i64, i64> = BTreeMap::new();
    for b in &found {
        let years = b
            .column_by_name("year")
            .unwrap()
            .as_primitive::<Int64Type>();
        for y in years.iter() {
            *want.entry(y.unwrap()).or_default() += 1;
        }
    }
    let mut facets: BTreeMap<i64, i64> = BTreeMap::new();
    for b in &got {
        let (y, n) = (
            b.column(0).as_primitive::<Int64Type>(),
            b.column(1).as_primitive::<Int64Type>(),
        );
        for i in 0..b.num_rows() {
            facets.insert(y.value(i), n.value(i));
        }
    }
    assert_eq!(facets, want);
    assert_eq!(want.values().sum::<i64>() as usize, model.len().min(1000));
    // A join with a table of the application's: labels of some keys.
    ctx.sql("CREATE TABLE labels (id VARCHAR, label VARCHAR) AS VALUES ('k0013', 'first'), ('k0213', 'second'), ('k9999', 'none')")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let got = sql(
        &ctx,
        "SELECT f.id, l.label, f._score FROM fts('docs', 'k0013 OR k0213 OR k0014', 10) f \
         JOIN labels l ON f.id = l.id ORDER BY f.id",
    )
    .await;
    let labels = rows_of(&got, "label");
    assert_eq!(
        labels,
        [
            ("k0013".to_string(), "first".to_string()),
            ("k0213".to_string(), "second".to_string())
        ]
    );
    let scores = got[0].column(2).as_primitive::<Float32Type>();
    assert!(scores.values().iter().all(|s| *s > 0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sql_is_an_error_naming_what_was_wrong() {
    let (index, model, ctx) = docs().await;
    let cases: &[(&str, &str)] = &[
        ("SELEC id FROM docs", "SELEC"),
        ("SELECT nope FROM docs", "nope"),
        ("SELECT * FROM fts('nowhere', 'x', 10)", "nowhere"),
        ("SELECT * FROM fts('docs', 'x', 0)", "k must be"),
        ("SELECT * FROM fts('docs', 'x')", "arguments"),
        ("SELECT * FROM fts('docs', 'nofield:x', 10)", "nofield"),
        ("SELECT * FROM knn('docs', [1, 2], 10)", "dimension"),
        ("SELECT * FROM knn('docs', 'not a vector', 10)", "vector"),
        ("SELECT * FROM fts('docs', 'x', 10, 'year >>> 3')", "filter"),
        (
            "SELECT * FROM fts('labels', 'x', 10)",
            "not an lsmsearch index",
        ),
    ];
    ctx.sql("CREATE TABLE labels (id VARCHAR) AS VALUES ('a')")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    for (statement, named) in cases {
        let e = lsmsearch::sql::query(&ctx, statement).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{statement}: {e}");
        assert!(
            e.message().to_lowercase().contains(&named.to_lowercase()),
            "{statement}: {e}"
        );
    }
    // Nothing changed.
    assert_eq!(common::live(&index).await, model);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_function_returns_every_row_whatever_the_batches_and_partitions() {
    // Small batches and several partitions: the search's rows come in many batches, which
    // DataFusion may spread over partitions under the search's own plan.
    let (index, _model, _) = docs().await;
    let config = datafusion::prelude::SessionConfig::new()
        .with_batch_size(4)
        .with_target_partitions(4);
    let ctx = SessionContext::new_with_config(config);
    lsmsearch::sql::register(&ctx, "docs", index.clone()).unwrap();
    for (statement, want) in [
        ("SELECT id, _score FROM fts('docs', 'version', 30)", 30),
        (
            "SELECT id, _distance FROM knn('docs', [1, 2, -1, 0.5], 25)",
            25,
        ),
    ] {
        let got = sql(&ctx, statement).await;
        assert_eq!(
            got.iter().map(|b| b.num_rows()).sum::<usize>(),
            want,
            "{statement}"
        );
    }
    let got = sql(&ctx, "SELECT id, _score FROM fts('docs', 'version 13', 30)").await;
    let want = index
        .search_fts("version 13", &SearchOptions::with_k(30))
        .await
        .unwrap();
    assert_eq!(rows_of(&got, "_score"), rows_of(&want, "_score"));
}
