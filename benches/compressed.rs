//! The compressed index against the suffix-array index of the same text (`cargo bench --bench
//! compressed`): both built from the same documents on one thread, one after the other (text per
//! second per core), their sizes (bytes per token of text: per byte at byte level), the latency of count,
//! of the ∞-gram distribution and of document search on mini-Pile test text, in one run. The index is the byte-level
//! mini-Pile train index unless `INFINI_SIDECAR_BENCH_INDEX` names another; with
//! `INFINI_SIDECAR_BENCH_COMPRESSED` naming a compressed index of the same text, nothing is built
//! and that one is measured (the multi-gigabyte run of `eval/run_scale.sh`). Writes
//! `eval/results/compressed.json`.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use infini_sidecar::corpus::{Content, InputDoc};
use infini_sidecar::index::build::{build, BuildOptions};
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::docs::SearchOptions;
use infini_sidecar::index::fm::{CompressedIndex, DEFAULT_SAMPLE_EVERY};
use infini_sidecar::index::{Index, OpenOptions};
use serde_json::json;

/// Queries of each kind: enough for a stable mean, few enough for a short run.
const QUERIES: usize = 400;
/// Most places of a document search the service lets a compressed index visit by default
/// (`max_search_places` / 1,024): the searches measured.
const SERVED_PLACES: u64 = 4_000_000 / 1024;

/// Mean microseconds of `f` over `items`.
/// Mean microseconds of `f` over `items`: after one untimed pass over them (warm), unless
/// `INFINI_SIDECAR_BENCH_COLD` is set (the page cache dropped before the run: cold).
fn mean_us<T>(items: &[T], mut f: impl FnMut(&T)) -> f64 {
    if std::env::var_os("INFINI_SIDECAR_BENCH_COLD").is_none() {
        items.iter().for_each(&mut f);
    }
    let t = Instant::now();
    items.iter().for_each(&mut f);
    t.elapsed().as_secs_f64() * 1e6 / items.len() as f64
}

/// Builds, one thread each, from the source index's documents: the suffix-array index, its
/// compressed form (`index compress`) and the compressed index built directly (`index build
/// --compressed`); their seconds and the suffix-array and compressed indexes.
fn build_all(source: &Index, work: &std::path::Path) -> (Index, CompressedIndex, [f64; 3]) {
    let docs: Vec<Vec<u32>> = source.documents().collect();
    // Metadata lines too: both indexes keep them, and the compressed size counts them.
    let metadata: Vec<Option<String>> = (0..source.total_documents())
        .map(|d| source.get_document(d).unwrap().metadata)
        .collect();
    let input = || {
        docs.iter().zip(&metadata).map(|(d, m)| {
            Ok(InputDoc {
                content: Content::Tokens(d.clone()),
                metadata: m.clone(),
                input_bytes: 0,
            })
        })
    };
    let opts = |out: &str| BuildOptions {
        threads: 1,
        ..BuildOptions::new(
            work.join(out),
            source.width(),
            source.eos_token_id(),
            source.vocab_size(),
        )
    };
    let t = Instant::now();
    build(input(), &opts("sa")).unwrap();
    let sa_seconds = t.elapsed().as_secs_f64();
    let sa = Index::open(&work.join("sa"), &OpenOptions::default()).unwrap();
    let t = Instant::now();
    let sampling = (DEFAULT_SAMPLE_EVERY, 1);
    let fm = CompressedIndex::build(&sa, &work.join("fm"), sampling, |_| {}).unwrap();
    let compress_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let direct = BuildOptions {
        compressed: Some(DEFAULT_SAMPLE_EVERY),
        ..opts("direct")
    };
    build(input(), &direct).unwrap();
    let direct_seconds = t.elapsed().as_secs_f64();
    (sa, fm, [sa_seconds, compress_seconds, direct_seconds])
}

fn main() {
    let dir = std::env::var_os("INFINI_SIDECAR_BENCH_INDEX")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::assets().join("index-minipile-train-bytes"));
    let t = Instant::now();
    let source = Index::open(&dir, &OpenOptions::default()).unwrap();
    let mut open_seconds = [t.elapsed().as_secs_f64(), 0.0];
    let text_tokens = source.total_tokens() - source.total_documents();
    let work = tempfile::tempdir().unwrap();
    let tokenizer = source.tokenizer().cloned().unwrap();
    // A compressed index of the same text built beforehand (a multi-gigabyte one) is measured
    // beside the source index, with no builds.
    let (sa, fm, seconds) = match std::env::var_os("INFINI_SIDECAR_BENCH_COMPRESSED") {
        Some(fm) => {
            let t = Instant::now();
            let fm = CompressedIndex::open(&PathBuf::from(fm)).unwrap();
            open_seconds[1] = t.elapsed().as_secs_f64();
            (source, fm, None)
        }
        None => {
            let (sa, fm, seconds) = build_all(&source, work.path());
            (sa, fm, Some(seconds))
        }
    };
    let (sa_info, fm_info) = (sa.info(), fm.info().unwrap());
    let width = sa.width().bytes() as f64;
    let text_mb = text_tokens as f64 * width / 1e6;

    // Prompts from test text: n-grams of 4 and 16 tokens for count, 64-token contexts for the
    // ∞-gram, at spread positions.
    let test = common::test_documents(&common::assets(), &tokenizer, 128, 200);
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
    // 1,000 tokens), over the n-grams a served compressed index answers: those the suffix array
    // does not subsample, with at most `SERVED_PLACES` places.
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
                let served = !found.approx && found.cnt <= SERVED_PLACES;
                visited += if served { found.cnt } else { 0 };
                served
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

    // Locating: the places of the 16-grams (at most `SERVED_PLACES` each), per place.
    let (mut located, t) = (0usize, Instant::now());
    for q in &long {
        located += fm.positions(q, SERVED_PLACES as usize).unwrap().len();
    }
    let locate_us = t.elapsed().as_secs_f64() * 1e6 / located.max(1) as f64;

    println!(
        "{}: {} documents, {:.1} MB of text ({} tokens of {} bytes)",
        dir.display(),
        sa.total_documents(),
        text_mb,
        text_tokens,
        width
    );
    if let Some([sa_s, compress_s, direct_s]) = seconds {
        println!(
            "build, one thread: suffix array {sa_s:.1} s ({:.2} MB/s), then compressed {compress_s:.1} s \
             ({:.2} MB/s; both {:.2} MB/s); compressed directly {direct_s:.1} s ({:.2} MB/s)",
            text_mb / sa_s,
            text_mb / compress_s,
            text_mb / (sa_s + compress_s),
            text_mb / direct_s
        );
    }
    // Per token of text (separators left out): per byte of UTF-8 at byte level.
    let per_text = |bytes: u64| bytes as f64 / text_tokens as f64;
    println!(
        "size: suffix array {:.1} MB ({:.3} bytes per token of text), compressed {:.1} MB ({:.3})",
        sa_info.bytes as f64 / 1e6,
        per_text(sa_info.bytes),
        fm_info.bytes as f64 / 1e6,
        per_text(fm_info.bytes)
    );
    println!(
        "open: suffix array {:.2} s, compressed {:.2} s (it reads its files whole)",
        open_seconds[0], open_seconds[1]
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
    println!(
        "locate: {locate_us:.2} µs a place ({located} places of 16-grams, sampled every {})",
        fm_info.sample_every
    );
    let result = json!({
            "cpu": infini_sidecar::cpu::CpuInfo::detect().summary(),
            "index": dir.display().to_string(),
            "documents": sa.total_documents(),
            "text_tokens": text_tokens,
            "token_bytes": width,
            "build_seconds_one_thread": seconds.map(|[sa, compress, direct]| json!({"suffix_array": sa, "compress": compress, "compressed_directly": direct})),
            "build_mb_per_s_one_thread": seconds.map(|[sa, compress, direct]| json!({"suffix_array": text_mb / sa, "compress": text_mb / compress, "suffix_array_then_compress": text_mb / (sa + compress), "compressed_directly": text_mb / direct})),
            "locate_us_per_place": locate_us,
            "sample_every": fm_info.sample_every,
            "cold": std::env::var_os("INFINI_SIDECAR_BENCH_COLD").is_some(),
            "open_seconds": {"suffix_array": open_seconds[0], "compressed": open_seconds[1]},
            "bytes": {"suffix_array": sa_info.bytes, "compressed": fm_info.bytes},
            "bytes_per_text_token": {"suffix_array": per_text(sa_info.bytes), "compressed": per_text(fm_info.bytes)},
            "compressed_parts_per_text_token": fm_info.bytes_by_component.iter().map(|(p, b)| (p.clone(), json!(per_text(*b)))).collect::<serde_json::Map<_, _>>(),
            "latency_us": rows.iter().map(|(n, s, f)| json!({"query": n, "suffix_array": s, "compressed": f})).collect::<Vec<_>>(),
            "document_search_places_mean": places.iter().map(|(n, p)| json!({"query": n, "places": p})).collect::<Vec<_>>(),
    });
    // Named by INFINI_SIDECAR_BENCH_LABEL when given (`eval/run_scale.sh`), else by the index.
    let name = match std::env::var("INFINI_SIDECAR_BENCH_LABEL") {
        Ok(label) => format!("compressed-{label}.json"),
        Err(_) if dir.ends_with("index-minipile-train-bytes") && seconds.is_some() => {
            "compressed.json".to_string()
        }
        Err(_) => format!(
            "compressed-{}.json",
            dir.file_name().unwrap().to_string_lossy()
        ),
    };
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("eval/results")
        .join(name);
    std::fs::write(&out, serde_json::to_string_pretty(&result).unwrap() + "\n").unwrap();
    println!("wrote {}", out.display());
}
