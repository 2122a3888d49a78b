//! The kernel in plain Rust, over the same repacked weights: what x86 without AVX2 and CPUs other
//! than x86 and aarch64 run. It computes what the SIMD flavours compute, in the same order, with
//! fused multiply-adds, so its results are theirs bit for bit.

use super::activations::ActBlock;
use super::formats::{Interleaved, Packing, LANES};

/// `G` rows (`acts[r·kb..]`) against one column group's blocks: `out[r·LANES + c]`. The caller
/// has checked that `acts` holds `G·kb` blocks and `out` `G·LANES` floats (`holds_rows`).
pub(super) fn rows_portable<W: Interleaved, const G: usize>(
    weights: &[W],
    acts: &[ActBlock],
    out: &mut [f32],
) {
    let kb = weights.len();
    let mut lanes = [[0f32; LANES]; G];
    for (b, w) in weights.iter().enumerate() {
        let qs = w.qs();
        for (g, lane) in lanes.iter_mut().enumerate() {
            let a = &acts[g * kb + b];
            let mut sums = [[0i32; LANES]; 2];
            for t in 0..4 {
                let half = usize::from(W::HALF_SCALES && t >= 2);
                for (chunk, input) in W::PACKING.pair_inputs(t).into_iter().enumerate() {
                    for (c, sum) in sums[half].iter_mut().enumerate() {
                        for i in 0..4 {
                            let q = match W::PACKING {
                                Packing::Nibbles => (qs[32 * t + 4 * c + i] >> (4 * chunk)) & 0x0F,
                                Packing::Bytes => qs[32 * (2 * t + chunk) + 4 * c + i],
                            };
                            *sum += (q as i32 - W::OFFSET) * a.qs[input + i] as i32;
                        }
                    }
                }
            }
            let halves = if W::HALF_SCALES { 2 } else { 1 };
            for (c, lane) in lane.iter_mut().enumerate() {
                for (h, sums) in sums.iter().enumerate().take(halves) {
                    *lane = (sums[c] as f32).mul_add(w.scale(h, c) * a.d, *lane);
                }
                if W::HAS_MIN {
                    *lane = w.min(c).mul_add(W::act_sum(a), *lane);
                }
            }
        }
    }
    for (g, lane) in lanes.iter().enumerate() {
        out[g * LANES..(g + 1) * LANES].copy_from_slice(lane);
    }
}
