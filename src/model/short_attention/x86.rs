//! Short attention with eight lanes and fused multiply-adds, for head dimensions of `8·C`.
//!
//! A row's arithmetic does not depend on the other rows of its pass, so it gives the same bits in
//! a pass of any size as decoding it alone does:
//! - a key's score is a chain of `C` multiply-adds into eight lanes, then the lanes' sum in one
//!   fixed tree, whether eight keys are summed side by side ([`sum_lanes`]) or one alone
//!   ([`sum_one`]): within each block of the cache a row's keys go eight at a time, the few left
//!   over (and the pass's own rows) one at a time;
//! - the exponentials are taken eight at a time over the row's whole score list
//!   ([`exponentiate`]);
//! - the values are summed under the unnormalised weights in key order and divided by the
//!   weights' total once at the end.
//!
//! Scoring the keys one at a time with the total taken by a shuffle per key, a scalar `exp` per
//! score and a division per value, as this did before, cost about twice as much at a few hundred
//! cached positions. The rows of a pass share each block of the cache while it is in L1
//! ([`attend_rows`]).

use std::arch::x86_64::*;

use super::Row;
use crate::model::exp_lanes::exp;

/// Floats in a vector, and keys scored side by side.
const LANES: usize = 8;

/// Bytes of keys (or values) in a block of the cache: read from L2 once for all the rows of a
/// pass, then from L1.
const BLOCK_BYTES: usize = 8 * 1024;

/// Attends each row into its `d = 8·C` floats of `out`.
///
/// The rows' cached keys are suffixes of one range that ends where the pass begins (a window clips
/// them from the front). That range is swept twice in blocks: each block of keys is scored for
/// every row that sees it while the block is in L1, then, after each row's softmax, each block of
/// values is summed for every row. Taken one row at a time, each row read its head's whole cache
/// from L2 (512 bytes a key), which bound a pass of several rows by L2's bandwidth: on a Zen 3,
/// 10–12 ns a key and row, where its 16 multiply-adds take about 6 ns. A row's
/// arithmetic does not depend on the blocks: a key's score does not depend on its neighbours, and
/// the values are added in key order into sums kept in `out` between blocks.
///
/// # Safety
/// The CPU supports AVX2 and FMA (checked by `short_attention::attend_rows` before dispatch).
/// Lengths need no promise: every access is bounds-checked (a short slice panics or is left out,
/// never read or written past its end).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn attend_rows<const C: usize>(rows: &[Row], out: &mut [f32]) {
    let d = 8 * C;
    let cached = |row: &Row| row.keys.cached.len() / d;
    let longest = rows.iter().map(cached).max().unwrap_or(0);
    let block = (BLOCK_BYTES / (4 * d)).max(LANES);
    // The part of the longest range's keys `from..to` that a row sees, as indices into its own.
    let part = |row: &Row, from: usize| {
        let skip = longest - cached(row);
        let to = (from + block).min(longest);
        from.max(skip) - skip..to.max(skip) - skip
    };
    let mut scores: Vec<Vec<f32>> = (rows.iter())
        .map(|row| vec![0f32; cached(row) + row.keys.path.len()])
        .collect();
    for from in (0..longest).step_by(block) {
        for (row, scores) in rows.iter().zip(&mut scores) {
            let keys = part(row, from);
            let block_keys = &row.keys.cached[keys.start * d..keys.end * d];
            score::<C>(row, block_keys, &mut scores[keys]);
        }
    }
    let mut totals = Vec::with_capacity(rows.len());
    for (row, scores) in rows.iter().zip(&mut scores) {
        for (k, score) in row.keys.path(d).zip(&mut scores[cached(row)..]) {
            *score = dot::<C>(row.query, k) * row.scale;
        }
        totals.push(exponentiate(scores));
    }
    out.fill(0.0);
    for from in (0..longest).step_by(block) {
        for ((row, scores), sums) in rows.iter().zip(&scores).zip(out.chunks_exact_mut(d)) {
            let keys = part(row, from);
            let values = row.values.cached[keys.start * d..keys.end * d].chunks_exact(d);
            accumulate::<C>(&scores[keys], values, sums);
        }
    }
    for (((row, scores), total), sums) in
        (rows.iter().zip(&scores).zip(totals)).zip(out.chunks_exact_mut(d))
    {
        accumulate::<C>(&scores[cached(row)..], row.values.path(d), sums);
        let total = _mm256_set1_ps(total);
        for c in 0..C {
            let mean = _mm256_div_ps(load(sums, c), total);
            _mm256_storeu_ps(sums[LANES * c..LANES * (c + 1)].as_mut_ptr(), mean);
        }
    }
}

/// Adds each value (`d` floats) under its weight into `sums`, in order.
///
/// # Safety
/// The CPU supports AVX2 and FMA. Lengths are bounds-checked ([`load`]): `sums` and each value
/// short of `8·C` floats panic.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate<'v, const C: usize>(
    weights: &[f32],
    values: impl Iterator<Item = &'v [f32]>,
    sums: &mut [f32],
) {
    if weights.is_empty() {
        return;
    }
    let mut acc = [_mm256_setzero_ps(); C];
    for (c, a) in acc.iter_mut().enumerate() {
        *a = load(sums, c);
    }
    for (&weight, value) in weights.iter().zip(values) {
        let p = _mm256_set1_ps(weight);
        for (c, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(p, load(value, c), *a);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(sums[LANES * c..LANES * (c + 1)].as_mut_ptr(), *a);
    }
}

/// One query against one key, before scaling: `C` multiply-adds, then [`sum_one`].
///
/// # Safety
/// The CPU supports AVX2 and FMA. Lengths are bounds-checked ([`load`]): `query` or `key` short of
/// `8·C` floats panics.
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
///
/// # Safety
/// The CPU supports AVX2 and FMA. Lengths are bounds-checked: scores go only into whole chunks of
/// `out`, and a query short of `8·C` floats panics.
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
///
/// # Safety
/// The CPU supports AVX (true wherever this module's AVX2 and FMA functions run). The range is
/// bounds-checked: a `v` short of `8c + 8` floats panics.
#[inline(always)]
unsafe fn load(v: &[f32], c: usize) -> __m256 {
    _mm256_loadu_ps(v[LANES * c..LANES * (c + 1)].as_ptr())
}

/// Lane `r` holds the sum of `acc[r]`'s lanes, added as [`sum_one`] adds them: pairs, pairs of
/// pairs within each 128-bit half, then the two halves.
///
/// # Safety
/// The CPU supports AVX2 and FMA; no memory is touched.
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
///
/// # Safety
/// The CPU supports AVX2 and FMA; no memory is touched.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_one(a: __m256) -> f32 {
    let pairs = _mm256_hadd_ps(a, a);
    let halves = _mm256_hadd_ps(pairs, pairs);
    let low = _mm256_castps256_ps128(halves);
    let high = _mm256_extractf128_ps::<1>(halves);
    _mm_cvtss_f32(_mm_add_ss(low, high))
}

/// Replaces scores by `exp(score − max)` and returns their sum: eight at a time, the last few
/// padded with −∞ (which give 0), the lanes' running sums added in [`sum_one`]'s tree.
///
/// # Safety
/// The CPU supports AVX2 and FMA. Any length of `scores` is sound: loads and stores cover whole
/// eight-float chunks or a padded copy of the tail.
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
    use crate::model::exp_lanes::tests::{avx2, lanes, ulp};

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
