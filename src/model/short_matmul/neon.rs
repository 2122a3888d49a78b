//! The kernel on aarch64: written once over a flavour's integer products, compiled under each
//! flavour's features by the entry points at the bottom.
//!
//! The eight columns of a group are two quads of i32 lanes. Weight bytes are taken signed (every
//! format's stored quants fit in i8 but Q8_0's, which are stored +128 and flipped back), so each
//! block's sums are `Σq·a`, and `OFFSET·Σa` comes off them as on x86. The float steps are the
//! portable kernel's, in the same order, fused, so every flavour agrees bit for bit.

use std::arch::aarch64::*;

use super::activations::ActBlock;
use super::formats::{Interleaved, Packing, LANES};

/// A flavour's products of sixteen signed weight bytes (four for each of four columns) with the
/// same four signed activation bytes for every column, added to each column's i32 lane.
trait Products {
    /// Adds each column's four products to its lane of `sum`.
    ///
    /// # Safety
    /// The CPU has the flavour's features (`dotprod` for [`Dot`]; none beyond NEON for the rest).
    unsafe fn dot(sum: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t;
}

/// `sdot` (the dot-product extension, `asimddp`: Neoverse N1 and later, Apple M1 and later): four
/// products summed into each lane by one instruction.
struct Dot;

impl Products for Dot {
    /// One `sdot`.
    ///
    /// # Safety
    /// The CPU has `dotprod` (`KernelFlavour::check`, in `from_qtensor`).
    #[inline]
    #[target_feature(enable = "dotprod")]
    unsafe fn dot(mut sum: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
        // Written out: the `vdotq_s32` intrinsic is not stable in the Rust this builds with.
        std::arch::asm!(
            "sdot {0:v}.4s, {1:v}.16b, {2:v}.16b",
            inout(vreg) sum,
            in(vreg) w,
            in(vreg) a,
            options(pure, nomem, nostack)
        );
        sum
    }
}

/// Widening multiplies (every aarch64 CPU): i8·i8 into i16, then pairwise additions into i32.
struct Widening;

impl Products for Widening {
    /// Widening multiplies and pairwise additions.
    ///
    /// # Safety
    /// None beyond NEON, which every aarch64 CPU has; no memory is touched.
    #[inline(always)]
    unsafe fn dot(sum: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
        // Columns 0 and 1, then 2 and 3: four i16 products each, exact (|w·a| ≤ 128·127).
        let low = vmull_s8(vget_low_s8(w), vget_low_s8(a));
        let high = vmull_high_s8(w, a);
        // Pairs into i32, then pairs of pairs: one sum per column, in column order.
        vaddq_s32(sum, vpaddq_s32(vpaddlq_s16(low), vpaddlq_s16(high)))
    }
}

/// A stored byte taken signed: as it is, or flipped back from Q8_0's +128.
///
/// # Safety
/// None beyond NEON, which every aarch64 CPU has; no memory is touched.
#[inline(always)]
unsafe fn signed<W: Interleaved>(bytes: uint8x16_t) -> int8x16_t {
    if W::OFFSET == 128 {
        vreinterpretq_s8_u8(veorq_u8(bytes, vdupq_n_u8(0x80)))
    } else {
        vreinterpretq_s8_u8(bytes)
    }
}

/// The signed weight bytes of pair `t`'s two chunks (see [`Packing::pair_inputs`]), columns 0–3
/// and 4–7 of each.
///
/// # Safety
/// `t < 4` and `w.qs()` holds `W::PACKING.len()` bytes (as every [`Interleaved`] does), so the
/// 16-byte loads (`32t`, `32t + 16` for nibbles; `64t` to `64t + 48` for bytes) stay inside it.
#[inline(always)]
unsafe fn chunks<W: Interleaved>(w: &W, t: usize) -> [[int8x16_t; 2]; 2] {
    let qs = w.qs().as_ptr();
    match W::PACKING {
        Packing::Nibbles => {
            let packed = [vld1q_u8(qs.add(32 * t)), vld1q_u8(qs.add(32 * t + 16))];
            let low = vdupq_n_u8(0x0F);
            [
                [
                    signed::<W>(vandq_u8(packed[0], low)),
                    signed::<W>(vandq_u8(packed[1], low)),
                ],
                [
                    signed::<W>(vshrq_n_u8::<4>(packed[0])),
                    signed::<W>(vshrq_n_u8::<4>(packed[1])),
                ],
            ]
        }
        Packing::Bytes => {
            let at = |chunk: usize| qs.add(32 * (2 * t + chunk));
            [
                [
                    signed::<W>(vld1q_u8(at(0))),
                    signed::<W>(vld1q_u8(at(0).add(16))),
                ],
                [
                    signed::<W>(vld1q_u8(at(1))),
                    signed::<W>(vld1q_u8(at(1).add(16))),
                ],
            ]
        }
    }
}

/// `G` rows (`acts[r·kb..]`) against one column group's blocks: `out[r·LANES + c]`. The caller
/// has checked that `acts` holds `G·kb` blocks and `out` `G·LANES` floats (`holds_rows`).
///
/// # Safety
/// The CPU has `P`'s features; `acts` holds at least `G·kb` blocks (`kb = weights.len()`, read
/// unchecked) and `out` at least `G·LANES` floats (stored by pointer).
#[inline(always)]
unsafe fn rows_kernel<W: Interleaved, P: Products, const G: usize>(
    weights: &[W],
    acts: &[ActBlock],
    out: &mut [f32],
) {
    let kb = weights.len();
    debug_assert!(super::holds_rows::<G>(kb, acts, out));
    // Q8_0's quants were flipped back to signed: nothing to take off.
    let offset = if W::OFFSET == 128 { 0 } else { W::OFFSET };
    let halves = if W::HALF_SCALES { 2 } else { 1 };
    let mut lanes = [[vdupq_n_f32(0.0); 2]; G];
    for (b, w) in weights.iter().enumerate() {
        let row = |g: usize| acts.get_unchecked(g * kb + b);
        // Per row, half (when the halves are scaled apart) and quad of columns.
        let mut sums = [[[vdupq_n_s32(0); 2]; 2]; G];
        for t in 0..4 {
            let w_chunks = chunks(w, t);
            let half = usize::from(W::HALF_SCALES && t >= 2);
            for (g, sum) in sums.iter_mut().enumerate() {
                let qs = row(g).qs.as_ptr();
                for (chunk, input) in W::PACKING.pair_inputs(t).into_iter().enumerate() {
                    let four = (qs.add(input) as *const i32).read_unaligned();
                    let a = vreinterpretq_s8_s32(vdupq_n_s32(four));
                    for (quad, sum) in sum[half].iter_mut().enumerate() {
                        *sum = P::dot(*sum, w_chunks[chunk][quad], a);
                    }
                }
            }
        }
        let scales: [[f32; LANES]; 2] = std::array::from_fn(|h| {
            std::array::from_fn(|c| if h < halves { w.scale(h, c) } else { 0.0 })
        });
        let mins: [f32; LANES] = std::array::from_fn(|c| if W::HAS_MIN { w.min(c) } else { 0.0 });
        for (g, (lane, sum)) in lanes.iter_mut().zip(sums).enumerate() {
            let a = row(g);
            let da = vdupq_n_f32(a.d);
            for (h, sum) in sum.iter().enumerate().take(halves) {
                let taken = W::offset_sum(a, h);
                let correction = vdupq_n_s32(offset * taken);
                for (quad, lane) in lane.iter_mut().enumerate() {
                    let sum = vsubq_s32(sum[quad], correction);
                    let scale = vmulq_f32(vld1q_f32(scales[h].as_ptr().add(4 * quad)), da);
                    *lane = vfmaq_f32(*lane, vcvtq_f32_s32(sum), scale);
                }
            }
            if W::HAS_MIN {
                let taken = vdupq_n_f32(W::act_sum(a));
                for (quad, lane) in lane.iter_mut().enumerate() {
                    *lane = vfmaq_f32(*lane, vld1q_f32(mins.as_ptr().add(4 * quad)), taken);
                }
            }
        }
    }
    for (g, lane) in lanes.iter().enumerate() {
        for (quad, lane) in lane.iter().enumerate() {
            vst1q_f32(out.as_mut_ptr().add(g * LANES + 4 * quad), *lane);
        }
    }
}

/// # Safety
/// The CPU has `dotprod`; `acts` holds `G·kb` blocks and `out` `G·LANES` floats.
#[target_feature(enable = "dotprod")]
pub(super) unsafe fn rows_neon_dot<W: Interleaved, const G: usize>(
    weights: &[W],
    acts: &[ActBlock],
    out: &mut [f32],
) {
    rows_kernel::<W, Dot, G>(weights, acts, out)
}

/// NEON is part of every aarch64 CPU: no feature to enable.
///
/// # Safety
/// `acts` holds `G·kb` blocks and `out` `G·LANES` floats.
pub(super) unsafe fn rows_neon<W: Interleaved, const G: usize>(
    weights: &[W],
    acts: &[ActBlock],
    out: &mut [f32],
) {
    rows_kernel::<W, Widening, G>(weights, acts, out)
}
