//! Which shard a server is, checked per call and per refresh (issue 52, item 2). An address the
//! router took for one shard that now reaches another (a pod IP reused before the next refresh;
//! here a link re-pointed) refuses the router's calls: the shard is unavailable (a router
//! fails over to its next replica, as from one that is down), never answered with the other
//! shard's counts; the refusals are counted against the address. A server of another set at a
//! router's address is left out of the set, named in `Info`, instead of keeping the router from
//! forming it.

use std::net::SocketAddr;

use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::server::pb;
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use super::cluster::{build_set, serve, shard_server, wait_ready};
use crate::common::netns::{Faults, Link};
use crate::common::server::{connect, free_port, sample, scrape};

/// A router over `shards` that describes them once (no refresh within the test).
async fn router(
    dir: &std::path::Path,
    name: &str,
    shards: &[String],
    metrics: SocketAddr,
) -> (super::cluster::Process, SidecarClient<Channel>) {
    let list: Vec<String> = shards.iter().map(|a| format!("\"{a}\"")).collect();
    let toml = format!(
        "metrics_bind = \"{metrics}\"\n[cluster]\nrole = \"router\"\nshards = [{}]\n\
         shard_timeout_ms = 2000\nrefresh_secs = 3600\n",
        list.join(", ")
    );
    let (process, addr) = serve(dir, name, &toml).await;
    let channel = connect(addr).await;
    wait_ready(&channel, ServingStatus::Serving).await;
    (process, SidecarClient::new(channel))
}

async fn counts(client: &mut SidecarClient<Channel>, ngrams: &[Vec<u32>]) -> Vec<u64> {
    let mut out = Vec::new();
    for ids in ngrams {
        let answer = client
            .count(pb::CountRequest {
                ids: ids.clone(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("count {ids:?}: {s:?}"));
        out.push(answer.into_inner().count);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_is_not_the_shard_it_was_taken_for_is_never_relayed() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, shard_dirs) = build_set(dir.path());
    let single = Index::open(&whole, &OpenOptions::default()).unwrap();
    // Unigrams and bigrams of the first documents: each shard holds its own share of them.
    let docs: Vec<Vec<u32>> = single.documents().take(40).collect();
    let ngrams: Vec<Vec<u32>> = docs
        .iter()
        .flat_map(|d| [d[..1].to_vec(), d[1..3].to_vec()])
        .collect();
    let want: Vec<u64> = ngrams.iter().map(|g| single.count(g).unwrap()).collect();

    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for (k, d) in shard_dirs.iter().enumerate() {
        let (process, addr) = shard_server(dir.path(), &format!("shard{k}"), d).await;
        servers.push(process);
        addrs.push(addr);
    }
    let (other_zero, other_zero_addr) = shard_server(dir.path(), "shard0b", &shard_dirs[0]).await;
    servers.push(other_zero);

    // The router reaches shard 1 through a link alone.
    let link = Link::start([127, 0, 0, 1].into(), addrs[1], Faults::default());
    let forwarded = link.addr;
    let metrics = free_port();
    let shards = [
        addrs[0].to_string(),
        forwarded.to_string(),
        addrs[2].to_string(),
    ];
    let (_router, mut client) = router(dir.path(), "router", &shards, metrics).await;
    assert_eq!(counts(&mut client, &ngrams).await, want);

    // The link's address now reaches a server of shard 0: every call is the single index's
    // answer or UNAVAILABLE naming shard 1, never shard 0's counts twice over.
    link.retarget(other_zero_addr);
    let mut refused = 0;
    for ids in ngrams.iter().take(20) {
        match client
            .count(pb::CountRequest {
                ids: ids.clone(),
                ..Default::default()
            })
            .await
        {
            Ok(answer) => assert_eq!(answer.into_inner().count, single.count(ids).unwrap()),
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert!(status.message().contains("shard 1 of 3"), "{status:?}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "the re-pointed address was never called");
    let text = tokio::task::spawn_blocking(move || scrape(metrics))
        .await
        .unwrap();
    let line = format!("sidecar_shard_wrong_identity_calls_total{{replica=\"{forwarded}\"}}");
    assert!(sample(&text, &line) >= 1.0, "{text}");
    let info = client.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert!(
        info.replicas_down.contains(&forwarded.to_string()),
        "{:?}",
        info.replicas_down
    );

    // A router whose addresses include a server of another set (the whole index: a set of
    // one) forms the set without it, names it, and answers as the single index.
    let strays_metrics = free_port();
    let with_stray = [
        addrs[0].to_string(),
        addrs[1].to_string(),
        addrs[2].to_string(),
        other_zero_addr.to_string(),
    ];
    let (_whole_server, whole_addr) = shard_server(dir.path(), "whole", &whole).await;
    let with_stray = [with_stray.as_slice(), &[whole_addr.to_string()]].concat();
    let (_second, mut second) = router(dir.path(), "second", &with_stray, strays_metrics).await;
    assert_eq!(counts(&mut second, &ngrams).await, want);
    let info = second.info(pb::InfoRequest {}).await.unwrap().into_inner();
    let stray = format!("{whole_addr} (left out of the set: ");
    assert!(
        info.replicas_down.iter().any(|r| r.starts_with(&stray)),
        "{:?}",
        info.replicas_down
    );
    let text = tokio::task::spawn_blocking(move || scrape(strays_metrics))
        .await
        .unwrap();
    assert_eq!(
        sample(&text, "sidecar_shard_stray_replicas "),
        1.0,
        "{text}"
    );
}
