//! The kernel on x86: written once over a flavour's integer products, compiled under each
//! flavour's features by the entry points at the bottom.
//!
//! Per block and row, the integer sums of the eight columns accumulate exactly in their lanes; then
//! `lanes += (d_w·d_a)·sums (+ min·Σa)`, block after block. The integer sums are the same under
//! every flavour, and the float steps are the same instructions, so the flavours agree bit for bit.

use std::arch::x86_64::*;

use super::activations::ActBlock;
use super::formats::{Interleaved, Packing, LANES};

/// A flavour's products of four unsigned weight bytes with four signed activation bytes, summed
/// per 32-bit lane. Products go into a partial accumulator that is settled into the block's i32
/// sums every [`Products::pairs_per_settle`] pairs.
trait Products {
    /// Adds both chunks' products to a partial accumulator, for weights of at most `MAX_QUANT`.
    ///
    /// # Safety
    /// The CPU has the flavour's features (those of the `rows_*` entry point that uses it).
    unsafe fn pair(partial: __m256i, w: [__m256i; 2], a: [__m256i; 2]) -> __m256i;
    /// Adds a partial accumulator to i32 sums.
    ///
    /// # Safety
    /// The CPU has the flavour's features (those of the `rows_*` entry point that uses it).
    unsafe fn settle(sum: __m256i, partial: __m256i) -> __m256i;
    /// How many pairs a partial accumulator holds without overflow.
    fn pairs_per_settle(max_quant: i32) -> usize;
    /// For 8-bit quants stored +128 (Q8_0), straight into the i32 sums; adds `SIGNED_BIAS·Σa`
    /// beyond the signed products, which the caller takes off.
    ///
    /// # Safety
    /// The CPU has the flavour's features (those of the `rows_*` entry point that uses it).
    unsafe fn pair_biased(sum: __m256i, w: [__m256i; 2], a: [__m256i; 2]) -> __m256i;
    const SIGNED_BIAS: i32;
}

/// `vpdpbusd`, in either encoding: exact i32 partials, settled once per block (or half).
struct Vnni<const EVEX: bool>;

impl<const EVEX: bool> Products for Vnni<EVEX> {
    /// Two `vpdpbusd`s.
    ///
    /// # Safety
    /// The CPU has AVX-512 VNNI and AVX-512VL (`EVEX`) or AVX-VNNI (otherwise).
    #[inline(always)]
    unsafe fn pair(partial: __m256i, w: [__m256i; 2], a: [__m256i; 2]) -> __m256i {
        let dot = |s, w, a| match EVEX {
            true => _mm256_dpbusd_epi32(s, w, a),
            false => _mm256_dpbusd_avx_epi32(s, w, a),
        };
        dot(dot(partial, w[0], a[0]), w[1], a[1])
    }
    /// One i32 addition.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    unsafe fn settle(sum: __m256i, partial: __m256i) -> __m256i {
        _mm256_add_epi32(sum, partial)
    }
    fn pairs_per_settle(_: i32) -> usize {
        4
    }
    /// [`Products::pair`] straight into the i32 sums.
    ///
    /// # Safety
    /// As [`Products::pair`]: AVX-512 VNNI and AVX-512VL (`EVEX`) or AVX-VNNI (otherwise).
    #[inline(always)]
    unsafe fn pair_biased(sum: __m256i, w: [__m256i; 2], a: [__m256i; 2]) -> __m256i {
        Self::pair(sum, w, a)
    }
    const SIGNED_BIAS: i32 = 128;
}

/// `vpmaddubsw` (u8 × i8 pairs into i16) and `vpmaddwd` (i16 pairs into i32). Partials stay in i16
/// while they cannot overflow (|w·a| ≤ 127·MAX_QUANT per byte): four pairs of 4-bit quants, two of
/// Q5_0's, one of Q6_K's, so 4-bit formats widen once per block. 8-bit quants are multiplied
/// signed (|w| ≤ 128 keeps one chunk's pair sums within i16) and widened chunk by chunk.
struct Avx2;

impl Avx2 {
    /// Adds i16 pairs, widened and summed pairwise into i32, to `sum`.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    unsafe fn widen(sum: __m256i, pairs: __m256i) -> __m256i {
        _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }
}

impl Products for Avx2 {
    /// Two `vpmaddubsw`s added into the i16 partials.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    unsafe fn pair(partial: __m256i, w: [__m256i; 2], a: [__m256i; 2]) -> __m256i {
        let both = _mm256_add_epi16(
            _mm256_maddubs_epi16(w[0], a[0]),
            _mm256_maddubs_epi16(w[1], a[1]),
        );
        _mm256_add_epi16(partial, both)
    }
    /// [`Avx2::widen`].
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    unsafe fn settle(sum: __m256i, partial: __m256i) -> __m256i {
        Self::widen(sum, partial)
    }
    fn pairs_per_settle(max_quant: i32) -> usize {
        // A pair adds at most 4 products of |w·a| ≤ 127·max_quant to an i16 lane.
        (i16::MAX as i32 / (4 * 127 * max_quant)).clamp(1, 4) as usize
    }
    /// Signed products chunk by chunk, each widened into the i32 sums.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    unsafe fn pair_biased(mut sum: __m256i, w: [__m256i; 2], a: [__m256i; 2]) -> __m256i {
        for (w, a) in w.into_iter().zip(a) {
            let signed = _mm256_xor_si256(w, _mm256_set1_epi8(-128));
            let magnitude = _mm256_sign_epi8(signed, signed);
            let a = _mm256_sign_epi8(a, signed);
            sum = Self::widen(sum, _mm256_maddubs_epi16(magnitude, a));
        }
        sum
    }
    const SIGNED_BIAS: i32 = 0;
}

/// The unsigned weight bytes of pair `t`'s two chunks (see [`Packing::pair_inputs`]).
///
/// # Safety
/// The CPU has AVX2; `t < 4` and `w.qs()` holds `W::PACKING.len()` bytes (as every
/// [`Interleaved`] does), so the unaligned 32-byte loads at `32t` or `64t` stay inside it.
#[inline(always)]
unsafe fn chunks<W: Interleaved>(w: &W, t: usize) -> [__m256i; 2] {
    let qs = w.qs().as_ptr();
    match W::PACKING {
        Packing::Nibbles => {
            let packed = _mm256_loadu_si256(qs.add(32 * t) as *const __m256i);
            let low = _mm256_set1_epi8(0x0F);
            [
                _mm256_and_si256(packed, low),
                _mm256_and_si256(_mm256_srli_epi16(packed, 4), low),
            ]
        }
        Packing::Bytes => [
            _mm256_loadu_si256(qs.add(64 * t) as *const __m256i),
            _mm256_loadu_si256(qs.add(64 * t + 32) as *const __m256i),
        ],
    }
}

/// `G` rows (`acts[r·kb..]`) against one column group's blocks: `out[r·LANES + c]`. The caller
/// has checked that `acts` holds `G·kb` blocks and `out` `G·LANES` floats (`holds_rows`).
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and `P`'s features; `acts` holds at least `G·kb` blocks
/// (`kb = weights.len()`, read unchecked) and `out` at least `G·LANES` floats (stored by pointer).
#[inline(always)]
unsafe fn rows_kernel<W: Interleaved, P: Products, const G: usize>(
    weights: &[W],
    acts: &[ActBlock],
    out: &mut [f32],
) {
    let kb = weights.len();
    debug_assert!(super::holds_rows::<G>(kb, acts, out));
    let biased = W::OFFSET == 128;
    let offset = if biased { P::SIGNED_BIAS } else { W::OFFSET };
    let mut lanes = [_mm256_setzero_ps(); G];
    for (b, w) in weights.iter().enumerate() {
        let row = |g: usize| acts.get_unchecked(g * kb + b);
        // Per row, the sums of inputs 0..16 and 16..32 when the halves are scaled apart.
        let mut sums = [[_mm256_setzero_si256(); 2]; G];
        let mut partials = [_mm256_setzero_si256(); G];
        let every = P::pairs_per_settle(W::MAX_QUANT);
        for t in 0..4 {
            let w_chunks = chunks(w, t);
            let half = usize::from(W::HALF_SCALES && t >= 2);
            let settle = (t + 1) % every == 0 || (W::HALF_SCALES && t == 1);
            for (g, (sum, partial)) in sums.iter_mut().zip(&mut partials).enumerate() {
                let qs = row(g).qs.as_ptr();
                let a = W::PACKING
                    .pair_inputs(t)
                    .map(|i| _mm256_set1_epi32((qs.add(i) as *const i32).read_unaligned()));
                if biased {
                    sum[half] = P::pair_biased(sum[half], w_chunks, a);
                    continue;
                }
                *partial = P::pair(*partial, w_chunks, a);
                if settle {
                    sum[half] = P::settle(sum[half], *partial);
                    *partial = _mm256_setzero_si256();
                }
            }
        }
        for (g, (lane, sum)) in lanes.iter_mut().zip(sums).enumerate() {
            let a = row(g);
            let da = _mm256_set1_ps(a.d);
            let halves = if W::HALF_SCALES { 2 } else { 1 };
            for (h, &sum) in sum.iter().enumerate().take(halves) {
                let taken = W::offset_sum(a, h);
                let sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(offset * taken));
                let scale = _mm256_mul_ps(w.scale_lanes(h), da);
                *lane = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *lane);
            }
            if W::HAS_MIN {
                *lane = _mm256_fmadd_ps(w.min_lanes(), _mm256_set1_ps(W::act_sum(a)), *lane);
            }
        }
    }
    for (g, lane) in lanes.iter().enumerate() {
        _mm256_storeu_ps(out.as_mut_ptr().add(g * LANES), *lane);
    }
}

/// [`rows_kernel`] with AVX-512 VNNI's `vpdpbusd`.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C, AVX-512 VNNI and AVX-512VL (`KernelFlavour::check`, in
/// `from_qtensor`); `acts` holds `G·kb` blocks and `out` `G·LANES` floats (`holds_rows`).
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(super) unsafe fn rows_avx512_vnni<W: Interleaved, const G: usize>(
    weights: &[W],
    acts: &[ActBlock],
    out: &mut [f32],
) {
    rows_kernel::<W, Vnni<true>, G>(weights, acts, out)
}

/// [`rows_kernel`] with AVX-VNNI's `vpdpbusd`.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-VNNI (`KernelFlavour::check`, in `from_qtensor`); `acts`
/// holds `G·kb` blocks and `out` `G·LANES` floats (`holds_rows`).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn rows_avx_vnni<W: Interleaved, const G: usize>(
    weights: &[W],
    acts: &[ActBlock],
    out: &mut [f32],
) {
    rows_kernel::<W, Vnni<false>, G>(weights, acts, out)
}

/// [`rows_kernel`] with AVX2's `vpmaddubsw` and `vpmaddwd`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C (`KernelFlavour::check`, in `from_qtensor`); `acts` holds `G·kb`
/// blocks and `out` `G·LANES` floats (`holds_rows`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2<W: Interleaved, const G: usize>(
    weights: &[W],
    acts: &[ActBlock],
    out: &mut [f32],
) {
    rows_kernel::<W, Avx2, G>(weights, acts, out)
}
