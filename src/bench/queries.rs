//! Warm query latency on an existing index, for the queries of a Parquet file: the figures
//! other front ends of the same index (the Python package's benchmark) compare with.

use crate::error::{Error, Result};
use crate::VectorSearchOptions;
use crate::{HybridSearchOptions, Location, ReadOnlyIndex, SearchOptions, Settings};
use arrow::array::AsArray;
use arrow::datatypes::Float32Type;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// Options of the benchmark: the flags of `lsmsearch bench queries`.
#[derive(Debug, Clone, clap::Args)]
pub struct QueriesOptions {
    /// The index (a local path, or s3://bucket/prefix).
    pub location: String,
    /// A Parquet file of queries: a `text` column and an `emb` column of vectors (as
    /// `lsmsearch bench corpus` writes to OUT/queries.parquet).
    #[arg(long)]
    pub queries: PathBuf,
    /// Times each query is measured, after one round that warms the handle.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Rows each search returns.
    #[arg(long, default_value_t = 10)]
    pub k: usize,
}

/// Warm latency of one kind of search.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// `fts`, `vector` or `hybrid`.
    pub kind: String,
    /// Searches measured.
    pub samples: usize,
    /// Median, in milliseconds.
    pub p50_ms: f64,
    /// 95th percentile, in milliseconds.
    pub p95_ms: f64,
}

/// What the benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct QueriesReport {
    /// Queries read from the file.
    pub queries: usize,
    /// One entry per kind of search.
    pub latency: Vec<Latency>,
}

impl QueriesReport {
    /// The report as a table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:>8} {:>8} {:>9} {:>9}\n",
            "kind", "samples", "p50 ms", "p95 ms"
        );
        for l in &self.latency {
            out += &format!(
                "{:>8} {:>8} {:>9.3} {:>9.3}\n",
                l.kind, l.samples, l.p50_ms, l.p95_ms
            );
        }
        out
    }
}

/// The `text` and `emb` columns of a Parquet file.
pub fn read_queries(path: &std::path::Path) -> Result<Vec<(String, Vec<f32>)>> {
    let file = std::fs::File::open(path)
        .map_err(|e| Error::invalid(format!("queries file {}: {e}", path.display())))?;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| Error::invalid(format!("queries file {}: {e}", path.display())))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch?;
        let column = |name: &str| {
            batch.column_by_name(name).cloned().ok_or_else(|| {
                Error::invalid(format!("queries file {}: no column {name}", path.display()))
            })
        };
        let (text, emb) = (column("text")?, column("emb")?);
        let text = text.as_string_opt::<i32>().ok_or_else(|| {
            Error::invalid(format!("queries file {}: text is not utf8", path.display()))
        })?;
        let emb =
            arrow::compute::cast(
                &emb,
                &arrow::datatypes::DataType::List(std::sync::Arc::new(
                    arrow::datatypes::Field::new("item", arrow::datatypes::DataType::Float32, true),
                )),
            )?;
        let emb = emb.as_list::<i32>();
        for i in 0..batch.num_rows() {
            let v = emb.value(i);
            let v = v.as_primitive::<Float32Type>();
            out.push((text.value(i).to_string(), v.values().to_vec()));
        }
    }
    if out.is_empty() {
        return Err(Error::invalid(format!(
            "queries file {}: no queries",
            path.display()
        )));
    }
    Ok(out)
}

/// Run one search of `kind`; the rows it returned.
async fn search(
    index: &ReadOnlyIndex,
    kind: &str,
    q: &(String, Vec<f32>),
    k: usize,
) -> Result<usize> {
    let batches = match kind {
        "fts" => index.search_fts(&q.0, &SearchOptions::with_k(k)).await?,
        "vector" => {
            index
                .search_vector(&q.1, &VectorSearchOptions::with_k(k))
                .await?
        }
        _ => {
            index
                .search_hybrid(&q.0, &q.1, &HybridSearchOptions::with_k(k))
                .await?
        }
    };
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

/// Measure the warm latency of full-text, vector and hybrid searches of every query.
pub async fn run(o: &QueriesOptions) -> Result<QueriesReport> {
    if o.rounds == 0 || o.k == 0 {
        return Err(Error::invalid("--rounds and --k need at least 1"));
    }
    let queries = read_queries(&o.queries)?;
    let index =
        crate::Index::open_read_only(Location::parse(&o.location)?, Settings::default()).await?;
    let mut latency = Vec::new();
    for kind in ["fts", "vector", "hybrid"] {
        for q in &queries {
            search(&index, kind, q, o.k).await?;
        }
        let mut ms = Vec::with_capacity(queries.len() * o.rounds);
        for _ in 0..o.rounds {
            for q in &queries {
                let t = Instant::now();
                search(&index, kind, q, o.k).await?;
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        ms.sort_by(f64::total_cmp);
        let pct = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
        latency.push(Latency {
            kind: kind.to_string(),
            samples: ms.len(),
            p50_ms: pct(0.5),
            p95_ms: pct(0.95),
        });
    }
    index.close().await?;
    Ok(QueriesReport {
        queries: queries.len(),
        latency,
    })
}
