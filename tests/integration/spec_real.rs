//! The speculative decoding loop with the real SmolLM2 as target and the real mini-Pile index as
//! drafter: greedy speculative decoding emits exactly plain greedy decoding's tokens on prompts from
//! every test domain, while drafts are actually accepted.
//!
//! Exactness rests on every row of a pass being computed as a one-token step computes it: the
//! quantized kernels sum each output the same way for any number of rows, and verification passes
//! attend row by row along each row's path (a chain, or a draft tree's branch), however many rows
//! they hold.

use crate::common;
use std::sync::Arc;

use common::server::build_index;
use infini_sidecar::corpus::Content;
use infini_sidecar::decoding::spec::{decode, SpecOptions, MAX_VERIFY_ROWS};
use infini_sidecar::decoding::Extras;
use infini_sidecar::draft::{DraftOptions, DraftSource};
use infini_sidecar::evidence::EvidenceSource;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::model::{Model, SHORT_PASS_ROWS};

#[test]
fn greedy_speculative_decoding_equals_plain_greedy() {
    let model = Model::load(&common::smollm2_gguf(), &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let index: Arc<dyn EvidenceSource> =
        Arc::new(Index::open(&build_index(dir.path()), &OpenOptions::default()).unwrap());
    // Two prompts of each domain: the test split lists the domains in turn.
    let prompts: Vec<Vec<u32>> = common::minipile_docs("test", 60)
        .iter()
        .filter_map(|d| match &d.content {
            Content::Text(t) => Some(model.encode_document(t).unwrap()),
            Content::Tokens(_) => None,
        })
        .filter(|ids| ids.len() > 96)
        .step_by(6)
        .take(8)
        .map(|ids| ids[..96].to_vec())
        .collect();
    assert_eq!(prompts.len(), 8);
    let (mut drafted, mut accepted, mut longest) = (0, 0, 0);
    for (i, prompt) in prompts.iter().enumerate() {
        let plain = SpecOptions {
            max_new_tokens: 40,
            draft: None,
            temperature: None,
            seed: 0,
            stop_token: None,
        };
        let want = decode(
            model.transformer(),
            &index,
            prompt,
            &plain,
            Extras::default(),
        )
        .unwrap();
        assert_eq!(want.drafted, 0);
        assert_eq!(want.steps, 40);
        let source = [DraftSource::All, DraftSource::Index, DraftSource::Prompt][i % 3];
        // Chains and trees (verified a tree per pass) in turn.
        let tree = i % 2 == 1;
        let spec = SpecOptions {
            // A low bar, so that many drafts are verified (and some rejected).
            draft: Some(DraftOptions {
                source,
                tree,
                min_token_prob: 0.1,
                min_path_prob: 0.1,
                // Drafts as long as the room allows, whatever the match: passes longer than a
                // short one stay exact.
                max_tokens: MAX_VERIFY_ROWS - 1,
                match_len_factor: 0.0,
                ..DraftOptions::default()
            }),
            ..plain
        };
        let got = decode(
            model.transformer(),
            &index,
            prompt,
            &spec,
            Extras::default(),
        )
        .unwrap();
        assert_eq!(
            got.tokens, want.tokens,
            "prompt {i}, {source:?}, tree {tree}"
        );
        assert_eq!(got.steps + got.accepted, 40);
        longest = longest.max(got.longest_draft);
        drafted += got.drafted;
        accepted += got.accepted;
    }
    assert!(
        accepted > 0 && drafted >= accepted,
        "{accepted} of {drafted} accepted"
    );
    assert!(
        longest + 1 >= SHORT_PASS_ROWS,
        "no pass as long as a short one's limit: {longest} draft tokens at most"
    );
}
