//! Version-3 generations are read by range: a handle holds their hot parts, a query reads the
//! blocks of the rows it returns or filters on (checked against their CRCs on arrival), and a
//! handle's disk cache outlives it.

use arrow::array::{AsArray, Int64Array, RecordBatch, StringArray};
use lsmsearch::{
    ErrorKind, Index, IndexSchema, LatencyConfig, LatencyStore, Location, ReadOnlyIndex,
    ScanOptions, SearchOptions, Settings,
};
use std::sync::Arc;

fn schema() -> IndexSchema {
    IndexSchema::from_json(
        r#"{"primary_key": "id", "text": ["body"],
            "payload": [{"name": "year", "type": "int64"}, {"name": "note", "type": "utf8"}]}"#,
    )
    .unwrap()
}

/// Rows `from..to`: a body of words drawn from the row number, a year and a long note (the
/// bulk of each row, never searched).
fn batch(s: &IndexSchema, from: usize, to: usize) -> RecordBatch {
    const WORDS: [&str; 12] = [
        "wing", "flow", "shock", "layer", "heat", "nozzle", "lift", "drag", "mach", "jet", "plate",
        "wave",
    ];
    let body = |i: usize| {
        (0..8)
            .map(|j| WORDS[(i * 7 + j * j * 3 + i / 13) % WORDS.len()])
            .collect::<Vec<_>>()
            .join(" ")
    };
    // Pseudo-random hex: about as compressible as prose.
    let note = |i: usize| {
        let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (0..30)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                format!("{x:016x}")
            })
            .collect::<String>()
    };
    RecordBatch::try_new(
        s.arrow_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                (from..to).map(|i| format!("k{i:06}")),
            )),
            Arc::new(StringArray::from_iter_values((from..to).map(body))),
            Arc::new(Int64Array::from_iter_values(
                (from..to).map(|i| 1950 + (i % 50) as i64),
            )),
            Arc::new(StringArray::from_iter_values((from..to).map(note))),
        ],
    )
    .unwrap()
}

/// An index of `rows` rows in one generation, in memory.
async fn one_generation(rows: usize) -> Arc<dyn object_store::ObjectStore> {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let s = schema();
    let index = Index::create(
        Location::from_store(inner.clone(), "idx"),
        s.clone(),
        Settings {
            memtable_max_rows: rows + 1,
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    for from in (0..rows).step_by(5_000) {
        index
            .append(&batch(&s, from, (from + 5_000).min(rows)))
            .await
            .unwrap();
    }
    index.flush().await.unwrap();
    assert_eq!(index.stats().generations.len(), 1);
    index.close().await.unwrap();
    inner
}

/// A read-only handle, at default settings, on the index at `idx` of `store`.
async fn read_only(store: Arc<dyn object_store::ObjectStore>) -> ReadOnlyIndex {
    Index::open_read_only(Location::from_store(store, "idx"), Settings::default())
        .await
        .unwrap()
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_reads_the_blocks_of_the_rows_it_returns_not_the_generation() {
    let inner = one_generation(20_000).await;
    let store = LatencyStore::new(inner, LatencyConfig::default());
    let ro = read_only(store.clone()).await;
    let object = ro.stats().generations[0].bytes;
    let opened = store.counters();
    // The open read the hot part: without the rows' text and notes.
    assert!(
        opened.bytes_read < object / 3,
        "the open read {} of {object} bytes",
        opened.bytes_read
    );
    store.reset();
    let hits = ro
        .search_fts("shock nozzle", &SearchOptions::with_k(10))
        .await
        .unwrap();
    assert_eq!(keys(&hits).len(), 10);
    let cold = store.counters();
    println!(
        "object {object} bytes: open read {} bytes, a cold query {} bytes in {} GETs ({} round trips)",
        opened.bytes_read, cold.bytes_read, cold.gets, cold.round_trips
    );
    assert!(
        cold.gets > 0,
        "the returned rows' notes are in the cold part"
    );
    assert!(
        cold.bytes_read * 10 < object,
        "a top 10 read {} of {object} bytes",
        cold.bytes_read
    );
    // One round for the postings of both terms, one for the pages of the ten rows returned.
    assert_eq!(cold.round_trips, 2, "{cold:?}");
    // The same query again: every block in memory.
    store.reset();
    let again = ro
        .search_fts("shock nozzle", &SearchOptions::with_k(10))
        .await
        .unwrap();
    assert_eq!(keys(&again), keys(&hits));
    assert_eq!(store.counters().gets, 0);
    let c = ro.cache_stats().await;
    assert!(c.blocks_fetched > 0 && c.block_memory_hits > 0, "{c:?}");
    // What the generation holds, by kind: no rows whole, and the hot part's parts.
    let r = c.resident;
    assert_eq!(r.whole, 0, "{r:?}");
    // Keys: the sorted key hashes (8 bytes a row) and their lookup table (about 5) at least.
    assert!(r.keys >= 20_000 * 13 && r.text > 0, "{r:?}");
    let held = r.keys + r.text + r.graph + r.vectors + r.other;
    assert!(held < object / 2, "{held} of {object} bytes held: {r:?}");
    // Every row, every column, by range, as written.
    let all = ro.scan(ScanOptions::default()).await.unwrap();
    let mut got: Vec<(String, i64, String)> = Vec::new();
    for b in &all {
        let (k, y, n) = (
            b.column(0).as_string::<i32>(),
            b.column(2).as_primitive::<arrow::datatypes::Int64Type>(),
            b.column(3).as_string::<i32>(),
        );
        for i in 0..b.num_rows() {
            got.push((k.value(i).into(), y.value(i), n.value(i).into()));
        }
    }
    got.sort();
    let want = batch(&schema(), 0, 20_000);
    assert_eq!(got.len(), 20_000);
    let (wk, wy, wn) = (
        want.column(0).as_string::<i32>(),
        want.column(2).as_primitive::<arrow::datatypes::Int64Type>(),
        want.column(3).as_string::<i32>(),
    );
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g, &(wk.value(i).into(), wy.value(i), wn.value(i).into()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_reads_only_the_columns_it_names() {
    let inner = one_generation(20_000).await;
    // Requests of one round are issued within a few milliseconds of each other; a latency
    // well above that keeps a round one round however loaded the machine is (at 10 ms, a
    // request issued late under load started after another of its round ended).
    let slow = LatencyConfig {
        read: std::time::Duration::from_millis(100),
        ..LatencyConfig::default()
    };
    let store = LatencyStore::new(inner, slow);
    let ro = read_only(store.clone()).await;
    let object = ro.stats().generations[0].bytes;
    store.reset();
    let opts = SearchOptions {
        filter: Some("year = 1960".into()),
        ..SearchOptions::with_k(10)
    };
    let hits = ro.search_fts("shock", &opts).await.unwrap();
    let got = keys(&hits);
    assert_eq!(got.len(), 10);
    assert!(got
        .iter()
        .all(|k| k[1..].parse::<usize>().unwrap() % 50 == 10));
    let read = store.counters().bytes_read;
    assert!(
        read * 10 < object,
        "a filter on year read {read} of {object} bytes"
    );
    // The filter's column with the term's postings, then the pages of the rows returned.
    assert_eq!(store.counters().round_trips, 2, "{:?}", store.counters());
    // The column is kept decoded: the same filter again reads nothing.
    assert!(ro.cache_stats().await.column_bytes >= 20_000 * 8);
    store.reset();
    assert_eq!(keys(&ro.search_fts("shock", &opts).await.unwrap()), got);
    assert_eq!(store.counters().gets, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_column_larger_than_the_block_cache_is_fetched_once() {
    // The notes (about 10 MB of hex) far outgrow a block cache of 128 KiB: the filter's read
    // of them must not fetch them twice, once ahead and once as they are decoded.
    let inner = one_generation(20_000).await;
    let opts = SearchOptions {
        filter: Some("note < '8'".into()),
        ..SearchOptions::with_k(10)
    };
    let mut runs = Vec::new();
    for cache_bytes in [Settings::default().cache_bytes, 128 << 10] {
        let store = LatencyStore::new(inner.clone(), LatencyConfig::default());
        let settings = Settings {
            cache_bytes,
            ..Settings::default()
        };
        let ro = Index::open_read_only(Location::from_store(store.clone(), "idx"), settings)
            .await
            .unwrap();
        store.reset();
        let got = keys(&ro.search_fts("shock", &opts).await.unwrap());
        runs.push((got, store.counters().bytes_read));
    }
    let ((big, read_big), (small, read_small)) = (&runs[0], &runs[1]);
    println!("a filter on the notes: {read_big} bytes read with the default cache, {read_small} with 128 KiB");
    assert_eq!(big.len(), 10);
    assert_eq!(small, big);
    assert!(
        *read_small < read_big + read_big / 4,
        "{read_small} bytes read with a small cache, {read_big} with the default"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_number_column_larger_than_its_cache_share_is_read_by_row() {
    // 50,000 rows of a random 64-bit number (400 KB, incompressible): a handle whose column
    // cache could not keep it reads the pages of the rows returned, not the whole column at
    // every query.
    let s = IndexSchema::from_json(
        r#"{"primary_key": "id", "text": ["body"], "payload": [{"name": "n", "type": "int64"}]}"#,
    )
    .unwrap();
    let rows = 50_000usize;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as i64
    };
    let batch = RecordBatch::try_new(
        s.arrow_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| format!("k{i:06}")),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| ["wing flow", "shock wave"][i % 2]),
            )),
            Arc::new(Int64Array::from_iter_values((0..rows).map(|_| next()))),
        ],
    )
    .unwrap();
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let settings = Settings {
        memtable_max_rows: rows + 1,
        ..Settings::default()
    };
    let index = Index::create(Location::from_store(inner.clone(), "idx"), s, settings)
        .await
        .unwrap();
    index.append(&batch).await.unwrap();
    index.flush().await.unwrap();
    index.close().await.unwrap();
    let store = LatencyStore::new(inner, LatencyConfig::default());
    let settings = Settings {
        column_cache_bytes: 64 << 10,
        ..Settings::default()
    };
    let ro = Index::open_read_only(Location::from_store(store.clone(), "idx"), settings)
        .await
        .unwrap();
    for _ in 0..2 {
        store.reset();
        let hits = ro
            .search_fts("shock", &SearchOptions::with_k(10))
            .await
            .unwrap();
        assert_eq!(keys(&hits).len(), 10);
        let n = hits[0]
            .column_by_name("n")
            .unwrap()
            .as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(n.len(), hits[0].num_rows());
        let read = store.counters().bytes_read;
        println!("a query of 10 rows: {read} bytes read");
        assert!(
            read < 200_000,
            "a query of 10 rows read {read} bytes (the column holds 400,000)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_handle_finds_its_disk_cache() {
    let inner = one_generation(5_000).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        cache_disk_bytes: 64 << 20,
        cache_dir: Some(dir.path().to_path_buf()),
        ..Settings::default()
    };
    let store = LatencyStore::new(inner, LatencyConfig::default());
    let open = || async {
        Index::open_read_only(Location::from_store(store.clone(), "idx"), settings.clone())
            .await
            .unwrap()
    };
    let query = |ro: ReadOnlyIndex| async move {
        let hits = ro
            .search_fts("wave heat", &SearchOptions::with_k(20))
            .await
            .unwrap();
        (ro, keys(&hits))
    };
    let (first, want) = query(open().await).await;
    let fetched_first = first.cache_stats().await.blocks_fetched;
    assert!(fetched_first > 0);
    first.close().await.unwrap();
    let e = first
        .search_fts("wave", &SearchOptions::with_k(1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Closed);
    drop(first);

    let (second, got) = query(open().await).await;
    assert_eq!(got, want);
    let c = second.cache_stats().await;
    // foyer's disk tier is best effort (a write it cannot queue is dropped, which a loaded
    // machine shows now and then): most blocks come back from disk, alone all of them.
    assert!(c.block_disk_hits > 0, "{c:?}");
    assert!(
        c.blocks_fetched * 2 <= fetched_first && c.blocks_fetched < c.block_disk_hits,
        "{c:?}, {fetched_first} fetched by the first handle"
    );
}

/// Files under `dir` this process holds open.
#[cfg(target_os = "linux")]
fn open_files_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter(|target| target.starts_with(dir))
                .count()
        })
        .unwrap_or(0)
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_handle_lets_go_of_its_disk_cache() {
    let inner = one_generation(2_000).await;
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path().canonicalize().unwrap();
    let settings = Settings {
        cache_disk_bytes: 64 << 20,
        cache_dir: Some(dir_path.clone()),
        ..Settings::default()
    };
    for _ in 0..6 {
        let ro =
            Index::open_read_only(Location::from_store(inner.clone(), "idx"), settings.clone())
                .await
                .unwrap();
        assert!(open_files_under(&dir_path) > 0, "the disk tier is open");
        ro.search_fts("wave heat", &SearchOptions::with_k(20))
            .await
            .unwrap();
        ro.close().await.unwrap();
        drop(ro);
    }
    // What a closed handle's disk tier held (its files, its write buffers) goes with it, at
    // once or within a moment: six opens do not leave six tiers behind.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while open_files_under(&dir_path) > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        open_files_under(&dir_path),
        0,
        "files of closed handles' disk tiers still open"
    );
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_handle_closes_its_disk_cache_as_close_does() {
    let inner = one_generation(5_000).await;
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path().canonicalize().unwrap();
    let settings = Settings {
        cache_disk_bytes: 64 << 20,
        cache_dir: Some(dir_path.clone()),
        ..Settings::default()
    };
    let store = LatencyStore::new(inner, LatencyConfig::default());
    let open = || async {
        Index::open_read_only(Location::from_store(store.clone(), "idx"), settings.clone())
            .await
            .unwrap()
    };
    let first = open().await;
    let want = keys(
        &first
            .search_fts("wave heat", &SearchOptions::with_k(20))
            .await
            .unwrap(),
    );
    let fetched_first = first.cache_stats().await.blocks_fetched;
    assert!(fetched_first > 0);
    // Dropped, not closed: its tier writes what its memory holds and closes its files.
    drop(first);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while open_files_under(&dir_path) > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(open_files_under(&dir_path), 0, "the dropped tier's files");
    let second = open().await;
    let got = keys(
        &second
            .search_fts("wave heat", &SearchOptions::with_k(20))
            .await
            .unwrap(),
    );
    assert_eq!(got, want);
    let c = second.cache_stats().await;
    assert!(c.block_disk_hits > 0, "{c:?}");
    assert!(
        c.blocks_fetched * 2 <= fetched_first,
        "{c:?}, {fetched_first} fetched by the first handle"
    );
    second.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_cold_block_is_a_data_error_naming_the_object() {
    let inner = one_generation(5_000).await;
    let ro = read_only(inner.clone()).await;
    let meta = ro.stats().generations[0].clone();
    drop(ro);
    let path = object_store::path::Path::from(format!(
        "idx/generations/{:020}-{:010}.gen",
        meta.id, meta.epoch
    ));
    use object_store::ObjectStoreExt;
    let mut bytes = inner
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    // A byte in the middle of the rows (the cold part), which the open does not read.
    let hot = meta.hot_offset.expect("a version-3 generation") as usize;
    bytes[hot / 2] ^= 0x10;
    inner.put(&path, bytes.into()).await.unwrap();
    let ro = Index::open_read_only(Location::from_store(inner, "idx"), Settings::default())
        .await
        .expect("the hot part is intact");
    let e = ro.scan(ScanOptions::default()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Data, "{e}");
    assert!(e.message().contains(".gen"), "names the object: {e}");
}

/// `(key, score)` of every hit, in order.
fn scored(batches: &[RecordBatch]) -> Vec<(String, f32)> {
    valued(batches, "_score")
}

/// `(key, column)` of every hit, in order, for a float column.
fn valued(batches: &[RecordBatch], column: &str) -> Vec<(String, f32)> {
    batches
        .iter()
        .flat_map(|b| {
            let k = b.column(0).as_string::<i32>();
            let s = b
                .column_by_name(column)
                .unwrap()
                .as_primitive::<arrow::datatypes::Float32Type>();
            (0..b.num_rows())
                .map(|i| (k.value(i).to_string(), s.value(i)))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_text_query_reads_the_postings_of_its_terms_not_the_index() {
    let inner = one_generation(20_000).await;
    let store = LatencyStore::new(inner, LatencyConfig::default());
    let ro = read_only(store.clone()).await;
    let object = ro.stats().generations[0].bytes;
    // Postings and positions stay in the cold part: what the text index holds is its term
    // dictionary, fieldnorms, row table and token counts (4 bytes a row), about 12 bytes a
    // row here, not 8 words' postings and positions per row as well.
    let text = ro.cache_stats().await.resident.text;
    println!("text held: {text} bytes for 20,000 rows");
    assert!(text < 20_000 * 13, "the text index holds {text} bytes");
    store.reset();
    let hits = ro
        .search_fts("mach", &SearchOptions::with_k(1))
        .await
        .unwrap();
    assert_eq!(keys(&hits).len(), 1);
    let one = store.counters();
    store.reset();
    let hits = ro
        .search_fts("\"shock nozzle\" wave", &SearchOptions::with_k(1))
        .await
        .unwrap();
    assert_eq!(keys(&hits).len(), 1);
    let three = store.counters();
    println!(
        "object {object} bytes: a one-term query read {} bytes ({} round trips), a phrase and a term {} bytes ({} round trips)",
        one.bytes_read, one.round_trips, three.bytes_read, three.round_trips
    );
    // One round for the postings (and the phrase's positions) of the query's terms, then one
    // for the page of the row returned (unless the first query read it).
    assert_eq!(one.round_trips, 2, "{one:?}");
    assert!((1..=2).contains(&three.round_trips), "{three:?}");
    assert!(
        one.bytes_read * 20 < object && three.bytes_read * 10 < object,
        "{one:?} {three:?} of {object} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_query_scores_cold_postings_as_held_ones() {
    let inner = one_generation(20_000).await;
    let cold = read_only(inner).await;
    // The same rows in a writer's memtable, whose index is held in memory.
    let s = schema();
    let held = Index::create(
        Location::from_store(Arc::new(object_store::memory::InMemory::new()), "idx"),
        s.clone(),
        Settings {
            memtable_max_rows: 30_000,
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    for from in (0..20_000).step_by(5_000) {
        held.append(&batch(&s, from, from + 5_000)).await.unwrap();
    }
    assert!(held.stats().generations.is_empty());
    // Terms and phrases (fetched before the search) and a phrase prefix, whose last term
    // tantivy expands while it searches (read when it asks).
    for q in [
        "shock",
        "shock nozzle -wave",
        "+mach +\"nozzle mach\"",
        "\"heat drag\"~2",
        "\"nozzle ma\"*",
    ] {
        let opts = SearchOptions::with_k(25);
        let want = scored(&held.search_fts(q, &opts).await.unwrap());
        let got = scored(&cold.search_fts(q, &opts).await.unwrap());
        assert!(!want.is_empty(), "{q}");
        assert_eq!(got, want, "{q}");
    }
    held.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_handle_answers_its_first_query_in_four_round_trips() {
    let inner = one_generation(20_000).await;
    // Rows in the WAL past the generation, which a new handle replays.
    let writer = Index::open(
        Location::from_store(inner.clone(), "idx"),
        Settings::default(),
    )
    .await
    .unwrap();
    writer
        .append(&batch(&schema(), 20_000, 20_010))
        .await
        .unwrap();
    writer.close().await.unwrap();
    let store = LatencyStore::new(inner, LatencyConfig::default());
    for (what, query) in [("full-text", "shock nozzle"), ("filtered", "wave")] {
        store.reset();
        let ro = read_only(store.clone()).await;
        // The manifest (carried by LATEST) with the listings, then the hot part with the WAL.
        let open = store.counters();
        assert_eq!(open.round_trips, 2, "{what}: the open: {open:?}");
        assert_eq!(ro.stats().memtable_rows, 10);
        let opts = SearchOptions {
            filter: (what == "filtered").then(|| "year > 1990".to_string()),
            ..SearchOptions::with_k(10)
        };
        let hits = ro.search_fts(query, &opts).await.unwrap();
        assert_eq!(keys(&hits).len(), 10);
        let all = store.counters();
        println!("{what}: open {open:?}, open and first query {all:?}");
        // Then the postings of the query's terms (and the filter's column), then the pages
        // of the rows returned.
        assert!(all.round_trips <= 4, "{what}: {all:?}");
    }
}

/// A writer of schema `s` in memory behind a [`LatencyStore`] (whose counters a test reads),
/// with `settings` and memtables of up to 20,000 rows (nothing flushes before the test does);
/// its location, to open read-only handles beside it.
async fn writer_in_memory(
    s: &IndexSchema,
    settings: Settings,
) -> (Arc<LatencyStore>, Location, Index) {
    let store = LatencyStore::new(
        Arc::new(object_store::memory::InMemory::new()),
        LatencyConfig::default(),
    );
    let loc = Location::from_store(store.clone(), "idx");
    let settings = Settings {
        memtable_max_rows: 20_000,
        ..settings
    };
    let index = Index::create(loc.clone(), s.clone(), settings)
        .await
        .unwrap();
    (store, loc, index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_searches_the_postings_it_just_flushed_without_a_request() {
    let s = schema();
    let (store, _, index) = writer_in_memory(&s, Settings::default()).await;
    for from in (0..5_000).step_by(1_000) {
        index.append(&batch(&s, from, from + 1_000)).await.unwrap();
    }
    index.flush().await.unwrap();
    store.reset();
    let hits = index
        .search_fts("shock nozzle", &SearchOptions::with_k(1))
        .await
        .unwrap();
    assert_eq!(keys(&hits).len(), 1);
    // The page of the row returned, and nothing for the postings: the flush left them in
    // the block cache's memory as it wrote them.
    let c = store.counters();
    assert!(c.round_trips <= 1, "{c:?}");
    index.close().await.unwrap();
}

/// Numbers in [-0.5, 0.5) drawn from `seed` (xorshift).
fn pseudo_random(seed: u64) -> impl FnMut() -> f32 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// The keys (`k000123`) and 128-d vectors (from `next`) of rows `from..from + 1000`.
fn keys_and_vectors(from: usize, next: &mut impl FnMut() -> f32) -> Vec<arrow::array::ArrayRef> {
    let values: Vec<f32> = (0..1_000 * 128).map(|_| next()).collect();
    vec![
        Arc::new(StringArray::from_iter_values(
            (from..from + 1_000).map(|i| format!("k{i:06}")),
        )),
        Arc::new(
            arrow::array::FixedSizeListArray::try_new(
                Arc::new(arrow::datatypes::Field::new(
                    "item",
                    arrow::datatypes::DataType::Float32,
                    true,
                )),
                128,
                Arc::new(arrow::array::Float32Array::from(values)),
                None,
            )
            .unwrap(),
        ),
    ]
}

/// `gens` generations of `rows` rows each of 128-d vectors (pseudo-random, cosine), with a
/// year, in memory.
async fn vector_generations(gens: usize, rows: usize) -> Arc<dyn object_store::ObjectStore> {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let s = IndexSchema::from_json(
        r#"{"primary_key": "id", "vector": {"column": "v", "dim": 128, "metric": "cosine"},
            "payload": [{"name": "year", "type": "int64"}]}"#,
    )
    .unwrap();
    let index = Index::create(
        Location::from_store(inner.clone(), "idx"),
        s.clone(),
        Settings {
            memtable_max_rows: rows,
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    let mut next = pseudo_random(0x2545_f491_4f6c_dd1d);
    for from in (0..gens * rows).step_by(1_000) {
        let mut columns = keys_and_vectors(from, &mut next);
        columns.push(Arc::new(Int64Array::from_iter_values(
            (from..from + 1_000).map(|i| 1950 + (i % 50) as i64),
        )));
        let b = RecordBatch::try_new(s.arrow_schema(), columns).unwrap();
        index.append(&b).await.unwrap();
    }
    index.flush().await.unwrap();
    assert_eq!(index.stats().generations.len(), gens);
    index.close().await.unwrap();
    inner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_vector_query_reranks_the_best_candidates_of_all_generations_at_once() {
    let inner = vector_generations(4, 5_000).await;
    let store = LatencyStore::new(inner, LatencyConfig::default());
    let ro = read_only(store.clone()).await;
    let query: Vec<f32> = (0..128).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
    let exact = ro
        .search_vector(
            &query,
            &lsmsearch::VectorSearchOptions {
                exact: true,
                ..lsmsearch::VectorSearchOptions::with_k(10)
            },
        )
        .await
        .unwrap();
    let exact = valued(&exact, "_distance");
    let ro = read_only(store.clone()).await;
    store.reset();
    let hits = valued(
        &ro.search_vector(&query, &lsmsearch::VectorSearchOptions::with_k(10))
            .await
            .unwrap(),
        "_distance",
    );
    let c = store.counters();
    println!("a cold vector query over 4 generations: {c:?}");
    // Every distance returned is exact, and the walk finds the nearest rows.
    let by_key: std::collections::HashMap<&str, f32> =
        exact.iter().map(|(k, d)| (k.as_str(), *d)).collect();
    let found = hits
        .iter()
        .filter(|(k, _)| by_key.contains_key(k.as_str()))
        .count();
    assert!(
        found >= 8,
        "{found} of the exact top 10: {hits:?} {exact:?}"
    );
    for (k, d) in &hits {
        if let Some(e) = by_key.get(k.as_str()) {
            assert_eq!(d, e, "{k}");
        }
    }
    // The vectors of the best 100 candidates of all four generations (one block each at
    // most), then the payload of the ten rows returned: two rounds.
    assert!(c.gets <= 100 + 10, "{c:?}");
    assert!(c.round_trips <= 2, "{c:?}");
}

/// A key and a text column.
fn text_schema() -> IndexSchema {
    IndexSchema::from_json(r#"{"primary_key": "id", "text": ["body"]}"#).unwrap()
}

/// Rows `from..to` of [`text_schema`]: [`batch`]'s bodies, with " shock" added but at `salt` 0.
fn text_rows(s: &IndexSchema, from: usize, to: usize, salt: usize) -> RecordBatch {
    let full = batch(&schema(), from, to);
    let body = full.column(1).as_string::<i32>();
    RecordBatch::try_new(
        s.arrow_schema(),
        vec![
            full.column(0).clone(),
            Arc::new(StringArray::from_iter((0..full.num_rows()).map(|i| {
                Some(match salt {
                    0 => body.value(i).to_string(),
                    _ => format!("{} shock", body.value(i)),
                })
            }))),
        ],
    )
    .unwrap()
}

/// A writer of a text-only index (nothing returned is read by range) with one generation of
/// 5,000 rows, searched once, then 29 of its rows updated in the memtable; with
/// `dead_row_terms_bytes` = `ahead`. Returns the GETs of the next search, its hits, and the
/// hits of the same search from a new read-only handle (which counts the superseded rows
/// from their text as it reads them).
async fn search_after_updates(ahead: u64) -> (u64, Vec<(String, f32)>, Vec<(String, f32)>) {
    let s = text_schema();
    let rows = |from: usize, to: usize, salt: usize| text_rows(&s, from, to, salt);
    let settings = Settings {
        dead_row_terms_bytes: ahead,
        ..Settings::default()
    };
    let (store, loc, index) = writer_in_memory(&s, settings).await;
    for from in (0..5_000).step_by(1_000) {
        index.append(&rows(from, from + 1_000, 0)).await.unwrap();
    }
    index.flush().await.unwrap();
    // Keys and scores only: the text of the rows returned would bring the blocks of the
    // superseded rows with it.
    let opts = SearchOptions {
        columns: Some(Vec::new()),
        ..SearchOptions::with_k(10)
    };
    index.search_fts("shock nozzle", &opts).await.unwrap();
    let updated: Vec<usize> = (0..200).step_by(7).collect();
    for &r in &updated {
        index.append(&rows(r, r + 1, 1)).await.unwrap();
    }
    if ahead > 0 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while index.cache_stats().await.dead_row_terms_rows < updated.len() as u64 {
            assert!(
                std::time::Instant::now() < deadline,
                "the superseded rows were not read ahead: {:?}",
                index.cache_stats().await
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    store.reset();
    let hits = scored(&index.search_fts("shock nozzle", &opts).await.unwrap());
    let gets = store.counters().gets;
    let ro = Index::open_read_only(loc, Settings::default())
        .await
        .unwrap();
    let expected = scored(&ro.search_fts("shock nozzle", &opts).await.unwrap());
    // Its first count read the superseded rows and keeps nothing of them: no older view
    // uncounts what a first count counted.
    assert_eq!(ro.cache_stats().await.dead_row_terms_rows, 0);
    index.close().await.unwrap();
    (gets, hits, expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_reads_the_rows_appends_supersede_before_its_searches_need_them() {
    // Without reading ahead, the search reads the superseded rows' text to take their terms
    // out of the statistics.
    let (gets, hits, expected) = search_after_updates(0).await;
    assert!(gets > 0, "the search read the superseded rows' text");
    assert_eq!(hits, expected);
    // Read ahead, it reads nothing, and scores the same.
    let (gets, hits, expected) = search_after_updates(16 << 20).await;
    assert_eq!(gets, 0, "the superseded rows' terms were read ahead");
    assert_eq!(hits, expected);
    assert_eq!(hits.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_counts_what_the_memtables_supersede_before_searches_see_it() {
    let s = text_schema();
    let (store, loc, index) = writer_in_memory(&s, Settings::default()).await;
    // Two generations, searched once.
    for (from, to) in [(0, 3_000), (3_000, 5_000)] {
        index.append(&text_rows(&s, from, to, 0)).await.unwrap();
        index.flush().await.unwrap();
    }
    let opts = SearchOptions::with_k(10);
    index.search_fts("shock nozzle", &opts).await.unwrap();
    // The memtable supersedes rows of both; a search counts them out.
    for r in (0..5_000).step_by(97) {
        index.append(&text_rows(&s, r, r + 1, 1)).await.unwrap();
    }
    index.search_fts("shock nozzle", &opts).await.unwrap();
    // The merged generation holds those rows again: counted out as it is published, not
    // read by the next search.
    index
        .compact()
        .await
        .unwrap()
        .expect("the two generations merge");
    assert_eq!(index.stats().generations.len(), 1);
    store.reset();
    let hits = scored(&index.search_fts("shock nozzle", &opts).await.unwrap());
    assert_eq!(store.counters().gets, 0, "the search read superseded rows");
    let ro = Index::open_read_only(loc, Settings::default())
        .await
        .unwrap();
    let expected = scored(&ro.search_fts("shock nozzle", &opts).await.unwrap());
    assert_eq!(hits, expected);
    assert_eq!(hits.len(), 10);
    index.close().await.unwrap();
}

/// The GETs of a vector search right after a writer with `cache_bytes` flushed 5,000 rows
/// of 128-d vectors (2.5 MB).
async fn gets_of_a_search_after_a_flush(cache_bytes: u64) -> u64 {
    let s = IndexSchema::from_json(
        r#"{"primary_key": "id", "vector": {"column": "v", "dim": 128, "metric": "cosine"}}"#,
    )
    .unwrap();
    let settings = Settings {
        cache_bytes,
        ..Settings::default()
    };
    let (store, _, index) = writer_in_memory(&s, settings).await;
    let mut next = pseudo_random(0x9e37_79b9_7f4a_7c15);
    for from in (0..5_000).step_by(1_000) {
        let b = RecordBatch::try_new(s.arrow_schema(), keys_and_vectors(from, &mut next)).unwrap();
        index.append(&b).await.unwrap();
    }
    index.flush().await.unwrap();
    assert_eq!(index.stats().generations.len(), 1);
    store.reset();
    let query: Vec<f32> = (0..128).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
    let hits = index
        .search_vector(&query, &lsmsearch::VectorSearchOptions::with_k(10))
        .await
        .unwrap();
    assert_eq!(keys(&hits).len(), 10);
    let gets = store.counters().gets;
    index.close().await.unwrap();
    gets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_reranks_the_vectors_it_just_flushed_without_a_request() {
    // The flush left the vectors in the block cache's memory as it wrote them: the
    // candidates are re-ranked without a request.
    assert_eq!(
        gets_of_a_search_after_a_flush(Settings::default().cache_bytes).await,
        0
    );
    // Not when they would take more than a quarter of the blocks' budget (1 MiB of 4).
    assert!(gets_of_a_search_after_a_flush(8 << 20).await > 0);
}

/// A read-only handle, over a latency store, on a generation of 20,000 rows, with `settings`
/// but caches so small that a few queries push each other's postings (and their blocks) out.
async fn small_caches(settings: Settings) -> (Arc<LatencyStore>, ReadOnlyIndex) {
    let inner = one_generation(20_000).await;
    let store = LatencyStore::new(inner, LatencyConfig::default());
    let settings = Settings {
        cache_bytes: 80 << 10,
        ..settings
    };
    let ro = Index::open_read_only(Location::from_store(store.clone(), "idx"), settings)
        .await
        .unwrap();
    (store, ro)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postings_pushed_out_of_the_caches_are_fetched_again_in_one_round() {
    let (store, ro) = small_caches(Settings::default()).await;
    let opts = SearchOptions::with_k(1);
    // Terms whose postings lie in three different blocks of the postings file.
    let query = "drag mach wing";
    let rounds = |label: &'static str| {
        let c = store.counters();
        println!("{label}: {c:?}");
        store.reset();
        c
    };
    ro.search_fts(query, &opts).await.unwrap();
    rounds("cold");
    ro.search_fts(query, &opts).await.unwrap();
    let warm = rounds("warm");
    for other in ["flow layer heat", "jet lift nozzle", "plate wave shock"] {
        ro.search_fts(other, &opts).await.unwrap();
    }
    rounds("others");
    ro.search_fts(query, &opts).await.unwrap();
    let again = rounds("again");
    // Warm, nothing was read: the postings were found kept (and remembered as kept).
    assert_eq!(warm.gets, 0, "{warm:?}");
    // Pushed out since, they are read again: all three in one round, then the page of the
    // row returned; not one term at a time as the search asks (four round trips).
    assert!(again.gets >= 3, "the postings left the caches: {again:?}");
    assert!(again.round_trips <= 2, "{again:?}");
}

/// A generation pushed out of the handle's cache of generations is opened again for the next
/// query: that copy's postings are read ahead in one round, as the first copy's were, not
/// one term at a time as its search asks (what the handle keeps of the terms names the first
/// copy's files, which no search reads any more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_opened_again_reads_its_postings_ahead_in_one_round() {
    // Besides, no generation stays open between queries.
    let (store, ro) = small_caches(Settings {
        hot_cache_bytes: 1,
        ..Settings::default()
    })
    .await;
    let opts = SearchOptions::with_k(1);
    let query = "drag mach wing";
    let want = keys(&ro.search_fts(query, &opts).await.unwrap());
    for other in ["flow layer heat", "jet lift nozzle", "plate wave shock"] {
        ro.search_fts(other, &opts).await.unwrap();
    }
    store.reset();
    assert_eq!(keys(&ro.search_fts(query, &opts).await.unwrap()), want);
    let again = store.counters();
    // The generation's hot part, its three terms' postings in one round, then the page of
    // the row returned.
    assert!(again.gets >= 3, "the postings left the caches: {again:?}");
    assert!(again.round_trips <= 3, "{again:?}");
}

/// A generation opened again leaves nothing of its earlier opening in what the handle keeps
/// of its searches' terms: the entries of terms no search asks for again would hold the
/// earlier opening's files (its held pieces and its reader) until the generations change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_opened_again_keeps_nothing_of_its_earlier_opening() {
    let inner = one_generation(20_000).await;
    // No generation stays open between queries.
    let settings = Settings {
        hot_cache_bytes: 1,
        ..Settings::default()
    };
    let ro = Index::open_read_only(Location::from_store(inner, "idx"), settings)
        .await
        .unwrap();
    let opts = SearchOptions::with_k(1);
    ro.search_fts("drag mach wing", &opts).await.unwrap();
    let three = ro.cache_stats().await.term_entries;
    ro.search_fts("drag", &opts).await.unwrap();
    let one = ro.cache_stats().await.term_entries;
    // The second search's opening replaced the entries of its term; those of the other two
    // terms named the first opening, and went.
    assert!(one < three, "{three} rows and entries, then {one}");
    // Asked again, the terms find their entries made again, as many as the first time.
    ro.search_fts("drag mach wing", &opts).await.unwrap();
    assert_eq!(ro.cache_stats().await.term_entries, three);
}

/// A refresh reads the WAL objects written since the last one, and nothing else: with nothing
/// new it reads no WAL object, and one new object costs one GET whatever the WAL's length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_reads_only_the_wal_objects_written_since() {
    let inner = one_generation(1_000).await;
    let s = schema();
    let writer = Index::open(
        Location::from_store(inner.clone(), "idx"),
        Settings::default(),
    )
    .await
    .unwrap();
    // Eight WAL objects past the generation.
    for i in 0..8 {
        let from = 1_000 + i * 10;
        writer.append(&batch(&s, from, from + 10)).await.unwrap();
    }
    let store = LatencyStore::new(inner, LatencyConfig::default());
    let ro = read_only(store.clone()).await;
    assert_eq!(ro.stats().memtable_rows, 80);
    store.reset();
    ro.refresh().await.unwrap();
    let idle = store.counters();
    // The manifest's hint (it carries the manifest) and nothing of the WAL.
    assert_eq!(idle.gets, 1, "{idle:?}");
    writer.append(&batch(&s, 1_080, 1_090)).await.unwrap();
    store.reset();
    ro.refresh().await.unwrap();
    let one = store.counters();
    assert_eq!(one.gets, 2, "{one:?}");
    assert_eq!(ro.stats().memtable_rows, 90);
    let all = ro.scan(ScanOptions::default()).await.unwrap();
    assert_eq!(
        all.iter().map(|b| b.num_rows()).sum::<usize>(),
        1_090,
        "every row once"
    );
    // A row updated in the WAL replaces its earlier version in what the view shows.
    writer.append(&batch(&s, 1_005, 1_006)).await.unwrap();
    ro.refresh().await.unwrap();
    let hits = ro
        .search_fts(
            "wing flow shock layer heat nozzle lift drag mach jet plate wave",
            &SearchOptions::with_k(2_000),
        )
        .await
        .unwrap();
    let mut got = keys(&hits);
    got.sort();
    let before = got.len();
    got.dedup();
    assert_eq!(before, got.len(), "a key shown twice");
    writer.close().await.unwrap();
}

/// Refreshes that arrive while one is under way share the next one: eight at once read the
/// manifest a few times, not eight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_refreshes_share_their_reads() {
    let inner = one_generation(1_000).await;
    let store = LatencyStore::new(inner, LatencyConfig::default());
    let ro = Arc::new(read_only(store.clone()).await);
    store.reset();
    let all = (0..8).map(|_| {
        let ro = ro.clone();
        tokio::spawn(async move { ro.refresh().await })
    });
    for r in futures::future::join_all(all).await {
        r.unwrap().unwrap();
    }
    let c = store.counters();
    // Each refresh lists the manifests and the WAL: at most two refreshes' worth.
    assert!(c.lists <= 4, "{c:?}");
}
