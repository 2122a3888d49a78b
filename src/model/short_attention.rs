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

#[cfg(target_arch = "x86_64")]
mod x86;

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
        || input.values.dims() != input.keys.dims()
        || kd != d
        || len != input.pos + n
        || kv_heads == 0
        || heads % kv_heads != 0
        || !paths_fit
    {
        candle_core::bail!(
            "attention: queries {:?} do not fit keys {:?} and values {:?} at position {}",
            q.dims(),
            input.keys.dims(),
            input.values.dims(),
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
            let rows: Vec<Row> = (input.paths.0.iter().enumerate())
                .map(|(i, path)| {
                    // The row's logical keys: cached positions `first..pos`, then its path,
                    // clipped from the front by the window.
                    let end = input.pos + path.len();
                    let first = input.window.map_or(0, |w| end.saturating_sub(w));
                    let cached = first.min(input.pos)..input.pos;
                    let path = &path[first.saturating_sub(input.pos)..];
                    Row {
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
                    }
                })
                .collect();
            let mut out = vec![0f32; n * d];
            attend_rows(&rows, &mut out);
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
        self.cached.chunks_exact(d).chain(self.path(d))
    }

    /// The pass's rows on the path, after the cached ones.
    fn path(&self, d: usize) -> impl Iterator<Item = &'a [f32]> + '_ {
        let pass = self.pass;
        self.path.iter().map(move |&r| &pass[r * d..(r + 1) * d])
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

/// Attends every row into its `d` floats of `out`, the rows one after another. The vector flavour
/// takes the cached keys in blocks for all the rows at once (see [`x86::attend_rows`]).
fn attend_rows(rows: &[Row], out: &mut [f32]) {
    let Some(d) = rows.first().map(|r| r.d) else {
        return;
    };
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY (each arm): the CPU has AVX2 and FMA, checked just above.
            match d {
                64 => return unsafe { x86::attend_rows::<8>(rows, out) },
                128 => return unsafe { x86::attend_rows::<16>(rows, out) },
                256 => return unsafe { x86::attend_rows::<32>(rows, out) },
                _ => {}
            }
        }
    }
    let mut scores = Vec::new();
    for (row, row_out) in rows.iter().zip(out.chunks_mut(d)) {
        row.attend(&mut scores, row_out);
    }
}

impl Row<'_> {
    /// Softmax of the scaled dot products, then the values summed under the unnormalised weights
    /// and divided by their total once: in plain Rust, for CPUs without AVX2 or head sizes the
    /// vector flavour does not take.
    fn attend(&self, scores: &mut Vec<f32>, out: &mut [f32]) {
        scores.clear();
        for k in self.keys.iter(self.d) {
            let dot: f32 = self.query.iter().zip(k).map(|(q, k)| q * k).sum();
            scores.push(dot * self.scale);
        }
        let sum = exponentiate(scores);
        out.fill(0.0);
        for (e, v) in scores.iter().zip(self.values.iter(self.d)) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += e * x;
            }
        }
        out.iter_mut().for_each(|o| *o /= sum);
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    const HEADS: usize = 4;
    const KV_HEADS: usize = 2;

    /// Deterministic values in about ±1, `(1, heads, len, d)`.
    fn tensor(heads: usize, len: usize, d: usize, seed: usize) -> Tensor {
        let v: Vec<f32> = (0..heads * len * d)
            .map(|i| ((i * 7 + seed * 131) as f32 * 0.618).sin())
            .collect();
        Tensor::from_vec(v, (1, heads, len, d), &Device::Cpu).unwrap()
    }

    /// The pass's output `(n, heads·d)` from the definition, in f64: each row's softmax over the
    /// keys it sees (cached positions `first..pos`, then its path), weighting the values.
    fn oracle(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        input: (usize, &RowPaths, Option<usize>),
    ) -> Vec<Vec<f64>> {
        let (pos, paths, window) = input;
        let q = q.squeeze(0).unwrap().to_vec3::<f32>().unwrap();
        let k = k.squeeze(0).unwrap().to_vec3::<f32>().unwrap();
        let v = v.squeeze(0).unwrap().to_vec3::<f32>().unwrap();
        let d = q[0][0].len();
        paths
            .0
            .iter()
            .enumerate()
            .map(|(i, path)| {
                let end = pos + path.len();
                let first = window.map_or(0, |w| end.saturating_sub(w));
                // Path row `k` (an ancestor at depth k) sits at position `pos + k`, its key at
                // `pos + r`.
                let seen: Vec<usize> = (first.min(pos)..pos)
                    .chain(
                        (path.iter().enumerate())
                            .filter(|&(k, _)| pos + k >= first)
                            .map(|(_, r)| pos + r),
                    )
                    .collect();
                (0..HEADS)
                    .flat_map(|h| {
                        let kvh = h / (HEADS / KV_HEADS);
                        let dot = |p: usize| -> f64 {
                            (0..d)
                                .map(|c| q[h][i][c] as f64 * k[kvh][p][c] as f64)
                                .sum::<f64>()
                                / (d as f64).sqrt()
                        };
                        let scores: Vec<f64> = seen.iter().map(|&p| dot(p)).collect();
                        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                        let total: f64 = e.iter().sum();
                        (0..d)
                            .map(|c| {
                                seen.iter()
                                    .zip(&e)
                                    .map(|(&p, e)| e * v[kvh][p][c] as f64)
                                    .sum::<f64>()
                                    / total
                            })
                            .collect::<Vec<f64>>()
                    })
                    .collect()
            })
            .collect()
    }

    fn run(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: usize,
        paths: &RowPaths,
        window: Option<usize>,
    ) -> Vec<Vec<f32>> {
        let input = AttentionInput {
            q,
            keys: k,
            values: v,
            pos,
            paths,
            window,
        };
        attend(&input)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
    }

    /// Several hundred cached positions, windows that clip rows differently (one of 3, into the
    /// pass's own rows), a chain and a tree, head sizes of the vector path and of the plain one:
    /// every row agrees with the f64 definition, and (for chains) with the same row decoded alone
    /// after the rows before it were cached, bit for bit.
    #[test]
    fn rows_match_the_definition_and_their_one_row_steps() {
        let pos = 300;
        let chain = RowPaths::chain(7);
        // Rows whose windows start a whole block of the cache (32 keys at d = 64) or more apart.
        let long_chain = RowPaths::chain(40);
        let tree = RowPaths::tree(&[0, 0, 1, 1, 0, 4, 2]).unwrap();
        for d in [64, 128, 256, 48] {
            for window in [None, Some(100), Some(303), Some(3)] {
                for paths in [&chain, &long_chain, &tree] {
                    let n = paths.len();
                    let q = tensor(HEADS, n, d, 1);
                    let k = tensor(KV_HEADS, pos + n, d, 2);
                    let v = tensor(KV_HEADS, pos + n, d, 3);
                    let got = run(&q, &k, &v, pos, paths, window);
                    let want = oracle(&q, &k, &v, (pos, paths, window));
                    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
                        for (g, w) in got.iter().zip(want) {
                            assert!(
                                (*g as f64 - w).abs() < 1e-5,
                                "d {d}, window {window:?}, row {i}: {g} against {w}"
                            );
                        }
                    }
                    if std::ptr::eq(paths, &tree) {
                        continue;
                    }
                    for (i, row) in got.iter().enumerate() {
                        let q_i = q.narrow(2, i, 1).unwrap();
                        let seen = pos + i + 1;
                        let (k_i, v_i) =
                            (k.narrow(2, 0, seen).unwrap(), v.narrow(2, 0, seen).unwrap());
                        let alone = run(&q_i, &k_i, &v_i, pos + i, &RowPaths::chain(1), window);
                        assert!(
                            alone[0] == *row,
                            "d {d}, window {window:?}: row {i} differs from its one-row step"
                        );
                    }
                }
            }
        }
    }
}
