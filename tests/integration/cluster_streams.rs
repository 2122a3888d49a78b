//! A stream whose client leaves while a step waits on the shards never stalls a router. The
//! step runs on the blocking pool holding its sequence, waiting on a fan-out that only the
//! runtime's threads drive; the stream's task, on a runtime thread, used to wait for the sequence
//! to describe it, so no thread drove the fan-out again and the router answered nothing more
//! (issue 52's chaos run found it: a router left every call unanswered and ignored SIGTERM).
//! The router here has one runtime thread, so one such wait stalls it for good.

use std::time::Duration;

use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::server::pb;
use infini_sidecar::server::pb::session_request::Step;
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

use super::cluster::{build_set, serve_with, shard_server, wait_ready};
use crate::common::netns::{Faults, Link};
use crate::common::server::{connect, open_session, step};

/// How long the router's client waits for an answer before calling the router stalled.
const STALLED: Duration = Duration::from_secs(20);

/// A count through the router answers (equal to the whole index's) within [`STALLED`].
async fn still_answers(client: &mut SidecarClient<Channel>, ids: &[u32], want: u64, after: &str) {
    let asked = client.count(pb::CountRequest {
        ids: ids.to_vec(),
        ..Default::default()
    });
    let answer = tokio::time::timeout(STALLED, asked)
        .await
        .unwrap_or_else(|_| panic!("the router answers nothing after {after}"));
    assert_eq!(answer.unwrap().into_inner().count, want, "after {after}");
}

fn draft_options() -> pb::DraftOptions {
    pb::DraftOptions {
        max_tokens: 8,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_left_mid_step_never_stalls_the_router() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, shard_dirs) = build_set(dir.path());
    let single = Index::open(&whole, &OpenOptions::default()).unwrap();
    let doc: Vec<u32> = single.documents().next().unwrap();
    let (context, probe) = (doc[..24].to_vec(), doc[..3].to_vec());
    let want = single.count(&probe).unwrap();

    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for (k, d) in shard_dirs.iter().enumerate() {
        let (process, addr) = shard_server(dir.path(), &format!("shard{k}"), d).await;
        servers.push(process);
        addrs.push(addr.to_string());
    }
    // Shard 0 answers through a slow link (0.4 s each way): a draft waits on it that long.
    let slow = Link::start(
        [127, 0, 0, 1].into(),
        addrs[0].parse().unwrap(),
        Faults {
            latency: Duration::from_millis(400),
            ..Default::default()
        },
    );
    addrs[0] = slow.addr.to_string();
    let list: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    let toml = format!(
        "[cluster]\nrole = \"router\"\nshards = [{}]\nshard_timeout_ms = 5000\nrefresh_secs = 3600\n",
        list.join(", ")
    );
    let (_router, addr) = serve_with(
        dir.path(),
        "router",
        &toml,
        &[("TOKIO_WORKER_THREADS", "1")],
    )
    .await;
    let channel = connect(addr).await;
    wait_ready(&channel, ServingStatus::Serving).await;
    let mut client = SidecarClient::new(channel);
    still_answers(&mut client, &probe, want, "starting").await;

    // A session: started, then a draft whose client leaves while it waits on shard 0.
    {
        let (tx, mut replies) = open_session(&mut client).await;
        let start = Step::Start(pb::SessionStart {
            context: context.clone(),
            ..Default::default()
        });
        let started = step(&tx, &mut replies, start).await;
        assert!(started.result.is_none(), "{started:?}");
        let draft = Step::Draft(draft_options());
        tx.send(pb::SessionRequest { step: Some(draft) })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    still_answers(&mut client, &probe, want, "a session left mid-step").await;

    // A batch likewise: a sequence started, then drafted, and the stream left.
    {
        let (tx, rx) = mpsc::channel(4);
        let mut results = client
            .batch(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let start = pb::SequenceStep {
            id: 1,
            start: Some(pb::SessionStart {
                context: context.clone(),
                ..Default::default()
            }),
            ..Default::default()
        };
        tx.send(pb::BatchStep {
            sequences: vec![start],
        })
        .await
        .unwrap();
        let started = results.message().await.unwrap().unwrap();
        assert!(started.sequences[0].error.is_none(), "{started:?}");
        let draft = pb::SequenceStep {
            id: 1,
            draft: Some(draft_options()),
            ..Default::default()
        };
        tx.send(pb::BatchStep {
            sequences: vec![draft],
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    still_answers(&mut client, &probe, want, "a batch left mid-step").await;
}
