//! Search planning and execution over a snapshot ([`crate::read`]): global BM25 statistics,
//! one arm per source with its live rows and filter applied inside, and the DataFusion plan
//! (one leaf with a partition per arm, or its arms gathered in one partition for a vector
//! search → `SortPreservingMergeExec(fetch = k)`).

pub(crate) mod annotate;
pub(crate) mod exec;
pub(crate) mod fts;
pub(crate) mod hybrid;
pub(crate) mod reader;
pub(crate) mod rerank;
pub(crate) mod vector;

pub use annotate::{Highlight, EXPLANATION_COLUMN, HIGHLIGHT_PREFIX};
pub use fts::FtsStatistics;
pub use hybrid::{
    Fusion, HybridSearchOptions, DEFAULT_CANDIDATES, FTS_RANK_COLUMN, FTS_SCORE_COLUMN,
    VECTOR_RANK_COLUMN,
};
pub use vector::VectorSearchOptions;

use serde::{Deserialize, Serialize};

/// How the terms of a full-text query combine when no operator is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Conjunction {
    /// Any term may match (tantivy's query-parser default).
    #[default]
    Or,
    /// Every term must match.
    And,
}

/// Options of a scan.
#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    /// A SQL predicate over the index's columns, e.g. `year >= 2020 AND lang = 'en'`.
    pub filter: Option<String>,
}

/// Options of a search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchOptions {
    /// How many rows to return (at least 1). Default 10.
    pub k: usize,
    /// A SQL predicate over payload columns, applied inside every arm before its top k.
    pub filter: Option<String>,
    /// Default operator between query terms. Default [`Conjunction::Or`].
    pub conjunction: Conjunction,
    /// Return only rows scoring at least this (finite, at least 0), as if the others did not
    /// match: applied before the top `k` and the offset. Default none.
    pub min_score: Option<f32>,
    /// Rows to skip before the `k` returned: the rows ranked `offset..offset + k` (by
    /// `_score` descending, then key), so consecutive pages over one snapshot equal one
    /// search for their rows. With an offset, `offset + k` is at most [`MAX_RESULT_WINDOW`].
    /// Default 0.
    pub offset: usize,
    /// The user columns returned after the key and `_score`, in this order, each once (the
    /// vector too, when named; naming the key or `_score` changes nothing; a name that is not
    /// a column is an error). Read for the top `k` only, after the merge. Default (`None`):
    /// every user column but the vector.
    pub columns: Option<Vec<String>>,
    /// How long the search may take, from its call to its last row: past it the search fails
    /// with an [`crate::ErrorKind::Timeout`] error naming the search and the time it was
    /// given (at least 1 ms), and its work is dropped: arms not started never run, a running
    /// full-text arm stops at its next segment (a generation is one segment: it finishes), and
    /// planning already under way (statistics, reads) finishes on its thread, its result
    /// unused. It bounds the searches (`search_*`, `count_fts`), not `plan_*` nor the SQL
    /// table functions. Default none.
    pub timeout: Option<std::time::Duration>,
    /// Snippets of the matched text columns, each a column `_highlight_<name>` after the
    /// returned columns (see [`Highlight`]). Default none.
    pub highlight: Option<Highlight>,
    /// Each row's score explained, as a column `_explanation` (last): tantivy's
    /// `Explanation` as JSON, built with the global statistics of the live rows (document
    /// frequencies, field lengths, term frequencies), whose `value` is the row's `_score`.
    /// Default false.
    pub explain: bool,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            timeout: None,
            k: 10,
            filter: None,
            conjunction: Conjunction::Or,
            min_score: None,
            offset: 0,
            columns: None,
            highlight: None,
            explain: false,
        }
    }
}

impl SearchOptions {
    /// Options returning the top `k` rows.
    pub fn with_k(k: usize) -> Self {
        SearchOptions {
            k,
            ..Default::default()
        }
    }
}

/// Name of the score column of full-text results.
pub const SCORE_COLUMN: &str = "_score";
/// Name of the distance column of vector results.
pub const DISTANCE_COLUMN: &str = "_distance";

/// The user columns a search returns after the key and its `value` column (`_score` or
/// `_distance`), as positions in the index's Arrow schema: those `columns` names, in that
/// order and each once (naming the key or `value` changes nothing, as both are always
/// returned), or by default every user column but the key and the vector. The columns are
/// read for the top k only, after the merge. A name that is not a column is an error naming
/// it and the index's columns.
pub(crate) fn returned_columns(
    schema: &crate::schema::IndexSchema,
    columns: Option<&[String]>,
    value: &str,
) -> crate::Result<Vec<usize>> {
    let user = schema.arrow_schema();
    let vector = schema.vector.as_ref().map(|v| v.column.as_str());
    let Some(names) = columns else {
        return Ok((1..user.fields().len())
            .filter(|i| Some(user.field(*i).name().as_str()) != vector)
            .collect());
    };
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        if name == value {
            continue;
        }
        let i = user.index_of(name).map_err(|_| {
            let known: Vec<&str> = user.fields().iter().map(|f| f.name().as_str()).collect();
            crate::Error::invalid(format!(
                "column '{name}' is not a column of the index (its columns: {}; and '{value}')",
                known.join(", ")
            ))
        })?;
        if i != 0 && !out.contains(&i) {
            out.push(i);
        }
    }
    Ok(out)
}

/// The schema of a search's rows: the key, `value` (`_score` or `_distance`, a float) and the
/// user columns `columns` (positions in the index's Arrow schema), each nullable.
pub(crate) fn output_schema(
    schema: &crate::schema::IndexSchema,
    value: &str,
    columns: &[usize],
) -> arrow::datatypes::SchemaRef {
    use arrow::datatypes::{DataType, Field, Schema};
    let user = schema.arrow_schema();
    let mut fields = vec![user.field(0).clone()];
    fields.push(Field::new(value, DataType::Float32, false));
    for c in columns {
        let f = user.field(*c);
        fields.push(Field::new(f.name(), f.data_type().clone(), true));
    }
    std::sync::Arc::new(Schema::new(fields))
}

/// The row a page ends at, at most: a search with an `offset` returns rows up to `offset + k`
/// of at most this many (Elasticsearch's `index.max_result_window` has the same default).
/// Every arm ranks its best `offset + k` rows, so a deep page costs what one search for all
/// the rows up to it costs. A search without an offset returns at most every match, whatever
/// its `k`; a scan reads any number of rows.
pub const MAX_RESULT_WINDOW: usize = 10_000;

/// The room an arm's heap of its best `k` rows starts with: `k + 1`, at most 1,024, as
/// a search without an offset may ask for any `k` (up to every match) and an arm's heap grows
/// to what its matches fill, not to what `k` says.
pub(crate) fn heap_capacity(k: usize) -> usize {
    k.saturating_add(1).min(1024)
}

/// The rows a search of `k` rows past `offset` ranks, `offset + k`, checked: an error names
/// what is wrong.
pub(crate) fn result_window(k: usize, offset: usize) -> crate::Result<usize> {
    if k == 0 {
        return Err(crate::Error::invalid("k must be at least 1"));
    }
    if offset == 0 {
        return Ok(k);
    }
    match offset.checked_add(k) {
        Some(w) if w <= MAX_RESULT_WINDOW => Ok(w),
        _ => Err(crate::Error::invalid(format!(
            "offset + k is {offset} + {k}: a page ends at row {MAX_RESULT_WINDOW} at most (a scan reads any number of rows)"
        ))),
    }
}

/// The rows of `merged` (ranked by `value`, see [`exec::ranked_schema`]) within `bound`: a
/// score at least it (`at_least`) or a distance at most it. The rows within form a prefix of
/// the ranking, so the top `offset + k` of them are those of every row, cut there.
pub(crate) fn within(
    merged: std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    value: &str,
    bound: Option<f32>,
    at_least: bool,
) -> crate::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{col, lit, BinaryExpr};
    let Some(bound) = bound else {
        return Ok(merged);
    };
    let op = match at_least {
        true => Operator::GtEq,
        false => Operator::LtEq,
    };
    let predicate = std::sync::Arc::new(BinaryExpr::new(
        col(value, &merged.schema())?,
        op,
        lit(bound),
    ));
    Ok(std::sync::Arc::new(
        datafusion::physical_plan::filter::FilterExec::try_new(predicate, merged)?,
    ))
}

/// The rows of `merged` (ordered, at most `offset + k` of them) past the first `offset`.
pub(crate) fn page(
    merged: std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    offset: usize,
    k: usize,
) -> std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan> {
    match offset {
        0 => merged,
        _ => std::sync::Arc::new(datafusion::physical_plan::limit::GlobalLimitExec::new(
            merged,
            offset,
            Some(k),
        )),
    }
}

/// Run `search` (a `what` search: "full-text", "vector", ...) within `timeout` when one is
/// given: past it the search is dropped, which stops its arms (those not started are skipped,
/// those running stop at their next check), and the error says which search passed what time.
/// Planning work already under way (on a blocking thread and the query pool) finishes
/// there, its result unused.
pub(crate) async fn within_deadline<T>(
    what: &str,
    timeout: Option<std::time::Duration>,
    search: impl std::future::Future<Output = crate::Result<T>>,
) -> crate::Result<T> {
    let Some(t) = timeout else {
        return search.await;
    };
    check_timeout(timeout)?;
    match tokio::time::timeout(t, search).await {
        Ok(r) => r,
        Err(_) => Err(passed(what, t)),
    }
}

/// The error of a `what` search past its `timeout`.
fn passed(what: &str, timeout: std::time::Duration) -> crate::Error {
    crate::Error::timeout(format!(
        "the {what} search passed its timeout of {:.1} ms and was stopped",
        timeout.as_secs_f64() * 1e3
    ))
}

/// An error when `timeout` is zero.
pub(crate) fn check_timeout(timeout: Option<std::time::Duration>) -> crate::Result<()> {
    match timeout {
        Some(t) if t.is_zero() => Err(crate::Error::invalid(
            "timeout is 0: a search needs some time (at least 1 ms), or no timeout",
        )),
        _ => Ok(()),
    }
}

/// `stream` (a `what` search's rows) ending with a timeout error, once `deadline` passes
/// before its last batch; dropping it stops the search's work as dropping `stream` does.
pub(crate) fn stream_within(
    stream: datafusion::execution::SendableRecordBatchStream,
    what: &'static str,
    timeout: Option<std::time::Duration>,
    started: tokio::time::Instant,
) -> datafusion::execution::SendableRecordBatchStream {
    use datafusion::error::DataFusionError;
    use futures::StreamExt;
    // A deadline past what the clock counts is none.
    let Some((t, deadline)) = timeout.and_then(|t| Some((t, started.checked_add(t)?))) else {
        return stream;
    };
    let schema = stream.schema();
    let sleep = Box::pin(tokio::time::sleep_until(deadline));
    let limited = futures::stream::unfold(Some((stream, sleep)), move |state| async move {
        let (mut stream, mut sleep) = state?;
        tokio::select! {
            next = stream.next() => next.map(|b| (b, Some((stream, sleep)))),
            _ = &mut sleep => Some((
                Err(DataFusionError::External(Box::new(passed(what, t)))),
                None,
            )),
        }
    });
    Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, limited))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_timeout_too_long_for_the_clock_is_no_timeout() {
        let schema = std::sync::Arc::new(arrow::datatypes::Schema::empty());
        let empty: datafusion::execution::SendableRecordBatchStream = Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                schema,
                futures::stream::empty(),
            ),
        );
        let t = Some(std::time::Duration::MAX);
        let mut s = stream_within(empty, "full-text", t, tokio::time::Instant::now());
        assert!(futures::StreamExt::next(&mut s).await.is_none());
        let r = within_deadline("full-text", t, async { Ok(7) }).await;
        assert_eq!(r.unwrap(), 7);
    }
}
