//! The GGUF block formats our kernels take, decoded block by block and repacked so that eight
//! output columns sit side by side (one per 32-bit lane).
//!
//! Every format is brought to one shape per 32 inputs: unsigned quants `q` with the weight
//! `scale·(q − offset) + min`, one scale per block (or one per 16-input half, for Q6_K), and an
//! optional additive minimum. The quants are packed as nibbles (4-bit formats) or bytes (the rest),
//! in the order the kernels load them: a 32-byte load holds four consecutive inputs of each of the
//! eight columns.

use half::f16;

/// Weights per kernel block.
pub(super) const QK: usize = 32;
/// Output columns whose weights are interleaved: one per 32-bit lane of an AVX2 register.
pub(super) const LANES: usize = 8;

/// One column's 32 inputs in the common shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct SubBlock {
    /// Unsigned quants, the format's offset included.
    pub q: [u8; QK],
    /// The scale of inputs 0..16 and 16..32 (equal but for Q6_K).
    pub scale: [f32; 2],
    /// The additive term (Q4_1's `m`, Q4_K's `−dmin·m`), 0 where the format has none.
    pub min: f32,
}

/// The formats we repack, with their GGUF block sizes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Format {
    Q4_1,
    Q4K,
    Q5_0,
    Q6K,
    Q8_0,
}

impl Format {
    pub fn of(dtype: candle_core::quantized::GgmlDType) -> Option<Self> {
        use candle_core::quantized::GgmlDType as T;
        Some(match dtype {
            T::Q4_1 => Format::Q4_1,
            T::Q4K => Format::Q4K,
            T::Q5_0 => Format::Q5_0,
            T::Q6K => Format::Q6K,
            T::Q8_0 => Format::Q8_0,
            _ => return None,
        })
    }

    /// Inputs per GGUF block and bytes per block.
    pub fn block(self) -> (usize, usize) {
        match self {
            Format::Q4_1 => (32, 20),
            Format::Q5_0 => (32, 22),
            Format::Q8_0 => (32, 34),
            Format::Q4K => (256, 144),
            Format::Q6K => (256, 210),
        }
    }

    /// Sub-block `s` (inputs `32s..32s+32`) of one GGUF block's bytes, as the format's
    /// dequantization in ggml defines it.
    pub fn sub_block(self, bytes: &[u8], s: usize) -> SubBlock {
        let half = |i: usize| f16::from_le_bytes([bytes[i], bytes[i + 1]]).to_f32();
        let mut q = [0u8; QK];
        match self {
            Format::Q4_1 => {
                for (e, q) in q.iter_mut().enumerate() {
                    *q = nibble(bytes[4 + e % 16], e >= 16);
                }
                SubBlock::new(q, [half(0); 2], half(2))
            }
            Format::Q8_0 => {
                for (q, &b) in q.iter_mut().zip(&bytes[2..2 + QK]) {
                    *q = b ^ 0x80;
                }
                SubBlock::new(q, [half(0); 2], 0.0)
            }
            Format::Q5_0 => {
                let high = u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
                for (e, q) in q.iter_mut().enumerate() {
                    *q = nibble(bytes[6 + e % 16], e >= 16) | (((high >> e) & 1) << 4) as u8;
                }
                SubBlock::new(q, [half(0); 2], 0.0)
            }
            Format::Q4K => {
                let (d, dmin) = (half(0), half(2));
                let (sc, m) = k4_scale_min(&bytes[4..16], s);
                for (l, q) in q.iter_mut().enumerate() {
                    *q = nibble(bytes[16 + 32 * (s / 2) + l], s % 2 == 1);
                }
                SubBlock::new(q, [d * sc as f32; 2], -(dmin * m as f32))
            }
            Format::Q6K => {
                let d = half(208);
                let scales = &bytes[192..208];
                for (l, q) in q.iter_mut().enumerate() {
                    *q = q6k_quant(bytes, 32 * s + l);
                }
                let scale = |j: usize| d * scales[j] as i8 as f32;
                SubBlock::new(q, [scale(2 * s), scale(2 * s + 1)], 0.0)
            }
        }
    }
}

impl SubBlock {
    fn new(q: [u8; QK], scale: [f32; 2], min: f32) -> Self {
        Self { q, scale, min }
    }
}

fn nibble(byte: u8, high: bool) -> u8 {
    if high {
        byte >> 4
    } else {
        byte & 0x0F
    }
}

/// Q4_K's 6-bit scale and minimum of sub-block `j`, from its 12 packed bytes.
fn k4_scale_min(packed: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4),
            (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
        )
    }
}

/// Q6_K's unsigned 6-bit quant of input `e` (0..256): four low bits in `ql`, two high in `qh`,
/// laid out in two halves of 128 inputs, each in four runs of 32.
fn q6k_quant(bytes: &[u8], e: usize) -> u8 {
    let (half, run, l) = (e / 128, (e % 128) / 32, e % 32);
    let ql = bytes[64 * half + l + 32 * (run % 2)];
    let qh = bytes[128 + 32 * half + l];
    nibble(ql, run >= 2) | (((qh >> (2 * run)) & 3) << 4)
}

/// How the quants sit in a group's bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Packing {
    /// 4-bit quants: `qs[32t + 4c + i]` holds column `c`'s input `4t + i` in its low nibble and
    /// `4t + 16 + i` in its high one, so a load and two masks give inputs `4t..` and `4t+16..`.
    Nibbles,
    /// One byte per quant: `qs[32t + 4c + i]` is column `c`'s input `4t + i`.
    Bytes,
}

impl Packing {
    pub const fn len(self) -> usize {
        match self {
            Packing::Nibbles => LANES * QK / 2,
            Packing::Bytes => LANES * QK,
        }
    }

    /// Which inputs the two chunks of pair `t` (0..4) hold, four from each.
    pub const fn pair_inputs(self, t: usize) -> [usize; 2] {
        match self {
            Packing::Nibbles => [4 * t, 4 * t + 16],
            Packing::Bytes => [8 * t, 8 * t + 4],
        }
    }

    fn pack(self, columns: &[SubBlock; LANES], qs: &mut [u8]) {
        for (c, column) in columns.iter().enumerate() {
            for i in 0..4 {
                match self {
                    Packing::Nibbles => {
                        for t in 0..4 {
                            qs[32 * t + 4 * c + i] =
                                column.q[4 * t + i] | (column.q[4 * t + 16 + i] << 4);
                        }
                    }
                    Packing::Bytes => {
                        for t in 0..LANES {
                            qs[32 * t + 4 * c + i] = column.q[4 * t + i];
                        }
                    }
                }
            }
        }
    }
}

/// One block (32 inputs) of eight columns in one of the repacked formats.
pub(super) trait Interleaved: Sync + Send + Sized {
    const PACKING: Packing;
    /// What a stored quant exceeds the signed one by; `OFFSET·Σa` comes off the integer sums.
    /// 128 marks 8-bit quants, whose products some flavours take signed instead.
    const OFFSET: i32;
    /// Whether the two 16-input halves have their own scales (then their sums are kept apart).
    const HALF_SCALES: bool;
    const HAS_MIN: bool;
    /// The largest stored quant (what bounds the x86 kernels' partial sums in i16).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const MAX_QUANT: i32;

    fn build(columns: &[SubBlock; LANES]) -> Self;
    fn qs(&self) -> &[u8];
    /// Column `c`'s scale of half `h`.
    fn scale(&self, h: usize, c: usize) -> f32;
    fn min(&self, c: usize) -> f32;
    /// The activations' `d·Σq` that the minimum multiplies: exact, or Q8_1's f16-rounded one for
    /// Q4_1, as ggml's `vec_dot_q4_1_q8_1` takes it.
    fn act_sum(a: &super::activations::ActBlock) -> f32 {
        a.ds
    }

    /// The activations' Σq over half `h`'s inputs (all 32 without half scales): what `OFFSET`
    /// multiplies in the integer sums of the x86 and ARM kernels.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    fn offset_sum(a: &super::activations::ActBlock, h: usize) -> i32 {
        match Self::HALF_SCALES {
            true => a.half_sums[h],
            false => a.sum(),
        }
    }

    /// Scales of half `h` as eight f32 lanes (F16C where they are stored as f16).
    ///
    /// # Safety
    /// The CPU has AVX and F16C (every x86 flavour is checked for AVX2, FMA and F16C). `h` needs
    /// no promise: impls ignore it or index with a bounds check.
    #[cfg(target_arch = "x86_64")]
    unsafe fn scale_lanes(&self, h: usize) -> std::arch::x86_64::__m256;
    /// Minimums as eight f32 lanes (zeros for formats without one).
    ///
    /// # Safety
    /// The CPU has AVX and F16C (every x86 flavour is checked for AVX2, FMA and F16C).
    #[cfg(target_arch = "x86_64")]
    unsafe fn min_lanes(&self) -> std::arch::x86_64::__m256;
}

/// How a group stores per-column scales: as the file does (f16), or in f32 where they are products
/// of two of the file's (K-quants' `d·sc`, exact in f32).
pub(super) trait Stored: Copy + Send + Sync {
    fn store(v: f32) -> Self;
    fn load(self) -> f32;
    /// Eight values as f32 lanes (F16C for f16).
    ///
    /// # Safety
    /// The CPU has AVX and F16C (every x86 flavour is checked for AVX2, FMA and F16C).
    #[cfg(target_arch = "x86_64")]
    unsafe fn lanes(v: &[Self; LANES]) -> std::arch::x86_64::__m256;
}

impl Stored for f16 {
    fn store(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn load(self) -> f32 {
        self.to_f32()
    }
    /// Eight f16s widened by `vcvtph2ps`.
    ///
    /// # Safety
    /// The CPU has AVX and F16C; nothing about `v`, whose type is exactly the 16 bytes loaded.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn lanes(v: &[Self; LANES]) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr() as *const __m128i))
    }
}

impl Stored for f32 {
    fn store(v: f32) -> Self {
        v
    }
    fn load(self) -> f32 {
        self
    }
    /// Eight f32s, loaded as they are.
    ///
    /// # Safety
    /// The CPU has AVX; nothing about `v`, whose type is exactly the 32 bytes loaded.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn lanes(v: &[Self; LANES]) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(v.as_ptr())
    }
}

fn column_values<S: Stored>(
    columns: &[SubBlock; LANES],
    f: impl Fn(&SubBlock) -> f32,
) -> [S; LANES] {
    std::array::from_fn(|c| S::store(f(&columns[c])))
}

/// 4-bit quants with a scale and a minimum per column and block: Q4_1 (f16 as stored; its minimum
/// multiplies Q8_1's rounded activation sums, as ggml's `vec_dot_q4_1_q8_1` does) and Q4_K (f32).
pub(super) struct NibbleGroup<S, const Q8_1_SUM: bool> {
    qs: [u8; Packing::Nibbles.len()],
    d: [S; LANES],
    m: [S; LANES],
}

pub(super) type Q4_1Group = NibbleGroup<f16, true>;
pub(super) type Q4KGroup = NibbleGroup<f32, false>;

impl<S: Stored, const Q8_1_SUM: bool> Interleaved for NibbleGroup<S, Q8_1_SUM> {
    const PACKING: Packing = Packing::Nibbles;
    const OFFSET: i32 = 0;
    const HALF_SCALES: bool = false;
    const HAS_MIN: bool = true;
    const MAX_QUANT: i32 = 15;

    fn build(columns: &[SubBlock; LANES]) -> Self {
        let mut qs = [0; Packing::Nibbles.len()];
        Self::PACKING.pack(columns, &mut qs);
        Self {
            qs,
            d: column_values(columns, |s| s.scale[0]),
            m: column_values(columns, |s| s.min),
        }
    }
    fn qs(&self) -> &[u8] {
        &self.qs
    }
    fn scale(&self, _: usize, c: usize) -> f32 {
        self.d[c].load()
    }
    fn min(&self, c: usize) -> f32 {
        self.m[c].load()
    }
    fn act_sum(a: &super::activations::ActBlock) -> f32 {
        if Q8_1_SUM {
            a.s
        } else {
            a.ds
        }
    }
    /// The blocks' scales `d` (one per block: `h` is ignored).
    ///
    /// # Safety
    /// The CPU has AVX and F16C (as [`Stored::lanes`]).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scale_lanes(&self, _: usize) -> std::arch::x86_64::__m256 {
        S::lanes(&self.d)
    }
    /// The blocks' minimums `m`.
    ///
    /// # Safety
    /// The CPU has AVX and F16C (as [`Stored::lanes`]).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn min_lanes(&self) -> std::arch::x86_64::__m256 {
        S::lanes(&self.m)
    }
}

/// Byte quants with one f16 scale per block: Q8_0 (`OFFSET` 128, signed quants stored +128) and
/// Q5_0 (16).
pub(super) struct ByteGroup<const OFFSET: i32> {
    qs: [u8; Packing::Bytes.len()],
    d: [f16; LANES],
}

pub(super) type Q8_0Group = ByteGroup<128>;
pub(super) type Q5_0Group = ByteGroup<16>;

impl<const OFFSET_: i32> Interleaved for ByteGroup<OFFSET_> {
    const PACKING: Packing = Packing::Bytes;
    const OFFSET: i32 = OFFSET_;
    const HALF_SCALES: bool = false;
    const HAS_MIN: bool = false;
    const MAX_QUANT: i32 = 2 * OFFSET_ - 1;

    fn build(columns: &[SubBlock; LANES]) -> Self {
        let mut qs = [0; Packing::Bytes.len()];
        Self::PACKING.pack(columns, &mut qs);
        Self {
            qs,
            d: column_values(columns, |s| s.scale[0]),
        }
    }
    fn qs(&self) -> &[u8] {
        &self.qs
    }
    fn scale(&self, _: usize, c: usize) -> f32 {
        self.d[c].load()
    }
    fn min(&self, _: usize) -> f32 {
        0.0
    }
    /// The blocks' f16 scales `d` (one per block: `h` is ignored).
    ///
    /// # Safety
    /// The CPU has AVX and F16C.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scale_lanes(&self, _: usize) -> std::arch::x86_64::__m256 {
        f16::lanes(&self.d)
    }
    /// Zeros: the format has no minimum.
    ///
    /// # Safety
    /// The CPU has AVX.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn min_lanes(&self) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_setzero_ps()
    }
}

/// Q6_K: byte quants stored +32, a scale `d·sc` (exact in f32) per 16-input half.
pub(super) struct Q6KGroup {
    qs: [u8; Packing::Bytes.len()],
    d: [[f32; LANES]; 2],
}

impl Interleaved for Q6KGroup {
    const PACKING: Packing = Packing::Bytes;
    const OFFSET: i32 = 32;
    const HALF_SCALES: bool = true;
    const HAS_MIN: bool = false;
    const MAX_QUANT: i32 = 63;

    fn build(columns: &[SubBlock; LANES]) -> Self {
        let mut qs = [0; Packing::Bytes.len()];
        Self::PACKING.pack(columns, &mut qs);
        Self {
            qs,
            d: [0, 1].map(|h| column_values(columns, |s| s.scale[h])),
        }
    }
    fn qs(&self) -> &[u8] {
        &self.qs
    }
    fn scale(&self, h: usize, c: usize) -> f32 {
        self.d[h][c]
    }
    fn min(&self, _: usize) -> f32 {
        0.0
    }
    /// Half `h`'s scales `d·sc`.
    ///
    /// # Safety
    /// The CPU has AVX; `h` is bounds-checked (above 1 it panics).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scale_lanes(&self, h: usize) -> std::arch::x86_64::__m256 {
        f32::lanes(&self.d[h])
    }
    /// Zeros: the format has no minimum.
    ///
    /// # Safety
    /// The CPU has AVX.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn min_lanes(&self) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_setzero_ps()
    }
}
