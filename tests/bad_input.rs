//! Every kind of bad input gets a clear `Invalid` error naming what was wrong, and leaves the
//! index exactly as it was (same live rows, same sequence number, same WAL) and usable.

mod common;

use arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int64Array, ListArray, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Float32Type, Schema};
use common::*;
use lsmsearch::{ErrorKind, Index, Key, ScanOptions};
use std::sync::Arc;

fn vectors(dim: usize, values: Vec<f32>) -> ArrayRef {
    Arc::new(
        FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            dim as i32,
            Arc::new(Float32Array::from(values)),
            None,
        )
        .unwrap(),
    )
}

fn custom(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap()
}

fn ids(v: Vec<Option<&str>>) -> ArrayRef {
    Arc::new(StringArray::from(v))
}

async fn assert_rejected(index: &Index, batch: RecordBatch, must_mention: &[&str]) {
    let before = live(index).await;
    let stats = index.stats();
    let e = index.append(&batch).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    for m in must_mention {
        assert!(
            e.to_string().contains(m),
            "error '{e}' should mention '{m}'"
        );
    }
    assert_eq!(
        live(index).await,
        before,
        "a rejected batch changed the rows"
    );
    let after = index.stats();
    assert_eq!(
        after.last_seq, stats.last_seq,
        "a rejected batch took sequence numbers"
    );
    assert_eq!(
        after.wal_objects_pending, stats.wal_objects_pending,
        "a rejected batch reached the WAL"
    );
    assert_eq!(after.memtable_rows, stats.memtable_rows);
}

#[tokio::test]
async fn bad_batches_are_rejected_and_change_nothing() {
    let s = schema();
    let index = Index::create(memory(), s.clone(), small_settings())
        .await
        .unwrap();
    index
        .append(&batch(&s, &[Row::new("ok", 1)]))
        .await
        .unwrap();
    let good_vec = || vectors(4, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);

    // Wrong column type.
    assert_rejected(
        &index,
        custom(vec![
            ("id", ids(vec![Some("x"), Some("y")])),
            ("body", Arc::new(Int64Array::from(vec![1, 2]))),
            ("emb", good_vec()),
        ]),
        &["body", "Int64", "Utf8"],
    )
    .await;
    // Missing primary key column.
    assert_rejected(
        &index,
        custom(vec![
            ("body", ids(vec![Some("x"), Some("y")])),
            ("emb", good_vec()),
        ]),
        &["primary-key", "id"],
    )
    .await;
    // Null primary key.
    assert_rejected(
        &index,
        custom(vec![
            ("id", ids(vec![Some("x"), None])),
            ("emb", good_vec()),
        ]),
        &["id", "null", "row 1"],
    )
    .await;
    // Missing vector column.
    assert_rejected(
        &index,
        custom(vec![("id", ids(vec![Some("x"), Some("y")]))]),
        &["vector", "emb"],
    )
    .await;
    // Wrong vector dimension.
    assert_rejected(
        &index,
        custom(vec![
            ("id", ids(vec![Some("x"), Some("y")])),
            ("emb", vectors(3, vec![0.0; 6])),
        ]),
        &["emb", "dimension 3", "4"],
    )
    .await;
    // Wrong dimension in one row of a list column.
    let list = ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
        Some(vec![Some(1.0), Some(2.0), Some(3.0), Some(4.0)]),
        Some(vec![Some(1.0), Some(2.0)]),
    ]);
    assert_rejected(
        &index,
        custom(vec![
            ("id", ids(vec![Some("x"), Some("y")])),
            ("emb", Arc::new(list)),
        ]),
        &["emb", "row 1", "2 components"],
    )
    .await;
    // NaN and infinite components.
    assert_rejected(
        &index,
        custom(vec![
            ("id", ids(vec![Some("x"), Some("y")])),
            (
                "emb",
                vectors(4, vec![0.0, 1.0, 2.0, 3.0, 4.0, f32::NAN, 6.0, 7.0]),
            ),
        ]),
        &["emb", "NaN", "row 1", "component 1"],
    )
    .await;
    assert_rejected(
        &index,
        custom(vec![
            ("id", ids(vec![Some("x"), Some("y")])),
            (
                "emb",
                vectors(4, vec![f32::INFINITY, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]),
            ),
        ]),
        &["emb", "inf", "row 0"],
    )
    .await;
    // Unknown column.
    assert_rejected(
        &index,
        custom(vec![
            ("id", ids(vec![Some("x"), Some("y")])),
            ("emb", good_vec()),
            ("colour", ids(vec![Some("red"), Some("blue")])),
        ]),
        &["unknown column", "colour"],
    )
    .await;
    // Empty batch.
    assert_rejected(
        &index,
        custom(vec![("id", ids(vec![])), ("emb", vectors(4, vec![]))]),
        &["empty batch"],
    )
    .await;

    // Deletes with a key of the wrong type, or none at all.
    let e = index.delete(&[Key::I64(3)]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    let e = index.delete(&[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    // A malformed filter.
    let e = index
        .scan(ScanOptions {
            filter: Some("year >>= 3".into()),
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let e = index
        .scan(ScanOptions {
            filter: Some("colour = 'red'".into()),
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert!(e.to_string().contains("colour"), "{e}");

    // Still usable, and a partial batch (absent payload) is fine.
    let ok = custom(vec![
        ("id", ids(vec![Some("z")])),
        ("emb", vectors(4, vec![1.0; 4])),
    ]);
    index.append(&ok).await.unwrap();
    let m = live(&index).await;
    assert_eq!(m.keys().cloned().collect::<Vec<_>>(), vec!["ok", "z"]);
    index.flush().await.unwrap();
    assert_eq!(live(&index).await, m);
}

#[tokio::test]
async fn bad_schemas_are_rejected() {
    use lsmsearch::IndexSchema;
    for (json, mention) in [
        (r#"{"primary_key": "id", "text": ["id"]}"#, "twice"),
        (r#"{"primary_key": "_seq"}"#, "reserved"),
        (
            r#"{"primary_key": "id", "vector": {"column": "v", "dim": 0, "metric": "l2"}}"#,
            "dimension",
        ),
        (
            r#"{"primary_key": "id", "vector": {"column": "v", "dim": 3, "metric": "manhattan"}}"#,
            "manhattan",
        ),
        (r#"{"text": ["a"]}"#, "primary_key"),
    ] {
        let e = IndexSchema::from_json(json).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid);
        assert!(
            e.to_string().contains(mention),
            "{e} should mention {mention}"
        );
    }
}

#[tokio::test]
async fn integer_keys_are_checked() {
    use lsmsearch::IndexSchema;
    let s = IndexSchema::from_json(
        r#"{"primary_key": "n", "primary_key_type": "int64", "text": ["t"]}"#,
    )
    .unwrap();
    let index = Index::create(memory(), s, small_settings()).await.unwrap();
    let good = custom(vec![
        ("n", Arc::new(Int64Array::from(vec![1, 2, 1]))),
        ("t", ids(vec![Some("a"), Some("b"), Some("c")])),
    ]);
    index.append(&good).await.unwrap();
    let rows = index.scan(ScanOptions::default()).await.unwrap();
    assert_eq!(
        rows.iter().map(|b| b.num_rows()).sum::<usize>(),
        2,
        "last row of a key wins"
    );
    let bad = custom(vec![("n", ids(vec![Some("1")]))]);
    let e = index.append(&bad).await.unwrap_err();
    assert!(e.to_string().contains("'n'"), "{e}");
    index.delete(&[Key::I64(1)]).await.unwrap();
    let rows = index.scan(ScanOptions::default()).await.unwrap();
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
}
