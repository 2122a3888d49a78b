//! The shape of a decoder-only transformer, read from GGUF metadata or an HF `config.json`. Llama and
//! Gemma-3 differ only in the switches below, so one forward pass serves both.

use std::collections::HashMap;

use candle_core::quantized::gguf_file;
use serde::Deserialize;

use super::ModelError;

/// The model families we load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    Gemma3,
}

/// Activation of the gated feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    Silu,
    /// GELU with the tanh approximation (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

/// How rotary embeddings pair the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeLayout {
    /// Pairs (2i, 2i+1): llama weights in GGUF, whose converter permutes Q and K for it.
    Interleaved,
    /// Pairs (i, i + d/2): HF checkpoints and Gemma.
    Halves,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f32,
    pub rope_layout: RopeLayout,
    pub activation: Activation,
    /// Longest context the model was trained for; contexts beyond it are refused.
    pub max_positions: usize,
    /// Gemma: local layers attend to the last `sliding_window` positions and use `rope_theta_local`;
    /// every `global_layer_period`-th layer is global.
    pub sliding_window: Option<usize>,
    pub global_layer_period: usize,
    pub rope_theta_local: f32,
    /// Gemma: embeddings are scaled by sqrt(hidden), Q and K are RMS-normed per head, and the attention
    /// and feed-forward outputs are normed before the residual add.
    pub scale_embeddings: bool,
    pub qk_norm: bool,
    pub post_norms: bool,
    /// Prepended to every sequence that is scored or generated from scratch (Gemma's `<bos>`).
    pub bos_token_id: Option<u32>,
}

impl ModelConfig {
    /// Whether layer `layer` attends within the sliding window (Gemma's local layers).
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        let global = (layer + 1).is_multiple_of(self.global_layer_period.max(1));
        self.sliding_window.filter(|_| !global)
    }

    pub fn layer_rope_theta(&self, layer: usize) -> f32 {
        if self.layer_window(layer).is_some() {
            self.rope_theta_local
        } else {
            self.rope_theta
        }
    }

    /// Reads the shape of a llama or gemma3 model from its GGUF metadata.
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self, ModelError> {
        let meta = GgufMeta(&content.metadata);
        let arch = meta.string("general.architecture")?;
        let architecture = match arch.as_str() {
            "llama" => Architecture::Llama,
            "gemma3" => Architecture::Gemma3,
            other => {
                return Err(ModelError::Unsupported(format!(
                    "architecture {other:?} (llama and gemma3 are supported)"
                )))
            }
        };
        let p = |key: &str| format!("{arch}.{key}");
        let hidden_size = meta.usize(&p("embedding_length"))?;
        let num_heads = meta.usize(&p("attention.head_count"))?;
        let head_dim = meta
            .usize(&p("attention.key_length"))
            .unwrap_or(hidden_size / num_heads.max(1));
        let vocab_size = match meta.usize(&p("vocab_size")) {
            Ok(v) => v,
            Err(_) => token_count(content)?,
        };
        let gemma = architecture == Architecture::Gemma3;
        Ok(Self {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: meta.usize(&p("feed_forward_length"))?,
            num_layers: meta.usize(&p("block_count"))?,
            num_heads,
            num_kv_heads: meta.usize(&p("attention.head_count_kv"))?,
            head_dim,
            rms_norm_eps: meta.f32(&p("attention.layer_norm_rms_epsilon"))? as f64,
            rope_theta: meta.f32(&p("rope.freq_base")).unwrap_or(if gemma {
                1_000_000.0
            } else {
                10_000.0
            }),
            rope_layout: if gemma {
                RopeLayout::Halves
            } else {
                RopeLayout::Interleaved
            },
            activation: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            max_positions: meta.usize(&p("context_length"))?,
            sliding_window: if gemma {
                Some(meta.usize(&p("attention.sliding_window"))?)
            } else {
                None
            },
            global_layer_period: meta.usize(&p("attention.sliding_window_type")).unwrap_or(6),
            rope_theta_local: meta.f32(&p("rope.local_freq_base")).unwrap_or(10_000.0),
            scale_embeddings: gemma,
            qk_norm: gemma,
            post_norms: gemma,
            bos_token_id: if meta.bool("tokenizer.ggml.add_bos_token").unwrap_or(gemma) {
                meta.usize("tokenizer.ggml.bos_token_id")
                    .ok()
                    .map(|v| v as u32)
            } else {
                None
            },
        })
    }

    /// Reads an HF `config.json` of the llama family.
    pub fn from_hf_json(text: &str) -> Result<Self, ModelError> {
        let hf: HfLlamaConfig = serde_json::from_str(text)
            .map_err(|e| ModelError::Format(format!("config.json: {e}")))?;
        if let Some(t) = hf.model_type.as_deref().filter(|t| *t != "llama") {
            return Err(ModelError::Unsupported(format!(
                "model_type {t:?} in config.json (llama is supported)"
            )));
        }
        let head_dim = hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1));
        Ok(Self {
            architecture: Architecture::Llama,
            vocab_size: hf.vocab_size,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_layers: hf.num_hidden_layers,
            num_heads: hf.num_attention_heads,
            num_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
            head_dim,
            rms_norm_eps: hf.rms_norm_eps,
            rope_theta: hf.rope_theta.unwrap_or(10_000.0),
            rope_layout: RopeLayout::Halves,
            activation: Activation::Silu,
            max_positions: hf.max_position_embeddings,
            sliding_window: None,
            global_layer_period: 1,
            rope_theta_local: 10_000.0,
            scale_embeddings: false,
            qk_norm: false,
            post_norms: false,
            bos_token_id: None,
        })
    }

    /// Checks the numbers fit together before any weight is read.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Format(m));
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return bad(format!(
                "{} attention heads cannot share {} key/value heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!("head dimension {} must be even", self.head_dim));
        }
        if self.vocab_size == 0 || self.num_layers == 0 || self.max_positions == 0 {
            return bad("empty vocabulary, layer stack or context".into());
        }
        Ok(())
    }
}

/// The fields of an HF llama `config.json` that decide the forward pass.
#[derive(Deserialize)]
struct HfLlamaConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    rope_theta: Option<f32>,
    max_position_embeddings: usize,
}

fn token_count(content: &gguf_file::Content) -> Result<usize, ModelError> {
    match content.metadata.get("tokenizer.ggml.tokens") {
        Some(gguf_file::Value::Array(tokens)) => Ok(tokens.len()),
        _ => Err(ModelError::Format(
            "GGUF has neither a vocab_size nor a token list".into(),
        )),
    }
}

struct GgufMeta<'a>(&'a HashMap<String, gguf_file::Value>);

impl GgufMeta<'_> {
    fn get(&self, key: &str) -> Result<&gguf_file::Value, ModelError> {
        self.0
            .get(key)
            .ok_or_else(|| ModelError::Format(format!("no {key} in the GGUF metadata")))
    }
    fn usize(&self, key: &str) -> Result<usize, ModelError> {
        let v = self.get(key)?;
        v.to_u64()
            .map(|v| v as usize)
            .or_else(|_| v.to_u32().map(|v| v as usize))
            .or_else(|_| v.to_i32().map(|v| v.max(0) as usize))
            .map_err(|e| ModelError::Format(format!("{key}: {e}")))
    }
    fn f32(&self, key: &str) -> Result<f32, ModelError> {
        self.get(key)?
            .to_f32()
            .map_err(|e| ModelError::Format(format!("{key}: {e}")))
    }
    fn bool(&self, key: &str) -> Result<bool, ModelError> {
        self.get(key)?
            .to_bool()
            .map_err(|e| ModelError::Format(format!("{key}: {e}")))
    }
    fn string(&self, key: &str) -> Result<String, ModelError> {
        self.get(key)?
            .to_string()
            .cloned()
            .map_err(|e| ModelError::Format(format!("{key}: {e}")))
    }
}
