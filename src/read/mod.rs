//! The read path: a snapshot of sources, the live rows of each, the statistics of the dead rows
//! of text indexes, SQL filters, and scans. Searches (`query`) plan over the same snapshot with
//! the same live rows and filters.
//!
//! A *source* is the active memtable, a frozen memtable, the WAL rows a read-only handle
//! replayed, or a generation. Sources are ordered newest first; for each key only the newest
//! version in the snapshot is live, and a tombstone supersedes every older version.

mod columns;
mod dead_rows;
mod filter;
mod live_rows;
pub(crate) mod pool;
mod source;
mod terms;
mod terms_ahead;

pub(crate) use columns::ColumnCache;
pub(crate) use dead_rows::{past_view, DeadRowCache};
pub(crate) use filter::{compile_filter, Filter};
pub(crate) use live_rows::{LiveRowCache, LiveRows};
pub(crate) use source::Source;
pub(crate) use terms::{Looked, TermTable};

use crate::generation::Generation;
use crate::memtable::MemtableView;
use crate::text::TextSchema;
use crate::Result;
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::physical_expr::PhysicalExpr;
use pool::QueryPool;
use source::SourceKey;
use std::sync::Arc;

/// Per source, the rows that pass `filter` (`None` without one), evaluated concurrently on
/// the query pool. A generation's are kept in `columns` under the filter's text (when it has
/// one, see [`Filter::key`]), and found there by the next query with the same filter.
pub(crate) fn filter_rows(
    pool: &QueryPool,
    columns: &ColumnCache,
    sources: &[Source],
    filter: Option<&Filter>,
    user: &SchemaRef,
) -> Result<Vec<Option<Arc<Vec<bool>>>>> {
    let Some(filter) = filter else {
        return Ok(vec![None; sources.len()]);
    };
    let f = &filter.expr;
    let kept: Vec<Option<Arc<Vec<bool>>>> = sources
        .iter()
        .map(|s| match (s, &filter.key) {
            (Source::Generation(g), Some(key)) => columns.passes(g, key),
            _ => None,
        })
        .collect();
    // The columns it names, of every generation it was not kept for at once (decoded ones
    // kept from an earlier query, the others by range, concurrently): one round of reads
    // whatever the number of generations.
    let used = source::filter_columns(f, user);
    let gens: Vec<&Arc<crate::generation::Generation>> = sources
        .iter()
        .zip(&kept)
        .filter_map(|(s, k)| match s {
            Source::Generation(g) if k.is_none() => Some(g),
            _ => None,
        })
        .collect();
    let mut read = match gens.is_empty() {
        true => Vec::new(),
        false => columns.read(&gens, &used)?,
    }
    .into_iter();
    let read: Vec<Option<Vec<arrow::array::ArrayRef>>> = sources
        .iter()
        .zip(&kept)
        .map(|(s, k)| match s {
            Source::Generation(_) if k.is_none() => read.next(),
            _ => None,
        })
        .collect();
    pool.install(|| {
        use rayon::prelude::*;
        sources
            .par_iter()
            .zip(kept)
            .zip(read)
            .map(|((s, k), r)| {
                if let Some(passes) = k {
                    return Ok(Some(passes));
                }
                let passes = Arc::new(s.filter_rows(f, user, r)?);
                if let (Source::Generation(g), Some(key)) = (s, &filter.key) {
                    columns.keep_passes(g, key, passes.clone());
                }
                Ok(Some(passes))
            })
            .collect()
    })
}

/// What a handle keeps between queries: the live rows and the dead-row statistics.
#[derive(Debug, Default)]
pub(crate) struct ReadCaches {
    pub(crate) live: LiveRowCache,
    pub(crate) dead: DeadRowCache,
    /// Decoded columns filters read, and the rows of generations filters pass.
    pub(crate) columns: ColumnCache,
    /// What searches looked up of their terms in generations.
    pub(crate) terms: TermTable,
    /// The generations [`ReadCaches::retain`] last pruned `terms` and `columns` to, sorted.
    pub(crate) generations: std::sync::Mutex<Vec<SourceKey>>,
}

impl ReadCaches {
    /// Drop what is kept for sources `sources` does not hold (flushed memtables, generations
    /// no longer listed), except the generations of the lists of live rows still kept (one of
    /// them may be the list a flush or a compaction is about to make visible).
    fn retain(&self, sources: &[Source]) {
        self.live.retain(sources);
        let kept = self.live.listed();
        let current: std::collections::HashSet<SourceKey> =
            sources.iter().map(SourceKey::of).collect();
        self.dead
            .retain(|k| current.contains(k) || kept.contains(k));
        // What is kept per generation (terms, columns, filters' rows) changes only when the
        // generations do: walked once each time.
        let mut gens: Vec<SourceKey> = current
            .iter()
            .chain(&kept)
            .filter(|k| matches!(k, SourceKey::Generation(..)))
            .copied()
            .collect();
        gens.sort_unstable();
        gens.dedup();
        {
            let mut last = self.generations.lock().unwrap_or_else(|e| e.into_inner());
            if *last == gens {
                return;
            }
            last.clone_from(&gens);
        }
        self.terms.retain(&gens);
        self.columns.retain(&gens);
    }

    /// Compute ahead what the first query over generation list `gens` (oldest first, as a
    /// manifest lists them) would: the live rows of each generation and, with `ts`, the
    /// dead-row statistics of their text indexes (see [`LiveRowCache::compute_ahead`] and
    /// [`DeadRowCache::compute_ahead`]; `recount` as there). A background compaction
    /// computes in the `background` (without `recount`); a flush and a compaction a caller
    /// waits for (`Index::compact`, or one at the generation cap) recount.
    ///
    /// `memtables` (newest first, all newer than `gens`) are what the list will be searched
    /// under: a generation counted here for the first time is counted with the rows they
    /// supersede of it (a merged generation holds the rows the memtables superseded of its
    /// inputs, which a search would otherwise read to count them out).
    pub(crate) fn compute_ahead(
        &self,
        gens: &[&Arc<Generation>],
        memtables: &[MemtableView],
        ts: Option<&TextSchema>,
        background: bool,
    ) -> Result<()> {
        let own = self.live.compute_ahead(gens, background);
        if let Some(ts) = ts {
            let views: Vec<&MemtableView> = memtables.iter().collect();
            let superseded = |g: &Generation| self.live.superseded_ahead(g, &views);
            self.dead
                .compute_ahead(gens, own, &superseded, ts, !background)?;
        }
        // What is kept for generations no kept list names goes (a handle that no longer
        // searches would otherwise keep it for every list it computes).
        let kept = self.live.listed();
        self.dead
            .retain(|k| matches!(k, SourceKey::Memtable(_)) || kept.contains(k));
        Ok(())
    }
}

/// What a query reads, fixed when it starts: its sources, newest first, and the handle's
/// caches of live rows and dead-row statistics.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// Memtable views first (newest first), then generations (newest first).
    pub(crate) sources: Vec<Source>,
    /// The handle's caches.
    pub(crate) caches: Arc<ReadCaches>,
    /// The handle's query threads.
    pub(crate) pool: Arc<QueryPool>,
}

impl Snapshot {
    /// Sources and the caches they are read with; what the caches keep for sources that are
    /// gone is dropped.
    pub(crate) fn new(
        sources: Vec<Source>,
        caches: Arc<ReadCaches>,
        pool: Arc<QueryPool>,
    ) -> Snapshot {
        caches.retain(&sources);
        Snapshot::keeping(sources, caches, pool)
    }

    /// The live rows of each source (generations' computed concurrently on the query pool).
    pub(crate) fn live(&self) -> Vec<LiveRows> {
        self.pool
            .install(|| live_rows::live_rows(&self.sources, &self.caches.live))
    }

    /// Sources read with the caches, leaving what the caches keep for other sources: a read
    /// that is not a search's (reading ahead), whose older view must not drop what a newer
    /// one's searches keep.
    pub(crate) fn keeping(
        sources: Vec<Source>,
        caches: Arc<ReadCaches>,
        pool: Arc<QueryPool>,
    ) -> Snapshot {
        Snapshot {
            sources,
            caches,
            pool,
        }
    }

    /// A cursor over every live row that passes `filter`, projected to `user_schema`, in
    /// batches of at most `batch_rows` rows: newest source first, rows in their source's
    /// order. The filter sees live rows only (a superseded version or a tombstone can never
    /// make it fail). A batch is built only when asked for, so a scan holds one batch at a
    /// time beside the snapshot.
    pub(crate) fn scan(
        self,
        user_schema: SchemaRef,
        filter: Option<Arc<dyn PhysicalExpr>>,
        batch_rows: usize,
    ) -> ScanCursor {
        let all = (0..user_schema.fields().len()).collect();
        let keep = user_schema.fields().len();
        self.scan_columns(&user_schema, all, keep, filter, batch_rows)
    }

    /// A cursor over the live rows reading the user columns `columns` (positions in
    /// `user_schema`) only, filtered by `filter` (compiled against those columns, in that
    /// order), returning the first `keep` of them (the others were read for the filter).
    pub(crate) fn scan_columns(
        self,
        user_schema: &SchemaRef,
        columns: Vec<usize>,
        keep: usize,
        filter: Option<Arc<dyn PhysicalExpr>>,
        batch_rows: usize,
    ) -> ScanCursor {
        let read_schema = match columns.iter().copied().eq(0..user_schema.fields().len()) {
            true => user_schema.clone(),
            false => Arc::new(user_schema.project(&columns).unwrap_or_else(|_| {
                arrow::datatypes::Schema::new(
                    columns
                        .iter()
                        .filter_map(|c| user_schema.fields().get(*c).cloned())
                        .collect::<Vec<_>>(),
                )
            })),
        };
        ScanCursor {
            snapshot: self,
            live: None,
            read_schema,
            columns,
            keep,
            filter,
            batch_rows: batch_rows.max(1),
            source: 0,
            next: 0,
        }
    }
}

/// Where a scan is (see [`Snapshot::scan`]).
pub(crate) struct ScanCursor {
    snapshot: Snapshot,
    /// Computed by the first batch (on the thread that builds it, never the caller's).
    live: Option<Vec<LiveRows>>,
    /// The columns read (positions in the user schema), their schema, and how many of them
    /// (the first) a batch returns.
    columns: Vec<usize>,
    read_schema: SchemaRef,
    keep: usize,
    filter: Option<Arc<dyn PhysicalExpr>>,
    batch_rows: usize,
    /// The source being read, and the row of it to go on from.
    source: usize,
    next: usize,
}

impl Iterator for ScanCursor {
    type Item = Result<RecordBatch>;

    /// The next batch of live rows that pass the filter (never empty), or `None` at the end.
    fn next(&mut self) -> Option<Result<RecordBatch>> {
        if self.live.is_none() {
            self.live = Some(self.snapshot.live());
        }
        loop {
            let live = self.live.as_ref()?.get(self.source)?;
            let ords: Vec<usize> = live.rows_from(self.next).take(self.batch_rows).collect();
            let Some(&last) = ords.last() else {
                self.source += 1;
                self.next = 0;
                continue;
            };
            self.next = last + 1;
            let source = &self.snapshot.sources[self.source];
            match self.batch(source, &ords) {
                Ok(b) if b.num_rows() == 0 => continue,
                other => return Some(other),
            }
        }
    }
}

impl ScanCursor {
    /// The schema of the batches it returns.
    pub(crate) fn schema(&self) -> SchemaRef {
        match self.keep < self.columns.len() {
            true => {
                let keep: Vec<usize> = (0..self.keep).collect();
                Arc::new(self.read_schema.project(&keep).unwrap_or_else(|_| {
                    arrow::datatypes::Schema::new(self.read_schema.fields()[..self.keep].to_vec())
                }))
            }
            false => self.read_schema.clone(),
        }
    }

    /// Rows `ords` of `source`, projected and filtered.
    fn batch(&self, source: &Source, ords: &[usize]) -> Result<RecordBatch> {
        let columns = match self.columns.is_empty() {
            true => Vec::new(),
            false => source.take(ords, &self.columns)?,
        };
        let rows = RecordBatch::try_new_with_options(
            self.read_schema.clone(),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(ords.len())),
        )?;
        let rows = match &self.filter {
            Some(f) => arrow::compute::filter_record_batch(&rows, &filter::evaluate(f, &rows)?)?,
            None => rows,
        };
        Ok(match self.keep < self.columns.len() {
            true => rows.project(&(0..self.keep).collect::<Vec<_>>())?,
            false => rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::RowFlags;
    use crate::schema::IndexSchema;
    use arrow::array::{ArrayRef, StringArray};
    use std::sync::atomic::{AtomicUsize, Ordering};

    pub(super) fn text_generation(
        ts: &TextSchema,
        id: u64,
        keys: &[&str],
        text: &str,
    ) -> Arc<Generation> {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t"]}"#).unwrap();
        let texts: ArrayRef = Arc::new(StringArray::from(vec![text; keys.len()]));
        let keys: ArrayRef = Arc::new(StringArray::from(keys.to_vec()));
        let user = RecordBatch::try_new(s.arrow_schema(), vec![keys, texts]).unwrap();
        let spec = crate::generation::IndexSpec {
            text: Some(ts),
            vector: None,
        };
        let rows = s.to_stored(&user, id).unwrap();
        let (g, _) = Generation::build(id, 1, rows, &s.stored_schema(), spec, None, 1).unwrap();
        Arc::new(g)
    }

    #[test]
    fn a_compaction_computes_ahead_holding_no_lock_a_search_takes() {
        // A compaction computes its list ahead on a thread of the background's priority:
        // while it extends a list of live rows or counts dead rows, a search must find every
        // lock it takes (the kept lists, the dead-row statistics and each source's) free.
        let caches = Arc::new(ReadCaches::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(AtomicUsize::new(0));
        let check: Arc<dyn Fn() + Send + Sync> = {
            let (caches, calls, held) = (caches.clone(), calls.clone(), held.clone());
            Arc::new(move || {
                calls.fetch_add(1, Ordering::SeqCst);
                if !(caches.live.lists_free() && caches.dead.all_free()) {
                    held.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t"]}"#).unwrap();
        let ts = TextSchema::new(&s).unwrap();
        let ts: &TextSchema = &ts;
        let g1 = text_generation(ts, 1, &["a", "b", "c"], "one two");
        let g2 = text_generation(ts, 2, &["a", "d"], "two three");
        let g3 = text_generation(ts, 3, &["b", "e"], "three four");
        // A handle that searched [g1, g2]: their list and dead rows are kept.
        caches.dead.for_source(&Source::Generation(g1.clone()));
        caches
            .compute_ahead(&[&g1, &g2], &[], Some(ts), false)
            .unwrap();
        *caches.live.computing.lock().unwrap() = Some(check.clone());
        *caches.dead.computing.lock().unwrap() = Some(check);
        // A memtable newer than every generation supersedes "e" (of g3) and "c" (of g1).
        let mut m = crate::memtable::Memtable::new(9, s.stored_schema(), None, None).unwrap();
        let keys: ArrayRef = Arc::new(StringArray::from(vec!["e", "c", "z"]));
        let texts: ArrayRef = Arc::new(StringArray::from(vec!["five"; 3]));
        let user = RecordBatch::try_new(s.arrow_schema(), vec![keys, texts]).unwrap();
        m.apply(s.to_stored(&user, 10).unwrap()).unwrap();
        // A list extending it, computed ahead at the background's priority under the memtable.
        caches
            .compute_ahead(&[&g1, &g2, &g3], &[m.keys_view().unwrap()], Some(ts), true)
            .unwrap();
        assert!(
            calls.load(Ordering::SeqCst) >= 2,
            "the list was extended and g3 counted"
        );
        assert_eq!(held.load(Ordering::SeqCst), 0, "a lock was held");
        // What it computed is kept: g3's dead rows and the extended list. g3, counted for
        // the first time, is counted under the memtable: its row "e" is dead.
        assert!(caches.dead.holds(&SourceKey::Generation(3, 1)));
        let g3_dead = caches.dead.for_source(&Source::Generation(g3.clone()));
        let four = tantivy::Term::from_field_text(ts.fields()[0], "four");
        assert_eq!(g3_dead.lock().unwrap().doc_freq(&four), 1);
        assert_eq!(g3_dead.lock().unwrap().tokens(0), 2);
        // Nothing is kept for a memtable no search asked about.
        assert!(!caches.live.keeps_memtable(9));
        let own = caches.live.compute_ahead(&[&g1, &g2, &g3], false);
        let flags: Vec<Vec<bool>> = own.iter().map(RowFlags::to_vec).collect();
        assert_eq!(
            flags,
            vec![vec![false, false, true], vec![true, true], vec![true, true]]
        );
        // The hooks hold the caches: break the cycle.
        *caches.live.computing.lock().unwrap() = None;
        *caches.dead.computing.lock().unwrap() = None;
    }
}
