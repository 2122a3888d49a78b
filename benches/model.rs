//! Model speed, ours beside candle-transformers' own forward on the same GGUF file and tokens:
//! scoring one 1024-token window (logits at every position for us; candle-transformers computes the
//! same layers but only the last position's logits), single-token decode with the cache, and our
//! exact passes of 1 to 32 rows (draft verification) after a short context and after 640 cached
//! positions.
//!
//! `cargo bench --bench model -- MODEL.gguf [TOKENS_FILE] [--ours-only]` prints one JSON line per
//! measurement, naming the CPU and the kernel flavour. Threads: set `CANDLE_NUM_THREADS`
//! (eval/bench_model.py runs it with 1 and 2); flavour: `INFINI_SIDECAR_CPU`. `--ours-only` skips
//! the quantized-only window and candle-transformers (the slow parts).

mod common;

use std::path::PathBuf;
use std::time::Instant;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use infini_sidecar::cpu::{CpuInfo, KernelFlavour};
use infini_sidecar::model::{load_transformer, DeviceChoice, Transformer, WindowOptions};

use common::median;

const WINDOW: usize = 1024;
const DECODE_STEPS: usize = 64;
/// Cached positions before the long-context passes: about a workload request's midpoint.
const LONG_CONTEXT: usize = 640;
const REPEATS: usize = 3;
/// Slow configurations (quantized window scoring on one thread) stop repeating after this long.
const REPEAT_BUDGET_S: f64 = 20.0;

/// candle-transformers' forward: token ids and their first position in, logits discarded.
type CandleStep = Box<dyn FnMut(&[u32], usize)>;

/// Wraps a candle-transformers model's `forward` as a [`CandleStep`].
fn boxed<M: 'static>(
    mut model: M,
    forward: fn(&mut M, &Tensor, usize) -> candle_core::Result<Tensor>,
) -> CandleStep {
    Box::new(move |ids, pos| {
        let x = Tensor::new(ids, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        forward(&mut model, &x, pos).unwrap();
    })
}

/// Median seconds of `run`, repeated up to [`REPEATS`] times within [`REPEAT_BUDGET_S`].
fn median_seconds(mut run: impl FnMut()) -> f64 {
    let mut times = Vec::new();
    while times.len() < REPEATS && times.iter().sum::<f64>() < REPEAT_BUDGET_S {
        let t = Instant::now();
        run();
        times.push(t.elapsed().as_secs_f64());
    }
    median(times)
}

fn report(runtime: &str, what: &str, model: &str, value: f64, unit: &str) {
    let threads = std::env::var("CANDLE_NUM_THREADS").unwrap_or_else(|_| "all".into());
    let flavour = match runtime {
        "candle-transformers" => "candle".to_string(),
        _ => KernelFlavour::requested(None).map_or_else(|e| e.to_string(), |f| f.to_string()),
    };
    println!(
        "{}",
        serde_json::json!({"runtime": runtime, "measure": what, "model": model, "threads": threads,
                           "value": value, "unit": unit, "kernel_flavour": flavour,
                           "cpu": CpuInfo::detect()})
    );
}

/// Deterministic pseudo-text ids when no token file is given (speed does not depend on them).
fn tokens(vocab: usize, file: Option<PathBuf>) -> Vec<u32> {
    match file {
        Some(f) => serde_json::from_str::<Vec<u32>>(&std::fs::read_to_string(f).unwrap()).unwrap(),
        None => (0..WINDOW as u64)
            .map(|i| ((i * 7919 + 13) % (vocab as u64 - 300) + 256) as u32)
            .collect(),
    }
}

/// Median tokens per second of scoring one window with the paper's protocol.
fn window_tokens_per_s(model: &Transformer, ids: &[u32]) -> f64 {
    let opts = WindowOptions {
        window: ids.len(),
        stride: ids.len() / 2,
    };
    ids.len() as f64
        / median_seconds(|| {
            model.score_document(ids, opts, |_| {}).unwrap();
        })
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let Some(path) = args.first().map(PathBuf::from) else {
        eprintln!("usage: cargo bench --bench model -- MODEL.gguf [TOKENS.json]");
        return;
    };
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    // A flavour this CPU lacks (`INFINI_SIDECAR_CPU`) is refused here: say why, not where.
    let mut ours = match load_transformer(&path, DeviceChoice::Cpu) {
        Ok(model) => model,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            std::process::exit(2);
        }
    };
    let ids = tokens(ours.config().vocab_size, args.get(1).map(PathBuf::from));
    let ids = &ids[..WINDOW];
    let gemma = ours.config().architecture == infini_sidecar::model::Architecture::Gemma3;
    let ours_only = std::env::args().any(|a| a == "--ours-only");

    // Ours: score a full window (forward + logits of every position + log-softmax), first on the
    // quantized weights alone, then with the dense f32 copies that `Model::load` adds by default.
    if !ours_only {
        report(
            "ours (quantized)",
            "window_tokens_per_s",
            &name,
            window_tokens_per_s(&ours, ids),
            "tok/s",
        );
    }
    ours.add_dense_copies().unwrap();
    report(
        "ours",
        "window_tokens_per_s",
        &name,
        window_tokens_per_s(&ours, ids),
        "tok/s",
    );

    // Ours: decode, one token at a time after a 32-token prompt.
    let mut cache = ours.new_cache();
    ours.forward(&ids[..32], &mut cache).unwrap();
    let t = Instant::now();
    for &id in &ids[32..32 + DECODE_STEPS] {
        ours.forward(&[id], &mut cache).unwrap();
    }
    report(
        "ours",
        "decode_ms_per_token",
        &name,
        t.elapsed().as_secs_f64() * 1e3 / DECODE_STEPS as f64,
        "ms",
    );

    // Ours: one exact pass of k rows after the decode above (draft verification, up to the longest
    // one), rolled back each time: an extra row's cost against the step's is what speculative
    // decoding trades on. Then the same after a context as long as a workload request's (a prompt
    // of a few hundred tokens and its answer), where attention's share of a row grows.
    for context in [cache.len(), LONG_CONTEXT] {
        if cache.len() < context {
            ours.forward(&ids[cache.len()..context], &mut cache)
                .unwrap();
        }
        let suffix = match context {
            LONG_CONTEXT => format!("_at_{LONG_CONTEXT}"),
            _ => String::new(),
        };
        for rows in [1usize, 2, 4, 8, 15, infini_sidecar::model::MAX_EXACT_ROWS] {
            let input = &ids[context..context + rows];
            let seconds = median_seconds(|| {
                ours.forward_exact(input, &mut cache).unwrap();
                cache.truncate(context);
            });
            report(
                "ours",
                &format!("pass_ms_{rows}_rows{suffix}"),
                &name,
                seconds * 1e3,
                "ms",
            );
        }
    }

    if ours_only {
        return;
    }
    // candle-transformers' forward on the same window and the same decode.
    let dev = Device::Cpu;
    let mut f = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut step: CandleStep = if gemma {
        use candle_transformers::models::quantized_gemma3::ModelWeights;
        boxed(
            ModelWeights::from_gguf(content, &mut f, &dev).unwrap(),
            ModelWeights::forward,
        )
    } else {
        use candle_transformers::models::quantized_llama::ModelWeights;
        boxed(
            ModelWeights::from_gguf(content, &mut f, &dev).unwrap(),
            ModelWeights::forward,
        )
    };
    let seconds = median_seconds(|| step(ids, 0));
    report(
        "candle-transformers",
        "window_tokens_per_s",
        &name,
        WINDOW as f64 / seconds,
        "tok/s",
    );
    step(&ids[..32], 0);
    let t = Instant::now();
    for (i, &id) in ids[32..32 + DECODE_STEPS].iter().enumerate() {
        step(&[id], 32 + i);
    }
    report(
        "candle-transformers",
        "decode_ms_per_token",
        &name,
        t.elapsed().as_secs_f64() * 1e3 / DECODE_STEPS as f64,
        "ms",
    );
}
