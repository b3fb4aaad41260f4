//! Generations: immutable, flushed memtables, one bundle object each.
//!
//! A generation holds the newest version of every key of one memtable (tombstones included) and
//! the set of their 64-bit key hashes, so that newer sources can hide older rows cheaply, with
//! the search indexes built over them: a tantivy index (`text/*` sections and
//! `text_token_counts`) and a vector graph (`vector/graph`; `hnsw/*` in format version 1). The
//! container and every section's layout are in `docs/format.md`, "Generation bundle".

pub(crate) mod cache;

use crate::format::bundle::{Bundle, BundleWriter};
use crate::format::ipc::{ipc_decode, ipc_encode};
use crate::format::GenerationMeta;
use crate::key::Key;
use crate::schema::{deleted_flags, Metric, SEQ_COLUMN};
use crate::settings::GraphParams;
use crate::text::{TextIndex, TextSchema};
use crate::vector::graph::Adjacency;
use crate::vector::{VectorIndex, GRAPH_SECTION};
use crate::{Error, Result};
use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{SchemaRef, UInt64Type};
use std::collections::HashMap;
use std::fmt::Display;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

/// The search indexes a generation carries, as the schema and settings ask.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IndexSpec<'a> {
    /// The shared text schema, when the index has text columns.
    pub(crate) text: Option<&'a TextSchema>,
    /// The vector column's position, metric and graph parameters, when it has one.
    pub(crate) vector: Option<(usize, Metric, GraphParams)>,
}

/// A generation loaded in memory.
#[derive(Debug)]
pub(crate) struct Generation {
    meta: GenerationMeta,
    rows: RecordBatch,
    /// The key hash of each row.
    row_hashes: Vec<u64>,
    text: Option<TextIndex>,
    vector: Option<Arc<VectorIndex>>,
    /// Key hash → row, built at first use.
    row_of_hash: std::sync::OnceLock<HashMap<u64, u32, BuildHasherDefault<HashIsKey>>>,
}

/// A hasher for keys that already are uniformly distributed 64-bit hashes.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct HashIsKey(u64);

impl std::hash::Hasher for HashIsKey {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// The key hash of every row; an error if a key is null.
fn row_hashes(rows: &RecordBatch) -> std::result::Result<Vec<u64>, &'static str> {
    (0..rows.num_rows())
        .map(|r| {
            Key::from_array(rows.column(0).as_ref(), r)
                .map(|k| k.hash64())
                .ok_or("a row has no key")
        })
        .collect()
}

impl Generation {
    /// Build a generation (and its encoded bundle) from stored rows holding one version per key,
    /// with `graph` as its vector graph when it is given (a memtable's, converted to `rows`),
    /// else a graph built here.
    pub(crate) fn build(
        id: u64,
        epoch: u64,
        rows: RecordBatch,
        schema: &SchemaRef,
        spec: IndexSpec<'_>,
        graph: Option<Adjacency>,
        flushes: u64,
    ) -> Result<(Generation, Vec<u8>)> {
        let seqs = rows
            .column_by_name(SEQ_COLUMN)
            .ok_or_else(|| Error::internal("stored rows without _seq"))?
            .as_primitive::<UInt64Type>();
        let min_seq = seqs.iter().flatten().min().unwrap_or(0);
        let max_seq = seqs.iter().flatten().max().unwrap_or(0);
        let tombstones = deleted_flags(&rows).true_count() as u64;
        let row_hashes = row_hashes(&rows).map_err(Error::internal)?;
        let mut pk_hashes = row_hashes.clone();
        pk_hashes.sort_unstable();
        pk_hashes.dedup();

        let mut w = BundleWriter::new();
        w.add("rows", &ipc_encode(schema, std::slice::from_ref(&rows))?);
        let hashes: Vec<u8> = pk_hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
        w.add("pk_hashes", &hashes);
        let vector = match spec.vector {
            Some((col, metric, params)) => {
                let (vi, sections) = match graph {
                    Some(adjacency) => VectorIndex::from_adjacency(&rows, col, metric, adjacency)?,
                    None => VectorIndex::build(&rows, col, metric, params)?,
                };
                for (name, bytes) in sections {
                    w.add(&name, &bytes);
                }
                Some(Arc::new(vi))
            }
            None => None,
        };
        let text = match spec.text {
            Some(ts) => {
                let (ti, files) = TextIndex::build(ts, &rows)?;
                w.add("text_token_counts", &ti.encode_counts());
                for (name, bytes) in files {
                    w.add(&format!("text/{name}"), &bytes);
                }
                Some(ti)
            }
            None => None,
        };
        let mut meta = GenerationMeta {
            id,
            epoch,
            rows: rows.num_rows() as u64,
            tombstones,
            bytes: 0,
            min_seq,
            max_seq,
            flushes: flushes.max(1),
        };
        let out = w.finish(&mut meta)?;
        Ok((
            Generation {
                meta,
                rows,
                row_hashes,
                text,
                vector,
                row_of_hash: Default::default(),
            },
            out,
        ))
    }

    /// Decode and verify a whole bundle. Any defect is an error of kind `Data` naming `object`.
    pub(crate) fn decode(
        bytes: bytes::Bytes,
        schema: &SchemaRef,
        spec: IndexSpec<'_>,
        object: &dyn Display,
    ) -> Result<Self> {
        let started = std::time::Instant::now();
        let bundle = Bundle::open(bytes, object)?;
        let bad = |m: String| bundle.error(m);
        let section = |name: &str| bundle.section(name);
        let t_crc = started.elapsed();
        let batches = ipc_decode(section("rows")?, schema, object)?;
        let rows = arrow::compute::concat_batches(schema, &batches)?;
        if rows.num_rows() as u64 != bundle.stats().rows {
            return Err(bad(format!(
                "holds {} rows, its directory says {}",
                rows.num_rows(),
                bundle.stats().rows
            )));
        }
        let row_hashes = row_hashes(&rows).map_err(|m| bad(m.into()))?;
        let mut sorted = row_hashes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let h = section("pk_hashes")?;
        let listed = h
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
        if h.len() != sorted.len() * 8 || !listed.eq(sorted.iter().copied()) {
            return Err(bad(
                "section 'pk_hashes' is not the sorted set of its rows' key hashes".into(),
            ));
        }
        let t_rows = started.elapsed();
        let vector = match spec.vector {
            Some((col, metric, _)) if bundle.version() == 1 => Some(Arc::new(
                VectorIndex::open_hnsw_dump(&rows, col, metric, &section("hnsw/meta")?, || {
                    Ok((section("hnsw/graph")?, section("hnsw/data")?))
                })
                .map_err(|e| e.corrupt_in(object, "generation vector graph"))?,
            )),
            Some((col, metric, _)) => Some(Arc::new(
                VectorIndex::open(&rows, col, metric, &section(GRAPH_SECTION)?)
                    .map_err(|e| e.corrupt_in(object, "generation vector graph"))?,
            )),
            None => None,
        };
        let t_vector = started.elapsed();
        let text = match spec.text {
            Some(ts) => {
                let c = section("text_token_counts")?;
                if c.len() != rows.num_rows() * ts.fields().len() * 4 {
                    return Err(bad("section 'text_token_counts' has the wrong size".into()));
                }
                let counts = c
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4")))
                    .collect();
                let mut files = Vec::new();
                for name in bundle.section_names().filter(|n| n.starts_with("text/")) {
                    files.push((name["text/".len()..].to_string(), section(name)?.to_vec()));
                }
                Some(
                    TextIndex::open(ts, files, counts)
                        .map_err(|e| e.corrupt_in(object, "generation text index"))?,
                )
            }
            None => None,
        };
        let t_text = started.elapsed();
        tracing::debug!(
            "decoded {object} ({} bytes, {} rows): checks {:?}, rows {:?}, vector {:?}, text {:?}, key hashes {:?}",
            bundle.len(),
            rows.num_rows(),
            t_crc,
            t_rows - t_crc,
            t_vector - t_rows,
            t_text - t_vector,
            started.elapsed() - t_text
        );
        Ok(Generation {
            meta: bundle.stats().clone(),
            row_hashes,
            rows,
            text,
            vector,
            row_of_hash: Default::default(),
        })
    }

    /// What the manifest records about it.
    pub(crate) fn meta(&self) -> &GenerationMeta {
        &self.meta
    }

    /// Approximate bytes it holds in memory, as the cache counts them: the size of its object
    /// (rows, key set, text index, graph) plus 32 bytes per row of key hashes (8) and their lookup table, plus what
    /// its graph keeps besides (a half-precision copy of cosine vectors, norms).
    pub(crate) fn weight(&self) -> u64 {
        let graph = self.vector().map_or(0, |v| v.extra_bytes() as u64);
        self.meta.bytes + 32 * self.meta.rows + graph
    }

    /// Stored rows: one version per key, tombstones included.
    pub(crate) fn rows(&self) -> &RecordBatch {
        &self.rows
    }

    /// The key hash of each row.
    pub(crate) fn row_hashes(&self) -> &[u64] {
        &self.row_hashes
    }

    /// The vector graph, when the schema has a vector column.
    pub(crate) fn vector(&self) -> Option<&Arc<VectorIndex>> {
        self.vector.as_ref()
    }

    /// The full-text index, when the schema has text columns.
    pub(crate) fn text(&self) -> Option<&TextIndex> {
        self.text.as_ref()
    }

    /// The key of `row`.
    pub(crate) fn key_at(&self, row: usize) -> Option<Key> {
        Key::from_array(self.rows.column(0).as_ref(), row)
    }

    /// The row holding `key` (whose hash is `hash`), if this generation has one; `key` is only
    /// computed on a hash hit, and a hit is confirmed on the exact key.
    pub(crate) fn row_of_key(&self, hash: u64, key: impl FnOnce() -> Option<Key>) -> Option<usize> {
        let first = *self.row_of_hash().get(&hash)? as usize;
        let key = key();
        if self.key_at(first) == key {
            return Some(first);
        }
        // Two keys of this generation share the hash (the map keeps the first): look further.
        (first + 1..self.row_hashes.len())
            .find(|r| self.row_hashes[*r] == hash && self.key_at(*r) == key)
    }

    /// Key hash → the first row with it, built at first use.
    pub(crate) fn row_of_hash(&self) -> &HashMap<u64, u32, BuildHasherDefault<HashIsKey>> {
        self.row_of_hash.get_or_init(|| {
            let mut m =
                HashMap::with_capacity_and_hasher(self.row_hashes.len(), Default::default());
            for (r, h) in self.row_hashes.iter().enumerate() {
                m.entry(*h).or_insert(r as u32);
            }
            m
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::IndexSchema;
    use arrow::array::StringArray;
    use bytes::Bytes;
    use std::sync::Arc;

    #[test]
    fn bundle_round_trip_and_corruption() {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t"]}"#).unwrap();
        let user = RecordBatch::try_new(
            s.arrow_schema(),
            vec![
                Arc::new(StringArray::from(vec!["a", "b", "c"])),
                Arc::new(StringArray::from(vec!["x", "y", "z"])),
            ],
        )
        .unwrap();
        let stored = s.to_stored(&user, 5).unwrap();
        let (g, bytes) = Generation::build(
            1,
            2,
            stored.clone(),
            &s.stored_schema(),
            IndexSpec {
                text: TextSchema::new(&s).as_deref(),
                vector: None,
            },
            None,
            1,
        )
        .unwrap();
        assert_eq!(g.meta().bytes as usize, bytes.len());
        let d = Generation::decode(
            bytes.clone().into(),
            &s.stored_schema(),
            IndexSpec {
                text: TextSchema::new(&s).as_deref(),
                vector: None,
            },
            &"g",
        )
        .unwrap();
        assert_eq!(d.rows(), &stored);
        assert_eq!(d.meta(), g.meta());
        let find = |k: &str| d.row_of_key(Key::from(k).hash64(), || Some(Key::from(k)));
        assert_eq!(find("b"), Some(1));
        assert_eq!(find("q"), None);
        for i in (0..bytes.len()).step_by(5) {
            let mut b = bytes.clone();
            b[i] ^= 1;
            let e = Generation::decode(
                b.into(),
                &s.stored_schema(),
                IndexSpec {
                    text: TextSchema::new(&s).as_deref(),
                    vector: None,
                },
                &"g",
            )
            .unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Data, "flip at {i}");
        }
        let e = Generation::decode(
            bytes[..bytes.len() - 3].to_vec().into(),
            &s.stored_schema(),
            IndexSpec {
                text: TextSchema::new(&s).as_deref(),
                vector: None,
            },
            &"g",
        )
        .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Data);
    }

    /// A bundle like `bytes` with `replace` applied to its sections (CRCs recomputed).
    fn rewrite(bytes: &[u8], replace: &dyn Fn(&str, Bytes) -> Bytes) -> Bytes {
        let b = crate::format::bundle::Bundle::open(Bytes::copy_from_slice(bytes), &"g").unwrap();
        let mut w = crate::format::bundle::BundleWriter::new();
        let names: Vec<String> = b.section_names().map(str::to_string).collect();
        for n in &names {
            w.add(n, &replace(n, b.section(n).unwrap()));
        }
        let mut meta = b.stats().clone();
        w.finish(&mut meta).unwrap().into()
    }

    #[test]
    fn key_hashes_and_row_numbers_are_checked() {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t"]}"#).unwrap();
        let ts = TextSchema::new(&s).unwrap();
        let stored = |ids: Vec<&str>| {
            let texts: Vec<String> = ids.iter().map(|i| format!("word {i}")).collect();
            let user = RecordBatch::try_new(
                s.arrow_schema(),
                vec![
                    Arc::new(StringArray::from(ids)),
                    Arc::new(StringArray::from(texts)),
                ],
            )
            .unwrap();
            s.to_stored(&user, 1).unwrap()
        };
        let build = |rows: RecordBatch| {
            let spec = IndexSpec {
                text: Some(&ts),
                vector: None,
            };
            Generation::build(1, 1, rows, &s.stored_schema(), spec, None, 1)
                .unwrap()
                .1
        };
        let decode = |bytes: Bytes| {
            let spec = IndexSpec {
                text: Some(&ts),
                vector: None,
            };
            Generation::decode(bytes, &s.stored_schema(), spec, &"g")
        };
        let three = build(stored(vec!["a", "b", "c"]));
        decode(three.clone().into()).unwrap();
        // Key hashes out of order.
        let reversed = rewrite(&three, &|n, b| {
            if n != "pk_hashes" {
                return b;
            }
            let mut h: Vec<[u8; 8]> = b.chunks_exact(8).map(|c| c.try_into().unwrap()).collect();
            h.reverse();
            Bytes::from(h.concat())
        });
        let e = decode(reversed).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
        // Key hashes of other keys.
        let other = build(stored(vec!["x", "y", "z"]));
        let other = crate::format::bundle::Bundle::open(other.into(), &"o").unwrap();
        let swapped = rewrite(&three, &|n, b| {
            if n == "pk_hashes" {
                other.section(n).unwrap()
            } else {
                b
            }
        });
        let e = decode(swapped).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
        // A text index whose documents name rows the generation does not have.
        let five = build(stored(vec!["a", "b", "c", "d", "e"]));
        let five = crate::format::bundle::Bundle::open(five.into(), &"f").unwrap();
        let names: Vec<String> = five.section_names().map(str::to_string).collect();
        let mut w = crate::format::bundle::BundleWriter::new();
        let orig = crate::format::bundle::Bundle::open(three.clone().into(), &"g").unwrap();
        for n in ["rows", "pk_hashes", "text_token_counts"] {
            w.add(n, &orig.section(n).unwrap());
        }
        for n in names.iter().filter(|n| n.starts_with("text/")) {
            w.add(n, &five.section(n).unwrap());
        }
        let mut meta = orig.stats().clone();
        let bad_rows = w.finish(&mut meta).unwrap();
        let e = decode(bad_rows.into()).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
    }
}
