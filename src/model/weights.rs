//! The tensors of a model, named by role, loaded from a GGUF file (quantized, kept quantized) or an HF
//! directory of safetensors (converted to f32).

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use std::sync::Arc;

use candle_core::quantized::{gguf_file, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::config::ModelConfig;
use super::short_matmul::ShortMatmul;
use super::ModelError;
use super::SHORT_PASS_ROWS;
use crate::cpu::KernelFlavour;

/// Which copy of a matrix a pass multiplies by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulPath {
    /// The dense f32 copy, where there is one, for inputs of [`SHORT_PASS_ROWS`] rows or more
    /// (window scoring, prefill): products in f32, where the stored weights' kernels quantize the
    /// input to 8 bits.
    ByRows,
    /// The stored weights whatever the rows, so that each row comes out bit for bit as a
    /// one-token step computes it (draft verification).
    Exact,
}

/// A weight matrix used as `x · Wᵀ`: quantized blocks from GGUF or a dense f32 tensor, plus, for
/// quantized ones, an optional dense copy for many-row inputs (window scoring, prompt prefill).
#[derive(Debug, Clone)]
pub struct Linear {
    inner: QMatMul,
    dense_copy: Option<QMatMul>,
    /// Our own kernel for few-row inputs, for the block formats it knows (see `short_matmul`).
    short: Option<Arc<ShortMatmul>>,
}

impl Linear {
    fn quantized(q: QTensor, flavour: KernelFlavour) -> candle_core::Result<Self> {
        Ok(Self {
            short: ShortMatmul::from_qtensor(&q, flavour)?.map(Arc::new),
            inner: QMatMul::from_qtensor(q)?,
            dense_copy: None,
        })
    }

    fn dense(w: Tensor) -> Self {
        Self {
            inner: QMatMul::Tensor(w),
            dense_copy: None,
            short: None,
        }
    }

    /// The flavour of our kernel when it serves this matrix's few-row inputs.
    pub fn kernel_flavour(&self) -> Option<KernelFlavour> {
        self.short.as_ref().map(|s| s.flavour())
    }

    /// Keeps a dequantized f32 copy of a quantized matrix for many-row inputs.
    pub fn add_dense_copy(&mut self) -> candle_core::Result<()> {
        if let QMatMul::QTensor(q) = &self.inner {
            self.dense_copy = Some(QMatMul::Tensor(q.dequantize(&q.device())?));
        }
        Ok(())
    }

    /// The dense copy when it serves `x` under `path`: inputs of [`SHORT_PASS_ROWS`] rows (tokens
    /// × sequences) or more, unless the pass is exact.
    fn dense_for(&self, x: &Tensor, path: MatmulPath) -> Option<&QMatMul> {
        let rows = x.elem_count() / x.dim(candle_core::D::Minus1).unwrap_or(1).max(1);
        self.dense_copy
            .as_ref()
            .filter(|_| path == MatmulPath::ByRows && rows >= SHORT_PASS_ROWS)
    }

    /// The matrix that serves `x`: the dense copy for many rows, else the stored one.
    fn for_input(&self, x: &Tensor, path: MatmulPath) -> &QMatMul {
        self.dense_for(x, path).unwrap_or(&self.inner)
    }

    pub fn forward(&self, x: &Tensor, path: MatmulPath) -> candle_core::Result<Tensor> {
        match (self.dense_for(x, path), &self.short) {
            (Some(dense), _) => dense.forward(x),
            (None, Some(q)) if x.device().is_cpu() => q.forward(x),
            (None, _) => self.inner.forward(x),
        }
    }

    /// `x · Wᵢᵀ` for several matrices that share the input (Q/K/V, gate/up): `x` is quantized once
    /// and the products share one parallel region, in our own kernel when it serves every part (so
    /// a row computes the same way alone and in a draft), else in candle's fused one where the CPU
    /// supports it.
    pub fn forward_shared(
        parts: &[&Linear],
        x: &Tensor,
        path: MatmulPath,
    ) -> candle_core::Result<Vec<Tensor>> {
        let short: Option<Vec<&ShortMatmul>> = parts
            .iter()
            .map(|l| {
                l.short
                    .as_deref()
                    .filter(|_| l.dense_for(x, path).is_none())
            })
            .collect();
        if let (Some(short), true) = (short, x.device().is_cpu()) {
            return ShortMatmul::forward_shared(&short, x);
        }
        let quantized: Option<Vec<&QTensor>> = parts
            .iter()
            .map(|l| match l.for_input(x, path) {
                QMatMul::QTensor(q) if l.short.is_none() => Some(q.as_ref()),
                _ => None,
            })
            .collect();
        if let Some(qs) = quantized {
            if x.device().is_cpu() {
                let x2 = x.flatten_to(x.rank().saturating_sub(2))?.contiguous()?;
                if let Some(outs) = QTensor::gemv_fused_shared_lhs(&qs, &x2)? {
                    let mut dims = x.dims().to_vec();
                    return outs
                        .into_iter()
                        .map(|o| {
                            if let Some(last) = dims.last_mut() {
                                *last = o.dim(candle_core::D::Minus1)?;
                            }
                            o.reshape(dims.as_slice())
                        })
                        .collect();
                }
            }
        }
        parts.iter().map(|l| l.forward(x, path)).collect()
    }
}

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Tensor,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub wo: Linear,
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub post_attn_norm: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
    pub post_ffn_norm: Option<Tensor>,
}

#[derive(Debug, Clone)]
pub struct Weights {
    /// Token embeddings, dense f32 (vocab × hidden), looked up by id.
    pub embeddings: Tensor,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Tensor,
    /// The output head; tied to the embeddings when the file has none.
    pub lm_head: Linear,
    /// Whether `lm_head` is the embedding matrix (so its dense copy is `embeddings` itself).
    pub tied_head: bool,
}

impl Weights {
    /// Gives every quantized matrix a dense f32 copy for many-row inputs; memory grows to about
    /// 4 bytes per parameter (540 MB for SmolLM2-135M), shared with the embeddings for a tied head.
    pub fn add_dense_copies(&mut self) -> candle_core::Result<()> {
        for l in &mut self.layers {
            for m in [
                &mut l.wq,
                &mut l.wk,
                &mut l.wv,
                &mut l.wo,
                &mut l.gate,
                &mut l.up,
                &mut l.down,
            ] {
                m.add_dense_copy()?;
            }
        }
        match self.tied_head {
            true => self.lm_head.dense_copy = Some(QMatMul::Tensor(self.embeddings.clone())),
            false => self.lm_head.add_dense_copy()?,
        }
        Ok(())
    }
}

/// Opens a GGUF file: its metadata decides the config, its tensors stay quantized (repacked for
/// our kernels in `flavour` where they know the format).
pub fn load_gguf(
    path: &Path,
    device: &Device,
    flavour: KernelFlavour,
) -> Result<(ModelConfig, Weights), ModelError> {
    let mut file =
        File::open(path).map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))?;
    let content = gguf_file::Content::read(&mut file)
        .map_err(|e| ModelError::Format(format!("{}: {e}", path.display())))?;
    let config = ModelConfig::from_gguf(&content)?;
    config.validate()?;
    let mut gguf = GgufTensors {
        path,
        content: &content,
        file,
        device,
        flavour,
    };
    let embeddings_q = gguf.quantized("token_embd.weight")?;
    let embeddings = embeddings_q.dequantize(device)?;
    let tied_head = !gguf.has("output.weight");
    let lm_head = match tied_head {
        false => gguf.quantized("output.weight")?,
        true => embeddings_q,
    };
    let mut layers = Vec::with_capacity(config.num_layers);
    for i in 0..config.num_layers {
        let name = |suffix: &str| format!("blk.{i}.{suffix}.weight");
        let mut norm_if = |present: bool, suffix: &str| -> Result<Option<Tensor>, ModelError> {
            present.then(|| gguf.dense(&name(suffix))).transpose()
        };
        let q_norm = norm_if(config.qk_norm, "attn_q_norm")?;
        let k_norm = norm_if(config.qk_norm, "attn_k_norm")?;
        let post_attn_norm = norm_if(config.post_norms, "post_attention_norm")?;
        let post_ffn_norm = norm_if(config.post_norms, "post_ffw_norm")?;
        layers.push(LayerWeights {
            attn_norm: gguf.dense(&name("attn_norm"))?,
            wq: gguf.linear(&name("attn_q"))?,
            wk: gguf.linear(&name("attn_k"))?,
            wv: gguf.linear(&name("attn_v"))?,
            wo: gguf.linear(&name("attn_output"))?,
            q_norm,
            k_norm,
            post_attn_norm,
            ffn_norm: gguf.dense(&name("ffn_norm"))?,
            gate: gguf.linear(&name("ffn_gate"))?,
            up: gguf.linear(&name("ffn_up"))?,
            down: gguf.linear(&name("ffn_down"))?,
            post_ffn_norm,
        });
    }
    let weights = Weights {
        embeddings,
        layers,
        final_norm: gguf.dense("output_norm.weight")?,
        lm_head: Linear::quantized(lm_head, flavour)?,
        tied_head,
    };
    check_shapes(&config, &weights)?;
    Ok((config, weights))
}

/// Reads named tensors of an open GGUF file.
struct GgufTensors<'a> {
    path: &'a Path,
    content: &'a gguf_file::Content,
    file: File,
    device: &'a Device,
    flavour: KernelFlavour,
}

impl GgufTensors<'_> {
    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }
    fn quantized(&mut self, name: &str) -> Result<QTensor, ModelError> {
        if !self.has(name) {
            let path = self.path.display();
            return Err(ModelError::Format(format!("{path}: no tensor {name}")));
        }
        Ok(self.content.tensor(&mut self.file, name, self.device)?)
    }
    fn linear(&mut self, name: &str) -> Result<Linear, ModelError> {
        Ok(Linear::quantized(self.quantized(name)?, self.flavour)?)
    }
    /// Norm weights and other small vectors, as f32.
    fn dense(&mut self, name: &str) -> Result<Tensor, ModelError> {
        Ok(self.quantized(name)?.dequantize(self.device)?)
    }
}

/// Opens an HF llama directory: `config.json` and one or more `*.safetensors`.
pub fn load_hf_dir(dir: &Path, device: &Device) -> Result<(ModelConfig, Weights), ModelError> {
    let io = |p: &Path, e: std::io::Error| ModelError::Io(format!("{}: {e}", p.display()));
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| io(&config_path, e))?;
    let config = ModelConfig::from_hf_json(&text)?;
    config.validate()?;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::Format(format!(
            "{}: no *.safetensors files",
            dir.display()
        )));
    }
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for f in &files {
        tensors.extend(candle_core::safetensors::load(f, device)?);
    }
    let mut take = |name: &str| -> Result<Tensor, ModelError> {
        let t = tensors
            .remove(name)
            .ok_or_else(|| ModelError::Format(format!("{}: no tensor {name}", dir.display())))?;
        Ok(t.to_dtype(DType::F32)?)
    };
    let embeddings = take("model.embed_tokens.weight")?;
    let lm_head = match take("lm_head.weight") {
        Ok(w) => w,
        Err(_) => embeddings.clone(),
    };
    let mut layers = Vec::with_capacity(config.num_layers);
    for i in 0..config.num_layers {
        let mut t = |name: &str| take(&format!("model.layers.{i}.{name}.weight"));
        layers.push(LayerWeights {
            attn_norm: t("input_layernorm")?,
            wq: Linear::dense(t("self_attn.q_proj")?),
            wk: Linear::dense(t("self_attn.k_proj")?),
            wv: Linear::dense(t("self_attn.v_proj")?),
            wo: Linear::dense(t("self_attn.o_proj")?),
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            ffn_norm: t("post_attention_layernorm")?,
            gate: Linear::dense(t("mlp.gate_proj")?),
            up: Linear::dense(t("mlp.up_proj")?),
            down: Linear::dense(t("mlp.down_proj")?),
            post_ffn_norm: None,
        });
    }
    let weights = Weights {
        embeddings,
        layers,
        final_norm: take("model.norm.weight")?,
        lm_head: Linear::dense(lm_head),
        tied_head: false,
    };
    check_shapes(&config, &weights)?;
    Ok((config, weights))
}

/// Catches a config that does not describe the tensors (which would otherwise fail mid-forward).
fn check_shapes(config: &ModelConfig, w: &Weights) -> Result<(), ModelError> {
    let (v, h) = w.embeddings.dims2()?;
    if v != config.vocab_size || h != config.hidden_size {
        return Err(ModelError::Format(format!(
            "embeddings are {v}×{h}, the config says {}×{}",
            config.vocab_size, config.hidden_size
        )));
    }
    let heads_width = config.num_heads * config.head_dim;
    for (i, l) in w.layers.iter().enumerate() {
        let q_out = l.wq.inner_rows()?;
        if q_out != heads_width {
            return Err(ModelError::Format(format!(
                "layer {i}: query projection has {q_out} rows, expected {heads_width}"
            )));
        }
    }
    Ok(())
}

impl Linear {
    /// Output width of the matrix.
    fn inner_rows(&self) -> candle_core::Result<usize> {
        match &self.inner {
            QMatMul::QTensor(q) => q.shape().dims2().map(|d| d.0),
            QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.dims2().map(|d| d.0),
        }
    }
}
