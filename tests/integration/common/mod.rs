//! Shared helpers of the integration tests: the real assets fetched by `scripts/fetch_assets.py`.
#![allow(dead_code)]

pub mod chaos;
pub mod netns;
pub mod oracle;
pub mod server;

use std::path::PathBuf;

use infini_sidecar::corpus::{expand_inputs, text_documents, InputDoc};
use infini_sidecar::tokenizer::Tokenizer;

/// The assets folder: `$INFINI_SIDECAR_ASSETS`, else `~/.cache/infini-sidecar/assets`.
pub fn assets() -> PathBuf {
    let dir = std::env::var_os("INFINI_SIDECAR_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/infini-sidecar/assets")
        });
    assert!(
        dir.join("minipile/train.jsonl").exists(),
        "{}: assets missing; run python3 scripts/fetch_assets.py",
        dir.display()
    );
    dir
}

pub fn smollm2_gguf() -> PathBuf {
    assets().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

pub fn smollm2_tokenizer() -> Tokenizer {
    Tokenizer::from_file(&smollm2_gguf()).expect("SmolLM2 tokenizer")
}

/// The first `n` documents of a mini-Pile split.
pub fn minipile_docs(split: &str, n: usize) -> Vec<InputDoc> {
    let files = expand_inputs(&[assets().join(format!("minipile/{split}.jsonl"))]).unwrap();
    text_documents(files).take(n).map(|d| d.unwrap()).collect()
}

/// The texts of the first `n` documents of a mini-Pile split whose metadata holds `domain` (any
/// domain for "").
pub fn minipile_texts(split: &str, n: usize, domain: &str) -> Vec<String> {
    let tag = format!("\"{domain}\"");
    minipile_docs(split, usize::MAX)
        .into_iter()
        .filter(|d| domain.is_empty() || d.metadata.as_deref().is_some_and(|m| m.contains(&tag)))
        .filter_map(|d| match d.content {
            infini_sidecar::corpus::Content::Text(t) => Some(t),
            infini_sidecar::corpus::Content::Tokens(_) => None,
        })
        .take(n)
        .collect()
}

/// An index over `docs` (token ids, or texts with `opts.tokenizer`), opened.
pub fn index_of<T: Clone>(
    docs: &[T],
    content: impl Fn(T) -> infini_sidecar::corpus::Content,
    opts: &infini_sidecar::index::build::BuildOptions,
) -> infini_sidecar::index::Index {
    let input = docs.iter().map(|d| {
        Ok(InputDoc {
            content: content(d.clone()),
            metadata: None,
            input_bytes: 0,
        })
    });
    infini_sidecar::index::build::build(input, opts).unwrap();
    infini_sidecar::index::Index::open(&opts.out, &Default::default()).unwrap()
}

/// An index in `dir` of generated token documents (ids below 8, eos 0), in shards of at most
/// `part_tokens`: the brute-force property tests' corpus.
pub fn small_index(
    dir: &std::path::Path,
    docs: &[Vec<u32>],
    part_tokens: u64,
) -> infini_sidecar::index::Index {
    let opts = infini_sidecar::index::build::BuildOptions {
        max_part_tokens: Some(part_tokens),
        ..infini_sidecar::index::build::BuildOptions::new(
            dir.join("idx"),
            infini_sidecar::index::TokenWidth::U16,
            0,
            8,
        )
    };
    index_of(docs, infini_sidecar::corpus::Content::Tokens, &opts)
}

/// Pieces `(document, from, length)` of `docs`, each followed by `noise`: a text that matches the
/// documents in parts.
pub fn pieces_of(docs: &[Vec<u32>], pieces: &[(usize, usize, usize)], noise: &[u32]) -> Vec<u32> {
    let mut ids = Vec::new();
    for &(d, from, len) in pieces {
        let doc = &docs[d % docs.len()];
        let from = from.min(doc.len());
        ids.extend_from_slice(&doc[from..(from + len).min(doc.len())]);
        ids.extend_from_slice(noise);
    }
    ids
}

/// An index of `texts` cut into SmolLM2's tokens, in `dir`.
pub fn smollm2_index_of(dir: &std::path::Path, texts: &[String]) -> infini_sidecar::index::Index {
    let tokenizer = smollm2_tokenizer();
    let opts = infini_sidecar::index::build::BuildOptions {
        tokenizer: Some(&tokenizer),
        ..infini_sidecar::index::build::BuildOptions::new(
            dir.join("idx"),
            infini_sidecar::index::TokenWidth::U16,
            tokenizer.eos_token_id().unwrap(),
            tokenizer.vocab_size(),
        )
    };
    index_of(texts, infini_sidecar::corpus::Content::Text, &opts)
}

/// The first of `texts` over 2,000 bytes, and its first 1,500 bytes or so (to a character's end).
pub fn long_document_head(texts: &[String]) -> (usize, &str) {
    let (ix, text) = texts
        .iter()
        .enumerate()
        .find(|(_, t)| t.len() > 2000)
        .unwrap();
    let cut = (1500..).find(|&i| text.is_char_boundary(i)).unwrap();
    (ix, &text[..cut])
}

/// The first Brown document of the mini-Pile test split.
pub fn brown_test_text() -> String {
    minipile_docs("test", 1000)
        .into_iter()
        .find(|d| {
            d.metadata
                .as_deref()
                .unwrap_or_default()
                .contains("\"brown\"")
        })
        .map(|d| match d.content {
            infini_sidecar::corpus::Content::Text(t) => t,
            infini_sidecar::corpus::Content::Tokens(_) => unreachable!(),
        })
        .expect("a Brown test document")
}
