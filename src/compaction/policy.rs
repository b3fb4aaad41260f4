//! The policy: which run of adjacent generations to merge next.
//!
//! Looking from a generation back towards older ones, a generation joins the run while it holds
//! at most 1.5 times the rows of the run so far; a run of at least
//! [`crate::Settings::compaction_fanout`] generations is merged (the newest such run first).
//! This is size-tiered compaction in the form of RocksDB's universal compaction (size ratio
//! with slack): generations grow geometrically from newest to oldest, so their count stays
//! logarithmic in the number of flushes, and each row is rewritten about log_fanout(flushes)
//! times. Without the slack (a ratio of 1), flushes each a little smaller than the one before
//! would never merge. `docs/architecture.md` gives the figures it was chosen by.
//!
//! At [`crate::Settings::compaction_max_generations`] the cheapest run of `fanout` adjacent
//! generations is merged whatever their sizes ([`due`]).

use crate::format::GenerationMeta;
use std::ops::Range;

/// The run (indices into `rows`, the generations' row counts oldest first) the policy merges
/// next, if any: the newest run of at least `fanout` adjacent generations in which each
/// generation holds at most 1.5 times the rows of the newer ones of the run together.
pub(crate) fn pick(rows: &[u64], fanout: usize) -> Option<Range<usize>> {
    for end in (0..rows.len()).rev() {
        let mut sum = rows[end];
        let mut start = end;
        // rows ≤ 1.5 × sum: a slack that lets flushes of slightly varying sizes merge. (Row
        // counts come from manifests: the arithmetic saturates.)
        while start > 0 && rows[start - 1].saturating_mul(2) <= sum.saturating_mul(3) {
            start -= 1;
            sum = sum.saturating_add(rows[start]);
        }
        if end + 1 - start >= fanout.max(2) {
            return Some(start..end + 1);
        }
    }
    None
}

/// The run to merge now: the policy's, or at `cap` generations the `fanout` adjacent ones
/// holding the fewest rows.
pub(crate) fn due(rows: &[u64], fanout: usize, cap: usize) -> Option<Range<usize>> {
    pick(rows, fanout).or_else(|| {
        if rows.len() < cap {
            return None;
        }
        let width = fanout.clamp(2, rows.len());
        (0..=rows.len() - width)
            .min_by_key(|&s| {
                rows[s..s + width]
                    .iter()
                    .fold(0u64, |a, r| a.saturating_add(*r))
            })
            .map(|s| s..s + width)
    })
}

/// Rows of the run compaction would merge now (0 when none is due).
pub(crate) fn debt(metas: &[GenerationMeta], fanout: usize, cap: usize) -> u64 {
    let rows: Vec<u64> = metas.iter().map(|m| m.rows).collect();
    due(&rows, fanout, cap).map_or(0, |r| {
        rows[r].iter().fold(0u64, |a, r| a.saturating_add(*r))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flushes of random, shrinking or mixed sizes, merges shrinking by up to 20% (updates and
    /// deletes): the count stays within `max(fanout - 1, 2 log2(flushes))` after every round,
    /// and each row is rewritten about log_fanout(flushes) times.
    #[test]
    fn the_policy_keeps_the_count_logarithmic() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for fanout in [2, 3, 4, 8] {
            for shape in ["random", "shrinking", "mixed"] {
                let mut gens: Vec<u64> = Vec::new();
                let mut rewritten = 0u64;
                let mut flushed = 0u64;
                let n = 2000u64;
                for flush in 1..=n {
                    let rows = match shape {
                        "random" => 40_000 + rand(20_000),
                        "shrinking" => 60_000 - flush * 10,
                        _ if rand(4) == 0 => 1 + rand(100),
                        _ => 50_000,
                    };
                    flushed += rows;
                    gens.push(rows);
                    while let Some(run) = pick(&gens, fanout) {
                        let sum: u64 = gens[run.clone()].iter().sum();
                        rewritten += sum;
                        let shrunk = sum - sum * rand(20) / 100;
                        gens.splice(run, [shrunk]);
                    }
                    let bound = ((2.0 * (flush as f64).log2()).floor() as usize).max(fanout - 1);
                    assert!(
                        gens.len() <= bound,
                        "fanout {fanout}, {shape}: {} generations after {flush} flushes \
                         (bound {bound}): {gens:?}",
                        gens.len()
                    );
                }
                let amplification = rewritten as f64 / flushed as f64;
                assert!(
                    amplification < 1.5 * (n as f64).log(fanout as f64),
                    "fanout {fanout}, {shape}: each row rewritten {amplification:.1} times"
                );
            }
        }
    }

    #[test]
    fn at_the_cap_the_cheapest_run_is_merged() {
        let doubling = [64, 32, 16, 8, 4, 2, 1];
        assert_eq!(pick(&doubling, 4), None, "the policy waits");
        assert_eq!(due(&doubling, 4, 8), None, "under the cap");
        assert_eq!(
            due(&doubling, 4, 7),
            Some(3..7),
            "at the cap: the four smallest"
        );
        assert_eq!(due(&[5, 9], 4, 2), Some(0..2));
    }

    #[test]
    fn a_run_needs_fanout_generations_each_no_bigger_than_the_newer_ones() {
        assert_eq!(pick(&[8, 1, 1, 1], 4), None, "8 is more than 1.5 × 3");
        assert_eq!(pick(&[8, 1, 1, 1, 1], 4), Some(1..5));
        assert_eq!(pick(&[8, 4, 4, 4], 4), Some(0..4));
        assert_eq!(
            pick(&[20, 4, 4, 4], 3),
            Some(1..4),
            "20 is more than 1.5 × 12"
        );
        assert_eq!(pick(&[100, 1, 1, 1, 1, 50], 4), Some(1..6));
        assert_eq!(
            pick(&[1000, 5, 5, 5, 5, 1], 4),
            Some(1..5),
            "an older run is found"
        );
        assert_eq!(pick(&[1, 1, 1], 4), None);
        assert_eq!(pick(&[], 4), None);
    }
}
