//! What `bench stream` measures and prints.

use serde::Serialize;

/// Latency percentiles of one kind of call, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    /// Calls.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Latency {
    pub(super) fn of(mut v: Vec<f64>) -> Latency {
        if v.is_empty() {
            return Latency::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
        Latency {
            count: v.len(),
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: v[v.len() - 1],
        }
    }
}

/// One printed row.
#[derive(Debug, Clone, Serialize)]
pub struct Interval {
    /// Seconds since the start, at the end of the interval.
    pub t: f64,
    /// Rows acknowledged per second during the interval.
    pub rows_per_s: f64,
    /// Appends and deletes.
    pub append: Latency,
    /// Per query kind.
    pub queries: std::collections::BTreeMap<String, Latency>,
    /// Generations at the end of the interval.
    pub generations: usize,
    /// Rows in the active and frozen memtables.
    pub memtable_rows: usize,
    /// Memtable rows not yet in their vector graph or text index.
    pub unindexed_rows: usize,
    /// Compactions finished since the start.
    pub compactions: u64,
    /// Rows of the generations the compaction policy would merge now (0: nothing due).
    pub compaction_debt_rows: u64,
    /// Resident memory of the process, MiB.
    pub rss_mib: f64,
}

/// What a checkpoint found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Checkpoint {
    /// Seconds since the start.
    pub t: f64,
    /// Live rows of the snapshot.
    pub live_rows: usize,
    /// Mean recall@10 of graph searches against exact searches of the same snapshot.
    pub recall_at_10: f64,
    /// Full-text queries compared with one tantivy index over the snapshot's rows.
    pub fts_queries: usize,
    /// Of those, queries whose top 10 differ (keys, or scores beyond 1e-5 relative).
    pub fts_mismatches: usize,
}

/// Everything `bench stream` measured.
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    /// Writers, batch size, target rate (0 = max).
    pub writers: usize,
    /// Rows per append.
    pub batch: usize,
    /// Target rows/s (0 = max).
    pub rate: f64,
    /// Readers and their target queries/s (0 = max).
    pub readers: usize,
    /// Target queries/s (0 = max).
    pub qps: f64,
    /// Seconds the stream ran (pauses for checkpoints excluded).
    pub seconds: f64,
    /// Rows acknowledged.
    pub rows: usize,
    /// Rows acknowledged per second.
    pub rows_per_s: f64,
    /// Every append and delete.
    pub append: Latency,
    /// Every query, per kind.
    pub queries: std::collections::BTreeMap<String, Latency>,
    /// The rows printed.
    pub intervals: Vec<Interval>,
    /// The snapshot checks.
    pub checkpoints: Vec<Checkpoint>,
    /// Highest resident memory seen, MiB.
    pub peak_rss_mib: f64,
    /// Rows in the index at the end (live keys).
    pub live_rows: usize,
    /// Peak resident memory per 100,000 acknowledged rows, MiB.
    pub peak_rss_mib_per_100k_rows: f64,
    /// The most generations the index had at once (sampled every 100 ms).
    pub max_generations: usize,
    /// Generations, their rows (versions and tombstones) and bytes after the final flush.
    pub generations_at_end: usize,
    /// Rows stored in the generations after the final flush.
    pub generation_rows: u64,
    /// Bytes of the generations after the final flush.
    pub generation_bytes: u64,
    /// Compactions published during the stream.
    pub compactions: u64,
    /// `generation_bytes` ÷ the bytes of one generation of the live rows (with
    /// `compact_at_end`).
    pub space_amplification: Option<f64>,
}

/// Resident memory of this process, MiB (0 where /proc is unavailable).
pub fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

/// Peak resident memory of this process, MiB (0 where /proc is unavailable).
pub fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

/// A field of `/proc/self/status` given in kB (`field` with its colon), in MiB; 0 where it
/// cannot be read.
fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A latency as `p50/p99/max` milliseconds (`-` without samples).
pub(super) fn p50_p99_max(l: Option<&Latency>) -> String {
    l.map_or("-".to_string(), |l| {
        format!("{:.1}/{:.1}/{:.0}", l.p50_ms, l.p99_ms, l.max_ms)
    })
}

impl Interval {
    /// The interval as a line of the printed table.
    pub(super) fn line(&self) -> String {
        format!(
            "{:>6.0} {:>8.0} {:>19} {:>19} {:>19} {:>19} {:>5} {:>4} {:>8} {:>8} {:>9} {:>7.0}",
            self.t,
            self.rows_per_s,
            p50_p99_max(Some(&self.append)),
            p50_p99_max(self.queries.get("fts")),
            p50_p99_max(self.queries.get("vector")),
            p50_p99_max(self.queries.get("filtered")),
            self.generations,
            self.compactions,
            self.compaction_debt_rows,
            self.memtable_rows,
            self.unindexed_rows,
            self.rss_mib
        )
    }
}

impl StreamReport {
    /// The lines printed after the run.
    pub(super) fn summary(&self) -> Vec<String> {
        let mut out = Vec::new();
        out.push(format!(
            "total: {} rows in {:.1} s = {:.0} rows/s; append p50 {:.1} ms, p99 {:.1} ms, max {:.0} ms",
            self.rows,
            self.seconds,
            self.rows_per_s,
            self.append.p50_ms,
            self.append.p99_ms,
            self.append.max_ms
        ));
        for (k, l) in &self.queries {
            out.push(format!(
                "       {k}: {} queries, p50 {:.2} ms, p99 {:.2} ms, max {:.0} ms",
                l.count, l.p50_ms, l.p99_ms, l.max_ms
            ));
        }
        for c in &self.checkpoints {
            out.push(format!(
                "checkpoint at {:.0} s: {} live rows, recall@10 {:.3}, full-text {} of {} queries differ from one tantivy index",
                c.t, c.live_rows, c.recall_at_10, c.fts_mismatches, c.fts_queries
            ));
        }
        out.push(format!(
            "peak RSS {:.0} MiB = {:.0} MiB per 100,000 rows acknowledged; {} live rows at the end",
            self.peak_rss_mib, self.peak_rss_mib_per_100k_rows, self.live_rows
        ));
        out.push(format!(
            "generations: at most {} at once, {} after the final flush ({} rows, {} bytes), {} compactions{}",
            self.max_generations,
            self.generations_at_end,
            self.generation_rows,
            self.generation_bytes,
            self.compactions,
            self
                .space_amplification
                .map(|a| format!("; space amplification {a:.2}"))
                .unwrap_or_default()
        ));
        out
    }
}
