//! `lsmsearch bench stream`: writers and readers on one index at the same time, as an app
//! server uses it.
//!
//! W writers append Durable (or Buffered) batches of B rows (new keys, 10% updates of earlier
//! keys, and deletes of 1% of a batch's size), at their maximum rate or at a target rate
//! (rows/s in total, each batch sent on a fixed schedule so a slow append delays no later
//! one's start). R readers run full-text, vector and filtered vector queries (the Cranfield
//! queries, cycled) at their maximum rate or paced (queries/s in total). Every interval a
//! row is printed: acknowledged rows/s, append and per-kind query latency (p50/p99/max),
//! generations, compactions done and rows due for one, memtable and unindexed rows, resident
//! memory. At every checkpoint the writers and readers
//! pause while a snapshot is read (its live rows, ten full-text and fifty vector queries
//! with graphs and exactly), and their schedules skip the pause instead of catching up
//! after it; after the stream, the full-text answers are compared with one
//! tantivy index over the snapshot's rows and the vector answers with the exact ones
//! (recall@10). Writes `results.json` and `stream.png` into the output directory.

mod checkpoint;
mod load;
mod options;
mod plot;
mod report;

pub use options::StreamOptions;
pub use report::{peak_rss_mib, rss_mib, Checkpoint, Interval, Latency, StreamReport};

use super::corpus::{Corpus, Embedder};
use crate::{Index, IndexSchema, Location, Result, ScanOptions};
use checkpoint::{check, snapshot, Snapshot};
use load::{reader, writer, Shared};
use plot::plot_stream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The corpus, its pools of rows and vectors, and a new index in `<out>/index` with the
/// benchmark's schema.
async fn prepare(o: &StreamOptions) -> Result<(Arc<Shared>, IndexSchema, PathBuf)> {
    let corpus = Corpus::load(o.data.as_deref())?;
    let mut embedder = Embedder::new(o.dim);
    let pool_rows = 20_000usize;
    let mut pool = Vec::new();
    for from in (0..pool_rows).step_by(o.batch.max(1).min(pool_rows)) {
        let n = o.batch.max(1).min(pool_rows - from);
        pool.push(corpus.batch(Some(&mut embedder), from, n)?);
    }
    // Equal-sized pool batches: `rows_with_keys` indexes them by position.
    let per = pool[0].num_rows();
    pool.retain(|b| b.num_rows() == per);
    let bases = (0..per * pool.len())
        .map(|i| {
            let (title, text) = corpus.document(i);
            embedder.embed(&format!("{title} {text}"), 0, 0.0)
        })
        .collect();
    let queries = corpus.queries().to_vec();
    let query_vectors = queries.iter().map(|q| embedder.embed(q, 0, 0.0)).collect();
    let dir = o.out.join("index");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| crate::Error::invalid(format!("cannot create {}: {e}", dir.display())))?;
    let schema = Corpus::schema(Some(o.dim));
    let index = Index::create(
        Location::parse(&dir.display().to_string())?,
        schema.clone(),
        o.settings.clone(),
    )
    .await?;
    let s = Arc::new(Shared {
        index,
        pause: tokio::sync::RwLock::new(()),
        interval: Mutex::default(),
        total: Mutex::default(),
        acked: AtomicUsize::new(0),
        next_key: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        pool,
        bases,
        dim: o.dim,
        queries,
        query_vectors,
    });
    Ok((s, schema, dir))
}

/// What the sampling loop of a stream run gathered.
struct Sampled {
    intervals: Vec<Interval>,
    snapshots: Vec<Snapshot>,
    peak_rss: f64,
    /// Seconds the run lasted, checkpoints left out.
    seconds: f64,
}

/// Sample the run every interval (printing a line with `say`) and take the checkpoints, until
/// the duration has passed; fails when a task of `tasks` ends early.
async fn sample(
    o: &StreamOptions,
    s: &Arc<Shared>,
    tasks: &mut tokio::task::JoinSet<Result<()>>,
    say: &dyn Fn(String),
) -> Result<Sampled> {
    say(format!(
        "{:>6} {:>8} {:>19} {:>19} {:>19} {:>19} {:>5} {:>4} {:>8} {:>8} {:>9} {:>7}",
        "t(s)",
        "rows/s",
        "append p50/p99/max",
        "fts p50/p99/max",
        "vector p50/p99/max",
        "filtered p50/p99/max",
        "gens",
        "cmp",
        "debt",
        "mem",
        "unindexed",
        "RSS MiB"
    ));
    let started = Instant::now();
    let mut paused = Duration::ZERO;
    let mut intervals = Vec::new();
    let mut snapshots = Vec::new();
    let mut last_acked = 0;
    let mut last_t = 0.0;
    let mut peak_rss = rss_mib();
    let mut next_checkpoint = o.checkpoint;
    loop {
        let running = started.elapsed() - paused;
        if running >= o.duration {
            break;
        }
        let next_print =
            Duration::from_secs_f64(last_t) + o.interval.max(Duration::from_millis(100));
        let wake = next_print.min(o.duration);
        tokio::select! {
            _ = tokio::time::sleep(wake.saturating_sub(running)) => {}
            Some(r) = tasks.join_next() => {
                s.stop.store(true, Ordering::SeqCst);
                r.map_err(|e| crate::Error::internal(format!("stream task: {e}")))??;
                return Err(crate::Error::internal("a stream task ended early"));
            }
        }
        let running = started.elapsed() - paused;
        let t = running.as_secs_f64();
        let acked = s.acked.load(Ordering::Relaxed);
        let samples = std::mem::take(&mut *s.interval.lock().unwrap_or_else(|e| e.into_inner()));
        let st = s.index.stats();
        let rss = rss_mib();
        peak_rss = peak_rss.max(rss);
        let row = Interval {
            t,
            rows_per_s: (acked - last_acked) as f64 / (t - last_t).max(1e-9),
            append: Latency::of(samples.append),
            queries: samples
                .queries
                .into_iter()
                .map(|(k, v)| (k, Latency::of(v)))
                .collect(),
            generations: st.generations.len(),
            memtable_rows: st.memtable_rows + st.frozen_rows,
            unindexed_rows: st.unindexed_rows,
            compactions: st.compactions,
            compaction_debt_rows: st.compaction_debt_rows,
            rss_mib: rss,
        };
        say(row.line());
        intervals.push(row);
        last_acked = acked;
        last_t = t;
        if !o.checkpoint.is_zero() && running >= next_checkpoint {
            next_checkpoint += o.checkpoint;
            let p = Instant::now();
            snapshots.push(snapshot(s, t, snapshots.len()).await?);
            paused += p.elapsed();
        }
    }
    Ok(Sampled {
        intervals,
        snapshots,
        peak_rss,
        seconds: (started.elapsed() - paused).as_secs_f64(),
    })
}

/// Run the stream (see the module documentation).
pub async fn run(o: &StreamOptions) -> Result<StreamReport> {
    o.check()?;
    let (s, schema, dir) = prepare(o).await?;
    let mut tasks = tokio::task::JoinSet::new();
    let max_generations = Arc::new(AtomicUsize::new(0));
    {
        let (s, most) = (s.clone(), max_generations.clone());
        tasks.spawn(async move {
            while !s.stop.load(Ordering::SeqCst) {
                most.fetch_max(s.index.stats().generations.len(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(())
        });
    }
    for w in 0..o.writers {
        tasks.spawn(writer(s.clone(), o.clone(), w));
    }
    for r in 0..o.readers {
        tasks.spawn(reader(s.clone(), o.clone(), r));
    }
    let say = |line: String| {
        if o.print {
            println!("{line}");
        }
    };
    let sampled = sample(o, &s, &mut tasks, &say).await?;
    let (intervals, snapshots, peak_rss) = (sampled.intervals, sampled.snapshots, sampled.peak_rss);
    s.stop.store(true, Ordering::SeqCst);
    let seconds = sampled.seconds;
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| crate::Error::internal(format!("stream task: {e}")))??;
    }
    let acked = s.acked.load(Ordering::Relaxed);
    // Counted batch by batch: the rows are not held (a 10-minute stream writes millions).
    let mut live_rows = 0;
    let mut stream = s.index.scan_stream(ScanOptions::default()).await?;
    while let Some(b) = futures::StreamExt::next(&mut stream).await {
        live_rows += b?.num_rows();
    }
    let mut checkpoints = Vec::new();
    for snap in &snapshots {
        checkpoints.push(check(snap, &schema)?);
    }
    s.index.flush().await?;
    let end = s.index.stats();
    let generation_bytes: u64 = end.generations.iter().map(|g| g.bytes).sum();
    let space_amplification = if o.compact_at_end {
        let one = match s.index.compact().await? {
            Some(r) => r.bytes_out,
            None => generation_bytes,
        };
        Some(generation_bytes as f64 / one.max(1) as f64)
    } else {
        None
    };
    s.index.close().await?;
    let total = std::mem::take(&mut *s.total.lock().unwrap_or_else(|e| e.into_inner()));
    let report = StreamReport {
        writers: o.writers,
        batch: o.batch,
        rate: o.rate,
        readers: o.readers,
        qps: o.qps,
        seconds,
        rows: acked,
        rows_per_s: acked as f64 / seconds.max(1e-9),
        append: Latency::of(total.append),
        queries: total
            .queries
            .into_iter()
            .map(|(k, v)| (k, Latency::of(v)))
            .collect(),
        intervals,
        checkpoints,
        peak_rss_mib: peak_rss,
        live_rows,
        peak_rss_mib_per_100k_rows: peak_rss / (acked.max(1) as f64 / 100_000.0),
        max_generations: max_generations.load(Ordering::Relaxed),
        generations_at_end: end.generations.len(),
        generation_rows: end.generations.iter().map(|g| g.rows).sum(),
        generation_bytes,
        compactions: end.compactions,
        space_amplification,
    };
    for line in report.summary() {
        say(line);
    }
    let path = o.out.join("results.json");
    let json = serde_json::to_vec_pretty(&report)
        .map_err(|e| crate::Error::internal(format!("results.json: {e}")))?;
    std::fs::write(&path, json)
        .map_err(|e| crate::Error::invalid(format!("cannot write {}: {e}", path.display())))?;
    let png = o.out.join("stream.png");
    match plot_stream(&report, &png) {
        Ok(()) => say(format!(
            "wrote {} and {}",
            o.out.join("results.json").display(),
            png.display()
        )),
        Err(e) => say(format!("no plot: {e}")),
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}
