//! Hybrid search: a full-text part and a vector part over one snapshot, each ranking its
//! candidates exactly as its own search would (global BM25; exact distances), fused by
//! reciprocal rank fusion or by a weighted sum of normalised scores, ordered by the fused
//! score then key; the columns of the rows returned are read once, after the fusion.
//!
//! Both parts are planned and run concurrently over the same sources, live rows and filter,
//! so a row ranked by both is one row (its source and ordinal), and the fused ranking does
//! not depend on how the rows are split into generations.

use super::exec::{take_payload, RankedPlan};
use super::{
    fts, vector, Conjunction, SearchOptions, VectorSearchOptions, DISTANCE_COLUMN,
    MAX_RESULT_WINDOW, SCORE_COLUMN,
};
use crate::read::Snapshot;
use crate::schema::IndexSchema;
use crate::settings::Settings;
use crate::text::TextSchema;
use crate::{Error, Result};
use arrow::array::{Array, ArrayRef, AsArray, Float32Array, RecordBatch, UInt32Array, UInt64Array};
use arrow::compute::{SortColumn, SortOptions};
use arrow::datatypes::{DataType, Field, FieldRef, Schema, UInt32Type, UInt64Type};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::collect;
use std::collections::HashMap;
use std::sync::Arc;

/// Name of the full-text part's BM25 score in hybrid results (null for a row the part did not
/// rank among its candidates).
pub const FTS_SCORE_COLUMN: &str = "_fts_score";
/// Name of the full-text part's rank (from 1) in hybrid results.
pub const FTS_RANK_COLUMN: &str = "_fts_rank";
/// Name of the vector part's rank (from 1) in hybrid results.
pub const VECTOR_RANK_COLUMN: &str = "_vector_rank";

/// How a hybrid search fuses its parts' rankings into `_score`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fusion {
    /// Reciprocal rank fusion: a row scores `Σ 1 / (k + rank)` over the parts that ranked it
    /// among their candidates (ranks from 1). `k` is finite and at least 0; 60 by default.
    Rrf {
        /// The rank constant.
        k: f32,
    },
    /// A weighted sum of each part's normalised score. The full-text part's BM25 score is
    /// divided by the best among its candidates (in 0..=1); the vector part's distance `d`
    /// becomes `(d_max - d) / (d_max - d_min)` over its candidates' distances (1 when they are
    /// all equal; a distance beyond f32, infinite or NaN, counts as the farthest). A part
    /// that did not rank a row adds 0. Weights are finite, at least 0, and sum to more than 0.
    Weighted {
        /// Weight of the full-text part.
        text: f32,
        /// Weight of the vector part.
        vector: f32,
    },
}

impl Default for Fusion {
    fn default() -> Self {
        Fusion::Rrf { k: 60.0 }
    }
}

/// Options of a hybrid search.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridSearchOptions {
    /// How many rows to return (at least 1). Default 10.
    pub k: usize,
    /// Rows to skip before the `k` returned (see [`SearchOptions::offset`]). Default 0.
    pub offset: usize,
    /// A SQL predicate over the index's columns, applied inside both parts before their
    /// candidates are taken.
    pub filter: Option<String>,
    /// The user columns returned after the key, `_score`, `_fts_score`, `_distance`,
    /// `_fts_rank` and `_vector_rank` (see [`SearchOptions::columns`]). Default: every user
    /// column but the vector.
    pub columns: Option<Vec<String>>,
    /// How the parts are fused. Default [`Fusion::Rrf`] with `k` 60.
    pub fusion: Fusion,
    /// Rows each part contributes: its best `candidates`, at least `offset + k`. Default
    /// [`DEFAULT_CANDIDATES`], whatever `k` and `offset`: pages and a larger search agree
    /// while they fuse the same candidates.
    pub candidates: Option<usize>,
    /// Default operator between the text part's terms.
    pub conjunction: Conjunction,
    /// The vector part's candidate list size of graph searches.
    pub ef: Option<usize>,
    /// Rank the vector part exactly (brute force) instead of walking graphs.
    pub exact: bool,
    /// How long the search may take, from its call to its last row: past it the search fails
    /// with an [`crate::ErrorKind::Timeout`] error naming the search and the time it was
    /// given (at least 1 ms), and its work is dropped: arms not started never run, a running
    /// full-text arm stops at its next segment (a generation is one segment: it finishes), and
    /// planning already under way (statistics, reads) finishes on its thread, its result
    /// unused. It bounds the searches (`search_*`, `count_fts`), not `plan_*` nor the SQL
    /// table functions. Default none.
    pub timeout: Option<std::time::Duration>,
}

impl Default for HybridSearchOptions {
    fn default() -> Self {
        HybridSearchOptions {
            timeout: None,
            k: 10,
            offset: 0,
            filter: None,
            columns: None,
            fusion: Fusion::default(),
            candidates: None,
            conjunction: Conjunction::Or,
            ef: None,
            exact: false,
        }
    }
}

impl HybridSearchOptions {
    /// Options returning the top `k` rows.
    pub fn with_k(k: usize) -> Self {
        HybridSearchOptions {
            k,
            ..Default::default()
        }
    }
}

/// Rows each part of a hybrid search contributes by default.
pub const DEFAULT_CANDIDATES: usize = 100;

/// The candidates each part contributes, checked against the rows asked for (`window`,
/// `offset + k`) and [`MAX_RESULT_WINDOW`].
pub(crate) fn candidates(opts: &HybridSearchOptions, window: usize) -> Result<usize> {
    let c = opts.candidates.unwrap_or(DEFAULT_CANDIDATES);
    if c < window {
        return Err(Error::invalid(format!(
            "candidates is {c}, below offset + k ({window}): a hybrid search fuses each part's best candidates; ask for at least offset + k"
        )));
    }
    if c > MAX_RESULT_WINDOW {
        return Err(Error::invalid(format!(
            "candidates is {c}: each part ranks at most {MAX_RESULT_WINDOW} rows"
        )));
    }
    Ok(c)
}

/// The fusion, checked: an error names what is wrong.
pub(crate) fn check_fusion(fusion: Fusion) -> Result<()> {
    match fusion {
        Fusion::Rrf { k } if !(k.is_finite() && k >= 0.0) => Err(Error::invalid(format!(
            "the reciprocal rank fusion's k is {k}: it must be a finite number at least 0"
        ))),
        Fusion::Weighted { text, vector }
            if !(text.is_finite() && vector.is_finite() && text >= 0.0 && vector >= 0.0) =>
        {
            Err(Error::invalid(format!(
                "fusion weights {text} (text) and {vector} (vector) must be finite numbers at least 0"
            )))
        }
        Fusion::Weighted { text, vector } if text + vector <= 0.0 => Err(Error::invalid(
            format!("fusion weights {text} (text) and {vector} (vector) sum to 0"),
        )),
        _ => Ok(()),
    }
}

/// What each part said of one row.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Parts {
    /// The full-text part's rank (from 1) and score.
    pub(crate) fts: Option<(u32, f32)>,
    /// The vector part's rank (from 1) and distance.
    pub(crate) vector: Option<(u32, f32)>,
}

/// The columns a hybrid search adds beside the key and `_score`: naming them among the
/// columns to return changes nothing.
pub(crate) const OWN_COLUMNS: [&str; 4] = [
    FTS_SCORE_COLUMN,
    DISTANCE_COLUMN,
    FTS_RANK_COLUMN,
    VECTOR_RANK_COLUMN,
];

/// The hybrid search of `query` and `vector_query` over `snapshot`.
pub(crate) async fn search(
    schema: &IndexSchema,
    text: Option<Arc<TextSchema>>,
    settings: &Settings,
    snapshot: Snapshot,
    query: &str,
    vector_query: &[f32],
    opts: &HybridSearchOptions,
) -> Result<Vec<RecordBatch>> {
    let window = super::result_window(opts.k, opts.offset)?;
    let candidates = candidates(opts, window)?;
    check_fusion(opts.fusion)?;
    // The names of the hybrid's own columns are always returned: naming them changes nothing.
    let named: Option<Vec<String>> = opts.columns.as_ref().map(|c| {
        c.iter()
            .filter(|n| !OWN_COLUMNS.contains(&n.as_str()))
            .cloned()
            .collect()
    });
    let columns = super::returned_columns(schema, named.as_deref(), SCORE_COLUMN)?;
    let text_opts = SearchOptions {
        k: candidates,
        offset: 0,
        filter: opts.filter.clone(),
        conjunction: opts.conjunction,
        min_score: None,
        columns: Some(Vec::new()),
        timeout: None,
        highlight: None,
        explain: false,
    };
    let vector_opts = VectorSearchOptions {
        k: candidates,
        offset: 0,
        filter: opts.filter.clone(),
        ef: opts.ef,
        exact: opts.exact,
        max_distance: None,
        columns: Some(Vec::new()),
        timeout: None,
    };
    // Both parts planned at once, then run at once.
    let (s1, t1, q1) = (schema.clone(), text.clone(), query.to_string());
    let snap1 = snapshot.clone();
    let text_plan = tokio::task::spawn_blocking(move || {
        fts::plan_ranked(&s1, t1.as_ref(), snap1, &q1, &text_opts, None)
    });
    let (s2, set2, v2) = (schema.clone(), settings.clone(), vector_query.to_vec());
    let vector_plan = tokio::task::spawn_blocking(move || {
        vector::plan_ranked(&s2, &set2, snapshot, &v2, &vector_opts)
    });
    let (text_plan, vector_plan) = futures::future::try_join(text_plan, vector_plan).await?;
    let (text_part, vector_part): (RankedPlan, RankedPlan) = (text_plan?, vector_plan?);
    let (text_rows, vector_rows) = futures::future::try_join(
        collect(text_part.merged.clone(), Arc::new(TaskContext::default())),
        collect(vector_part.merged.clone(), Arc::new(TaskContext::default())),
    )
    .await?;
    let rows = Ranks::gather(&text_rows, &vector_rows, schema)?;
    let fused = fuse(opts.fusion, &rows.parts);
    let page = rows.page(&fused, opts.offset, opts.k)?;
    rows.output(&page, &fused, schema, columns, &text_part)
        .await
}

/// Every row either part ranked, once (by its source and ordinal), in the order first
/// ranked: what each part said of it and its key.
struct Ranks {
    order: Vec<(u32, u64)>,
    parts: Vec<Parts>,
    keys: ArrayRef,
}

impl Ranks {
    /// The rows of the parts' ranked batches (key, value, source, ordinal).
    fn gather(
        text_rows: &[RecordBatch],
        vector_rows: &[RecordBatch],
        schema: &IndexSchema,
    ) -> Result<Ranks> {
        let mut keys: Vec<ArrayRef> = Vec::new();
        let mut key_rows: Vec<(usize, usize)> = Vec::new();
        let mut at: HashMap<(u32, u64), usize> = HashMap::new();
        let (mut order, mut parts) = (Vec::new(), Vec::<Parts>::new());
        for (part, batches) in [(0, text_rows), (1, vector_rows)] {
            let mut rank = 0u32;
            for b in batches {
                let (value, src, ord) = (
                    b.column(1).as_primitive::<arrow::datatypes::Float32Type>(),
                    b.column(2).as_primitive::<UInt32Type>(),
                    b.column(3).as_primitive::<UInt64Type>(),
                );
                let batch_at = keys.len();
                keys.push(b.column(0).clone());
                for i in 0..b.num_rows() {
                    rank += 1;
                    let id = (src.value(i), ord.value(i));
                    let n = *at.entry(id).or_insert_with(|| {
                        order.push(id);
                        key_rows.push((batch_at, i));
                        parts.push(Parts::default());
                        parts.len() - 1
                    });
                    match part {
                        0 => parts[n].fts = Some((rank, value.value(i))),
                        _ => parts[n].vector = Some((rank, value.value(i))),
                    }
                }
            }
        }
        let refs: Vec<&dyn Array> = keys.iter().map(|k| k.as_ref()).collect();
        let keys = match refs.is_empty() {
            true => arrow::array::new_empty_array(schema.arrow_schema().field(0).data_type()),
            false => arrow::compute::interleave(&refs, &key_rows)?,
        };
        Ok(Ranks { order, parts, keys })
    }

    /// The rows (positions) ranked `offset..offset + k` by `fused` descending, then key.
    fn page(&self, fused: &[f32], offset: usize, k: usize) -> Result<Vec<usize>> {
        page_by(fused, &self.keys, offset, k)
    }

    /// The rows `page` as a hybrid search returns them: key, fused `_score`, each part's
    /// score and rank, then `columns` read from `part`'s sources.
    async fn output(
        &self,
        page: &[usize],
        fused: &[f32],
        schema: &IndexSchema,
        columns: Vec<usize>,
        part: &RankedPlan,
    ) -> Result<Vec<RecordBatch>> {
        let take = UInt32Array::from_iter_values(page.iter().map(|i| *i as u32));
        let ranked_batch = RecordBatch::try_new(
            super::exec::ranked_schema(&super::output_schema(schema, SCORE_COLUMN, &[])),
            vec![
                arrow::compute::take(self.keys.as_ref(), &take, None)?,
                Arc::new(Float32Array::from_iter_values(
                    page.iter().map(|i| fused[*i]),
                )),
                Arc::new(UInt32Array::from_iter_values(
                    page.iter().map(|i| self.order[*i].0),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    page.iter().map(|i| self.order[*i].1),
                )),
            ],
        )?;
        let with_columns = super::output_schema(schema, SCORE_COLUMN, &columns);
        let read = take_payload(
            &ranked_batch,
            &part.sources,
            &part.caches,
            &columns,
            &with_columns,
        )
        .await?;
        let fields: Vec<FieldRef> = read.schema().fields().iter().skip(2).cloned().collect();
        let columns: Vec<ArrayRef> = read.columns().iter().skip(2).cloned().collect();
        output_batch(
            schema,
            read.column(0).clone(),
            page,
            fused,
            &self.parts,
            fields,
            columns,
        )
    }
}

/// The positions of the rows ranked `offset..offset + k` by `fused` descending, then by
/// `keys` (the rows' keys, in the same positions) ascending.
pub(crate) fn page_by(
    fused: &[f32],
    keys: &ArrayRef,
    offset: usize,
    k: usize,
) -> Result<Vec<usize>> {
    let descending = SortOptions {
        descending: true,
        nulls_first: false,
    };
    let sorted = arrow::compute::lexsort_to_indices(
        &[
            SortColumn {
                values: Arc::new(Float32Array::from(fused.to_vec())),
                options: Some(descending),
            },
            SortColumn {
                values: keys.clone(),
                options: Some(SortOptions {
                    descending: false,
                    nulls_first: false,
                }),
            },
        ],
        None,
    )?;
    Ok(sorted
        .values()
        .iter()
        .skip(offset)
        .take(k)
        .map(|i| *i as usize)
        .collect())
}

/// The rows `page` (positions in `fused` and `parts`) as a hybrid search returns them: key
/// (`keys`, one per page row), fused `_score`, each part's score and rank, then the user
/// columns `columns` (described by `fields`).
pub(crate) fn output_batch(
    schema: &IndexSchema,
    keys: ArrayRef,
    page: &[usize],
    fused: &[f32],
    parts: &[Parts],
    fields: Vec<FieldRef>,
    columns: Vec<ArrayRef>,
) -> Result<Vec<RecordBatch>> {
    let head = super::output_schema(schema, SCORE_COLUMN, &[]);
    let score = |f: &dyn Fn(&Parts) -> Option<f32>| -> ArrayRef {
        Arc::new(Float32Array::from_iter(page.iter().map(|i| f(&parts[*i]))))
    };
    let rank = |f: &dyn Fn(&Parts) -> Option<u32>| -> ArrayRef {
        Arc::new(UInt32Array::from_iter(page.iter().map(|i| f(&parts[*i]))))
    };
    let mut out_fields: Vec<FieldRef> = vec![
        head.fields()[0].clone(),
        head.fields()[1].clone(),
        Arc::new(Field::new(FTS_SCORE_COLUMN, DataType::Float32, true)),
        Arc::new(Field::new(DISTANCE_COLUMN, DataType::Float32, true)),
        Arc::new(Field::new(FTS_RANK_COLUMN, DataType::UInt32, true)),
        Arc::new(Field::new(VECTOR_RANK_COLUMN, DataType::UInt32, true)),
    ];
    let mut out: Vec<ArrayRef> = vec![
        keys,
        Arc::new(Float32Array::from_iter_values(
            page.iter().map(|i| fused[*i]),
        )),
        score(&|p| p.fts.map(|f| f.1)),
        score(&|p| p.vector.map(|v| v.1)),
        rank(&|p| p.fts.map(|f| f.0)),
        rank(&|p| p.vector.map(|v| v.0)),
    ];
    out_fields.extend(fields);
    out.extend(columns);
    Ok(vec![RecordBatch::try_new(
        Arc::new(Schema::new(out_fields)),
        out,
    )?])
}

/// Each row's fused score.
pub(crate) fn fuse(fusion: Fusion, parts: &[Parts]) -> Vec<f32> {
    match fusion {
        Fusion::Rrf { k } => {
            let k = f64::from(k);
            parts
                .iter()
                .map(|p| {
                    let of = |r: Option<(u32, f32)>| {
                        r.map_or(0.0, |(rank, _)| 1.0 / (k + f64::from(rank)))
                    };
                    (of(p.fts) + of(p.vector)) as f32
                })
                .collect()
        }
        Fusion::Weighted { text, vector } => {
            let best = parts
                .iter()
                .filter_map(|p| p.fts.map(|f| f64::from(f.1)))
                .fold(0.0f64, f64::max);
            // Over the finite distances; one beyond them (infinite, or NaN) counts as the
            // farthest.
            let (near, far) = parts
                .iter()
                .filter_map(|p| p.vector.map(|v| f64::from(v.1)))
                .filter(|d| d.is_finite())
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), d| {
                    (lo.min(d), hi.max(d))
                });
            parts
                .iter()
                .map(|p| {
                    let t = p.fts.map_or(0.0, |f| match best > 0.0 {
                        true => f64::from(f.1) / best,
                        false => 0.0,
                    });
                    let v = p.vector.map_or(0.0, |d| {
                        let d = f64::from(d.1);
                        match (d.is_finite(), far > near) {
                            (false, _) => 0.0,
                            (true, true) => (far - d) / (far - near),
                            (true, false) => 1.0,
                        }
                    });
                    (f64::from(text) * t + f64::from(vector) * v) as f32
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weighted_fusion_of_distances_beyond_f32_stays_a_number() {
        let parts = [
            Parts {
                fts: Some((1, 2.0)),
                vector: Some((1, 1.0)),
            },
            Parts {
                fts: None,
                vector: Some((2, 3.0)),
            },
            Parts {
                fts: Some((2, 1.0)),
                vector: Some((3, f32::INFINITY)),
            },
            Parts {
                fts: None,
                vector: Some((4, f32::NAN)),
            },
        ];
        let fused = fuse(
            Fusion::Weighted {
                text: 0.5,
                vector: 0.5,
            },
            &parts,
        );
        assert!(fused.iter().all(|f| f.is_finite()), "{fused:?}");
        // The finite distances span the scale; one beyond it is the farthest.
        assert_eq!(fused, [1.0, 0.0, 0.25, 0.0]);
        let text_only = fuse(
            Fusion::Weighted {
                text: 1.0,
                vector: 0.0,
            },
            &parts,
        );
        assert_eq!(text_only, [1.0, 0.0, 0.5, 0.0]);
    }
}
