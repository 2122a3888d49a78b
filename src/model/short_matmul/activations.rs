//! The activations' side of the products: each row cut into blocks of 32, quantized to 8 bits as
//! ggml's `quantize_row_q8_1` does.

use half::f16;

use super::formats::QK;
use crate::cpu::KernelFlavour;

/// A row's block of activations: the scale rounded to f16 as Q8_1 stores it, the quants, and the
/// sums that the formats' offsets and minimums multiply.
pub(super) struct ActBlock {
    pub d: f32,
    /// `d·Σq` rounded through f16 as ggml's Q8_1 stores it: what a Q4_1 block's `m` multiplies (so
    /// our Q4_1 products agree with ggml's to rounding order).
    pub s: f32,
    /// `d·Σq` in f32: what Q4_K's minimum multiplies.
    pub ds: f32,
    /// Σq over inputs 0..16 and 16..32 (for the offsets of stored quants; the x86 and ARM kernels
    /// take them off the integer sums, the portable one subtracts the offset quant by quant).
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub half_sums: [i32; 2],
    pub qs: [i8; QK],
}

impl ActBlock {
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub fn sum(&self) -> i32 {
        self.half_sums[0] + self.half_sums[1]
    }

    fn new(d: f32, qs: [i8; QK], half_sums: [i32; 2]) -> Self {
        let sum = half_sums[0] + half_sums[1];
        Self {
            d,
            s: f16::from_f32(f16::from_f32(sum as f32).to_f32() * d).to_f32(),
            ds: d * sum as f32,
            half_sums,
            qs,
        }
    }
}

/// ggml's `quantize_row_q8_1`, row by row: per block, the scale `max|x|/127` rounded to f16 and
/// quants rounded half away from zero. The rounding adds ½ to the magnitude and truncates, which
/// vectorizes, and differs from `roundf` only just below a half, where the addition itself rounds
/// up. Every flavour gets the same blocks bit for bit.
pub(super) fn quantize_rows(xs: &[f32], flavour: KernelFlavour) -> Vec<ActBlock> {
    xs.chunks_exact(QK)
        .map(|x| {
            #[cfg(target_arch = "x86_64")]
            if matches!(
                flavour,
                KernelFlavour::Avx512Vnni | KernelFlavour::AvxVnni | KernelFlavour::Avx2
            ) {
                // SAFETY: every x86 flavour was checked for AVX2, FMA and F16C.
                return unsafe { quantize_block_avx2(x) };
            }
            let _ = flavour;
            quantize_block(x)
        })
        .collect()
}

/// One block of [`quantize_rows`] in scalar arithmetic (the portable path and the AVX2 one's
/// oracle).
pub(super) fn quantize_block(x: &[f32]) -> ActBlock {
    let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let (d, id) = block_scale(amax);
    let qs: [i8; QK] = std::array::from_fn(|j| {
        let v = x[j] * id;
        ((v.abs() + 0.5) as i32 * if v < 0.0 { -1 } else { 1 }) as i8
    });
    let half = |h: usize| qs[16 * h..16 * h + 16].iter().map(|&q| q as i32).sum();
    ActBlock::new(d, qs, [half(0), half(1)])
}

/// The stored scale (f16-rounded `amax/127`) and the multiplier that quantizes by the unrounded one.
fn block_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (f16::from_f32(d).to_f32(), id)
}

/// [`quantize_block`] in eight lanes, bit for bit.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C (every x86 flavour is checked for them). `x` needs no promise:
/// the loads read `x[..QK]`, taken with a check (a shorter `x` gives a zero block).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_block_avx2(x: &[f32]) -> ActBlock {
    use std::arch::x86_64::*;
    let Some(x) = x.get(..QK) else {
        return ActBlock::new(0.0, [0; QK], [0; 2]);
    };
    let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
    let sign = _mm256_set1_ps(-0.0);
    let abs = |a: __m256| _mm256_andnot_ps(sign, a);
    let max = _mm256_max_ps(
        _mm256_max_ps(abs(v[0]), abs(v[1])),
        _mm256_max_ps(abs(v[2]), abs(v[3])),
    );
    let max = _mm_max_ps(_mm256_castps256_ps128(max), _mm256_extractf128_ps(max, 1));
    let max = _mm_max_ps(max, _mm_movehl_ps(max, max));
    let max = _mm_max_ss(max, _mm_movehdup_ps(max));
    let (d, id) = block_scale(_mm_cvtss_f32(max));
    let (id, half) = (_mm256_set1_ps(id), _mm256_set1_ps(0.5));
    // |x·id| + ½ truncated, with the sign of x·id put back.
    let q: [__m256i; 4] = std::array::from_fn(|i| {
        let scaled = _mm256_mul_ps(v[i], id);
        let magnitude = _mm256_cvttps_epi32(_mm256_add_ps(abs(scaled), half));
        _mm256_sign_epi32(magnitude, _mm256_castps_si256(scaled))
    });
    let horizontal_sum = |a: __m256i, b: __m256i| {
        let total = _mm256_add_epi32(a, b);
        let total = _mm_add_epi32(
            _mm256_castsi256_si128(total),
            _mm256_extracti128_si256(total, 1),
        );
        let total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0b01_00_11_10));
        let total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0b10_11_00_01));
        _mm_cvtsi128_si32(total)
    };
    let half_sums = [horizontal_sum(q[0], q[1]), horizontal_sum(q[2], q[3])];
    // Packing works within 128-bit halves; the permutation puts the 32 bytes back in order.
    let packed = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let mut qs = [0i8; QK];
    _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, ordered);
    ActBlock::new(d, qs, half_sums)
}
