//! Short attention with eight lanes and fused multiply-adds, for head dimensions of `8·C`.
//!
//! A row's arithmetic does not depend on the other rows of its pass, so it gives the same bits in
//! a pass of any size as decoding it alone does:
//! - a key's score is a chain of `C` multiply-adds into eight lanes, then the lanes' sum in one
//!   fixed tree, whether eight keys are summed side by side ([`sum_lanes`]) or one alone
//!   ([`sum_one`]): the cached keys go eight at a time, the rest one at a time;
//! - the exponentials are taken eight at a time over the row's whole score list
//!   ([`exponentiate`]);
//! - the values are summed under the unnormalised weights in key order and divided by the
//!   weights' total once at the end.
//!
//! Scoring the keys one at a time with the total taken by a shuffle per key, a scalar `exp` per
//! score and a division per value, as this did before, cost about twice as much at a few hundred
//! cached positions. Blocking the cache so that every row of a pass reads a block while it is in
//! L1 gained nothing here: one head's keys and values fit in L2.

use std::arch::x86_64::*;

use super::Row;

/// Floats in a vector, and keys scored side by side.
const LANES: usize = 8;

/// Attends one row into `out` (`d` floats); `scores` is scratch space.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn attend_row<const C: usize>(row: &Row, scores: &mut Vec<f32>, out: &mut [f32]) {
    let d = 8 * C;
    let cached = row.keys.cached.len() / d;
    scores.clear();
    scores.resize(cached + row.keys.path.len(), 0.0);
    let (from_cache, from_path) = scores.split_at_mut(cached);
    score::<C>(row, row.keys.cached, from_cache);
    for (k, score) in row.keys.path(d).zip(from_path) {
        *score = dot::<C>(row.query, k) * row.scale;
    }
    let total = _mm256_set1_ps(exponentiate(scores));
    let mut sums = [_mm256_setzero_ps(); C];
    for (&weight, value) in scores.iter().zip(row.values.iter(d)) {
        let p = _mm256_set1_ps(weight);
        for (c, sum) in sums.iter_mut().enumerate() {
            *sum = _mm256_fmadd_ps(p, load(value, c), *sum);
        }
    }
    for (c, sum) in sums.iter().enumerate() {
        let mean = _mm256_div_ps(*sum, total);
        _mm256_storeu_ps(out[LANES * c..LANES * (c + 1)].as_mut_ptr(), mean);
    }
}

/// One query against one key, before scaling: `C` multiply-adds, then [`sum_one`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot<const C: usize>(query: &[f32], key: &[f32]) -> f32 {
    let mut a = _mm256_setzero_ps();
    for c in 0..C {
        a = _mm256_fmadd_ps(load(query, c), load(key, c), a);
    }
    sum_one(a)
}

/// Scaled scores of the row's query against consecutive keys (`d` floats each), into `out`: eight
/// keys side by side, the rest one at a time.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn score<const C: usize>(row: &Row, keys: &[f32], out: &mut [f32]) {
    let d = 8 * C;
    let scale = _mm256_set1_ps(row.scale);
    let mut groups = keys.chunks_exact(LANES * d);
    let mut outs = out.chunks_exact_mut(LANES);
    for (group, eight) in (&mut groups).zip(&mut outs) {
        let mut acc = [_mm256_setzero_ps(); LANES];
        for c in 0..C {
            let qc = load(row.query, c);
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qc, load(&group[r * d..], c), *a);
            }
        }
        _mm256_storeu_ps(eight.as_mut_ptr(), _mm256_mul_ps(sum_lanes(acc), scale));
    }
    for (key, score) in groups
        .remainder()
        .chunks_exact(d)
        .zip(outs.into_remainder())
    {
        *score = dot::<C>(row.query, key) * row.scale;
    }
}

/// Floats `8c..8c+8` of `v`.
#[inline(always)]
unsafe fn load(v: &[f32], c: usize) -> __m256 {
    _mm256_loadu_ps(v[LANES * c..LANES * (c + 1)].as_ptr())
}

/// Lane `r` holds the sum of `acc[r]`'s lanes, added as [`sum_one`] adds them: pairs, pairs of
/// pairs within each 128-bit half, then the two halves.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_lanes(acc: [__m256; LANES]) -> __m256 {
    let pairs = |a, b| _mm256_hadd_ps(a, b);
    // [L0 L1 L2 L3 | H0 H1 H2 H3]: each accumulator's low-half and high-half sums.
    let first = pairs(pairs(acc[0], acc[1]), pairs(acc[2], acc[3]));
    let second = pairs(pairs(acc[4], acc[5]), pairs(acc[6], acc[7]));
    let lows = _mm256_permute2f128_ps::<0x20>(first, second);
    let highs = _mm256_permute2f128_ps::<0x31>(first, second);
    _mm256_add_ps(lows, highs)
}

/// The sum of one vector's lanes, in [`sum_lanes`]'s tree.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_one(a: __m256) -> f32 {
    let pairs = _mm256_hadd_ps(a, a);
    let halves = _mm256_hadd_ps(pairs, pairs);
    let low = _mm256_castps256_ps128(halves);
    let high = _mm256_extractf128_ps::<1>(halves);
    _mm_cvtss_f32(_mm_add_ss(low, high))
}

/// Below this, `e^x` is under f32's smallest normal: such lanes (−∞ among them) give 0.
const UNDERFLOW: f32 = -87.336_55;

/// `e^x` lane by lane, for the softmax's shifted scores (`x ≤ 0`), within a few ulp.
///
/// `e^x = 2^n · e^r` with `n = round(x·log₂e)` and `|r| ≤ ln2/2`, `r` taken off in two parts of
/// ln 2 so that it stays exact; `e^r ≈ 1 + r + r²·P(r)` with Cephes' `expf` minimax coefficients.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp(x: __m256) -> __m256 {
    let set = _mm256_set1_ps;
    let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, set(UNDERFLOW));
    // `max` returns its second operand when either is NaN: a NaN score stays NaN, as `expf`'s.
    let x = _mm256_max_ps(set(UNDERFLOW), x);
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        set(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, set(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, set(-2.121_944_4e-4), r);
    let mut p = set(1.987_569_1e-4);
    for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        p = _mm256_fmadd_ps(p, r, set(c));
    }
    let e_r = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, set(1.0)));
    let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_andnot_ps(underflow, _mm256_mul_ps(e_r, _mm256_castsi256_ps(two_n)))
}

/// Replaces scores by `exp(score − max)` and returns their sum: eight at a time, the last few
/// padded with −∞ (which give 0), the lanes' running sums added in [`sum_one`]'s tree.
#[target_feature(enable = "avx2,fma")]
unsafe fn exponentiate(scores: &mut [f32]) -> f32 {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let max = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    let mut exps = |eight: &mut [f32]| {
        let eight = &mut eight[..LANES];
        let e = exp(_mm256_sub_ps(_mm256_loadu_ps(eight.as_ptr()), max));
        _mm256_storeu_ps(eight.as_mut_ptr(), e);
        sum = _mm256_add_ps(sum, e);
    };
    let mut chunks = scores.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        exps(chunk);
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mut padded = [f32::NEG_INFINITY; LANES];
        padded[..rest.len()].copy_from_slice(rest);
        exps(&mut padded);
        rest.copy_from_slice(&padded[..rest.len()]);
    }
    sum_one(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes(v: __m256) -> [f32; LANES] {
        let mut out = [0f32; LANES];
        // SAFETY: `out` holds eight floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
        out
    }

    /// The spacing of f32s at `x`'s magnitude.
    fn ulp(x: f64) -> f64 {
        2f64.powi(x.abs().log2().floor() as i32 - 23)
    }

    fn avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    #[test]
    fn exp_is_within_a_few_ulp_of_f64s_over_the_softmax_range() {
        if !avx2() {
            return;
        }
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -90.0 + 90.0 * i as f32 / 200_000.0;
            // SAFETY: the CPU has AVX2 and FMA, checked above.
            let got = lanes(unsafe { exp(_mm256_set1_ps(x)) })[0] as f64;
            let want = (x as f64).exp();
            if x < UNDERFLOW {
                assert_eq!(got, 0.0, "e^{x}");
                continue;
            }
            worst = worst.max((got - want).abs() / ulp(want));
        }
        assert!(worst < 4.0, "worst error {worst} ulp");
        // SAFETY: as above.
        let ends = lanes(unsafe {
            exp(_mm256_setr_ps(
                0.0,
                f32::NEG_INFINITY,
                -1e30,
                f32::NAN,
                0.0,
                0.0,
                0.0,
                0.0,
            ))
        });
        assert_eq!(ends[..3], [1.0, 0.0, 0.0]);
        assert!(ends[3].is_nan(), "a NaN score stays NaN");
    }

    #[test]
    fn eight_keys_summed_together_equal_each_summed_alone() {
        if !avx2() {
            return;
        }
        let acc: [__m256; LANES] = std::array::from_fn(|r| {
            let v: [f32; LANES] =
                std::array::from_fn(|c| ((r * 37 + c * 11) as f32).sin() * 1e3 / (c + 1) as f32);
            // SAFETY: `v` holds eight floats.
            unsafe { _mm256_loadu_ps(v.as_ptr()) }
        });
        // SAFETY: the CPU has AVX2 and FMA, checked above.
        let together = lanes(unsafe { sum_lanes(acc) });
        for (r, a) in acc.into_iter().enumerate() {
            // SAFETY: as above.
            assert_eq!(
                together[r].to_bits(),
                unsafe { sum_one(a) }.to_bits(),
                "key {r}"
            );
            let v = lanes(a);
            let exact: f64 = v.iter().map(|&x| x as f64).sum();
            assert!(
                (together[r] as f64 - exact).abs()
                    <= 1e-3 * v.iter().map(|x| x.abs() as f64).sum::<f64>().max(1.0)
            );
        }
    }

    #[test]
    fn exponentiate_agrees_with_f64_and_returns_the_total() {
        if !avx2() {
            return;
        }
        for n in [1usize, 7, 8, 9, 23, 640] {
            let mut scores: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 20.0).collect();
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let want: Vec<f64> = scores.iter().map(|&s| ((s - max) as f64).exp()).collect();
            // SAFETY: the CPU has AVX2 and FMA, checked above.
            let sum = unsafe { exponentiate(&mut scores) };
            for (got, want) in scores.iter().zip(&want) {
                assert!(
                    (*got as f64 - want).abs() <= 4.0 * ulp(*want),
                    "{got} against {want}"
                );
            }
            let total: f64 = want.iter().sum();
            assert!(
                (sum as f64 - total).abs() <= 1e-5 * total,
                "n = {n}: {sum} against {total}"
            );
        }
    }
}
