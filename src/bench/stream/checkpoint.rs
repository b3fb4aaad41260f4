//! Checkpoints: a snapshot read while the writers pause, checked after the stream against
//! one tantivy index and exact vector search.

use super::load::Shared;
use super::report::Checkpoint;
use crate::{IndexSchema, Result, ScanOptions, SearchOptions, VectorSearchOptions};
use arrow::array::{Array, AsArray, Float32Array, RecordBatch};
use arrow::datatypes::Int64Type;

/// Keys and scores (or distances) of a search result, in its order.
pub(super) type Ranked = Vec<(i64, f32)>;

/// [`Ranked`] of a search result.
pub(super) fn ranked(batches: &[RecordBatch]) -> Ranked {
    let mut out = Vec::new();
    for b in batches {
        let keys = b.column(0).as_primitive::<Int64Type>();
        let scores = b
            .column(1)
            .as_any()
            .downcast_ref::<Float32Array>()
            .cloned()
            .unwrap_or_else(|| Float32Array::from(vec![0.0; b.num_rows()]));
        for r in 0..b.num_rows() {
            out.push((keys.value(r), scores.value(r)));
        }
    }
    out
}

/// Vector queries a checkpoint compares with exact search.
pub(super) const VECTOR_PROBES: usize = 50;

/// What a checkpoint reads while the writers wait.
pub(super) struct Snapshot {
    pub(super) t: f64,
    pub(super) rows: Vec<RecordBatch>,
    pub(super) fts: Vec<(String, Ranked)>,
    /// `(graph, exact)` answers: keys and distances.
    pub(super) vector: Vec<(Ranked, Ranked)>,
}

pub(super) async fn snapshot(s: &Shared, t: f64, n: usize) -> Result<Snapshot> {
    let _all = s.pause.write().await;
    let rows = s.index.scan(ScanOptions::default()).await?;
    let mut fts = Vec::new();
    for i in 0..10 {
        let q = &s.queries[(n * 10 + i) % s.queries.len()];
        let got = s.index.search_fts(q, &SearchOptions::with_k(10)).await?;
        fts.push((q.clone(), ranked(&got)));
    }
    let mut vector = Vec::new();
    for i in 0..VECTOR_PROBES {
        let q = &s.query_vectors[(n * VECTOR_PROBES + i) % s.query_vectors.len()];
        let graph = s
            .index
            .search_vector(q, &VectorSearchOptions::default())
            .await?;
        let exact = VectorSearchOptions {
            exact: true,
            ..Default::default()
        };
        let truth = s.index.search_vector(q, &exact).await?;
        vector.push((ranked(&graph), ranked(&truth)));
    }
    Ok(Snapshot {
        t,
        rows,
        fts,
        vector,
    })
}

/// Compare a snapshot's answers with the independent references.
pub(super) fn check(snap: &Snapshot, schema: &IndexSchema) -> Result<Checkpoint> {
    let live_rows = snap.rows.iter().map(RecordBatch::num_rows).sum();
    let mut recall = 0.0;
    for (got, want) in &snap.vector {
        // A graph answer counts when it is as near as the exact k-th: rows with equal
        // vectors (the stream reuses its pool's vectors under new keys) tie, whichever key.
        match want.last() {
            Some((_, kth)) => {
                let bound = kth + 1e-5 * kth.abs().max(1e-3);
                let hits = got
                    .iter()
                    .filter(|(_, d)| *d <= bound)
                    .count()
                    .min(want.len());
                recall += hits as f64 / want.len() as f64;
            }
            None => recall += 1.0,
        }
    }
    let reference = reference::Reference::new(schema, &snap.rows)?;
    let mut mismatches = 0;
    for (q, ours) in &snap.fts {
        let all = reference.search(q)?;
        if !reference::same_ranking(ours, &all, 10) {
            mismatches += 1;
        }
    }
    Ok(Checkpoint {
        t: snap.t,
        live_rows,
        recall_at_10: recall / snap.vector.len().max(1) as f64,
        fts_queries: snap.fts.len(),
        fts_mismatches: mismatches,
    })
}

pub(super) mod reference {
    //! One tantivy index over a snapshot's live rows, with tantivy's own statistics.
    use crate::{Error, IndexSchema, Result};
    use arrow::array::{Array, AsArray, RecordBatch};
    use arrow::datatypes::Int64Type;
    use tantivy::collector::TopDocs;
    use tantivy::query::QueryParser;
    use tantivy::schema::{Field, Value, FAST, STORED, TEXT};
    use tantivy::TantivyDocument;

    pub(super) struct Reference {
        index: tantivy::Index,
        fields: Vec<Field>,
        id: Field,
    }

    impl Reference {
        pub(super) fn new(schema: &IndexSchema, rows: &[RecordBatch]) -> Result<Reference> {
            let mut b = tantivy::schema::Schema::builder();
            let id = b.add_i64_field("id", STORED | FAST);
            let fields: Vec<Field> = schema
                .text
                .iter()
                .map(|c| b.add_text_field(c, TEXT))
                .collect();
            let index = tantivy::Index::create_in_ram(b.build());
            let mut w: tantivy::IndexWriter = index.writer_with_num_threads(1, 100_000_000)?;
            for batch in rows {
                let keys = batch.column(0).as_primitive::<Int64Type>();
                for r in 0..batch.num_rows() {
                    let mut d = TantivyDocument::default();
                    d.add_i64(id, keys.value(r));
                    for (f, name) in fields.iter().zip(&schema.text) {
                        let col = batch
                            .column_by_name(name)
                            .ok_or_else(|| Error::internal("scan without a text column"))?
                            .as_string::<i32>();
                        if !col.is_null(r) {
                            d.add_text(*f, col.value(r));
                        }
                    }
                    w.add_document(d)?;
                }
            }
            w.commit()?;
            Ok(Reference { index, fields, id })
        }

        /// Every match, by score descending then key.
        pub(super) fn search(&self, query: &str) -> Result<Vec<(i64, f32)>> {
            let parser = QueryParser::for_index(&self.index, self.fields.clone());
            let q = parser.parse_query(query)?;
            let searcher = self.index.reader()?.searcher();
            let n = (searcher.num_docs() as usize).max(1);
            let hits = searcher.search(&q, &TopDocs::with_limit(n).order_by_score())?;
            let mut out = Vec::with_capacity(hits.len());
            for (score, addr) in hits {
                let d: TantivyDocument = searcher.doc(addr)?;
                let key = d
                    .get_first(self.id)
                    .and_then(|v| v.as_i64())
                    .ok_or_else(|| Error::internal("reference document without key"))?;
                out.push((key, score));
            }
            out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            Ok(out)
        }
    }

    pub(super) fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1e-6)
    }

    /// `ours` (top k) against every reference match: as many rows, scores equal within 1e-5
    /// relative at every rank, the same keys except among rows tied with the k-th score.
    pub(super) fn same_ranking(ours: &[(i64, f32)], all: &[(i64, f32)], k: usize) -> bool {
        let n = k.min(all.len());
        if ours.len() != n {
            return false;
        }
        for (i, (key, score)) in ours.iter().enumerate() {
            if !close(*score, all[i].1) {
                return false;
            }
            let tied_with_last = close(*score, all[n - 1].1);
            if !tied_with_last && *key != all[i].0 {
                return false;
            }
            if tied_with_last && !all.iter().any(|(k2, s2)| k2 == key && close(*s2, *score)) {
                return false;
            }
        }
        true
    }
}
