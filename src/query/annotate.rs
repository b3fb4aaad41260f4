//! What a full-text search adds to its rows on request, after its columns are read: snippets
//! of the matched text columns with the matched terms marked ([`Highlight`]), and each row's
//! score explained (`_explanation`), both computed with the global statistics of the
//! snapshot's live rows, so they do not depend on how the rows are split into generations.

use crate::schema::IndexSchema;
use crate::text::{DocRows, TextIndex, TextSchema};
use crate::{Error, Result};
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, SchemaRef};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use tantivy::query::{Query, Weight};
use tantivy::snippet::SnippetGenerator;

/// The prefix of the column holding a text column's snippet: `_highlight_body` for `body`.
pub const HIGHLIGHT_PREFIX: &str = "_highlight_";
/// The column holding each row's score explained, as JSON (tantivy's `Explanation`).
pub const EXPLANATION_COLUMN: &str = "_explanation";

/// Snippets of the text columns a full-text search matched, with the matched terms marked, as
/// tantivy's `SnippetGenerator` makes them: the best fragment of at most `max_chars` characters
/// (fragments are ranked by the matched terms they hold, each term weighing `1 / (1 + its
/// document frequency)` over the live rows), its text HTML-escaped (`&`, `<`, `>`, `"`) and
/// each matched term between `pre_tag` and `post_tag`. A row whose column holds no term of the
/// query has a null snippet.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Highlight {
    /// The text columns to highlight, each as a column `_highlight_<name>` after the returned
    /// columns (in this order). Default (`None`): every text column of the index.
    pub columns: Option<Vec<String>>,
    /// The longest fragment, in bytes of UTF-8 as tantivy measures it (at least 1; a
    /// fragment of non-ASCII text holds fewer characters). Default 150.
    pub max_chars: usize,
    /// What comes before a matched term. Default `<b>`.
    pub pre_tag: String,
    /// What comes after a matched term. Default `</b>`.
    pub post_tag: String,
}

impl Default for Highlight {
    fn default() -> Self {
        Highlight {
            columns: None,
            max_chars: 150,
            pre_tag: "<b>".to_string(),
            post_tag: "</b>".to_string(),
        }
    }
}

/// One highlighted column: where its text is among the columns read, and the generator of
/// its snippets.
struct Highlighted {
    /// Position of the text column among the user columns read.
    read_at: usize,
    generator: SnippetGenerator,
}

/// What explains scores: the query's weight over the global statistics (`None` without
/// sources) and each source's text index.
type Explainer = (Option<Arc<dyn Weight>>, Vec<TextIndex>);

/// What a search computes for its rows after their columns are read.
pub(crate) struct Annotations {
    highlights: Vec<Highlighted>,
    pre_tag: String,
    post_tag: String,
    /// The query's weight (over the global statistics; `None` without sources) and each
    /// source's text index, when scores are explained.
    explain: Option<Explainer>,
    /// How many of the columns read are returned (the others were read for snippets only).
    returned: usize,
    schema: SchemaRef,
}

impl std::fmt::Debug for Annotations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Annotations(highlights={}, explain={})",
            self.highlights.len(),
            self.explain.is_some()
        )
    }
}

/// The parts of a prepared full-text search annotations are made of.
pub(crate) struct AnnotationInputs<'a> {
    pub(crate) schema: &'a IndexSchema,
    pub(crate) text: &'a TextSchema,
    pub(crate) query: &'a dyn Query,
    /// Each query term's document frequency over the live rows.
    pub(crate) doc_freq: &'a HashMap<tantivy::Term, u64>,
    /// The query's weight over the global statistics (`None` without sources).
    pub(crate) weight: Option<Arc<dyn Weight>>,
    /// Each source's text index, in snapshot order.
    pub(crate) indexes: Vec<TextIndex>,
}

impl Annotations {
    /// The annotations `highlight` and `explain` ask for, with `columns` the user columns the
    /// search returns (positions in the index's Arrow schema): the columns to read (`columns`
    /// and the highlighted text columns not among them) and the annotations, or `None` when
    /// neither is asked for. A highlighted column that is not a text column is an error.
    pub(crate) fn new(
        input: AnnotationInputs<'_>,
        columns: &[usize],
        highlight: Option<&Highlight>,
        explain: bool,
        base: &SchemaRef,
    ) -> Result<Option<(Vec<usize>, Annotations)>> {
        if highlight.is_none() && !explain {
            return Ok(None);
        }
        let user = input.schema.arrow_schema();
        let mut read = columns.to_vec();
        let mut highlights = Vec::new();
        let mut fields: Vec<Field> = base.fields().iter().map(|f| f.as_ref().clone()).collect();
        let (mut pre_tag, mut post_tag) = (String::new(), String::new());
        if let Some(h) = highlight {
            if h.max_chars == 0 {
                return Err(Error::invalid(
                    "highlight max_chars is 0: a snippet needs at least 1 character",
                ));
            }
            (pre_tag, post_tag) = (h.pre_tag.clone(), h.post_tag.clone());
            for name in highlighted(input.schema, h)? {
                let col = user.index_of(&name).map_err(|_| {
                    Error::internal(format!("text column '{name}' not in the schema"))
                })?;
                let read_at = match read.iter().position(|c| *c == col) {
                    Some(at) => at,
                    None => {
                        read.push(col);
                        read.len() - 1
                    }
                };
                let field = input.text.schema().get_field(&name)?;
                let generator = snippets(&input, field, h.max_chars)?;
                highlights.push(Highlighted { read_at, generator });
                fields.push(Field::new(
                    format!("{HIGHLIGHT_PREFIX}{name}"),
                    DataType::Utf8,
                    true,
                ));
            }
        }
        let explain = explain.then_some((input.weight, input.indexes));
        if explain.is_some() {
            fields.push(Field::new(EXPLANATION_COLUMN, DataType::Utf8, true));
        }
        Ok(Some((
            read,
            Annotations {
                highlights,
                pre_tag,
                post_tag,
                explain,
                returned: columns.len(),
                schema: Arc::new(arrow::datatypes::Schema::new(fields)),
            },
        )))
    }

    /// The schema of the annotated rows.
    pub(crate) fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// `taken` (key, score, the columns read) annotated: the returned columns, then a snippet
    /// column per highlighted column, then the explanations. `sources` and `ords` give each
    /// row's source (its position in the snapshot) and ordinal in it.
    pub(crate) fn apply(
        &self,
        taken: &RecordBatch,
        sources: &[u32],
        ords: &[u64],
    ) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = taken.columns()[..2 + self.returned].to_vec();
        for h in &self.highlights {
            let text = taken.column(2 + h.read_at);
            let text = arrow::compute::cast(text, &DataType::Utf8)?;
            let text = text.as_string::<i32>();
            let snippets: StringArray = (0..text.len())
                .map(|i| {
                    if text.is_null(i) {
                        return None;
                    }
                    let mut snippet = h.generator.snippet(text.value(i));
                    if snippet.is_empty() {
                        return None;
                    }
                    snippet.set_snippet_prefix_postfix(&self.pre_tag, &self.post_tag);
                    Some(snippet.to_html())
                })
                .collect();
            columns.push(Arc::new(snippets));
        }
        if let Some((weight, indexes)) = &self.explain {
            let explained = match weight {
                Some(w) => explain_rows(w.as_ref(), indexes, sources, ords)?,
                None if sources.is_empty() => Vec::new(),
                None => return Err(Error::internal("rows of a search without sources")),
            };
            columns.push(Arc::new(StringArray::from(explained)));
        }
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

/// The text columns `h` highlights: those it names (each once, each a text column), or every
/// text column.
/// The schema of a full-text search's rows: `base` (key, `_score`, returned columns) with the
/// columns `highlight` and `explain` add, as [`Annotations::new`] adds them.
pub(crate) fn annotated_schema(
    schema: &IndexSchema,
    base: &SchemaRef,
    highlight: Option<&Highlight>,
    explain: bool,
) -> Result<SchemaRef> {
    let mut fields: Vec<Field> = base.fields().iter().map(|f| f.as_ref().clone()).collect();
    if let Some(h) = highlight {
        for name in highlighted(schema, h)? {
            fields.push(Field::new(
                format!("{HIGHLIGHT_PREFIX}{name}"),
                DataType::Utf8,
                true,
            ));
        }
    }
    if explain {
        fields.push(Field::new(EXPLANATION_COLUMN, DataType::Utf8, true));
    }
    Ok(Arc::new(arrow::datatypes::Schema::new(fields)))
}

fn highlighted(schema: &IndexSchema, h: &Highlight) -> Result<Vec<String>> {
    let Some(names) = &h.columns else {
        return Ok(schema.text.clone());
    };
    let mut out: Vec<String> = Vec::new();
    for name in names {
        if !schema.text.contains(name) {
            return Err(Error::invalid(format!(
                "highlight column '{name}' is not a text column (text columns: {})",
                schema.text.join(", ")
            )));
        }
        if !out.contains(name) {
            out.push(name.clone());
        }
    }
    Ok(out)
}

/// A snippet generator of `field` for the query's terms in it, each weighing `1 / (1 +
/// document frequency)` over the live rows (as tantivy's `SnippetGenerator::create` weighs
/// them over one index's documents), with the field's analyzer.
fn snippets(
    input: &AnnotationInputs<'_>,
    field: tantivy::schema::Field,
    max_chars: usize,
) -> Result<SnippetGenerator> {
    let mut terms: BTreeSet<tantivy::Term> = BTreeSet::new();
    input.query.query_terms(&mut |term, _| {
        if term.field() == field {
            terms.insert(term.clone());
        }
    });
    let mut weights: BTreeMap<String, f32> = BTreeMap::new();
    for term in terms {
        let Some(text) = term.value().as_str().map(str::to_string) else {
            continue;
        };
        let df = input.doc_freq.get(&term).copied().unwrap_or(0);
        if df > 0 {
            weights.insert(text, 1.0 / (1.0 + df as f32));
        }
    }
    let tokenizer = input.text.query_index().tokenizer_for_field(field)?;
    Ok(SnippetGenerator::new(weights, tokenizer, field, max_chars))
}

/// Each row's score explained by `weight`, as JSON: the row is found among its source's
/// segments (a memtable's rows past its last commit among the segments built of them).
fn explain_rows(
    weight: &dyn Weight,
    indexes: &[TextIndex],
    sources: &[u32],
    ords: &[u64],
) -> Result<Vec<Option<String>>> {
    // Per source, the rows asked for, then where each is: (segment, doc).
    let mut wanted: HashMap<usize, HashMap<usize, (usize, tantivy::DocId)>> = HashMap::new();
    for (s, o) in sources.iter().zip(ords) {
        wanted
            .entry(*s as usize)
            .or_default()
            .insert(*o as usize, (usize::MAX, 0));
    }
    let mut segments: HashMap<usize, Vec<tantivy::SegmentReader>> = HashMap::new();
    for (s, rows) in wanted.iter_mut() {
        let ti = indexes
            .get(*s)
            .ok_or_else(|| Error::internal(format!("no text index for source {s}")))?;
        let mut segs: Vec<(tantivy::SegmentReader, DocRows)> = Vec::new();
        for (ord, seg) in ti.segment_readers().enumerate() {
            segs.push((seg.clone(), ti.doc_rows(ord)?));
        }
        for seg in ti.tail_readers()? {
            let rows = DocRows::of_segment(&seg)?;
            segs.push((seg, rows));
        }
        for (n, (seg, doc_rows)) in segs.iter().enumerate() {
            // A generation's table of rows is in row order: each row found by a binary
            // search; a row it misses (a table out of order), and the rows of a memtable's
            // segments, by a pass over the segment's documents.
            let mut left = 0;
            if let DocRows::Table(table) = doc_rows {
                for (row, at) in rows.iter_mut() {
                    match table.binary_search(&(*row as u32)) {
                        Ok(doc) => *at = (n, doc as tantivy::DocId),
                        Err(_) => left += 1,
                    }
                }
            } else {
                left = rows.len();
            }
            if left == 0 {
                continue;
            }
            for doc in 0..seg.max_doc() {
                if let Some(at) = doc_rows.get(doc).and_then(|r| rows.get_mut(&r)) {
                    *at = (n, doc);
                }
            }
        }
        segments.insert(*s, segs.into_iter().map(|(seg, _)| seg).collect());
    }
    sources
        .iter()
        .zip(ords)
        .map(|(s, o)| {
            let (n, doc) = wanted[&(*s as usize)][&(*o as usize)];
            let seg = segments[&(*s as usize)].get(n).ok_or_else(|| {
                Error::internal(format!("row {o} of source {s} is in no segment"))
            })?;
            let explanation = weight.explain(seg, doc)?;
            Ok(Some(serde_json::to_string(&explanation).map_err(|e| {
                Error::internal(format!("an explanation as JSON: {e}"))
            })?))
        })
        .collect()
}
