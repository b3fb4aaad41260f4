//! The writers and readers of `bench stream`, and what they share.

use super::options::StreamOptions;
use crate::bench::corpus::Embedder;
use crate::{Index, Key, Result, SearchOptions, VectorSearchOptions, WriteOptions};
use arrow::array::{Array, AsArray, Float32Array, Int64Array, RecordBatch};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Calls measured since the last interval and since the start.
#[derive(Default)]
pub(super) struct Samples {
    pub(super) append: Vec<f64>,
    pub(super) queries: std::collections::BTreeMap<String, Vec<f64>>,
}

pub(super) struct Shared {
    pub(super) index: Index,
    /// Writers and readers hold it (shared) around each call; a checkpoint takes it
    /// exclusively.
    pub(super) pause: tokio::sync::RwLock<()>,
    pub(super) interval: Mutex<Samples>,
    pub(super) total: Mutex<Samples>,
    pub(super) acked: AtomicUsize,
    pub(super) next_key: AtomicUsize,
    pub(super) stop: AtomicBool,
    pub(super) pool: Vec<RecordBatch>,
    /// The text vector (no jitter) of each pool row.
    pub(super) bases: Vec<Vec<f32>>,
    pub(super) dim: usize,
    pub(super) queries: Vec<String>,
    pub(super) query_vectors: Vec<Vec<f32>>,
}

/// Leave to the checkpoint under way (holding `pause`), if any, the time it reads (its scan
/// and exact searches are not the load's, and no call of the load is timed meanwhile); then
/// skip the slots of the schedule (`next_at`) it took instead of making them up in a burst.
async fn hold<'a>(
    pause: &'a tokio::sync::RwLock<()>,
    next_at: &mut Instant,
) -> tokio::sync::RwLockReadGuard<'a, ()> {
    if let Ok(held) = pause.try_read() {
        return held;
    }
    let held = pause.read().await;
    *next_at = (*next_at).max(Instant::now());
    held
}

impl Shared {
    pub(super) fn record_append(&self, ms: f64) {
        self.interval
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .append
            .push(ms);
        self.total
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .append
            .push(ms);
    }

    pub(super) fn record_query(&self, kind: &str, ms: f64) {
        for s in [&self.interval, &self.total] {
            s.lock()
                .unwrap_or_else(|e| e.into_inner())
                .queries
                .entry(kind.to_string())
                .or_default()
                .push(ms);
        }
    }
}

/// Rows with keys `keys`: the text and payload of the pool's rows from `from` on (cycled),
/// and vectors made as the benchmark corpus makes them (the text's vector jittered by the
/// key, see [`Embedder::jitter`]), so no two keys share a vector.
pub(super) fn rows_with_keys(s: &Shared, keys: &[i64], from: usize) -> Result<RecordBatch> {
    let pool = &s.pool;
    let per = pool[0].num_rows();
    let total = per * pool.len();
    let idx: Vec<(usize, usize)> = (0..keys.len())
        .map(|i| {
            let r = (from + i) % total;
            (r / per, r % per)
        })
        .collect();
    let schema = pool[0].schema();
    let mut columns = vec![Arc::new(Int64Array::from(keys.to_vec())) as arrow::array::ArrayRef];
    for c in 1..schema.fields().len() {
        if pool[0].column(c).as_fixed_size_list_opt().is_some() {
            let mut values = Vec::with_capacity(keys.len() * s.dim);
            for (i, key) in keys.iter().enumerate() {
                let base = &s.bases[(from + i) % total];
                values.extend(Embedder::jitter(base, *key as u64, 0.2));
            }
            columns.push(Arc::new(arrow::array::FixedSizeListArray::try_new(
                Arc::new(arrow::datatypes::Field::new(
                    "item",
                    arrow::datatypes::DataType::Float32,
                    true,
                )),
                s.dim as i32,
                Arc::new(Float32Array::from(values)),
                None,
            )?));
            continue;
        }
        let arrays: Vec<&dyn Array> = pool.iter().map(|b| b.column(c).as_ref()).collect();
        columns.push(arrow::compute::interleave(&arrays, &idx)?);
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

pub(super) async fn writer(s: Arc<Shared>, o: StreamOptions, w: usize) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(17 + w as u64);
    let opts = WriteOptions::with_durability(o.durability);
    let every = (o.rate > 0.0)
        .then(|| Duration::try_from_secs_f64(o.batch as f64 * o.writers as f64 / o.rate).ok())
        .flatten();
    let mut next_at = Instant::now();
    let mut sent = 0usize;
    while !s.stop.load(Ordering::Relaxed) {
        if let Some(every) = every {
            next_at += every;
            let now = Instant::now();
            if next_at > now {
                tokio::time::sleep(next_at - now).await;
            }
        }
        let known = s.next_key.load(Ordering::Relaxed);
        let mut keys = Vec::with_capacity(o.batch);
        for _ in 0..o.batch {
            if known > 0 && rng.random_bool(0.1) {
                keys.push(rng.random_range(0..known) as i64);
            } else {
                keys.push(s.next_key.fetch_add(1, Ordering::Relaxed) as i64);
            }
        }
        let rows = rows_with_keys(&s, &keys, sent)?;
        sent += o.batch;
        // 1% of the batch size, the fraction carried over between batches.
        let deletes =
            (o.batch / 100) + usize::from(rng.random_bool((o.batch % 100) as f64 / 100.0));
        let doomed: Vec<Key> = (0..deletes)
            .filter(|_| known > 0)
            .map(|_| Key::I64(rng.random_range(0..known) as i64))
            .collect();
        let _held = hold(&s.pause, &mut next_at).await;
        let t = Instant::now();
        s.index.append_with(&rows, opts).await?;
        s.record_append(t.elapsed().as_secs_f64() * 1e3);
        s.acked.fetch_add(rows.num_rows(), Ordering::Relaxed);
        if !doomed.is_empty() {
            let t = Instant::now();
            s.index.delete_with(&doomed, opts).await?;
            s.record_append(t.elapsed().as_secs_f64() * 1e3);
            s.acked.fetch_add(doomed.len(), Ordering::Relaxed);
        }
    }
    Ok(())
}

pub(super) async fn run_query(s: &Shared, kind: &str, i: usize) -> Result<()> {
    let q = i % s.queries.len();
    let columns = Some(s.index.schema().payload_names());
    match kind {
        "fts" => {
            let opts = SearchOptions {
                columns,
                ..SearchOptions::with_k(10)
            };
            s.index.search_fts(&s.queries[q], &opts).await?;
        }
        "vector" => {
            let opts = VectorSearchOptions {
                columns,
                ..Default::default()
            };
            s.index.search_vector(&s.query_vectors[q], &opts).await?;
        }
        _ => {
            let opts = VectorSearchOptions {
                filter: Some("bucket < 10".into()),
                columns,
                ..Default::default()
            };
            s.index.search_vector(&s.query_vectors[q], &opts).await?;
        }
    }
    Ok(())
}

pub(super) async fn reader(s: Arc<Shared>, o: StreamOptions, r: usize) -> Result<()> {
    let every = (o.qps > 0.0)
        .then(|| Duration::try_from_secs_f64(o.readers as f64 / o.qps).ok())
        .flatten();
    let mut next_at =
        Instant::now() + every.map_or(Duration::ZERO, |e| e.mul_f64(r as f64 / o.readers as f64));
    let mut i = r;
    while !s.stop.load(Ordering::Relaxed) {
        if let Some(every) = every {
            let now = Instant::now();
            if next_at > now {
                tokio::time::sleep(next_at - now).await;
            }
            next_at += every;
        }
        let kind = &o.kinds[i % o.kinds.len()];
        let _held = hold(&s.pause, &mut next_at).await;
        let t = Instant::now();
        run_query(&s, kind, i / o.kinds.len()).await?;
        s.record_query(kind, t.elapsed().as_secs_f64() * 1e3);
        i += o.readers;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer's or reader's call waits for the checkpoint holding the pause, and its
    /// schedule resumes after it instead of catching up on the slots it took.
    #[tokio::test]
    async fn calls_wait_out_a_checkpoint_and_skip_its_slots() {
        let pause = Arc::new(tokio::sync::RwLock::new(()));
        let start = Instant::now();
        let mut free = start;
        drop(hold(&pause, &mut free).await);
        assert_eq!(free, start, "no checkpoint: the schedule is left alone");
        let checkpoint = pause.clone().write_owned().await;
        let (waiting, done) = (pause.clone(), Arc::new(AtomicBool::new(false)));
        let flag = done.clone();
        let call = tokio::spawn(async move {
            let mut next_at = start;
            let _held = hold(&waiting, &mut next_at).await;
            flag.store(true, Ordering::SeqCst);
            next_at
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !done.load(Ordering::SeqCst),
            "a call ran during a checkpoint"
        );
        let released = Instant::now();
        drop(checkpoint);
        let next_at = call.await.unwrap();
        assert!(
            next_at >= released,
            "the slots the checkpoint took are made up"
        );
    }
}
