//! The tiny things the targets are built over: a byte-level BPE tokenizer of 262 tokens written as a
//! `tokenizer.json` (so nothing is fetched), generated token documents, and indexes built from them
//! by the library's own builder.

use std::path::{Path, PathBuf};

use infini_sidecar::corpus::{Content, InputDoc};
use infini_sidecar::index::build::{build, BuildOptions};
use infini_sidecar::index::format::NextTableSpec;
use infini_sidecar::index::TokenWidth;
use infini_sidecar::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// Id of `<|endoftext|>`, the tiny tokenizer's document end; ids below it are the 256 bytes.
pub const EOS: u32 = 256;
/// Merged tokens after `EOS`: ids 257.. in this order.
const MERGES: [(&str, &str); 5] = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r")];
pub const VOCAB: u64 = EOS as u64 + 1 + MERGES.len() as u64;

/// The printable stand-in of each byte in byte-level BPE vocabularies: printable Latin-1 bytes stand
/// for themselves, the others for 256, 257, ... in byte order.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut next = 256;
    (0u32..256)
        .map(|b| {
            let code = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(code).expect("a Latin or Latin Extended letter")
        })
        .collect()
}

/// The tokenizer's `tokenizer.json`: byte `b` is id `b`, then `<|endoftext|>`, then the merges.
pub fn tokenizer_json() -> String {
    let mut vocab = Map::new();
    for (id, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    vocab.insert("<|endoftext|>".into(), json!(EOS));
    for (i, (a, b)) in MERGES.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), json!(EOS as usize + 1 + i));
    }
    let merges: Vec<Value> = MERGES.iter().map(|(a, b)| json!([a, b])).collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": EOS, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": merges},
    })
    .to_string()
}

/// The tokenizer, loaded from its `tokenizer.json` written into `dir`.
pub fn tokenizer(dir: &Path) -> Tokenizer {
    let path = dir.join("tiny-tokenizer.json");
    std::fs::write(&path, tokenizer_json()).unwrap();
    let t = Tokenizer::from_file(&path).unwrap();
    assert_eq!((t.vocab_size(), t.eos_token_id()), (VOCAB, Some(EOS)));
    t
}

/// Ids that spell words of the tiny tokenizer (" the", "in", "er", a few letters), so generated
/// documents share many n-grams and decode to text.
pub const WORDS: [u32; 9] = [
    259,
    257,
    258,
    260,
    261,
    b'a' as u32,
    b'b' as u32,
    b' ' as u32,
    b'.' as u32,
];

/// `count` documents of 2..=9 tokens drawn from `alphabet` by a fixed linear congruential sequence.
pub fn documents(count: usize, alphabet: &[u32]) -> Vec<Vec<u32>> {
    let mut state = 0x2545_f491u32;
    (0..count)
        .map(|i| {
            (0..2 + i % 8)
                .map(|_| {
                    state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    alphabet[(state >> 16) as usize % alphabet.len()]
                })
                .collect()
        })
        .collect()
}

/// What an index is built from.
pub struct Spec<'a> {
    pub width: TokenWidth,
    pub eos: u32,
    pub vocab: u64,
    pub tokenizer: Option<&'a Tokenizer>,
    pub docs: Vec<Vec<u32>>,
    /// Tokens per shard, separators included: small enough for more than one shard.
    pub part_tokens: u64,
}

/// Builds `spec` at `dir/name`, every document with a metadata line, and returns the index folder.
pub fn build_index(dir: &Path, name: &str, spec: &Spec) -> PathBuf {
    let out = dir.join(name);
    let opts = BuildOptions {
        tokenizer: spec.tokenizer,
        max_part_tokens: Some(spec.part_tokens),
        threads: 1,
        // Down to prompts seen twice, so that even these tiny shards have next-token tables.
        next_table: Some(NextTableSpec {
            min_count: 2,
            ..NextTableSpec::default()
        }),
        ..BuildOptions::new(out.clone(), spec.width, spec.eos, spec.vocab)
    };
    let docs = spec.docs.iter().enumerate().map(|(i, d)| {
        Ok(InputDoc {
            content: Content::Tokens(d.clone()),
            metadata: Some(format!("{{\"doc\":{i}}}")),
            input_bytes: 0,
        })
    });
    build(docs, &opts).unwrap();
    out
}
