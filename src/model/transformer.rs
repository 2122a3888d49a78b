//! Our forward pass: hidden states (and so logits) for **every** position of a chunk, on top of a
//! truncatable cache. candle-transformers' forwards return only the last position, which scoring and
//! draft verification cannot use. Building blocks (quantized matmuls, RMS norm, RoPE, softmax) are
//! candle's.

use candle_core::{Device, Tensor};

use super::cache::KvCache;
use super::config::{Activation, ModelConfig, RopeLayout};
use super::gated::gated;
use super::short_attention::{self, AttentionInput, RowPaths};
use super::weights::{LayerWeights, Linear, MatmulPath, Weights};
use super::{ModelError, MAX_EXACT_ROWS, SHORT_PASS_ROWS};
use crate::cpu::KernelFlavour;

/// cos/sin tables of one RoPE base, `(positions, head_dim / 2)`.
#[derive(Debug, Clone)]
struct RopeTable {
    theta: f32,
    cos: Tensor,
    sin: Tensor,
}

impl RopeTable {
    /// Angles computed in f32 as llama.cpp and candle do, so logits agree with them.
    fn new(
        theta: f32,
        head_dim: usize,
        positions: usize,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let inv_freq: Vec<f32> = (0..head_dim)
            .step_by(2)
            .map(|i| 1f32 / theta.powf(i as f32 / head_dim as f32))
            .collect();
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for f in &inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        Ok(Self {
            theta,
            cos: Tensor::from_vec(cos, (positions, half), device)?,
            sin: Tensor::from_vec(sin, (positions, half), device)?,
        })
    }
}

/// A loaded decoder-only model. Immutable: every sequence brings its own [`KvCache`], so one model
/// serves many sequences and threads.
#[derive(Debug)]
pub struct Transformer {
    config: ModelConfig,
    weights: Weights,
    ropes: Vec<RopeTable>,
    device: Device,
}

/// Positions beyond this are not precomputed for RoPE even when the model allows them; the cache
/// refuses longer contexts.
const MAX_ROPE_POSITIONS: usize = 32_768;

impl Transformer {
    pub fn new(config: ModelConfig, weights: Weights, device: Device) -> Result<Self, ModelError> {
        let positions = config.max_positions.min(MAX_ROPE_POSITIONS);
        let mut ropes: Vec<RopeTable> = Vec::new();
        for layer in 0..config.num_layers {
            let theta = config.layer_rope_theta(layer);
            if !ropes.iter().any(|r| r.theta == theta) {
                ropes.push(RopeTable::new(theta, config.head_dim, positions, &device)?);
            }
        }
        Ok(Self {
            config,
            weights,
            ropes,
            device,
        })
    }

    /// Dequantizes the weights once more into f32 copies that serve many-row inputs (window
    /// scoring, prompt prefill) at gemm speed; single tokens keep reading the quantized blocks.
    pub fn add_dense_copies(&mut self) -> Result<(), ModelError> {
        Ok(self.weights.add_dense_copies()?)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The flavour of our quantized kernels that decoding and draft verification run on; None where
    /// candle's kernels serve (f32 weights, formats we do not repack, a GPU).
    pub fn kernel_flavour(&self) -> Option<KernelFlavour> {
        match self.device {
            Device::Cpu => self.weights.lm_head.kernel_flavour(),
            _ => None,
        }
    }

    /// Swaps the feed-forward activation, for comparing with implementations that differ only
    /// there (candle-transformers' `quantized_gemma3` uses SiLU where Gemma uses GELU).
    pub fn set_activation(&mut self, activation: Activation) {
        self.config.activation = activation;
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Longest context a cache of this model may hold.
    pub fn max_context(&self) -> usize {
        self.config.max_positions.min(MAX_ROPE_POSITIONS)
    }

    /// A fresh cache sized for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.config.num_layers, self.max_context())
    }

    /// Refuses ids outside the vocabulary before they reach an embedding lookup.
    pub fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        match tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            Some(t) => Err(ModelError::Invalid(format!(
                "token id {t} is outside the model's vocabulary of {}",
                self.config.vocab_size
            ))),
            None => Ok(()),
        }
    }

    /// Final-norm hidden states `(batch, n, hidden)` of `tokens` (`(batch, n)` ids), appended after
    /// what `cache` holds.
    pub fn forward_hidden(
        &self,
        tokens: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor, ModelError> {
        self.forward_rows(tokens, cache, None)
    }

    /// Logits `(n, vocab)` of a tree of `tokens` appended after what `cache` holds: row `i > 0` comes
    /// after row `parents[i] < i` (row 0 after the cache), and each row's logits are exactly those
    /// of decoding its path alone. The cache keeps all `n` rows; [`KvCache::keep`] then keeps the
    /// path that was accepted. On the CPU only, at most [`MAX_EXACT_ROWS`] rows.
    pub fn forward_tree(
        &self,
        tokens: &[u32],
        parents: &[usize],
        cache: &mut KvCache,
    ) -> Result<Tensor, ModelError> {
        self.check_tokens(tokens)?;
        if tokens.len() > MAX_EXACT_ROWS || parents.len() != tokens.len() {
            return Err(ModelError::Invalid(format!(
                "a tree pass takes at most {MAX_EXACT_ROWS} rows, one parent each; got {} \
                 tokens and {} parents",
                tokens.len(),
                parents.len()
            )));
        }
        if !self.device.is_cpu() {
            return Err(ModelError::Invalid("tree passes run on the CPU".into()));
        }
        let paths = RowPaths::tree(parents).map_err(ModelError::Invalid)?;
        let ids = Tensor::new(tokens, &self.device)?.unsqueeze(0)?;
        let hidden = self.forward_rows(&ids, cache, Some(paths))?;
        self.logits_on(&hidden.squeeze(0)?, MatmulPath::Exact)
    }

    /// Logits `(n, vocab)` at every position of one sequence's `tokens`, each row exactly as a
    /// one-token step computes it whatever `n` (at most [`MAX_EXACT_ROWS`]): a draft's verification
    /// pass, which must reproduce plain decoding. On the CPU only, where our kernels compute every
    /// row alike: they serve the GGUF block formats of the models we ship (a matrix they do not
    /// serve runs on candle's kernels, whose sums may depend on the rows).
    pub fn forward_exact(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor, ModelError> {
        self.check_tokens(tokens)?;
        if tokens.len() > MAX_EXACT_ROWS {
            return Err(ModelError::Invalid(format!(
                "an exact pass takes at most {MAX_EXACT_ROWS} rows; got {}",
                tokens.len()
            )));
        }
        if !self.device.is_cpu() {
            return Err(ModelError::Invalid("exact passes run on the CPU".into()));
        }
        let ids = Tensor::new(tokens, &self.device)?.unsqueeze(0)?;
        let hidden = self.forward_rows(&ids, cache, Some(RowPaths::chain(tokens.len())))?;
        self.logits_on(&hidden.squeeze(0)?, MatmulPath::Exact)
    }

    /// Short passes and exact ones (given their rows' paths) attend row by row, long ones with
    /// masks.
    fn forward_rows(
        &self,
        tokens: &Tensor,
        cache: &mut KvCache,
        exact: Option<RowPaths>,
    ) -> Result<Tensor, ModelError> {
        match self.device.is_cpu() {
            true => super::on_rayon_worker(|| self.forward_hidden_here(tokens, cache, exact)),
            false => self.forward_hidden_here(tokens, cache, exact),
        }
    }

    fn forward_hidden_here(
        &self,
        tokens: &Tensor,
        cache: &mut KvCache,
        exact: Option<RowPaths>,
    ) -> Result<Tensor, ModelError> {
        let (batch, n) = tokens.dims2()?;
        let pos = cache.len();
        if n == 0 {
            return Err(ModelError::Invalid("no tokens to run".into()));
        }
        if pos + n > cache.max_len() {
            return Err(ModelError::Invalid(format!(
                "a context of {} tokens exceeds the model's {}",
                pos + n,
                cache.max_len()
            )));
        }
        let c = &self.config;
        let ids = tokens.flatten_all()?;
        let mut x =
            self.weights
                .embeddings
                .index_select(&ids, 0)?
                .reshape((batch, n, c.hidden_size))?;
        if c.scale_embeddings {
            x = (x * (c.hidden_size as f64).sqrt())?;
        }
        // Short and exact passes attend row by row along their paths and need no masks; a tree's
        // rows sit at their depths.
        let rows = match (exact, n < SHORT_PASS_ROWS) {
            (Some(paths), _) => {
                let at: Vec<u32> = paths.depths().map(|d| (pos + d) as u32).collect();
                let in_order = at.iter().enumerate().all(|(i, &p)| p as usize == pos + i);
                PassRows::Short {
                    positions: (!in_order)
                        .then(|| Tensor::new(at, &self.device))
                        .transpose()?,
                    paths,
                    matmul: MatmulPath::Exact,
                }
            }
            (None, true) => PassRows::Short {
                positions: None,
                paths: RowPaths::chain(n),
                matmul: MatmulPath::ByRows,
            },
            (None, false) => PassRows::Masked(Masks::new(n, pos, c.sliding_window, &self.device)?),
        };
        for (i, layer) in self.weights.layers.iter().enumerate() {
            // A long pass stops between layers when its request is stopped; the cache keeps its
            // length, so the layers written so far are simply not counted.
            if crate::interrupt::interrupted() {
                return Err(ModelError::Interrupted);
            }
            x = self.layer_forward(i, layer, &x, pos, cache, &rows)?;
        }
        cache.advance(n);
        Ok(rms_norm(&x, &self.weights.final_norm, c.rms_norm_eps)?)
    }

    /// Logits `(.., vocab)` of hidden states from [`Self::forward_hidden`].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor, ModelError> {
        self.logits_on(hidden, MatmulPath::ByRows)
    }

    fn logits_on(&self, hidden: &Tensor, path: MatmulPath) -> Result<Tensor, ModelError> {
        Ok(self.weights.lm_head.forward(hidden, path)?)
    }

    /// Logits `(vocab,)` after the last of `tokens`, appended to `cache`: the next-token
    /// distribution without projecting every position onto the vocabulary.
    pub fn forward_last(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor, ModelError> {
        self.check_tokens(tokens)?;
        let ids = Tensor::new(tokens, &self.device)?.unsqueeze(0)?;
        let hidden = self.forward_hidden(&ids, cache)?;
        let last = hidden.squeeze(0)?.narrow(0, tokens.len() - 1, 1)?;
        Ok(self.logits(&last)?.squeeze(0)?)
    }

    /// Logits `(n, vocab)` at every position of one sequence's `tokens`, appended to `cache`.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor, ModelError> {
        self.check_tokens(tokens)?;
        let ids = Tensor::new(tokens, &self.device)?.unsqueeze(0)?;
        let hidden = self.forward_hidden(&ids, cache)?;
        self.logits(&hidden.squeeze(0)?)
    }

    fn layer_forward(
        &self,
        index: usize,
        w: &LayerWeights,
        x: &Tensor,
        pos: usize,
        cache: &mut KvCache,
        rows: &PassRows,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let (batch, n, _) = x.dims3()?;
        let matmul = rows.matmul();
        let h = rms_norm(x, &w.attn_norm, c.rms_norm_eps)?;
        let qkv = Linear::forward_shared(&[&w.wq, &w.wk, &w.wv], &h, matmul)?;
        let heads =
            |t: &Tensor, count: usize, norm: &Option<Tensor>| -> candle_core::Result<Tensor> {
                let t = t.reshape((batch, n, count, c.head_dim))?;
                let t = match norm {
                    Some(nw) => rms_norm(&t.contiguous()?, nw, c.rms_norm_eps)?,
                    None => t,
                };
                t.transpose(1, 2)?.contiguous()
            };
        let q = heads(&qkv[0], c.num_heads, &w.q_norm)?;
        let k = heads(&qkv[1], c.num_kv_heads, &w.k_norm)?;
        let v = heads(&qkv[2], c.num_kv_heads, &None)?;
        let rope = self.rope_for(index)?;
        let positions = match rows {
            PassRows::Short {
                positions: Some(at),
                ..
            } => Some(at),
            _ => None,
        };
        let q = apply_rope(&q, rope, pos, positions, c.rope_layout)?;
        let k = apply_rope(&k, rope, pos, positions, c.rope_layout)?;
        let (keys, values) = cache.append(index, &k, &v)?;
        let window = c.layer_window(index);
        let attn = match rows {
            PassRows::Masked(masks) => attention(&q, &keys, &values, c, masks.get(window))?,
            PassRows::Short { paths, .. } if self.device.is_cpu() => {
                short_attention::attend(&AttentionInput {
                    q: &q,
                    keys: &keys,
                    values: &values,
                    pos,
                    paths,
                    window,
                })?
            }
            PassRows::Short { .. } => attention_by_row(&q, &keys, &values, c, pos, window)?,
        };
        let mut attn = w.wo.forward(&attn, matmul)?;
        if let Some(nw) = &w.post_attn_norm {
            attn = rms_norm(&attn, nw, c.rms_norm_eps)?;
        }
        let x = (x + attn)?;
        let h = rms_norm(&x, &w.ffn_norm, c.rms_norm_eps)?;
        let gate_up = Linear::forward_shared(&[&w.gate, &w.up], &h, matmul)?;
        let gate = gated(c.activation, &gate_up[0], &gate_up[1])?;
        let mut ffn = w.down.forward(&gate, matmul)?;
        if let Some(nw) = &w.post_ffn_norm {
            ffn = rms_norm(&ffn, nw, c.rms_norm_eps)?;
        }
        Ok((x + ffn)?)
    }

    fn rope_for(&self, layer: usize) -> Result<&RopeTable, ModelError> {
        let theta = self.config.layer_rope_theta(layer);
        self.ropes
            .iter()
            .find(|r| r.theta == theta)
            .ok_or_else(|| ModelError::Invalid(format!("no RoPE table for layer {layer}")))
    }
}

/// How the rows of a pass attend: short and exact passes row by row along their paths (a tree's
/// rows at the positions of their depths), long ones batched with masks.
enum PassRows {
    Short {
        paths: RowPaths,
        positions: Option<Tensor>,
        matmul: MatmulPath,
    },
    Masked(Masks),
}

impl PassRows {
    fn matmul(&self) -> MatmulPath {
        match self {
            PassRows::Short { matmul, .. } => *matmul,
            PassRows::Masked(_) => MatmulPath::ByRows,
        }
    }
}

fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps as f32)
}

/// Rotates `x` `(b, heads, n, d)` for positions `pos..pos + n`, or for the given ones (a tree's).
fn apply_rope(
    x: &Tensor,
    rope: &RopeTable,
    pos: usize,
    positions: Option<&Tensor>,
    layout: RopeLayout,
) -> candle_core::Result<Tensor> {
    let n = x.dim(2)?;
    let (cos, sin) = match positions {
        Some(at) => (rope.cos.index_select(at, 0)?, rope.sin.index_select(at, 0)?),
        None => (rope.cos.narrow(0, pos, n)?, rope.sin.narrow(0, pos, n)?),
    };
    match layout {
        RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(x, &cos, &sin),
        RopeLayout::Halves => candle_nn::rotary_emb::rope(x, &cos, &sin),
    }
}

/// Scaled dot-product attention of `q` `(b, heads, n, d)` over the cached `keys`/`values`
/// `(b, kv_heads, len, d)`. Query heads that share a key/value head are folded into one matmul
/// instead of copying the keys per head.
fn attention(
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    c: &ModelConfig,
    mask: &Mask,
) -> candle_core::Result<Tensor> {
    let (b, _, n, d) = q.dims4()?;
    let group = c.num_heads / c.num_kv_heads;
    let len = keys.dim(2)? - mask.first_key;
    let keys = keys.narrow(2, mask.first_key, len)?;
    let values = values.narrow(2, mask.first_key, len)?;
    let q = (q * (1.0 / (d as f64).sqrt()))?.reshape((b, c.num_kv_heads, group * n, d))?;
    let scores = q.matmul(&keys.t()?)?;
    let scores = match &mask.bias {
        Some(bias) => scores
            .reshape((b, c.num_kv_heads, group, n, len))?
            .broadcast_add(bias)?
            .reshape((b, c.num_kv_heads, group * n, len))?,
        None => scores,
    };
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    probs
        .matmul(&values.contiguous()?)?
        .reshape((b, c.num_heads, n, d))?
        .transpose(1, 2)?
        .reshape((b, n, c.num_heads * d))
}

/// Attention of each query over exactly the keys it sees, as a one-token decoding step computes it.
/// Softmax and the value product then sum the same numbers in the same groups whether a row is
/// decoded alone or verified with a draft, so greedy speculative decoding reproduces plain greedy
/// decoding bit for bit (a batched pass would pad each row with masked keys and regroup the sums).
fn attention_by_row(
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    c: &ModelConfig,
    pos: usize,
    window: Option<usize>,
) -> candle_core::Result<Tensor> {
    let n = q.dim(2)?;
    let rows = (0..n)
        .map(|i| {
            let end = pos + i + 1;
            let mask = Mask {
                first_key: window.map_or(0, |w| end.saturating_sub(w)),
                bias: None,
            };
            attention(
                &q.narrow(2, i, 1)?,
                &keys.narrow(2, 0, end)?,
                &values.narrow(2, 0, end)?,
                c,
                &mask,
            )
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::cat(&rows, 1)
}

/// Which keys a chunk's queries see: keys `first_key..pos + n`, plus an additive bias `(n, len)`
/// (0 or −∞) where some of those are hidden.
#[derive(Debug)]
struct Mask {
    first_key: usize,
    bias: Option<Tensor>,
}

/// The masks of one forward call, built once and shared by the layers.
struct Masks {
    global: Mask,
    local: Option<Mask>,
}

impl Masks {
    fn new(
        n: usize,
        pos: usize,
        window: Option<usize>,
        device: &Device,
    ) -> candle_core::Result<Self> {
        Ok(Self {
            global: causal_mask(n, pos, None, device)?,
            local: window
                .map(|w| causal_mask(n, pos, Some(w), device))
                .transpose()?,
        })
    }

    fn get(&self, window: Option<usize>) -> &Mask {
        match (window, &self.local) {
            (Some(_), Some(local)) => local,
            _ => &self.global,
        }
    }
}

/// Query `i` (at position `pos + i`) sees key `j` when `j <= pos + i` and, with a window `w`,
/// `pos + i - j < w` (as HF and llama.cpp define sliding windows).
fn causal_mask(
    n: usize,
    pos: usize,
    window: Option<usize>,
    device: &Device,
) -> candle_core::Result<Mask> {
    let first_key = window.map_or(0, |w| (pos + 1).saturating_sub(w));
    if n == 1 {
        return Ok(Mask {
            first_key,
            bias: None,
        });
    }
    let len = pos + n - first_key;
    let mut bias = vec![0f32; n * len];
    for (i, row) in bias.chunks_exact_mut(len).enumerate() {
        let q = pos + i;
        for (jj, b) in row.iter_mut().enumerate() {
            let j = first_key + jj;
            if j > q || window.is_some_and(|w| q - j >= w) {
                *b = f32::NEG_INFINITY;
            }
        }
    }
    Ok(Mask {
        first_key,
        bias: Some(Tensor::from_vec(bias, (n, len), device)?),
    })
}
