//! The options of `bench stream`.

use crate::{Durability, Result, Settings};
use std::path::PathBuf;
use std::time::Duration;

/// What `bench stream` runs: the flags of `lsmsearch bench stream`, and their defaults
/// ([`Default`] is what the flags declare).
#[derive(Debug, Clone, clap::Args)]
pub struct StreamOptions {
    /// Writers.
    #[arg(long, default_value_t = 1)]
    pub writers: usize,
    /// Rows per append (new keys, 10% updates; deletes of 1% of it follow each append).
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Target rows/s of all writers together (0 = as fast as they can).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Durability of the appends: durable or buffered.
    #[arg(long, default_value = "durable")]
    pub durability: Durability,
    /// Readers.
    #[arg(long, default_value_t = 2)]
    pub readers: usize,
    /// Query kinds the readers cycle through (fts, vector, filtered), comma-separated.
    #[arg(long, default_value = "fts,vector,filtered", value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Target queries/s of all readers together (0 = as fast as they can).
    #[arg(long, default_value_t = 0.0)]
    pub qps: f64,
    /// Seconds the stream runs.
    #[arg(long = "seconds", default_value = "180", value_parser = crate::bench::options::seconds)]
    pub duration: Duration,
    /// Seconds between printed rows (at least 0.1).
    #[arg(long, default_value = "10", value_parser = crate::bench::options::seconds)]
    pub interval: Duration,
    /// Seconds between snapshot checks (recall, full-text equivalence; 0 = none).
    #[arg(long, default_value = "60", value_parser = crate::bench::options::seconds)]
    pub checkpoint: Duration,
    /// Output directory (the index is built in OUT/index and removed afterwards).
    #[arg(long, default_value = "bench-out/stream")]
    pub out: PathBuf,
    /// A Cranfield collection directory (default: the bundled one).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Vector dimension.
    #[arg(long, default_value_t = 128)]
    pub dim: usize,
    /// Index settings as JSON (fields of `Settings`; the rest keep their defaults).
    #[arg(long, default_value = "{}", value_parser = settings_json)]
    pub settings: Settings,
    /// Print the table (the command line: without `--json`).
    #[arg(skip = true)]
    pub print: bool,
    /// After the stream, merge every generation into one and report the space amplification
    /// (bytes of the generations ÷ bytes of one generation of the live rows).
    #[arg(long)]
    pub compact_at_end: bool,
}

impl Default for StreamOptions {
    fn default() -> Self {
        crate::bench::options::defaults()
    }
}

/// `--settings`: a JSON object of `Settings` fields.
pub(super) fn settings_json(v: &str) -> std::result::Result<Settings, String> {
    serde_json::from_str(v).map_err(|e| e.to_string())
}

impl StreamOptions {
    /// Refuse options the benchmark cannot run with.
    pub(super) fn check(&self) -> Result<()> {
        let o = self;
        let rate_ok = |r: f64| r.is_finite() && r >= 0.0;
        if o.writers == 0 || o.batch == 0 || o.dim == 0 || !rate_ok(o.rate) || !rate_ok(o.qps) {
            return Err(crate::Error::invalid(
                "writers, batch and dim must be at least 1, rate and qps at least 0",
            ));
        }
        if o.readers > 0 && o.kinds.is_empty() {
            return Err(crate::Error::invalid("readers need query kinds"));
        }
        if let Some(k) = o
            .kinds
            .iter()
            .find(|k| !["fts", "vector", "filtered"].contains(&k.as_str()))
        {
            return Err(crate::Error::invalid(format!(
                "unknown query kind '{k}' (fts, vector, filtered)"
            )));
        }
        Ok(())
    }
}
