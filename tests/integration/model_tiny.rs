//! The forward pass on tiny random models generated here: against candle-transformers' own
//! implementations fed one token at a time, across file formats (GGUF vs HF safetensors), with the
//! cache rolled back, batched, and with sliding windows (checked through RoPE's shift invariance).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, IndexOp, Tensor};
use infini_sidecar::model::{load_transformer, DeviceChoice, Transformer, WindowOptions};

const VOCAB: usize = 96;
const HIDDEN: usize = 64;
const FFN: usize = 128;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const LAYERS: usize = 2;

/// Deterministic pseudo-random weights (xorshift), scaled like an initialised network.
fn random(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
}

/// Norm weights near 1, so the network is neither dead nor exploding.
fn norm(n: usize, seed: u64) -> Tensor {
    (random(&[n], seed, 0.2) + 1.0).unwrap()
}

/// HF-named weights of a tiny llama (Q/K in the HF "halves" RoPE layout).
fn llama_weights(layers: usize) -> Vec<(String, Tensor)> {
    let mut w = vec![
        (
            "model.embed_tokens.weight".into(),
            random(&[VOCAB, HIDDEN], 1, 1.0),
        ),
        ("model.norm.weight".into(), norm(HIDDEN, 2)),
        ("lm_head.weight".into(), random(&[VOCAB, HIDDEN], 3, 0.3)),
    ];
    for l in 0..layers {
        let s = 100 * (l as u64 + 1);
        let p = |n: &str| format!("model.layers.{l}.{n}.weight");
        w.push((p("input_layernorm"), norm(HIDDEN, s)));
        w.push((p("post_attention_layernorm"), norm(HIDDEN, s + 1)));
        w.push((
            p("self_attn.q_proj"),
            random(&[HEADS * HEAD_DIM, HIDDEN], s + 2, 0.3),
        ));
        w.push((
            p("self_attn.k_proj"),
            random(&[KV_HEADS * HEAD_DIM, HIDDEN], s + 3, 0.3),
        ));
        w.push((
            p("self_attn.v_proj"),
            random(&[KV_HEADS * HEAD_DIM, HIDDEN], s + 4, 0.3),
        ));
        w.push((
            p("self_attn.o_proj"),
            random(&[HIDDEN, HEADS * HEAD_DIM], s + 5, 0.3),
        ));
        w.push((p("mlp.gate_proj"), random(&[FFN, HIDDEN], s + 6, 0.3)));
        w.push((p("mlp.up_proj"), random(&[FFN, HIDDEN], s + 7, 0.3)));
        w.push((p("mlp.down_proj"), random(&[HIDDEN, FFN], s + 8, 0.3)));
    }
    w
}

/// llama.cpp's converter permutation: HF's (i, i + d/2) RoPE pairs become (2i, 2i + 1).
fn to_interleaved(w: &Tensor, heads: usize) -> Tensor {
    let idx: Vec<u32> = (0..heads)
        .flat_map(|h| {
            (0..HEAD_DIM / 2).flat_map(move |i| {
                (0..2).map(move |s| (h * HEAD_DIM + s * HEAD_DIM / 2 + i) as u32)
            })
        })
        .collect();
    w.index_select(&Tensor::new(idx.as_slice(), &Device::Cpu).unwrap(), 0)
        .unwrap()
}

fn write_hf(dir: &Path, weights: &[(String, Tensor)]) {
    let config = serde_json::json!({
        "model_type": "llama", "vocab_size": VOCAB, "hidden_size": HIDDEN,
        "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 512
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let map: HashMap<String, Tensor> = weights.iter().cloned().collect();
    candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
}

/// The same tiny llama as a GGUF file, its matrices stored as `dtype`.
fn write_llama_gguf(path: &Path, weights: &[(String, Tensor)], dtype: GgmlDType) {
    let gguf_name = |hf: &str| -> String {
        let renames = [
            ("model.embed_tokens", "token_embd"),
            ("model.norm", "output_norm"),
            ("lm_head", "output"),
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "ffn_norm"),
            ("self_attn.q_proj", "attn_q"),
            ("self_attn.k_proj", "attn_k"),
            ("self_attn.v_proj", "attn_v"),
            ("self_attn.o_proj", "attn_output"),
            ("mlp.gate_proj", "ffn_gate"),
            ("mlp.up_proj", "ffn_up"),
            ("mlp.down_proj", "ffn_down"),
            ("model.layers", "blk"),
        ];
        renames
            .iter()
            .fold(hf.to_string(), |n, (a, b)| n.replace(a, b))
    };
    let tensors: Vec<(String, QTensor)> = weights
        .iter()
        .map(|(name, t)| {
            let t = if name.contains("q_proj") {
                to_interleaved(t, HEADS)
            } else if name.contains("k_proj") {
                to_interleaved(t, KV_HEADS)
            } else {
                t.clone()
            };
            let dt = if t.rank() == 2 { dtype } else { GgmlDType::F32 };
            (gguf_name(name), QTensor::quantize(&t, dt).unwrap())
        })
        .collect();
    let u = |v: usize| gguf_file::Value::U32(v as u32);
    let meta = vec![
        (
            "general.architecture",
            gguf_file::Value::String("llama".into()),
        ),
        ("llama.vocab_size", u(VOCAB)),
        ("llama.embedding_length", u(HIDDEN)),
        ("llama.feed_forward_length", u(FFN)),
        ("llama.block_count", u(LAYERS)),
        ("llama.attention.head_count", u(HEADS)),
        ("llama.attention.head_count_kv", u(KV_HEADS)),
        ("llama.rope.dimension_count", u(HEAD_DIM)),
        ("llama.context_length", u(512)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            gguf_file::Value::F32(1e-5),
        ),
        ("llama.rope.freq_base", gguf_file::Value::F32(10000.0)),
    ];
    write_gguf(path, &meta, &tensors);
}

fn write_gguf(path: &Path, meta: &[(&str, gguf_file::Value)], tensors: &[(String, QTensor)]) {
    let meta: Vec<(&str, &gguf_file::Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta, &tensors).unwrap();
}

/// A tiny one-layer Gemma-3 whose only layer is local, with a sliding window of `window`.
fn write_gemma_gguf(path: &Path, window: usize) {
    let mut tensors = vec![
        (
            "token_embd.weight".to_string(),
            random(&[VOCAB, HIDDEN], 11, 1.0),
        ),
        ("output_norm.weight".to_string(), norm(HIDDEN, 12)),
    ];
    let blk = |n: &str| format!("blk.0.{n}.weight");
    for (i, n) in [
        "attn_norm",
        "post_attention_norm",
        "ffn_norm",
        "post_ffw_norm",
    ]
    .iter()
    .enumerate()
    {
        tensors.push((blk(n), norm(HIDDEN, 20 + i as u64)));
    }
    tensors.push((blk("attn_q_norm"), norm(HEAD_DIM, 30)));
    tensors.push((blk("attn_k_norm"), norm(HEAD_DIM, 31)));
    tensors.push((blk("attn_q"), random(&[HEADS * HEAD_DIM, HIDDEN], 32, 0.3)));
    tensors.push((
        blk("attn_k"),
        random(&[KV_HEADS * HEAD_DIM, HIDDEN], 33, 0.3),
    ));
    tensors.push((
        blk("attn_v"),
        random(&[KV_HEADS * HEAD_DIM, HIDDEN], 34, 0.3),
    ));
    tensors.push((
        blk("attn_output"),
        random(&[HIDDEN, HEADS * HEAD_DIM], 35, 0.3),
    ));
    tensors.push((blk("ffn_gate"), random(&[FFN, HIDDEN], 36, 0.3)));
    tensors.push((blk("ffn_up"), random(&[FFN, HIDDEN], 37, 0.3)));
    tensors.push((blk("ffn_down"), random(&[HIDDEN, FFN], 38, 0.3)));
    let tensors: Vec<(String, QTensor)> = tensors
        .into_iter()
        .map(|(n, t)| (n, QTensor::quantize(&t, GgmlDType::F32).unwrap()))
        .collect();
    let u = |v: usize| gguf_file::Value::U32(v as u32);
    let meta = vec![
        (
            "general.architecture",
            gguf_file::Value::String("gemma3".into()),
        ),
        ("gemma3.vocab_size", u(VOCAB)),
        ("gemma3.embedding_length", u(HIDDEN)),
        ("gemma3.feed_forward_length", u(FFN)),
        ("gemma3.block_count", u(1)),
        ("gemma3.attention.head_count", u(HEADS)),
        ("gemma3.attention.head_count_kv", u(KV_HEADS)),
        ("gemma3.attention.key_length", u(HEAD_DIM)),
        ("gemma3.attention.value_length", u(HEAD_DIM)),
        ("gemma3.context_length", u(512)),
        ("gemma3.attention.sliding_window", u(window)),
        ("gemma3.attention.sliding_window_type", u(1000)),
        (
            "gemma3.attention.layer_norm_rms_epsilon",
            gguf_file::Value::F32(1e-6),
        ),
    ];
    write_gguf(path, &meta, &tensors);
}

fn tokens(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % VOCAB) as u32).collect()
}

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_vec2::<f32>().unwrap()
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f32::max)
}

fn all_logits(model: &Transformer, ids: &[u32]) -> Vec<Vec<f32>> {
    rows(&model.forward(ids, &mut model.new_cache()).unwrap())
}

fn tiny_llama(dir: &Path, dtype: GgmlDType) -> PathBuf {
    let path = dir.join(format!("tiny-{dtype:?}.gguf"));
    write_llama_gguf(&path, &llama_weights(LAYERS), dtype);
    path
}

#[test]
fn gguf_and_hf_directory_give_the_same_logits() {
    let dir = tempfile::tempdir().unwrap();
    let weights = llama_weights(LAYERS);
    write_hf(dir.path(), &weights);
    let gguf = tiny_llama(dir.path(), GgmlDType::F32);
    let hf = load_transformer(dir.path(), DeviceChoice::Cpu).unwrap();
    let gg = load_transformer(&gguf, DeviceChoice::Cpu).unwrap();
    let ids = tokens(40);
    let (a, b) = (all_logits(&hf, &ids), all_logits(&gg, &ids));
    let spread = a[5].iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(spread > 0.1, "logits are degenerate: {spread}");
    assert!(max_abs_diff(&a, &b) < 1e-4, "{}", max_abs_diff(&a, &b));
}

/// candle-transformers' quantized llama fed one position at a time: the last position's logits.
fn candle_token_by_token(path: &Path, ids: &[u32]) -> Vec<Vec<f32>> {
    use candle_transformers::models::quantized_llama::ModelWeights;
    let mut f = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut model = ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap();
    ids.iter()
        .enumerate()
        .map(|(pos, &id)| {
            let x = Tensor::new(&[id], &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            model
                .forward(&x, pos)
                .unwrap()
                .i(0)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

#[test]
fn all_positions_match_candle_transformers_token_by_token() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in [GgmlDType::F32, GgmlDType::Q8_0, GgmlDType::Q4_1] {
        let path = tiny_llama(dir.path(), dtype);
        let ours = load_transformer(&path, DeviceChoice::Cpu).unwrap();
        let ids = tokens(33);
        let diff = max_abs_diff(
            &all_logits(&ours, &ids),
            &candle_token_by_token(&path, &ids),
        );
        assert!(diff < 1e-4, "{dtype:?}: {diff}");
    }
}

#[test]
fn chunks_and_rollback_give_the_logits_of_a_fresh_pass() {
    let dir = tempfile::tempdir().unwrap();
    let model =
        load_transformer(&tiny_llama(dir.path(), GgmlDType::Q8_0), DeviceChoice::Cpu).unwrap();
    let ids = tokens(30);
    let fresh = all_logits(&model, &ids);
    let mut cache = model.new_cache();
    let mut chunked = Vec::new();
    for span in [0..7, 7..8, 8..19, 19..30] {
        chunked.extend(rows(&model.forward(&ids[span], &mut cache).unwrap()));
    }
    assert!(max_abs_diff(&fresh, &chunked) < 1e-4);
    // Roll back a rejected draft of 6 wrong tokens, then feed the real ones.
    cache.truncate(18);
    let wrong: Vec<u32> = ids[18..24].iter().map(|t| (t + 1) % VOCAB as u32).collect();
    model.forward(&wrong, &mut cache).unwrap();
    cache.truncate(18);
    assert_eq!(cache.len(), 18);
    let again = rows(&model.forward(&ids[18..30], &mut cache).unwrap());
    assert!(max_abs_diff(&fresh[18..], &again) < 1e-4);
}

#[test]
fn batched_scores_equal_one_at_a_time_and_windows_keep_their_context() {
    let dir = tempfile::tempdir().unwrap();
    let model =
        load_transformer(&tiny_llama(dir.path(), GgmlDType::Q8_0), DeviceChoice::Cpu).unwrap();
    let seqs: Vec<Vec<u32>> = [5, 40, 17]
        .iter()
        .map(|&n| tokens(n + 3)[3..].to_vec())
        .collect();
    let refs: Vec<&[u32]> = seqs.iter().map(|s| s.as_slice()).collect();
    let batched = model.score_batch(&refs).unwrap();
    for (s, b) in seqs.iter().zip(&batched) {
        let single = model.score_tokens(s).unwrap();
        assert_eq!(single.len(), s.len() - 1);
        for (x, y) in single.iter().zip(b) {
            assert!((x.logprob - y.logprob).abs() < 1e-4 && (x.entropy - y.entropy).abs() < 1e-4);
        }
    }
    // Window scoring: each token's log-prob is the next-token distribution of its window's context.
    let doc = tokens(50);
    let opts = WindowOptions {
        window: 16,
        stride: 6,
    };
    let scored = model.score_document(&doc, opts, |_| {}).unwrap();
    assert_eq!(scored.positions.len(), 49);
    let plan = infini_sidecar::model::plan_windows(doc.len(), opts).unwrap();
    for w in &plan {
        for i in w.score_from..w.end {
            let dist = model
                .next_token_distribution(&doc[w.start..i], 0, true)
                .unwrap();
            let expected = dist.logprobs.unwrap()[doc[i] as usize];
            assert!(
                (scored.positions[i - 1].logprob - expected).abs() < 1e-4,
                "token {i}"
            );
        }
    }
    // One window covering everything is one plain pass.
    let whole = model
        .score_document(
            &doc,
            WindowOptions {
                window: 64,
                stride: 32,
            },
            |_| {},
        )
        .unwrap();
    let plain = model.score_tokens(&doc).unwrap();
    assert_eq!(whole.positions, plain);
}

#[test]
fn sliding_window_sees_only_the_last_positions() {
    // One local layer: position i depends on tokens i-3..=i only, and RoPE depends only on relative
    // positions, so feeding just those four tokens must give the same logits.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemma.gguf");
    write_gemma_gguf(&path, 4);
    let model = load_transformer(&path, DeviceChoice::Cpu).unwrap();
    let ids = tokens(20);
    let full = all_logits(&model, &ids);
    for i in 3..20 {
        let alone = all_logits(&model, &ids[i - 3..=i]);
        let diff = max_abs_diff(&full[i..=i], &alone[3..]);
        assert!(diff < 1e-4, "position {i}: {diff}");
    }
    // With the cache, one token at a time, the window still holds.
    let mut cache = model.new_cache();
    let stepped: Vec<Vec<f32>> = ids
        .iter()
        .flat_map(|&t| rows(&model.forward(&[t], &mut cache).unwrap()))
        .collect();
    assert!(max_abs_diff(&full, &stepped) < 1e-4);
    // And the window matters: position 10 differs from seeing everything.
    let wide = dir.path().join("wide.gguf");
    write_gemma_gguf(&wide, 64);
    let unwindowed = all_logits(&load_transformer(&wide, DeviceChoice::Cpu).unwrap(), &ids);
    assert!(max_abs_diff(&full[10..11], &unwindowed[10..11]) > 1e-3);
}

#[test]
fn bad_inputs_are_refused_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let model =
        load_transformer(&tiny_llama(dir.path(), GgmlDType::F32), DeviceChoice::Cpu).unwrap();
    let err = model
        .forward(&[1, VOCAB as u32], &mut model.new_cache())
        .unwrap_err();
    assert!(
        err.to_string().contains("outside the model's vocabulary"),
        "{err}"
    );
    let long = tokens(513);
    assert!(model.forward(&long, &mut model.new_cache()).is_err());
    assert!(model.forward(&[], &mut model.new_cache()).is_err());
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF not really").unwrap();
    assert!(load_transformer(&bad, DeviceChoice::Cpu).is_err());
}
