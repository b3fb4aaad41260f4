//! Append many batches with updates and deletes, flush some, reopen (in a new process for the
//! local store): the live rows equal an in-memory "newest wins" model.

mod common;

use common::scenarios::workload;
use common::*;
use lsmsearch::{Index, Location, ScanOptions, Settings};

#[tokio::test]
async fn round_trip_memory_same_process() {
    let loc = memory();
    let mut model = Model::new();
    let index = Index::create(loc.clone(), schema(), small_settings())
        .await
        .unwrap();
    workload(&index, &mut model, 1, 200).await;
    assert_eq!(live(&index).await, model);
    assert!(
        !index.stats().generations.is_empty(),
        "the workload flushed"
    );
    index.close().await.unwrap();

    let reopened = Index::open(loc.clone(), small_settings()).await.unwrap();
    assert_eq!(live(&reopened).await, model, "after reopen");
    workload(&reopened, &mut model, 2, 100).await;
    reopened.close().await.unwrap();
    let ro = Index::open_read_only(loc, Settings::default())
        .await
        .unwrap();
    assert_eq!(
        to_model(&ro.scan(ScanOptions::default()).await.unwrap()),
        model
    );
}

#[tokio::test]
async fn round_trip_local_new_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    let location = path.display().to_string();
    let mut model = Model::new();
    {
        let index = Index::create(
            Location::parse(&location).unwrap(),
            schema(),
            small_settings(),
        )
        .await
        .unwrap();
        workload(&index, &mut model, 3, 250).await;
        index.close().await.unwrap();
    }
    // A new process reads it back.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lsmsearch"))
        .args(["scan", &location])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut seen = Model::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let emb: Vec<f32> = v["emb"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let row = Row {
            id: v["id"].as_str().unwrap().to_string(),
            body: v["body"].as_str().unwrap().to_string(),
            year: v["year"].as_i64().unwrap(),
            emb: [emb[0], emb[1], emb[2], emb[3]],
        };
        assert!(seen.insert(row.id.clone(), row).is_none(), "duplicate key");
    }
    assert_eq!(seen, model);

    // And a writer reopening it in this process continues from there.
    let index = Index::open(Location::parse(&location).unwrap(), small_settings())
        .await
        .unwrap();
    assert_eq!(live(&index).await, model);
    workload(&index, &mut model, 4, 50).await;
    index.close().await.unwrap();
    let ro = Index::open_read_only(Location::parse(&location).unwrap(), Settings::default())
        .await
        .unwrap();
    assert_eq!(
        to_model(&ro.scan(ScanOptions::default()).await.unwrap()),
        model
    );
}

#[tokio::test]
async fn read_only_handle_refreshes() {
    let loc = memory();
    let index = Index::create(loc.clone(), schema(), small_settings())
        .await
        .unwrap();
    let s = schema();
    index.append(&batch(&s, &[Row::new("a", 1)])).await.unwrap();
    index.flush().await.unwrap();
    let ro = Index::open_read_only(loc.clone(), Settings::default())
        .await
        .unwrap();
    assert_eq!(ro.stats().generations.len(), 1);
    index.append(&batch(&s, &[Row::new("b", 1)])).await.unwrap();
    index.flush().await.unwrap();
    index.append(&batch(&s, &[Row::new("c", 1)])).await.unwrap();
    assert_eq!(
        to_model(&ro.scan(ScanOptions::default()).await.unwrap()).len(),
        1
    );
    ro.refresh().await.unwrap();
    let m = to_model(&ro.scan(ScanOptions::default()).await.unwrap());
    assert_eq!(m.keys().cloned().collect::<Vec<_>>(), vec!["a", "b", "c"]);
    assert_eq!(ro.stats().generations.len(), 2);
}

#[tokio::test]
async fn scan_filter_equals_filtering_the_live_rows() {
    let loc = memory();
    let index = Index::create(loc, schema(), small_settings())
        .await
        .unwrap();
    let mut model = Model::new();
    workload(&index, &mut model, 9, 120).await;
    let got = to_model(
        &index
            .scan(ScanOptions {
                filter: Some("year >= 40 AND body LIKE '%k1%'".into()),
            })
            .await
            .unwrap(),
    );
    let want: Model = model
        .into_iter()
        .filter(|(_, r)| r.year >= 40 && r.body.contains("k1"))
        .collect();
    assert!(!want.is_empty());
    assert_eq!(got, want);
}

#[tokio::test]
async fn a_scan_filter_sees_only_live_rows() {
    // Older versions (in a generation and in the memtable) and a tombstone hold bodies the
    // cast cannot read; the filter never sees them, so it neither fails on them nor matches.
    let index = Index::create(memory(), schema(), small_settings())
        .await
        .unwrap();
    let s = schema();
    let mut old = Row::new("a", 1);
    old.body = "not a number".into();
    let mut gone = Row::new("b", 1);
    gone.body = "nor this".into();
    index.append(&batch(&s, &[old, gone])).await.unwrap();
    index.flush().await.unwrap();
    let mut stale = Row::new("a", 2);
    stale.body = "still not a number".into();
    index.append(&batch(&s, &[stale])).await.unwrap();
    let mut live = Row::new("a", 3);
    live.body = "7".into();
    index.append(&batch(&s, &[live.clone()])).await.unwrap();
    index.delete(&[lsmsearch::Key::from("b")]).await.unwrap();
    let opts = |f: &str| ScanOptions {
        filter: Some(f.into()),
    };
    let hit = index.scan(opts("CAST(body AS BIGINT) = 7")).await.unwrap();
    assert_eq!(to_model(&hit), Model::from([("a".to_string(), live)]));
    let none = index.scan(opts("CAST(body AS BIGINT) = 8")).await.unwrap();
    assert!(to_model(&none).is_empty());
}

/// Everything a read-only caller asks of a handle, through the one read surface.
async fn reads(h: &impl lsmsearch::Search) -> (Model, Vec<String>, Vec<String>, usize) {
    use arrow::array::AsArray;
    use futures::TryStreamExt;
    let keys = |batches: &[arrow::array::RecordBatch]| -> Vec<String> {
        batches
            .iter()
            .flat_map(|b| {
                let ids = b.column(0).as_string::<i32>();
                (0..b.num_rows())
                    .map(|r| ids.value(r).to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let rows = to_model(&h.scan(ScanOptions::default()).await.unwrap());
    let opts = lsmsearch::SearchOptions::with_k(5);
    let fts = h.search_fts("body version", &opts).await.unwrap();
    let streamed: Vec<_> = h
        .search_fts_stream("body version", &opts)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(keys(&fts), keys(&streamed), "streamed as collected");
    let near = h
        .search_vector(&[1.0, 2.0, -1.0, 0.5], &Default::default())
        .await
        .unwrap();
    let plan = h.plan_fts("body", &opts).await.unwrap();
    let vplan = h.plan_vector(&[1.0; 4], &Default::default()).await.unwrap();
    assert_eq!(h.arrow_schema(), h.schema().arrow_schema());
    for p in [plan, vplan] {
        let text = datafusion::physical_plan::displayable(p.as_ref())
            .indent(true)
            .to_string();
        // The payload of the rows the merge keeps is read on top of it.
        assert!(text.starts_with("TakeExec"), "{text}");
        assert!(text.contains("SortPreservingMergeExec"), "{text}");
    }
    // A writer's cache also holds generations a compaction replaced (their grace period).
    assert!(h.cache_stats().await.generations as usize >= h.stats().generations.len());
    (rows, keys(&fts), keys(&near), h.stats().generations.len())
}

#[tokio::test]
async fn both_handles_answer_every_read_alike() {
    let loc = memory();
    let mut model = Model::new();
    // No compaction: a merge published after the read-only handle opened would change what
    // the writer sees, not what the read surface does.
    let settings = Settings {
        compaction: false,
        ..small_settings()
    };
    let index = Index::create(loc.clone(), schema(), settings)
        .await
        .unwrap();
    workload(&index, &mut model, 1, 200).await;
    index.flush().await.unwrap();
    let ro = Index::open_read_only(loc, Settings::default())
        .await
        .unwrap();
    let (w, r) = (reads(&index).await, reads(&ro).await);
    assert_eq!(w.0, model);
    assert_eq!(w, r);
}

/// Every command that opens an index takes `--settings`: an ingest that prunes every manifest
/// version but the newest keeps one, where the default settings keep ten, and a reader opened
/// with settings of its own reads every row.
#[test]
fn the_command_line_takes_settings_for_the_index_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    let idx = dir.path().join("idx");
    let location = idx.display().to_string();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"primary_key": "id", "text": ["body"],
            "vector": {"column": "emb", "dim": 4, "metric": "l2"},
            "payload": [{"name": "year", "type": "int64"}]}"#,
    )
    .unwrap();
    let rows = dir.path().join("rows.jsonl");
    let lines: Vec<String> = (0..35)
        .map(|i| {
            format!(r#"{{"id": "k{i}", "body": "row {i}", "emb": [{i}, 1, 2, 3], "year": 2000}}"#)
        })
        .collect();
    std::fs::write(&rows, lines.join("\n")).unwrap();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lsmsearch"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let versions = || std::fs::read_dir(idx.join("manifest")).unwrap().count();
    let rows = rows.to_str().unwrap();
    cli(&["init", &location, "--schema", schema.to_str().unwrap()]);
    // Seven flushes, each a manifest version.
    let ingest = [
        "ingest",
        &location,
        rows,
        "--batch-size",
        "5",
        "--flush-every",
        "5",
    ];
    let mut with = ingest.to_vec();
    with.extend(["--settings", r#"{"manifest_retention": 0}"#]);
    cli(&with);
    assert_eq!(
        versions(),
        1,
        "a retention of 0 keeps the newest version only"
    );
    cli(&ingest);
    assert!(
        versions() > 5,
        "the default retention keeps ten: {}",
        versions()
    );
    let scanned = cli(&["scan", &location, "--settings", r#"{"query_threads": 1}"#]);
    assert_eq!(scanned.lines().count(), 35);
    let stats = cli(&[
        "stats",
        &location,
        "--json",
        "--settings",
        r#"{"cache_bytes": 1048576}"#,
    ]);
    let v: serde_json::Value = serde_json::from_str(stats.trim()).unwrap();
    assert!(v["generations"].as_array().is_some_and(|g| !g.is_empty()));
    // What the handle held once open: the generations' keys at least.
    let held = &v["cache"];
    assert!(held["generations"].as_u64().is_some_and(|n| n > 0), "{v}");
    assert!(
        held["resident"]["keys"].as_u64().is_some_and(|n| n > 0),
        "{v}"
    );
    let human = cli(&["stats", &location]);
    assert!(held["rows"].as_u64().is_some_and(|n| n > 0), "{v}");
    assert!(
        human.contains("held in memory:") && human.contains("B per stored row"),
        "{human}"
    );
    assert!(human.contains("block cache:"), "{human}");
    // A hybrid search, its parts' columns and the one named, as JSON lines: "row 7" ranks k7
    // first in text, [7, 1, 2, 3] nearest.
    let hybrid = cli(&[
        "search",
        &location,
        "--fts",
        "row 7",
        "--vector",
        "[7, 1, 2, 3]",
        "-k",
        "3",
        "--columns",
        "year",
        "--json",
    ]);
    let rows: Vec<serde_json::Value> = hybrid
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3, "{hybrid}");
    assert_eq!(rows[0]["id"], "k7", "{hybrid}");
    assert_eq!(rows[0]["_fts_rank"], 1, "{hybrid}");
    assert_eq!(rows[0]["_vector_rank"], 1, "{hybrid}");
    for r in &rows {
        for c in ["_score", "_distance", "_vector_rank", "year"] {
            assert!(r.get(c).is_some(), "{c} in {r}");
        }
        assert!(r.get("body").is_none(), "only the columns named: {r}");
    }
    // A count with the rows: every row holds "row"; 10 of them printed after the count.
    let counted = cli(&[
        "search",
        &location,
        "--fts",
        "row",
        "--count",
        "--json",
        "--timeout-ms",
        "60000",
    ]);
    let mut lines = counted.lines();
    let first: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(first, serde_json::json!({ "count": 35 }), "{counted}");
    assert_eq!(lines.count(), 10, "{counted}");
    let table = cli(&[
        "search",
        &location,
        "--fts",
        "row 7",
        "--count",
        "--min-score",
        "1",
    ]);
    assert!(table.starts_with("1 live row matches"), "{table}");
    // Snippets and explanations as JSON.
    let annotated = cli(&[
        "search",
        &location,
        "--fts",
        "row 7",
        "-k",
        "1",
        "--highlight",
        "--highlight-tags",
        "[,]",
        "--explain",
        "--json",
    ]);
    let row: serde_json::Value = serde_json::from_str(annotated.trim()).unwrap();
    assert_eq!(row["_highlight_body"], "[row] [7]", "{annotated}");
    let explained: serde_json::Value =
        serde_json::from_str(row["_explanation"].as_str().unwrap()).unwrap();
    let (value, score) = (
        explained["value"].as_f64().unwrap(),
        row["_score"].as_f64().unwrap(),
    );
    assert!((value - score).abs() <= 1e-5 * score, "{annotated}");
    // SQL: a facet count over a search, as JSON lines, under another table name.
    let facets = cli(&[
        "sql",
        &location,
        "SELECT year, count(*) AS n FROM fts('t', 'row', 100) GROUP BY year",
        "--table",
        "t",
        "--json",
    ]);
    let row: serde_json::Value = serde_json::from_str(facets.trim()).unwrap();
    assert_eq!(row, serde_json::json!({"year": 2000, "n": 35}), "{facets}");
}

/// `scan_stream` returns the rows `scan` does, in the same order, in batches of at most 8,192
/// rows built as the stream is polled; a filter that fails on the data fails the stream with
/// the same `Invalid` error as `scan`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_streams_the_rows_of_scan_in_bounded_batches() {
    use arrow::array::Array;
    use futures::TryStreamExt;
    let s = schema();
    let index = Index::create(memory(), s.clone(), Settings::default())
        .await
        .unwrap();
    let rows = |from: usize, to: usize, version: i64| {
        (from..to)
            .map(|i| Row::new(format!("k{i:06}"), version))
            .collect::<Vec<_>>()
    };
    // A generation of 12,000 rows, then a memtable updating 2,000 of them, adding 2,000 and
    // deleting 500.
    for from in (0..12_000).step_by(2_000) {
        index
            .append(&batch(&s, &rows(from, from + 2_000, 1)))
            .await
            .unwrap();
    }
    index.flush().await.unwrap();
    index
        .append(&batch(&s, &rows(10_000, 14_000, 2)))
        .await
        .unwrap();
    let deleted: Vec<lsmsearch::Key> = (0..500)
        .map(|i| lsmsearch::Key::from(format!("k{i:06}")))
        .collect();
    index.delete(&deleted).await.unwrap();

    for filter in [None, Some("year = 2".to_string())] {
        let options = ScanOptions { filter };
        let collected = index.scan(options.clone()).await.unwrap();
        let streamed: Vec<_> = index
            .scan_stream(options.clone())
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert!(streamed
            .iter()
            .all(|b| b.num_rows() <= 8192 && b.num_rows() > 0));
        let keys = |batches: &[arrow::array::RecordBatch]| -> Vec<String> {
            batches
                .iter()
                .flat_map(|b| {
                    let k = b
                        .column(0)
                        .as_any()
                        .downcast_ref::<arrow::array::StringArray>()
                        .unwrap();
                    (0..k.len())
                        .map(|i| k.value(i).to_string())
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        assert_eq!(keys(&streamed), keys(&collected), "{:?}", options.filter);
        assert_eq!(to_model(&streamed), to_model(&collected));
        let expected = if options.filter.is_some() {
            4_000
        } else {
            13_500
        };
        assert_eq!(keys(&streamed).len(), expected, "{:?}", options.filter);
    }
    assert!(
        index
            .scan_stream(ScanOptions::default())
            .await
            .unwrap()
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .len()
            >= 3
    );
    let bad = ScanOptions {
        filter: Some("CAST(body AS BIGINT) > 1".to_string()),
    };
    let e = index.scan(bad.clone()).await.unwrap_err();
    assert_eq!(e.kind(), lsmsearch::ErrorKind::Invalid, "{e}");
    let streamed: Result<Vec<_>, _> = index.scan_stream(bad).await.unwrap().try_collect().await;
    let e = lsmsearch::Error::from(streamed.unwrap_err());
    assert_eq!(e.kind(), lsmsearch::ErrorKind::Invalid, "{e}");
    index.close().await.unwrap();
}
