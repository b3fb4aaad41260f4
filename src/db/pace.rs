//! Append pacing: appends slow down smoothly as rows pile up ahead of the background
//! indexers, instead of stopping when the memtable queue is full.
//!
//! The debt is the memtable rows (active and frozen) not yet in their vector graph, plus the
//! active memtable's rows while the queue of frozen memtables is full (its freeze would wait
//! for a flush, so appends slow down as it fills instead of stopping when it is full). Up to
//! [`Settings::max_unindexed_rows`](crate::Settings::max_unindexed_rows) (`S`) appends are not
//! delayed. Above it, each group commit of `n` rows first waits
//! `n / r * min(4, (debt - S) / S)` (at most one second), `r` being the rate at which the
//! indexers drained the debt recently (rows/s, smoothed). At a debt of `2S` appends go exactly
//! as fast as the indexers, so the debt settles below about `2S` rows; every search scans at
//! most that many rows exactly. The queue of frozen memtables
//! ([`Settings::max_frozen_memtables`](crate::Settings::max_frozen_memtables)) stays as the
//! hard bound on memory.
//!
//! Compaction adds to the debt as the generation count nears its cap
//! ([`Settings::compaction_max_generations`](crate::Settings::compaction_max_generations)),
//! where flushes wait for compaction: while a compaction is due, from `cap - fanout`
//! generations on, each generation more adds `5S / (fanout - 1)` rows ([`generation_debt`]), so that one flush short of the
//! cap appends wait as long as they ever do. Appends that outrun compaction thus slow down
//! over several flushes instead of stopping once the frozen memtables wait behind the cap.

use crate::compaction::policy::debt;
use crate::memtable::read_memtable;
use crate::writer::Writer;
use std::time::{Duration, Instant};

/// Longest wait of one group commit.
const MAX_DELAY: Duration = Duration::from_secs(1);
/// Rate assumed before any was measured, and the lowest used (rows/s).
const MIN_RATE: f64 = 500.0;
/// The drain rate is measured over windows of at least this long.
const WINDOW: Duration = Duration::from_millis(250);

/// What the generation count adds to the debt (see the module documentation): nothing up to
/// `cap - fanout` generations, then `5 * soft / (fanout - 1)` rows per generation, so that at
/// `cap - 1` the debt holds `5 * soft` rows of it: the pressure (at most 4) of a full debt.
pub(crate) fn generation_debt(generations: usize, cap: usize, fanout: usize, soft: usize) -> usize {
    let calm = cap.saturating_sub(fanout);
    let steps = fanout.saturating_sub(1).max(1);
    let over = generations.saturating_sub(calm).min(steps);
    over.saturating_mul(5).saturating_mul(soft) / steps
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    /// `(time, rows applied, debt)` at the start of the current window.
    window: Option<(Instant, u64, usize)>,
    /// Smoothed drain rate, rows/s (0 until measured).
    rate: f64,
}

impl Pacer {
    /// How long a group of `rows` rows waits, given the rows applied so far (`applied`, which
    /// only grows) and the current `debt`, with soft limit `soft`.
    pub(crate) fn delay(
        &mut self,
        now: Instant,
        applied: u64,
        debt: usize,
        soft: usize,
        rows: usize,
    ) -> Duration {
        match self.window {
            Some((t0, a0, d0)) if now.duration_since(t0) >= WINDOW => {
                let secs = now.duration_since(t0).as_secs_f64();
                // Rows that left the debt: the ones applied, minus the growth of the debt.
                let drained = (applied - a0) as f64 - (debt as f64 - d0 as f64);
                let r = (drained / secs).max(0.0);
                self.rate = if self.rate == 0.0 {
                    r
                } else {
                    0.7 * self.rate + 0.3 * r
                };
                self.window = Some((now, applied, debt));
            }
            Some(_) => {}
            None => self.window = Some((now, applied, debt)),
        }
        if debt <= soft || rows == 0 {
            return Duration::ZERO;
        }
        let pressure = ((debt - soft) as f64 / soft.max(1) as f64).min(4.0);
        let rate = self.rate.max(MIN_RATE);
        Duration::from_secs_f64(rows as f64 / rate * pressure).min(MAX_DELAY)
    }
}

/// The debt appends are paced by: the unindexed rows, plus the active
/// memtable's rows while the queue of frozen memtables is full (its freeze would wait for
/// a flush), plus what generations near the cap add while a compaction is due and
/// compaction is not failing (at the cap flushes wait for it).
pub(crate) fn debt_rows(w: &Writer) -> usize {
    let s = &w.reader.settings;
    let (queue_full, generations, due) = {
        let st = w.read_state();
        let queue_full = if st.frozen.len() >= s.max_frozen_memtables {
            read_memtable(&st.active).rows()
        } else {
            0
        };
        let gens = &st.manifest.generations;
        let due = debt(
            gens,
            s.compaction_fanout,
            s.compaction_max_generations,
            s.compaction_max_rows as u64,
        ) > 0;
        let open = crate::compaction::policy::open(
            gens.iter().map(|g| g.rows),
            s.compaction_max_rows as u64,
        );
        (queue_full, open, due)
    };
    // Only while a compaction is due: one that is not would never drain it.
    let compaction = if s.compaction && due && w.compaction.telemetry().last_error.is_none() {
        generation_debt(
            generations,
            s.compaction_max_generations,
            s.compaction_fanout,
            s.max_unindexed_rows,
        )
    } else {
        0
    };
    w.unindexed_rows() + queue_full + compaction
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_near_the_cap_add_debt_until_appends_wait_their_longest() {
        let soft = 10_000;
        // Cap 16, fanout 4: calm up to 12 generations, full pressure from 15.
        let debt: Vec<usize> = (10..=17).map(|g| generation_debt(g, 16, 4, soft)).collect();
        assert_eq!(
            debt,
            [0, 0, 0, 16_666, 33_333, 50_000, 50_000, 50_000],
            "rows of debt from 10 to 17 generations"
        );
        // At 5 * soft the pressure is at its bound: a group of 1,000 rows waits the longest.
        let mut p = Pacer::default();
        let now = Instant::now();
        assert_eq!(
            p.delay(now, 0, soft + generation_debt(15, 16, 4, soft), soft, 1_000),
            MAX_DELAY
        );
        assert_eq!(
            p.delay(now, 0, generation_debt(12, 16, 4, soft), soft, 1_000),
            Duration::ZERO
        );
    }

    #[test]
    fn appends_wait_in_proportion_to_the_debt_above_the_limit() {
        let mut p = Pacer::default();
        let t0 = Instant::now();
        assert_eq!(p.delay(t0, 0, 10_000, 10_000, 1_000), Duration::ZERO);
        // 20,000 rows applied in a second while the debt grew by 10,000: drained 10,000/s.
        let t1 = t0 + Duration::from_secs(1);
        let at_2s = p.delay(t1, 20_000, 20_000, 10_000, 1_000);
        assert!((at_2s.as_secs_f64() - 0.1).abs() < 1e-6, "{at_2s:?}");
        let at_1_5s = p.delay(t1, 20_000, 15_000, 10_000, 1_000);
        assert!((at_1_5s.as_secs_f64() - 0.05).abs() < 1e-6, "{at_1_5s:?}");
        // Never more than a second, however deep the debt or slow the indexers.
        let t2 = t1 + Duration::from_secs(10);
        assert_eq!(p.delay(t2, 20_000, 1_000_000, 10_000, 100_000), MAX_DELAY);
    }
}
