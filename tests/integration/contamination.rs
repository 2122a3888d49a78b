//! Contamination reports against brute force (every n-gram of an item searched in the documents,
//! every span tried for the longest match), and `eval contamination` on real text: a benchmark with
//! an item copied from an indexed document and one that is not, in the JSON and the table.

use std::process::Command;

use infini_sidecar::eval::contamination::{self, ContaminationOptions};
use infini_sidecar::eval::documents::EvalDocument;
use proptest::prelude::*;

use crate::common;
use crate::common::oracle::Oracle;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn shares_and_longest_matches_are_brute_force(
        docs in proptest::collection::vec(proptest::collection::vec(1u32..4, 0..40), 1..6),
        pieces in proptest::collection::vec((0usize..6, 0usize..40, 0usize..14), 1..4),
        noise in proptest::collection::vec(1u32..6, 0..5),
        ngram in 1usize..6,
        threshold in 0.05f64..1.0,
        part_tokens in 45u64..200,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let index = common::small_index(dir.path(), &docs, part_tokens);
        let oracle = Oracle { docs: docs.clone(), eos: 0 };
        // An item of pieces of the documents with noise between them (5 never occurs).
        let tokens = common::pieces_of(&docs, &pieces, &noise);
        let item = EvalDocument { index: 7, domain: "d".into(), path: "p".into(), tokens: tokens.clone() };
        let opts = ContaminationOptions { ngram, threshold, max_documents: 2 };
        let got = contamination::item(&index, &item, &opts).unwrap();

        let grams: Vec<&[u32]> = tokens.windows(ngram).collect();
        let found = grams.iter().filter(|g| oracle.count(g) > 0).count();
        let longest = (0..tokens.len())
            .flat_map(|i| (i + 1..=tokens.len()).map(move |j| (i, j)))
            .filter(|&(i, j)| oracle.count(&tokens[i..j]) > 0)
            .map(|(i, j)| j - i)
            .max()
            .unwrap_or(0);
        prop_assert_eq!((got.ngrams, got.found, got.longest_match), (grams.len(), found, longest));
        let share = if grams.is_empty() { 0.0 } else { found as f64 / grams.len() as f64 };
        prop_assert_eq!(got.share, share);
        prop_assert_eq!(got.contaminated, !grams.is_empty() && share >= threshold);
        let span = &tokens[got.longest_start..got.longest_start + got.longest_match];
        prop_assert_eq!(got.longest_count, if longest == 0 { 0 } else { oracle.count(span) });
        prop_assert_eq!(got.documents.is_empty(), longest == 0);
        for source in &got.documents {
            let held = &docs[source.doc_ix as usize];
            prop_assert!(held.windows(span.len()).any(|w| w == span));
        }
    }
}

/// `eval contamination` over a SmolLM2 index of real documents: a benchmark item copied from one of
/// them is contaminated and traced to it; a held-out item is not; the table says so per domain.
#[test]
fn a_copied_benchmark_item_is_reported_with_its_document() {
    let tokenizer = common::smollm2_tokenizer();
    let texts = common::minipile_texts("train", 30, "");
    let dir = tempfile::tempdir().unwrap();
    let index = common::smollm2_index_of(dir.path(), &texts);
    let (doc_ix, head) = common::long_document_head(&texts);
    let held_out = common::brown_test_text();
    let held_out = &held_out[..(1500..).find(|&i| held_out.is_char_boundary(i)).unwrap()];
    let line = |text: &str, domain: &str| {
        serde_json::json!({"text": text, "meta": {"pile_set_name": domain}}).to_string()
    };
    let bench = dir.path().join("bench.jsonl");
    std::fs::write(
        &bench,
        [line(head, "copied"), line(held_out, "held-out")].join("\n") + "\n",
    )
    .unwrap();
    let out = dir.path().join("report");
    let run = Command::new(env!("CARGO_BIN_EXE_infini-sidecar"))
        .args(["eval", "contamination", "--index"])
        .arg(index.dir())
        .arg("--input")
        .arg(&bench)
        .arg("--out-dir")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("contamination.json")).unwrap()).unwrap();
    assert_eq!(report["options"]["ngram"], 13);
    assert_eq!(report["unit"], "tokens");
    let items = report["items"].as_array().unwrap();
    let copied = &items[0];
    let ids = tokenizer.encode(head).unwrap();
    // The passage is the document's head, cut into tokens alone: all but its last token or so is
    // the document's own cut.
    assert_eq!(copied["contaminated"], true);
    assert!(copied["share"].as_f64().unwrap() > 0.97, "{copied}");
    assert!(copied["longest_match"].as_u64().unwrap() as usize >= ids.len() - 2);
    assert_eq!(copied["documents"][0]["doc_ix"], doc_ix);
    let other = &items[1];
    assert_eq!(other["contaminated"], false);
    assert!(other["share"].as_f64().unwrap() < 0.05, "{other}");
    let table = String::from_utf8(run.stdout).unwrap();
    assert!(table.contains("| copied | 1 | 1 (100.0%) |"), "{table}");
    assert!(table.contains("| held-out | 1 | 0 (0.0%) |"), "{table}");
    assert!(table.contains("| all | 2 | 1 (50.0%) |"), "{table}");
    let md = std::fs::read_to_string(out.join("contamination.md")).unwrap();
    assert!(md.contains("| all | 2 | 1 (50.0%) |"), "{md}");
}

/// An item longer than a query may be (over 1 M tokens) is skipped with a line, and the report goes
/// on for the others; the report failed as a whole on it before.
#[test]
fn an_item_over_the_query_limit_is_skipped_and_the_others_reported() {
    let dir = tempfile::tempdir().unwrap();
    let docs = vec![vec![1, 2, 3, 1, 2]];
    let index = common::small_index(dir.path(), &docs, 100);
    let item = |index: usize, tokens: Vec<u32>| EvalDocument {
        index,
        domain: "d".into(),
        path: "p".into(),
        tokens,
    };
    let huge = vec![1u32; infini_sidecar::index::query::MAX_QUERY_TOKENS + 1];
    let items = [item(0, vec![1, 2, 3]), item(1, huge)];
    let opts = ContaminationOptions {
        ngram: 2,
        threshold: 0.5,
        max_documents: 1,
    };
    let report = contamination::report(&index, &items, &opts).unwrap();
    assert_eq!(report.items.len(), 1);
    assert!(report.items[0].contaminated);
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].item, 1);
    assert!(contamination::markdown(&report, 5).contains("Item 1 (d) was skipped"));
}
