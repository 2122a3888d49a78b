//! Byte-level indexes: a token's marginalised probability against brute-force chain-rule products
//! over the bytes, the real tokenizers' spellings against the text they encode, and on real text the
//! chain rule across tokenizers (SmolLM2's tokens, Gemma-3's and single bytes give the same text the
//! same ∞-gram probability).

use std::path::Path;

use infini_sidecar::corpus::Content;
use infini_sidecar::index::build::BuildOptions;
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::{Index, OpenOptions, TokenWidth};
use infini_sidecar::tokenizer::{Spelling, Tokenizer, BYTE_EOS, BYTE_VOCAB_SIZE};
use proptest::prelude::*;

use crate::common;
use crate::common::oracle::Oracle;

/// A byte index over `docs` (at most `max_part_tokens` a part).
pub fn byte_index(dir: &Path, docs: &[String], max_part_tokens: Option<u64>) -> Index {
    let tokenizer = Tokenizer::utf8_bytes();
    let opts = BuildOptions {
        tokenizer: Some(&tokenizer),
        max_part_tokens,
        ..BuildOptions::new(dir.join("bytes"), TokenWidth::U8, BYTE_EOS, BYTE_VOCAB_SIZE)
    };
    common::index_of(docs, Content::Text, &opts)
}

pub fn ids(text: &[u8]) -> Vec<u32> {
    text.iter().map(|&b| u32::from(b)).collect()
}

/// P(spelling | context) as the chain rule over its bytes, each factor a brute-force ∞-gram
/// probability with the context grown by one byte.
pub fn chain_rule(oracle: &Oracle, context: &[u8], spelling: &Spelling) -> f64 {
    let factor = |ctx: &[u32], next: u32| {
        let n = oracle.suffix_len(ctx);
        let suffix = &ctx[ctx.len() - n..];
        let dist = oracle.ntd(suffix);
        dist.get(&next).copied().unwrap_or(0) as f64 / oracle.count(suffix) as f64
    };
    // A context's text starts after its last byte that UTF-8 never holds; a token spelling one
    // never occurs.
    let start = context
        .iter()
        .rposition(|&b| b >= 0xFE)
        .map_or(0, |i| i + 1);
    let mut ctx = ids(&context[start..]);
    match spelling {
        Spelling::Nothing => 0.0,
        Spelling::Bytes(bytes) if bytes.iter().any(|&b| b >= 0xFE) => 0.0,
        Spelling::EndOfText => factor(&ctx, oracle.eos),
        Spelling::Bytes(bytes) => {
            let mut p = 1.0;
            for &b in bytes.iter() {
                p *= factor(&ctx, u32::from(b));
                ctx.push(u32::from(b));
            }
            p
        }
    }
}

fn corpus_strategy() -> impl Strategy<Value = (Vec<String>, Vec<String>, Vec<String>)> {
    // A small alphabet with a two-byte character, so contexts and candidates repeat and cut characters.
    let text = || {
        proptest::collection::vec(prop::sample::select(vec!["a", "b", " ", "é", "\n"]), 0..40)
            .prop_map(|v| v.concat())
    };
    (
        proptest::collection::vec(text(), 1..6),
        proptest::collection::vec(text(), 1..8),
        proptest::collection::vec(text(), 1..12),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn marginal_token_probabilities_are_chain_rule_products(
        (docs, contexts, candidates) in corpus_strategy(),
        part_tokens in 90u64..300,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let index = byte_index(dir.path(), &docs, Some(part_tokens));
        prop_assert!(index.is_byte_level());
        let oracle = Oracle {
            docs: docs.iter().map(|d| ids(d.as_bytes())).collect(),
            eos: BYTE_EOS,
        };
        let mut spellings: Vec<Spelling> = candidates
            .iter()
            .filter(|c| !c.is_empty())
            .map(|c| Spelling::Bytes(c.as_bytes().into()))
            .collect();
        // Prefixes of one another, a cut character, the end of text, a control token.
        spellings.extend([
            Spelling::Bytes(b"a".as_slice().into()),
            Spelling::Bytes(b"ab".as_slice().into()),
            Spelling::Bytes(b"ab ".as_slice().into()),
            Spelling::Bytes([0xC3].as_slice().into()),
            Spelling::EndOfText,
            Spelling::Nothing,
            Spelling::Bytes([0xFF].as_slice().into()),
            Spelling::Bytes(b"a\xFE".as_slice().into()),
        ]);
        let refs: Vec<&Spelling> = spellings.iter().collect();
        let mut all_contexts: Vec<Vec<u8>> = contexts.iter().map(|c| c.as_bytes().to_vec()).collect();
        all_contexts.extend(docs.iter().map(|d| d.as_bytes()[..d.len() / 2].to_vec()));
        all_contexts.push(b"ab \xFFa".to_vec());
        all_contexts.push(b"\xFE".to_vec());
        for context in &all_contexts {
            let got = index.byte_context(context).unwrap().token_probs(&index, &refs);
            for (spelling, &p) in spellings.iter().zip(&got) {
                let want = chain_rule(&oracle, context, spelling);
                prop_assert!(
                    (p - want).abs() <= 1e-12 * want.max(1e-300),
                    "context {:?}, {:?}: {} vs brute force {}", String::from_utf8_lossy(context), spelling, p, want
                );
            }
        }
    }
}

#[test]
fn token_indexes_refuse_byte_contexts() {
    let dir = tempfile::tempdir().unwrap();
    let index = crate::common::server::build_index(dir.path());
    let index = Index::open(&index, &OpenOptions::default()).unwrap();
    assert!(!index.is_byte_level());
    let err = index.byte_context(b"abc").err().unwrap().to_string();
    assert!(err.contains("--bytes"), "{err}");
}

/// Text with what tokenizers treat specially: accents, CJK, an emoji (byte fallback in Gemma),
/// digits, runs of spaces, a tab and newlines.
fn tricky_text() -> String {
    format!(
        "{}\nCafé déjà vu — 東京 🦀 x=12345;\t  indented\n\nend",
        &common::brown_test_text()[..2000]
    )
}

pub fn gemma_tokenizer() -> Tokenizer {
    Tokenizer::from_file(&common::assets().join("gemma3/tokenizer.json")).unwrap()
}

#[test]
fn real_tokenizers_spell_back_the_text_they_encode() {
    let text = tricky_text();
    for tokenizer in [common::smollm2_tokenizer(), gemma_tokenizer()] {
        let ids = tokenizer.encode(&text).unwrap();
        let mut spelled = Vec::new();
        for &id in &ids {
            match tokenizer.spelling(id) {
                Spelling::Bytes(b) => spelled.extend_from_slice(b),
                other => panic!("{}: token {id} spelled {other:?}", tokenizer.source()),
            }
        }
        assert_eq!(
            String::from_utf8_lossy(&spelled),
            text,
            "{}",
            tokenizer.source()
        );
        assert_eq!(tokenizer.text_bytes(&ids), text.len());
        let eos = tokenizer.eos_token_id().unwrap();
        assert_eq!(*tokenizer.spelling(eos), Spelling::EndOfText);
    }
    // Gemma's BOS stands for no text.
    let gemma = gemma_tokenizer();
    let bos = gemma.encode("<bos>").unwrap();
    assert_eq!(bos.len(), 1);
    assert_eq!(*gemma.spelling(bos[0]), Spelling::Nothing);
}

/// On a byte index of real documents, a text's ∞-gram log-probability is the same whether it is
/// cut into SmolLM2's tokens, Gemma-3's or single bytes (each token's probability marginalised
/// over its bytes, each byte's the engine's `infgram_prob`): the chain rule, exact.
#[test]
fn the_chain_rule_holds_across_real_tokenizers() {
    let docs = common::minipile_texts("train", 40, "");
    let dir = tempfile::tempdir().unwrap();
    let index = byte_index(dir.path(), &docs, None);
    // A passage of an indexed document, so every factor is positive.
    let doc = docs.iter().find(|d| d.len() > 3000).unwrap();
    let start = doc
        .char_indices()
        .map(|(i, _)| i)
        .find(|&i| i >= 1000)
        .unwrap();
    let end = doc
        .char_indices()
        .map(|(i, _)| i)
        .find(|&i| i >= 1600)
        .unwrap();
    let text = &doc[start..end];

    let mut by_byte = 0.0;
    for i in 0..text.len() {
        let prompt = ids(&text.as_bytes()[..i]);
        let p = index
            .infgram_prob(&prompt, u32::from(text.as_bytes()[i]))
            .unwrap()
            .prob
            .prob;
        by_byte += p.ln();
    }
    assert!(by_byte.is_finite());
    for tokenizer in [common::smollm2_tokenizer(), gemma_tokenizer()] {
        let ids = tokenizer.encode(text).unwrap();
        let mut by_token = 0.0;
        for i in 0..ids.len() {
            let context = index.byte_context_of_tokens(&tokenizer, &ids[..i]).unwrap();
            let p = context.token_probs(&index, &[tokenizer.spelling(ids[i])])[0];
            by_token += p.ln();
        }
        assert!(
            (by_token - by_byte).abs() < 1e-9 * by_byte.abs(),
            "{}: {by_token} by token vs {by_byte} by byte",
            tokenizer.source()
        );
    }
}

/// The vocabulary in spelling order, one token a spelling, keeps every token the tokenizers cut
/// text into: Gemma-3 spells "A" twice (a token and the byte fallback `<0x41>`) and keeps the
/// token.
#[test]
fn spelling_order_keeps_the_tokens_text_is_cut_into() {
    let text = tricky_text();
    for tokenizer in [common::smollm2_tokenizer(), gemma_tokenizer()] {
        let order = tokenizer.spelling_order();
        let spelled = |id: u32| tokenizer.spelling(id).bytes();
        assert!(order.windows(2).all(|w| spelled(w[0]) < spelled(w[1])));
        let kept: std::collections::HashSet<u32> = order.iter().copied().collect();
        for id in tokenizer.encode(&text).unwrap() {
            assert!(kept.contains(&id), "{}: token {id}", tokenizer.source());
        }
    }
    let gemma = gemma_tokenizer();
    let a = gemma.encode("A").unwrap();
    let twins: Vec<u32> = (0..gemma.vocab_size() as u32)
        .filter(|&id| gemma.spelling(id).bytes() == b"A")
        .collect();
    assert_eq!(a.len(), 1);
    assert!(twins.len() >= 2 && twins.contains(&a[0]), "{twins:?}");
    let kept: Vec<u32> = twins
        .iter()
        .copied()
        .filter(|id| gemma.spelling_order().contains(id))
        .collect();
    assert_eq!(kept, a);
}
