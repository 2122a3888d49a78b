//! The `Batch` RPC against sessions: every sequence of a batch step gets exactly the answers its own
//! `Session` stream gets for the same steps (mixed distributions, λ, drafts), sequences join and
//! leave between steps, and each bad part is refused alone.

use crate::common;

use common::server::{authed, build_index, config, open_session, start, step, Running};
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::server::pb::{self, draft_request, session_request};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// A caller's top-k log-probs that differ from token to token and from sequence to sequence.
fn neural(seed: usize, vocab: u32) -> pb::session_mix::Neural {
    let tokens: Vec<u32> = (0..64)
        .map(|i| ((seed * 131 + i * 977) as u32) % vocab)
        .collect();
    let mut tokens = tokens;
    tokens.sort_unstable();
    tokens.dedup();
    let logprobs: Vec<f32> = (0..tokens.len()).map(|i| -4.0 - i as f32 * 0.05).collect();
    let kept: f64 = logprobs.iter().map(|&l| (l as f64).exp()).sum();
    pb::session_mix::Neural::TopKLogprobs(pb::NeuralTopK {
        tokens,
        logprobs,
        rest_mass: (1.0 - kept).max(0.0),
    })
}

fn mix(seed: usize, vocab: u32) -> pb::SessionMix {
    pb::SessionMix {
        neural: Some(neural(seed, vocab)),
        top_k: 16,
        ..Default::default()
    }
}

fn draft_options() -> pb::DraftOptions {
    pb::DraftOptions {
        max_tokens: 8,
        ..Default::default()
    }
}

struct BatchStream {
    tx: mpsc::Sender<pb::BatchStep>,
    replies: tonic::Streaming<pb::BatchStepResult>,
}

impl BatchStream {
    async fn open(
        client: &mut pb::sidecar_client::SidecarClient<tonic::transport::Channel>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(4);
        let replies = client
            .batch(authed(ReceiverStream::new(rx)))
            .await
            .unwrap()
            .into_inner();
        Self { tx, replies }
    }

    async fn step(&mut self, sequences: Vec<pb::SequenceStep>) -> Vec<pb::SequenceResult> {
        self.tx.send(pb::BatchStep { sequences }).await.unwrap();
        self.replies.message().await.unwrap().unwrap().sequences
    }
}

/// Six sequences over real documents, in one batch and each in a session of its own, step by step:
/// one token accepted, a mixed distribution (the file's default rule, λ1/λ2 here) and a draft. One
/// sequence joins late and one leaves early; a rejected draft is taken back with `keep`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_each_sequence_as_its_session_does() {
    let dir = tempfile::tempdir().unwrap();
    let index_dir = build_index(dir.path());
    let Running {
        mut client, stop, ..
    } = start(config(dir.path(), index_dir, true)).await;
    let index = Index::open(&dir.path().join("index"), &OpenOptions::default()).unwrap();
    let vocab = index.vocab_size() as u32;
    let docs: Vec<Vec<u32>> = (0..6)
        .map(|d| index.get_document(10 + d).unwrap().token_ids)
        .collect();
    let mut batch = BatchStream::open(&mut client).await;
    let mut sessions = Vec::new();
    for doc in &docs {
        let (tx, mut replies) = open_session(&mut client).await;
        let start = session_request::Step::Start(pb::SessionStart {
            context: doc[..16].to_vec(),
            ..Default::default()
        });
        step(&tx, &mut replies, start).await;
        sessions.push((tx, replies));
    }
    let mut compared = 0;
    for t in 0..12usize {
        let mut parts = Vec::new();
        for (d, doc) in docs.iter().enumerate() {
            // Sequence 5 joins at step 3; sequence 0 leaves after step 7.
            if (d == 5 && t < 3) || (d == 0 && t > 7) {
                continue;
            }
            let joining = d == 5 && t == 3 || t == 0 && d != 5;
            let end = 16 + t;
            parts.push(pb::SequenceStep {
                id: 1000 + d as u64,
                start: joining.then(|| pb::SessionStart {
                    context: doc[..end].to_vec(),
                    ..Default::default()
                }),
                // A draft of four tokens that was rejected, taken back at step 6.
                keep: (t == 6).then_some(end as u64),
                append: match (joining, t == 6) {
                    (true, _) => vec![],
                    (false, false) => vec![doc[end - 1]],
                    (false, true) => vec![],
                },
                mix: Some(mix(d * 100 + t, vocab)),
                draft: Some(draft_options()),
                finish: d == 0 && t == 7,
            });
        }
        // At step 6 each sequence first appends its token and four more that are then taken back.
        if t == 6 {
            for part in &parts {
                let d = (part.id - 1000) as usize;
                let end = 16 + t;
                let extra = pb::SequenceStep {
                    id: part.id,
                    append: vec![docs[d][end - 1], 1, 2, 3, 4],
                    ..Default::default()
                };
                let r = batch.step(vec![extra.clone()]).await;
                assert!(r[0].error.is_none(), "{r:?}");
                let (tx, replies) = &mut sessions[d];
                let append = session_request::Step::Append(pb::SessionAppend {
                    tokens: extra.append,
                });
                step(tx, replies, append).await;
                assert_eq!(r[0].state.as_ref().unwrap().length, end as u64 + 4);
            }
        }
        let results = batch.step(parts.clone()).await;
        assert_eq!(results.len(), parts.len());
        for (part, result) in parts.iter().zip(&results) {
            assert_eq!(result.id, part.id);
            assert!(result.error.is_none(), "step {t}: {:?}", result.error);
            let d = (part.id - 1000) as usize;
            let end = 16 + t;
            let (tx, replies) = &mut sessions[d];
            if let Some(keep) = part.keep {
                let truncate =
                    session_request::Step::Truncate(pb::SessionTruncate { length: keep });
                step(tx, replies, truncate).await;
            }
            if !part.append.is_empty() {
                let append = session_request::Step::Append(pb::SessionAppend {
                    tokens: part.append.clone(),
                });
                step(tx, replies, append).await;
            } else if part.start.is_some() && t > 0 {
                // The late joiner's session catches up to where the batch started it.
                let append = session_request::Step::Append(pb::SessionAppend {
                    tokens: docs[d][16..end].to_vec(),
                });
                step(tx, replies, append).await;
            }
            let state = result.state.as_ref().unwrap();
            assert_eq!(state.length, end as u64);
            let by_session = step(
                tx,
                replies,
                session_request::Step::Mix(part.mix.clone().unwrap()),
            )
            .await;
            let Some(pb::session_response::Result::Mix(want)) = by_session.result else {
                panic!("no mix: {by_session:?}");
            };
            assert_eq!(result.mix.as_ref(), Some(&want), "sequence {d} step {t}");
            assert_eq!(
                state.suffix_len,
                by_session.state.as_ref().unwrap().suffix_len
            );
            let by_session = step(tx, replies, session_request::Step::Draft(draft_options())).await;
            let Some(pb::session_response::Result::Draft(want)) = by_session.result else {
                panic!("no draft: {by_session:?}");
            };
            assert_eq!(result.draft.as_ref(), Some(&want), "sequence {d} step {t}");
            compared += 1;
            if part.finish {
                continue;
            }
            // The sidecar's id of the sequence reaches it from a unary `Draft` too.
            let by_id = client
                .draft(authed(pb::DraftRequest {
                    target: Some(draft_request::Target::SessionId(state.session_id)),
                    options: Some(draft_options()),
                    ..Default::default()
                }))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(&by_id, result.draft.as_ref().unwrap());
        }
    }
    assert_eq!(compared, 6 * 12 - 3 - 4);
    // Sequence 0 has left: naming it again is NOT_FOUND, and it can start afresh.
    let gone = batch
        .step(vec![pb::SequenceStep {
            id: 1000,
            append: vec![5],
            ..Default::default()
        }])
        .await;
    assert_eq!(gone[0].error.as_ref().unwrap().code, Code::NotFound as i32);
    let _ = stop.send(());
}

/// Bad parts are refused one by one and the rest of the step is done: a sequence named twice, one
/// never started, one started twice, an id outside the vocabulary, and sequences past `max_sessions`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parts_are_refused_alone() {
    let dir = tempfile::tempdir().unwrap();
    let index_dir = build_index(dir.path());
    let mut cfg = config(dir.path(), index_dir, true);
    cfg.limits.max_sessions = 3;
    let Running {
        mut client, stop, ..
    } = start(cfg).await;
    let mut batch = BatchStream::open(&mut client).await;
    let start_step = |id: u64| pb::SequenceStep {
        id,
        start: Some(pb::SessionStart {
            context: vec![10, 11, 12],
            ..Default::default()
        }),
        ..Default::default()
    };
    let first = batch.step(vec![start_step(1), start_step(2)]).await;
    assert!(first.iter().all(|r| r.error.is_none()), "{first:?}");
    let append = |id: u64, tokens: Vec<u32>| pb::SequenceStep {
        id,
        append: tokens,
        ..Default::default()
    };
    let results = batch
        .step(vec![
            append(1, vec![13]),
            append(1, vec![14]),
            append(9, vec![13]),
            start_step(2),
            append(2, vec![u32::MAX]),
            start_step(3),
            start_step(4),
        ])
        .await;
    let codes: Vec<Option<i32>> = results
        .iter()
        .map(|r| r.error.as_ref().map(|e| e.code))
        .collect();
    assert_eq!(
        codes,
        vec![
            None,
            Some(Code::InvalidArgument as i32),
            Some(Code::NotFound as i32),
            Some(Code::FailedPrecondition as i32),
            // Sequence 2 appears twice: its second part is refused before the vocabulary is read.
            Some(Code::InvalidArgument as i32),
            None,
            Some(Code::ResourceExhausted as i32),
        ],
        "{results:?}"
    );
    assert_eq!(results[0].state.as_ref().unwrap().length, 4);
    // The refused append left sequence 2 as it was.
    let again = batch.step(vec![append(2, vec![u32::MAX])]).await;
    assert_eq!(
        again[0].error.as_ref().unwrap().code,
        Code::InvalidArgument as i32
    );
    assert_eq!(again[0].state.as_ref().unwrap().length, 3);
    // A part whose mix breaks the API's limits is refused before any of it is done: its append
    // is not applied either.
    let bad_mix = pb::SequenceStep {
        mix: Some(pb::SessionMix {
            top_k: 0,
            ..mix(0, 256)
        }),
        ..append(1, vec![13])
    };
    let refused = batch.step(vec![bad_mix]).await;
    assert_eq!(
        refused[0].error.as_ref().map(|e| e.code),
        Some(Code::InvalidArgument as i32),
        "{refused:?}"
    );
    assert_eq!(refused[0].state.as_ref().unwrap().length, 4, "{refused:?}");
    let _ = stop.send(());
}
