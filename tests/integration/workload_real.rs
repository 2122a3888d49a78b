//! `eval workload`'s replay on the real SmolLM2 and the real mini-Pile index, on a workload of three
//! requests: a short poem in namespace `a`, the same request in namespace `b`, then in `a` again.
//! Oracles: plain greedy decoding (every drafted run must reproduce it), the repeat's own output
//! (verbatim what `a` learned before, so the live index must draft most of it), and the namespaces
//! (what `b` learned cannot serve `a`'s repeat, nor `a`'s first request serve `b`). The same
//! replay over the index's compressed form gives the same outputs.

use crate::common;
use std::sync::Arc;

use common::server::build_index;
use infini_sidecar::eval::workload::{self, WorkloadRequest};
use infini_sidecar::index::fm::CompressedIndex;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::model::Model;

const NEW_TOKENS: usize = 32;

/// A request whose answer the model writes (not copied from its prompt), under a namespace.
fn request(id: &str, namespace: &str) -> WorkloadRequest {
    WorkloadRequest {
        id: id.into(),
        messages: Vec::new(),
        prompt: Some("Write a short poem about a lighthouse keeper and the sea.".into()),
        max_new_tokens: NEW_TOKENS,
        namespace: Some(namespace.into()),
        reference: None,
    }
}

#[test]
fn a_replayed_workload_learns_per_namespace_and_stays_exact() {
    let model = Model::load(&common::smollm2_gguf(), &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let index = Arc::new(Index::open(&build_index(dir.path()), &OpenOptions::default()).unwrap());
    let requests = [
        request("first", "a"),
        request("other-namespace", "b"),
        request("repeat", "a"),
    ];
    let draft = workload::draft_options();
    let report = workload::run(&model, index.clone(), &requests, &draft).unwrap();

    // Every configuration of every request reproduces plain greedy decoding.
    for r in &report.requests {
        for run in &r.configurations {
            assert!(run.matches_plain, "{} under {}", r.id, run.name);
        }
    }
    assert!(report.summary.iter().all(|s| s.mismatches == 0));
    // The same prompt gives the same greedy answer each time: the repeat's answer is what
    // namespace `a` learned from the first request.
    let outputs: Vec<&Vec<u32>> = report.replay.iter().map(|(_, out)| out).collect();
    assert_eq!(outputs[0], outputs[2]);
    assert_eq!(outputs[0], outputs[1]);
    let tokens = outputs[0].len();
    assert!(tokens >= 8, "a summary of {tokens} tokens");

    let live_accepted = |request: usize, config: &str| {
        let run = (report.requests[request].configurations.iter())
            .find(|c| c.name == config)
            .unwrap();
        run.by_source.get("live").map_or(0, |t| t.accepted)
    };
    // The repeat drafts its answer from what `a` learned: all but the first few tokens.
    let repeat = live_accepted(2, "live");
    assert!(
        repeat + 4 >= tokens,
        "the repeat accepted {repeat} of {tokens} tokens from the live index"
    );
    // Namespace `b` had learned nothing of the answer: its live drafts can come only from its
    // own one-line prompt, so far fewer are accepted than in `a`'s repeat.
    let other = live_accepted(1, "live");
    assert!(
        other * 2 < repeat,
        "namespace b accepted {other} live tokens against the repeat's {repeat}"
    );
    // Prompt lookup alone never drafts from the live index.
    for r in &report.requests {
        let prompt_only = r
            .configurations
            .iter()
            .find(|c| c.name == "prompt")
            .unwrap();
        assert!(prompt_only.by_source.keys().all(|&s| s == "prompt"));
    }
    // Every configuration's live index learned every prompt and answer.
    let learned: usize = report.replay.iter().map(|(p, o)| p.len() + o.len()).sum();
    for (name, live_tokens) in &report.live_tokens {
        let live_tokens = *live_tokens as usize;
        assert!(
            (learned..=learned + requests.len()).contains(&live_tokens),
            "{name}: {live_tokens} live tokens for {learned} learned"
        );
    }

    // The cost-model replay of the same outputs: the warm part (the repeat) drafts its answer
    // in a pass or two, each costing 1 + 0.2 per row, far below a step a token.
    let simulate = |row_cost: f64| {
        workload::simulate(
            index.clone(),
            &requests,
            &report.replay,
            &report.references,
            &draft,
            row_cost,
        )
        .unwrap()
    };
    let warm_live = |simulated: &[workload::Simulated]| {
        (simulated.iter())
            .find(|s| s.configuration == "ours: live" && s.part == "warm")
            .cloned()
            .unwrap()
    };
    let simulated = simulate(workload::DEFAULT_ROW_COST);
    let warm = warm_live(&simulated);
    assert_eq!(warm.tokens, tokens);
    assert!(warm.speedup > 2.0, "{warm:?}");
    // The row cost prices the drafted rows and nothing else: free rows leave a speed-up of the
    // tokens a step (the accepted ones and the target's own), and dearer rows a lower one.
    for (free, priced) in simulate(0.0).iter().zip(&simulated) {
        assert_eq!(
            (&free.configuration, &free.part),
            (&priced.configuration, &priced.part)
        );
        assert_eq!(free.accepted_per_step, priced.accepted_per_step);
        assert!(
            (free.speedup - (free.accepted_per_step + 1.0)).abs() < 1e-9,
            "{free:?}"
        );
    }
    assert!(warm_live(&simulate(0.4)).speedup < warm.speedup);

    // Over the compressed form of the same index: the same outputs, still plain decoding's.
    let fm = CompressedIndex::build(
        &index,
        &dir.path().join("fm"),
        (infini_sidecar::index::fm::DEFAULT_SAMPLE_EVERY, 2),
        |_| {},
    )
    .unwrap();
    let over_fm = workload::run(&model, Arc::new(fm), &requests, &draft).unwrap();
    assert!(over_fm.summary.iter().all(|s| s.mismatches == 0));
    assert_eq!(over_fm.replay, report.replay);
}
