//! Helpers shared by the integration tests.
#![allow(dead_code)]

use arrow::array::{
    Array, AsArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Int64Type};
use lsmsearch::{Index, IndexSchema, Location, ScanOptions, Settings};
use std::collections::BTreeMap;
use std::sync::Arc;

pub mod fashion;
pub mod faulty;
pub mod fts;
pub mod fusion;
pub mod scenarios;
pub mod sim;

pub const DIM: usize = 4;

pub fn schema() -> IndexSchema {
    IndexSchema::from_json(
        r#"{"primary_key": "id", "text": ["body"],
            "vector": {"column": "emb", "dim": 4, "metric": "l2"},
            "payload": [{"name": "year", "type": "int64"}]}"#,
    )
    .unwrap()
}

/// One row of the test schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: String,
    pub body: String,
    pub year: i64,
    pub emb: [f32; DIM],
}

impl Row {
    pub fn new(id: impl Into<String>, version: i64) -> Row {
        let id = id.into();
        let x = version as f32;
        Row {
            body: format!("body of {id} version {version}"),
            year: version,
            emb: [x, x + 1.0, -x, 0.5],
            id,
        }
    }
}

pub fn batch(schema: &IndexSchema, rows: &[Row]) -> RecordBatch {
    let values: Vec<f32> = rows.iter().flat_map(|r| r.emb).collect();
    let emb = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        DIM as i32,
        Arc::new(Float32Array::from(values)),
        None,
    )
    .unwrap();
    RecordBatch::try_new(
        schema.arrow_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.id.clone()),
            )),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.body.clone()),
            )),
            Arc::new(emb),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.year))),
        ],
    )
    .unwrap()
}

/// The live rows, keyed by id.
pub type Model = BTreeMap<String, Row>;

pub fn to_model(batches: &[RecordBatch]) -> Model {
    let mut m = Model::new();
    for b in batches {
        let ids = b.column(0).as_string::<i32>();
        let bodies = b.column(1).as_string::<i32>();
        let embs = b.column(2).as_fixed_size_list();
        let years = b.column(3).as_primitive::<Int64Type>();
        for r in 0..b.num_rows() {
            let v = embs.value(r);
            let v = v.as_primitive::<arrow::datatypes::Float32Type>();
            let row = Row {
                id: ids.value(r).to_string(),
                body: bodies.value(r).to_string(),
                year: if years.is_null(r) { 0 } else { years.value(r) },
                emb: [v.value(0), v.value(1), v.value(2), v.value(3)],
            };
            assert!(
                m.insert(row.id.clone(), row).is_none(),
                "a key was returned twice by a scan"
            );
        }
    }
    m
}

pub async fn live(index: &Index) -> Model {
    to_model(&index.scan(ScanOptions::default()).await.unwrap())
}

pub fn small_settings() -> Settings {
    Settings {
        memtable_max_rows: 50,
        wal_buffer_interval_ms: 20,
        ..Settings::default()
    }
}

pub fn memory() -> Location {
    Location::from_store(Arc::new(object_store::memory::InMemory::new()), "idx")
}

/// The S3 location for tests, when the environment provides a server (see `.ci/s3-server.sh`).
pub fn s3_location(test: &str) -> Option<String> {
    let base = std::env::var("LSMSEARCH_TEST_S3").ok()?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    Some(format!("{}/{test}-{nanos}", base.trim_end_matches('/')))
}

/// An index of three generations and a memtable (keys updated across them), its generations
/// read by range (their vectors too), and the live rows.
pub async fn spread() -> (Index, Model) {
    let s = schema();
    let index = Index::create(
        memory(),
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
