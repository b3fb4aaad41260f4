//! The `lsmsearch` command line: create, fill, inspect and demo an index.

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use clap::{Parser, Subcommand};
use lsmsearch::{
    Conjunction, Durability, Error, Fusion, HybridSearchOptions, Index, IndexSchema, IndexStats,
    Key, Location, ScanOptions, SearchOptions, Settings, VectorSearchOptions, WriteOptions,
};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod bench_shards;
mod demo;
mod handles;

use handles::{Reader, Writer};

/// The command line's allocator. glibc's per-thread arenas keep what the query, I/O and
/// compaction threads free: a new process answering 200 mixed queries over a 2,000,000-row
/// index peaked at 1,837 MiB with it and at 1,246 MiB with jemalloc, which returns freed pages
/// to the system. A program embedding the library chooses its own. Unix only: jemalloc is
/// built with make and a POSIX shell.
#[cfg(unix)]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (`_RJEM_MALLOC_CONF` in the environment overrides them): freed pages
/// go back to the system a second after they were freed instead of ten (decay runs as the
/// allocator is used: an idle process keeps what it held). The reader benchmark over
/// 2,000,000 rows peaked at 897 MiB with it and at 978 MiB without; its p50 stayed at 29 ms
/// (what a query frees, the next one reuses).
#[cfg(unix)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &u8 = &b"dirty_decay_ms:1000\0"[0];

/// A real-time search index built as an LSM tree on object storage.
#[derive(Parser, Debug)]
#[command(name = "lsmsearch", version, about)]
struct Cli {
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// Where the index a command opens lives, and the settings of its handle.
#[derive(clap::Args, Debug, Clone)]
struct Open {
    /// Where the index lives (a local path, memory:// or s3://bucket/prefix).
    location: String,
    /// Settings of the handle as JSON: any fields of `Settings` (e.g. '{"cache_bytes":
    /// 268435456, "memtable_max_rows": 50000}'); the others keep their defaults, and an
    /// unknown field is an error.
    #[arg(long, value_parser = settings_json, default_value = "{}")]
    settings: Settings,
}

/// `--settings`: a JSON object of `Settings` fields.
fn settings_json(v: &str) -> Result<Settings, String> {
    serde_json::from_str(v).map_err(|e| format!("settings: {e}"))
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Create an index at LOCATION (a local path, memory:// or s3://bucket/prefix).
    Init {
        #[command(flatten)]
        open: Open,
        /// The schema file (JSON): {"primary_key": "id", "text": [...], "vector": {...}, "payload": [...]}.
        #[arg(long)]
        schema: PathBuf,
        /// Create a sharded index of N shards (LOCATION/shard-0 ...), each row in the shard
        /// its key hashes to, searched as one index (see docs/sharding.md).
        #[arg(long, value_name = "N")]
        shards: Option<u32>,
    },
    /// Append the rows of FILE (JSON lines, Parquet or Arrow IPC), upserting by primary key.
    Ingest {
        #[command(flatten)]
        open: Open,
        /// JSON lines (.jsonl, .json, .ndjson), Parquet (.parquet) or Arrow IPC (.arrow, .arrows, .ipc).
        file: PathBuf,
        /// Rows per append call.
        #[arg(long, default_value_t = 1000)]
        batch_size: usize,
        /// Flush the memtable to a generation after every N rows appended.
        #[arg(long)]
        flush_every: Option<usize>,
        /// durable (the WAL object is written before each append returns) or buffered.
        #[arg(long, default_value = "durable")]
        durability: String,
    },
    /// Delete rows by primary key.
    Delete {
        #[command(flatten)]
        open: Open,
        /// Keys to delete.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Flush the memtable (the rows replayed from the WAL) into a generation.
    Flush {
        #[command(flatten)]
        open: Open,
    },
    /// Flush the memtable, then merge every generation into one (superseded versions and
    /// tombstones dropped).
    Compact {
        #[command(flatten)]
        open: Open,
    },
    /// Print every live row as JSON lines.
    Scan {
        #[command(flatten)]
        open: Open,
        /// A SQL predicate over the index's columns, e.g. "year >= 2020 AND lang = 'en'".
        #[arg(long)]
        filter: Option<String>,
    },
    /// Full-text search (BM25 with global statistics over the live rows: key, _score,
    /// columns), vector search (exact distances: key, _distance, columns), or both at once: a
    /// hybrid search fusing the two rankings (key, fused _score, _fts_score, _distance, each
    /// part's rank, columns).
    Search {
        #[command(flatten)]
        open: Open,
        /// The query, in tantivy's query-parser syntax: terms, AND/OR, "phrases", +required,
        /// -excluded, field:term, term^2. With --vector or --vector-file: a hybrid search.
        #[arg(long, required_unless_present_any = ["vector", "vector_file"])]
        fts: Option<String>,
        /// A query vector as a JSON array, e.g. '[0.1, 0.2, 0.3]'.
        #[arg(long, conflicts_with = "vector_file")]
        vector: Option<String>,
        /// A file holding the query vector as a JSON array.
        #[arg(long)]
        vector_file: Option<PathBuf>,
        /// Vector search: candidate list size of the graph searches.
        #[arg(long)]
        ef: Option<usize>,
        /// Vector search: scan every row exactly (brute force) instead of walking the graphs.
        #[arg(long)]
        exact: bool,
        /// How many rows to return.
        #[arg(short, long, default_value_t = 10)]
        k: usize,
        /// Rows to skip before the k returned (a page: offset + k at most 10,000).
        #[arg(long, default_value_t = 0)]
        offset: usize,
        /// A SQL predicate over payload columns, applied before the top k.
        #[arg(long)]
        filter: Option<String>,
        /// Require every term (AND) instead of any term (OR) when no operator is written.
        #[arg(long)]
        and: bool,
        /// The columns to return after the key and the score or distance, comma-separated
        /// (the vector too, when named). Default: every column but the vector.
        #[arg(long, value_delimiter = ',')]
        columns: Option<Vec<String>>,
        /// Full-text search: only rows scoring at least this.
        #[arg(long, allow_negative_numbers = true)]
        min_score: Option<f32>,
        /// Vector search: only rows at most this far from the query vector (a radius; negative
        /// under the dot metric, whose distances are negated products).
        #[arg(long, allow_negative_numbers = true)]
        max_distance: Option<f32>,
        /// Hybrid search: how the two rankings are fused (default rrf).
        #[arg(long, value_enum)]
        fusion: Option<FusionArg>,
        /// Hybrid search with reciprocal rank fusion: the rank constant (default 60).
        #[arg(long)]
        rrf_k: Option<f32>,
        /// Hybrid search with weighted fusion: the weights of the text and the vector parts'
        /// normalised scores, e.g. 0.3,0.7 (default 0.5,0.5).
        #[arg(long, value_delimiter = ',', num_args = 1)]
        weights: Option<Vec<f32>>,
        /// Hybrid search: the rows each part contributes (default 100; at least offset + k).
        #[arg(long)]
        candidates: Option<usize>,
        /// Stop the search after this many milliseconds, with an error saying so (with
        /// --count, the count and the search each have this long).
        #[arg(long)]
        timeout_ms: Option<u64>,
        /// A sharded index: run each shard's part of the search on these workers
        /// (`lsmsearch worker`), HOST:PORT,... (by default this process reads every shard).
        /// The results are the same.
        #[arg(long, value_delimiter = ',', value_name = "HOST:PORT,...")]
        workers: Option<Vec<String>>,
        /// Full-text search: also print the exact number of live rows that match (and pass
        /// the filter and --min-score), counted on the search's snapshot: a line before the
        /// table, or a first JSON line {"count": N} with --json.
        #[arg(long)]
        count: bool,
        /// Full-text search: a snippet of each matched text column, the matched terms marked
        /// (columns _highlight_<name>).
        #[arg(long)]
        highlight: bool,
        /// With --highlight: the text columns to highlight, comma-separated (default all).
        #[arg(long, value_delimiter = ',', requires = "highlight")]
        highlight_columns: Option<Vec<String>>,
        /// With --highlight: the longest snippet, in characters (default 150).
        #[arg(long, requires = "highlight")]
        highlight_chars: Option<usize>,
        /// With --highlight: the markers around a matched term, e.g. '[[,]]' (default
        /// <b>,</b>).
        #[arg(long, value_delimiter = ',', num_args = 1, requires = "highlight")]
        highlight_tags: Option<Vec<String>>,
        /// Full-text search: each row's score explained (column _explanation, JSON).
        #[arg(long)]
        explain: bool,
    },
    /// Print the physical plan of a full-text search.
    Explain {
        #[command(flatten)]
        open: Open,
        /// The query.
        #[arg(long)]
        fts: String,
        /// How many rows the plan returns.
        #[arg(short, long, default_value_t = 10)]
        k: usize,
        /// A SQL predicate over payload columns.
        #[arg(long)]
        filter: Option<String>,
        /// A sharded index: show the distributed plan of the search's second phase on these
        /// workers (HOST:PORT,...): its stages, their tasks and the workers they go to.
        #[arg(long, value_delimiter = ',', value_name = "HOST:PORT,...")]
        workers: Option<Vec<String>>,
    },
    /// Run one SQL statement over the index, registered as the table `docs` (or --table),
    /// with the search table functions fts(table, query, k), knn(table, vector, k) and
    /// hybrid(table, query, vector, k), e.g. "SELECT year, count(*) FROM fts('docs',
    /// 'shock wave', 1000) GROUP BY year". Prints a table, or JSON lines with --json.
    Sql {
        #[command(flatten)]
        open: Open,
        /// The statement.
        statement: String,
        /// The name the index has in the statement.
        #[arg(long, default_value = "docs")]
        table: String,
        /// A sharded index: run each shard's part of the search functions on these workers
        /// (`lsmsearch worker`), HOST:PORT,... (by default this process reads every shard).
        /// The table itself is then not scanned: query it with fts(), knn() or hybrid().
        #[arg(long, value_delimiter = ',', value_name = "HOST:PORT,...")]
        workers: Option<Vec<String>>,
    },
    /// Serve the shard tasks of distributed searches (`lsmsearch search --workers`) on
    /// HOST:PORT: shards are opened read-only from the location each task names. Prints
    /// `listening on ADDR` once it accepts connections (port 0 picks a free port).
    Worker {
        /// The address to listen on, e.g. 127.0.0.1:7070.
        #[arg(long)]
        listen: String,
        /// Settings of the shards' read-only handles, as JSON (`Settings` fields).
        #[arg(long, value_parser = settings_json, default_value = "{}")]
        settings: Settings,
    },
    /// Print generations, memtable rows, pending WAL objects and the writer epoch, and what a
    /// handle holds in memory once open (by kind, per row) and fetched to open.
    Stats {
        #[command(flatten)]
        open: Open,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
    /// Create an index in a local directory from generated data, append across several flushes,
    /// scan it and print its stats.
    Demo {
        /// Directory of the demo index (default: a new directory under the system temp dir).
        dir: Option<PathBuf>,
    },
}

#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Query latency and object-store round trips against the number of generations, on a
    /// local directory behind a store that adds per-request latency; prints a table and writes
    /// OUT/results.json and OUT/latency.png.
    Generations(lsmsearch::bench::Options),
    /// Writers and readers on one index at once: prints acknowledged rows/s, append and query
    /// latency, generations, memtable and unindexed rows and memory every interval, checks
    /// recall@10 and full-text results on snapshots, and writes OUT/results.json and
    /// OUT/stream.png.
    Stream(lsmsearch::bench::stream::StreamOptions),
    /// What a compaction's indexes cost built afresh against merged from its inputs' indexes:
    /// tantivy's segment merge against re-indexing the text, continuing the largest input's
    /// graph against a fresh graph (with the recall@10 of each).
    Merge(lsmsearch::bench::merge::MergeOptions),
    /// A new process opening an existing index read-only behind a store that adds
    /// per-request latency: round trips and bytes of its first queries and of cold ones, then
    /// many mixed queries on one handle with what it holds in memory and its peak RSS;
    /// writes OUT/results.json.
    Reader(lsmsearch::bench::reader::ReaderOptions),
    /// Warm latency (p50, p95) of full-text, vector and hybrid searches of 10 rows on an
    /// existing index, for the queries (`text`, `emb`) of a Parquet file such as the one
    /// `bench corpus` writes.
    Queries(lsmsearch::bench::queries::QueriesOptions),
    /// One index against the same corpus rows in N shards: warm p50 of full-text and vector
    /// searches and queries/s, in this process and through 1, 2, ... worker processes over
    /// loopback, with peak RSS.
    Shards(bench_shards::ShardsOptions),
    /// Write the benchmark corpus (Cranfield replicated, with vectors) to OUT/docs.parquet and
    /// its queries to OUT/queries.parquet, for measuring other systems on the same data.
    Corpus {
        /// Documents to write.
        #[arg(long, default_value_t = 100_000)]
        docs: usize,
        /// Vector dimension.
        #[arg(long, default_value_t = 128)]
        dim: usize,
        /// Output directory.
        #[arg(long, default_value = "bench-out/corpus")]
        out: PathBuf,
        /// A Cranfield collection directory (default: the collection this binary carries,
        /// `tests/data/cranfield` of the repository).
        #[arg(long)]
        data: Option<PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let json = cli.json;
    match rt.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"error": e.message(), "kind": format!("{:?}", e.kind())})
                );
            } else {
                eprintln!("error: {e}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> lsmsearch::Result<()> {
    let json = cli.json;
    match cli.command {
        Command::Init {
            open,
            schema,
            shards,
        } => init(&open, &schema, shards, json).await,
        Command::Ingest {
            open,
            file,
            batch_size,
            flush_every,
            durability,
        } => {
            let durability: Durability = durability.parse()?;
            ingest_file(&open, &file, batch_size, flush_every, durability, json).await
        }
        Command::Delete { open, keys } => delete(&open, &keys, json).await,
        Command::Flush { open } => flush(&open, json).await,
        Command::Compact { open } => compact(&open, json).await,
        Command::Scan { open, filter } => scan(&open, filter).await,
        Command::Search {
            open,
            fts,
            vector,
            vector_file,
            ef,
            exact,
            k,
            offset,
            filter,
            and,
            columns,
            min_score,
            max_distance,
            fusion,
            rrf_k,
            weights,
            candidates,
            timeout_ms,
            workers,
            count,
            highlight,
            highlight_columns,
            highlight_chars,
            highlight_tags,
            explain,
        } => {
            let vector = match (vector, vector_file) {
                (Some(v), _) => Some(parse_vector(&v)?),
                (None, Some(f)) => {
                    let text = std::fs::read_to_string(&f).map_err(|e| {
                        Error::invalid(format!("cannot read '{}': {e}", f.display()))
                    })?;
                    Some(parse_vector(&text)?)
                }
                (None, None) => None,
            };
            let query = match (fts, vector) {
                (Some(fts), None) => Query::Fts(fts),
                (None, Some(v)) => Query::Vector(v),
                (Some(fts), Some(v)) => Query::Hybrid(fts, v),
                (None, None) => {
                    return Err(Error::invalid("give --fts, --vector or --vector-file"))
                }
            };
            let hybrid_only =
                fusion.is_some() || rrf_k.is_some() || weights.is_some() || candidates.is_some();
            if hybrid_only && !matches!(query, Query::Hybrid(..)) {
                return Err(Error::invalid(
                    "--fusion, --rrf-k, --weights and --candidates apply to a hybrid search (--fts with --vector or --vector-file)",
                ));
            }
            if min_score.is_some() && !matches!(query, Query::Fts(..)) {
                return Err(Error::invalid(
                    "--min-score applies to a full-text search (--fts alone)",
                ));
            }
            if (highlight || explain) && !matches!(query, Query::Fts(..)) {
                return Err(Error::invalid(
                    "--highlight and --explain apply to a full-text search (--fts alone)",
                ));
            }
            if highlight_tags.as_ref().is_some_and(|t| t.len() != 2) {
                return Err(Error::invalid(
                    "--highlight-tags takes two markers: before,after",
                ));
            }
            if count && !matches!(query, Query::Fts(..)) {
                return Err(Error::invalid(
                    "--count applies to a full-text search (--fts alone)",
                ));
            }
            if max_distance.is_some() && !matches!(query, Query::Vector(..)) {
                return Err(Error::invalid(
                    "--max-distance applies to a vector search (--vector or --vector-file alone)",
                ));
            }
            let fusion = match (fusion.unwrap_or(FusionArg::Rrf), weights.as_deref()) {
                (FusionArg::Rrf, None) => Fusion::Rrf {
                    k: rrf_k.unwrap_or(60.0),
                },
                (FusionArg::Rrf, Some(_)) => {
                    return Err(Error::invalid("--weights applies to --fusion weighted"))
                }
                (FusionArg::Weighted, _) if rrf_k.is_some() => {
                    return Err(Error::invalid("--rrf-k applies to --fusion rrf"))
                }
                (FusionArg::Weighted, None) => Fusion::Weighted {
                    text: 0.5,
                    vector: 0.5,
                },
                (FusionArg::Weighted, Some([text, vector])) => Fusion::Weighted {
                    text: *text,
                    vector: *vector,
                },
                (FusionArg::Weighted, Some(w)) => {
                    return Err(Error::invalid(format!(
                        "--weights takes two numbers (text, vector), not {}",
                        w.len()
                    )))
                }
            };
            let request = SearchRequest {
                k,
                offset,
                filter,
                conjunction: if and {
                    Conjunction::And
                } else {
                    Conjunction::Or
                },
                ef,
                exact,
                columns,
                min_score,
                max_distance,
                fusion,
                candidates,
                timeout: timeout_ms.map(std::time::Duration::from_millis),
                count,
                highlight: highlight.then(|| lsmsearch::Highlight {
                    columns: highlight_columns,
                    max_chars: highlight_chars.unwrap_or(150),
                    pre_tag: highlight_tags
                        .as_ref()
                        .map_or("<b>".into(), |t| t[0].clone()),
                    post_tag: highlight_tags
                        .as_ref()
                        .map_or("</b>".into(), |t| t[1].clone()),
                }),
                explain,
            };
            match workers {
                Some(w) => distributed_search(&open, &w, query, request, json).await,
                None => search(&open, query, request, json).await,
            }
        }
        Command::Worker { listen, settings } => worker(&listen, settings, json).await,
        Command::Explain {
            open,
            fts,
            k,
            filter,
            workers,
        } => explain(&open, &fts, k, filter, workers.as_deref(), json).await,
        Command::Sql {
            open,
            statement,
            table,
            workers,
        } => sql(&open, &statement, &table, workers.as_deref(), json).await,
        Command::Stats { open } => {
            let index = Reader::open(&open.location, open.settings).await?;
            let stats = index.stats();
            let held = index.cache_stats().await;
            index.close().await?;
            for (i, (s, c)) in stats.iter().zip(&held).enumerate() {
                if json {
                    // The index's statistics, with what the handle held once open.
                    let mut v = serde_json::to_value(s).unwrap_or_default();
                    if let Some(o) = v.as_object_mut() {
                        o.insert("cache".into(), serde_json::to_value(c).unwrap_or_default());
                    }
                    println!("{v}");
                    continue;
                }
                if stats.len() > 1 {
                    println!("{}shard {i}", if i > 0 { "\n" } else { "" });
                }
                print_stats(s, false);
                print_held(s, c);
            }
            Ok(())
        }
        Command::Demo { dir } => demo::run(dir, json).await,
        Command::Bench { which } => match which {
            BenchCommand::Corpus {
                docs,
                dim,
                out,
                data,
            } => bench_corpus(docs, dim, &out, data.as_deref(), json),
            BenchCommand::Merge(opts) => {
                let report = lsmsearch::bench::merge::run(&opts)?;
                if json {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                } else {
                    print!("{}", report.table());
                }
                Ok(())
            }
            BenchCommand::Shards(opts) => {
                let report = bench_shards::run(&opts, !json).await?;
                match json {
                    true => println!("{}", serde_json::to_string(&report).unwrap_or_default()),
                    false => print!("{}", report.table()),
                }
                Ok(())
            }
            BenchCommand::Queries(opts) => {
                let report = lsmsearch::bench::queries::run(&opts).await?;
                match json {
                    true => println!("{}", serde_json::to_string(&report).unwrap_or_default()),
                    false => print!("{}", report.table()),
                }
                Ok(())
            }
            BenchCommand::Reader(opts) => {
                let opts = lsmsearch::bench::reader::ReaderOptions {
                    print: !json,
                    ..opts
                };
                let report = lsmsearch::bench::reader::run(&opts).await?;
                if json {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                }
                Ok(())
            }
            BenchCommand::Stream(opts) => {
                let opts = lsmsearch::bench::stream::StreamOptions {
                    print: !json,
                    ..opts
                };
                let report = lsmsearch::bench::stream::run(&opts).await?;
                if json {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                }
                Ok(())
            }
            BenchCommand::Generations(opts) => {
                let opts = lsmsearch::bench::Options {
                    progress: !json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
                    print: !json,
                    ..opts
                };
                bench_generations(&opts, json).await
            }
        },
    }
}

/// `lsmsearch init`.
async fn init(
    open: &Open,
    schema: &Path,
    shards: Option<u32>,
    json: bool,
) -> lsmsearch::Result<()> {
    let text = std::fs::read_to_string(schema).map_err(|e| {
        Error::invalid(format!(
            "cannot read schema file '{}': {e}",
            schema.display()
        ))
    })?;
    let schema = IndexSchema::from_json(&text)?;
    let loc = Location::parse(&open.location)?;
    match shards {
        Some(n) => {
            let index =
                lsmsearch::shard::ShardedIndex::create(loc, schema, n, open.settings.clone())
                    .await?;
            index.close().await?;
        }
        None => {
            let index = Index::create(loc, schema, open.settings.clone()).await?;
            index.close().await?;
        }
    }
    match (json, shards) {
        (true, _) => println!(
            "{}",
            serde_json::json!({"created": open.location, "shards": shards})
        ),
        (false, None) => println!("created index at {}", open.location),
        (false, Some(n)) => println!("created an index of {n} shards at {}", open.location),
    }
    Ok(())
}

/// `lsmsearch ingest`.
async fn ingest_file(
    open: &Open,
    file: &Path,
    batch_size: usize,
    flush_every: Option<usize>,
    durability: Durability,
    json: bool,
) -> lsmsearch::Result<()> {
    // Check the file (its type, its first batch against the schema) before opening the index
    // as its writer, which claims an epoch: a bad file leaves the index untouched.
    if batch_size == 0 {
        return Err(Error::invalid("--batch-size must be at least 1"));
    }
    let schema = handles::schema(&Location::parse(&open.location)?).await?;
    let mut reader = lsmsearch::ingest::read_rows(file, &schema.arrow_schema(), batch_size)?;
    let first = reader.next().transpose()?;
    if let Some(b) = first.as_ref().filter(|b| b.num_rows() > 0) {
        schema
            .validate_batch(b)
            .map_err(|e| e.context(format!("rows 0..{} of '{}'", b.num_rows(), file.display())))?;
    }
    let reader: lsmsearch::ingest::RowReader = Box::new(first.map(Ok).into_iter().chain(reader));
    let index = Writer::open(&open.location, open.settings.clone()).await?;
    let r = ingest(&index, file, reader, flush_every, durability, json).await;
    index.close().await?;
    let n = r?;
    if !json {
        println!("appended {n} rows to {}", open.location);
    }
    Ok(())
}

/// `lsmsearch delete`.
async fn delete(open: &Open, keys: &[String], json: bool) -> lsmsearch::Result<()> {
    // Parse the keys before opening the index as its writer (which claims an epoch).
    let kt = handles::schema(&Location::parse(&open.location)?)
        .await?
        .primary_key_type;
    let keys = keys
        .iter()
        .map(|k| Key::parse(k, kt))
        .collect::<lsmsearch::Result<Vec<_>>>()?;
    if keys.is_empty() {
        return Err(Error::invalid("no keys to delete"));
    }
    let index = Writer::open(&open.location, open.settings.clone()).await?;
    let r = index.delete(&keys).await;
    index.close().await?;
    let r = r?;
    if json {
        println!(
            "{}",
            serde_json::json!({"deleted": r.rows, "last_seq": r.last_seq})
        );
    } else {
        println!("deleted {} keys", r.rows);
    }
    Ok(())
}

/// `lsmsearch flush`.
async fn flush(open: &Open, json: bool) -> lsmsearch::Result<()> {
    let index = Writer::open(&open.location, open.settings.clone()).await?;
    let r = index.flush().await;
    let stats = index.stats();
    index.close().await?;
    r?;
    for (i, s) in stats.iter().enumerate() {
        let shard = shard_prefix(i, stats.len());
        if json {
            let mut v = serde_json::json!({"generations": s.generations.len(), "manifest_version": s.manifest_version});
            if stats.len() > 1 {
                v["shard"] = i.into();
            }
            println!("{v}");
        } else {
            println!(
                "{shard}flushed: {} generations, manifest version {}",
                s.generations.len(),
                s.manifest_version
            );
        }
    }
    Ok(())
}

/// What a line about shard `i` of `n` starts with: nothing for an index that is not
/// sharded.
fn shard_prefix(i: usize, n: usize) -> String {
    match n {
        1 => String::new(),
        _ => format!("shard {i}: "),
    }
}

/// `lsmsearch compact`.
async fn compact(open: &Open, json: bool) -> lsmsearch::Result<()> {
    let index = Writer::open(&open.location, open.settings.clone()).await?;
    let r = match index.flush().await {
        Ok(()) => index.compact().await,
        Err(e) => Err(e),
    };
    let stats = index.stats();
    index.close().await?;
    let reports = r?;
    let n = stats.len();
    for ((i, report), stats) in reports.into_iter().zip(&stats) {
        let shard = shard_prefix(i, n);
        if json {
            let mut v = serde_json::json!({"compaction": report, "generations": stats.generations.len(), "manifest_version": stats.manifest_version});
            if n > 1 {
                v["shard"] = i.into();
            }
            println!("{v}");
            continue;
        }
        match report {
            Some(r) => println!(
                "{shard}compacted {} generations ({} rows, {} bytes) into {} ({} rows, {} bytes) \
                 in {} ms; manifest version {}",
                r.generations_before,
                r.rows_in,
                r.bytes_in,
                r.generations_after,
                r.rows_out,
                r.bytes_out,
                r.millis,
                stats.manifest_version
            ),
            None => println!(
                "{shard}nothing to compact: {} generations, manifest version {}",
                stats.generations.len(),
                stats.manifest_version
            ),
        }
    }
    Ok(())
}

/// `lsmsearch scan`.
async fn scan(open: &Open, filter: Option<String>) -> lsmsearch::Result<()> {
    let index = handles::one_read_only(&open.location, open.settings.clone(), "scan").await?;
    // Printed as the scan goes: one batch in memory at a time.
    let mut batches = index.scan_stream(ScanOptions { filter }).await?;
    while let Some(batch) = futures::StreamExt::next(&mut batches).await {
        if !write_json_lines(&[batch?])? {
            break;
        }
    }
    drop(batches);
    index.close().await
}

/// What `lsmsearch search` looks for.
enum Query {
    Fts(String),
    Vector(Vec<f32>),
    Hybrid(String, Vec<f32>),
}

/// How `lsmsearch search --fts Q --vector V` fuses the two rankings.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum FusionArg {
    /// Reciprocal rank fusion.
    Rrf,
    /// A weighted sum of the parts' normalised scores.
    Weighted,
}

/// The options of `lsmsearch search`, whichever kind of search it is.
struct SearchRequest {
    k: usize,
    offset: usize,
    filter: Option<String>,
    conjunction: Conjunction,
    ef: Option<usize>,
    exact: bool,
    columns: Option<Vec<String>>,
    min_score: Option<f32>,
    max_distance: Option<f32>,
    fusion: Fusion,
    candidates: Option<usize>,
    timeout: Option<std::time::Duration>,
    count: bool,
    highlight: Option<lsmsearch::Highlight>,
    explain: bool,
}

impl SearchRequest {
    /// The options of a full-text search.
    fn fts_options(self) -> SearchOptions {
        SearchOptions {
            k: self.k,
            filter: self.filter,
            conjunction: self.conjunction,
            min_score: self.min_score,
            offset: self.offset,
            columns: self.columns,
            timeout: self.timeout,
            highlight: self.highlight,
            explain: self.explain,
        }
    }

    /// The options of a vector search.
    fn vector_options(self) -> VectorSearchOptions {
        VectorSearchOptions {
            k: self.k,
            filter: self.filter,
            ef: self.ef,
            exact: self.exact,
            max_distance: self.max_distance,
            offset: self.offset,
            columns: self.columns,
            timeout: self.timeout,
        }
    }

    /// The options of a hybrid search.
    fn hybrid_options(self) -> HybridSearchOptions {
        HybridSearchOptions {
            k: self.k,
            offset: self.offset,
            filter: self.filter,
            columns: self.columns,
            fusion: self.fusion,
            candidates: self.candidates,
            conjunction: self.conjunction,
            ef: self.ef,
            exact: self.exact,
            timeout: self.timeout,
        }
    }
}

/// `--count`'s line: the number of live rows matching, when counted.
fn print_count(matched: Option<u64>, json: bool) {
    match (matched, json) {
        (Some(n), true) => println!("{}", serde_json::json!({ "count": n })),
        (Some(1), false) => println!("1 live row matches"),
        (Some(n), false) => println!("{n} live rows match"),
        (None, _) => {}
    }
}

/// `lsmsearch search`.
async fn search(open: &Open, query: Query, r: SearchRequest, json: bool) -> lsmsearch::Result<()> {
    let index = Reader::open(&open.location, open.settings.clone()).await?;
    let mut matched = None;
    let rows = match query {
        Query::Fts(q) => {
            let count = r.count;
            let opts = r.fts_options();
            // With --count, the count and the rows of one snapshot.
            index
                .search_fts(&q, &opts, count)
                .await
                .map(|(rows, count)| {
                    matched = count;
                    rows
                })
        }
        Query::Vector(v) => {
            let opts = r.vector_options();
            index.search_vector(&v, &opts).await
        }
        Query::Hybrid(q, v) => {
            let opts = r.hybrid_options();
            index.search_hybrid(&q, &v, &opts).await
        }
    };
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => {
            index.close().await?;
            return Err(e);
        }
    };
    // The block cache's disk tier (when there is one) is written for the next process.
    index.close().await?;
    print_count(matched, json);
    print_rows(&rows, json)
}

/// `lsmsearch search --workers`: each shard's part of the search on a worker.
async fn distributed_search(
    open: &Open,
    workers: &[String],
    query: Query,
    r: SearchRequest,
    json: bool,
) -> lsmsearch::Result<()> {
    let index =
        lsmsearch::shard::distributed::DistributedIndex::open(&open.location, workers).await?;
    let (rows, matched) = match query {
        Query::Fts(q) => {
            let count = r.count;
            let opts = r.fts_options();
            // With --count, the count and the rows of one point in time of each shard.
            match count {
                true => {
                    let (rows, n) = index.search_and_count_fts(&q, &opts).await?;
                    (rows, Some(n))
                }
                false => (index.search_fts(&q, &opts).await?, None),
            }
        }
        Query::Vector(v) => {
            let opts = r.vector_options();
            (index.search_vector(&v, &opts).await?, None)
        }
        Query::Hybrid(q, v) => {
            let opts = r.hybrid_options();
            (index.search_hybrid(&q, &v, &opts).await?, None)
        }
    };
    print_count(matched, json);
    print_rows(&rows, json)
}

/// `lsmsearch worker`.
async fn worker(listen: &str, settings: Settings, json: bool) -> lsmsearch::Result<()> {
    // Before it says it listens: a worker that then exits would have misled its caller.
    settings.validate()?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Error::invalid(format!("cannot listen on {listen}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::invalid(format!("cannot listen on {listen}: {e}")))?;
    match json {
        true => println!("{}", serde_json::json!({ "listening": addr.to_string() })),
        false => println!("listening on {addr}"),
    }
    let _ = std::io::stdout().flush();
    lsmsearch::shard::distributed::serve(listener, settings).await
}

/// Characters of a text value a table shows (`--json` prints them whole).
const SHOWN_CHARS: usize = 80;

/// `batch` with each string longer than `chars` characters cut to its first `chars` and an
/// ellipsis: a table of search results stays readable with the text columns in it.
fn shortened(batch: &RecordBatch, chars: usize) -> lsmsearch::Result<RecordBatch> {
    use arrow::array::{AsArray, StringArray};
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8 => {
                let s = c.as_string::<i32>();
                Arc::new(StringArray::from_iter(s.iter().map(|v| {
                    v.map(|v| match v.char_indices().nth(chars) {
                        Some((cut, _)) => format!("{}…", &v[..cut]),
                        None => v.to_string(),
                    })
                }))) as ArrayRef
            }
            _ => c.clone(),
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// `lsmsearch explain`.
/// `lsmsearch sql`.
async fn sql(
    open: &Open,
    statement: &str,
    table: &str,
    workers: Option<&[String]>,
    json: bool,
) -> lsmsearch::Result<()> {
    let ctx = datafusion::prelude::SessionContext::new();
    let rows = match workers {
        Some(w) => {
            let index = std::sync::Arc::new(
                lsmsearch::shard::distributed::DistributedIndex::open(&open.location, w).await?,
            );
            lsmsearch::sql::register_distributed(&ctx, table, index)?;
            lsmsearch::sql::query(&ctx, statement).await
        }
        None => match Reader::open(&open.location, open.settings.clone()).await? {
            Reader::One(index) => {
                let index = std::sync::Arc::new(*index);
                lsmsearch::sql::register(&ctx, table, index.clone())?;
                let rows = lsmsearch::sql::query(&ctx, statement).await;
                drop(ctx);
                index.close().await?;
                rows
            }
            Reader::Sharded(index) => {
                let index = std::sync::Arc::new(*index);
                lsmsearch::sql::register_sharded(&ctx, table, index.clone())?;
                let rows = lsmsearch::sql::query(&ctx, statement).await;
                drop(ctx);
                index.close().await?;
                rows
            }
        },
    };
    let rows = rows?;
    // A plan is shown whole.
    let explained = rows
        .first()
        .is_some_and(|b| b.schema().column_with_name("plan").is_some());
    if explained && !json {
        println!("{}", arrow::util::pretty::pretty_format_batches(&rows)?);
        return Ok(());
    }
    print_rows(&rows, json)
}

/// Rows as JSON lines, or as a table with long texts cut.
fn print_rows(rows: &[arrow::array::RecordBatch], json: bool) -> lsmsearch::Result<()> {
    if json {
        print_json_lines(rows)
    } else {
        let shown = rows
            .iter()
            .map(|b| shortened(b, SHOWN_CHARS))
            .collect::<lsmsearch::Result<Vec<_>>>()?;
        println!("{}", arrow::util::pretty::pretty_format_batches(&shown)?);
        Ok(())
    }
}

async fn explain(
    open: &Open,
    fts: &str,
    k: usize,
    filter: Option<String>,
    workers: Option<&[String]>,
    json: bool,
) -> lsmsearch::Result<()> {
    let opts = SearchOptions {
        k,
        filter,
        ..Default::default()
    };
    let text = match workers {
        Some(w) => {
            lsmsearch::shard::distributed::DistributedIndex::open(&open.location, w)
                .await?
                .explain_fts(fts, &opts)
                .await?
        }
        None => {
            let index =
                handles::one_read_only(&open.location, open.settings.clone(), "explain").await?;
            let plan = index.plan_fts(fts, &opts).await;
            index.close().await?;
            datafusion::physical_plan::displayable(plan?.as_ref())
                .indent(true)
                .to_string()
        }
    };
    if json {
        println!("{}", serde_json::json!({"plan": text}));
    } else {
        print!("{text}");
    }
    Ok(())
}

/// `lsmsearch bench corpus`.
fn bench_corpus(
    docs: usize,
    dim: usize,
    out: &Path,
    data: Option<&Path>,
    json: bool,
) -> lsmsearch::Result<()> {
    if dim == 0 {
        return Err(Error::invalid("--dim must be at least 1"));
    }
    lsmsearch::bench::corpus::Corpus::load(data)?.export(docs, dim, out)?;
    if !json {
        println!(
            "wrote {docs} rows to {}/docs.parquet and the queries to {}/queries.parquet",
            out.display(),
            out.display()
        );
    }
    Ok(())
}

/// `lsmsearch bench generations`.
async fn bench_generations(opts: &lsmsearch::bench::Options, json: bool) -> lsmsearch::Result<()> {
    let report = lsmsearch::bench::run(opts).await?;
    if json {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    }
    Ok(())
}

/// Append the file's rows in batches; returns the number of rows appended.
async fn ingest(
    index: &Writer,
    file: &Path,
    reader: lsmsearch::ingest::RowReader,
    flush_every: Option<usize>,
    durability: Durability,
    json: bool,
) -> lsmsearch::Result<usize> {
    let bar = (!json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {human_pos} rows appended ({per_sec}) {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        b
    });
    let mut acked = 0usize;
    let mut since_flush = 0usize;
    let opts = WriteOptions::with_durability(durability);
    let mut stdout = std::io::stdout().lock();
    for batch in reader {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        index.append_with(&batch, opts).await.map_err(|e| {
            e.context(format!(
                "rows {}..{} of '{}'",
                acked,
                acked + batch.num_rows(),
                file.display()
            ))
        })?;
        acked += batch.num_rows();
        since_flush += batch.num_rows();
        if json {
            let last = batch.column(0);
            let key = json_value(last.as_ref(), last.len() - 1);
            let _ = writeln!(
                stdout,
                "{}",
                serde_json::json!({"acked_rows": acked, "last_key": key})
            );
        }
        if let Some(b) = &bar {
            b.set_position(acked as u64);
        }
        if let Some(n) = flush_every {
            if since_flush >= n {
                index.flush().await?;
                since_flush = 0;
            }
        }
    }
    if let Some(b) = bar {
        b.finish();
    }
    Ok(acked)
}

/// A query vector from a JSON array of numbers.
fn parse_vector(text: &str) -> lsmsearch::Result<Vec<f32>> {
    serde_json::from_str(text.trim())
        .map_err(|e| Error::invalid(format!("query vector is not a JSON array of numbers: {e}")))
}

/// A JSON value for one cell of a key column.
fn json_value(a: &dyn Array, row: usize) -> serde_json::Value {
    match Key::from_array(a, row) {
        Some(Key::Str(s)) => serde_json::Value::String(s),
        Some(Key::I64(v)) => v.into(),
        Some(Key::U64(v)) => v.into(),
        None => serde_json::Value::Null,
    }
}

/// Print batches as JSON lines on stdout (vectors as arrays).
fn print_json_lines(rows: &[RecordBatch]) -> lsmsearch::Result<()> {
    write_json_lines(rows).map(drop)
}

/// Print `rows` as JSON lines; `false` when the reader of the output has gone (a closed pipe).
fn write_json_lines(rows: &[RecordBatch]) -> lsmsearch::Result<bool> {
    let mut out = std::io::stdout().lock();
    let mut w = arrow::json::LineDelimitedWriter::new(&mut out);
    let broken_pipe = |e: &arrow::error::ArrowError| matches!(e, arrow::error::ArrowError::IoError(_, io) if io.kind() == std::io::ErrorKind::BrokenPipe);
    for b in rows {
        match w.write(&lists_for_json(b)?) {
            Err(e) if broken_pipe(&e) => return Ok(false),
            r => r?,
        }
    }
    match w.finish() {
        Err(e) if broken_pipe(&e) => Ok(false),
        r => r.map(|()| true).map_err(Into::into),
    }
}

/// The JSON writer prints `FixedSizeList` poorly in some versions: turn vectors into lists.
fn lists_for_json(b: &RecordBatch) -> lsmsearch::Result<RecordBatch> {
    let mut fields = Vec::new();
    let mut cols: Vec<ArrayRef> = Vec::new();
    for (f, c) in b.schema().fields().iter().zip(b.columns()) {
        if let DataType::FixedSizeList(inner, _) = f.data_type() {
            let t = DataType::List(inner.clone());
            cols.push(arrow::compute::cast(c, &t)?);
            fields.push(Field::new(f.name(), t, f.is_nullable()));
        } else {
            cols.push(c.clone());
            fields.push(f.as_ref().clone());
        }
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
}

/// What a read-only handle holds in memory once open (the hot parts of its generations, by
/// kind, and per row), and what its opening fetched through the block cache.
fn print_held(s: &IndexStats, c: &lsmsearch::CacheStats) {
    let held = c.resident.total();
    // Over the rows of the generations held (a budget below the hot parts holds fewer than
    // the index has), every stored version and tombstone counted.
    let rows = c.rows;
    println!(
        "held in memory:      {} bytes in {} of {} generations (budget {}), {:.1} B per \
         stored row",
        held,
        c.generations,
        s.generations.len(),
        c.budget,
        held as f64 / rows.max(1) as f64
    );
    println!("  by kind, B/row:    {}", c.resident.per_row(rows));
    println!(
        "block cache:         {} bytes in memory; {} blocks read: {} memory hits, {} disk hits, \
         {} fetched ({} bytes)",
        c.block_bytes,
        c.blocks_read,
        c.block_memory_hits,
        c.block_disk_hits,
        c.blocks_fetched,
        c.block_bytes_fetched
    );
}

pub(crate) fn print_stats(s: &IndexStats, json: bool) {
    if json {
        println!("{}", serde_json::to_string(s).unwrap_or_default());
        return;
    }
    println!("location:            {}", s.location);
    println!("writer epoch:        {}", s.epoch);
    println!("manifest version:    {}", s.manifest_version);
    println!("last sequence:       {}", s.last_seq);
    println!("memtable rows:       {}", s.memtable_rows);
    if s.frozen_memtables > 0 {
        println!(
            "frozen memtables:    {} ({} rows)",
            s.frozen_memtables, s.frozen_rows
        );
    }
    println!("unindexed rows:      {}", s.unindexed_rows);
    println!("WAL objects pending: {}", s.wal_objects_pending);
    if s.last_flush_ms > 0 {
        println!("last flush:          {} ms", s.last_flush_ms);
    }
    if s.append_delay_total_ms > 0.0 {
        println!(
            "append delay:        {:.1} ms last, {:.0} ms in total",
            s.append_delay_ms, s.append_delay_total_ms
        );
    }
    println!("generations:         {}", s.generations.len());
    if s.compactions > 0 || s.compaction_debt_rows > 0 {
        println!(
            "compaction:          {} done, last {} ms; {} rows due; {} bytes reclaimable",
            s.compactions, s.last_compaction_ms, s.compaction_debt_rows, s.bytes_reclaimable
        );
    }
    if let Some(e) = &s.compaction_error {
        println!("compaction error:    {e}");
    }
    if !s.generations.is_empty() {
        println!(
            "  {:>6} {:>10} {:>10} {:>12} {:>12}",
            "id", "rows", "deleted", "bytes", "max seq"
        );
        for g in &s.generations {
            println!(
                "  {:>6} {:>10} {:>10} {:>12} {:>12}",
                g.id, g.rows, g.tombstones, g.bytes, g.max_seq
            );
        }
    }
}
