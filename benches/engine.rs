//! Micro-benchmarks of the engine's hot paths on a generated corpus (`cargo bench`). The side-by-side
//! comparison with the reference engine on real data is `eval/bench_engine.py` (results in eval/ENGINE.md).

use criterion::{criterion_group, criterion_main, Criterion};
use infini_sidecar::corpus::{Content, InputDoc};
use infini_sidecar::index::build::{build, BuildOptions};
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

criterion_group!(benches, engine);
criterion_main!(benches);
