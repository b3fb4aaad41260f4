//! An independent reference for full-text results: one tantivy index over the live rows.

use std::collections::BTreeMap;
use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{Schema, Value, STORED, STRING, TEXT};
use tantivy::{Index, TantivyDocument};

/// One document: key and the text of each text column (None = null).
pub type Doc = (String, Vec<Option<String>>);

pub struct Reference {
    index: Index,
    fields: Vec<tantivy::schema::Field>,
    id: tantivy::schema::Field,
}

impl Reference {
    /// A single tantivy index over `docs` (the live rows), text columns named `columns`.
    pub fn new(columns: &[&str], docs: &BTreeMap<String, Vec<Option<String>>>) -> Reference {
        let mut b = Schema::builder();
        let id = b.add_text_field("id", STRING | STORED);
        let fields: Vec<_> = columns.iter().map(|c| b.add_text_field(c, TEXT)).collect();
        let index = Index::create_in_ram(b.build());
        let mut w: tantivy::IndexWriter = index.writer_with_num_threads(1, 50_000_000).unwrap();
        for (key, texts) in docs {
            let mut d = TantivyDocument::default();
            d.add_text(id, key);
            for (f, t) in fields.iter().zip(texts) {
                if let Some(t) = t {
                    d.add_text(*f, t);
                }
            }
            w.add_document(d).unwrap();
        }
        w.commit().unwrap();
        Reference { index, fields, id }
    }

    /// Every match, ordered by score descending then key.
    pub fn search(&self, query: &str, and: bool) -> Vec<(String, f32)> {
        let mut parser = QueryParser::for_index(&self.index, self.fields.clone());
        if and {
            parser.set_conjunction_by_default();
        }
        let q = parser.parse_query(query).unwrap();
        let searcher = self.index.reader().unwrap().searcher();
        let n = (searcher.num_docs() as usize).max(1);
        let hits = searcher
            .search(&q, &TopDocs::with_limit(n).order_by_score())
            .unwrap();
        let mut out: Vec<(String, f32)> = hits
            .into_iter()
            .map(|(s, a)| {
                let d: TantivyDocument = searcher.doc(a).unwrap();
                let key = d.get_first(self.id).unwrap().as_str().unwrap().to_string();
                (key, s)
            })
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }
}

impl Reference {
    /// `key`'s score for `query` explained by tantivy, as JSON (`None`: no match).
    #[allow(dead_code)]
    pub fn explain(&self, query: &str, key: &str) -> Option<serde_json::Value> {
        let parser = QueryParser::for_index(&self.index, self.fields.clone());
        let q = parser.parse_query(query).unwrap();
        let searcher = self.index.reader().unwrap().searcher();
        let n = (searcher.num_docs() as usize).max(1);
        let hits = searcher
            .search(&q, &TopDocs::with_limit(n).order_by_score())
            .unwrap();
        let at = hits.into_iter().find_map(|(_, a)| {
            let d: TantivyDocument = searcher.doc(a).unwrap();
            (d.get_first(self.id).unwrap().as_str() == Some(key)).then_some(a)
        })?;
        let e = q.explain(&searcher, at).unwrap();
        Some(serde_json::to_value(&e).unwrap())
    }

    /// The snippet tantivy's `SnippetGenerator` makes of `text` in text column `column` for
    /// `query`: at most `max_chars`, matched terms between `pre` and `post` (`None`: no term).
    #[allow(dead_code)]
    pub fn snippet(
        &self,
        query: &str,
        column: usize,
        text: &str,
        max_chars: usize,
        (pre, post): (&str, &str),
    ) -> Option<String> {
        let parser = QueryParser::for_index(&self.index, self.fields.clone());
        let q = parser.parse_query(query).unwrap();
        let searcher = self.index.reader().unwrap().searcher();
        let mut g =
            tantivy::snippet::SnippetGenerator::create(&searcher, q.as_ref(), self.fields[column])
                .unwrap();
        g.set_max_num_chars(max_chars);
        let mut snippet = g.snippet(text);
        if snippet.is_empty() {
            return None;
        }
        snippet.set_snippet_prefix_postfix(pre, post);
        Some(snippet.to_html())
    }
}

fn close_with(a: f32, b: f32, floor: f32) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(floor)
}

/// Check `ours` (top k) against every reference match: same length min(k, matches), scores equal
/// within 1e-5 relative at every rank, same keys except among rows tied with the k-th score.
pub fn assert_same_ranking(ours: &[(String, f32)], all: &[(String, f32)], k: usize, ctx: &str) {
    assert_same_ranking_with(ours, all, k, ctx, 1e-6)
}

/// As [`assert_same_ranking`], with values below `floor` compared to within `1e-5 * floor`
/// absolute (for distances near zero computed in f32 against an f64 reference).
pub fn assert_same_ranking_with(
    ours: &[(String, f32)],
    all: &[(String, f32)],
    k: usize,
    ctx: &str,
    floor: f32,
) {
    let close = |a: f32, b: f32| close_with(a, b, floor);
    let want = &all[..all.len().min(k)];
    assert_eq!(
        ours.len(),
        want.len(),
        "{ctx}: {} results, the reference has {} (ours {ours:?}, reference {want:?})",
        ours.len(),
        want.len()
    );
    for (i, (o, w)) in ours.iter().zip(want).enumerate() {
        assert!(
            close(o.1, w.1),
            "{ctx}: rank {i}: score {} ({}) vs reference {} ({})\nours {ours:?}\nreference {want:?}",
            o.1,
            o.0,
            w.1,
            w.0
        );
    }
    if let Some(last) = want.last() {
        let boundary = last.1;
        // Rank-wise scores are equal (above); keys may swap only between near-equal scores, so
        // compare the sets of keys strictly above the boundary score.
        let strict = |v: &[(String, f32)]| -> Vec<String> {
            let mut keys: Vec<String> = v
                .iter()
                .filter(|(_, s)| !close(*s, boundary) && *s > boundary)
                .map(|(k, _)| k.clone())
                .collect();
            keys.sort();
            keys
        };
        assert_eq!(
            strict(ours),
            strict(want),
            "{ctx}: keys above the boundary score differ"
        );
        let tied: Vec<&String> = all
            .iter()
            .filter(|(_, s)| close(*s, boundary))
            .map(|(k, _)| k)
            .collect();
        for (k, s) in ours {
            if close(*s, boundary) {
                assert!(
                    tied.contains(&k),
                    "{ctx}: {k} is not tied with the boundary in the reference"
                );
            }
        }
    }
}
