//! 8-bit scalar codes of a generation's walk vectors: what a graph walk reads when the f32
//! vectors stay in the object (format version 3), a byte per dimension instead of four.
//!
//! Each dimension `d` is quantized over its range in the generation: `x ≈ min[d] + c · step[d]`
//! with `c` in `0..=255` (rounded to nearest). A walk's key of a row is then computed from the
//! codes alone: `q·x ≈ Σ q[d] min[d] + Σ (q[d] step[d]) c[d]`, the first sum and the weights
//! computed once per query; for `l2`, `|x|² - 2 q·x` with `|x|²` of the decoded row kept per
//! row (the `|q|²` term ranks nothing). The walk only proposes candidates: every distance a
//! search returns is recomputed from the f32 vectors.
//!
//! Layout (`vector/codes`, little-endian): `version u32 (1) | rows u32 | dim u32 | l2 u8 |
//! min f32[dim] | step f32[dim] | codes u8[rows * dim] | (l2) squared norms f32[rows]`.

use crate::schema::Metric;

/// The codes' layout version.
const VERSION: u32 = 1;

/// Codes of every row of a generation (rows without a vector are all zeros and never walked).
#[derive(Debug)]
pub(crate) struct Codes {
    dim: usize,
    min: Vec<f32>,
    step: Vec<f32>,
    codes: Vec<u8>,
    /// `l2`: the squared norm of each row's decoded vector; empty otherwise.
    sqnorms: Vec<f32>,
    /// `l2`: how much a decoded row's squared norm exceeds the row's on average, the
    /// rounding's noise `Σ step²/12`, which keys take out so that keys of generations with
    /// different ranges compare.
    bias: f32,
}

/// A query prepared for [`Codes::dot`]: its weights `q[d] step[d]` as integers, scaled so the
/// largest is [`MAX_WEIGHT`], and what scales their sums back.
#[derive(Debug)]
pub(crate) struct CodeQuery {
    weights: Vec<i16>,
    unscale: f64,
    offset: f32,
}

/// A bound below the keys of a range of rows, as a function of a row's integer sum: the
/// key's own operations with the least squared norm of the range (`l2`). A key never
/// grows with the sum (the operations round monotonically), so the rows a scan would skip
/// by their key are found among those whose sum is at most a threshold, without their key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyFloor {
    /// `l2`: the least squared norm less the noise; `None` for the other metrics.
    base: Option<f32>,
    offset: f32,
    unscale: f64,
    /// The largest magnitude of an integer sum.
    most: i64,
}

impl KeyFloor {
    /// The bound below the key of any row of the range whose sum is `sum`.
    #[inline]
    fn key(&self, sum: i64) -> f32 {
        key_of(self.base, dot_of_sum(self.offset, self.unscale, sum))
    }

    /// The largest sum up to which `skip` holds of the bound, `skip` being true of every
    /// key above some value (a key at or above a bar, for instance): every row of the range
    /// whose sum is at most the threshold has a key `skip` holds of. `i64::MIN` when no sum
    /// is.
    pub(crate) fn skipped_up_to(&self, skip: impl Fn(f32) -> bool) -> i64 {
        // The bound never grows with the sum, so `skip` holds of sums up to a threshold.
        let (mut lo, mut hi) = (-self.most, self.most);
        if !skip(self.key(lo)) {
            return i64::MIN;
        }
        if skip(self.key(hi)) {
            return hi;
        }
        // skip(lo) and not skip(hi).
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match skip(self.key(mid)) {
                true => lo = mid,
                false => hi = mid,
            }
        }
        lo
    }
}

/// The largest magnitude of a query's integer weights: a code (at most 255) times a weight,
/// two of them summed, stays below 2^23, so [`LANE_PAIRS`] such sums fit in an `i32`. Rounding
/// a weight errs by at most 1 / 32,766 of the largest, far below the codes' own rounding (half
/// a step on every dimension).
const MAX_WEIGHT: usize = 16383;
/// Sums of two products an `i32` lane adds up before it is added to the row's `i64` total.
#[cfg(target_arch = "x86_64")]
const LANE_PAIRS: usize = 256;

impl Codes {
    /// The codes of `vectors` (row-major, `dim` per row; the walk vectors: unit length for
    /// `cosine`), the range of each dimension taken over the rows `has` accepts.
    pub(crate) fn build(
        metric: Metric,
        dim: usize,
        vectors: &[f32],
        has: &dyn Fn(usize) -> bool,
    ) -> Codes {
        let rows = vectors.len().checked_div(dim).unwrap_or(0);
        let mut min = vec![f32::INFINITY; dim];
        let mut max = vec![f32::NEG_INFINITY; dim];
        for (r, v) in vectors.chunks_exact(dim.max(1)).enumerate() {
            if !has(r) {
                continue;
            }
            for d in 0..dim {
                min[d] = min[d].min(v[d]);
                max[d] = max[d].max(v[d]);
            }
        }
        let mut step = vec![0f32; dim];
        for d in 0..dim {
            if !(min[d].is_finite() && max[d].is_finite()) {
                (min[d], max[d]) = (0.0, 0.0);
            }
            // In f64: the range of two finite f32s (±3.4e38) may not be one.
            step[d] = ((f64::from(max[d]) - f64::from(min[d])) / 255.0) as f32;
        }
        let mut codes = vec![0u8; rows * dim];
        for (r, (v, c)) in vectors
            .chunks_exact(dim.max(1))
            .zip(codes.chunks_exact_mut(dim.max(1)))
            .enumerate()
        {
            if !has(r) {
                continue;
            }
            for d in 0..dim {
                if step[d] > 0.0 {
                    let x = (f64::from(v[d]) - f64::from(min[d])) / f64::from(step[d]);
                    c[d] = x.round().clamp(0.0, 255.0) as u8;
                }
            }
        }
        let mut out = Codes {
            dim,
            bias: noise(&step),
            min,
            step,
            codes,
            sqnorms: Vec::new(),
        };
        if metric == Metric::L2 {
            out.sqnorms = (0..rows).map(|r| out.decoded_sqnorm(r)).collect();
        }
        out
    }

    fn decoded_sqnorm(&self, row: usize) -> f32 {
        let c = &self.codes[row * self.dim..(row + 1) * self.dim];
        (0..self.dim)
            .map(|d| {
                let x = self.min[d] + f32::from(c[d]) * self.step[d];
                x * x
            })
            .sum()
    }

    /// `query` prepared for [`Codes::dot`]. A weight that is not finite (a query or a range
    /// beyond f32) counts as 0.
    pub(crate) fn query(&self, query: &[f32]) -> CodeQuery {
        let weights: Vec<f64> = query
            .iter()
            .zip(&self.step)
            .map(|(q, s)| f64::from(*q) * f64::from(*s))
            .map(|w| if w.is_finite() { w } else { 0.0 })
            .collect();
        let max = weights.iter().fold(0f64, |m, w| m.max(w.abs()));
        let scale = if max > 0.0 {
            MAX_WEIGHT as f64 / max
        } else {
            0.0
        };
        CodeQuery {
            // In range: |w| * scale is at most MAX_WEIGHT (the cast saturates anyway).
            weights: weights.iter().map(|w| (w * scale).round() as i16).collect(),
            unscale: if max > 0.0 {
                max / MAX_WEIGHT as f64
            } else {
                0.0
            },
            offset: query.iter().zip(&self.min).map(|(q, m)| q * m).sum(),
        }
    }

    /// `q·x` of the prepared query and row `row`'s decoded vector, from an exact integer sum:
    /// the same on every CPU (walks only rank candidates, which are re-scored exactly).
    pub(crate) fn dot(&self, q: &CodeQuery, row: usize) -> f32 {
        let c = &self.codes[row * self.dim..(row + 1) * self.dim];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, the only feature the function enables.
            return q.unscaled(unsafe { avx2::idot(&q.weights, c) });
        }
        q.unscaled(idot(&q.weights, c))
    }

    /// Ask the processor to bring row `row`'s codes into its caches ahead of [`Codes::key`]
    /// (see [`super::distance::prefetch`]).
    #[inline(always)]
    pub(crate) fn prefetch(&self, row: usize) {
        if let Some(c) = self.codes.get(row * self.dim..(row + 1) * self.dim) {
            super::distance::prefetch(c);
        }
    }

    /// A walk's key of row `row` (smaller is nearer): `-q·x` for `cosine` (over unit rows)
    /// and `dot`, `|x|² - 2 q·x` for `l2`.
    pub(crate) fn key(&self, metric: Metric, q: &CodeQuery, row: usize) -> f32 {
        self.key_of_dot(metric, row, self.dot(q, row))
    }

    /// Row `row`'s key (see [`Codes::key`]) from its `q·x`.
    #[inline(always)]
    fn key_of_dot(&self, metric: Metric, row: usize, dot: f32) -> f32 {
        let norm = match metric {
            Metric::L2 => Some(self.sqnorms[row] - self.bias),
            Metric::Cosine | Metric::Dot => None,
        };
        key_of(norm, dot)
    }

    /// Row `row`'s key (see [`Codes::key`]) from its integer sum (see [`Codes::sums`]).
    #[inline(always)]
    pub(crate) fn key_of_sum(&self, metric: Metric, q: &CodeQuery, row: usize, sum: i64) -> f32 {
        self.key_of_dot(metric, row, q.unscaled(sum))
    }

    /// The integer sum `Σ weights[d] c[d]` of each row of `rows` (one dispatch for them all),
    /// appended to `out`: [`Codes::key_of_sum`] makes it the row's key, and a scan compares
    /// it with [`KeyFloor::skipped_up_to`] before it does.
    pub(crate) fn sums(&self, q: &CodeQuery, rows: std::ops::Range<usize>, out: &mut Vec<i64>) {
        if self.dim == 0 {
            out.extend(std::iter::repeat_n(0, rows.len()));
            return;
        }
        let c = &self.codes[rows.start * self.dim..rows.end * self.dim];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, the only feature the function enables.
            unsafe { avx2::sums(&q.weights, c, self.dim, out) };
            return;
        }
        out.extend(c.chunks_exact(self.dim).map(|c| idot(&q.weights, c)));
    }

    /// A bound below the key of every row of `rows` for each integer sum, when every key
    /// there is a number (not NaN) whatever the sum: `None` for a query or ranges beyond
    /// f32, or (`l2`) a squared norm or noise that is not finite (the scan then keys every
    /// row).
    pub(crate) fn floor(
        &self,
        metric: Metric,
        q: &CodeQuery,
        rows: std::ops::Range<usize>,
    ) -> Option<KeyFloor> {
        if !(q.offset.is_finite() && q.unscale.is_finite()) {
            return None;
        }
        let base = match metric {
            Metric::L2 => {
                let norms = self.sqnorms.get(rows)?;
                if !norms.iter().all(|n| n.is_finite()) || !self.bias.is_finite() {
                    return None;
                }
                // The same operations as the key's, on the least norm: never above a row's.
                Some(norms.iter().copied().fold(f32::INFINITY, f32::min) - self.bias)
            }
            Metric::Cosine | Metric::Dot => None,
        };
        let most = (self.dim as i64)
            .saturating_mul(255)
            .saturating_mul(MAX_WEIGHT as i64);
        Some(KeyFloor {
            base,
            offset: q.offset,
            unscale: q.unscale,
            most,
        })
    }

    /// Bytes held in memory.
    pub(crate) fn bytes(&self) -> usize {
        self.codes.len() + (self.min.len() + self.step.len() + self.sqnorms.len()) * 4
    }

    /// The section's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let rows = self.codes.len().checked_div(self.dim).unwrap_or(0);
        let mut out = Vec::with_capacity(13 + self.bytes());
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(rows as u32).to_le_bytes());
        out.extend_from_slice(&(self.dim as u32).to_le_bytes());
        out.push(u8::from(!self.sqnorms.is_empty()));
        for x in self.min.iter().chain(&self.step) {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.extend_from_slice(&self.codes);
        for x in &self.sqnorms {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }

    /// Codes of `rows` rows of `dim` dimensions for `metric` from their section; an error says
    /// what is wrong.
    pub(crate) fn decode(
        bytes: &[u8],
        metric: Metric,
        rows: usize,
        dim: usize,
    ) -> std::result::Result<Codes, String> {
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
        };
        let (Some(version), Some(r), Some(d), Some(l2)) =
            (u32_at(0), u32_at(4), u32_at(8), bytes.get(12))
        else {
            return Err("is truncated".into());
        };
        if version != VERSION {
            return Err(format!(
                "has layout version {version}, this build reads {VERSION}"
            ));
        }
        let l2 = *l2 == 1;
        if r as usize != rows || d as usize != dim || l2 != (metric == Metric::L2) {
            return Err(format!(
                "describes {r} rows of {d} dimensions (l2: {l2}) where the generation has {rows} of {dim} ({metric:?})"
            ));
        }
        let floats = |from: usize, n: usize| -> Vec<f32> {
            bytes[from..from + n * 4]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect()
        };
        let codes_at = 13 + 8 * dim;
        let norms_at = codes_at + rows * dim;
        let want = norms_at + if l2 { rows * 4 } else { 0 };
        if bytes.len() != want {
            return Err(format!(
                "has {} bytes where {want} were expected",
                bytes.len()
            ));
        }
        let min = floats(13, dim);
        let step = floats(13 + 4 * dim, dim);
        if min.iter().chain(&step).any(|x| !x.is_finite()) || step.iter().any(|s| *s < 0.0) {
            return Err("has a range that is not finite".into());
        }
        Ok(Codes {
            dim,
            bias: noise(&step),
            min,
            step,
            codes: bytes[codes_at..norms_at].to_vec(),
            sqnorms: if l2 {
                floats(norms_at, rows)
            } else {
                Vec::new()
            },
        })
    }
}

/// The mean squared error of rounding to the nearest of steps `step`: `Σ step²/12`, summed in
/// f64; 0 when it is beyond f32 (ranges near f32::MAX, where keys are infinite anyway).
fn noise(step: &[f32]) -> f32 {
    let sum: f64 = step.iter().map(|s| f64::from(*s).powi(2) / 12.0).sum();
    match sum <= f64::from(f32::MAX) {
        true => sum as f32,
        false => 0.0,
    }
}

impl CodeQuery {
    /// `q·x` from the integer sum `Σ weights[d] c[d]`.
    #[inline(always)]
    fn unscaled(&self, sum: i64) -> f32 {
        dot_of_sum(self.offset, self.unscale, sum)
    }
}

/// `q·x` from an integer sum, a query's offset and what scales its sums back: the one
/// formula of a row's key and of a [`KeyFloor`], which must round alike.
#[inline(always)]
fn dot_of_sum(offset: f32, unscale: f64, sum: i64) -> f32 {
    offset + (sum as f64 * unscale) as f32
}

/// A walk's key from `q·x`: `|x|² - 2 q·x` given `norm`, `|x|²` less the rounding's noise
/// (`l2`), else `-q·x`: the one formula of a row's key and of a [`KeyFloor`].
#[inline(always)]
fn key_of(norm: Option<f32>, dot: f32) -> f32 {
    match norm {
        Some(norm) => norm - 2.0 * dot,
        None => -dot,
    }
}

/// `Σ w[d] c[d]`, exactly: in `i32` over blocks of [`BLOCK`] dimensions (which vectorize),
/// each block's sum then added to the `i64` total.
#[inline(always)]
fn idot(w: &[i16], c: &[u8]) -> i64 {
    w.chunks(BLOCK)
        .zip(c.chunks(BLOCK))
        .map(|(w, c)| {
            let block: i32 = w
                .iter()
                .zip(c)
                .map(|(w, c)| i32::from(*w) * i32::from(*c))
                .sum();
            i64::from(block)
        })
        .sum()
}

/// Dimensions the portable sum adds up in an `i32`: 512 products of a weight and a code.
const BLOCK: usize = 512;
// The bounds the sums rely on: no i32 they add up in can overflow.
const _: () = assert!(BLOCK * MAX_WEIGHT * 255 <= i32::MAX as usize);
#[cfg(target_arch = "x86_64")]
const _: () = assert!(LANE_PAIRS * 2 * MAX_WEIGHT * 255 <= i32::MAX as usize);
/// Dimensions up to which every partial sum of a row's products fits an `i32`.
#[cfg(target_arch = "x86_64")]
const I32_DIM: usize = i32::MAX as usize / (MAX_WEIGHT * 255);
#[cfg(target_arch = "x86_64")]
const _: () = assert!(I32_DIM >= 128);

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{I32_DIM, LANE_PAIRS};
    use std::arch::x86_64::{
        __m128i, __m256i, _mm256_add_epi32, _mm256_castsi256_si128, _mm256_cvtepi32_epi64,
        _mm256_cvtepu8_epi16, _mm256_extracti128_si256, _mm256_hadd_epi32, _mm256_loadu_si256,
        _mm256_madd_epi16, _mm256_setzero_si256, _mm256_storeu_si256, _mm_add_epi32,
        _mm_loadu_si128, _mm_prefetch, _MM_HINT_T0,
    };

    /// [`super::idot`] sixteen dimensions at a time: the codes widened to 16 bits, multiplied by
    /// the weights and summed in pairs into eight `i32` lanes (`vpmaddwd`), which go into the
    /// `i64` total every [`LANE_PAIRS`] steps, before they could overflow. Equal to
    /// [`super::idot`]: integer sums do not depend on their order.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) fn idot(w: &[i16], c: &[u8]) -> i64 {
        let len = w.len().min(c.len());
        let whole = len / 16 * 16;
        let mut total = 0i64;
        let mut i = 0;
        while i < whole {
            let stop = (i + 16 * LANE_PAIRS).min(whole);
            let mut acc = _mm256_setzero_si256();
            while i < stop {
                // SAFETY: i + 16 <= whole <= both lengths: 16 codes and 16 weights are in bounds;
                // the loads are unaligned.
                let (codes, weights) = unsafe {
                    (
                        _mm_loadu_si128(c.as_ptr().add(i).cast::<__m128i>()),
                        _mm256_loadu_si256(w.as_ptr().add(i).cast::<__m256i>()),
                    )
                };
                acc =
                    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_cvtepu8_epi16(codes), weights));
                i += 16;
            }
            let mut lanes = [0i32; 8];
            // SAFETY: `lanes` holds 32 bytes; the store is unaligned.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast::<__m256i>(), acc) };
            total += lanes.iter().map(|l| i64::from(*l)).sum::<i64>();
        }
        total + super::idot(&w[whole..len], &c[whole..len])
    }

    /// How far ahead of the rows being summed [`sums`] asks for the codes: the hardware's
    /// stream prefetcher alone leaves a scan waiting on memory when other work has pushed
    /// the codes out of the shared cache (a hybrid search's full-text part). Measured on
    /// `bench generations` (128 dimensions, 18 generations) by `perf`, the sums' samples
    /// over those of tantivy's union `refill` in a hybrid search: 0.81 and 0.82 without,
    /// 0.54 and 0.54 at 2,048 bytes, 0.60 at 1,024 and 0.62 at 4,096 (one run each); hints
    /// `T1` 0.60 and `T2` 0.73 (`NTA` not tried with it: it keeps lines out of the shared
    /// cache, where the codes stay between queries).
    const PREFETCH_AHEAD: usize = 2048;

    /// [`super::idot`] of each row of `codes` (`dim` a row, at least 1) with `w`, appended to
    /// `out`. Up to [`I32_DIM`] dimensions, four rows at a time: the weights are loaded once
    /// for the four, each row's sum stays in `i32` lanes (it cannot overflow there), the
    /// four rows' lanes are summed together by horizontal adds, not stored and added one by
    /// one, and the codes [`PREFETCH_AHEAD`] bytes on (four rows' bytes on, when they are
    /// more) are asked for. Past [`I32_DIM`] dimensions each row is summed alone
    /// ([`idot`]), with no prefetch.
    #[target_feature(enable = "avx2")]
    pub(super) fn sums(w: &[i16], codes: &[u8], dim: usize, out: &mut Vec<i64>) {
        if dim > I32_DIM || w.len() < dim {
            out.extend(codes.chunks_exact(dim).map(|c| idot(w, c)));
            return;
        }
        let w = &w[..dim];
        let whole = dim / 16 * 16;
        let mut fours = codes.chunks_exact(4 * dim);
        out.reserve(codes.len() / dim);
        // The lines `ahead` bytes past each four rows are asked for as the four are summed
        // (at least the next four rows' bytes ahead). Each step asks for the lines that start
        // within its window of `4 dim` bytes: the windows follow each other, so every line is
        // asked for once.
        let ahead = PREFETCH_AHEAD.max(4 * dim);
        for four in &mut fours {
            let next = four.as_ptr().wrapping_add(ahead) as usize;
            let first = next.saturating_add(63) & !63;
            for line in (first..next.saturating_add(4 * dim)).step_by(64) {
                // A prefetch only hints the caches: it never faults, whatever the address
                // (past the codes' end, it is wasted).
                _mm_prefetch::<_MM_HINT_T0>(line as *const i8);
            }
            let mut acc = [_mm256_setzero_si256(); 4];
            let mut i = 0;
            while i < whole {
                // SAFETY: i + 16 <= whole <= dim: 16 weights, and 16 codes of each of the four
                // rows (row j's at j * dim + i, within the 4 * dim of `four`), are in bounds;
                // the loads are unaligned.
                unsafe {
                    let weights = _mm256_loadu_si256(w.as_ptr().add(i).cast::<__m256i>());
                    for (j, acc) in acc.iter_mut().enumerate() {
                        let codes =
                            _mm_loadu_si128(four.as_ptr().add(j * dim + i).cast::<__m128i>());
                        *acc = _mm256_add_epi32(
                            *acc,
                            _mm256_madd_epi16(_mm256_cvtepu8_epi16(codes), weights),
                        );
                    }
                }
                i += 16;
            }
            // [r0 r0 r1 r1 | r0 r0 r1 r1] and the same of rows 2 and 3, then each row's four
            // partial sums in one lane of each half, widened to i64.
            let pairs = _mm256_hadd_epi32(
                _mm256_hadd_epi32(acc[0], acc[1]),
                _mm256_hadd_epi32(acc[2], acc[3]),
            );
            let sums = _mm256_cvtepi32_epi64(_mm_add_epi32(
                _mm256_castsi256_si128(pairs),
                _mm256_extracti128_si256::<1>(pairs),
            ));
            let mut lanes = [0i64; 4];
            // SAFETY: `lanes` holds 32 bytes; the store is unaligned.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast::<__m256i>(), sums) };
            if whole < dim {
                for (j, lane) in lanes.iter_mut().enumerate() {
                    *lane += super::idot(&w[whole..], &four[j * dim + whole..(j + 1) * dim]);
                }
            }
            out.extend_from_slice(&lanes);
        }
        out.extend(fours.remainder().chunks_exact(dim).map(|c| idot(w, c)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A xorshift generator from `seed` (not 0).
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn integer_sums_are_exact_on_every_path_at_their_extremes() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        // Lengths around the 16-wide steps and past a lane's LANE_PAIRS steps.
        for len in [0usize, 1, 15, 16, 17, 128, 129, 4095, 4096, 4111, 9000] {
            for extreme in [false, true] {
                let w: Vec<i16> = (0..len)
                    .map(|_| match extreme {
                        true => 16383,
                        false => (next() % 32767) as i16 - 16383,
                    })
                    .collect();
                let c: Vec<u8> = (0..len)
                    .map(|_| if extreme { 255 } else { next() as u8 })
                    .collect();
                let want: i64 = w.iter().zip(&c).map(|(a, b)| *a as i64 * *b as i64).sum();
                assert_eq!(idot(&w, &c), want, "len {len}");
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2.
                    assert_eq!(unsafe { avx2::idot(&w, &c) }, want, "len {len}, AVX2");
                }
            }
        }
    }

    #[test]
    fn sums_of_many_rows_equal_each_rows_own_sum_at_every_dimension() {
        let mut next = xorshift(0x51_7cc1_b727_220a);
        // Dimensions around the 16-wide steps and the largest whose sums stay in i32 lanes;
        // row counts with and without a remainder past the rows taken four at a time.
        for dim in [1usize, 15, 16, 17, 128, 129, 513, 514, 515, 1536] {
            for rows in [1usize, 4, 7, 9] {
                // Random weights, then the largest codes times the largest weights of each sign.
                for extreme in [0i16, 16383, -16383] {
                    let weights: Vec<i16> = (0..dim)
                        .map(|_| match extreme {
                            0 => (next() % 32767) as i16 - 16383,
                            w => w,
                        })
                        .collect();
                    let codes: Vec<u8> = (0..rows * dim)
                        .map(|_| if extreme != 0 { 255 } else { next() as u8 })
                        .collect();
                    let q = CodeQuery {
                        weights,
                        unscale: 1.0,
                        offset: 0.0,
                    };
                    let c = Codes {
                        dim,
                        min: vec![0.0; dim],
                        step: vec![1.0; dim],
                        codes,
                        sqnorms: Vec::new(),
                        bias: 0.0,
                    };
                    let mut sums = Vec::new();
                    c.sums(&q, 0..rows, &mut sums);
                    let want: Vec<i64> = (0..rows)
                        .map(|r| idot(&q.weights, &c.codes[r * dim..(r + 1) * dim]))
                        .collect();
                    assert_eq!(sums, want, "dim {dim}, rows {rows}, extreme {extreme}");
                }
            }
        }
    }

    fn vectors(rows: usize, dim: usize) -> Vec<f32> {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        (0..rows * dim)
            .map(|_| (next() % 20_000) as f32 / 1000.0 - 10.0)
            .collect()
    }

    #[test]
    fn keys_from_codes_are_close_to_exact_ones_and_the_section_round_trips() {
        let (rows, dim) = (300, 37);
        let v = vectors(rows, dim);
        let q: Vec<f32> = vectors(1, dim).iter().map(|x| x / 3.0).collect();
        for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
            let codes = Codes::build(metric, dim, &v, &|r| r != 7);
            let back = Codes::decode(&codes.encode(), metric, rows, dim).unwrap();
            let cq = back.query(&q);
            let mut sums = Vec::new();
            back.sums(&cq, 5..rows, &mut sums);
            assert_eq!(sums.len(), rows - 5);
            for (r, sum) in (5..rows).zip(&sums) {
                assert_eq!(
                    back.key_of_sum(metric, &cq, r, *sum).to_bits(),
                    back.key(metric, &cq, r).to_bits(),
                    "{metric:?} {r}"
                );
            }
            for r in (0..rows).filter(|r| *r != 7) {
                let x = &v[r * dim..(r + 1) * dim];
                let dot: f32 = q.iter().zip(x).map(|(a, b)| a * b).sum();
                let exact = match metric {
                    Metric::L2 => x.iter().map(|a| a * a).sum::<f32>() - 2.0 * dot,
                    _ => -dot,
                };
                let got = back.key(metric, &cq, r);
                // Each coordinate is within half a step (20 / 255 / 2) of its value.
                let bound =
                    0.04 * (q.iter().map(|a| a.abs()).sum::<f32>() * 3.0 + 30.0 * dim as f32);
                assert!(
                    (got - exact).abs() < bound,
                    "{metric:?} row {r}: {got} vs {exact}"
                );
            }
            assert_eq!(back.encode(), codes.encode());
        }
    }

    #[test]
    fn a_floors_threshold_skips_only_rows_whose_key_is_skipped() {
        let mut next = xorshift(0x7a3b_9c1d_e5f2_0481);
        for dim in [1usize, 16, 37, 128] {
            let rows = 700;
            let v = vectors(rows, dim);
            for metric in [Metric::L2, Metric::Dot, Metric::Cosine] {
                let codes = Codes::build(metric, dim, &v, &|r| r % 11 != 3);
                for _ in 0..20 {
                    let q: Vec<f32> = (0..dim)
                        .map(|_| (next() % 2_000) as f32 / 1000.0 - 1.0)
                        .collect();
                    let cq = codes.query(&q);
                    let (from, to) = (next() as usize % 300, 300 + next() as usize % 400);
                    let mut sums = Vec::new();
                    codes.sums(&cq, from..to, &mut sums);
                    let mut keys: Vec<f32> = (from..to)
                        .zip(&sums)
                        .map(|(r, s)| codes.key_of_sum(metric, &cq, r, *s))
                        .collect();
                    keys.sort_by(f32::total_cmp);
                    let floor = codes.floor(metric, &cq, from..to).unwrap();
                    // Bars at keys of the range, and beyond every key both ways.
                    let picks = [0, keys.len() / 100, keys.len() / 2, keys.len() - 1];
                    let bars = picks.iter().map(|i| keys[*i]).chain([
                        f32::MIN,
                        f32::MAX,
                        f32::NEG_INFINITY,
                        -0.0,
                        f32::NAN,
                        -f32::NAN,
                    ]);
                    // A scan's own bar skips keys at or above it, the round's those above it.
                    for (bar, strict) in bars.flat_map(|b| [(b, false), (b, true)]) {
                        let skip = |key: f32| match strict {
                            true => key.total_cmp(&bar).is_gt(),
                            false => key.total_cmp(&bar).is_ge(),
                        };
                        let up_to = floor.skipped_up_to(skip);
                        let mut skipped = 0;
                        for (r, s) in (from..to).zip(&sums) {
                            if *s <= up_to {
                                skipped += 1;
                                let key = codes.key_of_sum(metric, &cq, r, *s);
                                assert!(skip(key), "{metric:?} dim {dim} row {r}: {key} < {bar}");
                            }
                        }
                        // The threshold is the floor's last sum to be skipped.
                        match up_to {
                            i64::MIN => assert!(!skip(floor.key(-floor.most))),
                            s if s < floor.most => assert!(!skip(floor.key(s + 1))),
                            _ => {}
                        }
                        if metric != Metric::L2 && bar.to_bits() == keys[keys.len() / 2].to_bits() {
                            // Without norms the floor is each row's key: it skips every row
                            // at or above the bar.
                            let at_or_above = keys.iter().filter(|k| skip(**k)).count();
                            assert_eq!(skipped, at_or_above, "{metric:?} dim {dim}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn no_floor_where_keys_may_not_be_numbers() {
        let v = [f32::MAX, -f32::MAX, 1.0, 0.0, 0.0, -1.0];
        let codes = Codes::build(Metric::L2, 2, &v, &|_| true);
        // The squared norms overflow f32.
        assert!(codes
            .floor(Metric::L2, &codes.query(&[0.0, 1.0]), 0..3)
            .is_none());
        let dot = Codes::build(Metric::Dot, 2, &v, &|_| true);
        assert!(dot
            .floor(Metric::Dot, &dot.query(&[1.0, f32::MAX]), 0..3)
            .is_none());
        assert!(dot
            .floor(Metric::Dot, &dot.query(&[0.5, 1.0]), 0..3)
            .is_some());
    }

    #[test]
    fn l2_keys_of_generations_with_different_ranges_compare() {
        // The same rows coded alone and beside an outlier that widens every range: the
        // keys a round compares between generations must agree on average.
        let (rows, dim) = (2_000, 64);
        let v: Vec<f32> = vectors(rows, dim).iter().map(|x| x / 20.0).collect();
        let mut wide = v.clone();
        wide.extend(std::iter::repeat_n(30.0, dim));
        let q: Vec<f32> = vectors(1, dim).iter().map(|x| x / 40.0).collect();
        let narrow = Codes::build(Metric::L2, dim, &v, &|_| true);
        let wide = Codes::build(Metric::L2, dim, &wide, &|_| true);
        let (nq, wq) = (narrow.query(&q), wide.query(&q));
        let mean: f32 = (0..rows)
            .map(|r| wide.key(Metric::L2, &wq, r) - narrow.key(Metric::L2, &nq, r))
            .sum::<f32>()
            / rows as f32;
        // The rounding noise (0.076 here) is taken out; what is left (0.023) comes from the
        // rows' values against the coarse grid (eight steps span them), data-dependent.
        assert!(mean.abs() < 0.03, "the wide codes' keys are {mean} higher");
    }

    #[test]
    fn the_widest_finite_range_makes_finite_codes() {
        let v = [f32::MAX, -f32::MAX, 1.0, f32::MAX * 0.5, 0.0, -1.0];
        for metric in [Metric::L2, Metric::Dot] {
            let codes = Codes::build(metric, 2, &v, &|_| true);
            assert!(
                Codes::decode(&codes.encode(), metric, 3, 2).is_ok(),
                "{metric:?}"
            );
        }
    }

    #[test]
    fn keys_stay_finite_over_the_widest_ranges() {
        // Steps near f32::MAX / 255: their squares overflow f32.
        let v = [f32::MAX, -f32::MAX, 1.0, 0.0, 0.0, -1.0];
        let codes = Codes::build(Metric::L2, 2, &v, &|_| true);
        let q = codes.query(&[0.0, 1.0]);
        for r in 0..3 {
            let key = codes.key(Metric::L2, &q, r);
            assert!(!key.is_nan() && key != f32::NEG_INFINITY, "row {r}: {key}");
        }
    }

    #[test]
    fn damaged_sections_are_refused() {
        let (rows, dim) = (10, 4);
        let bytes = Codes::build(Metric::L2, dim, &vectors(rows, dim), &|_| true).encode();
        assert!(Codes::decode(&bytes, Metric::L2, rows, dim).is_ok());
        assert!(Codes::decode(&bytes[..bytes.len() - 1], Metric::L2, rows, dim).is_err());
        assert!(Codes::decode(&bytes, Metric::Dot, rows, dim).is_err());
        assert!(Codes::decode(&bytes, Metric::L2, rows + 1, dim).is_err());
        let mut nan = bytes.clone();
        nan[13..17].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(Codes::decode(&nan, Metric::L2, rows, dim).is_err());
        assert!(Codes::decode(&[1, 2, 3], Metric::L2, rows, dim).is_err());
    }
}
