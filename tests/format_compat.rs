//! Every format version this build claims to read opens: `tests/fixtures/index/` holds a
//! version-1 generation (graph as hnsw_rs dump files), a version-2 generation (flat graph), a
//! version-3 generation (a hot part, and rows and vectors read by range), a version-4
//! generation (postings and positions read by range too),
//! version-1 WAL objects (rows, and an epoch fence as the last object) and a version-1 manifest
//! (written by `cargo test --lib write_fixtures -- --ignored`); `tests/fixtures/sharded/shards` is a
//! version-1 shard descriptor (`cargo test --lib write_descriptor_fixture -- --ignored`).
//! `tests/fixtures/index.json`
//! says what the index holds and what searches returned when the fixtures were written.
//!
//! A flipped byte in any of these objects is a `Data` error naming the object (when the index
//! opens, or for the cold part of a version-3 or -4 generation when it is read), except past the
//! magic number and version of the last WAL object, where the CRC mismatch makes it a torn tail
//! (never acknowledged), which recovery drops. The
//! `LATEST` hint is plain text without a CRC: a wrong hint only costs a longer LIST.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, Int64Type};
use lsmsearch::{
    distance, ErrorKind, Index, Location, Metric, ReadOnlyIndex, ScanOptions, SearchOptions,
    Settings, VectorSearchOptions,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize, PartialEq)]
struct Row {
    id: String,
    title: String,
    body: String,
    year: i64,
    emb: Vec<f32>,
}

#[derive(Debug, Deserialize)]
struct Expected {
    rows: Vec<Row>,
    fts: Vec<(String, Vec<String>)>,
    vector: Vec<(Vec<f32>, Vec<String>)>,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn expected() -> Expected {
    let text = std::fs::read_to_string(fixtures().join("index.json")).expect("index.json");
    serde_json::from_str(&text).expect("index.json parses")
}

/// A private copy of the fixture index (opening a writer changes an index).
fn copy() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let to = tmp.path().join("index");
    copy_dir(&fixtures().join("index"), &to);
    (tmp, to)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).expect("copy");
        }
    }
}

/// Every object file of the fixture index, relative to it, sorted.
fn objects(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in ["manifest", "wal", "generations"] {
        for e in std::fs::read_dir(dir.join(sub)).expect("read_dir") {
            out.push(PathBuf::from(sub).join(e.expect("entry").file_name()));
        }
    }
    out.sort();
    out
}

fn rows_of(batches: &[RecordBatch]) -> Vec<Row> {
    let mut out = Vec::new();
    for b in batches {
        let id = b.column(0).as_string::<i32>();
        let title = b.column(1).as_string::<i32>();
        let body = b.column(2).as_string::<i32>();
        let emb = b.column(3).as_fixed_size_list();
        let year = b.column(4).as_primitive::<Int64Type>();
        for r in 0..b.num_rows() {
            out.push(Row {
                id: id.value(r).to_string(),
                title: title.value(r).to_string(),
                body: body.value(r).to_string(),
                year: year.value(r),
                emb: emb.value(r).as_primitive::<Float32Type>().values().to_vec(),
            });
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

fn keys(batches: &[RecordBatch]) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let k = b.column(0).as_string::<i32>().clone();
            (0..k.len()).map(move |i| k.value(i).to_string())
        })
        .collect()
}

/// Format version recorded in an object: the footer of a generation, the header of a WAL
/// object (u16 at 4) or a manifest (u32 at 4).
fn version_of(path: &Path) -> u32 {
    let b = std::fs::read(path).expect("read");
    let le = |s: &[u8]| s.iter().rev().fold(0u32, |v, x| (v << 8) | u32::from(*x));
    match path.extension().and_then(|e| e.to_str()) {
        Some("gen") => le(&b[b.len() - 16..b.len() - 12]),
        Some("wal") => le(&b[4..6]),
        _ => le(&b[4..8]),
    }
}

#[test]
fn the_fixtures_hold_every_version_the_build_reads() {
    let dir = fixtures().join("index");
    let mut seen: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for o in objects(&dir) {
        let kind = o.parent().expect("a folder").display().to_string();
        seen.entry(kind)
            .or_default()
            .push(version_of(&dir.join(&o)));
    }
    for v in seen.values_mut() {
        v.sort();
        v.dedup();
    }
    assert_eq!(
        seen["generations"],
        [1, 2, 3, 4],
        "generation versions 1 to 4"
    );
    assert_eq!(seen["wal"], [1], "WAL version 1");
    assert_eq!(seen["manifest"], [1], "manifest version 1");
    let hnsw = std::fs::read(dir.join(&objects(&dir)[0])).expect("read");
    let mut found_v1_graph = false;
    for o in objects(&dir)
        .iter()
        .filter(|o| o.starts_with("generations"))
    {
        let b = std::fs::read(dir.join(o)).expect("read");
        if version_of(&dir.join(o)) == 1 {
            found_v1_graph = b.windows(10).any(|w| w == b"hnsw/graph");
        }
    }
    assert!(
        found_v1_graph && !hnsw.is_empty(),
        "the version-1 generation has hnsw/* sections"
    );
}

async fn check_contents(reader: &ReadOnlyIndex, e: &Expected) {
    let rows = rows_of(&reader.scan(ScanOptions::default()).await.expect("scan"));
    assert_eq!(rows, e.rows, "the live rows");
    for (q, want) in &e.fts {
        let hits = reader
            .search_fts(q, &SearchOptions::with_k(10))
            .await
            .expect("fts");
        assert_eq!(&keys(&hits), want, "full-text query {q:?}");
    }
    for (q, want) in &e.vector {
        // Exact search equals brute force over the expected rows, and the graph walks (forced
        // on every arm) return what they returned when the fixtures were written.
        let mut brute: Vec<(f32, &str)> = e
            .rows
            .iter()
            .map(|r| (distance(Metric::Cosine, q, &r.emb), r.id.as_str()))
            .collect();
        brute.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)));
        let exact = reader
            .search_vector(
                q,
                &VectorSearchOptions {
                    exact: true,
                    ..VectorSearchOptions::with_k(10)
                },
            )
            .await
            .expect("exact");
        let brute: Vec<String> = brute.iter().take(10).map(|(_, k)| k.to_string()).collect();
        assert_eq!(keys(&exact), brute, "exact vector search");
        let walked = reader
            .search_vector(q, &VectorSearchOptions::with_k(10))
            .await
            .expect("vector");
        assert_eq!(&keys(&walked), want, "vector search");
    }
}

#[tokio::test]
async fn every_fixture_version_opens_and_reads_as_written() {
    let e = expected();
    let (_tmp, dir) = copy();
    let loc = Location::parse(dir.to_str().expect("utf-8")).expect("location");
    // Walk every generation's graph, the version-1 one (reloaded from hnsw_rs files) included.
    let walk = Settings {
        vector_exact_below: 0,
        ..Settings::default()
    };
    let reader = Index::open_read_only(loc.clone(), walk.clone())
        .await
        .expect("open read-only");
    assert_eq!(reader.stats().generations.len(), 4);
    check_contents(&reader, &e).await;

    // A writer opens it too (replaying the WAL, fencing past the fence), appends and flushes
    // a generation of the current version beside the older ones; nothing it held is lost.
    // Without compaction: a background merge of the older generations would make the count
    // below depend on how far it got before the close.
    let writer = Index::open(
        loc.clone(),
        Settings {
            compaction: false,
            ..walk.clone()
        },
    )
    .await
    .expect("open writer");
    writer.flush().await.expect("flush");
    writer.close().await.expect("close");
    let reader = Index::open_read_only(loc, walk).await.expect("reopen");
    assert_eq!(reader.stats().generations.len(), 5);
    check_contents(&reader, &e).await;
}

#[tokio::test]
async fn a_flipped_byte_in_any_fixture_is_a_data_error_naming_it() {
    let e = expected();
    let fixture = fixtures().join("index");
    let all = objects(&fixture);
    let last_wal = all
        .iter()
        .filter(|o| o.starts_with("wal"))
        .max()
        .expect("WAL objects")
        .clone();
    for object in &all {
        let len = std::fs::metadata(fixture.join(object)).expect("stat").len() as usize;
        for at in [0, 5, len / 3, len / 2, len - 20, len - 1] {
            let (_tmp, dir) = copy();
            let path = dir.join(object);
            let mut bytes = std::fs::read(&path).expect("read");
            bytes[at] ^= 0x5a;
            std::fs::write(&path, &bytes).expect("write");
            let loc = Location::parse(dir.to_str().expect("utf-8")).expect("location");
            let opened = Index::open_read_only(loc, Settings::default()).await;
            if *object == last_wal && at >= 6 {
                // A CRC mismatch in the last object is a torn tail: dropped, and only its own
                // rows (a fence holds none) are gone. (A bad magic number or version is not what
                // a torn write leaves: that is an error like anywhere else.)
                let reader = opened.expect("a torn last WAL object is dropped");
                check_contents(&reader, &e).await;
                continue;
            }
            // A version-3 generation's cold part is checked when it is read, not at open.
            let err = match opened {
                Ok(reader) => reader.scan(ScanOptions::default()).await.map(|_| ()),
                Err(e) => Err(e),
            }
            .expect_err(&format!("{} with byte {at} flipped", object.display()));
            let name = object.file_name().expect("a name").to_string_lossy();
            assert_eq!(
                err.kind(),
                ErrorKind::Data,
                "{} byte {at}: {err}",
                object.display()
            );
            assert!(
                err.message().contains(name.as_ref()),
                "{} byte {at}: the error names the object: {err}",
                object.display()
            );
        }
    }
}

#[tokio::test]
async fn the_version_1_shard_descriptor_reads_and_a_flipped_byte_is_a_data_error() {
    use lsmsearch::shard::{ShardLayout, SHARD_HASH_SEED};
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("sharded");
    copy_dir(&fixtures().join("sharded"), &dir);
    let descriptor = dir.join("shards");
    assert_eq!(version_of(&descriptor), 1, "shard descriptor version 1");
    let root = Location::parse(dir.to_str().expect("utf-8")).expect("location");
    let layout = ShardLayout::read(&root)
        .await
        .expect("the descriptor reads");
    assert_eq!((layout.shards, layout.seed), (3, SHARD_HASH_SEED));
    assert_eq!(layout.hash, "xxh3-64");
    assert_eq!(layout.schema.text, ["body"]);
    let good = std::fs::read(&descriptor).expect("read");
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x01;
        std::fs::write(&descriptor, &bad).expect("write");
        let e = ShardLayout::read(&root)
            .await
            .expect_err("a flipped byte is found");
        assert_eq!(e.kind(), ErrorKind::Data, "flip at {i}: {e}");
        assert!(e.to_string().contains("shards"), "flip at {i}: {e}");
    }
}
