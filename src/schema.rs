//! The index schema: primary key, text columns, optional vector column, payload columns; and the
//! validation every appended batch passes before anything is written.

use crate::error::{Error, Result};
use crate::key::{Key, KeyType};
use crate::settings::{GraphParams, Settings};
use arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, BooleanArray, FixedSizeListArray, RecordBatch,
    UInt64Array,
};
use arrow::datatypes::{DataType, Field, Float32Type, Schema, SchemaRef, TimeUnit};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::Arc;

/// Name of the sequence-number column of stored rows (WAL entries and generations).
pub const SEQ_COLUMN: &str = "_seq";
/// Name of the tombstone flag column of stored rows.
pub const DELETED_COLUMN: &str = "_deleted";

/// Analyzers a text column may use (tantivy's built-in tokenizers).
pub const TOKENIZERS: &[&str] = &["default", "en_stem", "whitespace", "raw"];

/// Distance metric of a vector column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Euclidean distance.
    L2,
    /// One minus the cosine similarity.
    Cosine,
    /// Negative dot product.
    Dot,
}

/// The vector column of a schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VectorColumn {
    /// Column name.
    pub column: String,
    /// Number of dimensions; the column is `FixedSizeList<Float32, dim>`.
    pub dim: usize,
    /// Distance metric used by vector search.
    pub metric: Metric,
}

/// The type of a payload column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum PayloadType {
    Utf8,
    Bool,
    Int8,
    Int16,
    Int32,
    Int64,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Float32,
    Float64,
    /// Milliseconds since the Unix epoch, no time zone.
    TimestampMs,
    /// Microseconds since the Unix epoch, no time zone.
    TimestampUs,
    /// Days since the Unix epoch.
    Date32,
}

impl PayloadType {
    /// The Arrow type of the column.
    pub fn data_type(self) -> DataType {
        match self {
            PayloadType::Utf8 => DataType::Utf8,
            PayloadType::Bool => DataType::Boolean,
            PayloadType::Int8 => DataType::Int8,
            PayloadType::Int16 => DataType::Int16,
            PayloadType::Int32 => DataType::Int32,
            PayloadType::Int64 => DataType::Int64,
            PayloadType::Uint8 => DataType::UInt8,
            PayloadType::Uint16 => DataType::UInt16,
            PayloadType::Uint32 => DataType::UInt32,
            PayloadType::Uint64 => DataType::UInt64,
            PayloadType::Float32 => DataType::Float32,
            PayloadType::Float64 => DataType::Float64,
            PayloadType::TimestampMs => DataType::Timestamp(TimeUnit::Millisecond, None),
            PayloadType::TimestampUs => DataType::Timestamp(TimeUnit::Microsecond, None),
            PayloadType::Date32 => DataType::Date32,
        }
    }
}

/// A payload column: stored and returned, filterable, not indexed for search.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadColumn {
    /// Column name.
    pub name: String,
    /// Column type.
    #[serde(rename = "type")]
    pub kind: PayloadType,
}

/// What an index stores, declared once at creation and kept in every manifest.
///
/// JSON form (as read by `lsmsearch init --schema`):
/// `{"primary_key": "id", "text": ["title", "body"], "vector": {"column": "emb", "dim": 128,
/// "metric": "cosine"}, "payload": [{"name": "year", "type": "int64"}]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexSchema {
    /// Name of the primary-key column.
    pub primary_key: String,
    /// Type of the primary-key column. Default `utf8`.
    #[serde(default)]
    pub primary_key_type: KeyType,
    /// Text columns (Utf8), indexed for full-text search. May be absent from a batch (null).
    #[serde(default)]
    pub text: Vec<String>,
    /// Analyzer of each text column by name; absent columns use `default` (tantivy's default
    /// tokenizer: split on non-alphanumeric characters, drop tokens over 40 bytes, lowercase).
    /// `en_stem` adds English stemming; `whitespace` and `raw` are also available.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tokenizer: std::collections::BTreeMap<String, String>,
    /// The optional vector column. When declared, every appended row must carry a finite vector
    /// of exactly `dim` components.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector: Option<VectorColumn>,
    /// Payload columns. May be absent from a batch (null).
    #[serde(default)]
    pub payload: Vec<PayloadColumn>,
}

impl IndexSchema {
    /// Parse the JSON form and check it.
    pub fn from_json(json: &str) -> Result<Self> {
        let s: IndexSchema =
            serde_json::from_str(json).map_err(|e| Error::invalid(format!("schema JSON: {e}")))?;
        s.check()?;
        Ok(s)
    }

    /// Check names are unique, non-empty, not reserved, and the vector dimension is positive.
    pub fn check(&self) -> Result<()> {
        let mut seen = HashSet::new();
        for name in self.column_names() {
            if name.is_empty() {
                return Err(Error::invalid("schema: a column name is empty"));
            }
            if name.starts_with('_') {
                return Err(Error::invalid(format!(
                    "schema: column name '{name}' is reserved (names starting with '_' are used internally)"
                )));
            }
            if !seen.insert(name) {
                return Err(Error::invalid(format!(
                    "schema: column '{name}' is declared twice"
                )));
            }
        }
        for (col, tok) in &self.tokenizer {
            if !self.text.contains(col) {
                return Err(Error::invalid(format!(
                    "schema: tokenizer given for '{col}', which is not a text column"
                )));
            }
            if !TOKENIZERS.contains(&tok.as_str()) {
                return Err(Error::invalid(format!(
                    "schema: unknown tokenizer '{tok}' for column '{col}' (known: {})",
                    TOKENIZERS.join(", ")
                )));
            }
        }
        if let Some(v) = &self.vector {
            if v.dim == 0 || v.dim > 65_536 {
                return Err(Error::invalid(format!(
                    "schema: vector column '{}' has dimension {}; it must be between 1 and 65536",
                    v.column, v.dim
                )));
            }
        }
        Ok(())
    }

    /// Position of the vector column in the Arrow schema, its metric, and the graph parameters.
    pub(crate) fn vector_spec(&self, settings: &Settings) -> Option<(usize, Metric, GraphParams)> {
        let v = self.vector.as_ref()?;
        Some((1 + self.text.len(), v.metric, settings.graph_params()))
    }

    /// The analyzer name of text column `name`.
    pub fn tokenizer_of(&self, name: &str) -> &str {
        self.tokenizer.get(name).map_or("default", String::as_str)
    }

    /// The names of the payload columns, in order: what the benchmarks' searches return
    /// after the key and the score or distance (what every search returned before searches
    /// named their columns), so that figures stay comparable with earlier builds'.
    #[cfg(feature = "cli")]
    pub(crate) fn payload_names(&self) -> Vec<String> {
        self.payload.iter().map(|p| p.name.clone()).collect()
    }

    fn column_names(&self) -> Vec<&str> {
        let mut names = vec![self.primary_key.as_str()];
        names.extend(self.text.iter().map(String::as_str));
        if let Some(v) = &self.vector {
            names.push(v.column.as_str());
        }
        names.extend(self.payload.iter().map(|p| p.name.as_str()));
        names
    }

    fn vector_type(v: &VectorColumn) -> DataType {
        DataType::FixedSizeList(
            Arc::new(Field::new("item", DataType::Float32, true)),
            v.dim as i32,
        )
    }

    /// The Arrow schema of the rows an application appends and reads back.
    pub fn arrow_schema(&self) -> SchemaRef {
        let mut fields = vec![Field::new(
            &self.primary_key,
            self.primary_key_type.data_type(),
            false,
        )];
        fields.extend(
            self.text
                .iter()
                .map(|t| Field::new(t, DataType::Utf8, true)),
        );
        if let Some(v) = &self.vector {
            fields.push(Field::new(&v.column, Self::vector_type(v), false));
        }
        fields.extend(
            self.payload
                .iter()
                .map(|p| Field::new(&p.name, p.kind.data_type(), true)),
        );
        Arc::new(Schema::new(fields))
    }

    /// The Arrow schema of stored rows (WAL and generations): every user column nullable (a
    /// tombstone carries only its key), then `_seq` and `_deleted`.
    pub fn stored_schema(&self) -> SchemaRef {
        let user = self.arrow_schema();
        let mut fields: Vec<Field> = user
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| f.as_ref().clone().with_nullable(i != 0))
            .collect();
        fields.push(Field::new(SEQ_COLUMN, DataType::UInt64, false));
        fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
        Arc::new(Schema::new(fields))
    }

    /// Check an appended batch against the schema and return it in the canonical column order and
    /// types. Absent text and payload columns become nulls. Errors name the column and the row.
    pub fn validate_batch(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        if batch.num_rows() == 0 {
            return Err(Error::invalid(
                "empty batch: a batch must hold at least one row",
            ));
        }
        let declared: HashSet<&str> = self.column_names().into_iter().collect();
        let mut seen = HashSet::new();
        for f in batch.schema().fields() {
            if !declared.contains(f.name().as_str()) {
                return Err(Error::invalid(format!(
                    "unknown column '{}' (the schema declares: {})",
                    f.name(),
                    self.column_names().join(", ")
                )));
            }
            if !seen.insert(f.name().clone()) {
                return Err(Error::invalid(format!(
                    "column '{}' appears twice in the batch",
                    f.name()
                )));
            }
        }
        let n = batch.num_rows();
        let schema = self.arrow_schema();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());

        // Primary key.
        let pk = batch.column_by_name(&self.primary_key).ok_or_else(|| {
            Error::invalid(format!("missing primary-key column '{}'", self.primary_key))
        })?;
        let pk = cast_strings(pk, &self.primary_key_type.data_type(), &self.primary_key)?;
        if let Some(row) = first_null(&pk) {
            return Err(Error::invalid(format!(
                "primary-key column '{}' is null at row {row}",
                self.primary_key
            )));
        }
        columns.push(pk);

        for t in &self.text {
            columns.push(match batch.column_by_name(t) {
                Some(c) => cast_strings(c, &DataType::Utf8, t)?,
                None => new_null_array(&DataType::Utf8, n),
            });
        }

        if let Some(v) = &self.vector {
            let col = batch
                .column_by_name(&v.column)
                .ok_or_else(|| Error::invalid(format!("missing vector column '{}'", v.column)))?;
            columns.push(Arc::new(validate_vector(col, v)?));
        }

        for p in &self.payload {
            let want = p.kind.data_type();
            columns.push(match batch.column_by_name(&p.name) {
                Some(c) => cast_strings(c, &want, &p.name)?,
                None => new_null_array(&want, n),
            });
        }
        Ok(RecordBatch::try_new(schema, columns)?)
    }

    /// Turn a validated user batch into stored rows with sequence numbers `first_seq..`.
    pub(crate) fn to_stored(&self, batch: &RecordBatch, first_seq: u64) -> Result<RecordBatch> {
        let n = batch.num_rows() as u64;
        let mut columns = batch.columns().to_vec();
        columns.push(Arc::new(UInt64Array::from_iter_values(
            first_seq..first_seq + n,
        )));
        columns.push(Arc::new(BooleanArray::from(vec![false; n as usize])));
        Ok(RecordBatch::try_new(self.stored_schema(), columns)?)
    }

    /// Stored tombstone rows for `keys`, with sequence numbers `first_seq..`.
    pub(crate) fn tombstones(&self, keys: &ArrayRef, first_seq: u64) -> Result<RecordBatch> {
        let schema = self.stored_schema();
        let n = keys.len();
        let mut columns = vec![keys.clone()];
        for f in schema
            .fields()
            .iter()
            .skip(1)
            .take(schema.fields().len() - 3)
        {
            columns.push(new_null_array(f.data_type(), n));
        }
        columns.push(Arc::new(UInt64Array::from_iter_values(
            first_seq..first_seq + n as u64,
        )));
        columns.push(Arc::new(BooleanArray::from(vec![true; n])));
        Ok(RecordBatch::try_new(schema, columns)?)
    }

    /// Check keys for a delete and return them as a key column.
    pub(crate) fn key_column(&self, keys: &[Key]) -> Result<ArrayRef> {
        if keys.is_empty() {
            return Err(Error::invalid("delete: no keys given"));
        }
        Key::to_array(keys, self.primary_key_type)
    }
}

/// Whether each stored row is a tombstone (all false for batches without `_deleted`).
pub(crate) fn deleted_flags(batch: &RecordBatch) -> BooleanArray {
    batch
        .column_by_name(DELETED_COLUMN)
        .map(|c| c.as_boolean().clone())
        .unwrap_or_else(|| BooleanArray::from(vec![false; batch.num_rows()]))
}

fn first_null(a: &ArrayRef) -> Option<usize> {
    if a.null_count() == 0 {
        return None;
    }
    (0..a.len()).find(|&i| a.is_null(i))
}

/// Accept `want` exactly, or a string variant (LargeUtf8, Utf8View) of a Utf8 column.
fn cast_strings(col: &ArrayRef, want: &DataType, name: &str) -> Result<ArrayRef> {
    let got = col.data_type();
    if got == want {
        return Ok(col.clone());
    }
    let stringy = matches!(got, DataType::LargeUtf8 | DataType::Utf8View);
    let ok_tz_free =
        matches!((got, want), (DataType::Timestamp(a, _), DataType::Timestamp(b, None)) if a == b);
    if (stringy && *want == DataType::Utf8) || ok_tz_free {
        return Ok(arrow::compute::cast(col, want)?);
    }
    Err(Error::invalid(format!(
        "column '{name}' has type {got}, the schema declares {want}"
    )))
}

/// Check dimension, nulls and finiteness; accept `List`/`LargeList` rows of exactly `dim` values.
fn validate_vector(col: &ArrayRef, v: &VectorColumn) -> Result<FixedSizeListArray> {
    let name = &v.column;
    let dim = v.dim;
    let (values, offsets): (ArrayRef, Vec<usize>) = match col.data_type() {
        DataType::FixedSizeList(_, d) => {
            if *d as usize != dim {
                return Err(Error::invalid(format!(
                    "vector column '{name}' has dimension {d}, the schema declares {dim}"
                )));
            }
            let l = col.as_fixed_size_list();
            let vals = l.values().slice(l.value_offset(0) as usize, l.len() * dim);
            (vals, (0..=l.len()).map(|i| i * dim).collect())
        }
        DataType::List(_) => {
            let l = col.as_list::<i32>();
            let base = l.value_offsets()[0] as usize;
            let offs = l.value_offsets().iter().map(|o| *o as usize - base).collect();
            let end = *l.value_offsets().last().unwrap_or(&0) as usize;
            (l.values().slice(base, end - base), offs)
        }
        DataType::LargeList(_) => {
            let l = col.as_list::<i64>();
            let base = l.value_offsets()[0] as usize;
            let offs = l.value_offsets().iter().map(|o| *o as usize - base).collect();
            let end = *l.value_offsets().last().unwrap_or(&0) as usize;
            (l.values().slice(base, end - base), offs)
        }
        other => {
            return Err(Error::invalid(format!(
                "vector column '{name}' has type {other}, the schema declares FixedSizeList<Float32, {dim}>"
            )))
        }
    };
    if values.data_type() != &DataType::Float32 {
        let values = arrow::compute::cast(&values, &DataType::Float32).map_err(|_| {
            Error::invalid(format!(
                "vector column '{name}' has {} components, expected Float32",
                values.data_type()
            ))
        })?;
        return validate_vector_values(col, values, offsets, v);
    }
    validate_vector_values(col, values, offsets, v)
}

fn validate_vector_values(
    col: &ArrayRef,
    values: ArrayRef,
    offsets: Vec<usize>,
    v: &VectorColumn,
) -> Result<FixedSizeListArray> {
    let name = &v.column;
    let dim = v.dim;
    let rows = col.len();
    for row in 0..rows {
        if col.is_null(row) {
            return Err(Error::invalid(format!(
                "vector column '{name}' is null at row {row}"
            )));
        }
        let len = offsets[row + 1] - offsets[row];
        if len != dim {
            return Err(Error::invalid(format!(
                "vector column '{name}' has {len} components at row {row}, the schema declares dimension {dim}"
            )));
        }
    }
    let f = values.as_primitive::<Float32Type>();
    let mut out = Vec::with_capacity(rows * dim);
    for row in 0..rows {
        for i in offsets[row]..offsets[row + 1] {
            if f.is_null(i) {
                return Err(Error::invalid(format!(
                    "vector column '{name}' has a null component at row {row}, component {}",
                    i - offsets[row]
                )));
            }
            let x = f.value(i);
            if !x.is_finite() {
                return Err(Error::invalid(format!(
                    "vector column '{name}' has a non-finite value ({x}) at row {row}, component {}",
                    i - offsets[row]
                )));
            }
            out.push(x);
        }
    }
    let field = Arc::new(Field::new("item", DataType::Float32, true));
    Ok(FixedSizeListArray::try_new(
        field,
        dim as i32,
        Arc::new(arrow::array::Float32Array::from(out)),
        None,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_json_round_trip_and_checks() {
        let s = IndexSchema::from_json(
            r#"{"primary_key": "id", "text": ["title", "body"], "vector": {"column": "emb", "dim": 4, "metric": "cosine"}, "payload": [{"name": "year", "type": "int64"}]}"#,
        )
        .unwrap();
        assert_eq!(s.primary_key_type, KeyType::Utf8);
        let back = IndexSchema::from_json(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(s, back);
        assert!(IndexSchema::from_json(r#"{"primary_key": "_id"}"#).is_err());
        assert!(IndexSchema::from_json(r#"{"primary_key": "id", "text": ["id"]}"#).is_err());
        assert!(IndexSchema::from_json(
            r#"{"primary_key": "id", "payload": [{"name": "x", "type": "complex"}]}"#
        )
        .is_err());
    }
}
