//! Every kernel flavour this CPU runs (chosen as `INFINI_SIDECAR_CPU` would choose it), on the real
//! models: greedy speculative decoding emits exactly plain greedy decoding's tokens, and perplexity
//! on our quantized kernels alone stays within 0.5% of the f32 pass over the same weights.

use crate::common;
use std::sync::Arc;

use common::server::build_index;
use infini_sidecar::cpu::KernelFlavour;
use infini_sidecar::decoding::spec::{decode, SpecOptions};
use infini_sidecar::decoding::Extras;
use infini_sidecar::draft::{DraftOptions, DraftSource};
use infini_sidecar::evidence::EvidenceSource;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::model::{LoadOptions, Model, WindowOptions};

fn load(path: &std::path::Path, kernels: KernelFlavour, quantized_prefill: bool) -> Model {
    let opts = LoadOptions {
        kernels: Some(kernels),
        quantized_prefill,
        ..LoadOptions::default()
    };
    Model::load(path, &opts).unwrap()
}

fn brown_ids(model: &Model, n: usize) -> Vec<u32> {
    let ids = model.encode_document(&common::brown_test_text()).unwrap();
    assert!(ids.len() >= n);
    ids[..n].to_vec()
}

#[test]
fn every_flavour_decodes_speculatively_as_plain_greedy() {
    let dir = tempfile::tempdir().unwrap();
    let index: Arc<dyn EvidenceSource> =
        Arc::new(Index::open(&build_index(dir.path()), &OpenOptions::default()).unwrap());
    for flavour in KernelFlavour::supported_here() {
        let model = load(&common::smollm2_gguf(), flavour, true);
        assert_eq!(model.kernel_name(), flavour.name());
        let prompt = brown_ids(&model, 64);
        let plain = SpecOptions {
            max_new_tokens: 12,
            draft: None,
            temperature: None,
            seed: 0,
            stop_token: None,
        };
        let t = model.transformer();
        let want = decode(t, &index, &prompt, &plain, Extras::default()).unwrap();
        for tree in [false, true] {
            let spec = SpecOptions {
                draft: Some(DraftOptions {
                    source: DraftSource::All,
                    tree,
                    min_token_prob: 0.05,
                    min_path_prob: 0.05,
                    ..DraftOptions::default()
                }),
                ..plain
            };
            let got = decode(t, &index, &prompt, &spec, Extras::default()).unwrap();
            assert_eq!(got.tokens, want.tokens, "{flavour}, tree {tree}");
            assert!(got.drafted > 0, "{flavour}: nothing was drafted");
        }
    }
}

/// The quantized kernels round activations to 8 bits per block; over real tokens that may move
/// perplexity, but by less than 0.5%, in every flavour and both models (Gemma's Q5_0, Q4_K, Q6_K and
/// Q8_0 head included). Gemma skips the portable flavour, the slowest in a debug build: the unit tests
/// hold its products bit for bit to the others' in every format.
#[test]
fn every_flavour_keeps_perplexity_within_half_a_percent_of_f32() {
    let gemma = common::assets().join("gemma3/gemma-3-270m-q4_k_m.gguf");
    for (path, tokens, portable_too) in [(common::smollm2_gguf(), 256, true), (gemma, 128, false)] {
        let f32_model = load(&path, KernelFlavour::Portable, false);
        let ids = brown_ids(&f32_model, tokens);
        let opts = WindowOptions {
            window: tokens,
            stride: tokens / 2,
        };
        let score = |m: &Model| {
            m.transformer()
                .score_document(&ids, opts, |_| {})
                .unwrap()
                .perplexity()
        };
        let exact = score(&f32_model);
        drop(f32_model);
        for flavour in KernelFlavour::supported_here()
            .into_iter()
            .filter(|&f| portable_too || f != KernelFlavour::Portable)
        {
            let ours = score(&load(&path, flavour, true));
            eprintln!("{}: {flavour} {ours:.4}, f32 {exact:.4}", path.display());
            assert!(
                (ours / exact - 1.0).abs() < 0.005,
                "{}: {flavour} {ours} against f32 {exact}",
                path.display()
            );
        }
    }
}
