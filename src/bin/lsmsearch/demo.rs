//! `lsmsearch demo`: a guided tour on a local directory.

use arrow::array::{Array, AsArray};
use arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::Float32Type;
use arrow::datatypes::{DataType, Field};
use lsmsearch::{Index, IndexSchema, Key, Location, ScanOptions, SearchOptions, Settings};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

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
    "number",
    "drag",
    "lift",
    "vortex",
    "wake",
    "buckling",
    "shell",
    "panel",
    "flutter",
    "temperature",
];
const DIM: usize = 16;

fn schema() -> IndexSchema {
    IndexSchema::from_json(&format!(
        r#"{{"primary_key": "id", "text": ["title", "body"],
            "vector": {{"column": "emb", "dim": {DIM}, "metric": "cosine"}},
            "payload": [{{"name": "year", "type": "int64"}}, {{"name": "lang", "type": "utf8"}}]}}"#
    ))
    .expect("the demo schema is valid")
}

fn batch(index: &Index, rng: &mut StdRng, ids: &[usize], version: usize) -> RecordBatch {
    let sentence = |rng: &mut StdRng, n: usize| {
        (0..n)
            .map(|_| WORDS[rng.random_range(0..WORDS.len())])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let keys: Vec<String> = ids.iter().map(|i| format!("doc-{i:06}")).collect();
    let titles: Vec<String> = ids.iter().map(|_| sentence(rng, 4)).collect();
    let bodies: Vec<String> = ids
        .iter()
        .map(|_| format!("{} (version {version})", sentence(rng, 40)))
        .collect();
    let years: Vec<i64> = ids.iter().map(|i| 1950 + (*i as i64 % 70)).collect();
    let langs: Vec<&str> = ids
        .iter()
        .map(|i| if i % 5 == 0 { "fr" } else { "en" })
        .collect();
    let values: Vec<f32> = (0..ids.len() * DIM)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let emb = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        DIM as i32,
        Arc::new(Float32Array::from(values)),
        None,
    )
    .expect("valid vectors");
    RecordBatch::try_new(
        index.arrow_schema(),
        vec![
            Arc::new(StringArray::from(keys)),
            Arc::new(StringArray::from(titles)),
            Arc::new(StringArray::from(bodies)),
            Arc::new(emb),
            Arc::new(Int64Array::from(years)),
            Arc::new(StringArray::from(langs)),
        ],
    )
    .expect("the demo batch matches the schema")
}

/// One line per row of a search: key, `value` (score or distance) and title.
fn hit_lines(rows: &[RecordBatch], value: &str) -> Vec<String> {
    let mut out = Vec::new();
    for b in rows {
        let ids = b.column(0).as_string::<i32>();
        let (Some(values), Some(titles)) = (b.column_by_name(value), b.column_by_name("title"))
        else {
            continue;
        };
        let (values, titles) = (
            values.as_primitive::<Float32Type>(),
            titles.as_string::<i32>(),
        );
        for i in 0..b.num_rows() {
            out.push(format!(
                "  {} {value} {:.3}  \"{}\"",
                ids.value(i),
                values.value(i),
                titles.value(i)
            ));
        }
    }
    out
}

fn count(rows: &[RecordBatch]) -> usize {
    rows.iter().map(|b| b.num_rows()).sum()
}

pub async fn run(dir: Option<PathBuf>, json: bool) -> lsmsearch::Result<()> {
    let dir = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("lsmsearch-demo-{}", std::process::id()))
    });
    let location = dir.display().to_string();
    let settings = Settings {
        memtable_max_rows: 1_500,
        ..Settings::default()
    };
    let loc = Location::parse(&location)?;
    // Reuse the demo index when the directory holds one (a second run), else create it.
    let index = match Index::open(loc.clone(), settings.clone()).await {
        Ok(i) => i,
        Err(e) if e.kind() == lsmsearch::ErrorKind::Invalid => {
            Index::create(loc, schema(), settings).await?
        }
        Err(e) => return Err(e),
    };
    let say = |s: String| {
        if !json {
            println!("{s}");
        }
    };
    say(format!(
        "lsmsearch demo: index at {location} (writer epoch {})",
        index.epoch()
    ));
    let mut rng = StdRng::seed_from_u64(42);
    let total = 6_000;
    let started = Instant::now();
    for chunk in (0..total).collect::<Vec<_>>().chunks(500) {
        index.append(&batch(&index, &mut rng, chunk, 1)).await?;
    }
    let secs = started.elapsed().as_secs_f64();
    say(format!(
        "appended {total} rows in 12 durable batches in {:.0} ms ({:.0} rows/s); memtable threshold 1,500 rows",
        secs * 1e3,
        total as f64 / secs
    ));
    // Update every 10th document and delete every 7th: newest version wins, tombstones hide.
    let updates: Vec<usize> = (0..total).step_by(10).collect();
    index.append(&batch(&index, &mut rng, &updates, 2)).await?;
    let deletes: Vec<Key> = (0..total)
        .step_by(7)
        .map(|i| Key::from(format!("doc-{i:06}")))
        .collect();
    index.delete(&deletes).await?;
    say(format!(
        "updated {} rows, deleted {} keys",
        updates.len(),
        deletes.len()
    ));
    index.flush().await?;

    let all = index.scan(ScanOptions::default()).await?;
    say(format!(
        "scan: {} live rows (expected {})",
        count(&all),
        total - deletes.len()
    ));
    for filter in [
        "year >= 2000 AND lang = 'fr'",
        "body LIKE '%version 2%'",
        "title LIKE 'shock%'",
    ] {
        let rows = index
            .scan(ScanOptions {
                filter: Some(filter.to_string()),
            })
            .await?;
        say(format!("scan --filter \"{filter}\": {} rows", count(&rows)));
    }
    for (query, filter) in [
        ("shock boundary layer", None),
        ("\"heat transfer\" +turbulent", None),
        ("supersonic nozzle", Some("lang = 'fr'")),
    ] {
        let opts = SearchOptions {
            k: 3,
            filter: filter.map(str::to_string),
            ..Default::default()
        };
        let hits = index.search_fts(query, &opts).await?;
        let f = filter
            .map(|f| format!(" --filter \"{f}\""))
            .unwrap_or_default();
        say(format!("search --fts '{query}'{f} -k 3:"));
        hit_lines(&hits, "_score").into_iter().for_each(&say);
    }
    // The same words and a vector: nearest neighbours, then both fused (reciprocal rank
    // fusion), each row with its title.
    let v: Vec<f32> = (0..DIM).map(|_| rng.random_range(-1.0..1.0)).collect();
    let shown = format!("[{:.2}, {:.2}, ...]", v[0], v[1]);
    let nearest = index
        .search_vector(&v, &lsmsearch::VectorSearchOptions::with_k(3))
        .await?;
    say(format!("search --vector '{shown}' -k 3:"));
    hit_lines(&nearest, "_distance").into_iter().for_each(&say);
    let fused = index
        .search_hybrid(
            "shock boundary layer",
            &v,
            &lsmsearch::HybridSearchOptions::with_k(3),
        )
        .await?;
    say(format!(
        "search --fts 'shock boundary layer' --vector '{shown}' -k 3 (hybrid):"
    ));
    hit_lines(&fused, "_score").into_iter().for_each(&say);
    let opts = SearchOptions {
        k: 1,
        highlight: Some(lsmsearch::Highlight {
            columns: Some(vec!["body".into()]),
            max_chars: 60,
            ..Default::default()
        }),
        ..Default::default()
    };
    let snippet = index.search_fts("shock boundary layer", &opts).await?;
    if let Some(h) = snippet
        .first()
        .and_then(|b| b.column_by_name("_highlight_body"))
    {
        let h = h.as_string::<i32>();
        if !h.is_empty() && h.is_valid(0) {
            say(format!("search ... --highlight: {}", h.value(0)));
        }
    }
    let stats = index.stats();
    index.close().await?;
    // A second process would see the same through a read-only handle.
    let reader = Index::open_read_only(Location::parse(&location)?, Settings::default()).await?;
    let seen = count(&reader.scan(ScanOptions::default()).await?);
    say(format!("read-only handle sees {seen} live rows"));
    if json {
        println!("{}", serde_json::to_string(&stats).unwrap_or_default());
    } else {
        println!();
        super::print_stats(&stats, false);
        println!();
        println!("try: lsmsearch search {location} --fts 'wake vortex' -k 5");
        println!("     lsmsearch explain {location} --fts 'wake vortex'");
        println!("     lsmsearch search {location} --fts 'wake vortex' --highlight --count");
        println!(
            "     lsmsearch sql {location} \"SELECT year, count(*) FROM fts('docs', 'wake vortex', 100) GROUP BY year\""
        );
        println!("     lsmsearch scan {location} --filter \"year = 1998\" | head");
    }
    Ok(())
}
