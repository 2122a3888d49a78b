//! The live index through the real server: what one replica's session generates is drafted for
//! another's at once, never across namespaces; documents added by RPC and a session's reference text
//! are drafted from; and what was learnt survives a restart on the same data folder.

use std::time::{Duration, Instant};

use infini_sidecar::server::config::{LiveSection, ServeConfig};
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::{self, session_request};
use tonic::transport::Channel;
use tonic::Code;

use crate::common;
use crate::common::server::{authed, build_index, config, connect, open_session, start, step};

/// Text no mini-Pile document continues like this: a draft of its continuation can only come from
/// the live index or a reference.
const GENERATED: &str = "Invoice 7731 for Zanzibar Widget Cooperative: forty-four brass sprockets, \
     nine tin gaskets and one crate of walnut dowels, shipped by barge to Port Quillon on the third \
     of Lammas.";

fn tokens(text: &str) -> Vec<u32> {
    common::smollm2_tokenizer().encode(text).unwrap()
}

/// A session with `start`, answering its start step; panics on a refused start.
async fn session(
    client: &mut SidecarClient<Channel>,
    start: pb::SessionStart,
) -> (
    tokio::sync::mpsc::Sender<pb::SessionRequest>,
    tonic::Streaming<pb::SessionResponse>,
) {
    let (tx, mut replies) = open_session(client).await;
    let started = step(&tx, &mut replies, session_request::Step::Start(start)).await;
    assert!(
        started.result.is_none(),
        "start refused: {:?}",
        started.result
    );
    (tx, replies)
}

/// A chain drafted for `context` in `namespace` from `source` only.
async fn draft(
    client: &mut SidecarClient<Channel>,
    context: &[u32],
    namespace: &str,
    reference: &[u32],
    source: pb::DraftSource,
) -> Result<Vec<u32>, tonic::Status> {
    let request = pb::DraftRequest {
        target: Some(pb::draft_request::Target::Context(pb::TokenIds {
            ids: context.to_vec(),
        })),
        options: Some(pb::DraftOptions {
            max_tokens: 8,
            source: source as i32,
            min_path_prob: Some(0.0),
            ..Default::default()
        }),
        namespace: namespace.into(),
        reference: reference.to_vec(),
    };
    Ok(client.draft(authed(request)).await?.into_inner().token_ids)
}

fn live_config(dir: &std::path::Path, index: std::path::PathBuf, live: LiveSection) -> ServeConfig {
    ServeConfig {
        live,
        ..config(dir, index, true)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_b_drafts_what_replica_a_generated_and_no_other_namespace_does() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let running = start(live_config(dir.path(), index, LiveSection::default())).await;
    // Two replicas: two clients on connections of their own.
    let mut a = SidecarClient::new(connect(running.addr).await);
    let mut b = SidecarClient::new(connect(running.addr).await);
    let generated = tokens(GENERATED);
    let (head, rest) = generated.split_at(12);

    let prompt = tokens("Write the invoice.");
    let (tx, mut replies) = session(
        &mut a,
        pb::SessionStart {
            context: prompt.clone(),
            namespace: "billing".into(),
            learn: true,
            ..Default::default()
        },
    )
    .await;
    // Replica B, asking about the same invoice, sees nothing live before A generates it.
    let mut context = tokens("Summary:");
    context.extend_from_slice(head);
    let before = draft(&mut b, &context, "billing", &[], pb::DraftSource::Live).await;
    assert_eq!(before.unwrap(), Vec::<u32>::new());
    // A's decoding loop appends what its model generated, a few tokens a step.
    for chunk in generated.chunks(5) {
        let r = step(
            &tx,
            &mut replies,
            session_request::Step::Append(pb::SessionAppend {
                tokens: chunk.to_vec(),
            }),
        )
        .await;
        assert!(r.result.is_none(), "{:?}", r.result);
    }
    let drafted = draft(&mut b, &context, "billing", &[], pb::DraftSource::Live)
        .await
        .unwrap();
    assert_eq!(drafted, rest[..8].to_vec(), "B's draft is A's continuation");
    // All sources together draft it too; another namespace and no namespace never do.
    let all = draft(&mut b, &context, "billing", &[], pb::DraftSource::All)
        .await
        .unwrap();
    assert_eq!(all, rest[..8].to_vec());
    for other in ["payroll", ""] {
        let got = draft(&mut b, &context, other, &[], pb::DraftSource::Live)
            .await
            .unwrap();
        assert_eq!(
            got,
            Vec::<u32>::new(),
            "namespace {other:?} saw billing's tokens"
        );
    }
    drop(tx);
    while replies.message().await.unwrap().is_some() {}
    running.stop.send(()).unwrap();
    running.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_documents_and_references_are_drafted_from_and_bad_requests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let running = start(live_config(dir.path(), index, LiveSection::default())).await;
    let mut client = running.client.clone();
    let generated = tokens(GENERATED);
    let (head, rest) = generated.split_at(12);
    let added = client
        .add_documents(authed(pb::AddDocumentsRequest {
            namespace: "docs".into(),
            request_id: String::new(),
            documents: vec![pb::LiveDocument {
                content: Some(pb::live_document::Content::Text(GENERATED.into())),
            }],
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((added.documents, added.tokens), (1, generated.len() as u64));
    let got = draft(&mut client, head, "docs", &[], pb::DraftSource::Live).await;
    assert_eq!(got.unwrap(), rest[..8].to_vec());
    // A reference drafts for its own request only.
    let got = draft(
        &mut client,
        head,
        "",
        &generated,
        pb::DraftSource::Reference,
    )
    .await;
    assert_eq!(got.unwrap(), rest[..8].to_vec());
    let got = draft(&mut client, head, "", &[], pb::DraftSource::Reference).await;
    assert_eq!(got.unwrap(), Vec::<u32>::new());

    let refused = |r: Result<tonic::Response<pb::AddDocumentsResponse>, tonic::Status>| {
        r.map(|_| ()).unwrap_err().code()
    };
    let add = |namespace: &str, ids: Vec<u32>| {
        authed(pb::AddDocumentsRequest {
            namespace: namespace.into(),
            request_id: String::new(),
            documents: vec![pb::LiveDocument {
                content: Some(pb::live_document::Content::Tokens(pb::TokenIds { ids })),
            }],
        })
    };
    for bad in ["", "../escape", ".hidden", "a/b"] {
        let code = refused(client.add_documents(add(bad, vec![1, 2])).await);
        assert_eq!(code, Code::InvalidArgument, "namespace {bad:?}");
    }
    let code = refused(client.add_documents(add("docs", vec![1, 10_000_000])).await);
    assert_eq!(code, Code::InvalidArgument);
    let bad_ref = draft(&mut client, head, "", &[10_000_000], pb::DraftSource::All).await;
    assert_eq!(bad_ref.unwrap_err().code(), Code::InvalidArgument);
    let (tx, mut replies) = open_session(&mut client).await;
    let learn_alone = step(
        &tx,
        &mut replies,
        session_request::Step::Start(pb::SessionStart {
            context: head.to_vec(),
            learn: true,
            ..Default::default()
        }),
    )
    .await;
    let Some(pb::session_response::Result::Error(e)) = learn_alone.result else {
        panic!("learn without a namespace was taken");
    };
    assert_eq!(Code::from(e.code), Code::InvalidArgument);
    drop(tx);
    running.stop.send(()).unwrap();
    running.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_learnt_is_drafted_again_after_a_restart_on_the_same_data_folder() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let data = dir.path().join("live");
    let live = LiveSection {
        data_dir: Some(data.clone()),
        freeze_tokens: 16,
        budget_tokens: 1 << 20,
        ..LiveSection::default()
    };
    let generated = tokens(GENERATED);
    let (head, rest) = generated.split_at(12);
    {
        let running = start(live_config(dir.path(), index.clone(), live.clone())).await;
        let mut client = running.client.clone();
        let (tx, mut replies) = session(
            &mut client,
            pb::SessionStart {
                context: generated.clone(),
                namespace: "billing".into(),
                learn: true,
                ..Default::default()
            },
        )
        .await;
        // The compactor freezes the tail within its round (a second); wait for the run's list.
        let list = data.join("billing").join("runs.json");
        for _ in 0..200 {
            if std::fs::read_to_string(&list).is_ok_and(|t| t.contains("run-")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(std::fs::read_to_string(&list).unwrap().contains("run-"));
        drop(tx);
        while replies.message().await.unwrap().is_some() {}
        running.stop.send(()).unwrap();
        running.task.await.unwrap().unwrap();
    }
    let running = start(live_config(dir.path(), index, live)).await;
    let mut client = running.client.clone();
    let got = draft(&mut client, head, "billing", &[], pb::DraftSource::Live).await;
    assert_eq!(got.unwrap(), rest[..8].to_vec());
    running.stop.send(()).unwrap();
    running.task.await.unwrap().unwrap();
}

/// A chain drafted for `context` from namespace "agents" of the live index alone.
async fn agents_draft(client: &mut SidecarClient<Channel>, context: &[u32]) -> Vec<u32> {
    draft(client, context, "agents", &[], pb::DraftSource::Live)
        .await
        .unwrap()
}

/// A document of `len` token ids drawn from `seed` (ids that are ordinary SmolLM2 tokens).
fn random_document(seed: u64, len: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1_000 + (x % 30_000) as u32
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_documents_stream_in_never_leaves_a_live_index_that_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let data = dir.path().join("live");
    let path = dir.path().join("serve.toml");
    // A small freeze size: the compactor builds a run every few requests, so kills land in builds,
    // list writes and merges as well as between them.
    std::fs::write(
        &path,
        format!(
            "index = {:?}\nbind = \"127.0.0.1:0\"\n[live]\ndata_dir = {:?}\nfreeze_tokens = 300\nbudget_tokens = 10000000\n",
            index.display().to_string(),
            data.display().to_string()
        ),
    )
    .unwrap();
    let first = random_document(1, 200);
    let mut seed = 2;
    for round in 0..4u64 {
        let (mut child, addr) = crate::common::server::spawn_serve(&path).await;
        let mut client = SidecarClient::new(connect(addr).await);
        let add = |docs: Vec<Vec<u32>>| {
            authed(pb::AddDocumentsRequest {
                namespace: "agents".into(),
                request_id: String::new(),
                documents: docs
                    .into_iter()
                    .map(|ids| pb::LiveDocument {
                        content: Some(pb::live_document::Content::Tokens(pb::TokenIds { ids })),
                    })
                    .collect(),
            })
        };
        if round == 0 {
            client
                .add_documents(add(vec![first.clone()]))
                .await
                .unwrap();
        } else {
            // What a kill may lose is at most the tails; everything before them is in runs.
            let got = agents_draft(&mut client, &first[..20]).await;
            assert_eq!(got, first[20..28].to_vec(), "round {round}");
        }
        // Stream documents for a while (varying per round), then kill -9 mid-stream. The first
        // round streams on until a run holds `first` (a kill may lose the tails, and how soon the
        // compactor writes the first run depends on the machine's load).
        let until = Instant::now() + Duration::from_millis(600 + 350 * round);
        let first_in_a_run = || {
            std::fs::read(data.join("agents").join("runs.json"))
                .ok()
                .and_then(|list| serde_json::from_slice::<serde_json::Value>(&list).ok())
                .is_some_and(|list| list["runs"].as_array().is_some_and(|r| !r.is_empty()))
        };
        let started = Instant::now();
        while Instant::now() < until || (round == 0 && !first_in_a_run()) {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no run written"
            );
            let docs = (0..3).map(|_| {
                seed += 1;
                random_document(seed, 120)
            });
            let added = client.add_documents(add(docs.collect())).await;
            // Back-pressure while compaction catches up is an answer, not a failure.
            if let Err(e) = added {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    // A last start serves what was learnt and removes what the kills left; after a clean stop
    // nothing of ours is half-made: no builder work folders, every run folder named by the list.
    let (mut child, addr) = crate::common::server::spawn_serve(&path).await;
    let mut client = SidecarClient::new(connect(addr).await);
    let got = agents_draft(&mut client, &first[..20]).await;
    assert_eq!(got, first[20..28].to_vec());
    drop(client);
    // SAFETY: kill only sends a signal to the child we spawned.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(stopped.elapsed() < Duration::from_secs(60), "no clean stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
    let list = std::fs::read_to_string(data.join("agents").join("runs.json")).unwrap();
    for entry in std::fs::read_dir(data.join("agents")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with("run-") {
            assert!(!name.contains(".partial-"), "{name} left behind");
            let listed = list.contains(&format!("\"{name}\""));
            assert!(listed, "{name} not in the list");
        }
    }
}
