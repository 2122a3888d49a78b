//! ∞-gram hints for training (`cargo bench --bench hints`): 1,024-token windows of mini-Pile train
//! documents, which the default index holds (as a training job's sequences are in its datastore),
//! hinted at every position with S = 20 samples: the regulariser on and off, and the exact top 20,
//! on one thread (per core) and on all, in one run; with the searches per position left to right
//! against a fresh binary search at each. Writes `eval/results/hints.json`.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use infini_sidecar::corpus::{expand_inputs, text_documents, Content};
use infini_sidecar::index::hints::{HintCost, HintOptions};
use infini_sidecar::index::{Index, OpenOptions};
use rayon::prelude::*;
use serde_json::json;

const WINDOW: usize = 1024;
const SEQUENCES: usize = 64;

/// Positions a second hinting every sequence with `threads` threads, and the searches it cost.
fn rate(index: &Index, seqs: &[Vec<u32>], opts: &HintOptions, threads: usize) -> (f64, HintCost) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let t = Instant::now();
    let costs: Vec<HintCost> = pool.install(|| {
        seqs.par_iter()
            .map(|s| std::hint::black_box(index.hints(s, opts).unwrap()).1)
            .collect()
    });
    let seconds = t.elapsed().as_secs_f64();
    let mut cost = HintCost::default();
    costs.into_iter().for_each(|c| cost.add(c));
    (cost.positions as f64 / seconds, cost)
}

fn main() {
    let dir = std::env::var_os("INFINI_SIDECAR_BENCH_INDEX")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::assets().join("index-minipile-train-decon-smollm2"));
    let index = Index::open(&dir, &OpenOptions::default()).unwrap();
    let tokenizer = index.tokenizer().unwrap().clone();
    let files = expand_inputs(&[common::assets().join("minipile/train.jsonl")]).unwrap();
    // Every 40th document long enough, so each domain has its share.
    let seqs: Vec<Vec<u32>> = text_documents(files)
        .step_by(40)
        .filter_map(|d| match d.unwrap().content {
            Content::Text(t) => Some(tokenizer.encode(&t).unwrap()),
            Content::Tokens(_) => None,
        })
        .filter(|ids| ids.len() >= WINDOW)
        .map(|ids| ids[..WINDOW].to_vec())
        .take(SEQUENCES)
        .collect();
    let threads = rayon::current_num_threads();
    let configs = [
        ("samples, regulariser on", HintOptions::default()),
        (
            "samples, regulariser off",
            HintOptions {
                regularise: false,
                ..HintOptions::default()
            },
        ),
        (
            "exact top 20, regulariser on",
            HintOptions {
                exact: true,
                ..HintOptions::default()
            },
        ),
    ];
    let mut rows = Vec::new();
    for (name, opts) in configs {
        // A warm-up pass brings the index into the page cache.
        rate(&index, &seqs, &opts, threads);
        let (one, cost) = rate(&index, &seqs, &opts, 1);
        let (all, _) = rate(&index, &seqs, &opts, threads);
        let per = |n: u64| n as f64 / cost.positions as f64;
        println!(
            "{name}: {one:.0} positions/s on one thread, {all:.0} on {threads}; searches a position {:.2} left to right, {:.2} afresh",
            per(cost.searches),
            per(cost.fresh_searches)
        );
        rows.push(json!({
            "config": name,
            "samples": opts.samples,
            "exact": opts.exact,
            "regularise": opts.regularise,
            "min_plateau": opts.min_plateau,
            "positions_per_second_one_thread": one,
            "positions_per_second_all_threads": all,
            "searches_per_position": per(cost.searches),
            "fresh_searches_per_position": per(cost.fresh_searches),
        }));
    }
    let result = json!({
        "cpu": infini_sidecar::cpu::CpuInfo::detect().summary(),
        "index": dir.display().to_string(),
        "index_tokens": index.total_tokens(),
        "sequences": seqs.len(),
        "tokens_each": WINDOW,
        "threads": threads,
        "rows": rows,
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/results/hints.json");
    std::fs::write(&out, serde_json::to_string_pretty(&result).unwrap() + "\n").unwrap();
    println!("wrote {}", out.display());
}
