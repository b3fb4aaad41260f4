//! Distance kernels shared by graph walks and exact scans.
//!
//! Sums are accumulated in [`LANES`] independent lanes (element `i` goes to lane `i % LANES`)
//! and the lanes are added in a fixed order, so a distance is the same bits on every machine
//! and in every code path. Fixed lanes let the compiler use SIMD registers without reordering
//! floating-point additions; on x86-64 CPUs with AVX2 the same code is compiled a second time
//! for AVX2 and chosen at run time. No fused multiply-add is used, so both builds round alike.

/// Dimensions from which `cosine` graphs keep their points in half precision for walks and
/// construction. Below, distances between near neighbours are as small as half precision's
/// rounding (about 5e-4) on dense data, and a distance reads few bytes anyway.
pub(crate) const HALF_MIN_DIM: usize = 32;

/// Lanes of independent partial sums.
pub(crate) const LANES: usize = 32;

#[inline(always)]
fn reduce(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

#[inline(always)]
fn fold<const N: usize>(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> [f32; N]) -> [f32; N] {
    let mut acc = [[0f32; LANES]; N];
    let n = a.len().min(b.len());
    let (ca, cb) = (a[..n].chunks_exact(LANES), b[..n].chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            let v = f(x[i], y[i]);
            for (s, v) in acc.iter_mut().zip(v) {
                s[i] += v;
            }
        }
    }
    for i in 0..ta.len() {
        let v = f(ta[i], tb[i]);
        for (s, v) in acc.iter_mut().zip(v) {
            s[i] += v;
        }
    }
    acc.map(reduce)
}

/// [`fold`] for one sum, with a flat accumulator: the same additions in the same order, in a
/// shape the compiler keeps in vector registers (a one-element array of lane arrays was seen
/// spilled to the stack on every step, three times slower).
#[inline(always)]
fn fold1(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let n = a.len().min(b.len());
    let (ca, ta) = a[..n].as_chunks::<LANES>();
    let (cb, tb) = b[..n].as_chunks::<LANES>();
    for (x, y) in ca.iter().zip(cb) {
        for i in 0..LANES {
            acc[i] += f(x[i], y[i]);
        }
    }
    for i in 0..ta.len() {
        acc[i] += f(ta[i], tb[i]);
    }
    reduce(acc)
}

#[inline(always)]
fn l2_sq_generic(a: &[f32], b: &[f32]) -> f32 {
    fold1(a, b, |x, y| (x - y) * (x - y))
}

#[inline(always)]
fn dot_generic(a: &[f32], b: &[f32]) -> f32 {
    fold1(a, b, |x, y| x * y)
}

#[inline(always)]
fn cosine_parts_generic(a: &[f32], b: &[f32]) -> [f32; 3] {
    fold(a, b, |x, y| [x * y, x * x, y * y])
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    #[target_feature(enable = "avx2")]
    pub(super) fn l2_sq(a: &[f32], b: &[f32]) -> f32 {
        super::l2_sq_generic(a, b)
    }
    #[target_feature(enable = "avx2")]
    pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
        super::dot_generic(a, b)
    }
    #[target_feature(enable = "avx2")]
    pub(super) fn cosine_parts(a: &[f32], b: &[f32]) -> [f32; 3] {
        super::cosine_parts_generic(a, b)
    }
}

macro_rules! dispatch {
    ($name:ident, $generic:ident, $out:ty, $doc:literal) => {
        #[doc = $doc]
        #[inline]
        pub(crate) fn $name(a: &[f32], b: &[f32]) -> $out {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2, the only feature the function enables.
                return unsafe { avx2::$name(a, b) };
            }
            $generic(a, b)
        }
    };
}

dispatch!(
    l2_sq,
    l2_sq_generic,
    f32,
    "Squared Euclidean distance (over the shorter length)."
);
dispatch!(
    dot,
    dot_generic,
    f32,
    "Dot product (over the shorter length)."
);
dispatch!(
    cosine_parts,
    cosine_parts_generic,
    [f32; 3],
    "`[a·b, a·a, b·b]` in one pass (over the shorter length)."
);

/// Ask the processor to bring `data` into its caches ahead of a read: a graph walk reads the
/// vectors (or codes) of the nodes it visits in no order, and each read would otherwise wait
/// for memory in turn. At most the first [`PREFETCH_LINES`] cache lines of `data`: the
/// processor's own prefetcher follows a read along the rest.
#[inline(always)]
pub(crate) fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let start = data.as_ptr() as usize;
        let end = start + std::mem::size_of_val(data);
        // Every line the bytes touch, from the one holding the first.
        for line in ((start & !63)..end).step_by(64).take(PREFETCH_LINES) {
            // SAFETY: a prefetch only hints the caches: it reads nothing the program sees and
            // never faults, whatever the address (here each lies in a line `data` touches).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// The most cache lines [`prefetch`] asks for (512 bytes: 128 dimensions of `f32`).
const PREFETCH_LINES: usize = 8;

/// Dot product of `a` with a half-precision `b` (over the shorter length), for graph walks:
/// the order of its additions is not fixed, so results differ between machines in the last
/// bits; a walk's candidates are re-scored with the exact kernels.
#[inline]
pub(crate) fn dot_half(a: &[f32], b: &[half::f16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("f16c")
        && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: the CPU supports every feature the function enables.
        return unsafe { half_avx2::dot(a, b) };
    }
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}

/// Dot product of two half-precision vectors (over the shorter length), for graph construction
/// over half-precision points; additions in no fixed order, as [`dot_half`]'s.
#[inline]
pub(crate) fn dot_halves(a: &[half::f16], b: &[half::f16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("f16c")
        && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: the CPU supports every feature the function enables.
        return unsafe { half_avx2::dot_halves(a, b) };
    }
    a.iter().zip(b).map(|(x, y)| x.to_f32() * y.to_f32()).sum()
}

#[cfg(target_arch = "x86_64")]
mod half_avx2 {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    fn sum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
        _mm_cvtss_f32(s)
    }

    /// Eight values of `b` from `i` as f32.
    ///
    /// # Safety
    /// `i + 8 <= b.len()`.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn load_half(b: &[half::f16], i: usize) -> __m256 {
        // SAFETY: eight u16 from `i` are in bounds (the caller's promise); f16 is a u16.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(b.as_ptr().add(i).cast()) })
    }

    /// # Safety
    /// `i + 8 <= a.len()`.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn load(a: &[f32], i: usize) -> __m256 {
        // SAFETY: eight f32 from `i` are in bounds (the caller's promise).
        unsafe { _mm256_loadu_ps(a.as_ptr().add(i)) }
    }

    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn dot(a: &[f32], b: &[half::f16]) -> f32 {
        let n = a.len().min(b.len());
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n, within both slices.
            unsafe {
                s0 = _mm256_fmadd_ps(load(a, i), load_half(b, i), s0);
                s1 = _mm256_fmadd_ps(load(a, i + 8), load_half(b, i + 8), s1);
            }
            i += 16;
        }
        if i + 8 <= n {
            // SAFETY: i + 8 <= n, within both slices.
            unsafe { s0 = _mm256_fmadd_ps(load(a, i), load_half(b, i), s0) };
            i += 8;
        }
        let mut out = sum(_mm256_add_ps(s0, s1));
        for j in i..n {
            out += a[j] * b[j].to_f32();
        }
        out
    }

    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn dot_halves(a: &[half::f16], b: &[half::f16]) -> f32 {
        let n = a.len().min(b.len());
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n, within both slices.
            unsafe {
                s0 = _mm256_fmadd_ps(load_half(a, i), load_half(b, i), s0);
                s1 = _mm256_fmadd_ps(load_half(a, i + 8), load_half(b, i + 8), s1);
            }
            i += 16;
        }
        if i + 8 <= n {
            // SAFETY: i + 8 <= n, within both slices.
            unsafe { s0 = _mm256_fmadd_ps(load_half(a, i), load_half(b, i), s0) };
            i += 8;
        }
        let mut out = sum(_mm256_add_ps(s0, s1));
        for j in i..n {
            out += a[j].to_f32() * b[j].to_f32();
        }
        out
    }
}

/// One minus the cosine similarity; 1 when either vector is zero.
#[inline]
pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let [d, na, nb] = cosine_parts(a, b);
    if na == 0.0 || nb == 0.0 {
        1.0
    } else {
        1.0 - d / (na.sqrt() * nb.sqrt())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn f64_ref(a: &[f32], b: &[f32]) -> (f64, f64, f64, f64) {
        let (mut l2, mut d, mut na, mut nb) = (0f64, 0f64, 0f64, 0f64);
        for (x, y) in a.iter().zip(b) {
            let (x, y) = (*x as f64, *y as f64);
            l2 += (x - y) * (x - y);
            d += x * y;
            na += x * x;
            nb += y * y;
        }
        (l2, d, na, nb)
    }

    /// Deterministic values in [-1, 1) from `seed` (a 64-bit LCG), for kernel tests.
    pub(crate) fn uniform(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed;
        move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    #[test]
    fn the_half_precision_kernel_matches_an_f64_reference_of_the_rounded_values() {
        let mut next = uniform(3);
        for dim in [0usize, 1, 7, 8, 9, 15, 16, 17, 128, 131] {
            let a: Vec<f32> = (0..dim).map(|_| next()).collect();
            let b: Vec<f32> = (0..dim).map(|_| next()).collect();
            let h: Vec<half::f16> = b.iter().map(|x| half::f16::from_f32(*x)).collect();
            let rounded: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
            let (_, d, _, _) = f64_ref(&a, &rounded);
            let close =
                |ours: f32, want: f64| (ours as f64 - want).abs() <= 1e-5 * want.abs().max(1.0);
            assert!(close(dot_half(&a, &h), d), "dot, dim {dim}");
            // Both sides in half precision.
            let ha: Vec<half::f16> = a.iter().map(|x| half::f16::from_f32(*x)).collect();
            let ra: Vec<f32> = ha.iter().map(|x| x.to_f32()).collect();
            let (_, dh, _, _) = f64_ref(&ra, &rounded);
            assert!(close(dot_halves(&ha, &h), dh), "dot of halves, dim {dim}");
            // Half precision keeps about three decimal digits of the exact kernels.
            assert!((dot_half(&a, &h) - dot(&a, &b)).abs() <= 2e-3 * (dim as f32).sqrt().max(1.0));
        }
    }

    #[test]
    fn kernels_match_an_f64_reference_and_both_builds_agree_bit_for_bit() {
        let mut next = uniform(7);
        for dim in [1, 3, 31, 32, 33, 100, 128, 768, 784, 1000] {
            let a: Vec<f32> = (0..dim).map(|_| next()).collect();
            let b: Vec<f32> = (0..dim).map(|_| next()).collect();
            let (l2, d, na, nb) = f64_ref(&a, &b);
            let tol = 1e-4 * dim as f64;
            assert!((l2_sq(&a, &b) as f64 - l2).abs() < tol, "dim {dim}");
            assert!((dot(&a, &b) as f64 - d).abs() < tol, "dim {dim}");
            let c = 1.0 - d / (na.sqrt() * nb.sqrt());
            assert!((cosine(&a, &b) as f64 - c).abs() < 1e-4, "dim {dim}");
            assert_eq!(l2_sq(&a, &b).to_bits(), l2_sq_generic(&a, &b).to_bits());
            assert_eq!(dot(&a, &b).to_bits(), dot_generic(&a, &b).to_bits());
            assert_eq!(cosine_parts(&a, &b), cosine_parts_generic(&a, &b));
        }
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 2.0]), 1.0);
        assert_eq!(l2_sq(&[], &[]), 0.0);
    }
}
