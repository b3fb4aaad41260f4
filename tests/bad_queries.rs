//! Queries at the edges: a huge `k` or `ef` returns every match without aborting the process,
//! the internal row-number field cannot be queried, and a filter that fails on the data is the
//! caller's error (`Invalid`), not an internal one.

mod common;

use common::*;
use lsmsearch::{ErrorKind, Index, SearchOptions, VectorSearchOptions};

async fn three_rows() -> Index {
    let s = schema();
    let index = Index::create(memory(), s.clone(), small_settings())
        .await
        .unwrap();
    index
        .append(&batch(&s, &[Row::new("a", 1), Row::new("b", 2)]))
        .await
        .unwrap();
    index.flush().await.unwrap();
    index.append(&batch(&s, &[Row::new("c", 3)])).await.unwrap();
    index
}

fn rows(b: &[arrow::array::RecordBatch]) -> usize {
    b.iter().map(|b| b.num_rows()).sum()
}

#[tokio::test]
async fn a_huge_k_or_ef_returns_every_match() {
    let index = three_rows().await;
    for k in [1usize << 40, usize::MAX] {
        let hits = index
            .search_fts("body", &SearchOptions::with_k(k))
            .await
            .unwrap();
        assert_eq!(rows(&hits), 3, "full-text k = {k}");
        for exact in [false, true] {
            let opts = VectorSearchOptions {
                k,
                ef: Some(k),
                exact,
                ..Default::default()
            };
            let hits = index.search_vector(&[0.0; DIM], &opts).await.unwrap();
            assert_eq!(rows(&hits), 3, "vector k = {k}, exact = {exact}");
        }
    }
}

#[tokio::test]
async fn the_row_number_field_cannot_be_queried() {
    let index = three_rows().await;
    for q in ["_row:[0 TO 5]", "_row:*", "_row:1", "body AND _row:0"] {
        let e = index
            .search_fts(q, &SearchOptions::default())
            .await
            .expect_err(q);
        assert_eq!(e.kind(), ErrorKind::Invalid, "{q}: {e}");
        assert!(e.message().contains("_row"), "{q}: {e}");
    }
}

#[tokio::test]
async fn a_filter_failing_on_the_data_is_invalid() {
    let index = three_rows().await;
    let filter = Some("CAST(body AS BIGINT) > 1".to_string());
    let e = index
        .search_fts(
            "body",
            &SearchOptions {
                filter: filter.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let e = index
        .search_vector(
            &[0.0; DIM],
            &VectorSearchOptions {
                filter,
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}
