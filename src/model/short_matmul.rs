//! Our own quantized matrix products for passes of a few rows (decoding, draft verification), for the
//! two block formats of the models we ship: Q4_1 (SmolLM2's layers) and Q8_0 (its tied output head).
//!
//! candle computes one (row, column) dot product at a time, converting and scaling every 32-weight
//! block's integer sum on its own, so a pass of k rows costs about k decode steps. Here the weights
//! are repacked at load time so that eight output columns sit side by side: four activation bytes,
//! broadcast, meet four weights of each of the eight columns in one VNNI multiply-add, every lane
//! summing its own column. A block's integer sums are exact; they are converted and scaled once per
//! eight columns, and each weight block is unpacked once for up to [`ROW_GROUP`] rows. Extra rows
//! cost little, which is what speculative verification needs, and one row (decoding) gains as much.
//!
//! Every row runs the same instructions on its own accumulators whatever the number of rows in the
//! pass, so a row's output does not depend on what shares the pass: a verified draft reproduces
//! plain decoding bit for bit. CPUs without VNNI (AVX-VNNI, or AVX-512 VNNI with VL) keep candle's
//! kernels, which have the same property.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;
use half::f16;
use rayon::prelude::*;

/// Weights per quantization block, in both formats.
const QK: usize = 32;
/// Output columns whose weights are interleaved: one per 32-bit lane of an AVX2 register.
const LANES: usize = 8;
/// `Interleaved::chunks` calls that cover a block's 32 inputs, eight at a time.
const CHUNK_PAIRS: usize = QK / 8;
/// Column groups per parallel work item.
const GROUPS_PER_TASK: usize = 4;
/// Rows whose accumulators are kept in registers while one weight block is in hand.
const ROW_GROUP: usize = 4;

/// A row's block of activations, quantized as ggml's `quantize_row_q8_1` does (the scale rounded
/// to f16), with the exact sum of its quants.
struct ActBlock {
    d: f32,
    /// `d` times the sum of `qs`, rounded through f16 as ggml's Q8_1 stores it: what a Q4_1
    /// block's offset `m` multiplies (so our Q4_1 products agree with candle's to rounding order).
    s: f32,
    /// The sum of `qs`, for the unsigned storage of Q8_0 quants (see [`Q8_0Group`]).
    sum: i32,
    qs: [i8; QK],
}

/// One block (32 inputs) of eight Q4_1 columns, `w = d·q + m` for 4-bit `q`. `qs[32t + 4c + i]`
/// holds column `c`'s quant of input `4t + i` in its low nibble and of input `4(t + 4) + i` in its
/// high nibble, so a 32-byte load and two masks give the unsigned operands for inputs `4t..4t+4`
/// and `4t+16..4t+20` of all eight columns.
struct Q4_1Group {
    qs: [u8; 4 * QK],
    d: [f16; LANES],
    m: [f16; LANES],
}

/// One block of eight Q8_0 columns, `w = d·q` for signed 8-bit `q`, stored as `q + 128` (VNNI wants
/// unsigned weights) in the chunk order of [`Q4_1Group`] without the nibble fold: `qs[32t + 4c + i]`
/// is column `c`'s input `4t + i`. The `128·Σa` this adds is subtracted in integers.
struct Q8_0Group {
    qs: [u8; LANES * QK],
    d: [f16; LANES],
}

/// The repacked weights of one matrix: column group `g`'s blocks at `g·kb..(g+1)·kb`.
enum Groups {
    Q4_1(Vec<Q4_1Group>),
    Q8_0(Vec<Q8_0Group>),
}

/// Which VNNI instructions the CPU has; decided once, when a matrix is loaded.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Vnni {
    /// AVX-VNNI (VEX-encoded `vpdpbusd`, Alder Lake, Sapphire Rapids, Zen 5).
    Avx,
    /// AVX-512 VNNI on 256-bit registers (Ice Lake, Zen 4).
    Avx512,
}

impl Vnni {
    fn detect() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            if !(avx2 && is_x86_feature_detected!("f16c")) {
                return None;
            }
            if is_x86_feature_detected!("avxvnni") {
                return Some(Vnni::Avx);
            }
            if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
                return Some(Vnni::Avx512);
            }
        }
        None
    }
}

pub struct ShortMatmul {
    /// Output features (rows of the weight matrix) and input features.
    n: usize,
    k: usize,
    groups: Groups,
    vnni: Vnni,
}

impl std::fmt::Debug for ShortMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = match self.groups {
            Groups::Q4_1(_) => "Q4_1",
            Groups::Q8_0(_) => "Q8_0",
        };
        write!(
            f,
            "ShortMatmul({format}, {}×{}, {:?})",
            self.n, self.k, self.vnni
        )
    }
}

impl ShortMatmul {
    /// The matrix of a Q4_1 or Q8_0 tensor `(n, k)`; None for other types or shapes, or on a CPU
    /// without VNNI.
    pub fn from_qtensor(q: &QTensor) -> candle_core::Result<Option<Self>> {
        match Vnni::detect() {
            Some(vnni) => Self::with_vnni(q, vnni),
            None => Ok(None),
        }
    }

    fn with_vnni(q: &QTensor, vnni: Vnni) -> candle_core::Result<Option<Self>> {
        let Ok((n, k)) = q.shape().dims2() else {
            return Ok(None);
        };
        if k == 0 || k % QK != 0 || n == 0 || n % LANES != 0 {
            return Ok(None);
        }
        let block_bytes = match q.dtype() {
            GgmlDType::Q4_1 => 4 + QK / 2,
            GgmlDType::Q8_0 => 2 + QK,
            _ => return Ok(None),
        };
        let data = q.data()?;
        let kb = k / QK;
        if data.len() != n * kb * block_bytes {
            return Ok(None);
        }
        // Column `c`'s block `b`, as stored in the file (row-major blocks).
        let block = |c: usize, b: usize| &data[(c * kb + b) * block_bytes..][..block_bytes];
        let f16_at = |bytes: &[u8], i: usize| f16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let positions = (0..n / LANES).flat_map(|g| (0..kb).map(move |b| (g * LANES, b)));
        let groups = match q.dtype() {
            GgmlDType::Q4_1 => Groups::Q4_1(
                positions
                    .map(|(first, b)| {
                        let mut group = Q4_1Group {
                            qs: [0; 4 * QK],
                            d: [f16::ZERO; LANES],
                            m: [f16::ZERO; LANES],
                        };
                        for c in 0..LANES {
                            let bytes = block(first + c, b);
                            group.d[c] = f16_at(bytes, 0);
                            group.m[c] = f16_at(bytes, 2);
                            // ggml's Q4_1: byte j holds input j (low nibble) and j + 16 (high).
                            let quant = |e: usize| match e < QK / 2 {
                                true => bytes[4 + e] & 0x0F,
                                false => bytes[4 + e - QK / 2] >> 4,
                            };
                            for t in 0..4 {
                                for i in 0..4 {
                                    let (low, high) = (4 * t + i, 4 * (t + 4) + i);
                                    group.qs[32 * t + 4 * c + i] = quant(low) | (quant(high) << 4);
                                }
                            }
                        }
                        group
                    })
                    .collect(),
            ),
            _ => Groups::Q8_0(
                positions
                    .map(|(first, b)| {
                        let mut group = Q8_0Group {
                            qs: [0; LANES * QK],
                            d: [f16::ZERO; LANES],
                        };
                        for c in 0..LANES {
                            let bytes = block(first + c, b);
                            group.d[c] = f16_at(bytes, 0);
                            for t in 0..LANES {
                                for i in 0..4 {
                                    let q = bytes[2 + 4 * t + i] as i8;
                                    group.qs[32 * t + 4 * c + i] = (q as i16 + 128) as u8;
                                }
                            }
                        }
                        group
                    })
                    .collect(),
            ),
        };
        Ok(Some(Self { n, k, groups, vnni }))
    }

    /// `x · Wᵀ` for `x` of shape `(.., k)`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        Self::forward_shared(&[self], x)?
            .pop()
            .ok_or_else(|| candle_core::Error::Msg("quantized matmul: no output".into()))
    }

    /// `x · Wᵢᵀ` for several matrices of the same width: `x` is quantized once, and all the
    /// products share one parallel region.
    pub fn forward_shared(parts: &[&ShortMatmul], x: &Tensor) -> candle_core::Result<Vec<Tensor>> {
        let dims = x.dims().to_vec();
        let k = dims.last().copied().unwrap_or(0);
        if let Some(part) = parts.iter().find(|p| p.k != k) {
            candle_core::bail!(
                "quantized matmul: input of width {k} for a {}×{} matrix",
                part.n,
                part.k
            );
        }
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        let m = xs.len() / k.max(1);
        let acts = quantize_rows(&xs);
        // Tasks over every part's column groups, each writing its own slice of one buffer laid out
        // part by part, column group by column group, row by row.
        let tasks: Vec<(usize, usize)> = parts
            .iter()
            .enumerate()
            .flat_map(|(p, part)| {
                let groups = part.n / LANES;
                (0..groups.div_ceil(GROUPS_PER_TASK)).map(move |t| (p, t * GROUPS_PER_TASK))
            })
            .collect();
        let mut by_group = vec![0f32; parts.iter().map(|p| p.n * m).sum()];
        let mut slices = Vec::with_capacity(tasks.len());
        let mut rest = by_group.as_mut_slice();
        for &(p, first) in &tasks {
            let groups = (parts[p].n / LANES - first).min(GROUPS_PER_TASK);
            let (slice, tail) = rest.split_at_mut(groups * LANES * m);
            slices.push(slice);
            rest = tail;
        }
        tasks
            .par_iter()
            .zip(slices.into_par_iter())
            .for_each(|(&(p, first), out)| parts[p].column_groups(first, &acts, m, out));
        let mut outs = Vec::with_capacity(parts.len());
        let mut offset = 0;
        for part in parts {
            let n = part.n;
            let mut out = vec![0f32; m * n];
            for (g, group) in by_group[offset..offset + n * m]
                .chunks(LANES * m)
                .enumerate()
            {
                for (row, lanes) in group.chunks(LANES).enumerate() {
                    out[row * n + g * LANES..][..LANES].copy_from_slice(lanes);
                }
            }
            offset += n * m;
            let mut shape = dims.clone();
            if let Some(last) = shape.last_mut() {
                *last = n;
            }
            outs.push(Tensor::from_vec(out, shape, x.device())?);
        }
        Ok(outs)
    }

    /// Column groups `first..` (as many as `out` holds, `LANES·m` floats each) against all `m`
    /// rows: `out[(g·m + r)·LANES + c]` is row r's output in column `c` of group `first + g`.
    fn column_groups(&self, first: usize, acts: &[ActBlock], m: usize, out: &mut [f32]) {
        let kb = self.k / QK;
        for (g, group_out) in out.chunks_mut(LANES * m).enumerate() {
            let at = (first + g) * kb;
            match &self.groups {
                Groups::Q4_1(w) => self.rows(&w[at..at + kb], acts, group_out),
                Groups::Q8_0(w) => self.rows(&w[at..at + kb], acts, group_out),
            }
        }
    }

    /// One column group's blocks against every row, [`ROW_GROUP`] rows at a time.
    fn rows<W: Interleaved>(&self, weights: &[W], acts: &[ActBlock], out: &mut [f32]) {
        let kb = weights.len();
        for (index, rows_out) in out.chunks_mut(ROW_GROUP * LANES).enumerate() {
            let first = index * ROW_GROUP * kb;
            let rows = &acts[first..first + rows_out.len() / LANES * kb];
            // SAFETY: `self.vnni` was detected on this CPU, with AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                match (self.vnni, rows_out.len() / LANES) {
                    (Vnni::Avx, 1) => rows_avx_vnni::<W, 1>(weights, rows, rows_out),
                    (Vnni::Avx, 2) => rows_avx_vnni::<W, 2>(weights, rows, rows_out),
                    (Vnni::Avx, 3) => rows_avx_vnni::<W, 3>(weights, rows, rows_out),
                    (Vnni::Avx, _) => rows_avx_vnni::<W, ROW_GROUP>(weights, rows, rows_out),
                    (Vnni::Avx512, 1) => rows_avx512_vnni::<W, 1>(weights, rows, rows_out),
                    (Vnni::Avx512, 2) => rows_avx512_vnni::<W, 2>(weights, rows, rows_out),
                    (Vnni::Avx512, 3) => rows_avx512_vnni::<W, 3>(weights, rows, rows_out),
                    (Vnni::Avx512, _) => rows_avx512_vnni::<W, ROW_GROUP>(weights, rows, rows_out),
                }
            }
        }
    }
}

/// ggml's `quantize_row_q8_1`, row by row: per block, the scale `max|x|/127` rounded to f16 and
/// quants rounded half away from zero. The rounding adds ½ to the magnitude and truncates, which
/// vectorizes, and differs from `roundf` only just below a half, where the addition itself rounds
/// up.
fn quantize_rows(xs: &[f32]) -> Vec<ActBlock> {
    xs.chunks_exact(QK)
        .map(|x| {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the kernels' callers hold a `ShortMatmul`, which exists only where
            // `Vnni::detect` found AVX2, FMA and F16C.
            unsafe {
                quantize_block_avx2(x)
            }
            #[cfg(not(target_arch = "x86_64"))]
            quantize_block(x)
        })
        .collect()
}

/// One block of [`quantize_rows`], in scalar arithmetic (the portable path and the AVX2 one's
/// oracle).
#[cfg(any(test, not(target_arch = "x86_64")))]
fn quantize_block(x: &[f32]) -> ActBlock {
    let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let (d, id) = block_scale(amax);
    let qs: [i8; QK] = std::array::from_fn(|j| {
        let v = x[j] * id;
        ((v.abs() + 0.5) as i32 * if v < 0.0 { -1 } else { 1 }) as i8
    });
    let sum = qs.iter().map(|&q| q as i32).sum::<i32>();
    ActBlock {
        d,
        s: scaled_sum(d, sum),
        sum,
        qs,
    }
}

/// The stored scale (f16-rounded `amax/127`) and the multiplier that quantizes by the unrounded one.
fn block_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (f16::from_f32(d).to_f32(), id)
}

/// A block's `d·Σq` as Q8_1 keeps it: both factors and the product in f16.
fn scaled_sum(d: f32, sum: i32) -> f32 {
    f16::from_f32(f16::from_f32(sum as f32).to_f32() * d).to_f32()
}

/// [`quantize_block`] in eight lanes, bit for bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_block_avx2(x: &[f32]) -> ActBlock {
    use std::arch::x86_64::*;
    let mut block = ActBlock {
        d: 0.0,
        s: 0.0,
        sum: 0,
        qs: [0; QK],
    };
    let Some(x) = x.get(..QK) else {
        return block;
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
    let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let total = _mm_add_epi32(
        _mm256_castsi256_si128(total),
        _mm256_extracti128_si256(total, 1),
    );
    let total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0b01_00_11_10));
    let total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0b10_11_00_01));
    let sum = _mm_cvtsi128_si32(total);
    // Packing works within 128-bit halves; the permutation puts the 32 bytes back in order.
    let packed = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(block.qs.as_mut_ptr() as *mut __m256i, ordered);
    block.d = d;
    block.s = scaled_sum(d, sum);
    block.sum = sum;
    block
}

/// A column group's block in one of the interleaved formats.
trait Interleaved: Sync {
    /// The unsigned weights of chunks `t` and `t + 4` (inputs `4t..4t+4` and `4t+16..4t+20`),
    /// four bytes per column. Q8_0 has 8 chunks, taken as two such pairs per `t`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn chunks(&self, t: usize) -> [std::arch::x86_64::__m256i; 2];
    /// Whether quants are stored with +128 (then `128·Σa` comes off the integer sums).
    const OFFSET_128: bool;
    /// Which activation chunks `chunks(t)` pairs with.
    fn chunk_inputs(t: usize) -> [usize; 2];
    fn d(&self) -> &[f16; LANES];
    /// The per-column additive term `m` (Q4_1), multiplied by the activations' `d·Σq`.
    fn m(&self) -> Option<&[f16; LANES]>;
}

impl Interleaved for Q4_1Group {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunks(&self, t: usize) -> [std::arch::x86_64::__m256i; 2] {
        use std::arch::x86_64::*;
        let packed = _mm256_loadu_si256(self.qs.as_ptr().add(32 * t) as *const __m256i);
        let low = _mm256_set1_epi8(0x0F);
        [
            _mm256_and_si256(packed, low),
            _mm256_and_si256(_mm256_srli_epi16(packed, 4), low),
        ]
    }
    const OFFSET_128: bool = false;
    fn chunk_inputs(t: usize) -> [usize; 2] {
        [4 * t, 4 * (t + 4)]
    }
    fn d(&self) -> &[f16; LANES] {
        &self.d
    }
    fn m(&self) -> Option<&[f16; LANES]> {
        Some(&self.m)
    }
}

impl Interleaved for Q8_0Group {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunks(&self, t: usize) -> [std::arch::x86_64::__m256i; 2] {
        use std::arch::x86_64::*;
        let at = |chunk: usize| self.qs.as_ptr().add(32 * chunk) as *const __m256i;
        [
            _mm256_loadu_si256(at(2 * t)),
            _mm256_loadu_si256(at(2 * t + 1)),
        ]
    }
    const OFFSET_128: bool = true;
    fn chunk_inputs(t: usize) -> [usize; 2] {
        [8 * t, 8 * t + 4]
    }
    fn d(&self) -> &[f16; LANES] {
        &self.d
    }
    fn m(&self) -> Option<&[f16; LANES]> {
        None
    }
}

/// Eight f16 scales as f32 lanes (F16C).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn halves(h: &[f16; LANES]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i))
}

/// The kernel, for `G` rows (`acts[r·kb..]`) against one column group, written once and compiled
/// under each VNNI flavour by the two entry points below (`dpbusd` is their instruction).
///
/// Per block and row: the integer sums of the eight columns accumulate exactly in their lanes, then
/// `lanes += (d_w·d_a)·sums (+ m·s)`, block after block. `out[r·LANES + c]`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rows_kernel<W: Interleaved, const G: usize>(
    weights: &[W],
    acts: &[ActBlock],
    out: &mut [f32],
    dpbusd: impl Fn(
        std::arch::x86_64::__m256i,
        std::arch::x86_64::__m256i,
        std::arch::x86_64::__m256i,
    ) -> std::arch::x86_64::__m256i,
) {
    use std::arch::x86_64::*;
    let kb = weights.len();
    // The only bounds the loop relies on, checked once.
    if acts.len() < G * kb || out.len() < G * LANES {
        return;
    }
    let mut lanes = [_mm256_setzero_ps(); G];
    for (b, w) in weights.iter().enumerate() {
        let row = |g: usize| acts.get_unchecked(g * kb + b);
        let mut sums = [_mm256_setzero_si256(); G];
        for t in 0..CHUNK_PAIRS {
            let chunks = w.chunks(t);
            let inputs = W::chunk_inputs(t);
            for (g, sum) in sums.iter_mut().enumerate() {
                let qs = row(g).qs.as_ptr();
                for (chunk, input) in chunks.iter().zip(inputs) {
                    let a = _mm256_set1_epi32((qs.add(input) as *const i32).read_unaligned());
                    *sum = dpbusd(*sum, *chunk, a);
                }
            }
        }
        let d = halves(w.d());
        for (g, (lane, mut sum)) in lanes.iter_mut().zip(sums).enumerate() {
            let a = row(g);
            if W::OFFSET_128 {
                sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(128 * a.sum));
            }
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(a.d));
            *lane = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *lane);
            if let Some(m) = w.m() {
                *lane = _mm256_fmadd_ps(halves(m), _mm256_set1_ps(a.s), *lane);
            }
        }
    }
    for (g, lane) in lanes.iter().enumerate() {
        _mm256_storeu_ps(out.as_mut_ptr().add(g * LANES), *lane);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn rows_avx_vnni<W: Interleaved, const G: usize>(
    weights: &[W],
    acts: &[ActBlock],
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    rows_kernel::<W, G>(weights, acts, out, |s, w, a| {
        _mm256_dpbusd_avx_epi32(s, w, a)
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn rows_avx512_vnni<W: Interleaved, const G: usize>(
    weights: &[W],
    acts: &[ActBlock],
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    rows_kernel::<W, G>(weights, acts, out, |s, w, a| _mm256_dpbusd_epi32(s, w, a))
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

    /// The oracle: candle's dequantized weights against our dequantized activations, in f64, with
    /// Q4_1's offsets taken as ggml's `vec_dot_q4_1_q8_1` takes them: `m` times the activations'
    /// f16-rounded `d·Σq` (Q8_1's `s`), not their exact sum.
    fn reference(q: &QTensor, xs: &[f32], n: usize, k: usize) -> Vec<f64> {
        let w = flat(q.dequantize(&Device::Cpu).unwrap());
        let raw = q.data().unwrap();
        let acts = quantize_rows(xs);
        let a: Vec<f64> = acts
            .iter()
            .flat_map(|b| b.qs.map(|q| q as f64 * b.d as f64))
            .collect();
        let m = xs.len() / k;
        let kb = k / QK;
        // Per (column, block): what Q8_1's rounded `s` adds over the exact sum, for Q4_1.
        let offset_error = |c: usize, r: usize, b: usize| match q.dtype() {
            GgmlDType::Q4_1 => {
                let at = (c * kb + b) * (4 + QK / 2);
                let min = f16::from_le_bytes([raw[at + 2], raw[at + 3]]).to_f32() as f64;
                let act = &acts[r * kb + b];
                let sum: i32 = act.qs.iter().map(|&x| x as i32).sum();
                let s16 = f16::from_f32(f16::from_f32(sum as f32).to_f32() * act.d).to_f32();
                min * (s16 as f64 - act.d as f64 * sum as f64)
            }
            _ => 0.0,
        };
        (0..m)
            .flat_map(|r| {
                let (a, w) = (&a, &w);
                (0..n).map(move |c| {
                    let exact: f64 = (0..k).map(|i| a[r * k + i] * w[c * k + i] as f64).sum();
                    exact + (0..kb).map(|b| offset_error(c, r, b)).sum::<f64>()
                })
            })
            .collect()
    }

    /// For each format and each VNNI flavour the CPU has: every row's output is the same bit for
    /// bit whether the row runs alone or with 1–14 others (what exact verification rests on), the
    /// products match the dequantized oracle, both flavours agree bit for bit, products sharing one
    /// input equal separate ones, and candle's own product is close.
    #[test]
    fn rows_are_independent_and_match_the_oracle() {
        let dev = Device::Cpu;
        let flavours: Vec<Vnni> = [Vnni::Avx, Vnni::Avx512]
            .into_iter()
            .filter(|v| match v {
                Vnni::Avx => is_x86_feature_detected!("avxvnni"),
                Vnni::Avx512 => {
                    is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
                }
            })
            .collect();
        if flavours.is_empty() {
            eprintln!("no VNNI on this CPU: candle's kernels serve instead");
            return;
        }
        let (n, k) = (96, 320);
        let w = Tensor::from_vec(pseudo(n * k, 7919, 997, 0.2), (n, k), &dev).unwrap();
        let m = 15;
        let xs = pseudo(m * k, 104729, 1009, 3.0);
        let x = |rows: usize| Tensor::from_vec(xs[..rows * k].to_vec(), (1, rows, k), &dev);
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let oracle = reference(&q, &xs, n, k);
            let mut first_flavour: Option<Vec<f32>> = None;
            for &vnni in &flavours {
                let ours = ShortMatmul::with_vnni(&q, vnni).unwrap().unwrap();
                let all = flat(ours.forward(&x(m).unwrap()).unwrap());
                for rows in [1usize, 2, 3, 4, 5, 15] {
                    let alone = flat(ours.forward(&x(rows).unwrap()).unwrap());
                    assert!(alone == all[..rows * n], "{dtype:?}: {rows} rows differ");
                }
                for (i, (&a, &o)) in all.iter().zip(&oracle).enumerate() {
                    assert!(
                        (a as f64 - o).abs() <= 1e-4 * o.abs().max(1.0),
                        "{dtype:?} {vnni:?} at {i}: {a} vs oracle {o}"
                    );
                }
                match &first_flavour {
                    Some(f) => assert!(*f == all, "{dtype:?}: VNNI flavours differ"),
                    None => first_flavour = Some(all.clone()),
                }
                let shared = ShortMatmul::forward_shared(&[&ours, &ours], &x(m).unwrap()).unwrap();
                for part in shared {
                    assert!(flat(part) == all, "{dtype:?}: a shared product differs");
                }
            }
            let candle = flat(
                QMatMul::from_qtensor(q)
                    .unwrap()
                    .forward(&x(m).unwrap())
                    .unwrap(),
            );
            let ours = first_flavour.unwrap();
            for (a, b) in ours.iter().zip(&candle) {
                assert!(
                    (a - b).abs() <= 1e-3 * b.abs().max(1.0),
                    "{a} vs candle {b}"
                );
            }
        }
    }

    /// The vector quantizer gives the scalar one's blocks bit for bit, halves and zeros included.
    #[test]
    fn vector_quantization_matches_scalar() {
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        if !(avx2 && is_x86_feature_detected!("f16c")) {
            return;
        }
        let mut xs = pseudo(64 * QK, 7919, 1013, 9.0);
        // A block whose maximum makes the scale 1 (exact halves), and a block of zeros.
        xs.extend((0..QK).map(|i| if i == 0 { 127.0 } else { i as f32 - 15.5 }));
        xs.extend([0.0; QK]);
        for x in xs.chunks_exact(QK) {
            // SAFETY: AVX2, FMA and F16C checked above.
            let vector = unsafe { quantize_block_avx2(x) };
            let scalar = quantize_block(x);
            assert_eq!(vector.qs, scalar.qs, "{x:?}");
            assert_eq!(
                (vector.sum, vector.d, vector.s),
                (scalar.sum, scalar.d, scalar.s)
            );
        }
    }

    /// Shapes the kernel cannot take are left to candle.
    #[test]
    fn unsupported_shapes_are_declined() {
        let dev = Device::Cpu;
        for (n, dtype) in [(12, GgmlDType::Q8_0), (16, GgmlDType::F16)] {
            let w = Tensor::zeros((n, 64), candle_core::DType::F32, &dev).unwrap();
            let q = QTensor::quantize(&w, dtype).unwrap();
            assert!(ShortMatmul::with_vnni(&q, Vnni::Avx).unwrap().is_none());
        }
        let w = Tensor::zeros((16, 64), candle_core::DType::F32, &dev).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        assert!(ShortMatmul::with_vnni(&q, Vnni::Avx).unwrap().is_some());
    }
}
