//! What a byte-level index costs per token (`cargo bench --bench bytes`): at 100 positions of
//! mini-Pile test documents, the ∞-gram's distribution over SmolLM2's tokens and over Gemma-3's
//! from their 64 most likely next tokens (`Index::byte_context_of_tokens`, then
//! `evidence::bytes::marginalise`: the candidates' runs of the vocabulary walked over their bytes),
//! on one byte index of the mini-Pile train split (built once into the assets folder, or
//! `INFINI_SIDECAR_BENCH_BYTE_INDEX`). Beside it, in the same run, SmolLM2's decode step (`model
//! generate`, greedy, 64 tokens). Writes `eval/results/bytes.json`.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use infini_sidecar::corpus::{expand_inputs, text_documents};
use infini_sidecar::evidence::bytes::marginalise;
use infini_sidecar::index::build::{build, BuildOptions};
use infini_sidecar::index::{Index, OpenOptions, TokenWidth};
use infini_sidecar::model::{GenerateOptions, LoadOptions, Model};
use infini_sidecar::tokenizer::{Tokenizer, BYTE_EOS, BYTE_VOCAB_SIZE};
use serde_json::json;

const POSITIONS: usize = 100;
const TOP_K: usize = 64;

fn byte_index() -> Index {
    let dir = std::env::var_os("INFINI_SIDECAR_BENCH_BYTE_INDEX")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::assets().join("index-minipile-train-bytes"));
    if !dir.join("sidecar-index.json").exists() {
        let tokenizer = Tokenizer::utf8_bytes();
        let opts = BuildOptions {
            tokenizer: Some(&tokenizer),
            ..BuildOptions::new(dir.clone(), TokenWidth::U8, BYTE_EOS, BYTE_VOCAB_SIZE)
        };
        let files = expand_inputs(&[common::assets().join("minipile/train.jsonl")]).unwrap();
        build(text_documents(files).map(|d| d.map_err(Into::into)), &opts).unwrap();
    }
    Index::open(&dir, &OpenOptions::default()).unwrap()
}

/// µs per position of the ∞-gram's distribution from each position's candidates
/// (`(context, candidates)`), its byte context looked up afresh.
fn byte_steps(index: &Index, tokenizer: &Tokenizer, cases: &[(Vec<u32>, Vec<u32>)]) -> f64 {
    let start = Instant::now();
    for (context, candidates) in cases {
        let ctx = index.byte_context_of_tokens(tokenizer, context).unwrap();
        std::hint::black_box(marginalise(index, tokenizer, &ctx, candidates));
    }
    start.elapsed().as_secs_f64() * 1e6 / cases.len() as f64
}

/// Positions of test documents with the model's top-k candidates there.
fn cases(model: &Model) -> Vec<(Vec<u32>, Vec<u32>)> {
    let docs = common::test_documents(&common::assets(), model.tokenizer(), 96, 400);
    docs.iter()
        .step_by((docs.len() / POSITIONS).max(1))
        .take(POSITIONS)
        .map(|doc| {
            let context = doc[..64].to_vec();
            let top = model
                .transformer()
                .next_token_distribution(&context, TOP_K, false)
                .unwrap()
                .top;
            (context, top.into_iter().map(|(t, _)| t).collect())
        })
        .collect()
}

fn main() {
    let index = byte_index();
    let smollm2 = Model::load(
        &common::assets().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        &LoadOptions::default(),
    )
    .unwrap();
    let gemma = Model::load(
        &common::assets().join("gemma3/gemma-3-270m-q4_k_m.gguf"),
        &LoadOptions::default(),
    )
    .unwrap();
    let smollm2_cases = cases(&smollm2);
    let gemma_cases = cases(&gemma);
    // Warm the index's pages and the spelling tables, then time.
    byte_steps(&index, smollm2.tokenizer(), &smollm2_cases);
    byte_steps(&index, gemma.tokenizer(), &gemma_cases);
    let smollm2_us = byte_steps(&index, smollm2.tokenizer(), &smollm2_cases);
    let gemma_us = byte_steps(&index, gemma.tokenizer(), &gemma_cases);
    let decode = smollm2
        .transformer()
        .generate(
            &smollm2_cases[0].0,
            &GenerateOptions {
                max_new_tokens: 64,
                temperature: None,
                top_p: None,
                seed: 0,
                stop_token: None,
            },
        )
        .unwrap()
        .decode_ms_per_token;
    let result = json!({
        "cpu": infini_sidecar::cpu::CpuInfo::detect().summary(),
        "byte_index_bytes": index.total_tokens(),
        "positions": smollm2_cases.len(),
        "candidates": TOP_K,
        "context_tokens": 64,
        "smollm2_marginalise_us_per_token": smollm2_us,
        "gemma3_marginalise_us_per_token": gemma_us,
        "smollm2_decode_ms_per_token": decode,
        "marginalise_over_decode_smollm2": smollm2_us / 1e3 / decode,
    });
    println!("{}", serde_json::to_string_pretty(&result).unwrap());
    std::fs::write(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/results/bytes.json"),
        serde_json::to_string_pretty(&result).unwrap() + "\n",
    )
    .unwrap();
}
