//! An independent reference for hybrid search: fuse one tantivy index's ranking and a brute
//! force nearest-neighbour ranking over the live rows, as the documentation states.

use lsmsearch::Fusion;
use std::collections::BTreeMap;

/// One fused row: key, fused score, text rank and vector rank (from 1).
pub type Fused = (String, f32, Option<usize>, Option<usize>);

/// The rows `offset..offset + k` of fusing `texts` (every text match: key and BM25 score, best
/// first) and `nearest` (every live row: key and squared l2 distance, nearest first), each
/// part's best `candidates` only, ordered by fused score descending then key.
pub fn reference_fusion(
    texts: &[(String, f32)],
    nearest: &[(String, f64)],
    fusion: Fusion,
    candidates: usize,
    offset: usize,
    k: usize,
) -> Vec<Fused> {
    let t = &texts[..texts.len().min(candidates)];
    let n = &nearest[..nearest.len().min(candidates)];
    let mut fused: BTreeMap<String, (f64, Option<usize>, Option<usize>)> = BTreeMap::new();
    let best = t.iter().map(|r| f64::from(r.1)).fold(0.0, f64::max);
    let dist = |sq: f64| sq.sqrt();
    let (near, far) = (
        n.first().map_or(0.0, |r| dist(r.1)),
        n.last().map_or(0.0, |r| dist(r.1)),
    );
    for (i, (key, score)) in t.iter().enumerate() {
        let add = match fusion {
            Fusion::Rrf { k } => 1.0 / (f64::from(k) + (i + 1) as f64),
            Fusion::Weighted { text, .. } => f64::from(text) * f64::from(*score) / best,
        };
        let e = fused.entry(key.clone()).or_default();
        e.0 += add;
        e.1 = Some(i + 1);
    }
    for (i, (key, sq)) in n.iter().enumerate() {
        let add = match fusion {
            Fusion::Rrf { k } => 1.0 / (f64::from(k) + (i + 1) as f64),
            Fusion::Weighted { vector, .. } => match far > near {
                true => f64::from(vector) * (far - dist(*sq)) / (far - near),
                false => f64::from(vector),
            },
        };
        let e = fused.entry(key.clone()).or_default();
        e.0 += add;
        e.2 = Some(i + 1);
    }
    let mut want: Vec<Fused> = fused
        .into_iter()
        .map(|(key, (s, tr, vr))| (key, s as f32, tr, vr))
        .collect();
    want.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    want.into_iter().skip(offset).take(k).collect()
}

/// Every row of `rows` (key, vector) by squared l2 distance to `v`, nearest first, then key.
pub fn brute_force<'a>(
    rows: impl Iterator<Item = (&'a String, &'a [f32])>,
    v: &[f32],
) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = rows
        .map(|(k, e)| {
            let d: f64 = e
                .iter()
                .zip(v)
                .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
                .sum();
            (k.clone(), d)
        })
        .collect();
    out.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    out
}
