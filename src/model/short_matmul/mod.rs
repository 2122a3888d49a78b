//! Our own quantized matrix products for passes of a few rows (decoding, draft verification), for
//! the block formats of the models we ship: Q4_1 and Q8_0 (SmolLM2), Q5_0, Q4_K, Q6_K and Q8_0
//! (Gemma-3's Q4_K_M file, whose 262k-row output head is Q8_0).
//!
//! candle computes one (row, column) dot product at a time, converting and scaling every block's
//! integer sum on its own, so a pass of k rows costs about k decode steps. Here the weights are
//! repacked at load time so that eight output columns sit side by side: four activation bytes,
//! broadcast, meet four weights of each of the eight columns in one multiply-add, every lane
//! summing its own column. A block's integer sums are exact; they are converted and scaled once per
//! eight columns, and each weight block is unpacked once for up to [`ROW_GROUP`] rows. Extra rows
//! cost little, which is what speculative verification needs, and one row (decoding) gains as much.
//!
//! The multiply-add comes in flavours ([`KernelFlavour`]): AVX-512 VNNI and AVX-VNNI (`vpdpbusd`),
//! AVX2 (`vpmaddubsw` + `vpmaddwd`), on aarch64 `sdot` and NEON's widening multiplies, and plain
//! Rust for every other CPU. All compute the same integer sums and the same float steps, so they
//! agree bit for bit. Every row runs the same
//! instructions on its own accumulators whatever the number of rows in the pass, so a row's output
//! does not depend on what shares the pass: a verified draft reproduces plain decoding bit for bit.

mod activations;
mod formats;
#[cfg(target_arch = "aarch64")]
mod neon;
mod portable;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use candle_core::quantized::QTensor;
use candle_core::Tensor;
use rayon::prelude::*;

use self::activations::{quantize_rows, ActBlock};
use self::formats::{
    Format, Interleaved, Q4KGroup, Q4_1Group, Q5_0Group, Q6KGroup, Q8_0Group, SubBlock, LANES, QK,
};
use crate::cpu::KernelFlavour;

/// Column groups per parallel work item.
const GROUPS_PER_TASK: usize = 4;
/// Rows whose accumulators are kept in registers while one weight block is in hand.
const ROW_GROUP: usize = 4;

/// Whether `acts` and `out` hold `G` rows against `kb` weight blocks: the only bounds the kernels'
/// loops rely on, checked by their one caller before each call.
fn holds_rows<const G: usize>(kb: usize, acts: &[ActBlock], out: &[f32]) -> bool {
    acts.len() >= G * kb && out.len() >= G * LANES
}

/// One product's output, `rows × width` floats row by row, written by many tasks at once: each
/// writes only its own column groups of every row, so no two write the same float.
struct Columns<'a> {
    rows: usize,
    width: usize,
    out: *mut f32,
    /// The buffer `out` points into, borrowed while tasks write.
    buffer: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: tasks share a `Columns` only to write disjoint column groups (`write`'s contract), into
// a buffer it borrows for as long as it lives.
unsafe impl Sync for Columns<'_> {}

impl<'a> Columns<'a> {
    /// `buffer` as rows of `width` floats (`width` > 0: a matrix has output columns).
    fn new(buffer: &'a mut [f32], width: usize) -> Self {
        Self {
            rows: buffer.len() / width.max(1),
            width,
            out: buffer.as_mut_ptr(),
            buffer: std::marker::PhantomData,
        }
    }

    /// Writes column group `group` of every row: `lanes[r·LANES..]` holds row `r`'s eight outputs.
    /// False, writing nothing, for a group or rows outside the output.
    ///
    /// # Safety
    /// No other thread writes the same group while this runs.
    unsafe fn write(&self, group: usize, lanes: &[f32]) -> bool {
        if (group + 1) * LANES > self.width || lanes.len() != self.rows * LANES {
            return false;
        }
        for (r, row) in lanes.chunks_exact(LANES).enumerate() {
            // SAFETY: the group lies within the row and the row within the buffer (`rows` whole
            // rows, checked above); no other thread writes these floats (the caller's promise).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    row.as_ptr(),
                    self.out.add(r * self.width + group * LANES),
                    LANES,
                )
            };
        }
        true
    }
}

/// The repacked weights of one matrix: column group `g`'s blocks at `g·kb..(g+1)·kb`.
enum Groups {
    Q4_1(Vec<Q4_1Group>),
    Q4K(Vec<Q4KGroup>),
    Q5_0(Vec<Q5_0Group>),
    Q6K(Vec<Q6KGroup>),
    Q8_0(Vec<Q8_0Group>),
}

pub struct ShortMatmul {
    /// Output features (rows of the weight matrix) and input features.
    n: usize,
    k: usize,
    format: Format,
    groups: Groups,
    flavour: KernelFlavour,
}

impl std::fmt::Debug for ShortMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ShortMatmul({:?}, {}×{}, {})",
            self.format, self.n, self.k, self.flavour
        )
    }
}

impl ShortMatmul {
    /// The matrix of a tensor `(n, k)` in one of our formats, for the given flavour; None for other
    /// types or shapes, an error for a flavour this CPU cannot run (the kernels' `unsafe` rests on
    /// this check).
    pub fn from_qtensor(q: &QTensor, flavour: KernelFlavour) -> candle_core::Result<Option<Self>> {
        flavour
            .check()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let Ok((n, k)) = q.shape().dims2() else {
            return Ok(None);
        };
        let Some(format) = Format::of(q.dtype()) else {
            return Ok(None);
        };
        let (block_inputs, block_bytes) = format.block();
        if k == 0 || k % block_inputs != 0 || n == 0 || n % LANES != 0 {
            return Ok(None);
        }
        let data = q.data()?;
        let blocks = k / block_inputs;
        if data.len() != n * blocks * block_bytes {
            return Ok(None);
        }
        let kb = k / QK;
        let per_block = block_inputs / QK;
        // Column `c`'s 32 inputs `32b..32b+32`, from the file's row-major blocks.
        let sub_block = |c: usize, b: usize| {
            let at = (c * blocks + b / per_block) * block_bytes;
            format.sub_block(&data[at..at + block_bytes], b % per_block)
        };
        fn repack<W: Interleaved>(
            n: usize,
            kb: usize,
            sub_block: impl Fn(usize, usize) -> SubBlock + Sync,
        ) -> Vec<W> {
            (0..n / LANES * kb)
                .into_par_iter()
                .map(|i| {
                    let (first, b) = (i / kb * LANES, i % kb);
                    W::build(&std::array::from_fn(|c| sub_block(first + c, b)))
                })
                .collect()
        }
        let groups = match format {
            Format::Q4_1 => Groups::Q4_1(repack(n, kb, sub_block)),
            Format::Q4K => Groups::Q4K(repack(n, kb, sub_block)),
            Format::Q5_0 => Groups::Q5_0(repack(n, kb, sub_block)),
            Format::Q6K => Groups::Q6K(repack(n, kb, sub_block)),
            Format::Q8_0 => Groups::Q8_0(repack(n, kb, sub_block)),
        };
        Ok(Some(Self {
            n,
            k,
            format,
            groups,
            flavour,
        }))
    }

    pub fn flavour(&self) -> KernelFlavour {
        self.flavour
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
        let flavour = parts.first().map_or(KernelFlavour::Portable, |p| p.flavour);
        let acts = quantize_rows(&xs, flavour);
        // Tasks over every part's column groups; each computes its groups one at a time and
        // writes them into their columns of every row of the part's output.
        let tasks: Vec<(usize, usize)> = parts
            .iter()
            .enumerate()
            .flat_map(|(p, part)| {
                let groups = part.n / LANES;
                (0..groups.div_ceil(GROUPS_PER_TASK)).map(move |t| (p, t * GROUPS_PER_TASK))
            })
            .collect();
        let mut outs: Vec<Vec<f32>> = parts.iter().map(|p| vec![0f32; m * p.n]).collect();
        let columns: Vec<Columns> = (outs.iter_mut().zip(parts))
            .map(|(out, part)| Columns::new(out, part.n))
            .collect();
        let misfit = std::sync::atomic::AtomicBool::new(false);
        tasks.par_iter().for_each_init(
            || vec![0f32; LANES * m],
            |lanes, &(p, first)| {
                let part = parts[p];
                for group in first..(first + GROUPS_PER_TASK).min(part.n / LANES) {
                    part.column_group(group, &acts, lanes);
                    // SAFETY: each task owns groups `first..first + GROUPS_PER_TASK` of part `p`.
                    if !unsafe { columns[p].write(group, lanes) } {
                        misfit.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            },
        );
        if misfit.into_inner() {
            candle_core::bail!("quantized matmul: a column group outside its output");
        }
        parts
            .iter()
            .zip(outs)
            .map(|(part, out)| {
                let mut shape = dims.clone();
                if let Some(last) = shape.last_mut() {
                    *last = part.n;
                }
                Tensor::from_vec(out, shape, x.device())
            })
            .collect()
    }

    /// Column group `group` against every row: `out[r·LANES + c]` is row r's output in column
    /// `c` of the group.
    fn column_group(&self, group: usize, acts: &[ActBlock], out: &mut [f32]) {
        let kb = self.k / QK;
        let at = group * kb;
        match &self.groups {
            Groups::Q4_1(w) => self.rows(&w[at..at + kb], acts, out),
            Groups::Q4K(w) => self.rows(&w[at..at + kb], acts, out),
            Groups::Q5_0(w) => self.rows(&w[at..at + kb], acts, out),
            Groups::Q6K(w) => self.rows(&w[at..at + kb], acts, out),
            Groups::Q8_0(w) => self.rows(&w[at..at + kb], acts, out),
        }
    }

    /// One column group's blocks against every row, [`ROW_GROUP`] rows at a time, in this
    /// matrix's flavour.
    fn rows<W: Interleaved>(&self, weights: &[W], acts: &[ActBlock], out: &mut [f32]) {
        let kb = weights.len();
        for (index, rows_out) in out.chunks_mut(ROW_GROUP * LANES).enumerate() {
            let first = index * ROW_GROUP * kb;
            let rows = &acts[first..first + rows_out.len() / LANES * kb];
            /// The kernel `$f` for the number of rows in hand (1 to [`ROW_GROUP`]), once the rows
            /// and the output are checked to hold them.
            macro_rules! by_rows {
                ($f:ident) => {{
                    macro_rules! rows_of {
                        ($g:expr) => {
                            if holds_rows::<{ $g }>(kb, rows, rows_out) {
                                $f::<W, { $g }>(weights, rows, rows_out)
                            }
                        };
                    }
                    match rows_out.len() / LANES {
                        1 => rows_of!(1),
                        2 => rows_of!(2),
                        3 => rows_of!(3),
                        _ => rows_of!(ROW_GROUP),
                    }
                }};
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `from_qtensor` checked the flavour against this CPU; `rows_of!` checks the
            // rows and the output.
            unsafe {
                use self::x86::{rows_avx2, rows_avx512_vnni, rows_avx_vnni};
                match self.flavour {
                    KernelFlavour::Avx512Vnni => by_rows!(rows_avx512_vnni),
                    KernelFlavour::AvxVnni => by_rows!(rows_avx_vnni),
                    KernelFlavour::Avx2 => by_rows!(rows_avx2),
                    // The ARM flavours never pass `from_qtensor`'s check here.
                    KernelFlavour::NeonDot | KernelFlavour::Neon | KernelFlavour::Portable => {
                        use self::portable::rows_portable;
                        by_rows!(rows_portable)
                    }
                }
            }
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `from_qtensor` checked the flavour against this CPU; `rows_of!` checks the
            // rows and the output.
            unsafe {
                use self::neon::{rows_neon, rows_neon_dot};
                match self.flavour {
                    KernelFlavour::NeonDot => by_rows!(rows_neon_dot),
                    KernelFlavour::Neon => by_rows!(rows_neon),
                    // The x86 flavours never pass `from_qtensor`'s check here.
                    KernelFlavour::Avx512Vnni
                    | KernelFlavour::AvxVnni
                    | KernelFlavour::Avx2
                    | KernelFlavour::Portable => {
                        use self::portable::rows_portable;
                        by_rows!(rows_portable)
                    }
                }
            }
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            {
                use self::portable::rows_portable;
                by_rows!(rows_portable)
            }
        }
    }
}
