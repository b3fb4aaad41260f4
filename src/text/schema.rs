//! The text schema every source of an index shares: one tantivy field per text column with
//! its analyzer, and the `_row` fast field.

use super::{in_postings, ROW_FIELD};
use crate::schema::{deleted_flags, IndexSchema};
use crate::{Error, Result};
use arrow::array::{Array, AsArray, RecordBatch};
use std::sync::Arc;
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, FAST, INDEXED,
};
use tantivy::TantivyDocument;

/// The tantivy schema shared by every source of an index.
#[derive(Debug, Clone)]
pub(crate) struct TextSchema {
    pub(super) schema: Schema,
    /// An empty in-memory index of the text fields alone, to parse queries with: a query can
    /// name a text column, never the internal `_row` field. Made once: making one writes its
    /// meta file, which cost every parse of a query its share.
    query_index: tantivy::Index,
    /// One field per text column, in schema order.
    pub(super) fields: Vec<Field>,
    /// Column positions of the text columns in the user schema.
    pub(super) columns: Vec<usize>,
    pub(super) row: Field,
}

impl TextSchema {
    /// The text schema of `schema`, or `None` when it declares no text column.
    pub(crate) fn new(schema: &IndexSchema) -> Option<Arc<TextSchema>> {
        if schema.text.is_empty() {
            return None;
        }
        let text_fields = |b: &mut tantivy::schema::SchemaBuilder| -> Vec<Field> {
            schema
                .text
                .iter()
                .map(|name| {
                    let opts = TextOptions::default().set_indexing_options(
                        TextFieldIndexing::default()
                            .set_tokenizer(schema.tokenizer_of(name))
                            .set_index_option(IndexRecordOption::WithFreqsAndPositions),
                    );
                    b.add_text_field(name, opts)
                })
                .collect()
        };
        // Queries are parsed against the text fields alone (added in the same order, so with
        // the same ids): the internal `_row` field is no field of a query.
        let mut q = Schema::builder();
        text_fields(&mut q);
        let query_index = tantivy::Index::create_in_ram(q.build());
        let mut b = Schema::builder();
        let fields = text_fields(&mut b);
        let row = b.add_u64_field(ROW_FIELD, INDEXED | FAST);
        Some(Arc::new(TextSchema {
            schema: b.build(),
            query_index,
            fields,
            columns: (1..=schema.text.len()).collect(),
            row,
        }))
    }

    /// The tantivy schema.
    pub(crate) fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The text fields, in schema order.
    pub(crate) fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Column positions of the text columns in a stored batch, in the order of [`Self::fields`].
    pub(crate) fn columns(&self) -> &[usize] {
        &self.columns
    }

    /// Position of `field` among the text fields.
    pub(crate) fn field_position(&self, field: Field) -> Option<usize> {
        self.fields.iter().position(|f| *f == field)
    }

    /// An empty in-memory index with this schema (used to parse queries and as a template).
    pub(crate) fn empty_index(&self) -> tantivy::Index {
        tantivy::Index::create_in_ram(self.schema.clone())
    }

    /// An empty in-memory index of the text fields alone, to parse queries with: a query can
    /// name a text column, never the internal `_row` field.
    pub(crate) fn query_index(&self) -> &tantivy::Index {
        &self.query_index
    }

    /// Add the non-tombstone rows of `batch` (stored rows) as documents numbered from `first_row`,
    /// and return each row's token count per text field (tombstones count zero).
    pub(super) fn add_rows(
        &self,
        index: &tantivy::Index,
        add: &mut dyn FnMut(TantivyDocument) -> Result<()>,
        batch: &RecordBatch,
        first_row: u64,
    ) -> Result<Vec<u32>> {
        let deleted = deleted_flags(batch);
        let mut analyzers = self
            .fields
            .iter()
            .map(|f| index.tokenizer_for_field(*f).map_err(Error::from))
            .collect::<Result<Vec<_>>>()?;
        let texts: Vec<_> = self
            .columns
            .iter()
            .map(|c| batch.column(*c).as_string::<i32>().clone())
            .collect();
        let mut counts = Vec::with_capacity(batch.num_rows() * self.fields.len());
        for r in 0..batch.num_rows() {
            if deleted.value(r) {
                counts.extend(std::iter::repeat_n(0, self.fields.len()));
                continue;
            }
            let mut doc = TantivyDocument::default();
            doc.add_u64(self.row, first_row + r as u64);
            for (i, col) in texts.iter().enumerate() {
                if col.is_null(r) {
                    counts.push(0);
                    continue;
                }
                let text = col.value(r);
                let mut n = 0u32;
                let mut ts = analyzers[i].token_stream(text);
                while ts.advance() {
                    if in_postings(&ts.token().text) {
                        n += 1;
                    }
                }
                counts.push(n);
                doc.add_text(self.fields[i], text);
            }
            add(doc)?;
        }
        Ok(counts)
    }
}
