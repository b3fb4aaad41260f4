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
//!
//! No merge makes a generation of more than [`crate::Settings::compaction_max_rows`] rows (as
//! Lucene caps merged segments), which bounds a merge's memory by the setting, not by the
//! index. Generations of at least half that size are *full*: they may still take small
//! neighbours in, but the cap on the count applies to the others ([`open`]), so a large
//! index is not held at the cap by generations that cannot merge with each other. The count
//! stays within `compaction_max_generations` open ones plus the full ones (at most
//! `2 × rows / max_rows`); [`due`] finds nothing when no adjacent generations fit together,
//! and then flushes do not wait.

use crate::format::GenerationMeta;
use std::ops::Range;

/// The run (indices into `rows`, the generations' row counts oldest first) the policy merges
/// next, if any: the newest run of at least `fanout` adjacent generations in which each
/// generation holds at most 1.5 times the rows of the newer ones of the run together, and
/// which holds at most `max_rows` rows.
pub(crate) fn pick(rows: &[u64], fanout: usize, max_rows: u64) -> Option<Range<usize>> {
    for end in (0..rows.len()).rev() {
        let mut sum = rows[end];
        let mut start = end;
        // rows ≤ 1.5 × sum: a slack that lets flushes of slightly varying sizes merge. (Row
        // counts come from manifests: the arithmetic saturates.)
        while start > 0
            && rows[start - 1].saturating_mul(2) <= sum.saturating_mul(3)
            && sum.saturating_add(rows[start - 1]) <= max_rows
        {
            start -= 1;
            sum = sum.saturating_add(rows[start]);
        }
        if end + 1 - start >= fanout.max(2) {
            return Some(start..end + 1);
        }
    }
    None
}

/// How many of the generations (row counts) are open: below half of `max_rows`, so that two
/// adjacent open ones always fit together. The cap on the count applies to these.
pub(crate) fn open(rows: impl IntoIterator<Item = u64>, max_rows: u64) -> usize {
    rows.into_iter()
        .filter(|r| r.saturating_mul(2) < max_rows)
        .count()
}

/// The run to merge now: the policy's, or at `cap` open generations the `fanout` adjacent ones
/// holding the fewest rows among those that fit in `max_rows` (fewer adjacent ones, down to
/// two, when no `fanout` of them fit); `None` when nothing is due or nothing fits.
pub(crate) fn due(rows: &[u64], fanout: usize, cap: usize, max_rows: u64) -> Option<Range<usize>> {
    pick(rows, fanout, max_rows).or_else(|| {
        if open(rows.iter().copied(), max_rows) < cap || rows.len() < 2 {
            return None;
        }
        let sum = |r: &[u64]| r.iter().fold(0u64, |a, r| a.saturating_add(*r));
        (2..=fanout.clamp(2, rows.len())).rev().find_map(|width| {
            (0..=rows.len() - width)
                .map(|s| (sum(&rows[s..s + width]), s))
                .filter(|(n, _)| *n <= max_rows)
                .min()
                .map(|(_, s)| s..s + width)
        })
    })
}

/// What `compact()` merges next among the generations of sequence numbers up to `last` (those
/// present when it was called: it ends under appends; merges keep their inputs' place and
/// sequence numbers): the oldest run of at least two adjacent ones that
/// fits in `max_rows` rows, as long as it fits; or the oldest generation alone when it holds
/// tombstones (they go, as nothing older remains) and fits. `None` when nothing would change.
pub(crate) fn all(metas: &[GenerationMeta], max_rows: u64, last: u64) -> Option<Range<usize>> {
    let metas = &metas[..metas.partition_point(|m| m.max_seq <= last)];
    for start in 0..metas.len() {
        let mut sum = metas[start].rows;
        let mut end = start + 1;
        while end < metas.len() && sum.saturating_add(metas[end].rows) <= max_rows {
            sum = sum.saturating_add(metas[end].rows);
            end += 1;
        }
        if end - start >= 2 {
            return Some(start..end);
        }
        if start == 0 && metas[0].tombstones > 0 && metas[0].rows <= max_rows {
            return Some(0..1);
        }
    }
    None
}

/// Rows of the run compaction would merge now (0 when none is due).
pub(crate) fn debt(metas: &[GenerationMeta], fanout: usize, cap: usize, max_rows: u64) -> u64 {
    let rows: Vec<u64> = metas.iter().map(|m| m.rows).collect();
    due(&rows, fanout, cap, max_rows).map_or(0, |r| {
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
                    while let Some(run) = pick(&gens, fanout, u64::MAX) {
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
        assert_eq!(pick(&doubling, 4, u64::MAX), None, "the policy waits");
        assert_eq!(due(&doubling, 4, 8, u64::MAX), None, "under the cap");
        assert_eq!(
            due(&doubling, 4, 7, u64::MAX),
            Some(3..7),
            "at the cap: the four smallest"
        );
        assert_eq!(due(&[5, 9], 4, 2, u64::MAX), Some(0..2));
    }

    #[test]
    fn a_run_needs_fanout_generations_each_no_bigger_than_the_newer_ones() {
        assert_eq!(
            pick(&[8, 1, 1, 1], 4, u64::MAX),
            None,
            "8 is more than 1.5 × 3"
        );
        assert_eq!(pick(&[8, 1, 1, 1, 1], 4, u64::MAX), Some(1..5));
        assert_eq!(pick(&[8, 4, 4, 4], 4, u64::MAX), Some(0..4));
        assert_eq!(
            pick(&[20, 4, 4, 4], 3, u64::MAX),
            Some(1..4),
            "20 is more than 1.5 × 12"
        );
        assert_eq!(pick(&[100, 1, 1, 1, 1, 50], 4, u64::MAX), Some(1..6));
        assert_eq!(
            pick(&[1000, 5, 5, 5, 5, 1], 4, u64::MAX),
            Some(1..5),
            "an older run is found"
        );
        assert_eq!(pick(&[1, 1, 1], 4, u64::MAX), None);
        assert_eq!(pick(&[], 4, u64::MAX), None);
    }

    /// A large index under a cap on merged rows: no merge passes it, and the count stays
    /// within `cap` open generations plus the full ones (at most `2 × rows / max_rows`).
    #[test]
    fn no_merge_passes_max_rows_and_the_count_follows_the_size() {
        let (fanout, cap, max_rows) = (4, 16, 1_000_000u64);
        let mut gens: Vec<u64> = Vec::new();
        let mut total = 0u64;
        for flush in 0..2_000u64 {
            let rows = 20_000 + flush % 7 * 5_000;
            total += rows;
            gens.push(rows);
            while let Some(run) = due(&gens, fanout, cap, max_rows) {
                let sum: u64 = gens[run.clone()].iter().sum();
                assert!(sum <= max_rows, "a merge of {sum} rows: {gens:?}");
                gens.splice(run, [sum]);
            }
            let bound = cap + (2 * total / max_rows) as usize;
            assert!(
                gens.len() <= bound,
                "{} generations over {total} rows (bound {bound}): {gens:?}",
                gens.len()
            );
        }
        assert!(total > 40 * max_rows && gens.len() > cap, "{gens:?}");
    }

    #[test]
    fn at_the_cap_only_runs_that_fit_are_merged() {
        // Four adjacent ones do not fit, three do.
        assert_eq!(due(&[60, 40, 30, 30, 50], 4, 3, 100), Some(1..4));
        assert_eq!(due(&[60, 30, 30, 30, 5], 4, 4, 100), Some(1..5));
        // Full generations (at least half the cap) do not count towards it.
        assert_eq!(due(&[60, 30, 30, 30, 5], 4, 5, 100), None);
        // Only a pair fits.
        assert_eq!(due(&[90, 50, 40, 95], 4, 1, 100), Some(1..3));
        // Nothing fits: nothing to wait for.
        assert_eq!(due(&[90, 60, 90, 60], 4, 0, 100), None);
        assert_eq!(debt(&metas(&[(90, 0), (60, 0), (90, 0)]), 2, 3, 100), 0);
    }

    fn metas(rows: &[(u64, u64)]) -> Vec<GenerationMeta> {
        rows.iter()
            .enumerate()
            .map(|(i, (rows, tombstones))| GenerationMeta {
                id: i as u64 + 1,
                epoch: 1,
                rows: *rows,
                tombstones: *tombstones,
                bytes: 0,
                min_seq: 0,
                max_seq: i as u64 + 1,
                flushes: 1,
                hot_offset: None,
            })
            .collect()
    }

    #[test]
    fn compact_merges_the_oldest_runs_that_fit() {
        assert_eq!(
            all(&metas(&[(10, 0), (20, 0), (30, 0)]), 100, u64::MAX),
            Some(0..3)
        );
        assert_eq!(
            all(&metas(&[(60, 0), (50, 0), (30, 0)]), 100, u64::MAX),
            Some(1..3)
        );
        assert_eq!(all(&metas(&[(60, 0), (80, 0)]), 100, u64::MAX), None);
        assert_eq!(all(&metas(&[(60, 3), (80, 0)]), 100, u64::MAX), Some(0..1));
        assert_eq!(
            all(&metas(&[(160, 3)]), 100, u64::MAX),
            None,
            "too large to rewrite"
        );
        assert_eq!(
            all(&metas(&[(60, 0)]), 100, u64::MAX),
            None,
            "nothing to drop"
        );
        assert_eq!(all(&[], 100, u64::MAX), None);
        // Generations flushed after the call are left alone.
        assert_eq!(
            all(&metas(&[(10, 0), (20, 0), (30, 0)]), 100, 2),
            Some(0..2)
        );
        assert_eq!(all(&metas(&[(10, 0), (20, 0), (30, 0)]), 100, 1), None);
    }
}
