//! Attention for short passes (decoding, draft verification) on the CPU, straight over the cache's
//! memory.
//!
//! Each query row attends over exactly the keys it sees, in the same loops whether it is decoded alone
//! or verified with a draft, so greedy speculative decoding reproduces plain greedy decoding bit for
//! bit (a batched pass would pad each row with masked keys and regroup softmax's sums). The rows of
//! a pass may form a tree (a draft tree verified at once): a row then sees the cached positions and
//! its own ancestors among the pass's rows, in order, exactly the keys a plain decode of its path
//! would see. Done with
//! candle's tensor ops this took a dozen small ops per row and layer, about 3 ms per row for
//! SmolLM2; these loops take a fraction of that.

use candle_core::{Layout, Storage, Tensor};
use rayon::prelude::*;

/// Where one layer's queries and cached keys/values live, and their shapes.
pub struct AttentionInput<'a> {
    /// Queries `(batch, heads, n, head_dim)`, rotated.
    pub q: &'a Tensor,
    /// The cache's views `(batch, kv_heads, pos + n, head_dim)`, the new rows included.
    pub keys: &'a Tensor,
    pub values: &'a Tensor,
    /// Positions cached before this pass.
    pub pos: usize,
    /// Which of the pass's rows each row sees.
    pub paths: &'a RowPaths,
    /// Sliding window of this layer, if any.
    pub window: Option<usize>,
}

/// For each row of a short pass, the rows it attends to among the pass's own: its ancestors from
/// the first row down, then itself. A chain (decoding, a draft chain) sees every earlier row.
#[derive(Debug, Clone)]
pub struct RowPaths(Vec<Vec<usize>>);

impl RowPaths {
    pub fn chain(n: usize) -> Self {
        Self((0..n).map(|i| (0..=i).collect()).collect())
    }

    /// The paths of a tree whose row `i > 0` hangs under `parents[i] < i` (`parents[0]`, the root's,
    /// is ignored).
    pub fn tree(parents: &[usize]) -> Result<Self, String> {
        let mut paths: Vec<Vec<usize>> = Vec::with_capacity(parents.len());
        for (i, &parent) in parents.iter().enumerate() {
            let mut path = match i {
                0 => Vec::new(),
                _ => match paths.get(parent).filter(|_| parent < i) {
                    Some(up) => up.clone(),
                    None => return Err(format!("row {i} has parent {parent}, not an earlier row")),
                },
            };
            path.push(i);
            paths.push(path);
        }
        Ok(Self(paths))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Each row's distance from the first row: its position after the cached ones.
    pub fn depths(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().map(|p| p.len() - 1)
    }
}

/// Attention output `(batch, n, heads · head_dim)`, the layout the output projection takes.
pub fn attend(input: &AttentionInput) -> candle_core::Result<Tensor> {
    let q = input.q.contiguous()?;
    let (batch, heads, n, d) = q.dims4()?;
    let (kb, kv_heads, len, kd) = input.keys.dims4()?;
    let paths_fit = input.paths.len() == n;
    if kb != batch
        || kd != d
        || len != input.pos + n
        || kv_heads == 0
        || heads % kv_heads != 0
        || !paths_fit
    {
        candle_core::bail!(
            "attention: queries {:?} do not fit keys {:?} at position {}",
            q.dims(),
            input.keys.dims(),
            input.pos
        );
    }
    let (k_storage, k_layout) = input.keys.storage_and_layout();
    let (v_storage, v_layout) = input.values.storage_and_layout();
    let (q_storage, q_layout) = q.storage_and_layout();
    let keys = CpuView::of(&k_storage, k_layout, input.keys.dims())?;
    let values = CpuView::of(&v_storage, v_layout, input.values.dims())?;
    let queries = CpuView::of(&q_storage, q_layout, q.dims())?;
    let group = heads / kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    // Heads in parallel (each row computes the same way on any thread), each writing its rows
    // `n × d` back to back; then interleaved into the projection's layout.
    let by_head: Vec<Vec<f32>> = (0..batch * heads)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / heads, bh % heads);
            let kvh = h / group;
            let mut scores = Vec::with_capacity(len);
            let mut out = vec![0f32; n * d];
            for ((i, path), row_out) in input.paths.0.iter().enumerate().zip(out.chunks_mut(d)) {
                // The row's logical keys: cached positions `first..pos`, then its path, clipped
                // from the front by the window.
                let end = input.pos + path.len();
                let first = input.window.map_or(0, |w| end.saturating_sub(w));
                let cached = first.min(input.pos)..input.pos;
                let path = &path[first.saturating_sub(input.pos)..];
                let row = Row {
                    query: queries.rows(b, h, i, i + 1),
                    keys: Vectors {
                        cached: keys.rows(b, kvh, cached.start, cached.end),
                        pass: keys.rows(b, kvh, input.pos, len),
                        path,
                    },
                    values: Vectors {
                        cached: values.rows(b, kvh, cached.start, cached.end),
                        pass: values.rows(b, kvh, input.pos, len),
                        path,
                    },
                    d,
                    scale,
                };
                row.attend(&mut scores, row_out);
            }
            out
        })
        .collect();
    let mut out = vec![0f32; batch * n * heads * d];
    for (bh, head) in by_head.iter().enumerate() {
        let (b, h) = (bh / heads, bh % heads);
        for (i, row) in head.chunks(d).enumerate() {
            let at = ((b * n + i) * heads + h) * d;
            out[at..at + d].copy_from_slice(row);
        }
    }
    Tensor::from_vec(out, (batch, n, heads * d), q.device())
}

/// Keys or values a row sees, `d` floats each: cached ones back to back, then the pass's rows on
/// its path.
struct Vectors<'a> {
    cached: &'a [f32],
    /// Every row of the pass, back to back.
    pass: &'a [f32],
    path: &'a [usize],
}

impl<'a> Vectors<'a> {
    /// In order. Path rows come from [`RowPaths`], so they index `pass`.
    fn iter(&self, d: usize) -> impl Iterator<Item = &'a [f32]> + '_ {
        let pass = self.pass;
        self.cached
            .chunks_exact(d)
            .chain(self.path.iter().map(move |&r| &pass[r * d..(r + 1) * d]))
    }
}

/// One query row and the keys and values it sees.
struct Row<'a> {
    query: &'a [f32],
    keys: Vectors<'a>,
    values: Vectors<'a>,
    d: usize,
    scale: f32,
}

impl Row<'_> {
    /// Softmax of the scaled dot products, then the probability-weighted sum of the values.
    fn attend(&self, scores: &mut Vec<f32>, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY (each arm): the CPU has AVX2 and FMA, checked just above.
                match self.d {
                    64 => return unsafe { self.attend_avx2::<8>(scores, out) },
                    128 => return unsafe { self.attend_avx2::<16>(scores, out) },
                    256 => return unsafe { self.attend_avx2::<32>(scores, out) },
                    _ => {}
                }
            }
        }
        scores.clear();
        for k in self.keys.iter(self.d) {
            let dot: f32 = self.query.iter().zip(k).map(|(q, k)| q * k).sum();
            scores.push(dot * self.scale);
        }
        let sum = exponentiate(scores);
        out.fill(0.0);
        for (e, v) in scores.iter().zip(self.values.iter(self.d)) {
            let p = e / sum;
            for (o, x) in out.iter_mut().zip(v) {
                *o += p * x;
            }
        }
    }

    /// The same with eight lanes and fused multiply-adds, for head dimensions of `8·C`: the query and
    /// the output stay in registers, and four keys are scored at once. Each score is the same chain
    /// of multiply-adds however the keys are grouped.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn attend_avx2<const C: usize>(&self, scores: &mut Vec<f32>, out: &mut [f32]) {
        use std::arch::x86_64::*;
        const KEYS_AT_ONCE: usize = 4;
        let d = 8 * C;
        let load = |v: &[f32], c: usize| _mm256_loadu_ps(v[8 * c..8 * c + 8].as_ptr());
        let q: [__m256; C] = std::array::from_fn(|c| load(self.query, c));
        scores.clear();
        let mut groups = self.keys.cached.chunks_exact(KEYS_AT_ONCE * d);
        for group in &mut groups {
            let mut acc = [_mm256_setzero_ps(); KEYS_AT_ONCE];
            for (c, &qc) in q.iter().enumerate() {
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(qc, load(&group[r * d..], c), *a);
                }
            }
            scores.extend(acc.iter().map(|&a| hsum(a) * self.scale));
        }
        let rest = Vectors {
            cached: groups.remainder(),
            ..self.keys
        };
        for k in rest.iter(d) {
            let mut a = _mm256_setzero_ps();
            for (c, &qc) in q.iter().enumerate() {
                a = _mm256_fmadd_ps(qc, load(k, c), a);
            }
            scores.push(hsum(a) * self.scale);
        }
        let sum = exponentiate(scores);
        let mut acc = [_mm256_setzero_ps(); C];
        for (e, v) in scores.iter().zip(self.values.iter(d)) {
            let p = _mm256_set1_ps(e / sum);
            for (c, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(p, load(v, c), *a);
            }
        }
        for (c, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out[8 * c..8 * c + 8].as_mut_ptr(), *a);
        }
    }
}

/// Replaces scores by `exp(score − max)` and returns their sum.
fn exponentiate(scores: &mut [f32]) -> f32 {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    sum
}

/// A 4-d f32 CPU tensor's memory, read in place through its strides (the cache's views are narrowed,
/// not copied).
struct CpuView<'a> {
    data: &'a [f32],
    offset: usize,
    strides: [usize; 3],
}

impl<'a> CpuView<'a> {
    /// Checks once that every vector of `dims` lies inside the storage, so `rows` cannot fail.
    fn of(storage: &'a Storage, layout: &Layout, dims: &[usize]) -> candle_core::Result<Self> {
        let Storage::Cpu(cpu) = storage else {
            candle_core::bail!("short attention runs on the CPU");
        };
        let stride = layout.stride();
        if dims.len() != 4 || stride.len() != 4 || stride[3] != 1 || stride[2] != dims[3] {
            candle_core::bail!("short attention needs each head's vectors back to back");
        }
        let data = cpu.as_slice::<f32>()?;
        let end = (0..3).try_fold(layout.start_offset() + dims[3], |end, i| {
            Some(end + dims[i].checked_sub(1)? * stride[i])
        });
        if end.is_none_or(|end| end > data.len()) {
            candle_core::bail!("short attention: a {dims:?} view outside its storage");
        }
        Ok(Self {
            data,
            offset: layout.start_offset(),
            strides: [stride[0], stride[1], stride[2]],
        })
    }

    /// Vectors `from..to` of head `h` in batch `b`, which lie back to back.
    fn rows(&self, b: usize, h: usize, from: usize, to: usize) -> &'a [f32] {
        let at = self.offset + b * self.strides[0] + h * self.strides[1];
        &self.data[at + from * self.strides[2]..at + to * self.strides[2]]
    }
}

/// The eight lanes' sum, added in halves (the order candle's `hsum_float_8` uses).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn hsum(x: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let res = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    let res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    let res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}
