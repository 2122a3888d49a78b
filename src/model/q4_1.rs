//! Our own Q4_1 × Q8_1 matrix product for inputs of a few rows (decoding, draft verification).
//!
//! candle computes Q4_1 dot products with its generic scalar loop, one (row, column) pair at a time,
//! so a pass of k rows costs k decode steps. Here each weight block is unpacked once per pass and
//! multiplied with every row's block (AVX2 where the CPU has it): extra rows cost little, which is
//! what speculative verification needs. Every output element is summed exactly as candle sums it
//! (integer block sums, then `sumi·d_w·d_x + m_w·s_x` added block by block from zero), with
//! activations quantized exactly as candle quantizes them, so the results are bit-identical to
//! candle's and do not depend on how many rows share a pass.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;
use half::f16;
use rayon::prelude::*;

const QK: usize = 32;
/// Columns per parallel work item.
const COLUMNS_PER_TASK: usize = 32;

#[derive(Clone, Copy)]
struct WeightBlock {
    d: f32,
    m: f32,
    qs: [u8; QK / 2],
}

/// A row's block of activations, quantized as candle's `BlockQ8_1::from_float` does.
struct ActBlock {
    d: f32,
    s: f32,
    qs: [i8; QK],
}

pub struct Q4_1Matrix {
    /// Output features (rows of the weight matrix) and input features.
    n: usize,
    k: usize,
    blocks: Vec<WeightBlock>,
}

impl std::fmt::Debug for Q4_1Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Q4_1Matrix({}×{})", self.n, self.k)
    }
}

impl Q4_1Matrix {
    /// The matrix of a Q4_1 tensor `(n, k)`; None for other types or shapes.
    pub fn from_qtensor(q: &QTensor) -> candle_core::Result<Option<Self>> {
        if q.dtype() != GgmlDType::Q4_1 {
            return Ok(None);
        }
        let Ok((n, k)) = q.shape().dims2() else {
            return Ok(None);
        };
        if k % QK != 0 {
            return Ok(None);
        }
        let data = q.data()?;
        let blocks: Vec<WeightBlock> = data
            .chunks_exact(4 + QK / 2)
            .map(|b| {
                let mut qs = [0u8; QK / 2];
                qs.copy_from_slice(&b[4..]);
                WeightBlock {
                    d: f16::from_le_bytes([b[0], b[1]]).to_f32(),
                    m: f16::from_le_bytes([b[2], b[3]]).to_f32(),
                    qs,
                }
            })
            .collect();
        if blocks.len() != n * k / QK {
            return Ok(None);
        }
        Ok(Some(Self { n, k, blocks }))
    }

    /// `x · Wᵀ` for `x` of shape `(.., k)`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut dims = x.dims().to_vec();
        let k = dims.last().copied().unwrap_or(0);
        if k != self.k {
            candle_core::bail!(
                "Q4_1 matmul: input of width {k} for a {}×{} matrix",
                self.n,
                self.k
            );
        }
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        let m = xs.len() / k;
        let acts = quantize_rows(&xs);
        let kb = k / QK;
        // Computed column-major (each task owns whole columns), then transposed.
        let mut by_column = vec![0f32; self.n * m];
        by_column
            .par_chunks_mut(COLUMNS_PER_TASK * m)
            .enumerate()
            .for_each(|(task, out)| {
                let first = task * COLUMNS_PER_TASK;
                for (c, column_out) in out.chunks_mut(m).enumerate() {
                    let col = first + c;
                    dot_column(
                        &self.blocks[col * kb..(col + 1) * kb],
                        &acts,
                        kb,
                        column_out,
                    );
                }
            });
        let mut out = vec![0f32; m * self.n];
        for (col, column) in by_column.chunks(m).enumerate() {
            for (row, &v) in column.iter().enumerate() {
                out[row * self.n + col] = v;
            }
        }
        if let Some(last) = dims.last_mut() {
            *last = self.n;
        }
        Tensor::from_vec(out, dims, x.device())
    }
}

/// candle's `quantize_row_q8_1`, row by row.
fn quantize_rows(xs: &[f32]) -> Vec<ActBlock> {
    xs.chunks_exact(QK)
        .map(|x| {
            let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
            let d = amax / ((1 << 7) - 1) as f32;
            let id = if d != 0f32 { 1. / d } else { 0. };
            let d16 = f16::from_f32(d);
            let mut qs = [0i8; QK];
            let mut sum = 0i32;
            for j in 0..QK / 2 {
                qs[j] = f32::round(x[j] * id) as i8;
                qs[j + QK / 2] = f32::round(x[j + QK / 2] * id) as i8;
                sum += qs[j] as i32 + qs[j + QK / 2] as i32;
            }
            let s16 = f16::from_f32(sum as f32) * d16;
            ActBlock {
                d: d16.to_f32(),
                s: s16.to_f32(),
                qs,
            }
        })
        .collect()
}

/// One column against every row: `out[r]` gets row r's dot product.
fn dot_column(weights: &[WeightBlock], acts: &[ActBlock], kb: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            unsafe { dot_column_avx2(weights, acts, kb, out) };
            return;
        }
    }
    dot_column_scalar(weights, acts, kb, out);
}

fn dot_column_scalar(weights: &[WeightBlock], acts: &[ActBlock], kb: usize, out: &mut [f32]) {
    out.fill(0.0);
    for (b, w) in weights.iter().enumerate() {
        for (r, acc) in out.iter_mut().enumerate() {
            let a = &acts[r * kb + b];
            let mut sumi = 0i32;
            for j in 0..QK / 2 {
                sumi += (w.qs[j] & 0x0F) as i32 * a.qs[j] as i32
                    + (w.qs[j] >> 4) as i32 * a.qs[j + QK / 2] as i32;
            }
            *acc += sumi as f32 * w.d * a.d + w.m * a.s;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_column_avx2(weights: &[WeightBlock], acts: &[ActBlock], kb: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    out.fill(0.0);
    let low = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    for (b, w) in weights.iter().enumerate() {
        // Lanes 0..16: low nibbles (paired with activations 0..16), 16..32: high nibbles.
        let packed = _mm_loadu_si128(w.qs.as_ptr() as *const __m128i);
        let lo = _mm_and_si128(packed, low);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        let unpacked = _mm256_set_m128i(hi, lo);
        for (r, acc) in out.iter_mut().enumerate() {
            let a = &acts[r * kb + b];
            let av = _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i);
            let pairs = _mm256_madd_epi16(_mm256_maddubs_epi16(unpacked, av), ones);
            let s128 = _mm_add_epi32(
                _mm256_castsi256_si128(pairs),
                _mm256_extracti128_si256(pairs, 1),
            );
            let s64 = _mm_add_epi32(s128, _mm_unpackhi_epi64(s128, s128));
            let s32 = _mm_add_epi32(s64, _mm_shuffle_epi32(s64, 0b01));
            let sumi = _mm_cvtsi128_si32(s32);
            *acc += sumi as f32 * w.d * a.d + w.m * a.s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Device, Module};

    /// Bit-identical to candle's own Q4_1 product, for one row and for several.
    #[test]
    fn equals_candles_q4_1_matmul_bit_for_bit() {
        let dev = Device::Cpu;
        let (n, k) = (96, 256);
        let w: Vec<f32> = (0..n * k)
            .map(|i| (((i * 7919) % 997) as f32 / 997.0 - 0.5) * 0.2)
            .collect();
        let w = Tensor::from_vec(w, (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let ours = Q4_1Matrix::from_qtensor(&q).unwrap().unwrap();
        let theirs = QMatMul::from_qtensor(q).unwrap();
        for m in [1usize, 3, 15] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| (((i * 104729) % 1009) as f32 / 1009.0 - 0.5) * 3.0)
                .collect();
            let x = Tensor::from_vec(x, (1, m, k), &dev).unwrap();
            let flat = |t: Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
            let a = flat(ours.forward(&x).unwrap());
            let b = flat(theirs.forward(&x).unwrap());
            assert_eq!(a, b, "{m} rows");
            // The scalar fallback agrees too.
            let acts = quantize_rows(&flat(x.clone()));
            let mut scalar = vec![0f32; m];
            dot_column_scalar(&ours.blocks[..k / QK], &acts, k / QK, &mut scalar);
            let first_column: Vec<f32> = (0..m).map(|r| a[r * n]).collect();
            assert_eq!(scalar, first_column);
        }
    }
}
