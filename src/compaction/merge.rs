//! The merge: the newest version of each key among the inputs, in sequence order (older inputs
//! first), but for versions a generation newer than the run supersedes (a newer version of a
//! key hides every older one for good, so they are dead); a tombstone is kept unless the run
//! starts at the oldest generation, when nothing older remains for it to hide. The merged generation's vector graph continues the graph of
//! its largest input when it can ([`crate::Settings::compaction_continue_graph`]).

use crate::generation::{Generation, HashIsKey};
use crate::schema::Metric;
use crate::settings::GraphParams;
use crate::vector::graph::Adjacency;
use crate::vector::VectorIndex;
use crate::{Error, Result};
use arrow::array::{BooleanArray, RecordBatch};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

/// The rows of the generation merging `inputs` (adjacent generations, oldest first): the newest
/// version of each key among them, in sequence order; tombstones left out when
/// `drop_tombstones` (nothing older remains for them to hide), and versions `newer` (the
/// generations after the run) supersede left out. What to keep is decided from the keys every
/// generation holds ([`kept_rows`]); then each input's rows are read (`read`) and filtered one
/// input at a time, so that a merge holds the merged rows and one input's, not every input's.
pub(crate) fn merge_rows(
    inputs: &[Arc<Generation>],
    newer: &[Arc<Generation>],
    read: impl Fn(&Arc<Generation>) -> Result<RecordBatch>,
    drop_tombstones: bool,
) -> Result<(RecordBatch, Vec<Vec<bool>>)> {
    let schema = match inputs.first() {
        Some(g) => g.schema().clone(),
        None => return Err(Error::internal("a compaction of no generations")),
    };
    let keep = kept_rows(inputs, newer, drop_tombstones);
    let mut parts = Vec::with_capacity(inputs.len());
    for (g, k) in inputs.iter().zip(&keep) {
        if !k.iter().any(|x| *x) {
            continue;
        }
        let rows = read(g)?;
        parts.push(arrow::compute::filter_record_batch(
            &rows,
            &BooleanArray::from(k.clone()),
        )?);
    }
    Ok((arrow::compute::concat_batches(&schema, &parts)?, keep))
}

/// Per input, which of its rows the merge keeps: the newest version of each key among the
/// inputs unless one of `newer` holds the key, tombstones left out when `drop_tombstones`.
fn kept_rows(
    inputs: &[Arc<Generation>],
    newer: &[Arc<Generation>],
    drop_tombstones: bool,
) -> Vec<Vec<bool>> {
    // Key hash → (input, row) of the newest version seen, newest input first; a hit is confirmed
    // on the exact key, and a true hash collision falls back to asking every newer input.
    let mut seen: HashMap<u64, (usize, usize), BuildHasherDefault<HashIsKey>> =
        HashMap::with_capacity_and_hasher(
            inputs.iter().map(|g| g.num_rows()).sum(),
            Default::default(),
        );
    let mut keep: Vec<Vec<bool>> = vec![Vec::new(); inputs.len()];
    for (i, g) in inputs.iter().enumerate().rev() {
        let deleted = g.deleted();
        let mut mine = vec![false; g.num_rows()];
        for (r, keep) in mine.iter_mut().enumerate() {
            let h = &g.row_hash(r);
            let superseded = match seen.get(h) {
                None => false,
                Some(&(gi, gr)) => {
                    let key = g.key_at(r);
                    inputs[gi].key_at(gr) == key
                        || inputs[i + 1..]
                            .iter()
                            .any(|n| n.row_of_key(*h, || key.clone()).is_some())
                }
            };
            if superseded {
                continue;
            }
            if newer
                .iter()
                .any(|n| n.row_of_key(*h, || g.key_at(r)).is_some())
            {
                continue;
            }
            seen.entry(*h).or_insert((i, r));
            *keep = !(drop_tombstones && deleted.value(r));
        }
        keep[i] = mine;
    }
    keep
}

/// The share of `g`'s rows that `newer` (the generations after it) supersede, estimated
/// from at most `samples` rows spread over it.
pub(crate) fn superseded_share(g: &Generation, newer: &[Arc<Generation>], samples: usize) -> f64 {
    let rows = g.num_rows();
    if rows == 0 || newer.is_empty() {
        return 0.0;
    }
    let step = rows.div_ceil(samples.max(1)).max(1);
    let (mut seen, mut dead) = (0usize, 0usize);
    for r in (0..rows).step_by(step) {
        seen += 1;
        if newer
            .iter()
            .any(|n| n.row_of_key(g.row_hash(r), || g.key_at(r)).is_some())
        {
            dead += 1;
        }
    }
    dead as f64 / seen.max(1) as f64
}

/// The merged generation's graph, continuing the graph of the input with the most rows (its
/// nodes keep their links; the other inputs' rows are inserted), when that input's graph can
/// be continued (see [`VectorIndex::continue_graph`]); `None` to build it afresh.
pub(crate) fn continue_largest(
    inputs: &[Arc<Generation>],
    kept: &[Vec<bool>],
    rows: &RecordBatch,
    col: usize,
    metric: Metric,
    params: GraphParams,
) -> Result<Option<Adjacency>> {
    let Some(largest) = (0..inputs.len()).max_by_key(|i| inputs[*i].num_rows()) else {
        return Ok(None);
    };
    let Some(base) = inputs[largest].vector() else {
        return Ok(None);
    };
    // Merged rows are the kept rows of each input, oldest input first.
    let offset: usize = kept[..largest]
        .iter()
        .map(|k| k.iter().filter(|x| **x).count())
        .sum();
    let mut next = offset as u32;
    let base_rows: Vec<Option<u32>> = kept[largest]
        .iter()
        .map(|k| {
            k.then(|| {
                next += 1;
                next - 1
            })
        })
        .collect();
    VectorIndex::continue_graph(rows, col, metric, params, base, &base_rows)
}
