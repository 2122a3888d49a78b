//! `e^x` in eight f32 lanes (AVX2 and FMA), for the softmax of short attention and the
//! feed-forward's gates.

use std::arch::x86_64::*;

/// Below this, `e^x` is under f32's smallest normal: such lanes (−∞ among them) give 0.
const UNDERFLOW: f32 = -87.336_55;
/// Above this, a bound below ln(f32::MAX) ≈ 88.72 that keeps `2^n` inside f32's exponents, lanes
/// (+∞ among them) give +∞.
const OVERFLOW: f32 = 88.0;

/// `e^x` lane by lane, within a few ulp; 0 below [`UNDERFLOW`], +∞ above [`OVERFLOW`].
///
/// `e^x = 2^n · e^r` with `n = round(x·log₂e)` and `|r| ≤ ln2/2`, `r` taken off in two parts of
/// ln 2 so that it stays exact; `e^r ≈ 1 + r + r²·P(r)` with Cephes' `expf` minimax coefficients.
///
/// # Safety
/// The CPU supports AVX2 and FMA (callers check with `is_x86_feature_detected!` before dispatch).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp(x: __m256) -> __m256 {
    let set = _mm256_set1_ps;
    let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, set(UNDERFLOW));
    let overflow = _mm256_cmp_ps::<_CMP_GT_OQ>(x, set(OVERFLOW));
    // `max` and `min` return their second operand when either is NaN: NaN stays NaN, as in
    // `expf`.
    let x = _mm256_min_ps(set(OVERFLOW), _mm256_max_ps(set(UNDERFLOW), x));
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
    let e = _mm256_andnot_ps(underflow, _mm256_mul_ps(e_r, _mm256_castsi256_ps(two_n)));
    _mm256_blendv_ps(e, set(f32::INFINITY), overflow)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A vector's eight lanes.
    pub(crate) fn lanes(v: __m256) -> [f32; 8] {
        let mut out = [0f32; 8];
        // SAFETY: `out` holds eight floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
        out
    }

    /// The spacing of f32s at `x`'s magnitude.
    pub(crate) fn ulp(x: f64) -> f64 {
        2f64.powi(x.abs().log2().floor() as i32 - 23)
    }

    pub(crate) fn avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// From below the underflow to the overflow; past them, 0 and +∞.
    #[test]
    fn exp_is_within_a_few_ulp_of_f64s() {
        if !avx2() {
            return;
        }
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -90.0 + 178.0 * i as f32 / 200_000.0;
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
                100.0,
                f32::INFINITY,
                0.0,
                0.0,
            ))
        });
        assert_eq!(ends[..3], [1.0, 0.0, 0.0]);
        assert!(ends[3].is_nan(), "NaN stays NaN");
        assert_eq!(ends[4..6], [f32::INFINITY; 2]);
    }
}
