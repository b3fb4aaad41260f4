//! Generations: immutable, flushed memtables, one bundle object each.
//!
//! A generation holds the newest version of every key of one memtable (tombstones included) and
//! the set of their 64-bit key hashes, so that newer sources can hide older rows cheaply. The
//! search issues add their sections (a tantivy index, an HNSW graph) to the same bundle.
//!
//! Layout of `generations/{id:020}-{epoch:010}.gen` (little-endian):
//!
//! ```text
//! "LSMG"                          4-byte magic
//! section bytes ...               each section at the offset the directory gives
//! directory                       JSON: {"sections": [{"name", "offset", "len", "crc32"}], "stats": {...}}
//! footer (32 bytes):
//!   dir_offset  u64
//!   dir_len     u64
//!   version     u32               format version (2; version 1 is still read)
//!   body_crc    u32               CRC32 of bytes [0, dir_offset + dir_len)
//!   magic       "LSMG"
//!   footer_crc  u32               CRC32 of the 28 footer bytes before it
//! ```
//!
//! Sections: `rows` (Arrow IPC stream of stored rows: index columns, `_seq`, `_deleted`),
//! `pk_hashes` (sorted, distinct u64 xxh3 hashes of the keys, see [`crate::key::PK_HASH_SEED`]),
//! and the search indexes': `text/*` and `text_token_counts`, and `vector/graph` (version 2,
//! see [`crate::index::graph`]) or `hnsw/meta`, `hnsw/graph`, `hnsw/data` (version 1: hnsw_rs
//! dump files). Every section also has its own CRC so it can be read by range.

pub mod cache;

use crate::codec::{ipc_decode, ipc_encode, Reader};
use crate::index::text::{TextIndex, TextSchema};
use crate::index::vector::{GraphParams, VectorIndex, GRAPH_SECTION};
use crate::schema::Metric;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

/// The search indexes a generation carries, as the schema and settings ask.
#[derive(Debug, Clone, Copy, Default)]
pub struct IndexSpec<'a> {
    /// The shared text schema, when the index has text columns.
    pub text: Option<&'a TextSchema>,
    /// The vector column's position, metric and graph parameters, when it has one.
    pub vector: Option<(usize, Metric, GraphParams)>,
}
use crate::key::Key;
use crate::memtable::deleted_flags;
use crate::schema::SEQ_COLUMN;
use crate::{Error, Result};
use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{SchemaRef, UInt64Type};
use serde::{Deserialize, Serialize};
use std::fmt::Display;

/// Magic bytes of a generation bundle (start and footer).
pub const GENERATION_MAGIC: &[u8; 4] = b"LSMG";
/// Current generation format version.
pub const GENERATION_FORMAT_VERSION: u32 = 2;
const FOOTER_LEN: usize = 32;

/// What the manifest records about a generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationMeta {
    /// Generation id (increasing; newer generations have larger ids).
    pub id: u64,
    /// Epoch of the writer that wrote it (part of the object name).
    pub epoch: u64,
    /// Rows stored (live and tombstones).
    pub rows: u64,
    /// Tombstones among them.
    pub tombstones: u64,
    /// Size of the object in bytes.
    pub bytes: u64,
    /// Smallest sequence number stored.
    pub min_seq: u64,
    /// Largest sequence number stored.
    pub max_seq: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Section {
    name: String,
    offset: u64,
    len: u64,
    crc32: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Directory {
    sections: Vec<Section>,
    stats: GenerationMeta,
}

/// A generation loaded in memory.
#[derive(Debug)]
pub struct Generation {
    meta: GenerationMeta,
    rows: RecordBatch,
    pk_hashes: Vec<u64>,
    /// The key hash of each row.
    row_hashes: Vec<u64>,
    /// `(row, key hash)` of every row: a search's candidates (one version per key).
    candidates: std::sync::Arc<Vec<(usize, u64)>>,
    text: Option<TextIndex>,
    vector: Option<Arc<VectorIndex>>,
    /// Key hash → row, built at first use.
    row_of_hash: std::sync::OnceLock<HashMap<u64, u32, BuildHasherDefault<HashIsKey>>>,
    /// The rows newer generations hide, for the newer generations last asked about.
    newer: std::sync::Mutex<Option<Arc<NewerMask>>>,
}

/// A hasher for keys that already are uniformly distributed 64-bit hashes.
#[derive(Debug, Default, Clone, Copy)]
pub struct HashIsKey(u64);

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

/// What the generations newer than one generation hide of it (block lists between generations,
/// which only change when the generation list does, so they are computed once per list).
#[derive(Debug)]
pub struct NewerMask {
    /// Ids of the newer generations, newest first.
    pub newer: Vec<u64>,
    /// Per row: neither a tombstone nor superseded by a newer generation.
    pub live: Arc<Vec<bool>>,
    /// Rows (not tombstones) that newer generations hide.
    pub hidden: Vec<u32>,
}

fn candidates(row_hashes: &[u64]) -> std::sync::Arc<Vec<(usize, u64)>> {
    std::sync::Arc::new(row_hashes.iter().copied().enumerate().collect())
}

fn row_hashes(rows: &RecordBatch) -> Vec<u64> {
    (0..rows.num_rows())
        .map(|r| Key::from_array(rows.column(0).as_ref(), r).map_or(0, |k| k.hash64()))
        .collect()
}

impl Generation {
    /// Build a generation (and its encoded bundle) from stored rows holding one version per key.
    pub fn build(
        id: u64,
        epoch: u64,
        rows: RecordBatch,
        schema: &SchemaRef,
        spec: IndexSpec<'_>,
    ) -> Result<(Generation, Vec<u8>)> {
        let seqs = rows
            .column_by_name(SEQ_COLUMN)
            .ok_or_else(|| Error::internal("stored rows without _seq"))?
            .as_primitive::<UInt64Type>();
        let min_seq = seqs.iter().flatten().min().unwrap_or(0);
        let max_seq = seqs.iter().flatten().max().unwrap_or(0);
        let tombstones = deleted_flags(&rows).true_count() as u64;
        let row_hashes = row_hashes(&rows);
        let mut pk_hashes = row_hashes.clone();
        pk_hashes.sort_unstable();
        pk_hashes.dedup();

        let mut out = Vec::new();
        out.extend_from_slice(GENERATION_MAGIC);
        let mut sections = Vec::new();
        let mut add = |out: &mut Vec<u8>, name: &str, bytes: &[u8]| {
            sections.push(Section {
                name: name.to_string(),
                offset: out.len() as u64,
                len: bytes.len() as u64,
                crc32: crc32fast::hash(bytes),
            });
            out.extend_from_slice(bytes);
        };
        add(
            &mut out,
            "rows",
            &ipc_encode(schema, std::slice::from_ref(&rows))?,
        );
        let hashes: Vec<u8> = pk_hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
        add(&mut out, "pk_hashes", &hashes);
        let vector = match spec.vector {
            Some((col, metric, params)) => {
                let (vi, sections) = VectorIndex::build(&rows, col, metric, params)?;
                for (name, bytes) in sections {
                    add(&mut out, &name, &bytes);
                }
                Some(Arc::new(vi))
            }
            None => None,
        };
        let text = match spec.text {
            Some(ts) => {
                let (ti, files) = TextIndex::build(ts, &rows)?;
                add(&mut out, "text_token_counts", &ti.encode_counts());
                for (name, bytes) in files {
                    add(&mut out, &format!("text/{name}"), &bytes);
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
        };
        let dir_offset = out.len() as u64;
        // The object size is known once the directory is serialized; its own digits may change
        // the size, so iterate to a fixed point (at most a couple of rounds).
        let mut dir_json;
        let mut total = out.len() as u64 + FOOTER_LEN as u64;
        loop {
            meta.bytes = total;
            dir_json = serde_json::to_vec(&Directory {
                sections: std::mem::take(&mut sections),
                stats: meta.clone(),
            })
            .map_err(|e| Error::internal(format!("generation directory: {e}")))?;
            let d: Directory = serde_json::from_slice(&dir_json).expect("just written");
            sections = d.sections;
            let t = dir_offset + dir_json.len() as u64 + FOOTER_LEN as u64;
            if t == total {
                break;
            }
            total = t;
        }
        out.extend_from_slice(&dir_json);
        let body_crc = crc32fast::hash(&out);
        let mut footer = Vec::with_capacity(FOOTER_LEN);
        footer.extend_from_slice(&dir_offset.to_le_bytes());
        footer.extend_from_slice(&(dir_json.len() as u64).to_le_bytes());
        footer.extend_from_slice(&GENERATION_FORMAT_VERSION.to_le_bytes());
        footer.extend_from_slice(&body_crc.to_le_bytes());
        footer.extend_from_slice(GENERATION_MAGIC);
        let fcrc = crc32fast::hash(&footer);
        footer.extend_from_slice(&fcrc.to_le_bytes());
        out.extend_from_slice(&footer);
        debug_assert_eq!(out.len() as u64, meta.bytes);
        Ok((
            Generation {
                meta,
                rows,
                pk_hashes,
                candidates: candidates(&row_hashes),
                row_hashes,
                text,
                vector,
                row_of_hash: Default::default(),
                newer: Default::default(),
            },
            out,
        ))
    }

    /// Decode and verify a whole bundle. Any defect is an error of kind `Data` naming `object`.
    pub fn decode(
        bytes: bytes::Bytes,
        schema: &SchemaRef,
        spec: IndexSpec<'_>,
        object: &dyn Display,
    ) -> Result<Self> {
        let bad = |m: String| Error::data(object, format!("generation {m}"));
        let started = std::time::Instant::now();
        if bytes.len() < FOOTER_LEN + 4 || &bytes[0..4] != GENERATION_MAGIC {
            return Err(bad(format!(
                "is truncated or not a generation ({} bytes)",
                bytes.len()
            )));
        }
        let footer = &bytes[bytes.len() - FOOTER_LEN..];
        let fcrc = u32::from_le_bytes(footer[28..32].try_into().expect("4"));
        if crc32fast::hash(&footer[..28]) != fcrc || &footer[24..28] != GENERATION_MAGIC {
            return Err(bad("footer is corrupt (CRC or magic mismatch)".into()));
        }
        let mut r = Reader::new(footer);
        let dir_offset = r.u64().expect("footer") as usize;
        let dir_len = r.u64().expect("footer") as usize;
        let version = r.u32().expect("footer");
        let body_crc = r.u32().expect("footer");
        debug_assert_eq!(r.position(), 24);
        if !(1..=GENERATION_FORMAT_VERSION).contains(&version) {
            return Err(bad(format!(
                "has format version {version}; this build reads versions 1 to {GENERATION_FORMAT_VERSION}"
            )));
        }
        if dir_offset.checked_add(dir_len) != Some(bytes.len() - FOOTER_LEN) {
            return Err(bad("footer points outside the object".into()));
        }
        if crc32fast::hash(&bytes[..dir_offset + dir_len]) != body_crc {
            return Err(bad("fails its CRC32 check".into()));
        }
        let dir: Directory = serde_json::from_slice(&bytes[dir_offset..dir_offset + dir_len])
            .map_err(|e| bad(format!("directory is not valid: {e}")))?;
        let section = |name: &str| -> Result<bytes::Bytes> {
            let s = dir
                .sections
                .iter()
                .find(|s| s.name == name)
                .ok_or_else(|| bad(format!("has no '{name}' section")))?;
            let (o, l) = (s.offset as usize, s.len as usize);
            if o.checked_add(l).is_none_or(|e| e > dir_offset) {
                return Err(bad(format!("section '{name}' lies outside the object")));
            }
            let b = bytes.slice(o..o + l);
            if crc32fast::hash(&b) != s.crc32 {
                return Err(bad(format!("section '{name}' fails its CRC32 check")));
            }
            Ok(b)
        };
        let t_crc = started.elapsed();
        let batches = ipc_decode(section("rows")?, schema, object)?;
        let rows = arrow::compute::concat_batches(schema, &batches)?;
        let h = section("pk_hashes")?;
        if h.len() % 8 != 0 {
            return Err(bad("section 'pk_hashes' has a partial hash".into()));
        }
        let pk_hashes = h
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
            .collect();
        if rows.num_rows() as u64 != dir.stats.rows {
            return Err(bad(format!(
                "holds {} rows, its directory says {}",
                rows.num_rows(),
                dir.stats.rows
            )));
        }
        let t_rows = started.elapsed();
        let vector = match spec.vector {
            Some((col, metric, _)) if version == 1 => Some(Arc::new(
                VectorIndex::open_hnsw_dump(&rows, col, metric, &section("hnsw/meta")?, || {
                    Ok((section("hnsw/graph")?, section("hnsw/data")?))
                })
                .map_err(|e| bad(format!("vector graph: {}", e.message())))?,
            )),
            Some((col, metric, _)) => Some(Arc::new(
                VectorIndex::open(&rows, col, metric, &section(GRAPH_SECTION)?)
                    .map_err(|e| bad(format!("vector graph: {}", e.message())))?,
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
                for s in dir.sections.iter().filter(|s| s.name.starts_with("text/")) {
                    files.push((
                        s.name["text/".len()..].to_string(),
                        section(&s.name)?.to_vec(),
                    ));
                }
                Some(
                    TextIndex::open(ts, files, counts)
                        .map_err(|e| bad(format!("text index: {}", e.message())))?,
                )
            }
            None => None,
        };
        let t_text = started.elapsed();
        let row_hashes = row_hashes(&rows);
        tracing::debug!(
            "decoded {object} ({} bytes, {} rows): checks {:?}, rows {:?}, vector {:?}, text {:?}, key hashes {:?}",
            bytes.len(),
            rows.num_rows(),
            t_crc,
            t_rows - t_crc,
            t_vector - t_rows,
            t_text - t_vector,
            started.elapsed() - t_text
        );
        Ok(Generation {
            meta: dir.stats,
            candidates: candidates(&row_hashes),
            row_hashes,
            rows,
            pk_hashes,
            text,
            vector,
            row_of_hash: Default::default(),
            newer: Default::default(),
        })
    }

    /// What the manifest records about it.
    pub fn meta(&self) -> &GenerationMeta {
        &self.meta
    }

    /// Approximate bytes it holds in memory, as the cache counts them: the size of its object
    /// (rows, key set, text index, graph) plus 24 bytes per row of key-hash tables.
    pub fn weight(&self) -> u64 {
        self.meta.bytes + 24 * self.meta.rows
    }

    /// Stored rows: one version per key, tombstones included.
    pub fn rows(&self) -> &RecordBatch {
        &self.rows
    }

    /// Whether the key set may contain `key` (exact for absent keys; confirm hits on the rows).
    pub fn may_contain(&self, key: &Key) -> bool {
        self.pk_hashes.binary_search(&key.hash64()).is_ok()
    }

    /// The key hash of each row.
    pub fn row_hashes(&self) -> &[u64] {
        &self.row_hashes
    }

    /// `(row, key hash)` of every row.
    pub fn candidates(&self) -> &std::sync::Arc<Vec<(usize, u64)>> {
        &self.candidates
    }

    /// The vector graph, when the schema has a vector column.
    pub fn vector(&self) -> Option<&Arc<VectorIndex>> {
        self.vector.as_ref()
    }

    /// The full-text index, when the schema has text columns.
    pub fn text(&self) -> Option<&TextIndex> {
        self.text.as_ref()
    }

    /// The sorted, distinct key hashes.
    pub fn pk_hashes(&self) -> &[u64] {
        &self.pk_hashes
    }

    fn key_at(&self, row: usize) -> Option<Key> {
        Key::from_array(self.rows.column(0).as_ref(), row)
    }

    /// The row holding `key` (whose hash is `hash`), if this generation has one; `key` is only
    /// computed on a hash hit, and a hit is confirmed on the exact key.
    pub fn row_of_key(&self, hash: u64, key: impl FnOnce() -> Option<Key>) -> Option<usize> {
        let map = self.row_of_hash.get_or_init(|| {
            let mut m =
                HashMap::with_capacity_and_hasher(self.row_hashes.len(), Default::default());
            for (r, h) in self.row_hashes.iter().enumerate() {
                m.entry(*h).or_insert(r as u32);
            }
            m
        });
        let first = *map.get(&hash)? as usize;
        let key = key();
        if self.key_at(first) == key {
            return Some(first);
        }
        // Two keys of this generation share the hash (the map keeps the first): look further.
        (first + 1..self.row_hashes.len())
            .find(|r| self.row_hashes[*r] == hash && self.key_at(*r) == key)
    }

    /// The rows of this generation that `newer` (the generations newer than it, newest first)
    /// hide, with its tombstones: computed once per list of newer generations, and extended
    /// (not recomputed) when generations were only added on top.
    pub fn newer_mask(&self, newer: &[&Arc<Generation>]) -> Arc<NewerMask> {
        let ids: Vec<u64> = newer.iter().map(|g| g.meta.id).collect();
        let mut cached = self.newer.lock().unwrap_or_else(|e| e.into_inner());
        let (mut live, mut hidden, todo) = match cached.as_ref() {
            Some(c) if c.newer == ids => return c.clone(),
            Some(c) if ids.ends_with(&c.newer) => (
                (*c.live).clone(),
                c.hidden.clone(),
                ids.len() - c.newer.len(),
            ),
            _ => {
                let deleted = crate::memtable::deleted_flags(&self.rows);
                let live = (0..self.rows.num_rows())
                    .map(|r| !deleted.value(r))
                    .collect();
                (live, Vec::new(), ids.len())
            }
        };
        for g in &newer[..todo] {
            for (r, h) in g.row_hashes.iter().enumerate() {
                if let Some(mine) = self.row_of_key(*h, || g.key_at(r)) {
                    if live[mine] {
                        live[mine] = false;
                        hidden.push(mine as u32);
                    }
                }
            }
        }
        let mask = Arc::new(NewerMask {
            newer: ids,
            live: Arc::new(live),
            hidden,
        });
        *cached = Some(mask.clone());
        mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::IndexSchema;
    use arrow::array::StringArray;
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
        assert!(d.may_contain(&Key::from("b")));
        assert!(!d.may_contain(&Key::from("q")));
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
}
