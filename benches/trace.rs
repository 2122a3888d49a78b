//! Maximal matching spans of SmolLM2's own output (`cargo bench --bench trace`): for test
//! documents of each domain, SmolLM2 continues the first 64 tokens by 256 greedy tokens, and the
//! 256 tokens are traced against the default index (spans of at least 8 tokens, 3 documents each).
//! Timed with all cores and with one (the searches run in parallel), 5 rounds each, in one run.
//! Writes `eval/results/trace.json` and `eval/results/trace-example.md`, the first generation
//! with its spans marked.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::trace::{TraceOptions, TraceSpan};
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::model::{GenerateOptions, LoadOptions, Model};
use infini_sidecar::tokenizer::Tokenizer;
use serde_json::json;

const PROMPT_TOKENS: usize = 64;
const NEW_TOKENS: usize = 256;
const ROUNDS: usize = 5;

/// Median ms of tracing every generation, with `threads` threads.
fn time_traces(index: &Index, generations: &[Vec<u32>], opts: TraceOptions, threads: usize) -> f64 {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut ms: Vec<f64> = Vec::new();
    for _ in 0..ROUNDS {
        for g in generations {
            let t = Instant::now();
            std::hint::black_box(pool.install(|| index.trace(g, opts).unwrap()));
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    ms.sort_by(f64::total_cmp);
    ms[ms.len() / 2]
}

/// The generation in Markdown: tokens inside a span in bold, then each span with its count and
/// where its first document comes from.
fn marked(tokenizer: &Tokenizer, prompt: &[u32], ids: &[u32], spans: &[TraceSpan]) -> String {
    let decode = |t: &[u32]| tokenizer.decode(t).unwrap().replace('\n', " ⏎ ");
    let mut covered = vec![false; ids.len()];
    for s in spans {
        covered[s.start..s.end].iter_mut().for_each(|c| *c = true);
    }
    let mut text = String::new();
    let mut i = 0;
    while i < ids.len() {
        let j = (i..ids.len())
            .find(|&j| covered[j] != covered[i])
            .unwrap_or(ids.len());
        let piece = decode(&ids[i..j]);
        if covered[i] {
            let trimmed = piece.trim();
            let lead = &piece[..piece.len() - piece.trim_start().len()];
            let tail = &piece[piece.trim_end().len()..];
            text += &format!("{lead}**{trimmed}**{tail}");
        } else {
            text += &piece;
        }
        i = j;
    }
    let mut out = format!(
        "# A SmolLM2 generation traced to the mini-Pile\n\nPrompt (the first {PROMPT_TOKENS} tokens of a test document): *{}*\n\nSmolLM2-135M's greedy continuation, {NEW_TOKENS} tokens; **bold**: inside a maximal span of at least 8 tokens that occurs verbatim in the train split (`cargo bench --bench trace`).\n\n> {text}\n\n| span (tokens) | count | text | first document |\n|---|---|---|---|\n",
        decode(prompt)
    );
    for s in spans {
        let doc = s.documents.first().map_or(String::new(), |d| {
            let meta: serde_json::Value = d
                .metadata
                .as_deref()
                .and_then(|m| serde_json::from_str(m).ok())
                .unwrap_or_default();
            format!(
                "#{} ({})",
                d.doc_ix,
                meta["metadata"]["meta"]["path"].as_str().unwrap_or("?")
            )
        });
        out += &format!(
            "| {}–{} | {} | {} | {} |\n",
            s.start,
            s.end,
            s.count,
            decode(&ids[s.start..s.end]).replace('|', "\\|"),
            doc
        );
    }
    out
}

fn main() {
    let dir = std::env::var_os("INFINI_SIDECAR_BENCH_INDEX")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::assets().join("index-minipile-train-decon-smollm2"));
    let index = Index::open(&dir, &OpenOptions::default()).unwrap();
    let model = Model::load(
        &common::assets().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        &LoadOptions::default(),
    )
    .unwrap();
    let tokenizer = model.tokenizer().clone();
    let docs = common::test_documents(&common::assets(), &tokenizer, PROMPT_TOKENS + 16, 400);
    // Two documents of each domain's stretch of the test split.
    let picked: Vec<&Vec<u32>> = docs.iter().step_by(docs.len() / 10).take(10).collect();
    let opts = GenerateOptions {
        max_new_tokens: NEW_TOKENS,
        temperature: None,
        top_p: None,
        seed: 0,
        stop_token: None,
    };
    let mut prompts = Vec::new();
    let mut generations = Vec::new();
    for doc in &picked {
        let prompt = &doc[..PROMPT_TOKENS];
        generations.push(model.transformer().generate(prompt, &opts).unwrap().tokens);
        prompts.push(prompt.to_vec());
    }
    let trace_opts = TraceOptions::default();
    let threads = rayon::current_num_threads();
    let all_cores = time_traces(&index, &generations, trace_opts, threads);
    let one_core = time_traces(&index, &generations, trace_opts, 1);
    let traced: Vec<Vec<TraceSpan>> = generations
        .iter()
        .map(|g| index.trace(g, trace_opts).unwrap())
        .collect();
    let spans: usize = traced.iter().map(Vec::len).sum();
    let covered: usize = traced
        .iter()
        .zip(&generations)
        .map(|(t, g)| {
            let mut c = vec![false; g.len()];
            for s in t {
                c[s.start..s.end].iter_mut().for_each(|x| *x = true);
            }
            c.iter().filter(|&&x| x).count()
        })
        .sum();
    let longest = traced
        .iter()
        .flatten()
        .map(|s| s.end - s.start)
        .max()
        .unwrap_or(0);
    let cpu = infini_sidecar::cpu::CpuInfo::detect();
    let result = json!({
        "cpu": cpu.summary(),
        "index": dir.display().to_string(),
        "index_tokens": index.total_tokens(),
        "generations": generations.len(),
        "tokens_each": NEW_TOKENS,
        "min_len": trace_opts.min_len,
        "documents_per_span": trace_opts.max_documents,
        "threads": threads,
        "median_ms_all_threads": all_cores,
        "median_ms_one_thread": one_core,
        "spans": spans,
        "tokens_in_spans_share": covered as f64 / (generations.len() * NEW_TOKENS) as f64,
        "longest_span": longest,
    });
    println!("{}", serde_json::to_string_pretty(&result).unwrap());
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/results");
    std::fs::write(
        out.join("trace.json"),
        serde_json::to_string_pretty(&result).unwrap() + "\n",
    )
    .unwrap();
    // The generation with the most of it traced, as the example.
    let best = (0..generations.len())
        .max_by_key(|&i| traced[i].iter().map(|s| s.end - s.start).sum::<usize>())
        .unwrap();
    std::fs::write(
        out.join("trace-example.md"),
        marked(
            &tokenizer,
            &prompts[best],
            &generations[best],
            &traced[best],
        ),
    )
    .unwrap();
}
