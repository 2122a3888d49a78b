//! What the benchmarks share: real test-split text of the default assets, tokenized.

use std::path::Path;

use infini_sidecar::corpus::{expand_inputs, text_documents, Content};
use infini_sidecar::tokenizer::Tokenizer;

/// The first `count` mini-Pile test documents longer than `min_tokens`, tokenized; `assets` is the
/// folder holding `minipile/`.
pub fn test_documents(
    assets: &Path,
    tokenizer: &Tokenizer,
    min_tokens: usize,
    count: usize,
) -> Vec<Vec<u32>> {
    let files = expand_inputs(&[assets.join("minipile/test.jsonl")]).unwrap();
    text_documents(files)
        .filter_map(|d| match d.unwrap().content {
            Content::Text(t) => Some(tokenizer.encode(&t).unwrap()),
            Content::Tokens(_) => None,
        })
        .filter(|ids| ids.len() > min_tokens)
        .take(count)
        .collect()
}
