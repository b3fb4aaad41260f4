//! Generations: immutable, flushed memtables, one bundle object each.
//!
//! A generation holds the newest version of every key of one memtable (tombstones included) and
//! the set of their 64-bit key hashes, so that newer sources can hide older rows cheaply, with
//! the search indexes built over them: a tantivy index (`text/*` sections and
//! `text_token_counts`) and a vector graph (`vector/graph`; `hnsw/*` in format version 1). The
//! container and every section's layout are in `docs/format.md`, "Generation bundle".
//!
//! From format version 3 an opened generation holds in memory only its hot part (keys, flags,
//! key hashes, the text index, the graph, 8-bit codes of its vectors; a small generation also
//! its f32 vectors); the other columns of its rows and its vectors stay in the object, read by
//! range when a query returns, filters or re-ranks rows ([`cold`], [`rows`]). A generation of
//! an older version, or one decoded from a whole object, holds every row.

pub(crate) mod by_hash;
pub(crate) mod cache;
pub(crate) mod cold;
pub(crate) mod pins;
pub(crate) mod rows;

use crate::format::bundle::{Bundle, BundleWriter};
use crate::format::ipc::{ipc_decode, ipc_encode};
use crate::format::GenerationMeta;
use crate::key::Key;
use crate::schema::{deleted_flags, Metric, SEQ_COLUMN};
use crate::settings::GraphParams;
use crate::text::{hot_pieces, ColdRead, TextFile, TextIndex, TextSchema};
use crate::vector::graph::Adjacency;
use crate::vector::{VectorIndex, CODES_SECTION, GRAPH_SECTION};
use crate::{Error, Result};
use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, RecordBatch};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Float32Type, SchemaRef, UInt64Type};
use by_hash::HashIndex;
use bytes::Bytes;
use cold::ColdObject;
use rows::ColdRows;
use std::collections::HashMap;
use std::fmt::Display;
use std::sync::Arc;

/// The search indexes a generation carries, as the schema and settings ask.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IndexSpec<'a> {
    /// The shared text schema, when the index has text columns.
    pub(crate) text: Option<&'a TextSchema>,
    /// The vector column's position, metric and graph parameters, when it has one.
    pub(crate) vector: Option<(usize, Metric, GraphParams)>,
}

/// Version 3: the hot section holding the key, `_seq` and `_deleted` columns (Arrow IPC).
const KEYS_SECTION: &str = "keys";
/// Version 3: the cold section holding the other stored columns but the vector (Parquet).
const ROWS_SECTION: &str = "rows";
/// Version 3: the hot section holding the Parquet metadata of [`ROWS_SECTION`].
const ROWS_FOOTER_SECTION: &str = "rows/footer";
/// Version 3: the cold section holding the vectors, `dim` f32 little-endian per row.
const VECTORS_SECTION: &str = "vectors";
/// Version 3: the hot section marking the rows with a vector, one bit per row (LSB first).
const VECTORS_VALID_SECTION: &str = "vectors/valid";
/// Prefix of the hot sections holding what tantivy reads of a cold text file when it opens
/// the generation (its pieces, see [`crate::text::hot_pieces`]), named by the file.
const TEXT_PIECES: &str = "text_pieces/";
/// The first version whose postings and positions are in the cold part.
const COLD_TEXT_VERSION: u32 = 4;

/// Bytes a row of a generation's [`HashIndex`] holds, about (besides its sorted hashes).
const HASH_BYTES_PER_ROW: u64 = 5;

/// A generation opened for reading.
#[derive(Debug)]
pub(crate) struct Generation {
    meta: GenerationMeta,
    /// The stored schema.
    schema: SchemaRef,
    /// Every stored row ([`Generation::decode`], and versions 1 and 2); in a version-3
    /// generation opened from its hot part, the key and `_deleted` columns only.
    resident: RecordBatch,
    /// Version 3, opened from its hot part: the other columns, read by range.
    cold: Option<ColdRows>,
    /// Version 3, opened from its hot part: where its vectors are (read by range).
    vectors: Option<ColdVectors>,
    text: Option<TextIndex>,
    vector: Option<Arc<VectorIndex>>,
    /// Rows by key hash (over the `pk_hashes` section's distinct hashes).
    by_hash: HashIndex,
    /// Bytes of the hot part it was opened from (0: decoded whole).
    hot_bytes: u64,
    /// What it holds in memory, by kind (see [`Resident`]).
    resident_bytes: Resident,
    /// The position of the vector column, when the index has one.
    vector_col: Option<usize>,
    /// Opened by a handle's cache: its object, held from deletion while this copy lives.
    object_pin: Option<pins::Pins>,
}

/// What a version-3 generation opened from its hot part also holds of its cold part (a small
/// one, read whole: see [`Generation::held_parts`]).
#[derive(Default)]
pub(crate) struct Held {
    /// Its vectors section.
    pub(crate) vectors: Option<Bytes>,
    /// Its cold text sections, by name.
    pub(crate) text: HashMap<String, Bytes>,
}

/// What opened generations hold in memory, by kind, in bytes (an estimate: the sizes of the
/// sections and arrays they were made from).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Resident {
    /// Keys and `_deleted` (version 3), the sorted key hashes and their lookup table (13 bytes
    /// a row).
    pub keys: u64,
    /// Full-text indexes (tantivy files) and token counts.
    pub text: u64,
    /// Vector graphs and the 8-bit codes walks read (version 3).
    pub graph: u64,
    /// f32 vectors held (small version-3 generations) and graphs' extra copies and norms.
    pub vectors: u64,
    /// Parquet metadata of the cold rows, the block CRCs and the rest of the hot parts.
    pub other: u64,
    /// Generations of versions 1 and 2, held whole (every row).
    pub whole: u64,
}

impl Resident {
    /// The bytes of every kind together.
    pub fn total(&self) -> u64 {
        self.keys + self.text + self.graph + self.vectors + self.other + self.whole
    }

    /// Each kind's bytes per row over `rows` rows, as `keys 21.1, text 9.4, graph and codes
    /// 167.6, vectors 0.0, other 5.2, whole 0.0` (what `lsmsearch stats` and `bench reader`
    /// print).
    pub fn per_row(&self, rows: u64) -> String {
        let per_row = |b: u64| b as f64 / rows.max(1) as f64;
        format!(
            "keys {:.1}, text {:.1}, graph and codes {:.1}, vectors {:.1}, other {:.1}, whole {:.1}",
            per_row(self.keys),
            per_row(self.text),
            per_row(self.graph),
            per_row(self.vectors),
            per_row(self.other),
            per_row(self.whole)
        )
    }

    /// The sum of two.
    pub(crate) fn add(self, o: Resident) -> Resident {
        Resident {
            keys: self.keys + o.keys,
            text: self.text + o.text,
            graph: self.graph + o.graph,
            vectors: self.vectors + o.vectors,
            other: self.other + o.other,
            whole: self.whole + o.whole,
        }
    }
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
        .map(|r| Key::hash_at(rows.column(0).as_ref(), r).ok_or("a row has no key"))
        .collect()
}

/// A copy of `a` in buffers of its own (not slices of larger ones).
fn owned(a: &ArrayRef) -> Result<ArrayRef> {
    let data = a.to_data();
    let mut copy = arrow::array::MutableArrayData::new(vec![&data], false, data.len());
    copy.try_extend(0, 0, data.len())?;
    Ok(arrow::array::make_array(copy.freeze()))
}

/// The stored columns a version-3 generation keeps in its hot part: the key, `_seq` and
/// `_deleted` (the last two columns of the stored schema).
fn hot_columns(schema: &SchemaRef) -> Vec<usize> {
    let n = schema.fields().len();
    vec![0, n - 2, n - 1]
}

/// A version-3 generation's vectors, in its cold part.
#[derive(Debug)]
struct ColdVectors {
    /// The `vectors` section.
    range: std::ops::Range<u64>,
    dim: usize,
    /// One bit per row, set where the row has a vector (`vectors/valid`).
    valid: Vec<u8>,
    /// The vector column's field.
    field: arrow::datatypes::FieldRef,
    /// Every row's vector, when the generation keeps them in memory (a small one, which
    /// vector search scans exactly).
    held: Option<ArrayRef>,
}

/// The vectors of `list` as `dim` f32 little-endian per row (zeros for null rows) and one bit
/// per row, set where the row has one.
fn encode_vectors(list: &FixedSizeListArray) -> Result<(Vec<u8>, Vec<u8>)> {
    let dim = list.value_length() as usize;
    let values = list
        .values()
        .as_primitive_opt::<Float32Type>()
        .ok_or_else(|| Error::internal("vector column is not float32"))?;
    let start = list.offset() * dim;
    let mut out = Vec::with_capacity(list.len() * dim * 4);
    for v in &values.values()[start..start + list.len() * dim] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let mut valid = vec![0u8; list.len().div_ceil(8)];
    for r in 0..list.len() {
        if list.is_valid(r) {
            valid[r / 8] |= 1 << (r % 8);
        }
    }
    Ok((out, valid))
}

/// The vector column of `rows` rows of `field`'s type from [`encode_vectors`]' two sections.
fn decode_vectors(
    field: &arrow::datatypes::Field,
    values: &[u8],
    valid: &[u8],
    rows: usize,
) -> std::result::Result<ArrayRef, String> {
    let DataType::FixedSizeList(item, dim) = field.data_type() else {
        return Err("the vector column is not a fixed-size list".into());
    };
    let dim = *dim as usize;
    if values.len() != rows * dim * 4 || valid.len() != rows.div_ceil(8) {
        return Err(format!(
            "sections '{VECTORS_SECTION}' ({} bytes) and '{VECTORS_VALID_SECTION}' ({} bytes) do not hold {rows} vectors of {dim} dimensions",
            values.len(),
            valid.len()
        ));
    }
    let floats: Vec<f32> = values
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    let nulls = NullBuffer::from_iter((0..rows).map(|r| valid[r / 8] & (1 << (r % 8)) != 0));
    let list = FixedSizeListArray::try_new(
        item.clone(),
        dim as i32,
        Arc::new(Float32Array::from(floats)),
        Some(nulls),
    )
    .map_err(|e| e.to_string())?;
    Ok(Arc::new(list))
}

impl Generation {
    /// Build a generation (and its encoded bundle) from stored rows holding one version per key,
    /// with `graph` as its vector graph when it is given (a memtable's, converted to `rows`),
    /// else a graph built here. The generation returned holds every row in memory; a handle
    /// keeps the one [`Generation::open`] makes of the object instead.
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
        let vcol = spec.vector.map(|(c, _, _)| c);
        let (parquet, footer) = rows::encode(&rows, vcol)?;
        w.add_cold(ROWS_SECTION, &parquet);
        drop(parquet);
        w.add(ROWS_FOOTER_SECTION, &footer);
        let hot = rows.project(&hot_columns(schema))?;
        w.add(KEYS_SECTION, &ipc_encode(&hot.schema(), &[hot])?);
        let hashes: Vec<u8> = pk_hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
        w.add("pk_hashes", &hashes);
        let by_hash = HashIndex::new(Bytes::from(hashes), row_hashes.into_iter());
        let vector = match spec.vector {
            Some((col, metric, params)) => {
                let list = rows
                    .column(col)
                    .as_fixed_size_list_opt()
                    .ok_or_else(|| Error::internal("vector column is not a fixed-size list"))?;
                let (values, valid) = encode_vectors(list)?;
                w.add_cold(VECTORS_SECTION, &values);
                drop(values);
                w.add(VECTORS_VALID_SECTION, &valid);
                w.add(
                    CODES_SECTION,
                    &VectorIndex::codes_section(&rows, col, metric)?,
                );
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
                // Owned once (not copied) for the recording of their pieces and the bundle.
                let files: Vec<(String, tantivy::directory::OwnedBytes)> = files
                    .into_iter()
                    .map(|(n, b)| (n, tantivy::directory::OwnedBytes::new(b)))
                    .collect();
                let pieces: HashMap<String, Vec<u8>> = match w.version() >= COLD_TEXT_VERSION {
                    true => hot_pieces(ts, &files)?.into_iter().collect(),
                    false => HashMap::new(),
                };
                for (name, bytes) in files {
                    match pieces.get(&name) {
                        Some(p) => {
                            w.add_cold(&format!("text/{name}"), bytes.as_slice());
                            w.add(&format!("{TEXT_PIECES}{name}"), p);
                        }
                        None => w.add(&format!("text/{name}"), bytes.as_slice()),
                    }
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
            hot_offset: None,
        };
        let out = w.finish(&mut meta)?;
        Ok((
            Generation {
                meta,
                schema: schema.clone(),
                resident: rows,
                cold: None,
                vectors: None,
                text,
                vector,
                by_hash,
                hot_bytes: 0,
                resident_bytes: Resident::default(),
                vector_col: vcol,
                object_pin: None,
            },
            out,
        ))
    }

    /// Decode and verify a whole bundle, every row held in memory. Any defect is an error of
    /// kind `Data` naming `object`.
    pub(crate) fn decode(
        bytes: Bytes,
        schema: &SchemaRef,
        spec: IndexSpec<'_>,
        object: &dyn Display,
    ) -> Result<Self> {
        let bundle = Bundle::open(bytes, object)?;
        let rows = if bundle.version() >= 3 {
            let mut rows = Self::decode_rows_v3(&bundle, schema, spec, object)?;
            if let Some((col, _, _)) = spec.vector {
                let vectors = decode_vectors(
                    schema.field(col),
                    &bundle.section(VECTORS_SECTION)?,
                    &bundle.section(VECTORS_VALID_SECTION)?,
                    rows.num_rows(),
                )
                .map_err(|m| bundle.error(m))?;
                let mut columns = rows.columns().to_vec();
                columns.insert(col, vectors);
                rows = RecordBatch::try_new(schema.clone(), columns)
                    .map_err(|e| bundle.error(format!("rows: {e}")))?;
            }
            rows
        } else {
            let batches = ipc_decode(bundle.section("rows")?, schema, object)?;
            arrow::compute::concat_batches(schema, &batches)?
        };
        Self::assemble(
            &bundle,
            schema,
            spec,
            object,
            rows,
            None,
            None,
            0,
            &HashMap::new(),
        )
    }

    /// A version-3 bundle's stored columns but the vector column, decoded from the whole
    /// object (its Parquet section read in memory).
    fn decode_rows_v3(
        bundle: &Bundle,
        schema: &SchemaRef,
        spec: IndexSpec<'_>,
        object: &dyn Display,
    ) -> Result<RecordBatch> {
        let bad = |m: String| Error::data(object, format!("generation rows: {m}"));
        let file = bundle.section(ROWS_SECTION)?;
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| bad(e.to_string()))?
            .with_batch_size(8192)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        let batches = reader
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string()))?;
        let keep: Vec<usize> = (0..schema.fields().len())
            .filter(|c| Some(*c) != spec.vector.map(|v| v.0))
            .collect();
        let want = Arc::new(schema.project(&keep)?);
        let same = batches.iter().all(|b| {
            b.schema().fields().len() == want.fields().len()
                && b.schema()
                    .fields()
                    .iter()
                    .zip(want.fields())
                    .all(|(a, w)| a.name() == w.name() && a.data_type() == w.data_type())
        });
        if !same {
            return Err(bad("its columns are not the index's stored columns".into()));
        }
        let columns = (0..want.fields().len())
            .map(|c| {
                let parts: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
                if parts.is_empty() {
                    Ok(arrow::array::new_empty_array(want.field(c).data_type()))
                } else {
                    arrow::compute::concat(&parts)
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        RecordBatch::try_new(want, columns).map_err(|e| bad(e.to_string()))
    }

    /// Open a version-3 generation from its checked hot part, reading the rest through `cold`
    /// when a query asks for rows (its columns) or re-ranks candidates (their vectors), or
    /// holding what `held` gives (a small generation read whole).
    pub(crate) fn open(
        bundle: &Bundle,
        cold: ColdObject,
        held: Held,
        schema: &SchemaRef,
        spec: IndexSpec<'_>,
        object: &dyn Display,
    ) -> Result<Self> {
        let hot_schema = Arc::new(schema.project(&hot_columns(schema))?);
        let batches = ipc_decode(bundle.section(KEYS_SECTION)?, &hot_schema, object)?;
        let keys = arrow::compute::concat_batches(&hot_schema, &batches)?;
        drop(batches);
        // The key and `_deleted` stay, in buffers of their own (the hot part they were decoded
        // from is not kept alive by them); `_seq` is read by range with the other columns.
        let resident = RecordBatch::try_new(
            Arc::new(hot_schema.project(&[0, 2])?),
            vec![owned(keys.column(0))?, owned(keys.column(2))?],
        )?;
        drop(keys);
        let rows = resident.num_rows();
        let vcol = spec.vector.map(|v| v.0);
        let Held {
            vectors,
            text: held_text,
        } = held;
        let cold_rows = ColdRows::open(
            cold,
            bundle.cold_range(ROWS_SECTION)?,
            &bundle.section(ROWS_FOOTER_SECTION)?,
            schema,
            vcol,
            rows,
        )?;
        let held = match (vcol, vectors) {
            (Some(col), Some(values)) => Some(
                decode_vectors(
                    schema.field(col),
                    &values,
                    &bundle.section(VECTORS_VALID_SECTION)?,
                    rows,
                )
                .map_err(|m| bundle.error(m))?,
            ),
            _ => None,
        };
        let vectors = match vcol {
            Some(col) => {
                let field = schema.fields()[col].clone();
                let DataType::FixedSizeList(_, dim) = field.data_type() else {
                    return Err(Error::internal(
                        "the vector column is not a fixed-size list",
                    ));
                };
                let dim = *dim as usize;
                let range = bundle.cold_range(VECTORS_SECTION)?;
                let valid = bundle.section(VECTORS_VALID_SECTION)?.to_vec();
                if range.end - range.start != (rows * dim * 4) as u64
                    || valid.len() != rows.div_ceil(8)
                {
                    return Err(bundle.error(format!(
                        "sections '{VECTORS_SECTION}' and '{VECTORS_VALID_SECTION}' do not hold {rows} vectors of {dim} dimensions"
                    )));
                }
                Some(ColdVectors {
                    range,
                    dim,
                    valid,
                    field,
                    held: held.clone(),
                })
            }
            None => None,
        };
        let hot = bundle.len() as u64 - bundle.hot_offset();
        let mut g = Self::assemble(
            bundle,
            schema,
            spec,
            object,
            resident,
            Some(cold_rows),
            vectors,
            hot,
            &held_text,
        )?;
        g.resident_bytes = g.measure(bundle, hot);
        g.resident_bytes.text += held_text.values().map(|b| b.len() as u64).sum::<u64>();
        Ok(g)
    }

    /// What a generation opened from `bundle`'s hot part (`hot` bytes) holds, by kind.
    fn measure(&self, bundle: &Bundle, hot: u64) -> Resident {
        let len = |n: &str| bundle.section(n).map_or(0, |b| b.len() as u64);
        // The rows' token counts are summed at open, not kept.
        let counts = len("text_token_counts");
        let text: u64 = bundle
            .section_names()
            .filter(|n| n.starts_with("text"))
            .map(len)
            .sum::<u64>()
            - counts;
        let nodes = self.vector().map_or(0, |v| v.nodes_bytes() as u64);
        let graph =
            self.vector().map_or(0, |v| v.graph_bytes() as u64) + len(CODES_SECTION) + nodes;
        let keys = self.resident.get_array_memory_size() as u64
            + HASH_BYTES_PER_ROW * self.meta.rows
            + 8 * self.by_hash.len() as u64;
        let held = self
            .vectors
            .as_ref()
            .and_then(|v| v.held.as_ref())
            .map_or(0, |h| h.get_array_memory_size() as u64);
        let vectors = held + self.vector().map_or(0, |v| v.extra_bytes() as u64) - nodes;
        let sections = len(GRAPH_SECTION) + len(CODES_SECTION);
        let accounted = text + counts + sections + len(KEYS_SECTION) + len("pk_hashes");
        let parquet = self.cold.as_ref().map_or(0, |c| c.resident_bytes() as u64);
        Resident {
            keys,
            text,
            graph,
            vectors,
            other: hot.saturating_sub(accounted) + parquet,
            whole: 0,
        }
    }

    /// What it holds in memory, by kind.
    pub(crate) fn resident(&self) -> Resident {
        match self.cold {
            Some(_) => self.resident_bytes,
            None => Resident {
                whole: self.weight(),
                ..Resident::default()
            },
        }
    }

    /// The text index of `bundle` (`rows` rows): its held files, and its postings and
    /// positions read through `cold` when they are in the cold part (version 4) and not in
    /// `held` (by section name).
    fn open_text(
        bundle: &Bundle,
        ts: &TextSchema,
        rows: usize,
        cold: Option<&ColdRows>,
        held: &HashMap<String, Bytes>,
        object: &dyn Display,
    ) -> Result<TextIndex> {
        let section = |name: &str| bundle.section(name);
        let c = section("text_token_counts")?;
        if c.len() != rows * ts.fields().len() * 4 {
            return Err(bundle.error("section 'text_token_counts' has the wrong size"));
        }
        let counts = c
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4")))
            .collect();
        let mut files = Vec::new();
        let read = cold.map(|c| Arc::new(c.object().clone()) as Arc<dyn ColdRead>);
        for name in bundle.section_names().filter(|n| n.starts_with("text/")) {
            let file = &name["text/".len()..];
            let f = match read.is_some() && bundle.is_cold(name) {
                true if held.contains_key(name) => TextFile::Hot(held[name].clone()),
                true => {
                    let r = bundle.cold_range(name)?;
                    TextFile::Cold {
                        at: r.start,
                        len: r.end - r.start,
                        pieces: section(&format!("{TEXT_PIECES}{file}"))?,
                    }
                }
                false => TextFile::Hot(section(name)?),
            };
            files.push((file.to_string(), f));
        }
        TextIndex::open(ts, files, counts, read)
            .map_err(|e| e.corrupt_in(object, "generation text index"))
    }

    /// The generation of `bundle` whose rows (all, or the hot columns with `cold`) are
    /// `resident`: key hashes checked against `pk_hashes`, text index and graph opened.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        bundle: &Bundle,
        schema: &SchemaRef,
        spec: IndexSpec<'_>,
        object: &dyn Display,
        resident: RecordBatch,
        cold: Option<ColdRows>,
        vectors: Option<ColdVectors>,
        hot_bytes: u64,
        held_text: &HashMap<String, Bytes>,
    ) -> Result<Self> {
        let started = std::time::Instant::now();
        let bad = |m: String| bundle.error(m);
        let section = |name: &str| bundle.section(name);
        let rows = resident.num_rows();
        if rows as u64 != bundle.stats().rows {
            return Err(bad(format!(
                "holds {rows} rows, its directory says {}",
                bundle.stats().rows
            )));
        }
        let row_hashes = row_hashes(&resident).map_err(|m| bad(m.into()))?;
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
                VectorIndex::open_hnsw_dump(&resident, col, metric, &section("hnsw/meta")?, || {
                    Ok((section("hnsw/graph")?, section("hnsw/data")?))
                })
                .map_err(|e| e.corrupt_in(object, "generation vector graph"))?,
            )),
            Some((_, metric, _)) if vectors.as_ref().is_some_and(|v| v.held.is_some()) => {
                let v = vectors.as_ref().expect("checked");
                let held = RecordBatch::try_new(
                    Arc::new(arrow::datatypes::Schema::new(vec![v.field.clone()])),
                    vec![v.held.clone().expect("checked")],
                )?;
                // Its codes too: searches that need not be exact scan them instead of the
                // vectors, and rank the best exactly. Objects of the first version-3 writers
                // have none: their searches scan the vectors.
                let codes = match bundle.section_names().any(|n| n == CODES_SECTION) {
                    true => Some(section(CODES_SECTION)?),
                    false => None,
                };
                Some(Arc::new(
                    VectorIndex::open(&held, 0, metric, &section(GRAPH_SECTION)?)
                        .and_then(|vi| match &codes {
                            Some(c) => vi.with_scan_codes(c, metric, v.dim),
                            None => Ok(vi),
                        })
                        .map_err(|e| e.corrupt_in(object, "generation vector graph"))?,
                ))
            }
            Some((_, metric, _)) if vectors.is_some() => {
                let dim = vectors.as_ref().map_or(0, |v| v.dim);
                Some(Arc::new(
                    VectorIndex::open_codes(
                        rows,
                        dim,
                        metric,
                        &section(GRAPH_SECTION)?,
                        &section(CODES_SECTION)?,
                    )
                    .map_err(|e| e.corrupt_in(object, "generation vector graph"))?,
                ))
            }
            Some((col, metric, _)) => Some(Arc::new(
                VectorIndex::open(&resident, col, metric, &section(GRAPH_SECTION)?)
                    .map_err(|e| e.corrupt_in(object, "generation vector graph"))?,
            )),
            None => None,
        };
        let t_vector = started.elapsed();
        let text = match spec.text {
            Some(ts) => Some(Self::open_text(
                bundle,
                ts,
                rows,
                cold.as_ref(),
                held_text,
                object,
            )?),
            None => None,
        };
        tracing::debug!(
            "opened {object} ({} bytes, {rows} rows): rows {:?}, vector {:?}, text {:?}",
            bundle.len(),
            t_rows,
            t_vector - t_rows,
            started.elapsed() - t_vector
        );
        Ok(Generation {
            meta: bundle.stats().clone(),
            schema: schema.clone(),
            resident,
            cold,
            vectors,
            text,
            vector,
            // The hashes copied, so the bundle's bytes are not kept alive by them.
            by_hash: HashIndex::new(Bytes::copy_from_slice(&h), row_hashes.into_iter()),
            hot_bytes,
            resident_bytes: Resident::default(),
            vector_col: spec.vector.map(|v| v.0),
            object_pin: None,
        })
    }

    /// This generation, holding its object from deletion with `pin` while it lives.
    pub(crate) fn holding(mut self, pin: pins::Pins) -> Self {
        self.object_pin = Some(pin);
        self
    }

    /// What the manifest records about it.
    pub(crate) fn meta(&self) -> &GenerationMeta {
        &self.meta
    }

    /// Approximate bytes it holds in memory, as the cache counts them. Opened from its hot
    /// part: the hot part (keys, key hashes, text index, graph, codes, Parquet metadata) and
    /// [`HASH_BYTES_PER_ROW`] bytes per row of the key hashes' lookup table. Decoded whole:
    /// the object's size instead of the hot part, and what its graph keeps besides (a
    /// half-precision copy of cosine vectors, norms, the bitmap of its nodes a scan builds).
    pub(crate) fn weight(&self) -> u64 {
        let graph = self.vector().map_or(0, |v| v.extra_bytes() as u64);
        let held = match &self.cold {
            Some(c) => {
                let held = self.vectors.as_ref().and_then(|v| v.held.as_ref());
                self.hot_bytes
                    + c.resident_bytes() as u64
                    + held.map_or(0, |h| h.get_array_memory_size() as u64)
            }
            None => self.meta.bytes,
        };
        held + HASH_BYTES_PER_ROW * self.meta.rows + graph
    }

    /// Rows stored: live and tombstones.
    pub(crate) fn num_rows(&self) -> usize {
        self.resident.num_rows()
    }

    /// The stored schema.
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Whether each row is a tombstone.
    pub(crate) fn deleted(&self) -> arrow::array::BooleanArray {
        deleted_flags(&self.resident)
    }

    /// Columns `cols` (stored schema positions) of rows `ords`, in the order given: from
    /// memory, or read by range through the block cache (the pages, and the vectors, of
    /// every column at once).
    pub(crate) async fn read_rows(&self, ords: &[usize], cols: &[usize]) -> Result<Vec<ArrayRef>> {
        let idx = arrow::array::UInt32Array::from_iter_values(ords.iter().map(|r| *r as u32));
        let Some(cold) = &self.cold else {
            return cols
                .iter()
                .map(|c| {
                    Ok(arrow::compute::take(
                        self.resident.column(*c).as_ref(),
                        &idx,
                        None,
                    )?)
                })
                .collect();
        };
        let fetched: Vec<usize> = cols
            .iter()
            .copied()
            .filter(|c| self.held_column(*c).is_none() && Some(*c) != self.vector_col)
            .collect();
        let wants_vectors = cols.iter().any(|c| Some(*c) == self.vector_col);
        let (columns, vectors) = futures::future::try_join(
            async {
                if fetched.is_empty() {
                    Ok(Vec::new())
                } else {
                    cold.read(ords, &fetched).await
                }
            },
            async {
                match wants_vectors {
                    true => self.read_vectors(ords).await.map(Some),
                    false => Ok(None),
                }
            },
        )
        .await?;
        let mut columns = columns.into_iter();
        cols.iter()
            .map(|c| match self.held_column(*c) {
                Some(a) => Ok(arrow::compute::take(a.as_ref(), &idx, None)?),
                None if Some(*c) == self.vector_col => vectors
                    .clone()
                    .ok_or_else(|| Error::internal("vectors missing from a read")),
                None => columns
                    .next()
                    .ok_or_else(|| Error::internal("a column missing from a read")),
            })
            .collect()
    }

    /// The vectors of rows `ords`, in the order given, read by range (a generation opened
    /// from its hot part) or from memory.
    pub(crate) async fn read_vectors(&self, ords: &[usize]) -> Result<ArrayRef> {
        match self.vector_reads(ords)? {
            VectorReads::Done(a) => Ok(a),
            VectorReads::Ranges(cold, reads) => {
                let read = cold.object().read_ranges(&reads.ranges).await?;
                reads.assemble(ords, &read)
            }
        }
    }

    /// [`Generation::read_vectors`] when nothing has to be fetched: every block the vectors
    /// are in is in memory (or the generation holds them); `None`, with nothing read, when not.
    pub(crate) fn vectors_in_memory(&self, ords: &[usize]) -> Option<Result<ArrayRef>> {
        match self.vector_reads(ords) {
            Err(e) => Some(Err(e)),
            Ok(VectorReads::Done(a)) => Some(Ok(a)),
            Ok(VectorReads::Ranges(cold, reads)) => {
                let read = cold.object().read_ranges_in_memory(&reads.ranges)?;
                Some(reads.assemble(ords, &read))
            }
        }
    }

    /// The vectors of rows `ords` when in memory, or the ranges to read them from.
    fn vector_reads(&self, ords: &[usize]) -> Result<VectorReads<'_>> {
        if let Some(held) = self.vectors.as_ref().and_then(|v| v.held.as_ref()) {
            let idx = arrow::array::UInt32Array::from_iter_values(ords.iter().map(|r| *r as u32));
            return Ok(VectorReads::Done(arrow::compute::take(
                held.as_ref(),
                &idx,
                None,
            )?));
        }
        let (Some(cold), Some(v)) = (&self.cold, &self.vectors) else {
            let col = self
                .vector_col
                .ok_or_else(|| Error::internal("vectors of an index without a vector column"))?;
            let idx = arrow::array::UInt32Array::from_iter_values(ords.iter().map(|r| *r as u32));
            return Ok(VectorReads::Done(arrow::compute::take(
                self.resident.column(col).as_ref(),
                &idx,
                None,
            )?));
        };
        let row_bytes = (v.dim * 4) as u64;
        let mut sorted = ords.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.last().is_some_and(|r| *r >= self.num_rows()) {
            return Err(Error::internal("a vector past the generation's rows"));
        }
        // Runs of consecutive rows, one range each, read at once.
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        for &r in &sorted {
            match runs.last_mut() {
                Some(last) if last.end == r => last.end = r + 1,
                _ => runs.push(r..r + 1),
            }
        }
        let ranges: Vec<std::ops::Range<u64>> = runs
            .iter()
            .map(|run| {
                let at = v.range.start + run.start as u64 * row_bytes;
                at..at + run.len() as u64 * row_bytes
            })
            .collect();
        Ok(VectorReads::Ranges(
            cold,
            RowRanges {
                sorted,
                runs,
                ranges,
                vectors: v,
            },
        ))
    }

    /// Columns `cols` of every row, in row order (the vectors as one read of their section).
    pub(crate) async fn read_all(&self, cols: &[usize]) -> Result<Vec<ArrayRef>> {
        self.read_whole(cols, true).await
    }

    /// [`Generation::read_all`], through the block cache or not (`cached`).
    async fn read_whole(&self, cols: &[usize], cached: bool) -> Result<Vec<ArrayRef>> {
        let Some(cold) = &self.cold else {
            return Ok(cols
                .iter()
                .map(|c| self.resident.column(*c).clone())
                .collect());
        };
        let fetched: Vec<usize> = cols
            .iter()
            .copied()
            .filter(|c| self.held_column(*c).is_none() && Some(*c) != self.vector_col)
            .collect();
        let mut got = if fetched.is_empty() {
            Vec::new()
        } else {
            cold.read_all(&fetched, cached).await?
        }
        .into_iter();
        let mut out = Vec::with_capacity(cols.len());
        for c in cols {
            out.push(match self.held_column(*c) {
                Some(a) => a.clone(),
                None if Some(*c) == self.vector_col => self.all_vectors(cold).await?,
                None => got
                    .next()
                    .ok_or_else(|| Error::internal("a column missing from a read"))?,
            });
        }
        Ok(out)
    }

    /// Every row's vector, in one read of the vectors section (not through the cache).
    async fn all_vectors(&self, cold: &ColdRows) -> Result<ArrayRef> {
        let v = self
            .vectors
            .as_ref()
            .ok_or_else(|| Error::internal("vectors of a generation without them"))?;
        if let Some(held) = &v.held {
            return Ok(held.clone());
        }
        let bytes = cold.object().read_direct(v.range.clone()).await?;
        decode_vectors(&v.field, &bytes, &v.valid, self.num_rows())
            .map_err(|m| Error::data(cold.object().path(), format!("generation {m}")))
    }

    /// [`Generation::read_rows`] from a query or blocking thread.
    pub(crate) fn read_rows_blocking(
        &self,
        ords: &[usize],
        cols: &[usize],
    ) -> Result<Vec<ArrayRef>> {
        match &self.cold {
            Some(c) => c.object().block_on(self.read_rows(ords, cols)),
            None => futures::executor::block_on(self.read_rows(ords, cols)),
        }
    }

    /// Run `f` (reads of any of `gens`) to completion from a query or blocking thread, driven
    /// by the runtime of one that reads by range if any does (a generation held whole does
    /// no I/O); `None` without generations.
    pub(crate) fn block_on_any<'a, T>(
        gens: impl IntoIterator<Item = &'a Arc<Generation>> + Clone,
        f: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let driver = gens
            .clone()
            .into_iter()
            .find(|g| g.reads_by_range())
            .or(gens.into_iter().next())?;
        Some(driver.block_on(f))
    }

    /// Fetch `pieces` of its cold text files (a query's postings the postings cache does not
    /// hold, see [`crate::read::TermTable`]) through the block cache and keep them for the
    /// search that reads them next.
    pub(crate) async fn warm(&self, pieces: &[crate::text::ColdPiece]) -> Result<()> {
        let Some(c) = &self.cold else {
            return Ok(());
        };
        if pieces.is_empty() {
            return Ok(());
        }
        let ranges: Vec<_> = pieces.iter().map(|p| p.object_range()).collect();
        let bytes = c.object().read_ranges(&ranges).await?;
        for (p, b) in pieces.iter().zip(&bytes) {
            p.fill(b);
        }
        Ok(())
    }

    /// Where its cold part is read from (a version-3 or later generation opened from its hot
    /// part).
    pub(crate) fn cold_object(&self) -> Option<&ColdObject> {
        self.cold.as_ref().map(|c| c.object())
    }

    /// Whether its rows are read by range (a version-3 generation opened from its hot part).
    pub(crate) fn reads_by_range(&self) -> bool {
        self.cold.is_some()
    }

    /// Run `f` (reads of generations) to completion from a query or blocking thread, the
    /// runtime this generation's reads use serving its I/O.
    pub(crate) fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        match &self.cold {
            Some(c) => c.object().block_on(f),
            None => futures::executor::block_on(f),
        }
    }

    /// [`Generation::read_all`] from a query or blocking thread.
    #[cfg(test)]
    pub(crate) fn read_all_blocking(&self, cols: &[usize]) -> Result<Vec<ArrayRef>> {
        match &self.cold {
            Some(c) => c.object().block_on(self.read_all(cols)),
            None => futures::executor::block_on(self.read_all(cols)),
        }
    }

    /// Every stored row (what a compaction merges).
    pub(crate) async fn all_rows(&self) -> Result<RecordBatch> {
        let cols: Vec<usize> = (0..self.schema.fields().len()).collect();
        Ok(RecordBatch::try_new(
            self.schema.clone(),
            self.read_whole(&cols, false).await?,
        )?)
    }

    /// Stored column `c` when it is held in memory: every column of a generation decoded
    /// whole; the key and `_deleted` of one opened from its hot part.
    fn held_column(&self, c: usize) -> Option<&ArrayRef> {
        if self.cold.is_none() {
            return Some(self.resident.column(c));
        }
        let n = self.schema.fields().len();
        match c {
            0 => Some(self.resident.column(0)),
            c if c == n - 1 => Some(self.resident.column(1)),
            _ => None,
        }
    }

    /// The vector column of every row when it is held in memory (a generation decoded whole,
    /// or a small one that keeps its vectors).
    pub(crate) fn vector_values(&self) -> Option<&ArrayRef> {
        match &self.vectors {
            Some(v) => v.held.as_ref(),
            None => self.held_column(self.vector_col?),
        }
    }

    /// The names of `bundle`'s text sections in its cold part (postings and positions, from
    /// version 4).
    pub(crate) fn cold_text(bundle: &Bundle) -> impl Iterator<Item = &str> {
        bundle
            .section_names()
            .filter(|n| n.starts_with("text/") && bundle.is_cold(n))
    }

    /// The cold section of a generation's vectors (version 3 and later), if any.
    pub(crate) fn cold_vectors(bundle: &Bundle) -> impl Iterator<Item = &str> {
        bundle
            .section_names()
            .filter(|n| *n == VECTORS_SECTION && bundle.is_cold(n))
    }

    /// What a small generation read whole keeps of its cold part (the whole object at hand):
    /// its vectors, which exact scans read, and its postings and positions (version 4), copied
    /// so that the object is not held.
    pub(crate) fn held_parts(bundle: &Bundle) -> Result<Held> {
        let mut text = HashMap::new();
        for name in Self::cold_text(bundle) {
            text.insert(
                name.to_string(),
                Bytes::copy_from_slice(&bundle.section(name)?),
            );
        }
        Ok(Held {
            vectors: bundle
                .section_names()
                .any(|n| n == VECTORS_SECTION)
                .then(|| bundle.section(VECTORS_SECTION))
                .transpose()?,
            text,
        })
    }

    /// The key hash of row `row`, computed from its key (generations do not hold them in row
    /// order).
    pub(crate) fn row_hash(&self, row: usize) -> u64 {
        Key::hash_at(self.resident.column(0).as_ref(), row).unwrap_or(0)
    }

    /// The vector graph, when the schema has a vector column.
    pub(crate) fn vector(&self) -> Option<&Arc<VectorIndex>> {
        self.vector.as_ref()
    }

    /// The full-text index, when the schema has text columns.
    pub(crate) fn text(&self) -> Option<&TextIndex> {
        self.text.as_ref()
    }

    /// The keys of rows `ords`, in the order given (held in memory).
    pub(crate) fn keys(&self, ords: &[usize]) -> Result<ArrayRef> {
        let idx = arrow::array::UInt32Array::from_iter_values(ords.iter().map(|r| *r as u32));
        Ok(arrow::compute::take(
            self.resident.column(0).as_ref(),
            &idx,
            None,
        )?)
    }

    /// The key of `row`.
    pub(crate) fn key_at(&self, row: usize) -> Option<Key> {
        Key::from_array(self.resident.column(0).as_ref(), row)
    }

    /// The row holding `key` (whose hash is `hash`), if this generation has one; `key` is only
    /// computed on a hash hit, and a hit is confirmed on the exact key.
    pub(crate) fn row_of_key(&self, hash: u64, key: impl FnOnce() -> Option<Key>) -> Option<usize> {
        let mut rows = self.by_hash.rows(self.by_hash.find(hash)?);
        let key = key();
        // One row, unless two keys of this generation share the hash.
        rows.find(|r| self.key_at(*r) == key)
    }

    /// Its rows by key hash.
    pub(crate) fn by_hash(&self) -> &HashIndex {
        &self.by_hash
    }
}

/// Where the vectors of some rows are: in hand, or in ranges of the cold part.
enum VectorReads<'a> {
    Done(ArrayRef),
    Ranges(&'a ColdRows, RowRanges<'a>),
}

/// The ranges holding the vectors of some rows: `sorted` (each row once), in `runs` of
/// consecutive rows, each run one of `ranges`.
struct RowRanges<'a> {
    sorted: Vec<usize>,
    runs: Vec<std::ops::Range<usize>>,
    ranges: Vec<std::ops::Range<u64>>,
    vectors: &'a ColdVectors,
}

impl RowRanges<'_> {
    /// The vectors of rows `ords`, in the order given, from `read` (the bytes of each
    /// of the ranges).
    fn assemble(&self, ords: &[usize], read: &[Bytes]) -> Result<ArrayRef> {
        let v = self.vectors;
        let row_bytes = v.dim * 4;
        let mut at_sorted: Vec<&[u8]> = Vec::with_capacity(self.sorted.len());
        for (run, bytes) in self.runs.iter().zip(read) {
            for i in 0..run.len() {
                let row = bytes
                    .get(i * row_bytes..(i + 1) * row_bytes)
                    .ok_or_else(|| Error::internal("a read of vectors came back short"))?;
                at_sorted.push(row);
            }
        }
        let mut values = Vec::with_capacity(ords.len() * v.dim);
        for r in ords {
            let i = self
                .sorted
                .binary_search(r)
                .map_err(|_| Error::internal("a vector asked for and not read"))?;
            values.extend(
                at_sorted[i]
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))),
            );
        }
        let nulls =
            NullBuffer::from_iter(ords.iter().map(|r| v.valid[r / 8] & (1 << (r % 8)) != 0));
        let DataType::FixedSizeList(item, dim) = v.field.data_type() else {
            return Err(Error::internal(
                "the vector column is not a fixed-size list",
            ));
        };
        Ok(Arc::new(FixedSizeListArray::try_new(
            item.clone(),
            *dim,
            Arc::new(Float32Array::from(values)),
            Some(nulls),
        )?))
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
        assert_eq!(
            RecordBatch::try_new(
                stored.schema(),
                d.read_all_blocking(&(0..stored.num_columns()).collect::<Vec<_>>())
                    .unwrap()
            )
            .unwrap(),
            stored
        );
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
            w.add_section(n, &replace(n, b.section(n).unwrap()), b.is_cold(n));
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
        for n in orig.section_names().filter(|n| !n.starts_with("text/")) {
            w.add_section(n, &orig.section(n).unwrap(), orig.is_cold(n));
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
