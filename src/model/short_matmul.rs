//! Our own quantized matrix products for passes of a few rows (decoding, draft verification), for the
//! two block formats of the models we ship: Q4_1 (SmolLM2's layers) and Q8_0 (its tied output head).
//!
//! candle computes one (row, column) dot product at a time, and for Q4_1 with its generic scalar loop,
//! so a pass of k rows costs about k decode steps. Here each weight block is unpacked once per pass and
//! multiplied with up to [`ROW_GROUP`] rows' activation blocks held next to it (AVX2 where the CPU has
//! it), each row summing into its own float lanes as ggml's AVX2 kernels do: extra rows cost little,
//! which is what speculative verification needs.
//!
//! Every row runs the same instructions on its own accumulators whatever the number of rows in the
//! pass, so a row's output does not depend on what shares the pass: a verified draft reproduces plain
//! decoding bit for bit. Activations are quantized exactly as candle quantizes them (Q8_1 for Q4_1,
//! Q8_0 for Q8_0: the same blocks, Q8_1 also carrying their sum), and a Q8_0 product is bit-identical
//! to candle's AVX2 one.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;
use half::f16;
use rayon::prelude::*;

const QK: usize = 32;
/// Columns per parallel work item.
const COLUMNS_PER_TASK: usize = 32;
/// Rows whose accumulators are kept in registers while one weight block is in hand.
const ROW_GROUP: usize = 4;

/// A row's block of activations, quantized as candle's `BlockQ8_1::from_float` (and, without `s`,
/// `BlockQ8_0::from_float`) does.
struct ActBlock {
    d: f32,
    /// `d` times the sum of `qs`, in f16 as Q8_1 stores it.
    s: f32,
    qs: [i8; QK],
}

/// A Q4_1 weight block: `w = d·q + m` for 4-bit `q`.
#[derive(Clone, Copy)]
struct Q4_1Block {
    d: f32,
    m: f32,
    qs: [u8; QK / 2],
}

/// A Q8_0 weight block: `w = d·q` for 8-bit `q`.
#[derive(Clone, Copy)]
struct Q8_0Block {
    d: f32,
    qs: [i8; QK],
}

/// The weight blocks of one matrix, in the formats we compute ourselves.
enum Blocks {
    Q4_1(Vec<Q4_1Block>),
    Q8_0(Vec<Q8_0Block>),
}

pub struct ShortMatmul {
    /// Output features (rows of the weight matrix) and input features.
    n: usize,
    k: usize,
    blocks: Blocks,
}

impl std::fmt::Debug for ShortMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = match self.blocks {
            Blocks::Q4_1(_) => "Q4_1",
            Blocks::Q8_0(_) => "Q8_0",
        };
        write!(f, "ShortMatmul({format}, {}×{})", self.n, self.k)
    }
}

impl ShortMatmul {
    /// The matrix of a Q4_1 or Q8_0 tensor `(n, k)`; None for other types or shapes.
    pub fn from_qtensor(q: &QTensor) -> candle_core::Result<Option<Self>> {
        let Ok((n, k)) = q.shape().dims2() else {
            return Ok(None);
        };
        if k == 0 || k % QK != 0 {
            return Ok(None);
        }
        let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        let blocks = match q.dtype() {
            GgmlDType::Q4_1 => Blocks::Q4_1(
                q.data()?
                    .chunks_exact(4 + QK / 2)
                    .map(|b| {
                        let mut qs = [0u8; QK / 2];
                        qs.copy_from_slice(&b[4..]);
                        Q4_1Block {
                            d: f16_at(b, 0),
                            m: f16_at(b, 2),
                            qs,
                        }
                    })
                    .collect(),
            ),
            GgmlDType::Q8_0 => Blocks::Q8_0(
                q.data()?
                    .chunks_exact(2 + QK)
                    .map(|b| Q8_0Block {
                        d: f16_at(b, 0),
                        qs: std::array::from_fn(|i| b[2 + i] as i8),
                    })
                    .collect(),
            ),
            _ => return Ok(None),
        };
        let count = match &blocks {
            Blocks::Q4_1(b) => b.len(),
            Blocks::Q8_0(b) => b.len(),
        };
        if count != n * k / QK {
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
                "quantized matmul: input of width {k} for a {}×{} matrix",
                self.n,
                self.k
            );
        }
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        let m = xs.len() / k;
        let acts = quantize_rows(&xs);
        let out = match &self.blocks {
            Blocks::Q4_1(b) => product(b, &acts, self.n, m),
            Blocks::Q8_0(b) => product(b, &acts, self.n, m),
        };
        if let Some(last) = dims.last_mut() {
            *last = self.n;
        }
        Tensor::from_vec(out, dims, x.device())
    }
}

/// `(m, n)` outputs of `m` activation rows against `n` weight rows of `blocks`.
fn product<B: WeightBlock>(blocks: &[B], acts: &[ActBlock], n: usize, m: usize) -> Vec<f32> {
    let kb = blocks.len() / n;
    // Computed column-major (each task owns whole columns), then transposed.
    let mut by_column = vec![0f32; n * m];
    by_column
        .par_chunks_mut(COLUMNS_PER_TASK * m)
        .enumerate()
        .for_each(|(task, out)| {
            let first = task * COLUMNS_PER_TASK;
            for (c, column_out) in out.chunks_mut(m).enumerate() {
                let col = first + c;
                dot_column(&blocks[col * kb..(col + 1) * kb], acts, kb, column_out);
            }
        });
    let mut out = vec![0f32; m * n];
    for (col, column) in by_column.chunks(m).enumerate() {
        for (row, &v) in column.iter().enumerate() {
            out[row * n + col] = v;
        }
    }
    out
}

/// candle's `quantize_row_q8_1` (whose blocks are `quantize_row_q8_0`'s plus their sum), row by row.
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

/// A weight block format: how it multiplies one activation block.
trait WeightBlock: Sync {
    /// `Σ q_w·q_a` over the block, in plain integer arithmetic (CPUs without AVX2).
    fn sum_products(&self, a: &ActBlock) -> i32;

    /// The block's scale, and the part of the dot product that does not depend on the activations'
    /// individual values (`m·s` for Q4_1).
    fn d(&self) -> f32;
    fn offset(&self, a: &ActBlock) -> f32;

    /// `Σ w·a` over the block, in plain scalar arithmetic.
    fn dot_scalar(&self, a: &ActBlock) -> f32 {
        self.sum_products(a) as f32 * self.d() * a.d + self.offset(a)
    }

    /// The block as the unsigned operand of `maddubs`, and what signs the activations need first.
    #[cfg(target_arch = "x86_64")]
    unsafe fn unpack(&self) -> Unpacked;
}

/// A weight block ready for AVX2: `unsigned` bytes and, for signed formats, the original bytes whose
/// signs go onto the activations (`|w|·sign(w)·a = w·a`).
#[cfg(target_arch = "x86_64")]
struct Unpacked {
    unsigned: std::arch::x86_64::__m256i,
    signs: Option<std::arch::x86_64::__m256i>,
}

impl WeightBlock for Q4_1Block {
    fn sum_products(&self, a: &ActBlock) -> i32 {
        (0..QK / 2)
            .map(|j| {
                (self.qs[j] & 0x0F) as i32 * a.qs[j] as i32
                    + (self.qs[j] >> 4) as i32 * a.qs[j + QK / 2] as i32
            })
            .sum()
    }

    fn d(&self) -> f32 {
        self.d
    }

    fn offset(&self, a: &ActBlock) -> f32 {
        self.m * a.s
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn unpack(&self) -> Unpacked {
        use std::arch::x86_64::*;
        // Lanes 0..16: low nibbles (paired with activations 0..16), 16..32: high nibbles.
        let packed = _mm_loadu_si128(self.qs.as_ptr() as *const __m128i);
        let low = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(packed, low);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        Unpacked {
            unsigned: _mm256_set_m128i(hi, lo),
            signs: None,
        }
    }
}

impl WeightBlock for Q8_0Block {
    fn sum_products(&self, a: &ActBlock) -> i32 {
        self.qs
            .iter()
            .zip(&a.qs)
            .map(|(&w, &x)| w as i32 * x as i32)
            .sum()
    }

    fn d(&self) -> f32 {
        self.d
    }

    fn offset(&self, _: &ActBlock) -> f32 {
        0.0
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn unpack(&self) -> Unpacked {
        use std::arch::x86_64::*;
        let w = _mm256_loadu_si256(self.qs.as_ptr() as *const __m256i);
        Unpacked {
            unsigned: _mm256_sign_epi8(w, w),
            signs: Some(w),
        }
    }
}

/// One column against every row: `out[r]` gets row r's dot product.
fn dot_column<B: WeightBlock>(weights: &[B], acts: &[ActBlock], kb: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            for (index, group) in out.chunks_mut(ROW_GROUP).enumerate() {
                let rows = &acts[index * ROW_GROUP * kb..];
                // SAFETY: the CPU has AVX2 and FMA, checked just above.
                unsafe {
                    match group.len() {
                        1 => dot_rows_avx2::<B, 1>(weights, rows, kb, group),
                        2 => dot_rows_avx2::<B, 2>(weights, rows, kb, group),
                        3 => dot_rows_avx2::<B, 3>(weights, rows, kb, group),
                        _ => dot_rows_avx2::<B, ROW_GROUP>(weights, rows, kb, group),
                    }
                }
            }
            return;
        }
    }
    dot_column_scalar(weights, acts, kb, out);
}

fn dot_column_scalar<B: WeightBlock>(weights: &[B], acts: &[ActBlock], kb: usize, out: &mut [f32]) {
    for (r, acc) in out.iter_mut().enumerate() {
        *acc = weights
            .iter()
            .zip(&acts[r * kb..(r + 1) * kb])
            .map(|(w, a)| w.dot_scalar(a))
            .sum();
    }
}

/// `G` rows (`acts[r·kb..]`) against one column, each row in its own eight float lanes, as candle's
/// `vec_dot_q8_0_q8_0` and ggml's Q4_1 kernel sum: lanes get `d_w·d_a · (pair sums)` block by block,
/// then are added horizontally, then the offsets.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows_avx2<B: WeightBlock, const G: usize>(
    weights: &[B],
    acts: &[ActBlock],
    kb: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); G];
    let mut offsets = [0f32; G];
    for (b, w) in weights.iter().enumerate() {
        let unpacked = w.unpack();
        for g in 0..G {
            let a = &acts[g * kb + b];
            let mut av = _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i);
            if let Some(signs) = unpacked.signs {
                av = _mm256_sign_epi8(av, signs);
            }
            let pairs = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(unpacked.unsigned, av));
            let scale = _mm256_set1_ps(w.d() * a.d);
            acc[g] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(pairs), acc[g]);
            offsets[g] += w.offset(a);
        }
    }
    for g in 0..G {
        out[g] = hsum(acc[g]) + offsets[g];
    }
}

/// candle's `hsum_float_8`: the same additions in the same order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn hsum(x: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let res = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    let res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    let res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Device, Module};

    fn flat(t: Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    fn pseudo(len: usize, step: usize, modulus: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * step) % modulus) as f32 / modulus as f32 - 0.5) * scale)
            .collect()
    }

    /// For each format: every row's output is the same bit for bit whether the row runs alone or
    /// with 1–14 others (what exact verification rests on), agrees with candle's own product, and
    /// is bit-identical to it for Q8_0; the scalar fallback agrees too.
    #[test]
    fn rows_are_independent_and_agree_with_candle() {
        let dev = Device::Cpu;
        // k = 320 is not a multiple of 256, so candle takes its generic AVX2 path (as it does for
        // SmolLM2's 576-wide output head) rather than its repacked AVX-512 tiles.
        let (n, k) = (96, 320);
        let w = Tensor::from_vec(pseudo(n * k, 7919, 997, 0.2), (n, k), &dev).unwrap();
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let ours = ShortMatmul::from_qtensor(&q).unwrap().unwrap();
            let theirs = QMatMul::from_qtensor(q).unwrap();
            let m = 15;
            let xs = pseudo(m * k, 104729, 1009, 3.0);
            let all = flat(
                ours.forward(&Tensor::from_vec(xs.clone(), (1, m, k), &dev).unwrap())
                    .unwrap(),
            );
            for rows in [1usize, 2, 3, 4, 5, 15] {
                let x = Tensor::from_vec(xs[..rows * k].to_vec(), (1, rows, k), &dev).unwrap();
                let alone = flat(ours.forward(&x).unwrap());
                assert!(alone == all[..rows * n], "{dtype:?}: {rows} rows differ");
            }
            let x = Tensor::from_vec(xs.clone(), (1, m, k), &dev).unwrap();
            let reference = flat(theirs.forward(&x).unwrap());
            match dtype {
                GgmlDType::Q8_0 => assert!(all == reference, "Q8_0 differs from candle's"),
                _ => {
                    for (a, b) in all.iter().zip(&reference) {
                        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
                    }
                }
            }
            let acts = quantize_rows(&xs);
            let mut scalar = vec![0f32; m];
            match &ours.blocks {
                Blocks::Q4_1(b) => dot_column_scalar(&b[..k / QK], &acts, k / QK, &mut scalar),
                Blocks::Q8_0(b) => dot_column_scalar(&b[..k / QK], &acts, k / QK, &mut scalar),
            }
            for (r, s) in scalar.iter().enumerate() {
                let a = all[r * n];
                assert!(
                    (a - s).abs() <= 1e-5 * a.abs().max(1.0),
                    "{dtype:?} scalar {s} vs {a}"
                );
            }
        }
    }
}
