//! The benchmarks behind `lsmsearch bench`, one module each; every benchmark's options are a
//! `clap::Args` struct whose flags declare the defaults once ([`Default`] reads them):
//!
//! - [`generations`]: query latency and object-store round trips against the number of
//!   generations, behind a store adding per-request latency;
//! - [`stream`]: writers and readers on one index at once, with compaction at work;
//! - [`merge`]: a compaction's indexes merged against rebuilt;
//! - [`reader`]: a new process opening an existing index read-only and answering queries:
//!   round trips, bytes, resident memory;
//! - [`queries`]: warm latency of full-text, vector and hybrid searches on an existing index,
//!   for the queries of a Parquet file (what the Python package's benchmark compares with);
//! - [`corpus`]: the benchmark corpus (Cranfield replicated, with vectors), also as Parquet for
//!   other systems.

pub mod corpus;
pub mod generations;
pub mod merge;
mod options;
mod plot;
pub mod queries;
pub mod reader;
pub mod stream;

pub use generations::{run, slope, Options, Report, Run, Shape};

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_default_parses() {
        let g = Options::default();
        assert_eq!(g.docs, 100_000);
        assert_eq!(g.gens, vec![1, 2, 5, 10, 18, 32, 64]);
        assert_eq!(g.get_latency, Duration::from_millis(10));
        assert!(g.print && !g.progress);
        assert_eq!(g.kinds.len(), 7);
        g.check().unwrap();
        let unknown = Options {
            kinds: vec!["fts".into(), "vectors".into()],
            ..Options::default()
        };
        let e = unknown.check().unwrap_err().to_string();
        assert!(e.contains("--kinds") && e.contains("'vectors'"), "{e}");
        let s = stream::StreamOptions::default();
        assert_eq!(s.duration, Duration::from_secs(180));
        assert_eq!(s.kinds, ["fts", "vector", "filtered"]);
        let m = merge::MergeOptions::default();
        assert_eq!((m.docs, m.inputs, m.dim), (100_000, 4, 128));
    }
}
