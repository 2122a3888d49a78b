//! Mixing a model with a byte-level index: the ∞-gram's distribution over the model's tokens against
//! the rule written in `evidence::bytes`, worked from brute-force chain-rule products; a document's
//! contexts read in one pass against fresh searches; the records of real text scored with SmolLM2
//! against a fresh marginalisation at each position from the same pass of the model; `Score` and
//! `Mix` over a served byte index against the library; and sessions, drafts and the live index over
//! a served byte index in the model's tokens, against fresh lookups and the indexed text.

use infini_sidecar::evidence::byte_source::whole_word_tokens;
use infini_sidecar::evidence::bytes::{decode_step, marginalise, BYTE_CANDIDATES};
use infini_sidecar::evidence::{document_records, mix_tokens};
use infini_sidecar::index::bytes::ByteText;
use infini_sidecar::mix::params::FitRecord;
use infini_sidecar::mix::{mix, LambdaRule, MixingParams, NeuralDistribution};
use infini_sidecar::model::{LoadOptions, Model, WindowOptions};
use infini_sidecar::server::config::ServeConfig;
use infini_sidecar::server::pb;
use infini_sidecar::server::SidecarService;
use infini_sidecar::tokenizer::{Spelling, Tokenizer, BYTE_EOS};
use proptest::prelude::*;

use super::byte_level::{byte_index, chain_rule, ids};
use crate::common;
use crate::common::oracle::Oracle;
use crate::common::server::{self, Running};

/// The first `n` bytes of `s`, or fewer, to a character's end.
fn cut(s: &str, n: usize) -> &str {
    let end = (0..=n.min(s.len()))
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    &s[..end]
}

/// The rule of `evidence::bytes` by brute force, from chain-rule products over a brute-force
/// ∞-gram: P∞ of every token after `context`, given the model's `candidates` and distribution.
fn the_rule(
    oracle: &Oracle,
    tokenizer: &Tokenizer,
    context: &[u8],
    candidates: &[u32],
    neural: &NeuralDistribution,
) -> Vec<f64> {
    let bytes = |id: u32| match tokenizer.spelling(id) {
        Spelling::Bytes(b) => Some(&b[..]),
        _ => None,
    };
    let roots: Vec<&[u8]> = candidates.iter().filter_map(|&t| bytes(t)).collect();
    // The tokens whose spelling starts with a candidate's and that can follow the context (SmolLM2
    // spells no two tokens alike).
    let walked: Vec<(u32, &[u8], f64)> = (0..tokenizer.vocab_size() as u32)
        .filter_map(|id| bytes(id).map(|b| (id, b)))
        .filter(|(_, b)| !b.is_empty() && b.iter().all(|&x| x < 0xFE))
        .filter(|(_, b)| roots.iter().any(|r| b.starts_with(r)))
        .map(|(id, b)| (id, b, chain_rule(oracle, context, tokenizer.spelling(id))))
        .filter(|&(_, _, m)| m > 0.0)
        .collect();
    let mut p = vec![0.0; tokenizer.vocab_size() as usize];
    for &(id, own, m) in &walked {
        // The event "the longest walked token the text starts with is this one".
        let longer: Vec<&(u32, &[u8], f64)> = walked
            .iter()
            .filter(|w| w.1.len() > own.len() && w.1.starts_with(own))
            .collect();
        let nearest = longer.iter().filter(|w| {
            !longer
                .iter()
                .any(|c| c.1.len() < w.1.len() && w.1.starts_with(c.1))
        });
        let event = m - nearest.map(|w| w.2).sum::<f64>();
        p[id as usize] += event;
    }
    for &t in candidates {
        if *tokenizer.spelling(t) == Spelling::EndOfText {
            p[t as usize] = chain_rule(oracle, context, &Spelling::EndOfText);
        }
    }
    let rest = 1.0 - p.iter().sum::<f64>();
    for (t, slot) in p.iter_mut().enumerate() {
        *slot += rest * neural.prob(t as u32);
    }
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// SmolLM2's real vocabulary over a small alphabet, the model's candidates the tokens spelled
    /// in it (and a few others): P∞ of every candidate is the rule's, of every other token its share
    /// of the model's, and P∞ sums to one over all 49,152 tokens.
    #[test]
    fn byte_distributions_follow_the_rule_and_sum_to_one(
        docs in proptest::collection::vec(
            proptest::collection::vec(prop::sample::select(vec!["a", "b", " ", "é", "\n"]), 0..40)
                .prop_map(|v| v.concat()),
            1..6,
        ),
        context in proptest::collection::vec(prop::sample::select(vec!["a", "b", " ", "é"]), 0..12)
            .prop_map(|v| v.concat()),
        seed in 0u64..1000,
        all_mass_on_candidates in any::<bool>(),
    ) {
        let tokenizer = common::smollm2_tokenizer();
        let dir = tempfile::tempdir().unwrap();
        let index = byte_index(dir.path(), &docs, None);
        let oracle = Oracle { docs: docs.iter().map(|d| ids(d.as_bytes())).collect(), eos: BYTE_EOS };
        // Candidates: the first 40 tokens spelled in the alphabet, with high and varied logits.
        let in_alphabet = |id: &u32| match tokenizer.spelling(*id) {
            Spelling::Bytes(b) => std::str::from_utf8(b)
                .is_ok_and(|s| s.chars().all(|c| "ab é\n".contains(c))),
            _ => false,
        };
        let vocab = tokenizer.vocab_size();
        let chosen: Vec<u32> = (0..vocab as u32).filter(in_alphabet).take(40).collect();
        let logits: Vec<f32> = (0..vocab as u32)
            .map(|id| {
                let noise = ((id as u64 * 2654435761 + seed * 97) % 1000) as f32 / 250.0;
                match (chosen.contains(&id), all_mass_on_candidates) {
                    (true, _) => 10.0 + noise,
                    (false, true) => f32::MIN,
                    (false, false) => noise - 2.0,
                }
            })
            .collect();
        let neural = NeuralDistribution::from_logits(&logits).unwrap();
        let mut candidates = chosen.clone();
        // Beside them a token outside the alphabet (a spelling the index never holds) and the end
        // of text.
        candidates.push(tokenizer.encode("xyz").unwrap()[0]);
        candidates.push(tokenizer.eos_token_id().unwrap());
        let context_bytes = context.as_bytes();
        let step = marginalise(&index, &tokenizer, &index.byte_context(context_bytes).unwrap(), &candidates);
        let want = the_rule(&oracle, &tokenizer, context_bytes, &candidates, &neural);
        let mut total = 0.0;
        for (t, &w) in want.iter().enumerate() {
            let got = step.dist.prob(t as u32, &neural);
            prop_assert!((got - w).abs() <= 1e-9, "token {t} ({:?}): {got} vs the rule's {w}", tokenizer.spelling(t as u32));
            total += got;
        }
        prop_assert!((total - 1.0).abs() < 1e-6, "P∞ sums to {}", total);
        prop_assert_eq!(step.sparse, want.iter().any(|&w| w >= 1.0 - 1e-9));
    }
}

/// A document's contexts read a token at a time ([`ByteText`]) are those a fresh search of each
/// prefix's text gives, across ends of text (first, and two in a row), a control token and a
/// byte-fallback character, with the same tokens counted inside the match; and so are they after
/// taking tokens back.
#[test]
fn contexts_read_in_one_pass_are_fresh_searches() {
    let docs = common::minipile_texts("train", 30, "");
    let dir = tempfile::tempdir().unwrap();
    let index = byte_index(dir.path(), &docs, Some(400_000));
    for tokenizer in [
        common::smollm2_tokenizer(),
        super::byte_level::gemma_tokenizer(),
    ] {
        let eos = tokenizer.eos_token_id().unwrap();
        // An end of text first, and two in a row: pieces of text with nothing in them.
        let mut tokens = vec![eos];
        tokens.extend(tokenizer.encode(cut(&docs[3], 1500)).unwrap());
        tokens.extend([eos, eos]);
        tokens.extend(
            tokenizer
                .encode(&format!("{} 🦀 東京", cut(&docs[7], 600)))
                .unwrap(),
        );
        let neural =
            NeuralDistribution::from_logits(&vec![0.0; tokenizer.vocab_size() as usize]).unwrap();
        let mut text = ByteText::new(&index).unwrap();
        for i in 0..tokens.len() {
            let fresh = index
                .byte_context_of_tokens(&tokenizer, &tokens[..i])
                .unwrap();
            let read = text.context();
            let step = decode_step(&index, &tokenizer, &tokens[..i], &neural).unwrap();
            assert_eq!(
                (read.suffix_len(), read.prompt_cnt(), text.matched_tokens()),
                (
                    fresh.suffix_len(),
                    fresh.prompt_cnt(),
                    step.matched_tokens()
                ),
                "{} at token {i}",
                tokenizer.source()
            );
            text.push(&index, &tokenizer, tokens[i]);
        }
        // Taken back to every length, across the ends of text, the text reads as it did.
        for keep in (0..tokens.len()).rev().step_by(37) {
            text.truncate(&index, keep);
            let fresh = index
                .byte_context_of_tokens(&tokenizer, &tokens[..keep])
                .unwrap();
            let read = text.context();
            assert_eq!(
                (read.suffix_len(), read.prompt_cnt()),
                (fresh.suffix_len(), fresh.prompt_cnt()),
                "{} kept {keep}",
                tokenizer.source()
            );
        }
    }
}

/// SmolLM2 scoring held-out text against a byte index of real documents: each record's P∞ is the
/// marginalisation, from the same pass of the model, over a fresh byte context of its prefix; the
/// ∞-gram is sure of most tokens of the indexed half and of few of the rest.
#[test]
fn smollm2_records_against_a_byte_index() {
    let docs = common::minipile_texts("train", 60, "");
    let dir = tempfile::tempdir().unwrap();
    let index = byte_index(dir.path(), &docs, None);
    let model = Model::load(&common::smollm2_gguf(), &LoadOptions::default()).unwrap();
    let tokenizer = model.tokenizer();
    // A passage that is half in the index (so long matches), half not.
    let indexed = cut(&docs[5], 400);
    let text = format!("{indexed}{}", cut(&common::brown_test_text(), 300));
    let tokens = tokenizer.encode(&text).unwrap();
    let records = document_records(&model, &index, WindowOptions::default(), 0, &tokens, |_| {})
        .unwrap()
        .tokens;
    assert_eq!(records.len(), tokens.len() - 1);
    let (_, fresh) = model
        .transformer()
        .score_document_with(
            &tokens,
            WindowOptions::default(),
            |_| {},
            |position, row| {
                let context = index
                    .byte_context_of_tokens(tokenizer, &tokens[..position])
                    .unwrap();
                let candidates: Vec<u32> = row
                    .top(BYTE_CANDIDATES)
                    .into_iter()
                    .map(|(t, _)| t)
                    .collect();
                let step = marginalise(&index, tokenizer, &context, &candidates);
                let token = tokens[position];
                (
                    step.dist.prob_beside(token, row.prob(token)),
                    context.suffix_len(),
                    step.sparse,
                )
            },
        )
        .unwrap();
    for (r, &(prob, suffix_len, sparse)) in records.iter().zip(&fresh) {
        assert_eq!(
            (r.infgram_prob, r.suffix_len, r.sparse),
            (prob, suffix_len, sparse),
            "position {}",
            r.position
        );
    }
    let mean = |rs: &[infini_sidecar::evidence::TokenRecord]| {
        rs.iter().map(|r| r.infgram_prob).sum::<f64>() / rs.len() as f64
    };
    let indexed_tokens = tokenizer.encode(indexed).unwrap().len();
    let (inside, outside) = records.split_at(indexed_tokens - 1);
    assert!(mean(&inside[20..]) > 0.8, "{}", mean(&inside[20..]));
    assert!(mean(outside) < mean(&inside[20..]) - 0.3);
}

/// A sidecar serving a byte index with SmolLM2: `Score` gives, token by token, the library's
/// records mixed under the file's λ1/λ2, and `Mix` the library's decoding step; a mixing file
/// fitted against a token index is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_index_serves_score_and_mix() {
    let docs = common::minipile_texts("train", 60, "");
    let dir = tempfile::tempdir().unwrap();
    let index = byte_index(dir.path(), &docs, None);
    let model = Model::load(&common::smollm2_gguf(), &LoadOptions::default()).unwrap();
    let mixing = |byte_level: bool| {
        let mut params = MixingParams::new(
            "test".into(),
            "test".into(),
            model.tokenizer().fingerprint().to_string(),
            (0.4, 0.05),
            None,
            FitRecord::default(),
        );
        params.byte_level = byte_level;
        let path = dir.path().join(format!("mixing-{byte_level}.json"));
        params.save(&path).unwrap();
        (path, params)
    };
    let (byte_file, params) = mixing(true);
    let config = ServeConfig {
        model: Some(common::smollm2_gguf()),
        mixing: Some(byte_file),
        ..server::config(dir.path(), index.dir().to_path_buf(), false)
    };
    let (token_file, _) = mixing(false);
    let refused = SidecarService::open(&ServeConfig {
        mixing: Some(token_file),
        ..config.clone()
    })
    .err()
    .unwrap()
    .to_string();
    assert!(refused.contains("byte-level"), "{refused}");
    let Running {
        mut client, stop, ..
    } = server::start(config).await;

    let texts = common::minipile_texts("test", 2, "");
    let scored: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| model.tokenizer().encode(cut(t, 1200)).unwrap())
        .collect();
    let request = pb::ScoreRequest {
        documents: scored
            .iter()
            .map(|ids| pb::ScoreDocument {
                token_ids: ids.clone(),
                domain: String::new(),
            })
            .collect(),
        lambda: Some(pb::score_request::Lambda::Split(true)),
        per_token: true,
    };
    let mut stream = client.score(request).await.unwrap().into_inner();
    let mut documents = Vec::new();
    while let Some(r) = stream.message().await.unwrap() {
        if let Some(pb::score_response::Item::Document(d)) = r.item {
            documents.push(d);
        }
    }
    assert_eq!(documents.len(), 2);
    for (d, ids) in documents.iter().zip(&scored) {
        let records = document_records(&model, &index, WindowOptions::default(), 0, ids, |_| {})
            .unwrap()
            .tokens;
        let mixed = mix_tokens(&records, LambdaRule::DomainSplit, Some(&params), None).unwrap();
        assert_eq!(d.token_scores.len(), records.len());
        for ((got, r), m) in d.token_scores.iter().zip(&records).zip(&mixed) {
            assert_eq!(
                (got.token, got.infgram_prob, got.mixed_logprob, got.lambda),
                (r.token, r.infgram_prob, m.logprob, m.lambda)
            );
        }
    }

    // Mix after a prefix of a scored document, with the sidecar's own model: the library's step.
    let context = &scored[0][..40];
    let mixed = client
        .mix(pb::MixRequest {
            context: context.to_vec(),
            neural: Some(pb::mix_request::Neural::OwnModel(true)),
            lambda: Some(pb::mix_request::Lambda::Split(true)),
            top_k: 5,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let transformer = model.transformer();
    let logits = transformer
        .forward_last(context, &mut transformer.new_cache())
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let neural = NeuralDistribution::from_logits(&logits).unwrap();
    let step = decode_step(&index, model.tokenizer(), context, &neural).unwrap();
    let (l1, l2) = params.split_for(None);
    let lambda = if step.sparse() { l1 } else { l2 };
    let want = mix(&step.distribution(), &neural, lambda, 5);
    assert_eq!(mixed.lambda, lambda);
    assert_eq!(
        (mixed.suffix_len as usize, mixed.sparse),
        (step.suffix_len(), step.sparse())
    );
    let got: Vec<(u32, f64)> = mixed.top.iter().map(|t| (t.token, t.prob)).collect();
    assert_eq!(got, want.top);
    assert!(
        step.suffix_len() > 20,
        "the document's prefix is in the index"
    );

    let _ = stop.send(());
}

/// The ∞-gram's top tokens and what it matched, as a `Mix` reply gives them.
fn mix_answer(m: &pb::MixResponse) -> (Vec<(u32, f64)>, u32, u64, bool) {
    let top = m.top.iter().map(|t| (t.token, t.prob)).collect();
    (top, m.suffix_len, m.prompt_cnt, m.sparse)
}

/// A sidecar serving a byte index with SmolLM2 follows sequences in the model's tokens:
/// - a session's mix after each append, a truncate and a truncate across an end of text is the
///   unary `Mix` of the same context (which looks its text up afresh), given the same logits;
/// - a draft from the index is the tokenizer's cut of the text that follows the context in its
///   document, and a session's state counts the matched bytes;
/// - the live index holds the model's tokens: text added to a namespace is drafted back in them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_drafts_and_live_documents_over_a_byte_index_are_in_the_models_tokens() {
    let docs = common::minipile_texts("train", 60, "");
    let dir = tempfile::tempdir().unwrap();
    let index = byte_index(dir.path(), &docs, None);
    let model = Model::load(&common::smollm2_gguf(), &LoadOptions::default()).unwrap();
    let tokenizer = model.tokenizer();
    let config = ServeConfig {
        model: Some(common::smollm2_gguf()),
        mixing: None,
        ..server::config(dir.path(), index.dir().to_path_buf(), false)
    };
    let Running {
        mut client, stop, ..
    } = server::start(config).await;
    // Indexed text (a document's head, to a word's end), an end of text, then held-out text.
    let doc = &docs[5];
    let head = &doc[..doc[..300].rfind(' ').unwrap()];
    let mut tokens = tokenizer.encode(head).unwrap();
    let eos_at = tokens.len();
    tokens.push(tokenizer.eos_token_id().unwrap());
    tokens.extend(
        tokenizer
            .encode(cut(&common::brown_test_text(), 200))
            .unwrap(),
    );
    let logits_after = |context: &[u32]| {
        let transformer = model.transformer();
        let logits = transformer
            .forward_last(context, &mut transformer.new_cache())
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        pb::NeuralLogits { logits }
    };
    let (tx, mut replies) = server::open_session(&mut client).await;
    let start = pb::session_request::Step::Start(pb::SessionStart {
        context: tokens[..3].to_vec(),
        ..Default::default()
    });
    let reply = server::step(&tx, &mut replies, start).await;
    assert!(reply.result.is_none() && reply.state.is_some(), "{reply:?}");
    let mut length = 3;
    // Each check: the session's mix, its state, and the unary Mix of the same context.
    let mut checked = Vec::new();
    let mut moves: Vec<usize> = (10..tokens.len()).step_by(9).collect();
    moves.extend([
        eos_at - 4,
        tokens.len(),
        eos_at + 3,
        eos_at - 7,
        tokens.len(),
    ]);
    for to in moves {
        let step = match to > length {
            true => pb::session_request::Step::Append(pb::SessionAppend {
                tokens: tokens[length..to].to_vec(),
            }),
            false => pb::session_request::Step::Truncate(pb::SessionTruncate { length: to as u64 }),
        };
        let reply = server::step(&tx, &mut replies, step).await;
        let (Some(state), None) = (reply.state.clone(), &reply.result) else {
            panic!("moving to {to}: {reply:?}");
        };
        length = to;
        let context = &tokens[..length];
        let logits = logits_after(context);
        let lambda = 0.3;
        let mix = pb::session_request::Step::Mix(pb::SessionMix {
            neural: Some(pb::session_mix::Neural::Logits(logits.clone())),
            lambda: Some(pb::session_mix::Lambda::FixedLambda(lambda)),
            top_k: 8,
            ..Default::default()
        });
        let reply = server::step(&tx, &mut replies, mix).await;
        let Some(pb::session_response::Result::Mix(in_session)) = reply.result else {
            panic!("mixing at {length}: {reply:?}");
        };
        let unary = client
            .mix(pb::MixRequest {
                context: context.to_vec(),
                neural: Some(pb::mix_request::Neural::Logits(logits)),
                lambda: Some(pb::mix_request::Lambda::FixedLambda(lambda)),
                top_k: 8,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            mix_answer(&in_session),
            mix_answer(&unary),
            "after {length} tokens"
        );
        assert_eq!(
            (state.suffix_len, state.prompt_cnt),
            (unary.suffix_len, unary.prompt_cnt)
        );
        checked.push((length, unary.suffix_len));
    }
    // The head is indexed: long byte matches before the end of text, none across it.
    let before_eos = checked.iter().filter(|&&(l, _)| l > 40 && l < eos_at);
    assert!(before_eos.clone().count() >= 3);
    assert!(
        before_eos
            .clone()
            .all(|&(l, len)| len as usize > 4 * (l - 20)),
        "{checked:?}"
    );

    // A draft from the index after the head: the model's tokens of what the document goes on with.
    let rest = &doc[head.len()..];
    let want = tokenizer.encode(cut(rest, 400)).unwrap();
    for depth in [1, 3, 10, 24] {
        let draft = client
            .draft(pb::DraftRequest {
                target: Some(pb::draft_request::Target::Context(pb::TokenIds {
                    ids: tokens[..eos_at].to_vec(),
                })),
                options: Some(pb::DraftOptions {
                    max_tokens: depth,
                    source: pb::DraftSource::Index as i32,
                    min_path_prob: Some(0.0),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(draft.token_ids, want[..depth as usize].to_vec());
        assert_eq!(draft.match_len as usize, eos_at);
    }

    // Text added to a live namespace comes back as the model's tokens.
    let added = cut(&docs[50], 400);
    client
        .add_documents(pb::AddDocumentsRequest {
            namespace: "notes".into(),
            request_id: String::new(),
            documents: vec![pb::LiveDocument {
                content: Some(pb::live_document::Content::Text(added.into())),
            }],
        })
        .await
        .unwrap();
    let ids = tokenizer.encode(added).unwrap();
    let draft = client
        .draft(pb::DraftRequest {
            target: Some(pb::draft_request::Target::Context(pb::TokenIds {
                ids: ids[..30].to_vec(),
            })),
            options: Some(pb::DraftOptions {
                max_tokens: 8,
                source: pb::DraftSource::Live as i32,
                min_path_prob: Some(0.0),
                ..Default::default()
            }),
            namespace: "notes".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(draft.token_ids, ids[30..38].to_vec());
    drop(tx);
    let _ = stop.send(());
}

/// What followed a match, cut short by a draft's byte budget anywhere (inside a word, inside a
/// character), gives the model's tokens of the whole text: a prefix of them, under SmolLM2's and
/// Gemma-3's tokenizers, and all but the last word's or so.
#[test]
fn drafted_text_cut_anywhere_gives_a_prefix_of_the_whole_texts_tokens() {
    let mut texts: Vec<String> = common::minipile_texts("train", 12, "")
        .iter()
        .map(|d| cut(d, 300).to_string())
        .collect();
    texts.push("  fn main() {\n        println!(\"東京 🦀 {}\", 1_000);\n    }\n".into());
    texts.push("Internationalization of unbelievably long words, 東京都庁舎の展望室".into());
    for tokenizer in [
        common::smollm2_tokenizer(),
        super::byte_level::gemma_tokenizer(),
    ] {
        for text in &texts {
            let whole = tokenizer.encode(text).unwrap();
            for n in 1..text.len() {
                let got = whole_word_tokens(&tokenizer, &text.as_bytes()[..n], true);
                assert_eq!(
                    got,
                    whole[..got.len()],
                    "{} cut at {n} of {text:?}",
                    tokenizer.source()
                );
                // All but the last word: the text up to the whitespace before it.
                let valid = match std::str::from_utf8(&text.as_bytes()[..n]) {
                    Ok(t) => t,
                    Err(e) => &text[..e.valid_up_to()],
                };
                let words = valid
                    .trim_end_matches(|c: char| !c.is_whitespace())
                    .trim_end();
                let spelled: usize = got.iter().map(|&t| tokenizer.spelling(t).byte_len()).sum();
                if !words.is_empty() {
                    assert_eq!(spelled, words.len(), "cut at {n} of {text:?}");
                }
            }
            let uncut = whole_word_tokens(&tokenizer, text.as_bytes(), false);
            assert_eq!(uncut, whole);
        }
    }
}
