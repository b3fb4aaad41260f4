//! Sources of a search snapshot and their block lists.

use crate::generation::Generation;
use crate::index::text::{MemTextIndex, TextIndex};
use crate::key::Key;
use crate::memtable::{deleted_flags, KillCache, MemtableView};
use crate::{Error, Result};
use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use datafusion::physical_expr::PhysicalExpr;
use std::collections::HashMap;
use std::sync::Arc;

/// Where a source's text index comes from.
#[derive(Debug, Clone)]
pub(crate) enum SourceText {
    /// A memtable's index, caught up at planning time.
    Mem(Arc<MemTextIndex>),
    /// A generation's index.
    Gen(TextIndex),
    /// The schema has no text columns.
    None,
}

/// A memtable's row hashes (one slice per stored batch) and the generation rows its keys hide.
pub(crate) type MemtableKeys = (Vec<Arc<[u64]>>, Arc<KillCache>);

/// One source of a snapshot: a memtable view or a generation.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub name: String,
    /// Stored batches (index columns, `_seq`, `_deleted`).
    pub batches: Vec<RecordBatch>,
    pub offsets: Vec<usize>,
    pub rows: usize,
    /// `(ordinal, key hash)` of the newest version of each key in the source.
    pub candidates: Arc<Vec<(usize, u64)>>,
    pub text: SourceText,
    /// A generation's vector graph.
    pub vector: Option<Arc<crate::index::vector::VectorIndex>>,
    /// A memtable's vector graph (covering a prefix of its rows).
    pub mem_graph: Option<Arc<crate::index::vector::MemVectorIndex>>,
    /// The generation this source reads.
    pub generation: Option<Arc<Generation>>,
    /// A memtable's row hashes and the generation rows its keys hide.
    pub memtable: Option<MemtableKeys>,
}

impl Source {
    pub fn from_memtable(name: String, v: MemtableView) -> Source {
        Source {
            name,
            batches: v.batches,
            offsets: v.offsets,
            rows: v.rows,
            candidates: Arc::new(v.candidates),
            text: v.text.map_or(SourceText::None, SourceText::Mem),
            vector: None,
            mem_graph: v.graph,
            generation: None,
            memtable: Some((v.row_hashes, v.kills)),
        }
    }

    pub fn from_generation(g: &Arc<Generation>) -> Source {
        Source {
            name: format!("generation {}", g.meta().id),
            batches: vec![g.rows().clone()],
            offsets: vec![0],
            rows: g.rows().num_rows(),
            candidates: g.candidates().clone(),
            text: g.text().cloned().map_or(SourceText::None, SourceText::Gen),
            vector: g.vector().cloned(),
            mem_graph: None,
            generation: Some(g.clone()),
            memtable: None,
        }
    }

    /// (batch, row) of an ordinal.
    pub fn locate(&self, ord: usize) -> (usize, usize) {
        let b = self.offsets.partition_point(|o| *o <= ord) - 1;
        (b, ord - self.offsets[b])
    }

    pub fn key_at(&self, ord: usize) -> Option<Key> {
        let (b, r) = self.locate(ord);
        Key::from_array(self.batches[b].column(0).as_ref(), r)
    }

    /// The text index covering the source's rows (a memtable's index is caught up here).
    pub fn text_index(&self) -> Result<Option<TextIndex>> {
        Ok(match &self.text {
            SourceText::Mem(m) => Some(m.catch_up(&self.batches, self.rows)?),
            SourceText::Gen(t) => Some(t.clone()),
            SourceText::None => None,
        })
    }

    /// Evaluate a predicate over the user columns of every row; nulls count as false.
    pub fn filter_mask(
        &self,
        filter: &Arc<dyn PhysicalExpr>,
        user: &SchemaRef,
    ) -> Result<Vec<bool>> {
        let mut mask = Vec::with_capacity(self.rows);
        let n = user.fields().len();
        for b in &self.batches {
            // The stored schema's first columns are the user columns, all nullable (tombstones).
            let schema = Arc::new(arrow::datatypes::Schema::new(
                b.schema().fields()[..n].to_vec(),
            ));
            let cols: Vec<ArrayRef> = b.columns()[..n].to_vec();
            let ub = RecordBatch::try_new(schema, cols)?;
            let v = filter.evaluate(&ub)?.into_array(ub.num_rows())?;
            let v = v
                .as_any()
                .downcast_ref::<BooleanArray>()
                .ok_or_else(|| Error::invalid("filter: the predicate is not boolean"))?;
            mask.extend((0..v.len()).map(|i| v.is_valid(i) && v.value(i)));
        }
        mask.truncate(self.rows);
        Ok(mask)
    }
}

/// The live rows of one source.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    /// Per row: the newest version of its key in the snapshot, and not a tombstone.
    pub mask: Arc<Vec<bool>>,
    /// For a generation: its rows (not tombstones) that newer sources hide. Statistics of a
    /// generation are its own totals minus these rows.
    pub hidden: Option<Vec<u32>>,
}

impl Live {
    /// Rows the mask admits.
    pub fn count(&self) -> usize {
        self.mask.iter().filter(|l| **l).count()
    }
}

/// The live rows of each source (newest first): the newest version of a key within the source,
/// not a tombstone, and not hidden by a strictly newer source. A newer source's key hashes form
/// the block list; a hash hit is confirmed on the exact key before a row is hidden.
///
/// Memtables come first in a snapshot. Among themselves they are compared here, per search;
/// what newer generations hide of a generation is cached with the generation (it only changes
/// when the generation list does), and what memtables hide of it is kept incrementally by each
/// memtable ([`KillCache`]), so a search does no work proportional to the generations' rows.
pub(crate) fn live_masks(sources: &[Source]) -> Vec<Live> {
    let m = sources
        .iter()
        .take_while(|s| s.generation.is_none())
        .count();
    let mut out: Vec<Live> = memtable_masks(&sources[..m])
        .into_iter()
        .map(|mask| Live {
            mask: Arc::new(mask),
            hidden: None,
        })
        .collect();
    let gens: Vec<&Arc<Generation>> = sources[m..]
        .iter()
        .map(|s| {
            s.generation
                .as_ref()
                .expect("memtables come before generations in a snapshot")
        })
        .collect();
    for (i, g) in gens.iter().enumerate() {
        let base = g.newer_mask(&gens[..i]);
        let mut kills: Vec<u32> = Vec::new();
        for s in &sources[..m] {
            if let Some((hashes, cache)) = &s.memtable {
                kills.extend(cache.hidden_in(g, &s.batches, &s.offsets, hashes, s.rows));
            }
        }
        kills.retain(|r| base.live[*r as usize]);
        kills.sort_unstable();
        kills.dedup();
        let mut hidden = base.hidden.clone();
        let mask = if kills.is_empty() {
            base.live.clone()
        } else {
            let mut live = (*base.live).clone();
            for r in &kills {
                live[*r as usize] = false;
            }
            hidden.extend(kills);
            Arc::new(live)
        };
        out.push(Live {
            mask,
            hidden: Some(hidden),
        });
    }
    out
}

/// Live masks among memtables (newest first), compared key by key.
fn memtable_masks(sources: &[Source]) -> Vec<Vec<bool>> {
    // The newest (source, ordinal) seen for each key hash; a hit is confirmed on the exact key,
    // and a true hash collision falls back to looking the key up in every newer source.
    let mut newer: HashMap<u64, (usize, usize)> = HashMap::new();
    let mut out = Vec::with_capacity(sources.len());
    for (i, s) in sources.iter().enumerate() {
        let mut live = vec![false; s.rows];
        let deleted: Vec<BooleanArray> = s.batches.iter().map(deleted_flags).collect();
        for &(ord, h) in s.candidates.iter() {
            if ord >= s.rows {
                continue;
            }
            let hidden = match newer.get(&h) {
                None => false,
                Some((j, o)) => {
                    let k = s.key_at(ord);
                    sources[*j].key_at(*o) == k || in_any(&sources[..i], h, &k)
                }
            };
            let (b, r) = s.locate(ord);
            live[ord] = !hidden && !deleted[b].value(r);
        }
        if i + 1 < sources.len() {
            for &(ord, h) in s.candidates.iter() {
                if ord < s.rows {
                    newer.entry(h).or_insert((i, ord));
                }
            }
        }
        out.push(live);
    }
    out
}

/// Whether any of `sources` holds `key` (whose hash is `h`): the slow path of a hash collision.
fn in_any(sources: &[Source], h: u64, key: &Option<Key>) -> bool {
    sources.iter().any(|s| {
        s.candidates
            .iter()
            .any(|&(o, hh)| hh == h && o < s.rows && &s.key_at(o) == key)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::IndexSchema;
    use arrow::array::StringArray;

    fn source(name: &str, keys: &[&str], hashes: &[u64], deleted: bool) -> Source {
        let s = IndexSchema::from_json(r#"{"primary_key": "id"}"#).unwrap();
        let keys: ArrayRef = Arc::new(StringArray::from(keys.to_vec()));
        let batch = if deleted {
            s.tombstones(&keys, 1).unwrap()
        } else {
            let user = RecordBatch::try_new(s.arrow_schema(), vec![keys]).unwrap();
            s.to_stored(&user, 1).unwrap()
        };
        Source {
            name: name.into(),
            rows: batch.num_rows(),
            batches: vec![batch],
            offsets: vec![0],
            candidates: Arc::new(hashes.iter().copied().enumerate().collect()),
            text: SourceText::None,
            vector: None,
            mem_graph: None,
            generation: None,
            memtable: None,
        }
    }

    #[test]
    fn a_hash_collision_never_hides_a_live_row() {
        // "b" in the newer source collides with "a" in the older one: "a" must stay live.
        let newer = source("new", &["b", "c"], &[7, 9], false);
        let older = source("old", &["a", "c", "d"], &[7, 9, 11], false);
        let m = live_masks(&[newer, older]);
        assert_eq!(*m[0].mask, vec![true, true]);
        assert_eq!(
            *m[1].mask,
            vec![true, false, true],
            "only the superseded 'c' is hidden"
        );
    }

    #[test]
    fn a_collision_beside_a_real_match_still_hides_the_real_match() {
        // Hash 7 is held by "x" (newest) and "a" (middle); the oldest "a" is superseded by the
        // middle one although the first hash hit is the unrelated "x".
        let newest = source("newest", &["x"], &[7], false);
        let middle = source("middle", &["a"], &[7], true);
        let oldest = source("oldest", &["a", "z"], &[7, 3], false);
        let m = live_masks(&[newest, middle, oldest]);
        assert_eq!(*m[0].mask, vec![true]);
        assert_eq!(*m[1].mask, vec![false], "a tombstone is never live");
        assert_eq!(*m[2].mask, vec![false, true]);
    }
}
