//! Full-text search: parse once, compute global BM25 statistics over the snapshot's live rows,
//! run one tantivy search per arm with its block list and filter applied inside the collector,
//! merge the arms' top k in DataFusion.

use super::exec::{ArmExec, ArmWork};
use super::source::{live_masks, Source};
use super::{Conjunction, SearchOptions, SCORE_COLUMN};
use crate::index::text::{TextIndex, TextSchema, ROW_FIELD};
use crate::key::Key;
use crate::schema::IndexSchema;
use crate::{Error, Result};
use arrow::array::{Array, ArrayRef, Float32Array, RecordBatch};
use arrow::compute::SortOptions;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::expressions::col;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use std::collections::HashMap;
use std::sync::Arc;
use tantivy::collector::{FilterCollector, TopDocs};
use tantivy::query::{Bm25StatisticsProvider, Query, QueryParser};
use tantivy::schema::IndexRecordOption;
use tantivy::{DocSet, Term, TERMINATED};

fn tv(e: impl std::fmt::Display) -> Error {
    Error::internal(format!("tantivy: {e}"))
}

/// BM25 statistics of the snapshot's live rows, for the query's terms.
#[derive(Debug, Default)]
pub(crate) struct GlobalStats {
    pub docs: u64,
    pub tokens: HashMap<tantivy::schema::Field, u64>,
    pub doc_freq: HashMap<Term, u64>,
}

impl Bm25StatisticsProvider for GlobalStats {
    fn total_num_tokens(&self, field: tantivy::schema::Field) -> tantivy::Result<u64> {
        Ok(self.tokens.get(&field).copied().unwrap_or(0))
    }

    fn total_num_docs(&self) -> tantivy::Result<u64> {
        Ok(self.docs)
    }

    fn doc_freq(&self, term: &Term) -> tantivy::Result<u64> {
        Ok(self.doc_freq.get(term).copied().unwrap_or(0))
    }
}

/// The output schema of a full-text search: key, `_score`, payload columns.
pub(crate) fn output_schema(schema: &IndexSchema) -> SchemaRef {
    let user = schema.arrow_schema();
    let mut fields = vec![user.field(0).clone()];
    fields.push(Field::new(SCORE_COLUMN, DataType::Float32, false));
    for p in &schema.payload {
        fields.push(Field::new(&p.name, p.kind.data_type(), true));
    }
    Arc::new(Schema::new(fields))
}

/// Parse `query` with tantivy's query-parser syntax over every text column.
pub(crate) fn parse_query(
    ts: &TextSchema,
    query: &str,
    conjunction: Conjunction,
) -> Result<Box<dyn Query>> {
    if query.trim().is_empty() {
        return Err(Error::invalid("full-text query is empty"));
    }
    let index = ts.empty_index();
    let mut parser = QueryParser::for_index(&index, ts.fields().to_vec());
    if conjunction == Conjunction::And {
        parser.set_conjunction_by_default();
    }
    let q = parser
        .parse_query(query)
        .map_err(|e| Error::invalid(format!("full-text query '{query}': {e}")))?;
    let mut bad = None;
    q.query_terms(&mut |t, _| {
        if ts.field_position(t.field()).is_none() {
            bad = Some(ts.schema().get_field_name(t.field()).to_string());
        }
    });
    if let Some(f) = bad {
        return Err(Error::invalid(format!(
            "full-text query '{query}': unknown field '{f}' (text columns: {})",
            ts.fields()
                .iter()
                .map(|f| ts.schema().get_field_name(*f))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(q)
}

/// Compile a SQL predicate over the user columns.
pub(crate) fn compile_filter(user: &SchemaRef, filter: &str) -> Result<Arc<dyn PhysicalExpr>> {
    let invalid =
        |e: datafusion::error::DataFusionError| Error::invalid(format!("filter '{filter}': {e}"));
    let ctx = SessionContext::new();
    let df_schema = DFSchema::try_from(user.as_ref().clone())?;
    let expr = ctx.parse_sql_expr(filter, &df_schema).map_err(invalid)?;
    let phys = ctx
        .create_physical_expr(expr, &df_schema)
        .map_err(invalid)?;
    let t = phys.data_type(user).map_err(invalid)?;
    if t != DataType::Boolean {
        return Err(Error::invalid(format!(
            "filter '{filter}': the predicate has type {t}, not Boolean"
        )));
    }
    Ok(phys)
}

pub(crate) fn sort_ordering(
    schema: &SchemaRef,
    score_descending: bool,
    score: &str,
) -> Result<LexOrdering> {
    let key = schema.field(0).name().clone();
    LexOrdering::new(vec![
        PhysicalSortExpr::new(
            col(score, schema)?,
            SortOptions {
                descending: score_descending,
                nulls_first: false,
            },
        ),
        PhysicalSortExpr::new(
            col(&key, schema)?,
            SortOptions {
                descending: false,
                nulls_first: false,
            },
        ),
    ])
    .ok_or_else(|| Error::internal("empty ordering"))
}

/// Build the physical plan of a full-text search over `sources` (newest first).
pub(crate) fn plan(
    schema: &IndexSchema,
    text: Option<&Arc<TextSchema>>,
    sources: Vec<Source>,
    query: &str,
    opts: &SearchOptions,
) -> Result<Arc<dyn ExecutionPlan>> {
    let ts =
        text.ok_or_else(|| Error::invalid("full-text search on an index without text columns"))?;
    if opts.k == 0 {
        return Err(Error::invalid("k must be at least 1"));
    }
    let query: Arc<dyn Query> = Arc::from(parse_query(ts, query, opts.conjunction)?);
    let user = schema.arrow_schema();
    let filter = opts
        .filter
        .as_deref()
        .map(|f| compile_filter(&user, f))
        .transpose()?;
    let out_schema = output_schema(schema);
    let ordering = sort_ordering(&out_schema, true, SCORE_COLUMN)?;

    // Block lists, then each source's text index (a memtable's is caught up here).
    let live = live_masks(&sources);
    let indexes: Vec<TextIndex> = sources
        .iter()
        .map(|s| {
            s.text_index()?
                .ok_or_else(|| Error::internal("a source without a text index"))
        })
        .collect::<Result<_>>()?;

    // Global statistics over the live rows of every source.
    let mut terms: Vec<Term> = Vec::new();
    query.query_terms(&mut |t, _| terms.push(t.clone()));
    terms.sort();
    terms.dedup();
    let mut stats = GlobalStats::default();
    for (i, ti) in indexes.iter().enumerate() {
        let live = &live[i];
        stats.docs += live.count() as u64;
        match &live.hidden {
            // A generation: its totals (cached) minus the rows newer sources hide.
            Some(hidden) => {
                for (pos, field) in ts.fields().iter().enumerate() {
                    let gone: u64 = hidden
                        .iter()
                        .map(|r| ti.tokens(*r as usize, pos) as u64)
                        .sum();
                    *stats.tokens.entry(*field).or_default() += ti.total_tokens(pos) - gone;
                }
                for term in &terms {
                    let df = if hidden.is_empty() {
                        ti.searcher().doc_freq(term).map_err(tv)?
                    } else {
                        live_doc_freq(ti, term, &live.mask)?
                    };
                    *stats.doc_freq.entry(term.clone()).or_default() += df;
                }
            }
            // A memtable: count over its live rows.
            None => {
                for (pos, field) in ts.fields().iter().enumerate() {
                    let sum: u64 = live
                        .mask
                        .iter()
                        .enumerate()
                        .filter(|(_, l)| **l)
                        .map(|(r, _)| ti.tokens(r, pos) as u64)
                        .sum();
                    *stats.tokens.entry(*field).or_default() += sum;
                }
                for term in &terms {
                    *stats.doc_freq.entry(term.clone()).or_default() +=
                        live_doc_freq(ti, term, &live.mask)?;
                }
            }
        }
    }
    let stats = Arc::new(stats);

    let mut arms: Vec<Arc<dyn ExecutionPlan>> = Vec::with_capacity(sources.len());
    for ((source, ti), live) in sources.into_iter().zip(indexes).zip(live) {
        let live_rows = live.count();
        let mut mask = live.mask;
        if let Some(f) = &filter {
            let fm = source.filter_mask(f, &user)?;
            for (m, f) in Arc::make_mut(&mut mask).iter_mut().zip(fm) {
                *m &= f;
            }
        }
        let candidates = mask.iter().filter(|l| **l).count();
        let description = format!(
            "source={}, rows={}, live={live_rows}, candidates={candidates}, k={}",
            source.name, source.rows, opts.k
        );
        let work: ArmWork = {
            let query = query.clone();
            let stats = stats.clone();
            let out_schema = out_schema.clone();
            let k = opts.k;
            let payload: Vec<usize> = (0..schema.payload.len())
                .map(|i| user.fields().len() - schema.payload.len() + i)
                .collect();
            Arc::new(move || {
                search_arm(
                    &source,
                    &ti,
                    query.as_ref(),
                    &stats,
                    &mask,
                    k,
                    &out_schema,
                    &payload,
                )
            })
        };
        arms.push(Arc::new(ArmExec::new(
            "FtsArmExec",
            description,
            out_schema.clone(),
            ordering.clone(),
            work,
        )));
    }
    let union = UnionExec::try_new(arms)?;
    Ok(Arc::new(
        SortPreservingMergeExec::new(ordering, union).with_fetch(Some(opts.k)),
    ))
}

/// Documents containing `term` among the live rows.
fn live_doc_freq(ti: &TextIndex, term: &Term, live: &[bool]) -> Result<u64> {
    let mut n = 0;
    for seg in ti.searcher().segment_readers() {
        let inv = seg.inverted_index(term.field()).map_err(tv)?;
        let Some(mut postings) = inv
            .read_postings(term, IndexRecordOption::Basic)
            .map_err(tv)?
        else {
            continue;
        };
        let rows = seg.fast_fields().u64(ROW_FIELD).map_err(tv)?;
        let mut doc = postings.doc();
        while doc != TERMINATED {
            if let Some(r) = rows.first(doc) {
                if live.get(r as usize).copied().unwrap_or(false) {
                    n += 1;
                }
            }
            doc = postings.advance();
        }
    }
    Ok(n)
}

#[allow(clippy::too_many_arguments)]
fn search_arm(
    source: &Source,
    ti: &TextIndex,
    query: &dyn Query,
    stats: &GlobalStats,
    mask: &Arc<Vec<bool>>,
    k: usize,
    out_schema: &SchemaRef,
    payload: &[usize],
) -> Result<RecordBatch> {
    if stats.docs == 0 || !mask.iter().any(|m| *m) {
        return Ok(RecordBatch::new_empty(out_schema.clone()));
    }
    let m = mask.clone();
    let collector = FilterCollector::new(
        ROW_FIELD.to_string(),
        move |row: u64| m.get(row as usize).copied().unwrap_or(false),
        TopDocs::with_limit(k).order_by_score(),
    );
    let searcher = ti.searcher();
    let hits = searcher
        .search_with_statistics_provider(query, &collector, stats)
        .map_err(tv)?;
    let mut rows: Vec<(f32, usize, Option<Key>)> = Vec::with_capacity(hits.len());
    for (score, addr) in hits {
        let col = searcher
            .segment_reader(addr.segment_ord)
            .fast_fields()
            .u64(ROW_FIELD)
            .map_err(tv)?;
        let row = col
            .first(addr.doc_id)
            .ok_or_else(|| Error::internal("a document without its row number"))?
            as usize;
        rows.push((score, row, source.key_at(row)));
    }
    rows.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.2.cmp(&b.2)));
    if rows.is_empty() {
        return Ok(RecordBatch::new_empty(out_schema.clone()));
    }
    let idx: Vec<(usize, usize)> = rows.iter().map(|(_, r, _)| source.locate(*r)).collect();
    let take = |c: usize| -> Result<ArrayRef> {
        let arrays: Vec<&dyn Array> = source
            .batches
            .iter()
            .map(|b| b.column(c).as_ref())
            .collect();
        Ok(arrow::compute::interleave(&arrays, &idx)?)
    };
    let mut columns = vec![take(0)?];
    columns.push(Arc::new(Float32Array::from_iter_values(
        rows.iter().map(|(s, _, _)| *s),
    )));
    for c in payload {
        columns.push(take(*c)?);
    }
    Ok(RecordBatch::try_new(out_schema.clone(), columns)?)
}
