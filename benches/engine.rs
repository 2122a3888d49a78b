//! Library-level benchmarks of the engine (`cargo bench --bench engine`): the hot paths on a generated
//! corpus, and count and next-token distributions per prompt length on a real index when one is given
//! (`INFINI_SIDECAR_BENCH_INDEX`, default: the default index under `INFINI_SIDECAR_ASSETS`). These are the
//! engine's own costs, without the JSON of the CLI; the side-by-side comparisons with the reference
//! engine and tokengrams are `eval/bench_engine.py` (results in eval/ENGINE.md).

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use infini_sidecar::corpus::{Content, InputDoc};
use infini_sidecar::index::build::{build, BuildOptions};
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::{Index, OpenOptions, TokenWidth};

/// A Zipf-like token stream: frequent tokens repeat, so matches have realistic lengths.
fn corpus(docs: usize, len: usize) -> Vec<Vec<u32>> {
    let mut state = 7u64;
    (0..docs)
        .map(|_| {
            (0..len)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let u = ((state >> 11) as f64 / (1u64 << 53) as f64).max(1e-12);
                    ((1.0 / u) as u32).min(30_000) + 1
                })
                .collect()
        })
        .collect()
}

fn engine(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("idx");
    let docs = corpus(2000, 1000);
    let opts = BuildOptions::new(out.clone(), TokenWidth::U16, 0, 49152);
    build(
        docs.iter().map(|d| {
            Ok(InputDoc {
                content: Content::Tokens(d.clone()),
                metadata: None,
                input_bytes: 0,
            })
        }),
        &opts,
    )
    .unwrap();
    let index = Index::open(&out, &OpenOptions::default()).unwrap();
    let query = &docs[17][100..104];
    let long_prompt = &docs[3][0..500];
    let window = &docs[42][..1000];
    c.bench_function("count 4-gram", |b| b.iter(|| index.count(query).unwrap()));
    c.bench_function("ntd 2-gram exact", |b| {
        b.iter(|| index.ntd(&query[..2], None).unwrap())
    });
    c.bench_function("infgram_prob 500-token prompt", |b| {
        b.iter(|| index.infgram_prob(long_prompt, 5).unwrap())
    });
    c.bench_function("score 1000 tokens", |b| {
        b.iter(|| index.score(window).unwrap())
    });
}

/// The real index to measure, if there is one.
fn real_index() -> Option<PathBuf> {
    let dir = std::env::var_os("INFINI_SIDECAR_BENCH_INDEX")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("INFINI_SIDECAR_ASSETS")
                .map(|a| PathBuf::from(a).join("index-minipile-train-decon-smollm2"))
        })?;
    dir.is_dir().then_some(dir)
}

/// `count` prompts of `len` tokens taken at random places of the index's own documents, so they occur
/// and frequent tokens are drawn as often as text has them.
fn prompts_from(index: &Index, len: usize, count: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut state = seed;
    let mut next = move |bound: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % bound
    };
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let doc = index
            .get_document(next(index.total_documents()))
            .expect("document");
        if doc.token_ids.len() > len {
            let at = next((doc.token_ids.len() - len) as u64) as usize;
            out.push(doc.token_ids[at..at + len].to_vec());
        }
    }
    out
}

/// Mean time per call over a fixed set of prompts per length (1 to 8 tokens), on the real index.
fn real(c: &mut Criterion) {
    let Some(dir) = real_index() else {
        eprintln!(
            "no real index (set INFINI_SIDECAR_BENCH_INDEX): skipping the real-index benchmarks"
        );
        return;
    };
    let index = Index::open(&dir, &OpenOptions::default()).unwrap();
    index.warm_up();
    const PER_LENGTH: usize = 100;
    let mut group = c.benchmark_group("real index, 100 prompts per call");
    group.sample_size(10);
    for len in [1usize, 2, 3, 5, 8] {
        let prompts = prompts_from(&index, len, PER_LENGTH, len as u64);
        group.bench_with_input(BenchmarkId::new("ntd", len), &prompts, |b, ps| {
            b.iter(|| {
                for p in ps {
                    index.ntd(p, None).unwrap();
                }
            })
        });
        group.bench_with_input(BenchmarkId::new("count", len), &prompts, |b, ps| {
            b.iter(|| {
                for p in ps {
                    index.count(p).unwrap();
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, engine, real);
criterion_main!(benches);
