//! Drafting on a real index (200 mini-Pile documents, SmolLM2 tokenizer): what the index source
//! reads after a matched suffix equals a brute-force scan of the documents, and drafts, chains and
//! trees alike, are valid trees of in-vocabulary ids, at every position of real test text.

use crate::common;
use std::sync::Arc;

use common::server::build_index;
use infini_sidecar::corpus::Content;
use infini_sidecar::decoding::Sequence;
use infini_sidecar::draft::calibration::Calibration;
use infini_sidecar::draft::{DraftOptions, DraftSource, DraftTree, Origin};
use infini_sidecar::index::suffix::SuffixMatch;
use infini_sidecar::index::{Index, OpenOptions};

fn texts(split: &str, n: usize) -> Vec<Vec<u32>> {
    let tokenizer = common::smollm2_tokenizer();
    common::minipile_docs(split, n)
        .iter()
        .map(|d| match &d.content {
            Content::Text(t) => tokenizer.encode(t).unwrap(),
            Content::Tokens(_) => unreachable!(),
        })
        .collect()
}

/// Every occurrence of `suffix` in the documents, with up to `depth` following tokens.
fn brute_force(docs: &[Vec<u32>], suffix: &[u32], depth: usize) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for d in docs {
        for start in 0..d.len().saturating_sub(suffix.len() - 1) {
            if d[start..start + suffix.len()] == *suffix {
                let from = start + suffix.len();
                out.push(d[from..(from + depth).min(d.len())].to_vec());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn index_continuations_equal_a_brute_force_scan() {
    let dir = tempfile::tempdir().unwrap();
    let index = Index::open(&build_index(dir.path()), &OpenOptions::default()).unwrap();
    let corpus = texts("train", 200);
    let eos = index.eos_token_id();
    let mut checked = 0;
    for doc in texts("test", 5) {
        for i in 0..doc.len().min(400) {
            let m = SuffixMatch::of(&index, &doc[..=i]).unwrap();
            let count = m.prompt_cnt();
            if m.suffix_len() == 0 || count > 50 {
                continue;
            }
            let suffix = &doc[i + 1 - m.suffix_len()..=i];
            let mut got = m.continuations(&index, 64, 6);
            got.sort();
            // Documents end with eos in the index; the scan stops there too.
            let want: Vec<Vec<u32>> = brute_force(&corpus, suffix, 6)
                .into_iter()
                .map(|c| c.into_iter().take_while(|&t| t != eos).collect())
                .collect();
            assert_eq!(got, want, "suffix {suffix:?}");
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} suffixes checked");
}

#[test]
fn drafts_are_valid_trees_of_vocabulary_ids() {
    let dir = tempfile::tempdir().unwrap();
    let index = Arc::new(Index::open(&build_index(dir.path()), &OpenOptions::default()).unwrap());
    let vocab = index.vocab_size();
    let mut nonempty = 0;
    for doc in texts("test", 4) {
        let mut seq = Sequence::new(index.clone(), doc[..1].to_vec()).unwrap();
        for i in 1..doc.len().min(300) {
            seq.append(&doc[i..=i]).unwrap();
            for (tree, source) in [
                (false, DraftSource::All),
                (true, DraftSource::Index),
                (true, DraftSource::Prompt),
            ] {
                let opts = DraftOptions {
                    tree,
                    tree_budget: 24,
                    source,
                    min_token_prob: 0.05,
                    ..DraftOptions::default()
                };
                let draft = seq.draft(&opts).unwrap();
                draft.validate(vocab).unwrap();
                assert!(draft.len() <= if tree { 24 } else { opts.max_tokens });
                if !tree {
                    assert!(draft
                        .parents
                        .iter()
                        .enumerate()
                        .all(|(i, &p)| p == i as i32 - 1));
                    assert_eq!(draft.chain(), draft.token_ids);
                }
                nonempty += usize::from(!draft.is_empty());
            }
        }
        // Taking tokens back gives the drafts of the shorter sequence: the same nodes (with no
        // path bar, calibration scales probabilities but keeps every node; the sequence's record
        // of accepted drafts is history, kept across a truncation).
        let shape = |t: DraftTree| (t.token_ids, t.parents, t.match_len);
        let half = seq.tokens().len() / 2;
        let mut fresh = Sequence::new(index.clone(), seq.tokens()[..half].to_vec()).unwrap();
        seq.truncate(half).unwrap();
        for source in [DraftSource::Index, DraftSource::Prompt] {
            let opts = DraftOptions {
                min_path_prob: 0.0,
                source,
                ..DraftOptions::default()
            };
            assert_eq!(
                shape(seq.draft(&opts).unwrap()),
                shape(fresh.draft(&opts).unwrap())
            );
        }
    }
    assert!(nonempty > 500, "only {nonempty} non-empty drafts");
}

/// An all-sources chain is the best of the sources' own chains (ties to the index), although the
/// index is not read where its chain could not win: at every third position of real test text and
/// of the same text repeated (where prompt lookup's chains are long and certain), each on a fresh
/// sequence so that every source starts from the same record.
#[test]
fn an_all_sources_chain_is_the_best_single_source_chain() {
    let dir = tempfile::tempdir().unwrap();
    let index = Arc::new(Index::open(&build_index(dir.path()), &OpenOptions::default()).unwrap());
    // No path bar, so that chains run long and a short index match is often outscored.
    let opts = DraftOptions {
        min_path_prob: 0.0,
        ..DraftOptions::default()
    };
    let draft = |tokens: &[u32], source| {
        let opts = DraftOptions { source, ..opts };
        let mut seq = Sequence::new(index.clone(), tokens.to_vec()).unwrap();
        seq.draft(&opts).unwrap()
    };
    // A fresh record: every source's factor is the prior's.
    let fresh = Calibration::default();
    let (mut checked, mut skipped, mut index_won) = (0, 0, 0);
    for doc in texts("test", 4) {
        let doc = &doc[..doc.len().min(160)];
        let repeated = [doc, doc].concat();
        for end in (2..repeated.len()).step_by(3) {
            let tokens = &repeated[..end];
            let all = draft(tokens, DraftSource::All);
            let from_index = draft(tokens, DraftSource::Index);
            let from_prompt = draft(tokens, DraftSource::Prompt);
            let best = match from_prompt.score > from_index.score {
                true => &from_prompt,
                false => &from_index,
            };
            assert_eq!(all.token_ids, best.token_ids, "at {end}");
            assert_eq!(all.score, best.score, "at {end}");
            checked += 1;
            // Where the prompt's chain outscores the best the index's could: not read.
            let matched = SuffixMatch::of(&*index, tokens).unwrap().suffix_len();
            let bound = fresh.chain_bound(Origin::Index, matched, &opts);
            skipped += usize::from(bound > 0.0 && from_prompt.score > bound);
            index_won +=
                usize::from(!from_index.is_empty() && from_index.score >= from_prompt.score);
        }
    }
    // The index is skipped at some steps and wins at others.
    assert!(
        checked > 200 && skipped > 10 && index_won > 10,
        "{checked} {skipped} {index_won}"
    );
}
