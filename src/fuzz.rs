//! Fuzzing every decoder under `cargo test`, on the stable toolchain: the WAL, manifest and
//! generation codecs, the generation's sections (rows, key hashes, token counts, the tantivy
//! files, the vector graph), Arrow IPC, and the ingest readers (JSON lines, Parquet, Arrow IPC
//! files).
//!
//! Each target starts from valid encodings (seeds) and mutates them: bit flips, interesting
//! 8/16/32/64-bit values, truncation, insertion, deletion, splicing from another seed; most
//! mutants get their checksums recomputed so that they reach the parsers behind them, and a
//! mutant a decoder accepts joins the corpus. A run fails on a panic, on an error of a kind
//! other than `Data` (stored objects) or `Invalid` (input files), and on any single allocation
//! above [`ALLOCATION_BOUND`] while a decoder runs (a counting global allocator watches the
//! fuzzing thread). A decoder that accepts a mutant is then used (a graph walk, a term query)
//! to show that what it accepted is safe to read.
//!
//! `cargo test --lib fuzz` runs a short slice (`LSMSEARCH_FUZZ_EXECS` executions per target,
//! default 2,000); `LSMSEARCH_FUZZ_EXECS=1000000 cargo test --release --lib fuzz -- --nocapture`
//! is the long mode. A failure prints the seed and execution that replay it and writes the input
//! to `target/fuzz-failures/`.

#![allow(clippy::unwrap_used)] // test code: a failed setup step is a failed test

use crate::format::bundle::{Bundle, BundleWriter};
use crate::format::ipc::{ipc_decode, ipc_encode};
use crate::format::manifest::Manifest;
use crate::format::wal::{decode as wal_decode, encode as wal_encode, WalEntry, WalKind};
use crate::generation::{Generation, IndexSpec};
use crate::schema::IndexSchema;
use crate::settings::Settings;
use crate::text::TextSchema;
use crate::{Error, ErrorKind};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// No single allocation of a decoder may exceed this (inputs are a few KiB).
const ALLOCATION_BOUND: usize = 64 << 20;

thread_local! {
    static WATCHED: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, noting the largest allocation a watched thread makes and refusing
/// (which aborts with a message) absurd ones.
struct Counting;

static REFUSED: AtomicUsize = AtomicUsize::new(0);

/// Note an allocation of `size` bytes by a watched thread; false when it must be refused.
fn admit(size: usize) -> bool {
    if !WATCHED.try_with(Cell::get).unwrap_or(false) {
        return true;
    }
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    if size > 16 * ALLOCATION_BOUND {
        REFUSED.store(size, Ordering::SeqCst);
        return false;
    }
    true
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !admit(new_size) {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What a decoder did with one input.
type Outcome = std::result::Result<(), String>;

/// Decodes (and uses) one input; `Err` describes a violation.
type Runner = Box<dyn Fn(&[u8]) -> Outcome + Send + Sync>;

/// A decoder under test.
struct Target {
    name: &'static str,
    seeds: Vec<Vec<u8>>,
    /// Recompute checksums after a mutation (so that it reaches the parser behind them).
    fix: fn(&mut [u8]),
    /// Decode (and use) an input; `Err` describes a violation.
    run: Runner,
    /// How many executions of the run this target gets, relative to the others.
    weight: u64,
}

/// An error a decoder may return for bad bytes: `Data` for a stored object.
fn stored_error(e: &Error) -> Outcome {
    match e.kind() {
        ErrorKind::Data => Ok(()),
        k => Err(format!("error of kind {k:?} (expected Data): {e}")),
    }
}

/// An error a reader of input files may return: `Invalid`.
fn input_error(e: &Error) -> Outcome {
    match e.kind() {
        ErrorKind::Invalid => Ok(()),
        k => Err(format!("error of kind {k:?} (expected Invalid): {e}")),
    }
}

fn no_fix(_: &mut [u8]) {}

/// WAL objects and manifests end with the CRC32 of everything before it.
fn fix_trailing_crc(b: &mut [u8]) {
    if b.len() >= 4 {
        let n = b.len() - 4;
        let crc = crc32fast::hash(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A bundle's footer: body CRC over `[0, dir_offset + dir_len)` and the footer's own CRC.
fn fix_bundle(b: &mut [u8]) {
    if b.len() < 32 {
        return;
    }
    let f = b.len() - 32;
    let field = |b: &[u8], at: usize| u64::from_le_bytes(b[f + at..f + at + 8].try_into().unwrap());
    let end = field(b, 0).checked_add(field(b, 8));
    if let Some(end) = end.filter(|e| *e as usize <= f) {
        let crc = crc32fast::hash(&b[..end as usize]);
        b[f + 20..f + 24].copy_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32fast::hash(&b[f..f + 28]);
    b[f + 28..f + 32].copy_from_slice(&crc.to_le_bytes());
}

const SCHEMA: &str = r#"{"primary_key": "id", "text": ["title", "body"],
    "vector": {"column": "emb", "dim": 4, "metric": "cosine"},
    "payload": [{"name": "year", "type": "int64"}]}"#;

/// The schema of `tests/fixtures/index` (see `src/db/fixtures.rs`).
const FIXTURE_SCHEMA: &str = r#"{"primary_key": "id", "text": ["title", "body"],
    "vector": {"column": "emb", "dim": 8, "metric": "cosine"},
    "payload": [{"name": "year", "type": "int64"}]}"#;

struct Fixture {
    schema: IndexSchema,
    stored: SchemaRef,
    text: Arc<TextSchema>,
    rows: RecordBatch,
    generation: Vec<u8>,
}

fn fixture() -> Fixture {
    let schema = IndexSchema::from_json(SCHEMA).unwrap();
    let words = [
        "shock", "boundary", "layer", "flow", "wing", "heat", "mach", "plate",
    ];
    let mut rng = StdRng::seed_from_u64(1);
    let n = 40;
    let text = |rng: &mut StdRng| {
        (0..rng.random_range(0..6))
            .map(|_| words[rng.random_range(0..words.len())])
            .collect::<Vec<_>>()
            .join(" ")
    };
    use arrow::array::{FixedSizeListArray, Float32Array, Int64Array, StringArray};
    let ids: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let titles: Vec<String> = (0..n).map(|_| text(&mut rng)).collect();
    let bodies: Vec<String> = (0..n).map(|_| text(&mut rng)).collect();
    let values: Vec<f32> = (0..n * 4).map(|_| rng.random_range(-1.0..1.0)).collect();
    let item = Arc::new(arrow::datatypes::Field::new(
        "item",
        arrow::datatypes::DataType::Float32,
        true,
    ));
    let emb = FixedSizeListArray::new(item, 4, Arc::new(Float32Array::from(values)), None);
    let user = RecordBatch::try_new(
        schema.arrow_schema(),
        vec![
            Arc::new(StringArray::from(ids)),
            Arc::new(StringArray::from(titles)),
            Arc::new(StringArray::from(bodies)),
            Arc::new(emb),
            Arc::new(Int64Array::from_iter_values(1950..1950 + n as i64)),
        ],
    )
    .unwrap();
    let rows = schema.to_stored(&user, 1).unwrap();
    let stored = schema.stored_schema();
    let text = TextSchema::new(&schema).unwrap();
    let spec = IndexSpec {
        text: Some(&text),
        vector: schema.vector_spec(&Settings::default()),
    };
    let (_, generation) = Generation::build(3, 2, rows.clone(), &stored, spec, None, 1).unwrap();
    Fixture {
        schema,
        stored,
        text,
        rows,
        generation,
    }
}

fn targets(fx: &Arc<Fixture>) -> Vec<Target> {
    let mut targets = vec![
        wal_target(fx),
        manifest_target(fx),
        ipc_target(fx),
        graph_target(fx),
    ];
    targets.extend(generation_targets(fx));
    targets
}

/// WAL objects: rows of several sizes, deletes, a fence.
fn wal_target(fx: &Arc<Fixture>) -> Target {
    let stored = fx.stored.clone();
    let entry = |rows: Option<RecordBatch>, kind| WalEntry {
        kind,
        epoch: 7,
        first_seq: 1,
        last_seq: 40,
        rows,
    };
    let tomb = fx
        .schema
        .tombstones(
            &fx.schema
                .key_column(&[crate::Key::from("k3"), crate::Key::from("zz")])
                .unwrap(),
            41,
        )
        .unwrap();
    let wal_seeds = vec![
        wal_encode(&entry(Some(fx.rows.slice(0, 3)), WalKind::Rows), &stored).unwrap(),
        wal_encode(&entry(Some(fx.rows.clone()), WalKind::Rows), &stored).unwrap(),
        wal_encode(&entry(Some(tomb), WalKind::Rows), &stored).unwrap(),
        wal_encode(&entry(None, WalKind::Fence), &stored).unwrap(),
    ];
    let s = stored.clone();
    Target {
        name: "wal",
        seeds: wal_seeds,
        fix: fix_trailing_crc,
        run: Box::new(
            move |b| match wal_decode(Bytes::copy_from_slice(b), &s, &"wal") {
                Ok(_) => Ok(()),
                Err(e) => stored_error(&e),
            },
        ),
        weight: 30,
    }
}

/// Manifests.
fn manifest_target(fx: &Arc<Fixture>) -> Target {
    let stored = fx.stored.clone();
    let manifest = Manifest {
        version: 12,
        epoch: 3,
        schema: fx.schema.clone(),
        generations: vec![
            Generation::decode(
                fx.generation.clone().into(),
                &stored,
                IndexSpec {
                    text: Some(&fx.text),
                    vector: fx.schema.vector_spec(&Settings::default()),
                },
                &"g",
            )
            .unwrap()
            .meta()
            .clone();
            2
        ],
        wal_replay_from: 9,
        last_seq: 40,
        next_generation_id: 4,
    };
    Target {
        name: "manifest",
        seeds: vec![manifest.encode().unwrap()],
        fix: fix_trailing_crc,
        run: Box::new(|b| match Manifest::decode(b, &"manifest") {
            Ok(_) => Ok(()),
            Err(e) => stored_error(&e),
        }),
        weight: 30,
    }
}

/// Arrow IPC streams of stored rows.
fn ipc_target(fx: &Arc<Fixture>) -> Target {
    let stored = fx.stored.clone();
    let s = stored.clone();
    Target {
        name: "ipc",
        seeds: vec![
            ipc_encode(&stored, &[fx.rows.slice(0, 2)]).unwrap(),
            ipc_encode(&stored, &[fx.rows.slice(0, 10), fx.rows.slice(10, 5)]).unwrap(),
        ],
        fix: no_fix,
        run: Box::new(
            move |b| match ipc_decode(Bytes::copy_from_slice(b), &s, &"ipc") {
                Ok(_) => Ok(()),
                Err(e) => stored_error(&e),
            },
        ),
        weight: 30,
    }
}

/// The vector graph section, then a walk over what was accepted.
fn graph_target(fx: &Arc<Fixture>) -> Target {
    let bundle = Bundle::open(fx.generation.clone().into(), &"g").unwrap();
    let graph = bundle
        .section(crate::vector::GRAPH_SECTION)
        .unwrap()
        .to_vec();
    let rows = fx.rows.clone();
    let (vcol, metric, _) = fx.schema.vector_spec(&Settings::default()).unwrap();
    Target {
        name: "graph",
        seeds: vec![graph],
        fix: no_fix,
        run: Box::new(move |b| {
            if let Ok(v) = crate::vector::VectorIndex::open(&rows, vcol, metric, b) {
                let _ = v.candidates(&[0.5, -0.5, 0.25, 1.0], 5, 16, &|_| true);
            }
            Ok(())
        }),
        weight: 30,
    }
}

/// Whole generation bundles (container parsing, then every section), bundles rebuilt around
/// one mutated section (every CRC valid: the section decoders see the damage), and the
/// checked-in fixtures.
fn generation_targets(fx: &Arc<Fixture>) -> Vec<Target> {
    let mut targets = Vec::new();
    let bundle = Bundle::open(fx.generation.clone().into(), &"g").unwrap();
    let run_generation = {
        let fx = fx.clone();
        move |b: &[u8]| -> Outcome {
            let spec = IndexSpec {
                text: Some(&fx.text),
                vector: fx.schema.vector_spec(&Settings::default()),
            };
            match Generation::decode(Bytes::copy_from_slice(b), &fx.stored, spec, &"g") {
                Ok(g) => use_generation(&g),
                Err(e) => stored_error(&e),
            }
        }
    };
    // The checked-in fixtures: a format-1 generation (hnsw_rs dump files) and a format-2 one.
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/index/generations");
    let mut fixture_seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    fixture_seeds.sort();
    let fixture_schema = IndexSchema::from_json(FIXTURE_SCHEMA).unwrap();
    let fixture_text = TextSchema::new(&fixture_schema).unwrap();
    targets.push(Target {
        name: "fixtures",
        seeds: fixture_seeds,
        fix: fix_bundle,
        run: Box::new(move |b| {
            let spec = IndexSpec {
                text: Some(&fixture_text),
                vector: fixture_schema.vector_spec(&Settings::default()),
            };
            let stored = fixture_schema.stored_schema();
            match Generation::decode(Bytes::copy_from_slice(b), &stored, spec, &"g") {
                Ok(g) => use_generation(&g),
                Err(e) => stored_error(&e),
            }
        }),
        weight: 1,
    });
    targets.push(Target {
        name: "bundle",
        seeds: vec![fx.generation.clone()],
        fix: fix_bundle,
        run: Box::new(run_generation.clone()),
        weight: 2,
    });
    let names: Vec<String> = bundle.section_names().map(str::to_string).collect();
    let sections: Vec<(String, Bytes, bool)> = names
        .iter()
        .map(|n| (n.clone(), bundle.section(n).unwrap(), bundle.is_cold(n)))
        .collect();
    let meta = bundle.stats().clone();
    // Seeds: one per section, the section's bytes prefixed by its index.
    let seeds = sections
        .iter()
        .enumerate()
        .map(|(i, (_, b, _))| {
            let mut v = vec![i as u8];
            v.extend_from_slice(b);
            v
        })
        .collect();
    targets.push(Target {
        name: "sections",
        seeds,
        fix: no_fix,
        run: Box::new(move |b| {
            let Some((&which, mutated)) = b.split_first() else {
                return Ok(());
            };
            let which = which as usize % sections.len();
            let mut w = BundleWriter::new();
            for (i, (n, s, cold)) in sections.iter().enumerate() {
                w.add_section(n, if i == which { mutated } else { s }, *cold);
            }
            let mut meta = meta.clone();
            let bytes = w.finish(&mut meta).map_err(|e| e.to_string())?;
            run_generation(&bytes)
        }),
        weight: 2,
    });
    targets
}

/// Read what a decoder accepted: a graph walk and a term query over every text field.
fn use_generation(g: &Generation) -> Outcome {
    if let Some(v) = g.vector() {
        let _ = v.candidates(&[0.5, -0.5, 0.25, 1.0], 5, 16, &|_| true);
    }
    if let Some(t) = g.text() {
        let _ = t.total_tokens(0);
        let searcher = t.searcher();
        for (ord, seg) in searcher.segment_readers().iter().enumerate() {
            let rows = t.doc_rows(ord).map_err(|e| format!("doc rows: {e}"))?;
            for d in 0..seg.max_doc() {
                if let Some(r) = rows.get(d) {
                    if r >= g.num_rows() {
                        return Err(format!("document {d} names row {r} of {}", g.num_rows()));
                    }
                    if r >= t.rows() {
                        return Err(format!("document {d} has no token counts"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The ingest readers, over files of each type holding the fixture's rows.
fn ingest_target(fx: &Arc<Fixture>) -> Target {
    let user_schema = fx.schema.arrow_schema();
    let user = {
        let cols: Vec<_> = (0..user_schema.fields().len())
            .map(|i| fx.rows.column(i).clone())
            .collect();
        RecordBatch::try_new(user_schema.clone(), cols).unwrap()
    };
    let mut jsonl = Vec::new();
    {
        let mut w = arrow::json::LineDelimitedWriter::new(&mut jsonl);
        w.write(&user.slice(0, 6)).unwrap();
        w.finish().unwrap();
    }
    let mut parquet = Vec::new();
    {
        let mut w =
            parquet::arrow::ArrowWriter::try_new(&mut parquet, user_schema.clone(), None).unwrap();
        w.write(&user.slice(0, 6)).unwrap();
        w.close().unwrap();
    }
    let mut ipc_file = Vec::new();
    {
        let mut w = arrow::ipc::writer::FileWriter::try_new(&mut ipc_file, &user_schema).unwrap();
        w.write(&user.slice(0, 6)).unwrap();
        w.finish().unwrap();
    }
    let ipc_stream = ipc_encode(&user_schema, &[user.slice(0, 6)]).unwrap();
    // The first byte picks the file type.
    let seeds = [jsonl, parquet, ipc_file, ipc_stream]
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            let mut v = vec![i as u8];
            v.extend(b);
            v
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    Target {
        name: "ingest",
        seeds,
        fix: no_fix,
        run: Box::new(move |b| {
            let Some((&which, body)) = b.split_first() else {
                return Ok(());
            };
            let ext = ["jsonl", "parquet", "arrow", "arrows"][which as usize % 4];
            let path = dir
                .path()
                .join(format!("{:?}.{ext}", std::thread::current().id()).replace(['(', ')'], ""));
            std::fs::write(&path, body).map_err(|e| e.to_string())?;
            let rows = match crate::ingest::read_rows(&path, &user_schema, 4) {
                Ok(r) => r,
                Err(e) => return input_error(&e),
            };
            for r in rows.take(1_000) {
                if let Err(e) = r {
                    return input_error(&e);
                }
            }
            Ok(())
        }),
        weight: 3,
    }
}

/// Apply 1 to 4 random mutations to `input`.
fn mutate(rng: &mut StdRng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    for _ in 0..rng.random_range(1..=4) {
        let len = input.len();
        if len == 0 {
            input.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..len);
        match rng.random_range(0..10) {
            0 | 1 => input[at] ^= 1 << rng.random_range(0..8),
            2 => input[at] = [0u8, 1, 0x7f, 0x80, 0xff][rng.random_range(0..5)],
            3 if len >= 4 => {
                let at = rng.random_range(0..=len - 4);
                let v: u32 = match rng.random_range(0..7) {
                    0 => 0,
                    1 => u32::MAX,
                    2 => i32::MAX as u32,
                    3 => 0x8000_0000,
                    4 => len as u32,
                    5 => u32::from_le_bytes(input[at..at + 4].try_into().unwrap())
                        .wrapping_add(rng.random_range(0..3))
                        .wrapping_sub(1),
                    _ => rng.random(),
                };
                input[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            4 if len >= 8 => {
                let at = rng.random_range(0..=len - 8);
                let v: u64 = match rng.random_range(0..6) {
                    0 => 0,
                    1 => u64::MAX,
                    2 => i64::MAX as u64,
                    3 => 1 << rng.random_range(20..62),
                    4 => len as u64,
                    _ => rng.random(),
                };
                input[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            5 => input.truncate(at),
            6 => {
                let n = rng.random_range(1..16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                input.splice(at..at, bytes);
            }
            7 => {
                let end = (at + rng.random_range(1..64)).min(len);
                input.drain(at..end);
            }
            8 => {
                let other = &corpus[rng.random_range(0..corpus.len())];
                if !other.is_empty() {
                    let from = rng.random_range(0..other.len());
                    let n = rng.random_range(1..=(other.len() - from).min(256));
                    let end = (at + n).min(len);
                    input.splice(at..end, other[from..from + n].iter().copied());
                }
            }
            _ => {
                let end = (at + rng.random_range(1..32)).min(len);
                let chunk = input[at..end].to_vec();
                input.splice(at..at, chunk);
            }
        }
    }
}

/// Run `execs` mutants of `target` from `seed`; the number of executions, or the violation.
fn fuzz(target: &Target, execs: u64, seed: u64) -> std::result::Result<u64, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut corpus = target.seeds.clone();
    // The seeds themselves must decode.
    for s in &target.seeds {
        (target.run)(s).map_err(|e| format!("{}: a seed fails: {e}", target.name))?;
    }
    for i in 0..execs {
        let mut input = corpus[rng.random_range(0..corpus.len())].clone();
        mutate(&mut rng, &mut input, &corpus);
        if rng.random_bool(0.8) {
            (target.fix)(&mut input);
        }
        WATCHED.with(|w| w.set(true));
        LARGEST.with(|l| l.set(0));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (target.run)(&input)));
        WATCHED.with(|w| w.set(false));
        let largest = LARGEST.with(Cell::get);
        let violation = match r {
            Err(p) => Some(format!("panic: {}", crate::error::panic_text(&*p))),
            Ok(Err(e)) => Some(e),
            Ok(Ok(())) if largest > ALLOCATION_BOUND => {
                Some(format!("an allocation of {largest} bytes"))
            }
            Ok(Ok(())) => None,
        };
        if let Some(v) = violation {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-failures");
            let _ = std::fs::create_dir_all(&dir);
            let file = dir.join(format!("{}-{seed}-{i}.bin", target.name));
            let _ = std::fs::write(&file, &input);
            return Err(format!(
                "{}: execution {i}: {v}\n  input: {}\n  replay: LSMSEARCH_FUZZ_SEED={seed} \
                 LSMSEARCH_FUZZ_TARGET={} LSMSEARCH_FUZZ_EXECS={} cargo test --lib fuzz",
                target.name,
                file.display(),
                target.name,
                i + 1
            ));
        }
        if corpus.len() < 512 && rng.random_bool(0.05) {
            corpus.push(input);
        }
    }
    Ok(execs)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn decoders_survive_mutated_inputs() {
    let per_target = env_u64("LSMSEARCH_FUZZ_EXECS").unwrap_or(2_000);
    let seed = env_u64("LSMSEARCH_FUZZ_SEED").unwrap_or(0x5eed);
    let only = std::env::var("LSMSEARCH_FUZZ_TARGET").ok();
    // Decoder panics are caught (and some are expected inside third-party decoders, which we
    // guard): keep their messages off the output while a fuzzing thread runs one.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !WATCHED.try_with(Cell::get).unwrap_or(false) {
            default_hook(info);
        }
    }));
    let fx = Arc::new(fixture());
    let mut all = targets(&fx);
    all.push(ingest_target(&fx));
    all.retain(|t| only.as_deref().is_none_or(|o| o == t.name));
    assert!(!all.is_empty(), "no fuzz target named {only:?}");
    let total_weight: u64 = all.iter().map(|t| t.weight).sum();
    let n = all.len() as u64;
    let started = Instant::now();
    // Both cores: the targets split over two threads.
    let results: Vec<(String, std::result::Result<u64, String>, f64)> = std::thread::scope(|s| {
        let (even, odd): (Vec<_>, Vec<_>) = all.iter().enumerate().partition(|(i, _)| i % 2 == 0);
        let handles: Vec<_> = [even, odd]
            .into_iter()
            .map(|part| {
                s.spawn(move || {
                    part.into_iter()
                        .map(|(_, t)| {
                            let execs = (per_target * n * t.weight / total_weight).max(1);
                            let t0 = Instant::now();
                            let r = fuzz(t, execs, seed);
                            (t.name.to_string(), r, t0.elapsed().as_secs_f64())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut failures = Vec::new();
    let mut total = 0;
    for (name, r, secs) in &results {
        match r {
            Ok(execs) => {
                total += execs;
                println!("fuzz {name:>9}: {execs:>10} executions in {secs:>7.1} s, 0 crashes");
            }
            Err(e) => failures.push(e.clone()),
        }
    }
    println!(
        "fuzz total: {total} executions in {:.1} s (seed {seed})",
        started.elapsed().as_secs_f64()
    );
    assert!(REFUSED.load(Ordering::SeqCst) == 0);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
