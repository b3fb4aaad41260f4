//! The benchmark corpus: Cranfield documents replicated with variations to any size, with a
//! deterministic 128-d (or any dimension) embedding per document and per query.
//!
//! Copy `c` of document `d` (row `i = c * 1400 + d`) has `d`'s words rotated by `c` and one
//! word dropped, so copies differ in length and term statistics. Its embedding is a hashed bag
//! of words (every distinct word maps to a fixed pseudo-random unit direction; a text's vector
//! is the normalised sum of its words' directions) plus a little per-row noise, so nearest
//! neighbours are texts sharing words, as with a real text embedding.

use crate::{Error, IndexSchema, Result};
use arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Cranfield text, ready to be replicated.
#[derive(Debug, Clone)]
pub struct Corpus {
    titles: Vec<String>,
    texts: Vec<Vec<String>>,
    queries: Vec<String>,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn unit(seed: u64, dim: usize) -> Vec<f32> {
    let mut s = seed;
    let v: Vec<f32> = (0..dim)
        .map(|_| (splitmix(&mut s) >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect();
    normalised(v)
}

fn normalised(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
    v
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// Turns texts into vectors (see the module documentation).
#[derive(Debug, Default)]
pub struct Embedder {
    dim: usize,
    directions: HashMap<String, Vec<f32>>,
}

impl Embedder {
    /// An embedder of `dim` dimensions.
    pub fn new(dim: usize) -> Self {
        Embedder {
            dim,
            directions: HashMap::new(),
        }
    }

    /// The vector of `text`, with `noise` (0 for none) of per-`salt` jitter.
    pub fn embed(&mut self, text: &str, salt: u64, noise: f32) -> Vec<f32> {
        let dim = self.dim;
        let mut v = vec![0f32; dim];
        for w in words(text) {
            let d = self
                .directions
                .entry(w)
                .or_insert_with_key(|w| unit(xxhash_rust::xxh3::xxh3_64(w.as_bytes()), dim));
            v.iter_mut().zip(d.iter()).for_each(|(a, b)| *a += b);
        }
        let v = normalised(v);
        if noise == 0.0 {
            return v;
        }
        Self::jitter(&v, salt, noise)
    }

    /// `base` (a text's vector, [`Embedder::embed`] without noise) with the per-`salt` jitter
    /// `embed` adds: `embed(text, salt, noise) == jitter(&embed(text, 0, 0.0), salt, noise)`.
    pub fn jitter(base: &[f32], salt: u64, noise: f32) -> Vec<f32> {
        let jitter = unit(salt ^ 0x5151_5151, base.len());
        normalised(
            base.iter()
                .zip(jitter)
                .map(|(a, b)| a + noise * b)
                .collect(),
        )
    }
}

/// The Cranfield collection kept in the repository (`tests/data/cranfield`), carried in the
/// binary so the benchmarks run anywhere.
const BUNDLED_DOCS: &str = include_str!("../../tests/data/cranfield/docs.jsonl");
const BUNDLED_QUERIES: &str = include_str!("../../tests/data/cranfield/queries.jsonl");

impl Corpus {
    /// The Cranfield collection this build carries (`tests/data/cranfield`).
    pub fn bundled() -> Result<Corpus> {
        Self::parse(BUNDLED_DOCS, BUNDLED_QUERIES, "the bundled collection")
    }

    /// Read `docs.jsonl` and `queries.jsonl` of a Cranfield collection in `dir`.
    pub fn cranfield(dir: &Path) -> Result<Corpus> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).map_err(|e| {
                Error::invalid(format!(
                    "cannot read {}: {e} (the Cranfield collection)",
                    dir.join(name).display()
                ))
            })
        };
        Self::parse(
            &read("docs.jsonl")?,
            &read("queries.jsonl")?,
            &dir.display().to_string(),
        )
    }

    /// The collection or `dir` when given.
    pub fn load(dir: Option<&Path>) -> Result<Corpus> {
        match dir {
            Some(d) => Self::cranfield(d),
            None => Self::bundled(),
        }
    }

    fn parse(docs: &str, queries: &str, origin: &str) -> Result<Corpus> {
        let field = |l: &str, f: &str| -> Result<String> {
            let v: serde_json::Value = serde_json::from_str(l)
                .map_err(|e| Error::invalid(format!("Cranfield line '{l}': {e}")))?;
            Ok(v[f].as_str().unwrap_or("").to_string())
        };
        let (mut titles, mut texts) = (Vec::new(), Vec::new());
        for l in docs.lines() {
            titles.push(field(l, "title")?);
            texts.push(
                field(l, "text")?
                    .split_whitespace()
                    .map(str::to_string)
                    .collect(),
            );
        }
        let queries = queries
            .lines()
            .map(|l| {
                Ok(field(l, "text")?
                    .chars()
                    .map(|c| if c.is_alphanumeric() { c } else { ' ' })
                    .collect())
            })
            .collect::<Result<Vec<String>>>()?;
        if titles.is_empty() || queries.is_empty() {
            return Err(Error::invalid(format!(
                "no Cranfield documents or queries in {origin}"
            )));
        }
        Ok(Corpus {
            titles,
            texts,
            queries,
        })
    }

    /// The 225 Cranfield queries (punctuation replaced by spaces).
    pub fn queries(&self) -> &[String] {
        &self.queries
    }

    /// Documents in the original collection.
    pub fn originals(&self) -> usize {
        self.titles.len()
    }

    /// Title and text of row `i`.
    pub fn document(&self, i: usize) -> (&str, String) {
        let d = i % self.titles.len();
        let copy = i / self.titles.len();
        let words = &self.texts[d];
        let text = if words.is_empty() || copy == 0 {
            words.join(" ")
        } else {
            let r = copy % words.len();
            let mut w: Vec<&str> = words[r..]
                .iter()
                .chain(&words[..r])
                .map(String::as_str)
                .collect();
            w.remove(copy % w.len());
            w.join(" ")
        };
        (&self.titles[d], text)
    }

    /// The schema of [`Corpus::batch`]: `id` int64, `title` and `text`, an optional `emb`
    /// vector of `dim` (cosine), payload `year` (1950..2019) and `bucket` (`id mod 100`).
    pub fn schema(dim: Option<usize>) -> IndexSchema {
        let vector = dim.map_or(String::new(), |d| {
            format!(r#""vector": {{"column": "emb", "dim": {d}, "metric": "cosine"}},"#)
        });
        IndexSchema::from_json(&format!(
            r#"{{"primary_key": "id", "primary_key_type": "int64", "text": ["title", "text"], {vector}
                "payload": [{{"name": "year", "type": "int64"}}, {{"name": "bucket", "type": "int64"}}]}}"#
        ))
        .expect("the benchmark schema is valid")
    }

    /// Rows `[from, from + n)` as a batch of [`Corpus::schema`]`(dim)`.
    pub fn batch(
        &self,
        embedder: Option<&mut Embedder>,
        from: usize,
        n: usize,
    ) -> Result<RecordBatch> {
        let ids = from..from + n;
        let docs: Vec<(&str, String)> = ids.clone().map(|i| self.document(i)).collect();
        let schema = Corpus::schema(embedder.as_ref().map(|e| e.dim));
        let mut columns: Vec<arrow::array::ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(ids.clone().map(|i| i as i64))),
            Arc::new(StringArray::from_iter_values(docs.iter().map(|d| d.0))),
            Arc::new(StringArray::from_iter_values(
                docs.iter().map(|d| d.1.as_str()),
            )),
        ];
        if let Some(e) = embedder {
            let dim = e.dim;
            let mut values = Vec::with_capacity(n * dim);
            for (i, (title, text)) in ids.clone().zip(&docs) {
                values.extend(e.embed(&format!("{title} {text}"), i as u64, 0.2));
            }
            columns.push(Arc::new(FixedSizeListArray::try_new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                dim as i32,
                Arc::new(Float32Array::from(values)),
                None,
            )?));
        }
        columns.push(Arc::new(Int64Array::from_iter_values(
            ids.clone().map(|i| 1950 + (i % 70) as i64),
        )));
        columns.push(Arc::new(Int64Array::from_iter_values(
            ids.map(|i| (i % 100) as i64),
        )));
        Ok(RecordBatch::try_new(schema.arrow_schema(), columns)?)
    }
}

impl Corpus {
    /// Write rows `[0, docs)` of [`Corpus::batch`] (with `dim`-d vectors) to `dir/docs.parquet`
    /// and the queries with their vectors (`text`, `emb`) to `dir/queries.parquet`, so other
    /// systems can be measured on exactly the rows and queries this crate's benchmarks use.
    pub fn export(&self, docs: usize, dim: usize, dir: &Path) -> Result<()> {
        use parquet::arrow::ArrowWriter;
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::invalid(format!("cannot create {}: {e}", dir.display())))?;
        let file = |name: &str| {
            let p = dir.join(name);
            std::fs::File::create(&p)
                .map_err(|e| Error::invalid(format!("cannot create {}: {e}", p.display())))
        };
        let pq = |e: parquet::errors::ParquetError| Error::internal(format!("parquet: {e}"));
        let mut embedder = Embedder::new(dim);
        let schema = Corpus::schema(Some(dim)).arrow_schema();
        let mut w = ArrowWriter::try_new(file("docs.parquet")?, schema, None).map_err(pq)?;
        for from in (0..docs).step_by(10_000) {
            let n = 10_000.min(docs - from);
            w.write(&self.batch(Some(&mut embedder), from, n)?)
                .map_err(pq)?;
        }
        w.close().map_err(pq)?;
        let values: Vec<f32> = self
            .queries
            .iter()
            .flat_map(|q| embedder.embed(q, 0, 0.0))
            .collect();
        let queries = RecordBatch::try_from_iter(vec![
            (
                "text",
                Arc::new(StringArray::from_iter_values(self.queries.iter())) as _,
            ),
            (
                "emb",
                Arc::new(FixedSizeListArray::try_new(
                    Arc::new(Field::new("item", DataType::Float32, true)),
                    dim as i32,
                    Arc::new(Float32Array::from(values)),
                    None,
                )?) as _,
            ),
        ])?;
        let mut w =
            ArrowWriter::try_new(file("queries.parquet")?, queries.schema(), None).map_err(pq)?;
        w.write(&queries).map_err(pq)?;
        w.close().map_err(pq)?;
        Ok(())
    }
}
