//! The benchmarks behind `lsmsearch bench`, one module each; every benchmark's options are a
//! `clap::Args` struct whose flags declare the defaults once ([`Default`] reads them):
//!
//! - [`generations`]: query latency and object-store round trips against the number of
//!   generations, behind a store adding per-request latency;
//! - [`stream`]: writers and readers on one index at once, with compaction at work;
//! - [`merge`]: a compaction's indexes merged against rebuilt;
//! - [`corpus`]: the benchmark corpus (Cranfield replicated, with vectors), also as Parquet for
//!   other systems.

pub mod corpus;
pub mod generations;
pub mod merge;
mod plot;
pub mod stream;

pub use generations::{run, slope, Options, Report, Run, Shape};

use std::time::Duration;

/// Options with the defaults their flags declare: each default is written once, on its flag.
pub(crate) fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults").no_binary_name(true));
    let parsed = command
        .try_get_matches_from(std::iter::empty::<String>())
        .and_then(|m| T::from_arg_matches(&m));
    match parsed {
        Ok(options) => options,
        // Every flag has a default that parses (`tests::every_default_parses`).
        Err(e) => panic!("the benchmark's option defaults do not parse: {e}"),
    }
}

/// A duration given in (fractional) milliseconds.
pub(crate) fn millis(v: &str) -> std::result::Result<Duration, String> {
    let ms: f64 = v.parse().map_err(|e| format!("{e}"))?;
    Duration::try_from_secs_f64(ms / 1e3).map_err(|_| "a number of milliseconds".to_string())
}

/// A duration given in (fractional) seconds.
pub(crate) fn seconds(v: &str) -> std::result::Result<Duration, String> {
    let s: f64 = v.parse().map_err(|e| format!("{e}"))?;
    Duration::try_from_secs_f64(s).map_err(|_| "a number of seconds".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_parses() {
        let g = Options::default();
        assert_eq!(g.docs, 100_000);
        assert_eq!(g.gens, vec![1, 2, 5, 10, 18, 32, 64]);
        assert_eq!(g.get_latency, Duration::from_millis(10));
        assert!(g.print && !g.progress);
        let s = stream::StreamOptions::default();
        assert_eq!(s.duration, Duration::from_secs(180));
        assert_eq!(s.kinds, ["fts", "vector", "filtered"]);
        let m = merge::MergeOptions::default();
        assert_eq!((m.docs, m.inputs, m.dim), (100_000, 4, 128));
    }
}
