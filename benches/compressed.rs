//! The compressed index against the suffix-array index of the same text (`cargo bench --bench
//! compressed`): both built from the same documents on one thread, one after the other (text per
//! second per core), their sizes (bytes per token of text: per byte at byte level), the latency of count,
//! of the ∞-gram distribution and of document search on mini-Pile test text, in one run. The index is the byte-level
//! mini-Pile train index unless `INFINI_SIDECAR_BENCH_INDEX` names another. Writes
//! `eval/results/compressed.json`.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use infini_sidecar::corpus::{Content, InputDoc};
use infini_sidecar::index::build::{build, BuildOptions};
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::docs::SearchOptions;
use infini_sidecar::index::fm::CompressedIndex;
use infini_sidecar::index::{Index, OpenOptions};
use serde_json::json;

/// Queries of each kind: enough for a stable mean, few enough for a short run.
const QUERIES: usize = 400;

/// Mean microseconds of `f` over `items`.
fn mean_us<T>(items: &[T], mut f: impl FnMut(&T)) -> f64 {
    let t = Instant::now();
    items.iter().for_each(&mut f);
    t.elapsed().as_secs_f64() * 1e6 / items.len() as f64
}

fn main() {
    let dir = std::env::var_os("INFINI_SIDECAR_BENCH_INDEX")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::assets().join("index-minipile-train-bytes"));
    let source = Index::open(&dir, &OpenOptions::default()).unwrap();
    let docs: Vec<Vec<u32>> = source.documents().collect();
    // Metadata lines too: both indexes keep them, and the compressed size counts them.
    let metadata: Vec<Option<String>> = (0..source.total_documents())
        .map(|d| source.get_document(d).unwrap().metadata)
        .collect();
    let text_tokens: u64 = docs.iter().map(|d| d.len() as u64).sum();
    let work = tempfile::tempdir().unwrap();

    let t = Instant::now();
    let input = docs.iter().zip(&metadata).map(|(d, m)| {
        Ok(InputDoc {
            content: Content::Tokens(d.clone()),
            metadata: m.clone(),
            input_bytes: 0,
        })
    });
    let opts = BuildOptions {
        threads: 1,
        ..BuildOptions::new(
            work.path().join("sa"),
            source.width(),
            source.eos_token_id(),
            source.vocab_size(),
        )
    };
    build(input, &opts).unwrap();
    let sa_seconds = t.elapsed().as_secs_f64();
    let sa = Index::open(&work.path().join("sa"), &OpenOptions::default()).unwrap();
    let t = Instant::now();
    let fm = CompressedIndex::build(&sa, &work.path().join("fm"), 1, |_| {}).unwrap();
    let fm_seconds = t.elapsed().as_secs_f64();
    let (sa_info, fm_info) = (sa.info(), fm.info().unwrap());
    let width = source.width().bytes() as f64;
    let text_mb = text_tokens as f64 * width / 1e6;

    // Prompts from test text: n-grams of 4 and 16 tokens for count, 64-token contexts for the
    // ∞-gram, at spread positions.
    let tokenizer = source.tokenizer().unwrap();
    let test = common::test_documents(&common::assets(), tokenizer, 128, 200);
    let at = |k: usize, len: usize| {
        let d = &test[k % test.len()];
        let from = (k * 7919) % (d.len() - len);
        d[from..from + len].to_vec()
    };
    let grams = |len: usize| (0..QUERIES).map(|k| at(k, len)).collect::<Vec<_>>();
    let (short, long, contexts) = (grams(4), grams(16), grams(64));
    let mut rows = Vec::new();
    for (name, queries) in [("count, 4-grams", &short), ("count, 16-grams", &long)] {
        let sa_us = mean_us(queries, |q| {
            std::hint::black_box(sa.count(q).unwrap());
        });
        let fm_us = mean_us(queries, |q| {
            std::hint::black_box(fm.count(q).unwrap());
        });
        rows.push((name, sa_us, fm_us));
    }
    let sa_us = mean_us(&contexts, |q| {
        std::hint::black_box(sa.infgram_ntd(q, None).unwrap());
    });
    let fm_us = mean_us(&contexts, |q| {
        std::hint::black_box(fm.infgram_ntd(q, None).unwrap());
    });
    rows.push(("∞-gram ntd, 64-token contexts", sa_us, fm_us));
    let sa_us = mean_us(&contexts, |q| {
        std::hint::black_box(sa.infgram_prob(q, q[0]).unwrap());
    });
    let fm_us = mean_us(&contexts, |q| {
        std::hint::black_box(fm.infgram_prob(q, q[0]).unwrap());
    });
    rows.push(("∞-gram prob, 64-token contexts", sa_us, fm_us));
    // Document search as the service asks it (the defaults: the first document, a window of
    // 1,000 tokens), over the n-grams the compressed index answers: those the suffix array does
    // not subsample.
    // Places visited (matches located) a search, mean: a row's time over it is a place's cost.
    let opts = SearchOptions {
        max_places: u64::MAX,
        ..SearchOptions::default()
    };
    let mut places = Vec::new();
    for (name, queries) in [
        ("document search, 4-grams", &short),
        ("document search, 16-grams", &long),
    ] {
        let mut visited = 0;
        let whole: Vec<Vec<Vec<Vec<u32>>>> = queries
            .iter()
            .map(|q| vec![vec![q.clone()]])
            .filter(|cnf| {
                let found = sa.search_docs_cnf(cnf, opts).unwrap();
                visited += if found.approx { 0 } else { found.cnt };
                !found.approx
            })
            .collect();
        let sa_us = mean_us(&whole, |cnf| {
            std::hint::black_box(sa.search_docs_cnf(cnf, opts).unwrap());
        });
        let fm_us = mean_us(&whole, |cnf| {
            std::hint::black_box(fm.search_docs_cnf(cnf, opts).unwrap());
        });
        rows.push((name, sa_us, fm_us));
        places.push((name, visited as f64 / whole.len().max(1) as f64));
    }

    println!(
        "{}: {} documents, {:.1} MB of text ({} tokens of {} bytes)",
        dir.display(),
        docs.len(),
        text_mb,
        text_tokens,
        width
    );
    println!(
        "build, one thread: suffix array {sa_seconds:.1} s ({:.2} MB/s), compressed {fm_seconds:.1} s ({:.2} MB/s)",
        text_mb / sa_seconds,
        text_mb / fm_seconds
    );
    // Per token of text (separators left out): per byte of UTF-8 at byte level.
    let per_text = |bytes: u64| bytes as f64 / text_tokens as f64;
    println!(
        "size: suffix array {:.1} MB ({:.3} bytes per token of text), compressed {:.1} MB ({:.3})",
        sa_info.bytes as f64 / 1e6,
        per_text(sa_info.bytes),
        fm_info.bytes as f64 / 1e6,
        per_text(fm_info.bytes)
    );
    for (part, bytes) in &fm_info.bytes_by_component {
        println!("  {part}: {:.3} bytes per token of text", per_text(*bytes));
    }
    println!(
        "{:<32} {:>14} {:>14}",
        "latency (mean µs)", "suffix array", "compressed"
    );
    for (name, sa_us, fm_us) in &rows {
        println!("{name:<32} {sa_us:>14.1} {fm_us:>14.1}");
    }
    for (name, mean) in &places {
        println!("{name}: {mean:.0} places a search");
    }
    let result = json!({
            "cpu": infini_sidecar::cpu::CpuInfo::detect().summary(),
            "index": dir.display().to_string(),
            "documents": docs.len(),
            "text_tokens": text_tokens,
            "token_bytes": width,
            "build_seconds_one_thread": {"suffix_array": sa_seconds, "compressed": fm_seconds},
            "build_mb_per_s_one_thread": {"suffix_array": text_mb / sa_seconds, "compressed": text_mb / fm_seconds},
            "bytes": {"suffix_array": sa_info.bytes, "compressed": fm_info.bytes},
            "bytes_per_text_token": {"suffix_array": per_text(sa_info.bytes), "compressed": per_text(fm_info.bytes)},
            "compressed_parts_per_text_token": fm_info.bytes_by_component.iter().map(|(p, b)| (p.clone(), json!(per_text(*b)))).collect::<serde_json::Map<_, _>>(),
            "latency_us": rows.iter().map(|(n, s, f)| json!({"query": n, "suffix_array": s, "compressed": f})).collect::<Vec<_>>(),
            "document_search_places_mean": places.iter().map(|(n, p)| json!({"query": n, "places": p})).collect::<Vec<_>>(),
    });
    let name = if dir.ends_with("index-minipile-train-bytes") {
        "compressed.json".to_string()
    } else {
        format!(
            "compressed-{}.json",
            dir.file_name().unwrap().to_string_lossy()
        )
    };
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("eval/results")
        .join(name);
    std::fs::write(&out, serde_json::to_string_pretty(&result).unwrap() + "\n").unwrap();
    println!("wrote {}", out.display());
}
