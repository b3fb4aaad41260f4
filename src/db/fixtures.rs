//! Writes `tests/fixtures/index/`: an index holding an object of every format version this build
//! reads (a version-1 generation with `hnsw/*` sections, a version-2 generation, a version-3
//! generation (text held), a version-4 generation (postings and positions read by range),
//! version-1 WAL rows and fence objects, a version-1 manifest), and `tests/fixtures/index.json`, what it
//! holds. `tests/format_compat.rs` opens them. Regenerate (only when a format version is added)
//! with:
//!
//! ```text
//! cargo test --lib write_fixtures -- --ignored
//! ```

use crate::format::bundle::{Bundle, BundleWriter};
use crate::format::manifest::Manifest;
use crate::storage::paths::{parse_generation, parse_manifest, parse_wal, Paths};
use crate::vector::VectorIndex;
use crate::{Index, IndexSchema, Key, Location, SearchOptions, Settings, VectorSearchOptions};
use arrow::array::{
    Array, AsArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field};
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

const SCHEMA: &str = r#"{"primary_key": "id", "text": ["title", "body"],
    "vector": {"column": "emb", "dim": 8, "metric": "cosine"},
    "payload": [{"name": "year", "type": "int64"}]}"#;

const WORDS: &[&str] = &[
    "wing",
    "flow",
    "boundary",
    "layer",
    "shock",
    "pressure",
    "supersonic",
    "heat",
    "transfer",
    "turbulent",
    "laminar",
    "nozzle",
    "jet",
    "plate",
    "cylinder",
    "mach",
    "drag",
    "lift",
];

#[derive(Debug, Clone, Serialize)]
struct Row {
    id: String,
    title: String,
    body: String,
    year: i64,
    emb: Vec<f32>,
}

#[derive(Debug, Serialize)]
struct Expected {
    rows: Vec<Row>,
    fts: Vec<(String, Vec<String>)>,
    vector: Vec<(Vec<f32>, Vec<String>)>,
}

struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn words(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| WORDS[self.next() as usize % WORDS.len()])
            .collect::<Vec<_>>()
            .join(" ")
    }
    fn vector(&mut self) -> Vec<f32> {
        (0..8)
            .map(|_| (self.next() % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }
}

fn rows(g: &mut Gen, ids: std::ops::Range<u32>, version: u32) -> Vec<Row> {
    ids.map(|i| Row {
        id: format!("k{i:02}"),
        title: g.words(3),
        body: format!("{} version {version}", g.words(12)),
        year: 1950 + i64::from(i % 40),
        emb: g.vector(),
    })
    .collect()
}

fn batch(schema: &IndexSchema, rows: &[Row]) -> RecordBatch {
    let emb = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        8,
        Arc::new(Float32Array::from(
            rows.iter().flat_map(|r| r.emb.clone()).collect::<Vec<_>>(),
        )),
        None,
    )
    .expect("vectors");
    RecordBatch::try_new(
        schema.arrow_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.id))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.title))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.body))),
            Arc::new(emb),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.year))),
        ],
    )
    .expect("a batch")
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

/// Rewrite generation `path` (written at the current version) as a bundle of format
/// `version`: 1 (its graph as hnsw_rs dump files) or 2 (its graph as flat arrays), both with
/// every section hot and their rows as one Arrow IPC stream, or 3 (rows and vectors cold, the
/// text index held whole). Returns its new size and where its hot part starts.
async fn to_format(
    store: &Arc<dyn ObjectStore>,
    path: &object_store::path::Path,
    version: u32,
) -> (u64, Option<u64>) {
    let bytes = store
        .get(path)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes");
    let schema = IndexSchema::from_json(SCHEMA).expect("schema");
    let stored = schema.stored_schema();
    let text = crate::text::TextSchema::new(&schema);
    let (vcol, metric, params) = schema.vector_spec(&Settings::default()).expect("vector");
    let spec = crate::generation::IndexSpec {
        text: text.as_deref(),
        vector: Some((vcol, metric, params)),
    };
    let b = Bundle::open(bytes.clone(), path).expect("a bundle");
    if version == 3 {
        let mut w = BundleWriter::with_version(version);
        let names: Vec<String> = b.section_names().map(str::to_string).collect();
        for n in names.iter().filter(|n| !n.starts_with("text_pieces/")) {
            let cold = b.is_cold(n) && !n.starts_with("text/");
            w.add_section(n, &b.section(n).expect("section"), cold);
        }
        let mut meta = b.stats().clone();
        let out = w.finish(&mut meta).expect("finish");
        store.put(path, out.into()).await.expect("put");
        return (meta.bytes, meta.hot_offset);
    }
    let g = crate::generation::Generation::decode(bytes.clone(), &stored, spec, path)
        .expect("a generation");
    let rows = g.all_rows().await.expect("rows");
    let mut w = BundleWriter::with_version(version);
    w.add(
        "rows",
        &crate::format::ipc::ipc_encode(&stored, std::slice::from_ref(&rows)).expect("rows"),
    );
    w.add("pk_hashes", &b.section("pk_hashes").expect("hashes"));
    if version == 1 {
        for (name, bytes) in
            VectorIndex::build_hnsw_dump(&rows, vcol, metric, params).expect("hnsw")
        {
            w.add(&name, &bytes);
        }
    } else {
        let graph = crate::vector::GRAPH_SECTION;
        w.add(graph, &b.section(graph).expect("graph"));
    }
    let names: Vec<String> = b.section_names().map(str::to_string).collect();
    for name in names
        .iter()
        .filter(|n| n.starts_with("text") && !n.starts_with("text_pieces/"))
    {
        w.add(name, &b.section(name).expect("text"));
    }
    let mut meta = b.stats().clone();
    let out = w.finish(&mut meta).expect("finish");
    store.put(path, out.into()).await.expect("put");
    (meta.bytes, None)
}

/// Delete every manifest version but the latest, and rewrite the oldest of the index's four
/// generations in format 1, the next in format 2 and the third in format 3 (the latest
/// manifest records their new sizes; the newest stays at the current version).
async fn keep_the_latest_manifest_with_older_formats(loc: &Location) {
    let store = loc.store.clone();
    let paths = Paths::new(loc.root.clone());
    let listed: Vec<_> = store.list(None).try_collect().await.expect("list");
    let mut manifests: Vec<u64> = listed
        .iter()
        .filter_map(|m| parse_manifest(&m.location))
        .collect();
    manifests.sort_unstable();
    let latest = *manifests.last().expect("a manifest");
    for v in &manifests[..manifests.len() - 1] {
        store.delete(&paths.manifest(*v)).await.expect("delete");
    }
    let mut gens: Vec<(u64, u64)> = listed
        .iter()
        .filter_map(|m| parse_generation(&m.location))
        .collect();
    gens.sort_unstable();
    assert_eq!(gens.len(), 4, "four generations: {gens:?}");
    let mut sizes = Vec::new();
    for (i, version) in [1, 2, 3].into_iter().enumerate() {
        sizes.push(to_format(&store, &paths.generation(gens[i].0, gens[i].1), version).await);
    }
    let mp = paths.manifest(latest);
    let raw = store
        .get(&mp)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes");
    let mut m = Manifest::decode(&raw, &mp).expect("manifest");
    for (g, (bytes, hot)) in m.generations.iter_mut().zip(sizes) {
        g.bytes = bytes;
        g.hot_offset = hot;
    }
    // WAL objects below the replay point (the fence the index was created with) are never
    // read: none is left, so that every object of the fixture is one a reader checks.
    for w in listed.iter().filter_map(|o| parse_wal(&o.location)) {
        if w < m.wal_replay_from {
            store.delete(&paths.wal(w)).await.expect("delete");
        }
    }
    store
        .put(&mp, m.encode().expect("encode").into())
        .await
        .expect("put");
    // LATEST carried the manifest as it was before this rewrite: it now says the version
    // alone, as older builds wrote it (readers then read the manifest object).
    store
        .put(&paths.latest_hint(), m.version.to_string().into())
        .await
        .expect("put");
}

#[tokio::test]
#[ignore = "writes tests/fixtures/; run with --ignored when a format version is added"]
async fn write_fixtures() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = root.join("index");
    let _ = std::fs::remove_dir_all(&dir);
    let loc = Location::parse(dir.to_str().expect("utf-8")).expect("location");
    let schema = IndexSchema::from_json(SCHEMA).expect("schema");
    let settings = Settings {
        manifest_retention: 0,
        ..Settings::default()
    };
    let mut g = Gen(7);
    let mut model: BTreeMap<String, Row> = BTreeMap::new();
    let index = Index::create(loc.clone(), schema.clone(), settings.clone())
        .await
        .expect("create");
    // Generation 1 (rewritten below as format 1): k00..k29.
    let r = rows(&mut g, 0..30, 1);
    index.append(&batch(&schema, &r)).await.expect("append");
    model.extend(r.into_iter().map(|r| (r.id.clone(), r)));
    index.flush().await.expect("flush");
    // Generation 2: k20..k39 (k20..k29 updated), k00 and k01 deleted.
    let r = rows(&mut g, 20..40, 2);
    index.append(&batch(&schema, &r)).await.expect("append");
    model.extend(r.into_iter().map(|r| (r.id.clone(), r)));
    index
        .delete(&[Key::from("k00"), Key::from("k01")])
        .await
        .expect("delete");
    model.remove("k00");
    model.remove("k01");
    index.flush().await.expect("flush");
    // Generation 3 (rewritten below as format 3): k30..k34 updated, k40..k42 new, k03 deleted.
    let mut r = rows(&mut g, 30..35, 5);
    r.extend(rows(&mut g, 40..43, 5));
    index.append(&batch(&schema, &r)).await.expect("append");
    model.extend(r.into_iter().map(|r| (r.id.clone(), r)));
    index.delete(&[Key::from("k03")]).await.expect("delete");
    model.remove("k03");
    index.flush().await.expect("flush");
    // Generation 4 (the current version): k10..k14 updated, k45..k47 new, k04 deleted.
    let mut r = rows(&mut g, 10..15, 6);
    r.extend(rows(&mut g, 45..48, 6));
    index.append(&batch(&schema, &r)).await.expect("append");
    model.extend(r.into_iter().map(|r| (r.id.clone(), r)));
    index.delete(&[Key::from("k04")]).await.expect("delete");
    model.remove("k04");
    index.flush().await.expect("flush");
    // WAL rows: k35..k44 (k35..k39 updated), k02 and k36 deleted, k44 updated again.
    let r = rows(&mut g, 35..45, 3);
    index.append(&batch(&schema, &r)).await.expect("append");
    model.extend(r.into_iter().map(|r| (r.id.clone(), r)));
    index
        .delete(&[Key::from("k02"), Key::from("k36")])
        .await
        .expect("delete");
    model.remove("k02");
    model.remove("k36");
    let r = rows(&mut g, 44..45, 4);
    index.append(&batch(&schema, &r)).await.expect("append");
    model.extend(r.into_iter().map(|r| (r.id.clone(), r)));
    index.close().await.expect("close");
    // A second writer's open leaves an epoch fence as the last WAL object.
    Index::open(loc.clone(), settings)
        .await
        .expect("open")
        .close()
        .await
        .expect("close");

    keep_the_latest_manifest_with_older_formats(&loc).await;

    // What it holds, as the model says, and what searches return today.
    // Graph walks on every arm, as tests/format_compat.rs searches.
    let walk = Settings {
        vector_exact_below: 0,
        ..Settings::default()
    };
    let reader = Index::open_read_only(loc, walk).await.expect("open");
    let scanned = keys(&reader.scan(Default::default()).await.expect("scan"));
    let mut sorted = scanned.clone();
    sorted.sort();
    assert_eq!(sorted, model.keys().cloned().collect::<Vec<_>>());
    let mut fts = Vec::new();
    for q in [
        "boundary layer",
        "\"supersonic flow\"",
        "heat +nozzle",
        "version 3",
    ] {
        let hits = reader
            .search_fts(q, &SearchOptions::with_k(10))
            .await
            .expect("search");
        fts.push((q.to_string(), keys(&hits)));
    }
    let mut vector = Vec::new();
    for _ in 0..4 {
        let q = g.vector();
        let hits = reader
            .search_vector(&q, &VectorSearchOptions::with_k(10))
            .await
            .expect("search");
        vector.push((q, keys(&hits)));
    }
    let expected = Expected {
        rows: model.into_values().collect(),
        fts,
        vector,
    };
    std::fs::write(
        root.join("index.json"),
        serde_json::to_string_pretty(&expected).expect("json"),
    )
    .expect("write");
}
