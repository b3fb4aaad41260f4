//! Full-text search behaviour: never short, filters inside the arms, bad input, the plan's
//! shape, read-your-writes, and the sequential round trips of a cold query.

mod common;

use arrow::array::{AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::Float32Type;
use common::fts::{assert_same_ranking, Reference};
use lsmsearch::{
    ErrorKind, Index, IndexSchema, Key, LatencyConfig, LatencyStore, Location, SearchOptions,
    Settings,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn schema() -> IndexSchema {
    IndexSchema::from_json(
        r#"{"primary_key": "id", "text": ["title", "body"],
            "payload": [{"name": "year", "type": "int64"}, {"name": "lang", "type": "utf8"}]}"#,
    )
    .unwrap()
}

type Rows = Vec<(String, String, String, i64, String)>;

fn batch(s: &IndexSchema, rows: &Rows) -> RecordBatch {
    RecordBatch::try_new(
        s.arrow_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0.clone()),
            )),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.1.clone()),
            )),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.2.clone()),
            )),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.4.clone()),
            )),
        ],
    )
    .unwrap()
}

fn results(batches: &[RecordBatch]) -> Vec<(String, f32)> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column(0).as_string::<i32>();
        let scores = b.column(1).as_primitive::<Float32Type>();
        for i in 0..b.num_rows() {
            out.push((ids.value(i).to_string(), scores.value(i)));
        }
    }
    out
}

fn row(
    id: &str,
    title: &str,
    body: &str,
    year: i64,
    lang: &str,
) -> (String, String, String, i64, String) {
    (id.into(), title.into(), body.into(), year, lang.into())
}

#[tokio::test]
async fn never_short_when_the_best_matches_are_superseded_or_deleted() {
    let s = schema();
    let index = Index::create(common::memory(), s.clone(), Settings::default())
        .await
        .unwrap();
    // The strongest matches for "alpha", in the oldest generation.
    let strong: Rows = (0..30)
        .map(|i| {
            row(
                &format!("s{i:02}"),
                "alpha alpha",
                "alpha alpha alpha",
                2000,
                "en",
            )
        })
        .collect();
    index.append(&batch(&s, &strong)).await.unwrap();
    index.flush().await.unwrap();
    // Weak matches spread over a newer generation and the memtable.
    let filler = "one two three four five six seven eight nine ten eleven twelve";
    let weak: Rows = (0..8)
        .map(|i| {
            row(
                &format!("w{i:02}"),
                "beta",
                &format!("alpha {filler}"),
                1990,
                "en",
            )
        })
        .collect();
    index.append(&batch(&s, &weak[..4].to_vec())).await.unwrap();
    index.flush().await.unwrap();
    // Supersede half of the strong rows (no alpha any more) and delete the other half.
    let replaced: Rows = (0..15)
        .map(|i| row(&format!("s{i:02}"), "gamma", "gamma", 2001, "en"))
        .collect();
    index.append(&batch(&s, &replaced)).await.unwrap();
    index.flush().await.unwrap();
    let gone: Vec<Key> = (15..30).map(|i| Key::from(format!("s{i:02}"))).collect();
    index.delete(&gone).await.unwrap();
    index.append(&batch(&s, &weak[4..].to_vec())).await.unwrap();

    for k in [1, 5, 8, 20] {
        let got = results(
            &index
                .search_fts("alpha", &SearchOptions::with_k(k))
                .await
                .unwrap(),
        );
        assert_eq!(got.len(), k.min(8), "k = {k}: {got:?}");
        assert!(got.iter().all(|(id, _)| id.starts_with('w')), "{got:?}");
    }
}

#[tokio::test]
async fn filters_equal_filtering_the_live_rows_then_ranking() {
    let s = schema();
    let index = Index::create(common::memory(), s.clone(), Settings::default())
        .await
        .unwrap();
    let words = ["wing", "flow", "shock", "layer", "heat", "plate"];
    let mut live = BTreeMap::new();
    let mut meta = BTreeMap::new();
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for g in 0..6 {
        let rows: Rows = (0..40)
            .map(|_| {
                let key = format!("d{:03}", rng.random_range(0..150)); // updates across generations
                let n = rng.random_range(2..10);
                let body: Vec<&str> = (0..n).map(|_| words[rng.random_range(0..6)]).collect();
                let lang = if rng.random_bool(0.3) { "fr" } else { "en" };
                row(
                    &key,
                    words[rng.random_range(0..6)],
                    &body.join(" "),
                    rng.random_range(1990..2020),
                    lang,
                )
            })
            .collect();
        index.append(&batch(&s, &rows)).await.unwrap();
        for r in &rows {
            live.insert(r.0.clone(), vec![Some(r.1.clone()), Some(r.2.clone())]);
            meta.insert(r.0.clone(), (r.3, r.4.clone()));
        }
        if g < 5 {
            index.flush().await.unwrap();
        }
    }
    let reference = Reference::new(&["title", "body"], &live);
    let filter = "year >= 2000 AND lang = 'en'";
    // The second time, the generations' passing rows are the ones kept from the first.
    for q in ["flow", "shock heat", "+layer plate"]
        .into_iter()
        .cycle()
        .take(6)
    {
        let opts = SearchOptions {
            k: 7,
            filter: Some(filter.into()),
            ..Default::default()
        };
        let ours = results(&index.search_fts(q, &opts).await.unwrap());
        let want: Vec<(String, f32)> = reference
            .search(q, false)
            .into_iter()
            .filter(|(k, _)| {
                let (y, l) = &meta[k];
                *y >= 2000 && l == "en"
            })
            .collect();
        assert!(!want.is_empty());
        assert_same_ranking(&ours, &want, 7, &format!("{q} with {filter}"));
    }
}

#[tokio::test]
async fn bad_queries_get_clear_errors() {
    let s = schema();
    let index = Index::create(common::memory(), s.clone(), Settings::default())
        .await
        .unwrap();
    index
        .append(&batch(&s, &vec![row("a", "x", "y", 1, "en")]))
        .await
        .unwrap();
    let check = |r: lsmsearch::Result<Vec<RecordBatch>>, mention: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
        assert!(
            e.to_string().contains(mention),
            "'{e}' should mention '{mention}'"
        );
    };
    let opts = SearchOptions::default();
    check(index.search_fts("\"unclosed", &opts).await, "unclosed");
    check(index.search_fts("nope:foo", &opts).await, "nope");
    check(index.search_fts("_row:1", &opts).await, "_row");
    check(index.search_fts("   ", &opts).await, "empty");
    check(
        index.search_fts("x", &SearchOptions::with_k(0)).await,
        "k must be",
    );
    let f = |f: &str| SearchOptions {
        filter: Some(f.into()),
        ..Default::default()
    };
    check(index.search_fts("x", &f("colour = 'red'")).await, "colour");
    check(index.search_fts("x", &f("year +")).await, "year +");
    check(index.search_fts("x", &f("year + 1")).await, "Boolean");

    let plain = IndexSchema::from_json(
        r#"{"primary_key": "id", "payload": [{"name": "year", "type": "int64"}]}"#,
    )
    .unwrap();
    let no_text = Index::create(common::memory(), plain, Settings::default())
        .await
        .unwrap();
    check(no_text.search_fts("x", &opts).await, "without text columns");
    // The index is unchanged and still answers.
    assert_eq!(
        results(&index.search_fts("x", &opts).await.unwrap()).len(),
        1
    );
}

#[tokio::test]
async fn appended_rows_are_found_at_once_and_the_plan_has_one_arm_per_source() {
    let s = schema();
    let index = Index::create(common::memory(), s.clone(), Settings::default())
        .await
        .unwrap();
    for g in 0..3 {
        index
            .append(&batch(
                &s,
                &vec![row(&format!("g{g}"), "old", "text", 1, "en")],
            ))
            .await
            .unwrap();
        index.flush().await.unwrap();
    }
    index
        .append(&batch(&s, &vec![row("new", "fresh", "words", 1, "en")]))
        .await
        .unwrap();
    let got = results(
        &index
            .search_fts("fresh", &SearchOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(
        got.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        vec!["new"]
    );
    let plan = index
        .plan_fts("fresh", &SearchOptions::default())
        .await
        .unwrap();
    let text = datafusion::physical_plan::displayable(plan.as_ref())
        .indent(true)
        .to_string();
    assert!(text.contains("SortPreservingMergeExec"), "{text}");
    assert!(text.contains("fetch=10"), "{text}");
    assert!(text.contains("FtsArmExec: arms=4"), "{text}");
    assert_eq!(text.matches("[arm ").count(), 4, "{text}");
}

async fn cold_query_round_trips(generations: usize) -> (usize, usize) {
    cold_query_round_trips_with(generations, None).await
}

async fn cold_query_round_trips_with(generations: usize, filter: Option<&str>) -> (usize, usize) {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let s = schema();
    {
        let index = Index::create(
            Location::from_store(inner.clone(), "idx"),
            s.clone(),
            Settings::default(),
        )
        .await
        .unwrap();
        for g in 0..generations {
            let rows: Rows = (0..5)
                .map(|i| row(&format!("g{g}-{i}"), "wing", "flow over a wing", 1, "en"))
                .collect();
            index.append(&batch(&s, &rows)).await.unwrap();
            index.flush().await.unwrap();
        }
        index
            .append(&batch(
                &s,
                &vec![row("m", "wing", "memtable wing", 1, "en")],
            ))
            .await
            .unwrap();
        index.close().await.unwrap();
    }
    let delayed = LatencyStore::new(
        inner,
        LatencyConfig {
            read: Duration::from_millis(50),
            ..LatencyConfig::default()
        },
    );
    let loc = Location::from_store(delayed.clone(), "idx");
    let ro = Index::open_read_only(loc, Settings::default())
        .await
        .unwrap();
    let opts = SearchOptions {
        filter: filter.map(str::to_string),
        ..SearchOptions::with_k(10)
    };
    let got = ro.search_fts("wing", &opts).await.unwrap();
    assert_eq!(got.iter().map(|b| b.num_rows()).sum::<usize>(), 10);
    let c = delayed.counters();
    // Warm: the same handle again does no I/O at all.
    delayed.reset();
    ro.search_fts("wing", &opts).await.unwrap();
    assert_eq!(delayed.counters(), lsmsearch::StoreCounters::default());
    (c.round_trips as usize, c.gets as usize + c.lists as usize)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_query_needs_a_constant_number_of_sequential_round_trips() {
    let (rt32, req32) = cold_query_round_trips(32).await;
    let (rt2, _) = cold_query_round_trips(2).await;
    println!("cold query: 32 generations: {rt32} sequential round trips ({req32} requests); 2 generations: {rt2}");
    assert!(
        rt32 <= 6,
        "{rt32} sequential round trips over 32 generations"
    );
    assert_eq!(rt32, rt2, "round trips grow with the number of generations");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_filtered_query_needs_a_constant_number_of_sequential_round_trips() {
    // The filter's column is read by range from every generation, all at once.
    let (rt32, req32) = cold_query_round_trips_with(32, Some("year = 1")).await;
    let (rt2, _) = cold_query_round_trips_with(2, Some("year = 1")).await;
    println!("cold filtered query: 32 generations: {rt32} sequential round trips ({req32} requests); 2 generations: {rt2}");
    assert_eq!(rt32, rt2, "round trips grow with the number of generations");
}

#[tokio::test]
async fn filters_work_beside_tombstones_of_a_vector_schema() {
    // Tombstones carry nulls in columns the schema declares non-null (the vector): a filter must
    // still evaluate over them.
    let s = common::schema();
    let index = Index::create(common::memory(), s.clone(), Settings::default())
        .await
        .unwrap();
    let rows: Vec<common::Row> = (0..6)
        .map(|i| common::Row::new(format!("r{i}"), i))
        .collect();
    index.append(&common::batch(&s, &rows)).await.unwrap();
    index.delete(&[Key::from("r1")]).await.unwrap();
    index.flush().await.unwrap();
    index.delete(&[Key::from("r2")]).await.unwrap();
    let opts = SearchOptions {
        k: 10,
        filter: Some("year >= 3".into()),
        ..Default::default()
    };
    let got = results(&index.search_fts("body", &opts).await.unwrap());
    let mut keys: Vec<&str> = got.iter().map(|r| r.0.as_str()).collect();
    keys.sort();
    assert_eq!(keys, vec!["r3", "r4", "r5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generation_cache_keeps_to_its_byte_budget_and_results_do_not_change() {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let s = schema();
    // Six generations, as flushed (no compaction).
    let index = Index::create(
        Location::from_store(inner.clone(), "idx"),
        s.clone(),
        Settings {
            compaction: false,
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    for g in 0..6 {
        let rows: Rows = (0..20)
            .map(|i| {
                let text = format!("flow over a wing number {i} of {g} {}", "lift ".repeat(i));
                row(
                    &format!("k{}", (g * 7 + i) % 50),
                    "wing",
                    &text,
                    i as i64,
                    "en",
                )
            })
            .collect();
        index.append(&batch(&s, &rows)).await.unwrap();
        index.flush().await.unwrap();
    }
    let opts = SearchOptions::with_k(15);
    let want = results(&index.search_fts("lift wing", &opts).await.unwrap());
    let all = index.cache_stats().await;
    assert_eq!(all.generations, 6, "the writer caches what it flushes");
    index.close().await.unwrap();

    // A budget of about two generations (the six weigh about the same): every query still
    // sees all six.
    let budget = all.bytes / 3 + 1000;
    let delayed = LatencyStore::new(inner, LatencyConfig::default());
    let settings = Settings {
        hot_cache_bytes: budget,
        ..Settings::default()
    };
    let ro = Index::open_read_only(Location::from_store(delayed.clone(), "idx"), settings)
        .await
        .unwrap();
    for _ in 0..3 {
        delayed.reset();
        let got = results(&ro.search_fts("lift wing", &opts).await.unwrap());
        assert_eq!(got, want, "results depend on what the cache holds");
        assert!(
            delayed.counters().gets > 0,
            "six generations cannot stay within a budget of two"
        );
        let c = ro.cache_stats().await;
        assert!(c.bytes <= budget, "{c:?} over its budget");
        assert!(c.generations < 6, "{c:?}");
    }
    // With the default budget the same queries are served without any request once the rows
    // they return are cached (the first one reads them by range).
    let ro = Index::open_read_only(
        Location::from_store(delayed.clone(), "idx"),
        Settings::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        results(&ro.search_fts("lift wing", &opts).await.unwrap()),
        want
    );
    delayed.reset();
    assert_eq!(
        results(&ro.search_fts("lift wing", &opts).await.unwrap()),
        want
    );
    assert_eq!(delayed.counters(), lsmsearch::StoreCounters::default());
    assert_eq!(ro.cache_stats().await.generations, 6);
}
