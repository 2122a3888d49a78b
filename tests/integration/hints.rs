//! ∞-gram hints for training against brute force, over corpora that hold the training sequences
//! themselves (the n-gram profile of every position counted, the plateau found, the kept counts
//! worked from brute-force next-token counts), and on real text: SmolLM2's tokens of an indexed document
//! hint their own continuation without the regulariser and other documents' with it.

use std::collections::BTreeMap;

use infini_sidecar::index::hints::HintOptions;
use proptest::prelude::*;

use crate::common;
use crate::common::oracle::Oracle;

/// The brute-force hint after `ctx`: (suffix length, excluded count, kept next-token counts).
fn brute_force(
    oracle: &Oracle,
    ctx: &[u32],
    regularise: bool,
    min_plateau: usize,
) -> (usize, u64, BTreeMap<u32, u64>) {
    let end = ctx.len();
    let count = |n: usize| oracle.count(&ctx[end - n..]);
    let longest = oracle.suffix_len(ctx);
    let bottom = (1..=longest).find(|&n| count(n) == count(longest));
    match bottom {
        // Its occurrences less the plateau's (those of the a-gram), by brute-force counts.
        Some(a) if regularise && longest + 1 - a >= min_plateau => {
            let m = a - 1;
            let mut dist = oracle.ntd(&ctx[end - m..]);
            for (token, n) in oracle.ntd(&ctx[end - a..]) {
                if let Some(kept) = dist.get_mut(&token) {
                    *kept -= n;
                }
            }
            dist.retain(|_, n| *n > 0);
            (m, count(a), dist)
        }
        _ => (longest, 0, oracle.ntd(&ctx[end - longest..])),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn hints_match_brute_force_over_corpora_holding_the_sequence(
        mut docs in proptest::collection::vec(proptest::collection::vec(1u32..4, 0..30), 1..5),
        seq in proptest::collection::vec(1u32..5, 1..40),
        copies in 0usize..3,
        min_plateau in 2usize..7,
        regularise: bool,
        seed: u64,
        part_tokens in 45u64..200,
    ) {
        // The training sequence is in the datastore, once or twice (a duplicate), or not at all
        // (its 4s never occur then: the match breaks and restarts).
        for _ in 0..copies {
            docs.push(seq.clone());
        }
        let dir = tempfile::tempdir().unwrap();
        let index = common::small_index(dir.path(), &docs, part_tokens);
        let oracle = Oracle { docs: docs.clone(), eos: 0 };
        let exact = HintOptions { samples: 8, exact: true, regularise, min_plateau, seed };
        let (hints, cost) = index.hints(&seq, &exact).unwrap();
        prop_assert_eq!(hints.len(), seq.len());
        prop_assert_eq!(cost.positions, seq.len() as u64);
        let sampled = HintOptions { exact: false, ..exact };
        let (samples, _) = index.hints(&seq, &sampled).unwrap();
        prop_assert_eq!(&index.hints(&seq, &sampled).unwrap().0, &samples, "samples are reproducible");
        for (end, (hint, drawn)) in (1..).zip(hints.iter().zip(&samples)) {
            let (len, excluded, dist) = brute_force(&oracle, &seq[..end], regularise, min_plateau);
            prop_assert_eq!((hint.suffix_len, hint.excluded), (len, excluded), "position {}", end);
            prop_assert_eq!(hint.count, dist.values().sum::<u64>());
            let mut top: Vec<(u32, u64)> = dist.clone().into_iter().collect();
            top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            top.truncate(8);
            let got: Vec<(u32, u64)> = hint.tokens.iter().copied().zip(hint.counts.iter().copied()).collect();
            prop_assert_eq!(got, top, "position {}", end);
            prop_assert_eq!((drawn.suffix_len, drawn.excluded), (len, excluded));
            prop_assert_eq!(drawn.tokens.len(), 8);
            prop_assert!(drawn.tokens.iter().all(|t| dist.contains_key(t)), "position {}: {:?} from {:?}", end, drawn.tokens, dist);
        }
    }
}

/// A document's own tokens, asked of an index that holds it: without the regulariser the match runs
/// back through the whole sequence and the hint is its own next token; with it the copy is excluded
/// and the hint comes from shorter suffixes found in other documents. (Prose: a document that
/// repeats a passage of itself puts a short top plateau over a long one, which the rule keeps; see
/// `index::hints`.)
#[test]
fn the_regulariser_removes_a_training_sequences_own_copy() {
    let texts = common::minipile_texts("train", 200, "brown");
    let dir = tempfile::tempdir().unwrap();
    let index = common::smollm2_index_of(dir.path(), &texts);
    let (doc_ix, head) = common::long_document_head(&texts);
    let tokenizer = common::smollm2_tokenizer();
    let ids = tokenizer.encode(head).unwrap();
    // The head cut alone may end in a token the document cuts otherwise.
    let seq = &ids[..ids.len() - 2];
    let exact = |regularise| HintOptions {
        samples: 5,
        exact: true,
        regularise,
        ..HintOptions::default()
    };
    let (off, _) = index.hints(seq, &exact(false)).unwrap();
    for end in 21..seq.len() {
        let hint = &off[end - 1];
        assert_eq!(hint.suffix_len, end, "the whole sequence so far matches");
        assert_eq!(hint.tokens[0], seq[end], "and predicts its own next token");
    }
    let (on, cost) = index.hints(seq, &exact(true)).unwrap();
    let deep = &on[20..];
    assert!(
        deep.iter().all(|h| h.count >= 1 && h.suffix_len < 20),
        "{deep:?}"
    );
    // What is excluded is the copy: the occurrences of the whole sequence so far.
    for (end, hint) in (21..).zip(deep) {
        assert_eq!(hint.excluded, index.count(&seq[..end]).unwrap());
    }
    // The hint's suffix is found elsewhere: in other documents at nearly every position (a rare
    // word the document repeats is found only in it), and an empty suffix is every other position.
    let elsewhere = (21..)
        .zip(deep)
        .filter(|&(end, hint)| {
            let suffix = &seq[end - hint.suffix_len..end];
            let opts = infini_sidecar::index::docs::SearchOptions {
                maxnum: 10,
                ..Default::default()
            };
            suffix.is_empty()
                || index
                    .search_docs(suffix, opts)
                    .unwrap()
                    .documents
                    .iter()
                    .any(|d| d.doc_ix != doc_ix as u64)
        })
        .count();
    assert!(
        elsewhere as f64 >= 0.9 * deep.len() as f64,
        "{elsewhere} of {}",
        deep.len()
    );
    // Left to right, a position costs a few searches; afresh it would cost two binary searches.
    let per = |n: u64| n as f64 / cost.positions as f64;
    assert!(per(cost.searches) < 4.0, "{cost:?}");
    assert!(
        per(cost.fresh_searches) > 2.0 * per(cost.searches),
        "{cost:?}"
    );
}
