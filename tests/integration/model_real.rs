//! The real models (SmolLM2-135M and Gemma-3-270M, fetched by `scripts/fetch_assets.py`) against
//! candle-transformers' own implementations fed one token at a time, and against published figures.

use crate::common;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::{Device, IndexOp, Tensor};
use infini_sidecar::model::{
    Activation, DeviceChoice, GenerateOptions, LoadOptions, Model, Transformer,
};

fn gemma3_gguf() -> PathBuf {
    common::assets().join("gemma3/gemma-3-270m-q4_k_m.gguf")
}

fn load(path: &Path) -> Model {
    let opts = LoadOptions {
        device: DeviceChoice::Cpu,
        ..LoadOptions::default()
    };
    Model::load(path, &opts).unwrap()
}

/// The first Brown document of the test split (ca03), as text.
/// One forward call of a candle-transformers model: tokens and position in, last logits out.
type CandleStep = Box<dyn FnMut(&Tensor, usize) -> Tensor>;

/// candle-transformers' own model, fed one token at a time.
struct CandleReference {
    step: CandleStep,
    pos: usize,
}

impl CandleReference {
    fn new(path: &Path, gemma: bool) -> Self {
        use candle_transformers::models::{quantized_gemma3, quantized_llama};
        let mut f = std::fs::File::open(path).unwrap();
        let content = gguf_file::Content::read(&mut f).unwrap();
        let dev = Device::Cpu;
        let step: CandleStep = if gemma {
            let mut m = quantized_gemma3::ModelWeights::from_gguf(content, &mut f, &dev).unwrap();
            Box::new(move |x, pos| m.forward(x, pos).unwrap())
        } else {
            let mut m = quantized_llama::ModelWeights::from_gguf(content, &mut f, &dev).unwrap();
            Box::new(move |x, pos| m.forward(x, pos).unwrap())
        };
        Self { step, pos: 0 }
    }

    /// The logits after feeding `id`.
    fn feed(&mut self, id: u32) -> Vec<f32> {
        let x = Tensor::new(&[id], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = (self.step)(&x, self.pos);
        self.pos += 1;
        logits.i(0).unwrap().to_vec1::<f32>().unwrap()
    }
}

fn candle_token_by_token(path: &Path, ids: &[u32], gemma: bool) -> Vec<Vec<f32>> {
    let mut reference = CandleReference::new(path, gemma);
    ids.iter().map(|&id| reference.feed(id)).collect()
}

fn all_logits(model: &Transformer, ids: &[u32]) -> Vec<Vec<f32>> {
    model
        .forward(ids, &mut model.new_cache())
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

/// A copy of a GGUF model with every tensor dequantized to f32, so no activation is quantized and
/// two forwards that sum in different orders agree to float precision.
fn dequantized_copy(path: &Path, dir: &Path) -> PathBuf {
    use candle_core::quantized::{GgmlDType, QTensor};
    let mut f = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(String, QTensor)> = names
        .into_iter()
        .map(|n| {
            let t = content
                .tensor(&mut f, n, &Device::Cpu)
                .unwrap()
                .dequantize(&Device::Cpu)
                .unwrap();
            (n.clone(), QTensor::quantize(&t, GgmlDType::F32).unwrap())
        })
        .collect();
    let meta: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let out = dir.join("f32.gguf");
    gguf_file::write(&mut std::fs::File::create(&out).unwrap(), &meta, &tensors).unwrap();
    out
}

#[test]
fn smollm2_logits_at_every_position_match_candle_token_by_token() {
    // With f32 weights both forwards are exact up to summation order (and our gate's exponential,
    // a few ulp): one pass over 48 tokens gives, at every position, the logits candle-transformers
    // gives fed one token at a time.
    let dir = tempfile::tempdir().unwrap();
    let f32_model = dequantized_copy(&common::smollm2_gguf(), dir.path());
    let model = load(&common::smollm2_gguf());
    let ids = model.encode_document(&common::brown_test_text()).unwrap()[..48].to_vec();
    let ours = infini_sidecar::model::load_transformer(&f32_model, DeviceChoice::Cpu).unwrap();
    let diff = max_abs_diff(
        &all_logits(&ours, &ids),
        &candle_token_by_token(&f32_model, &ids, false),
    );
    assert!(diff < 1e-4, "max |Δlogit| = {diff}");
}

#[test]
fn smollm2_rollback_leaves_no_trace() {
    // Feeding a rejected draft and truncating it gives bit-identical logits to never feeding it.
    let model = load(&common::smollm2_gguf());
    let t = model.transformer();
    let ids = model.encode_document(&common::brown_test_text()).unwrap()[..48].to_vec();
    let mut clean = t.new_cache();
    t.forward(&ids[..30], &mut clean).unwrap();
    let expected = t
        .forward(&ids[30..], &mut clean)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let mut rolled = t.new_cache();
    t.forward(&ids[..30], &mut rolled).unwrap();
    let draft: Vec<u32> = ids[30..40].iter().map(|&x| (x + 7) % 49152).collect();
    t.forward(&draft, &mut rolled).unwrap();
    rolled.truncate(30);
    let again = t
        .forward(&ids[30..], &mut rolled)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(expected, again);
}

/// A draft tree verified in one pass: every row's logits are those of decoding its path alone, bit
/// for bit, and keeping an accepted path leaves the cache as decoding that path would.
#[test]
fn smollm2_tree_rows_decode_their_paths_exactly() {
    let model = load(&common::smollm2_gguf());
    let t = model.transformer();
    let ids = model.encode_document(&common::brown_test_text()).unwrap()[..40].to_vec();
    let (context, next) = (&ids[..30], &ids[30..]);
    // Rows: 0 the pending token; 1 and 2 two children of it; 3 under 1; 4 under 2; 5 under 4.
    let tokens = [next[0], next[1], 1000, next[2], 2000, next[3]];
    let parents = [0, 0, 0, 1, 2, 4];
    let mut cache = t.new_cache();
    t.forward(context, &mut cache).unwrap();
    let tree = t
        .forward_tree(&tokens, &parents, &mut cache)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let path_of = |mut row: usize| {
        let mut path = vec![row];
        while row > 0 {
            row = parents[row];
            path.push(row);
        }
        path.reverse();
        path
    };
    let decode_alone = |path: &[usize]| {
        let mut alone = t.new_cache();
        t.forward(context, &mut alone).unwrap();
        let mut last = Vec::new();
        for &r in path {
            last = t
                .forward(&[tokens[r]], &mut alone)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
        }
        (last.remove(0), alone)
    };
    for (row, logits) in tree.iter().enumerate() {
        let (want, _) = decode_alone(&path_of(row));
        assert!(
            *logits == want,
            "row {row} differs from its path decoded alone"
        );
    }
    // Keep the path 0 → 2 → 4, then decode one more token on each cache.
    let kept = path_of(4);
    cache.keep(context.len(), &kept).unwrap();
    assert_eq!(cache.len(), context.len() + 3);
    let (_, mut plain) = decode_alone(&kept);
    let after = |c: &mut infini_sidecar::model::KvCache| {
        t.forward(&[next[5]], c).unwrap().to_vec2::<f32>().unwrap()
    };
    assert_eq!(after(&mut cache), after(&mut plain));
    // Parents must come before their rows.
    let mut bad = t.new_cache();
    t.forward(context, &mut bad).unwrap();
    assert!(t.forward_tree(&tokens[..3], &[0, 2, 0], &mut bad).is_err());
    assert!(bad.keep(context.len(), &[1, 0]).is_err());
}

/// A verification pass longer than a short one (here the most an exact pass takes) still computes
/// every row as a one-token step does, bit for bit, where the same rows through `forward` take the
/// dense f32 copies and differ; a longer exact pass is refused.
#[test]
fn smollm2_exact_passes_of_many_rows_decode_as_single_steps() {
    let model = load(&common::smollm2_gguf());
    let t = model.transformer();
    let rows = infini_sidecar::model::MAX_EXACT_ROWS;
    let ids = model.encode_document(&common::brown_test_text()).unwrap()[..30 + rows].to_vec();
    let (context, chain) = ids.split_at(30);
    let primed = || {
        let mut cache = t.new_cache();
        t.forward(context, &mut cache).unwrap();
        cache
    };
    let exact = t
        .forward_exact(chain, &mut primed())
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let mut alone = primed();
    for (i, &id) in chain.iter().enumerate() {
        let want = t
            .forward(&[id], &mut alone)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert!(
            exact[i] == want[0],
            "row {i} differs from its one-token step"
        );
    }
    let batched = t
        .forward(chain, &mut primed())
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert!(
        batched != exact,
        "a long pass through forward should take the dense copies"
    );
    let mut longer = primed();
    let too_many = [chain, &chain[..1]].concat();
    assert!(t.forward_exact(&too_many, &mut longer).is_err());
    assert_eq!(longer.len(), context.len(), "a refused pass writes nothing");
}

/// Perplexity of tokens 1.. of `ids` from candle-transformers fed one token at a time.
fn candle_perplexity(path: &Path, ids: &[u32], gemma: bool) -> f64 {
    let mut reference = CandleReference::new(path, gemma);
    let mut nll = 0.0;
    for w in ids.windows(2) {
        let logits = reference.feed(w[0]);
        let max = logits.iter().copied().fold(f32::MIN, f32::max) as f64;
        let log_z = logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln()
            + max;
        nll += log_z - logits[w[1] as usize] as f64;
    }
    (nll / (ids.len() - 1) as f64).exp()
}

#[test]
fn smollm2_perplexity_agrees_with_candle_token_by_token() {
    // The first 400 tokens of the Brown test split, scored by our window scorer in one pass. The
    // quantized model quantizes activations to 8 bits, so a chunk and single tokens round differently;
    // the perplexities must still agree.
    let model = load(&common::smollm2_gguf());
    let ids = model.encode_document(&common::brown_test_text()).unwrap()[..400].to_vec();
    let score = model
        .transformer()
        .score_document(&ids, Default::default(), |_| {})
        .unwrap();
    assert_eq!(score.positions.len(), 399);
    let ours = score.perplexity();
    let theirs = candle_perplexity(&common::smollm2_gguf(), &ids, false);
    assert!(
        (ours / theirs - 1.0).abs() < 0.01,
        "ours {ours}, candle {theirs}"
    );
}

#[test]
fn smollm2_greedy_continuation_names_paris() {
    let model = load(&common::smollm2_gguf());
    let prompt = model.encode_document("The capital of France is").unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 12,
        temperature: None,
        top_p: None,
        seed: 0,
        stop_token: None,
    };
    let generated = model.transformer().generate(&prompt, &opts).unwrap().tokens;
    let text = model.decode(&generated).unwrap();
    assert!(text.contains("Paris"), "{text:?}");
}

/// Token-by-token decoding quantizes each activation row to 8 bits, so a float's last bit can flip a
/// rounding and move a logit by up to about 1 (candle's logits move as much under a 10⁻⁶ nudge).
/// Our kernels and candle's sum in different orders, so neither is the other's oracle: both are held
/// against the unquantized f32 pass over the same 200 tokens, and ours must be as close as candle's.
#[test]
fn smollm2_decoding_is_as_close_to_f32_as_candles() {
    let model = load(&common::smollm2_gguf());
    let t = model.transformer();
    let ids = model.encode_document(&common::brown_test_text()).unwrap()[..200].to_vec();
    let f32_logits = t
        .forward(&ids, &mut t.new_cache())
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let mut reference = CandleReference::new(&common::smollm2_gguf(), false);
    let mut cache = t.new_cache();
    let argmax = |v: &[f32]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b]));
    let max_diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let (mut ours_agree, mut candle_agree, mut ours_diff, mut candle_diff) = (0, 0, 0f32, 0f32);
    for (exact, &id) in f32_logits.iter().zip(&ids) {
        let candle = reference.feed(id);
        let ours: Vec<f32> = t
            .forward_last(&[id], &mut cache)
            .unwrap()
            .to_vec1()
            .unwrap();
        ours_agree += usize::from(argmax(&ours) == argmax(exact));
        candle_agree += usize::from(argmax(&candle) == argmax(exact));
        ours_diff += max_diff(&ours, exact);
        candle_diff += max_diff(&candle, exact);
    }
    eprintln!("argmax as f32: ours {ours_agree}, candle {candle_agree} of 200; summed max |Δ|: ours {ours_diff}, candle {candle_diff}");
    assert!(ours_agree + 4 >= candle_agree && ours_agree >= 180);
    assert!(ours_diff <= 1.1 * candle_diff);
}

#[test]
fn gemma3_matches_candle_and_needs_u32_ids() {
    let model = load(&gemma3_gguf());
    let config = model.config().clone();
    assert_eq!(config.vocab_size, 262_144);
    assert_eq!(config.bos_token_id, Some(2));
    // The 262k vocabulary reaches past u16.
    let ids = model
        .encode_document("naïve café — 東京 🚀 ".repeat(3).as_str())
        .unwrap();
    assert!(ids.iter().any(|&t| t > u16::MAX as u32), "{ids:?}");
    let text = common::brown_test_text();
    let ids = model.encode_document(&text).unwrap()[..40].to_vec();
    assert_eq!(
        model.decode(&ids[1..]).unwrap(),
        text[..model.decode(&ids[1..]).unwrap().len()]
    );
    // candle-transformers' quantized_gemma3 uses SiLU in the feed-forward block; with that one switch
    // flipped, our forward gives its logits at every position (f32 weights: exact up to summation
    // order and our gate's exponential).
    let dir = tempfile::tempdir().unwrap();
    let f32_model = dequantized_copy(&gemma3_gguf(), dir.path());
    let mut silu = infini_sidecar::model::load_transformer(&f32_model, DeviceChoice::Cpu).unwrap();
    silu.set_activation(Activation::Silu);
    let diff = max_abs_diff(
        &all_logits(&silu, &ids),
        &candle_token_by_token(&f32_model, &ids, true),
    );
    assert!(diff < 1e-3, "max |Δlogit| = {diff}");
    let ppl = |s: Vec<infini_sidecar::model::PositionScore>| {
        (-s.iter().map(|p| p.logprob as f64).sum::<f64>() / s.len() as f64).exp()
    };
    // Gemma's real activation is GELU: it predicts real text far better.
    let ids = model.encode_document(&text).unwrap()[..300].to_vec();
    let gelu = ppl(model.transformer().score_tokens(&ids).unwrap());
    let mut silu =
        infini_sidecar::model::load_transformer(&gemma3_gguf(), DeviceChoice::Cpu).unwrap();
    silu.set_activation(Activation::Silu);
    let silu = ppl(silu.score_tokens(&ids).unwrap());
    assert!(gelu < 0.8 * silu, "GELU {gelu} vs SiLU {silu}");
}

#[test]
fn models_pair_only_with_indexes_of_their_tokenizer() {
    let smollm2 = load(&common::smollm2_gguf());
    let index_tokenizer = common::smollm2_tokenizer();
    smollm2
        .check_tokenizer(index_tokenizer.fingerprint(), "the index")
        .unwrap();
    let gemma = load(&gemma3_gguf());
    let err = gemma
        .check_tokenizer(index_tokenizer.fingerprint(), "the index")
        .unwrap_err();
    assert!(err.to_string().contains("tokenized with"), "{err}");
}
