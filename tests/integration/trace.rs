//! Maximal matching spans against brute force (every span of the text counted, the maximal ones
//! kept), and on real text: a passage copied from an indexed document is found whole, with that
//! document.

use std::collections::BTreeSet;

use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::trace::TraceOptions;
use proptest::prelude::*;

use crate::common;
use crate::common::oracle::Oracle;

/// Every span of `ids` that occurs and lies in no other that occurs, at least `min_len` long.
fn brute_force(oracle: &Oracle, ids: &[u32], min_len: usize) -> BTreeSet<(usize, usize, u64)> {
    let n = ids.len();
    let occurs = |i: usize, j: usize| oracle.count(&ids[i..j]) > 0;
    let mut out = BTreeSet::new();
    for i in 0..n {
        for j in i + 1..=n {
            let maximal =
                occurs(i, j) && (j == n || !occurs(i, j + 1)) && (i == 0 || !occurs(i - 1, j));
            if maximal && j - i >= min_len {
                out.insert((i, j, oracle.count(&ids[i..j])));
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn maximal_spans_match_brute_force(
        docs in proptest::collection::vec(proptest::collection::vec(1u32..4, 0..40), 1..6),
        pieces in proptest::collection::vec((0usize..6, 0usize..40, 0usize..12), 1..5),
        noise in proptest::collection::vec(1u32..6, 0..6),
        min_len in 1usize..4,
        part_tokens in 45u64..200,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let index = common::small_index(dir.path(), &docs, part_tokens);
        let oracle = Oracle { docs: docs.clone(), eos: 0 };
        // A text of pieces of the documents with noise between them (5 never occurs).
        let ids = common::pieces_of(&docs, &pieces, &noise);
        let opts = TraceOptions { min_len, max_documents: 2, max_disp_len: 100, ..TraceOptions::default() };
        let spans = index.trace(&ids, opts).unwrap();
        let got: BTreeSet<_> = spans.iter().map(|s| (s.start, s.end, s.count)).collect();
        prop_assert_eq!(&got, &brute_force(&oracle, &ids, min_len));
        for span in &spans {
            prop_assert!(!span.documents.is_empty());
            for doc in &span.documents {
                let held = &docs[doc.doc_ix as usize];
                let needle = &ids[span.start..span.end];
                prop_assert!(held.windows(needle.len()).any(|w| w == needle));
            }
        }
    }
}

#[test]
fn a_copied_passage_is_traced_to_its_document() {
    let tokenizer = common::smollm2_tokenizer();
    let texts = common::minipile_texts("train", 30, "");
    let dir = tempfile::tempdir().unwrap();
    let index = common::smollm2_index_of(dir.path(), &texts);
    let (doc_ix, head) = common::long_document_head(&texts);
    let passage_ids = tokenizer.encode(head).unwrap();
    let passage = &passage_ids[100..160];
    let novel = tokenizer
        .encode(" zqxj wvkp 7731 plorb fnarg quux blee")
        .unwrap();
    let ids: Vec<u32> = [novel.as_slice(), passage, novel.as_slice()].concat();
    let spans = index
        .trace(
            &ids,
            TraceOptions {
                min_len: 20,
                ..TraceOptions::default()
            },
        )
        .unwrap();
    let whole = spans
        .iter()
        .find(|s| s.start <= novel.len() && s.end >= novel.len() + passage.len())
        .unwrap_or_else(|| panic!("the passage is not one span: {spans:?}"));
    assert!(whole.documents.iter().any(|d| d.doc_ix == doc_ix as u64));
    // No span lies inside the novel text.
    let passage_range = novel.len()..novel.len() + passage.len();
    assert!(
        spans
            .iter()
            .all(|s| s.start < passage_range.end && s.end > passage_range.start),
        "{spans:?}"
    );
}
