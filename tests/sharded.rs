//! Sharded indexes: random rows with updates and deletes routed over three shards, each
//! split randomly into a memtable and generations, searched as one index. Full text ranks as
//! one tantivy index over the live rows, and returns exactly what one lsmsearch index of the
//! same writes returns (scores, highlights, explanations, counts); exact vector search equals
//! brute force; hybrid search equals the reference fusion. Then the layout: routing, the
//! descriptor, and the errors of writes and opens that do not fit it.

mod common;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Float32Type;
use common::fts::{assert_same_ranking, assert_same_ranking_with, Reference};
use common::fusion::{brute_force, reference_fusion};
use common::{batch, schema, Row};
use lsmsearch::shard::{ShardLayout, ShardedIndex, SHARD_HASH_SEED};
use lsmsearch::{
    ErrorKind, Fusion, Highlight, HybridSearchOptions, Index, Key, Location, SearchOptions,
    Settings, VectorSearchOptions,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const WORDS: &[&str] = &[
    "wing", "flow", "shock", "layer", "heat", "plate", "mach", "drag",
];

const QUERIES: &[&str] = &[
    "wing",
    "shock layer",
    "+flow heat",
    "\"shock layer\"",
    "mach OR drag",
    "flow -wing",
];

#[derive(Debug, Clone)]
enum Op {
    Upsert(Vec<(u8, Vec<u8>, [i8; 4])>),
    Delete(Vec<u8>),
    /// Flush the shard of the n-th key (each shard's generations differ).
    Flush(u8),
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    let row = (
        0u8..60,
        prop::collection::vec(0u8..8, 0..8),
        prop::array::uniform4(-3i8..4),
    );
    prop_oneof![
        6 => prop::collection::vec(row, 1..12).prop_map(Op::Upsert),
        2 => prop::collection::vec(0u8..60, 1..4).prop_map(Op::Delete),
        2 => (0u8..60).prop_map(Op::Flush),
        1 => Just(Op::Compact),
    ]
}

fn settings() -> Settings {
    Settings {
        memtable_max_rows: 1_000_000,
        compaction: false,
        vector_exact_below: 4,
        ..Settings::default()
    }
}

fn key(k: u8) -> String {
    format!("k{k:02}")
}

fn memory_root() -> Location {
    Location::from_store(Arc::new(object_store::memory::InMemory::new()), "root")
}

/// Key and score (or distance) of each row, in order.
fn ranked(batches: &[RecordBatch]) -> Vec<(String, f32)> {
    let mut out = Vec::new();
    for b in batches {
        let keys = b.column(0).as_string::<i32>();
        let values = b.column(1).as_primitive::<Float32Type>();
        for i in 0..b.num_rows() {
            out.push((keys.value(i).to_string(), values.value(i)));
        }
    }
    out
}

/// Every row of `batches` as one batch (`None` when there are none: a search may return no
/// batch or an empty one).
fn one(batches: &[RecordBatch]) -> Option<RecordBatch> {
    let first = batches.first()?;
    let all = arrow::compute::concat_batches(&first.schema(), batches).unwrap();
    (all.num_rows() > 0).then_some(all)
}

async fn run(ops: Vec<Op>, searches: Vec<(usize, [i8; 4], usize, usize)>) {
    let s = schema();
    let sharded = Arc::new(
        ShardedIndex::create(memory_root(), s.clone(), 3, settings())
            .await
            .unwrap(),
    );
    // One index of the same writes: what a sharded search must return.
    let single = Arc::new(
        Index::create(common::memory(), s.clone(), settings())
            .await
            .unwrap(),
    );
    let mut live: BTreeMap<String, Row> = BTreeMap::new();
    let mut flushes = 0;
    for (n, op) in ops.into_iter().enumerate() {
        match op {
            Op::Upsert(rows) => {
                let rows: Vec<Row> = rows
                    .into_iter()
                    .map(|(k, words, e)| Row {
                        id: key(k),
                        body: words
                            .iter()
                            .map(|w| WORDS[*w as usize])
                            .collect::<Vec<_>>()
                            .join(" "),
                        year: n as i64,
                        emb: e.map(f32::from),
                    })
                    .collect();
                let b = batch(&s, &rows);
                let receipt = sharded.append(&b).await.unwrap();
                assert_eq!(receipt.rows, rows.len());
                single.append(&b).await.unwrap();
                for r in rows {
                    live.insert(r.id.clone(), r);
                }
            }
            Op::Delete(keys) => {
                let keys: Vec<Key> = keys.iter().map(|k| Key::from(key(*k).as_str())).collect();
                sharded.delete(&keys).await.unwrap();
                single.delete(&keys).await.unwrap();
                for k in &keys {
                    if let Key::Str(k) = k {
                        live.remove(k);
                    }
                }
            }
            Op::Flush(k) if flushes < 15 => {
                // Flush the one shard holding key k: the shards' splits differ.
                let shard = sharded.layout().shard_of(&Key::from(key(k).as_str()));
                let one = ShardedIndex::flush_shard(&sharded, shard).await;
                one.unwrap();
                single.flush().await.unwrap();
                flushes += 1;
            }
            Op::Flush(_) => {}
            Op::Compact => {
                sharded.compact().await.unwrap();
                single.compact().await.unwrap();
            }
        }
    }
    let docs = live
        .iter()
        .map(|(k, r)| (k.clone(), vec![Some(r.body.clone())]))
        .collect();
    let reference = Reference::new(&["body"], &docs);
    let pit = sharded.point_in_time().await.unwrap();
    for (qi, v, k, offset) in searches {
        let q = QUERIES[qi % QUERIES.len()];
        let ctx = format!("{q:?}, k {k}, offset {offset}, {flushes} flushes");

        // Full text: as one tantivy index, and exactly as one lsmsearch index, highlights
        // and explanations included.
        let opts = SearchOptions {
            k,
            offset,
            highlight: Some(Highlight::default()),
            explain: true,
            ..SearchOptions::default()
        };
        let got = sharded.search_fts(q, &opts).await.unwrap();
        let all = reference.search(q, false);
        let want: Vec<(String, f32)> = all.iter().skip(offset).cloned().collect();
        assert_same_ranking(&ranked(&got), &want, k, &ctx);
        let same = single.search_fts(q, &opts).await.unwrap();
        assert_eq!(one(&got), one(&same), "{ctx}: against one index");
        let on_pit = pit.search_fts(q, &opts).await.unwrap();
        assert_eq!(one(&on_pit), one(&same), "{ctx}: on a point in time");

        // Counts, with and without a floor on the score.
        let count = SearchOptions::with_k(1);
        assert_eq!(
            sharded.count_fts(q, &count).await.unwrap(),
            all.len() as u64,
            "{ctx}: count"
        );
        if let Some(mid) = all.get(all.len() / 2) {
            let floor = SearchOptions {
                min_score: Some(mid.1),
                ..SearchOptions::with_k(1)
            };
            assert_eq!(
                sharded.count_fts(q, &floor).await.unwrap(),
                single.count_fts(q, &floor).await.unwrap(),
                "{ctx}: count with min_score"
            );
        }

        // Vector search, exact: brute force over the live rows.
        let v = v.map(|x| f32::from(x) + 0.5);
        let vopts = VectorSearchOptions {
            k,
            offset,
            exact: true,
            ..VectorSearchOptions::default()
        };
        let got = sharded.search_vector(&v, &vopts).await.unwrap();
        let nearest = brute_force(live.values().map(|r| (&r.id, r.emb.as_slice())), &v);
        let want: Vec<(String, f32)> = nearest
            .iter()
            .skip(offset)
            .map(|(k, d)| (k.clone(), d.sqrt() as f32))
            .collect();
        assert_same_ranking_with(&ranked(&got), &want, k, &ctx, 1e-3);
        let same = single.search_vector(&v, &vopts).await.unwrap();
        assert_eq!(one(&got), one(&same), "{ctx}: vector against one index");

        // Hybrid: the reference fusion, and what one index returns.
        let candidates = offset + k + 3;
        for fusion in [
            Fusion::Rrf { k: 60.0 },
            Fusion::Weighted {
                text: 0.4,
                vector: 0.6,
            },
        ] {
            let hopts = HybridSearchOptions {
                k,
                offset,
                fusion,
                candidates: Some(candidates),
                exact: true,
                ..HybridSearchOptions::default()
            };
            let got = sharded.search_hybrid(q, &v, &hopts).await.unwrap();
            let want = reference_fusion(&all, &nearest, fusion, candidates, offset, k);
            let keys: Vec<String> = ranked(&got).into_iter().map(|r| r.0).collect();
            let want_keys: Vec<String> = want.iter().map(|r| r.0.clone()).collect();
            assert_eq!(keys, want_keys, "{ctx}: hybrid {fusion:?}");
            let same = single.search_hybrid(q, &v, &hopts).await.unwrap();
            assert_eq!(
                one(&got),
                one(&same),
                "{ctx}: hybrid {fusion:?} against one index"
            );
        }
    }
    same_sql(&sharded, &single).await;
    sharded.close().await.unwrap();
    single.close().await.unwrap();
}

/// SQL over the sharded index returns what it returns over one index of the same writes: the
/// table's scan (every shard's live rows, with a filter and a projection pushed in) and the
/// search functions, joined, filtered and grouped.
async fn same_sql(sharded: &Arc<ShardedIndex>, single: &Arc<Index>) {
    let (a, b) = (
        datafusion::prelude::SessionContext::new(),
        datafusion::prelude::SessionContext::new(),
    );
    lsmsearch::sql::register_sharded(&a, "docs", sharded.clone()).unwrap();
    lsmsearch::sql::register(&b, "docs", single.clone()).unwrap();
    for statement in [
        "SELECT id, body, year FROM docs ORDER BY id",
        "SELECT id FROM docs WHERE year > 3 AND body LIKE '%wing%' ORDER BY id",
        "SELECT count(*) FROM docs",
        "SELECT id, _score, year FROM fts('docs', 'shock layer', 7) ORDER BY _score DESC, id",
        "SELECT year, count(*) AS n FROM fts('docs', 'flow OR wing', 1000) GROUP BY year \
         ORDER BY year",
        "SELECT id, _distance FROM knn('docs', [0.5, 1.5, -0.5, 2.5], 5, 'year >= 0') \
         ORDER BY _distance, id",
        "SELECT f.id, d.body FROM fts('docs', 'mach', 5) f JOIN docs d ON f.id = d.id \
         ORDER BY f._score DESC, f.id",
        "SELECT id, _score FROM hybrid('docs', 'heat', [1.0, 0.0, 0.5, 0.5], 6) \
         ORDER BY _score DESC, id",
    ] {
        let got = lsmsearch::sql::query(&a, statement).await.unwrap();
        let want = lsmsearch::sql::query(&b, statement).await.unwrap();
        // The rows (a result of none may come as no batch at all).
        let pretty = |r: &[RecordBatch]| {
            let rows: Vec<RecordBatch> = r.iter().filter(|b| b.num_rows() > 0).cloned().collect();
            match rows.is_empty() {
                true => String::new(),
                false => arrow::util::pretty::pretty_format_batches(&rows)
                    .unwrap()
                    .to_string(),
            }
        };
        assert_eq!(pretty(&got), pretty(&want), "{statement}");
    }
}

/// Cases of the property test: 16, or `PROPTEST_CASES` (the long mode).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn three_shards_search_as_one_index(
        ops in prop::collection::vec(op(), 1..40),
        searches in prop::collection::vec(
            (0usize..6, prop::array::uniform4(-3i8..4), 1usize..10, 0usize..5),
            1..4,
        ),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(ops, searches));
    }
}

#[test]
fn a_key_routes_to_the_same_shard_in_every_build() {
    // Part of the format: these must never change.
    let layout = ShardLayout::new(3, schema()).unwrap();
    assert_eq!(layout.seed, SHARD_HASH_SEED);
    // The documented formula: xxh3 of the key's bytes (UTF-8, or 8 little-endian bytes)
    // with the descriptor's seed, mod the shard count.
    use xxhash_rust::xxh3::xxh3_64_with_seed as xxh3;
    for k in ["a", "b", "doc-1", "doc-2", "", "ünïcödé"] {
        let want = (xxh3(k.as_bytes(), SHARD_HASH_SEED) % 3) as usize;
        assert_eq!(layout.shard_of(&Key::from(k)), want, "{k:?}");
    }
    for v in [-1i64, 0, 42, i64::MAX] {
        let want = (xxh3(&v.to_le_bytes(), SHARD_HASH_SEED) % 3) as usize;
        assert_eq!(layout.shard_of(&Key::I64(v)), want, "{v}");
        assert_eq!(layout.shard_of(&Key::U64(v as u64)), want, "{v}");
    }
    let got: Vec<usize> = ["a", "b", "doc-1", "doc-2", ""]
        .iter()
        .map(|k| layout.shard_of(&Key::from(*k)))
        .collect();
    assert_eq!(got, vec![2, 2, 0, 2, 2]);
    // Keys spread over the shards.
    let mut per = [0usize; 3];
    for i in 0..3000 {
        per[layout.shard_of(&Key::I64(i))] += 1;
    }
    assert!(per.iter().all(|n| (900..1100).contains(n)), "{per:?}");
}

#[tokio::test]
async fn the_descriptor_is_written_once_and_checked() {
    let root = memory_root();
    let s = schema();
    let index = ShardedIndex::create(root.clone(), s.clone(), 2, settings())
        .await
        .unwrap();
    assert_eq!(index.written_shards(), vec![0, 1]);
    let e = ShardedIndex::create(root.clone(), s.clone(), 2, settings())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("already exists"), "{e}");
    index.close().await.unwrap();
    let layout = ShardLayout::read(&root).await.unwrap();
    assert_eq!(layout, ShardLayout::new(2, s.clone()).unwrap());

    // A flipped byte is a Data error naming the descriptor.
    let path = object_store::path::Path::from("root/shards");
    use object_store::ObjectStoreExt;
    let bytes = root.store.get(&path).await.unwrap().bytes().await.unwrap();
    let mut bad = bytes.to_vec();
    bad[24] ^= 0x20;
    root.store.put(&path, bad.into()).await.unwrap();
    let e = ShardedIndex::open(root.clone(), settings())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Data, "{e}");
    assert!(e.to_string().contains("shards"), "{e}");

    // No sharded index, and shard counts out of range.
    let e = ShardedIndex::open(memory_root(), settings())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("no sharded index"), "{e}");
    for n in [0, 1025] {
        let e = ShardedIndex::create(memory_root(), s.clone(), n, settings())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    }
    // Over an index that is not sharded.
    let plain = memory_root();
    Index::create(plain.clone(), s.clone(), settings())
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let e = ShardedIndex::create(plain, s, 2, settings())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not sharded"), "{e}");
}

#[tokio::test]
async fn a_missing_shard_or_another_schema_is_a_clear_error() {
    let root = memory_root();
    let s = schema();
    ShardedIndex::create(root.clone(), s.clone(), 3, settings())
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    // Shard 1 removed.
    let layout = ShardLayout::read(&root).await.unwrap();
    let shard1 = layout.shard_location(&root, 1).unwrap();
    use futures::TryStreamExt;
    let objects: Vec<_> = root
        .store
        .list(Some(&shard1.root))
        .try_collect()
        .await
        .unwrap();
    for o in objects {
        object_store::ObjectStoreExt::delete(root.store.as_ref(), &o.location)
            .await
            .unwrap();
    }
    for read_only in [false, true] {
        let e = match read_only {
            false => ShardedIndex::open(root.clone(), settings()).await,
            true => ShardedIndex::open_read_only(root.clone(), settings()).await,
        }
        .unwrap_err();
        assert!(e.to_string().contains("shard 1 of 3"), "{e}");
    }
    // Shard 1 holds an index of another schema.
    let other =
        lsmsearch::IndexSchema::from_json(r#"{"primary_key": "id", "text": ["body"]}"#).unwrap();
    Index::create(shard1, other, settings())
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let e = ShardedIndex::open(root.clone(), settings())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(
        e.to_string().contains("shard 1") && e.to_string().contains("schema"),
        "{e}"
    );
}

#[tokio::test]
async fn a_write_to_a_shard_held_elsewhere_writes_nothing() {
    let root = memory_root();
    let s = schema();
    ShardedIndex::create(root.clone(), s.clone(), 3, settings())
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    // This process writes shards 0 and 2; another writes shard 1.
    let mine = ShardedIndex::open_shards(root.clone(), &[0, 2], settings())
        .await
        .unwrap();
    let theirs = ShardedIndex::open_shards(root.clone(), &[1], settings())
        .await
        .unwrap();
    let layout = mine.layout().clone();
    let rows: Vec<Row> = (0..30).map(|i| Row::new(format!("r{i}"), i)).collect();
    let (held, elsewhere): (Vec<Row>, Vec<Row>) = rows
        .iter()
        .cloned()
        .partition(|r| layout.shard_of(&Key::from(r.id.as_str())) != 1);
    assert!(!held.is_empty() && !elsewhere.is_empty());
    // A batch with a row of shard 1 is refused whole.
    let e = mine.append(&batch(&s, &rows)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("shard 1"), "{e}");
    let e = mine
        .delete(&[Key::from(elsewhere[0].id.as_str())])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let all = SearchOptions::with_k(100);
    assert!(ranked(&mine.search_fts("body", &all).await.unwrap()).is_empty());

    mine.append(&batch(&s, &held)).await.unwrap();
    theirs.append(&batch(&s, &elsewhere)).await.unwrap();
    // Each sees its own writes at once, the other's after a refresh.
    assert_eq!(
        ranked(&mine.search_fts("body", &all).await.unwrap()).len(),
        held.len()
    );
    mine.refresh().await.unwrap();
    theirs.refresh().await.unwrap();
    for handle in [&mine, &theirs] {
        assert_eq!(
            ranked(&handle.search_fts("body", &all).await.unwrap()).len(),
            rows.len()
        );
    }
    // A null key is refused, naming its row.
    let nulls = RecordBatch::try_new(
        s.arrow_schema(),
        batch(&s, &held[..2])
            .columns()
            .iter()
            .enumerate()
            .map(|(i, c)| match i {
                0 => Arc::new(arrow::array::StringArray::from(vec![Some("x"), None])) as _,
                _ => c.clone(),
            })
            .collect(),
    );
    if let Ok(nulls) = nulls {
        let e = mine.append(&nulls).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    }
    let stats = mine.stats();
    assert_eq!(stats.len(), 3);
    mine.close().await.unwrap();
    theirs.close().await.unwrap();
}

/// Run the command line; its stdout, or a panic with its stderr.
fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_lsmsearch"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = cli(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_command_line_creates_writes_and_searches_a_sharded_index_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let schema_file = dir.path().join("schema.json");
    std::fs::write(
        &schema_file,
        r#"{"primary_key": "id", "text": ["body"],
            "vector": {"column": "emb", "dim": 4, "metric": "l2"},
            "payload": [{"name": "year", "type": "int64"}]}"#,
    )
    .unwrap();
    let rows = dir.path().join("rows.jsonl");
    let mut lines = String::new();
    for i in 0..200 {
        let words: Vec<&str> = (0..(i % 7 + 1)).map(|w| WORDS[(i * 3 + w) % 8]).collect();
        let x = (i % 13) as f32;
        lines.push_str(
            &serde_json::json!({"id": format!("d{i:03}"), "body": words.join(" "),
                                "emb": [x, 1.0 - x, x / 2.0, 0.5], "year": i})
            .to_string(),
        );
        lines.push('\n');
    }
    std::fs::write(&rows, lines).unwrap();
    let sharded = dir.path().join("sharded").display().to_string();
    let single = dir.path().join("single").display().to_string();
    let schema_arg = schema_file.display().to_string();
    let rows_arg = rows.display().to_string();
    ok(&["init", &sharded, "--schema", &schema_arg, "--shards", "3"]);
    ok(&["init", &single, "--schema", &schema_arg]);
    for loc in [&sharded, &single] {
        ok(&[
            "ingest",
            loc,
            &rows_arg,
            "--batch-size",
            "64",
            "--flush-every",
            "100",
        ]);
        ok(&["delete", loc, "d007", "d100"]);
    }
    // Every search returns what one index returns.
    let searches: [&[&str]; 4] = [
        &[
            "--fts",
            "shock layer",
            "--k",
            "7",
            "--offset",
            "2",
            "--count",
        ],
        &["--fts", "wing", "--highlight", "--explain", "--k", "5"],
        &[
            "--vector",
            "[1, 0, 0.5, 0.5]",
            "--exact",
            "--k",
            "6",
            "--offset",
            "1",
        ],
        &[
            "--fts",
            "flow heat",
            "--vector",
            "[2, -1, 1, 0.5]",
            "--exact",
            "--k",
            "5",
        ],
    ];
    for args in searches {
        let run = |loc: &str| {
            let mut all = vec!["--json", "search", loc];
            all.extend_from_slice(args);
            ok(&all)
        };
        let (got, want) = (run(&sharded), run(&single));
        assert!(!want.trim().is_empty(), "{args:?}");
        assert_eq!(got, want, "{args:?}");
    }
    // Stats per shard; compaction per shard.
    let stats = ok(&["stats", &sharded]);
    assert!(
        stats.contains("shard 0") && stats.contains("shard 2"),
        "{stats}"
    );
    let compacted = ok(&["compact", &sharded]);
    assert!(compacted.contains("shard 1:"), "{compacted}");
    // SQL reads every shard: the same rows as over one index.
    for statement in [
        "SELECT count(*) FROM docs",
        "SELECT year, count(*) AS n FROM fts('docs', 'shock', 100) GROUP BY year ORDER BY year",
    ] {
        let (got, want) = (
            ok(&["--json", "sql", &sharded, statement]),
            ok(&["--json", "sql", &single, statement]),
        );
        assert!(!want.trim().is_empty(), "{statement}");
        assert_eq!(got, want, "{statement}");
    }
    // A command that reads one index says so.
    let out = cli(&["scan", &sharded]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sharded index (3 shards)"), "{err}");
}

#[tokio::test]
async fn a_delete_with_a_key_of_another_type_deletes_nothing() {
    let s = schema();
    let index = ShardedIndex::create(memory_root(), s.clone(), 3, settings())
        .await
        .unwrap();
    let rows: Vec<Row> = (0..30).map(|i| Row::new(format!("r{i}"), i)).collect();
    index.append(&batch(&s, &rows)).await.unwrap();
    // Keys of every shard, and one of the wrong type.
    let mut keys: Vec<Key> = (0..10)
        .map(|i| Key::from(format!("r{i}").as_str()))
        .collect();
    keys.push(Key::I64(3));
    let e = index.delete(&keys).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let all = SearchOptions::with_k(100);
    assert_eq!(
        ranked(&index.search_fts("body", &all).await.unwrap()).len(),
        30
    );
    index.close().await.unwrap();
}

#[test]
fn a_layout_of_zero_shards_does_not_divide_by_zero() {
    // Its fields are public: a layout built by hand may say 0 shards.
    let layout = ShardLayout {
        shards: 0,
        ..ShardLayout::new(1, schema()).unwrap()
    };
    assert_eq!(layout.shard_of(&Key::from("a")), 0);
    let e = layout.shard_location(&memory_root(), 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

/// The shards of one handle split its cache budgets, and each has a disk cache directory of
/// its own under the handle's (two handles cannot share one).
#[tokio::test]
async fn each_shard_has_a_disk_cache_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let settings = Settings {
        cache_dir: Some(cache.clone()),
        cache_disk_bytes: 64 << 20,
        ..settings()
    };
    let root = Location::parse(dir.path().join("idx").to_str().unwrap()).unwrap();
    let index = ShardedIndex::create(root.clone(), schema(), 3, settings.clone())
        .await
        .unwrap();
    index.close().await.unwrap();
    let reader = ShardedIndex::open_read_only(root, settings).await.unwrap();
    reader.close().await.unwrap();
    for i in 0..3 {
        assert!(cache.join(format!("shard-{i}")).is_dir(), "shard {i}");
    }
}
