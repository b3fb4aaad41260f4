//! `lsmsearch bench merge`: what a compaction's indexes cost built afresh against merged from
//! the indexes of its inputs.
//!
//! It builds `inputs` generations of the benchmark corpus (each with its text index and vector
//! graph, as flushes make them), merges their rows as a compaction does, and times, on one
//! thread each as the compactor runs by default:
//!
//! - **text, rebuilt**: the merged rows tokenized and indexed into one tantivy segment (what a
//!   compaction does);
//! - **text, merged**: tantivy's segment merge of the inputs' segments (copied into one
//!   directory first, not timed). The merged segment would still need its `_row` fast field
//!   renumbered; that is not timed either, so this is merging's best case;
//! - **graph, rebuilt**: a fresh graph over the merged rows (what a compaction does);
//! - **graph, continued**: the largest input's graph with the other rows inserted
//!   (`compaction_continue_graph`),
//!
//! and the recall@10 of both graphs against exact search for the corpus queries, walked with
//! the default candidate list.

use super::corpus::{Corpus, Embedder};
use crate::compaction::merge::{continue_largest, merge_rows};
use crate::generation::{Generation, IndexSpec};
use crate::text::{TextIndex, TextSchema};
use crate::vector::{distance, VectorIndex};
use crate::{Error, Result, Settings};
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::Float32Type;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tantivy::directory::{Directory, RamDirectory};

/// What `bench merge` builds: the flags of `lsmsearch bench merge`, and their defaults
/// ([`Default`] is what the flags declare).
#[derive(Debug, Clone, clap::Args)]
pub struct MergeOptions {
    /// Rows of all inputs together (the benchmark corpus, with vectors).
    #[arg(long, default_value_t = 100_000)]
    pub docs: usize,
    /// Input generations, equal shares of the rows.
    #[arg(long, default_value_t = 4)]
    pub inputs: usize,
    /// Vector dimension.
    #[arg(long, default_value_t = 128)]
    pub dim: usize,
    /// A Cranfield collection directory (default: the bundled one).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// `hnsw_ef_construction` of the merged graphs (default: the setting's default; the
    /// inputs keep it).
    #[arg(long)]
    pub merged_ef_construction: Option<usize>,
    /// `hnsw_m` of the merged graphs (default: the setting's default; the inputs keep it).
    #[arg(long)]
    pub merged_m: Option<usize>,
    /// Candidate lists to measure recall@10 with, comma-separated (default: the setting's
    /// `hnsw_ef_search`).
    #[arg(long = "ef", value_delimiter = ',')]
    pub efs: Vec<usize>,
}

impl Default for MergeOptions {
    fn default() -> Self {
        super::options::defaults()
    }
}

/// Seconds each way, and the recall of each graph.
#[derive(Debug, Clone, Serialize)]
pub struct MergeReport {
    /// Rows merged.
    pub rows: usize,
    /// Input generations.
    pub inputs: usize,
    /// Seconds to build the inputs (as flushes: text index and graph each).
    pub inputs_s: f64,
    /// Seconds to merge the rows (newest version per key).
    pub rows_s: f64,
    /// Seconds to index the merged rows' text afresh.
    pub text_rebuilt_s: f64,
    /// Seconds of tantivy's merge of the inputs' segments.
    pub text_merged_s: f64,
    /// Seconds to build the merged rows' graph afresh.
    pub graph_rebuilt_s: f64,
    /// Seconds to continue the largest input's graph.
    pub graph_continued_s: f64,
    /// Per candidate list: `(ef, recall@10 of the fresh graph, of the continued graph)`.
    pub recall: Vec<(usize, f64, f64)>,
}

/// Build the inputs, then time each way of making the merged generation's indexes.
pub fn run(o: &MergeOptions) -> Result<MergeReport> {
    if o.inputs < 2 || o.docs < o.inputs {
        return Err(Error::invalid(
            "bench merge needs at least 2 inputs and a row for each",
        ));
    }
    let corpus = Corpus::load(o.data.as_deref())?;
    let schema = Corpus::schema(Some(o.dim));
    let settings = Settings {
        compaction_threads: 1,
        ..Settings::default()
    };
    let text = TextSchema::new(&schema).ok_or_else(|| Error::internal("no text columns"))?;
    let (vcol, metric, mut params) = schema
        .vector_spec(&settings)
        .ok_or_else(|| Error::internal("no vector column"))?;
    params.threads = settings.compaction_threads;
    let stored = schema.stored_schema();
    let merged = crate::settings::GraphParams {
        m: o.merged_m.unwrap_or(params.m),
        ef_construction: o.merged_ef_construction.unwrap_or(params.ef_construction),
        ..params
    };
    let spec = IndexSpec {
        text: Some(&text),
        vector: Some((vcol, metric, params)),
    };
    let mut embedder = Embedder::new(o.dim);

    let started = Instant::now();
    let share = o.docs / o.inputs;
    let mut inputs = Vec::with_capacity(o.inputs);
    for i in 0..o.inputs {
        let n = if i + 1 == o.inputs {
            o.docs - share * i
        } else {
            share
        };
        let user = corpus.batch(Some(&mut embedder), share * i, n)?;
        let rows = schema.to_stored(&user, (share * i) as u64 + 1)?;
        let (g, _) = Generation::build(i as u64 + 1, 1, rows, &stored, spec, None, 1)?;
        inputs.push(Arc::new(g));
    }
    let inputs_s = started.elapsed().as_secs_f64();

    let t = Instant::now();
    let read = |g: &Arc<Generation>| futures::executor::block_on(g.all_rows());
    let (rows, kept) = merge_rows(&inputs, &[], read, true)?;
    let rows_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    TextIndex::build(&text, &rows)?;
    let text_rebuilt_s = t.elapsed().as_secs_f64();

    let text_merged_s = merge_segments(&inputs)?;

    let t = Instant::now();
    let (fresh, _) = VectorIndex::build(&rows, vcol, metric, merged)?;
    let graph_rebuilt_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let continued = continue_largest(&inputs, &kept, &rows, vcol, metric, merged)?
        .ok_or_else(|| Error::internal("the largest input's graph cannot be continued"))?;
    let (continued, _) = VectorIndex::from_adjacency(&rows, vcol, metric, continued)?;
    let graph_continued_s = t.elapsed().as_secs_f64();

    let queries: Vec<Vec<f32>> = corpus
        .queries()
        .iter()
        .map(|q| embedder.embed(q, 0, 0.0))
        .collect();
    let efs = if o.efs.is_empty() {
        vec![settings.hnsw_ef_search]
    } else {
        o.efs.clone()
    };
    let recall = efs
        .iter()
        .map(|ef| {
            let of = |g: &VectorIndex| recall_at_10(g, &rows, vcol, metric, &queries, *ef);
            Ok((*ef, of(&fresh)?, of(&continued)?))
        })
        .collect::<Result<_>>()?;
    Ok(MergeReport {
        rows: rows.num_rows(),
        inputs: o.inputs,
        inputs_s,
        rows_s,
        text_rebuilt_s,
        text_merged_s,
        graph_rebuilt_s,
        graph_continued_s,
        recall,
    })
}

/// Copy every input's segments into one directory, then time tantivy's merge of them into one
/// segment (one indexing thread, as a compaction builds).
fn merge_segments(inputs: &[Arc<Generation>]) -> Result<f64> {
    let dir = RamDirectory::create();
    let mut meta = None;
    let mut segments = Vec::new();
    for g in inputs {
        let ti = g
            .text()
            .ok_or_else(|| Error::internal("an input without a text index"))?;
        let index = ti.searcher().index();
        for seg in index.searchable_segment_metas()? {
            for file in crate::text::segment_files(&seg) {
                if let Ok(bytes) = index.directory().atomic_read(&file) {
                    dir.atomic_write(&file, &bytes)
                        .map_err(tantivy::TantivyError::from)?;
                }
            }
            segments.push(seg);
        }
        meta.get_or_insert(index.load_metas()?);
    }
    let mut meta = meta.ok_or_else(|| Error::internal("no inputs"))?;
    meta.segments = segments;
    let json = serde_json::to_vec(&meta).map_err(|e| Error::internal(e.to_string()))?;
    dir.atomic_write(std::path::Path::new("meta.json"), &json)
        .map_err(tantivy::TantivyError::from)?;
    let index = tantivy::Index::open(dir)?;
    let mut writer: tantivy::IndexWriter = index.writer_with_num_threads(1, 128_000_000)?;
    let ids = index.searchable_segment_ids()?;
    let t = Instant::now();
    writer.merge(&ids).wait()?;
    writer.wait_merging_threads()?;
    let secs = t.elapsed().as_secs_f64();
    let merged = index.searchable_segment_metas()?;
    if merged.len() != 1 {
        return Err(Error::internal(format!(
            "the merge left {} segments",
            merged.len()
        )));
    }
    Ok(secs)
}

/// Mean recall@10 of `graph`'s walks with candidate list `ef` against exact search over `rows`.
fn recall_at_10(
    graph: &VectorIndex,
    rows: &RecordBatch,
    vcol: usize,
    metric: crate::Metric,
    queries: &[Vec<f32>],
    ef: usize,
) -> Result<f64> {
    let vectors = rows.column(vcol).as_fixed_size_list();
    let values = vectors.values().as_primitive::<Float32Type>().values();
    let dim = vectors.value_length() as usize;
    let mut found = 0usize;
    for q in queries {
        let mut exact: Vec<(f32, usize)> = (0..rows.num_rows())
            .filter(|r| vectors.is_valid(*r))
            .map(|r| (distance(metric, q, &values[r * dim..(r + 1) * dim]), r))
            .collect();
        exact.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let Some(tenth) = exact.get(9).or(exact.last()).map(|e| e.0) else {
            continue;
        };
        // Ties with the tenth count as found.
        let got = graph.candidates(q, 10, ef, &|_| true);
        found += got
            .iter()
            .take(10)
            .filter(|r| distance(metric, q, &values[**r * dim..(**r + 1) * dim]) <= tenth)
            .count();
    }
    Ok(found as f64 / (10 * queries.len()).max(1) as f64)
}

impl MergeReport {
    /// The table `bench merge` prints.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{} rows from {} inputs (inputs built in {:.1} s, rows merged in {:.2} s)\n\
             {:<8} {:>12} {:>12}\n\
             {:<8} {:>12.2} {:>12.2}\n\
             {:<8} {:>12.2} {:>12.2}\n",
            self.rows,
            self.inputs,
            self.inputs_s,
            self.rows_s,
            "",
            "rebuilt (s)",
            "merged (s)",
            "text",
            self.text_rebuilt_s,
            self.text_merged_s,
            "graph",
            self.graph_rebuilt_s,
            self.graph_continued_s,
        );
        out.push_str(&format!(
            "{:>8} {:>16} {:>18}\n",
            "ef", "recall@10 fresh", "recall@10 continued"
        ));
        for (ef, fresh, continued) in &self.recall {
            out.push_str(&format!("{ef:>8} {fresh:>16.3} {continued:>18.3}\n"));
        }
        out
    }
}
