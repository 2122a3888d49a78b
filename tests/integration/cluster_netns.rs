//! Routers and shards on a real network (issue 52, item 1): a router and three shard servers each
//! in a network namespace of its own, every router-to-shard link through a faulty [`Link`] of
//! 1 ms ± 0.2 ms. The router answers as the single index; a cut link makes its shard UNAVAILABLE
//! by name (or the answer partial and flagged, when allowed), and the shard comes back when the
//! link heals. Skipped, with the reason, where namespaces cannot be made (not root).

use std::path::Path;
use std::time::Duration;

use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::server::pb;
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use super::cluster::{build_set, wait_ready, Process};
use crate::common::netns::{Faults, Host, Link, Net};
use crate::common::server::{connect, spawn_serve_by};

const PORT: u16 = 50051;

/// `infini-sidecar serve` inside `host`, on its address, with `toml` (its `bind` added).
async fn serve_on(dir: &Path, host: &Host, name: &str, toml: &str) -> Process {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, format!("bind = \"{}\"\n{toml}", host.at(PORT))).unwrap();
    let command = host.command(env!("CARGO_BIN_EXE_infini-sidecar"));
    let (child, addr, _) = spawn_serve_by(command, &path, &[]).await;
    assert_eq!(addr, host.at(PORT));
    Process::of(child)
}

async fn count(
    client: &mut SidecarClient<Channel>,
    ids: &[u32],
    allow_partial: bool,
) -> Result<pb::CountResponse, tonic::Status> {
    let request = pb::CountRequest {
        ids: ids.to_vec(),
        allow_partial,
    };
    client.count(request).await.map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_router_across_namespaces_answers_as_one_index_and_names_a_cut_shard() {
    let net = match Net::new(4) {
        Ok(net) => net,
        Err(why) => {
            eprintln!("skipped: network namespaces cannot be made here ({why})");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let (whole, shard_dirs) = build_set(dir.path());
    let single = Index::open(&whole, &OpenOptions::default()).unwrap();
    let ngrams: Vec<Vec<u32>> = single
        .documents()
        .take(30)
        .flat_map(|d| [d[..1].to_vec(), d[2..4].to_vec()])
        .collect();

    let router_host = net.host(0);
    let mut servers = Vec::new();
    let mut links = Vec::new();
    for (k, index) in shard_dirs.iter().enumerate() {
        let toml = format!(
            "index = \"{}\"\n[cluster]\nrole = \"shard\"\n[live]\nenabled = false\n",
            index.display()
        );
        let host = net.host(k + 1);
        servers.push(serve_on(dir.path(), host, &format!("shard{k}"), &toml).await);
        let faults = Faults {
            latency: Duration::from_micros(1000),
            jitter: Duration::from_micros(200),
            drop_share: 0.0,
        };
        links.push(Link::start(router_host.here.into(), host.at(PORT), faults));
    }
    let shards: Vec<String> = links.iter().map(|l| format!("\"{}\"", l.addr)).collect();
    let toml = format!(
        "[cluster]\nrole = \"router\"\nshards = [{}]\nshard_timeout_ms = 2000\nrefresh_secs = 1\n\
         [live]\nenabled = false\n",
        shards.join(", ")
    );
    let _router = serve_on(dir.path(), router_host, "router", &toml).await;
    let channel = connect(router_host.at(PORT)).await;
    wait_ready(&channel, ServingStatus::Serving).await;
    let mut client = SidecarClient::new(channel.clone());

    for ids in &ngrams {
        let got = count(&mut client, ids, false).await.unwrap();
        assert_eq!(got.count, single.count(ids).unwrap(), "{ids:?}");
    }

    // A partition between the router and shard 1.
    links[1].cut();
    let status = count(&mut client, &ngrams[0], false).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shard 1 of 3"), "{status:?}");
    let partial = count(&mut client, &ngrams[0], true).await.unwrap();
    assert_eq!(partial.partial.unwrap().missing_shards, vec![1]);
    assert!(partial.count <= single.count(&ngrams[0]).unwrap());
    wait_ready(&channel, ServingStatus::NotServing).await;

    // Healed: the router describes shard 1 again and answers whole.
    links[1].heal();
    wait_ready(&channel, ServingStatus::Serving).await;
    for ids in &ngrams {
        let got = count(&mut client, ids, false).await.unwrap();
        assert_eq!(got.count, single.count(ids).unwrap(), "{ids:?}");
    }
    drop(servers);
}
