//! The bad-input matrix: every kind of bad input, through the API (append, delete, full-text,
//! vector and filtered search, scan, settings, schema JSON) and the command line (input files,
//! keys, queries), gets a clear `Invalid` error naming what was wrong, leaves every byte of the
//! index as it was, and the index stays usable. Nothing aborts or panics.

mod common;

use arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int64Array, ListArray, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Float32Type, Schema};
use common::*;
use lsmsearch::{
    Error, ErrorKind, Index, IndexSchema, Key, Location, ScanOptions, SearchOptions, Settings,
    VectorSearchOptions,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
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

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let name = p.strip_prefix(dir).unwrap().display().to_string();
                out.insert(name, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

struct Matrix {
    dir: tempfile::TempDir,
    cases: usize,
}

impl Matrix {
    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn location(&self) -> Location {
        Location::parse(&self.root().display().to_string()).unwrap()
    }

    /// One case: `outcome` must be an `Invalid` error mentioning every word of `mention`,
    /// and the index bytes are what they were before `outcome` was computed (`before`).
    fn check(
        &mut self,
        case: &str,
        before: &BTreeMap<String, Vec<u8>>,
        outcome: Result<(), Error>,
        mention: &[&str],
    ) {
        let e = outcome.expect_err(case);
        assert_eq!(e.kind(), ErrorKind::Invalid, "{case}: {e}");
        for m in mention {
            assert!(
                e.to_string().contains(m),
                "{case}: '{e}' should mention '{m}'"
            );
        }
        assert!(
            snapshot(self.root()) == *before,
            "{case}: the index bytes changed"
        );
        self.cases += 1;
    }

    /// A command-line case: a non-zero exit (not a signal, not a panic) whose message mentions
    /// every word of `mention`, and the index bytes unchanged.
    fn cli(&mut self, case: &str, args: &[&str], mention: &[&str]) {
        let before = snapshot(self.root());
        let out = Command::new(env!("CARGO_BIN_EXE_lsmsearch"))
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code().is_some_and(|c| c != 0),
            "{case}: exit {:?}, stderr {stderr}",
            out.status
        );
        assert!(!stderr.contains("panicked"), "{case}: {stderr}");
        for m in mention {
            assert!(
                stderr.contains(m),
                "{case}: '{stderr}' should mention '{m}'"
            );
        }
        assert!(
            snapshot(self.root()) == before,
            "{case}: the index bytes changed"
        );
        self.cases += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bad_input_matrix() {
    let s = schema();
    let mut m = Matrix {
        dir: tempfile::tempdir().unwrap(),
        cases: 0,
    };
    let index = Index::create(m.location(), s.clone(), small_settings())
        .await
        .unwrap();
    index
        .append(&batch(&s, &[Row::new("a", 1), Row::new("b", 2)]))
        .await
        .unwrap();
    index.flush().await.unwrap();
    index.append(&batch(&s, &[Row::new("c", 3)])).await.unwrap();
    let rows_before = live(&index).await;
    let stats = index.stats();
    let good_vec = || vectors(4, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let snap = |m: &Matrix| snapshot(m.root());

    // Append.
    let appends: Vec<(&str, RecordBatch, &[&str])> = vec![
        (
            "append: wrong column type",
            custom(vec![
                ("id", ids(vec![Some("x"), Some("y")])),
                ("body", Arc::new(Int64Array::from(vec![1, 2]))),
                ("emb", good_vec()),
            ]),
            &["body", "Int64", "Utf8"],
        ),
        (
            "append: no primary-key column",
            custom(vec![
                ("body", ids(vec![Some("x"), Some("y")])),
                ("emb", good_vec()),
            ]),
            &["primary-key", "id"],
        ),
        (
            "append: null key",
            custom(vec![
                ("id", ids(vec![Some("x"), None])),
                ("emb", good_vec()),
            ]),
            &["id", "null", "row 1"],
        ),
        (
            "append: no vector column",
            custom(vec![("id", ids(vec![Some("x"), Some("y")]))]),
            &["vector", "emb"],
        ),
        (
            "append: wrong vector dimension",
            custom(vec![
                ("id", ids(vec![Some("x"), Some("y")])),
                ("emb", vectors(3, vec![0.0; 6])),
            ]),
            &["emb", "dimension 3", "4"],
        ),
        (
            "append: one list row of the wrong dimension",
            custom(vec![
                ("id", ids(vec![Some("x"), Some("y")])),
                (
                    "emb",
                    Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
                        Some(vec![Some(1.0), Some(2.0), Some(3.0), Some(4.0)]),
                        Some(vec![Some(1.0), Some(2.0)]),
                    ])),
                ),
            ]),
            &["emb", "row 1", "2 components"],
        ),
        (
            "append: NaN component",
            custom(vec![
                ("id", ids(vec![Some("x"), Some("y")])),
                (
                    "emb",
                    vectors(4, vec![0.0, 1.0, 2.0, 3.0, 4.0, f32::NAN, 6.0, 7.0]),
                ),
            ]),
            &["emb", "NaN", "row 1", "component 1"],
        ),
        (
            "append: infinite component",
            custom(vec![
                ("id", ids(vec![Some("x"), Some("y")])),
                (
                    "emb",
                    vectors(4, vec![f32::INFINITY, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]),
                ),
            ]),
            &["emb", "inf", "row 0"],
        ),
        (
            "append: unknown column",
            custom(vec![
                ("id", ids(vec![Some("x"), Some("y")])),
                ("emb", good_vec()),
                ("colour", ids(vec![Some("red"), Some("blue")])),
            ]),
            &["unknown column", "colour"],
        ),
        (
            "append: empty batch",
            custom(vec![("id", ids(vec![])), ("emb", vectors(4, vec![]))]),
            &["empty batch"],
        ),
    ];
    for (case, b, mention) in appends {
        let before = snap(&m);
        let r = index.append(&b).await.map(|_| ());
        m.check(case, &before, r, mention);
    }

    // Delete.
    let before = snap(&m);
    let r = index.delete(&[Key::I64(3)]).await.map(|_| ());
    m.check("delete: key of the wrong type", &before, r, &["key"]);
    let r = index.delete(&[]).await.map(|_| ());
    m.check("delete: no keys", &before, r, &["key"]);

    // Full-text search.
    let fts = |q: &'static str, filter: Option<&'static str>| {
        let index = &index;
        async move {
            let opts = SearchOptions {
                filter: filter.map(str::to_string),
                ..Default::default()
            };
            index.search_fts(q, &opts).await.map(|_| ())
        }
    };
    let r = fts("body AND (", None).await;
    m.check("fts: malformed query", &before, r, &["query"]);
    let r = fts("colour:red", None).await;
    m.check("fts: unknown field", &before, r, &["colour"]);
    let r = fts("_row:*", None).await;
    m.check("fts: the internal row field", &before, r, &["_row"]);
    let r = fts("body", Some("year >>= 3")).await;
    m.check("fts: malformed filter", &before, r, &["filter"]);
    let r = fts("body", Some("CAST(body AS BIGINT) > 1")).await;
    m.check("fts: filter failing on the data", &before, r, &["filter"]);

    // Vector search.
    let vector = |q: Vec<f32>, filter: Option<&'static str>| {
        let index = &index;
        async move {
            let opts = VectorSearchOptions {
                filter: filter.map(str::to_string),
                ..Default::default()
            };
            index.search_vector(&q, &opts).await.map(|_| ())
        }
    };
    let r = vector(vec![0.0; 3], None).await;
    m.check(
        "vector: wrong query dimension",
        &before,
        r,
        &["dimension", "3", "4"],
    );
    let r = vector(vec![0.0, f32::NAN, 0.0, 0.0], None).await;
    m.check("vector: NaN in the query", &before, r, &["NaN"]);
    let r = vector(vec![0.0; 4], Some("colour = 'red'")).await;
    m.check(
        "vector: filter on an unknown column",
        &before,
        r,
        &["colour"],
    );

    // Scan.
    let r = index
        .scan(ScanOptions {
            filter: Some("year >>= 3".into()),
        })
        .await
        .map(|_| ());
    m.check("scan: malformed filter", &before, r, &["filter"]);
    let r = index
        .scan(ScanOptions {
            filter: Some("colour = 'red'".into()),
        })
        .await
        .map(|_| ());
    m.check("scan: filter on an unknown column", &before, r, &["colour"]);

    // Settings.
    let bad = Settings {
        memtable_max_rows: 0,
        ..Settings::default()
    };
    let r = Index::open(m.location(), bad).await.map(|_| ());
    m.check(
        "settings: zero memtable rows (open)",
        &before,
        r,
        &["memtable_max_rows"],
    );
    let bad = Settings {
        hnsw_m: 1,
        ..Settings::default()
    };
    let r = Index::open_read_only(m.location(), bad).await.map(|_| ());
    m.check(
        "settings: hnsw_m of 1 (read-only open)",
        &before,
        r,
        &["hnsw_m"],
    );

    // Schema JSON.
    for (case, json, mention) in [
        (
            "schema: a column twice",
            r#"{"primary_key": "id", "text": ["id"]}"#,
            "twice",
        ),
        (
            "schema: a reserved name",
            r#"{"primary_key": "_seq"}"#,
            "reserved",
        ),
        (
            "schema: dimension 0",
            r#"{"primary_key": "id", "vector": {"column": "v", "dim": 0, "metric": "l2"}}"#,
            "dimension",
        ),
        (
            "schema: unknown metric",
            r#"{"primary_key": "id", "vector": {"column": "v", "dim": 3, "metric": "manhattan"}}"#,
            "manhattan",
        ),
        (
            "schema: no primary key",
            r#"{"text": ["a"]}"#,
            "primary_key",
        ),
        ("schema: not JSON", r#"{"primary_key": "id""#, "schema"),
    ] {
        let r = IndexSchema::from_json(json).map(|_| ());
        m.check(case, &before, r, &[mention]);
    }

    // The command line: input files and arguments.
    let files = tempfile::tempdir().unwrap();
    let file = |name: &str, bytes: &[u8]| {
        let p = files.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p.display().to_string()
    };
    let loc = m.root().display().to_string();
    let csv = file("rows.csv", b"id,body\nx,y\n");
    m.cli(
        "cli: unknown file type",
        &["ingest", &loc, &csv],
        &["rows.csv", "unknown file type"],
    );
    let not_json = file("bad.jsonl", b"{\"id\": \"x\", \"emb\": [1,2,3,4]\n");
    m.cli(
        "cli: malformed JSON line",
        &["ingest", &loc, &not_json],
        &["bad.jsonl"],
    );
    let short = file("short.jsonl", b"{\"id\": \"x\", \"emb\": [1, 2]}\n");
    m.cli(
        "cli: wrong dimension in a file",
        &["ingest", &loc, &short],
        &["short.jsonl", "emb"],
    );
    let mut crafted = b"ARROW1\0\0".to_vec();
    crafted.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xf0, 0xff, 0xff, 0x7f, 1, 2, 3]);
    let crafted = file("crafted.arrow", &crafted);
    m.cli(
        "cli: crafted Arrow IPC lengths",
        &["ingest", &loc, &crafted],
        &["crafted.arrow"],
    );
    m.cli(
        "cli: an unknown setting",
        &["scan", &loc, "--settings", r#"{"memtable_rows": 10}"#],
        &["settings", "memtable_rows"],
    );
    m.cli(
        "cli: a setting out of range",
        &["stats", &loc, "--settings", r#"{"memtable_max_rows": 0}"#],
        &["memtable_max_rows"],
    );
    m.cli(
        "cli: settings that are not JSON",
        &["flush", &loc, "--settings", "memtable_max_rows=10"],
        &["settings"],
    );
    let parquet = file("garbage.parquet", b"PAR1 this is not a parquet file PAR1");
    m.cli(
        "cli: garbage Parquet",
        &["ingest", &loc, &parquet],
        &["garbage.parquet"],
    );
    // A stream announcing 2^40 rows of a zero-width (Null) column: nothing may be sized by it.
    let nulls = {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Null, true)]));
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(arrow::array::NullArray::new(12345))],
        )
        .unwrap();
        let mut out = Vec::new();
        {
            let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut out, &schema).unwrap();
            w.write(&b).unwrap();
            w.finish().unwrap();
        }
        let from = 12345i64.to_le_bytes();
        let to = (1i64 << 40).to_le_bytes();
        let mut i = 0;
        while i + 8 <= out.len() {
            if out[i..i + 8] == from {
                out[i..i + 8].copy_from_slice(&to);
            }
            i += 1;
        }
        out
    };
    let nulls = file("nulls.arrows", &nulls);
    m.cli(
        "cli: 2^40 zero-width rows",
        &["ingest", &loc, &nulls],
        &["nulls.arrows"],
    );
    let ok_jsonl = file("ok.jsonl", b"{\"id\": \"x\", \"emb\": [1, 2, 3, 4]}\n");
    m.cli(
        "cli: a batch size no buffer may have",
        &["ingest", &loc, &ok_jsonl, "--batch-size", "10000000000"],
        &["batch size"],
    );
    let missing = files.path().join("missing.jsonl").display().to_string();
    m.cli(
        "cli: missing file",
        &["ingest", &loc, &missing],
        &["missing.jsonl"],
    );
    m.cli(
        "cli: malformed query",
        &["search", &loc, "--fts", "body AND ("],
        &["query"],
    );
    m.cli(
        "cli: query vector that is not JSON",
        &["search", &loc, "--vector", "[0.1, oops]"],
        &["vector"],
    );
    m.cli(
        "cli: an unknown column",
        &["search", &loc, "--fts", "body", "--columns", "body,colour"],
        &["colour"],
    );
    m.cli(
        "cli: a page past the bound",
        &["search", &loc, "--fts", "body", "--offset", "10000"],
        &["offset + k"],
    );
    m.cli(
        "cli: hybrid weights summing to 0",
        &[
            "search",
            &loc,
            "--fts",
            "body",
            "--vector",
            "[1, 2, 3, 4]",
            "--fusion",
            "weighted",
            "--weights",
            "0,0",
        ],
        &["sum to 0"],
    );
    m.cli(
        "cli: hybrid weights that are not two",
        &[
            "search",
            &loc,
            "--fts",
            "body",
            "--vector",
            "[1, 2, 3, 4]",
            "--fusion",
            "weighted",
            "--weights",
            "1",
        ],
        &["two numbers"],
    );
    m.cli(
        "cli: a hybrid flag on a full-text search",
        &["search", &loc, "--fts", "body", "--candidates", "20"],
        &["hybrid"],
    );
    m.cli(
        "cli: the rank constant with weighted fusion",
        &[
            "search",
            &loc,
            "--fts",
            "body",
            "--vector",
            "[1, 2, 3, 4]",
            "--fusion",
            "weighted",
            "--rrf-k",
            "10",
        ],
        &["--rrf-k"],
    );
    m.cli(
        "cli: a NaN minimum score",
        &["search", &loc, "--fts", "body", "--min-score", "NaN"],
        &["min_score"],
    );
    m.cli(
        "cli: a negative radius",
        &[
            "search",
            &loc,
            "--vector",
            "[1, 2, 3, 4]",
            "--max-distance",
            "-1",
        ],
        &["max_distance"],
    );
    m.cli(
        "cli: a timeout of 0",
        &["search", &loc, "--fts", "body", "--timeout-ms", "0"],
        &["timeout"],
    );
    m.cli(
        "cli: malformed SQL",
        &["sql", &loc, "SELECT FROM WHERE"],
        &["SQL"],
    );
    m.cli(
        "cli: SQL naming a column the index lacks",
        &["sql", &loc, "SELECT nope FROM docs"],
        &["nope"],
    );
    m.cli(
        "cli: highlights of a vector search",
        &["search", &loc, "--vector", "[1, 2, 3, 4]", "--highlight"],
        &["--highlight"],
    );
    m.cli(
        "cli: one highlight marker",
        &[
            "search",
            &loc,
            "--fts",
            "body",
            "--highlight",
            "--highlight-tags",
            "[",
        ],
        &["--highlight-tags"],
    );
    m.cli(
        "cli: a count of a vector search",
        &["search", &loc, "--vector", "[1, 2, 3, 4]", "--count"],
        &["--count"],
    );
    assert!(m.cases >= 25, "only {} cases", m.cases);
    println!(
        "{} bad inputs rejected, the index unchanged by each",
        m.cases
    );

    // Still usable: nothing changed, a partial batch (absent payload) is fine, a flush and a
    // reopen keep everything.
    assert_eq!(live(&index).await, rows_before);
    assert_eq!(index.stats().last_seq, stats.last_seq);
    let ok = custom(vec![
        ("id", ids(vec![Some("z")])),
        ("emb", vectors(4, vec![1.0; 4])),
    ]);
    index.append(&ok).await.unwrap();
    let hits = index
        .search_fts("body", &SearchOptions::default())
        .await
        .unwrap();
    assert_eq!(hits.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    index.flush().await.unwrap();
    let expect = live(&index).await;
    assert_eq!(expect.len(), 4);
    index.close().await.unwrap();
    let reopened = Index::open(m.location(), small_settings()).await.unwrap();
    assert_eq!(live(&reopened).await, expect);
}

#[tokio::test]
async fn integer_keys_are_checked() {
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
