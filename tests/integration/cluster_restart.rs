//! Shard servers restarted under a router (issue 52, item 4). A rolling restart under load: every
//! shard server of a set of 3 shards × 2 replicas is stopped (SIGTERM: it drains, finishing its
//! calls in flight) and started again at the same address, one at a time, while a steady workload
//! of counts and ∞-gram distributions runs through a router. The router fails over to each
//! shard's other replica: not one call fails, and every answer is the single index's. And the live
//! index across replicas killed outright: what a router acknowledged is on every replica of its
//! namespace's owner.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::server::pb;
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use super::cluster::{build_set, router, serve, wait_ready, Process};
use crate::common::server::{add, connect, draftable, free_port, random_documents, spawn_serve};

/// A shard server over `index` listening at `bind`, its live index kept in `live` (off without).
async fn shard_at(
    dir: &Path,
    name: &str,
    index: &Path,
    bind: SocketAddr,
    live: Option<&Path>,
) -> Process {
    let path = dir.join(format!("{name}.toml"));
    let live = match live {
        Some(data) => format!("data_dir = \"{}\"", data.display()),
        None => "enabled = false".into(),
    };
    let config = format!(
        "bind = \"{bind}\"\nindex = \"{}\"\n[cluster]\nrole = \"shard\"\n[live]\n{live}\n",
        index.display()
    );
    std::fs::write(&path, config).unwrap();
    let (child, addr) = spawn_serve(&path).await;
    assert_eq!(addr, bind);
    Process::of(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_of_every_shard_server_fails_no_call() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, shard_dirs) = build_set(dir.path());
    let single = Index::open(&whole, &OpenOptions::default()).unwrap();
    let prompts: Vec<Vec<u32>> = single
        .documents()
        .take(50)
        .map(|d| d[..d.len().min(6)].to_vec())
        .collect();
    let want: Vec<(u64, u64)> = prompts
        .iter()
        .map(|p| {
            let ntd = single.infgram_ntd(p, None).unwrap();
            (single.count(&p[..2]).unwrap(), ntd.ntd.prompt_cnt)
        })
        .collect();

    // Two replicas of each shard, at addresses they keep across restarts.
    let mut servers = Vec::new();
    for (k, d) in shard_dirs.iter().enumerate() {
        for r in 0..2 {
            let bind = free_port();
            let child = shard_at(dir.path(), &format!("s{k}r{r}"), d, bind, None).await;
            servers.push((d.clone(), format!("s{k}r{r}"), bind, Some(child)));
        }
    }
    let list: Vec<String> = servers
        .iter()
        .map(|(_, _, a, _)| format!("\"{a}\""))
        .collect();
    let toml = format!(
        "[cluster]\nrole = \"router\"\nshards = [{}]\nshard_timeout_ms = 2000\nrefresh_secs = 1\n",
        list.join(", ")
    );
    let (_router, addr) = serve(dir.path(), "router", &toml).await;
    let channel = connect(addr).await;
    wait_ready(&channel, ServingStatus::Serving).await;

    // The steady workload: one call after another, every answer checked.
    let done = Arc::new(AtomicBool::new(false));
    let workload = {
        let (done, mut client) = (Arc::clone(&done), SidecarClient::new(channel.clone()));
        tokio::spawn(async move {
            let (mut calls, mut failed) = (0usize, Vec::new());
            while !done.load(Ordering::Relaxed) {
                for (p, &(count, prompt_cnt)) in prompts.iter().zip(&want) {
                    let got = client
                        .count(pb::CountRequest {
                            ids: p[..2].to_vec(),
                            ..Default::default()
                        })
                        .await
                        .map(|a| a.into_inner().count);
                    match got {
                        Ok(got) => assert_eq!(got, count, "{p:?}"),
                        Err(status) => failed.push(status),
                    }
                    let got = client
                        .next_token_distribution(pb::NextTokenDistributionRequest {
                            prompt: p.clone(),
                            infinite: true,
                            ..Default::default()
                        })
                        .await
                        .map(|a| a.into_inner().prompt_cnt);
                    match got {
                        Ok(got) => assert_eq!(got, prompt_cnt, "{p:?}"),
                        Err(status) => failed.push(status),
                    }
                    calls += 2;
                }
            }
            (calls, failed)
        })
    };

    // Each server in turn: stopped, started again at its address, described again by the router.
    for (index, name, bind, child) in &mut servers {
        let stopping = child.take().unwrap();
        tokio::task::spawn_blocking(move || stopping.terminate())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        *child = Some(shard_at(dir.path(), name, index, *bind, None).await);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        wait_ready(&channel, ServingStatus::Serving).await;
    }
    done.store(true, Ordering::Relaxed);
    let (calls, failed) = workload.await.unwrap();
    assert!(calls > 200, "only {calls} calls ran");
    assert!(
        failed.is_empty(),
        "{} of {calls} calls failed: {failed:?}",
        failed.len()
    );
}

/// Documents a router acknowledged went to one replica of the namespace's owner shard (the first
/// that answered): with that replica killed, the other drafted none of them. Now each replica
/// takes every append before it is acknowledged, so either drafts them; while one is down the
/// append is refused by name, and its retry (same request id) after the restart adds it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_documents_are_on_every_replica_of_their_owner() {
    let dir = tempfile::tempdir().unwrap();
    let (_, shard_dirs) = build_set(dir.path());
    let mut replicas: Vec<Replica> = Vec::new();
    for (k, d) in shard_dirs.iter().enumerate() {
        for r in 0..2 {
            let (name, bind) = (format!("s{k}r{r}"), free_port());
            let live = dir.path().join(format!("{name}-live"));
            let child = shard_at(dir.path(), &name, d, bind, Some(&live)).await;
            replicas.push((d.clone(), name, bind, live, Some(child)));
        }
    }
    let list: Vec<String> = replicas.iter().map(|r| r.2.to_string()).collect();
    let (_router, mut client, channel) = router(dir.path(), "router", &list, "").await;
    let first = random_documents(41, 4);
    client
        .add_documents(add("ns", &first, "first"))
        .await
        .unwrap();
    // A router that knows one replica of each shard (the other gone from its DNS name while it
    // restarts, say) refuses appends rather than acknowledging them on one replica alone.
    let half: Vec<String> = list.iter().step_by(2).map(|a| format!("\"{a}\"")).collect();
    let toml = format!(
        "[cluster]\nrole = \"router\"\nshards = [{}]\nrefresh_secs = 1\nreplicas_per_shard = 2\n",
        half.join(", ")
    );
    let (_half_router, half_addr) = serve(dir.path(), "half", &toml).await;
    let half_channel = connect(half_addr).await;
    wait_ready(&half_channel, ServingStatus::Serving).await;
    let refused = SidecarClient::new(half_channel)
        .add_documents(add("ns", &first, "first"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("knows 1 of its 2 replicas"),
        "{refused:?}"
    );

    kill(&mut replicas, 0);
    assert_eq!(draftable(&mut client, "ns", &first).await, 4);
    let second = random_documents(42, 4);
    let refused = client
        .add_documents(add("ns", &second, "second"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("did not take the write"),
        "{refused:?}"
    );
    assert!(refused.message().contains(" of 3"), "{refused:?}");

    for (index, name, bind, live, child) in replicas.iter_mut().step_by(2) {
        *child = Some(shard_at(dir.path(), name, index, *bind, Some(live)).await);
    }
    wait_ready(&channel, ServingStatus::Serving).await;
    let retried = retry(&mut client, add("ns", &second, "second")).await;
    // The surviving replica had taken the first try; the restarted one takes it now.
    assert!(!retried.repeated, "{retried:?}");
    // Both replicas of the owner hold every document once; no other replica holds any.
    let mut held = Vec::new();
    for (_, _, bind, _, _) in &replicas {
        let info = connect(*bind).await;
        let info = SidecarClient::new(info)
            .info(pb::InfoRequest {})
            .await
            .unwrap();
        held.push(info.into_inner().live.map_or(0, |l| l.tokens));
    }
    let owner: Vec<usize> = (0..held.len()).filter(|&j| held[j] > 0).collect();
    assert_eq!(owner.len(), 2, "{held:?}");
    assert_eq!((owner[0] % 2, owner[1]), (0, owner[0] + 1), "{held:?}");
    assert!(owner.iter().all(|&j| held[j] == 8 * 300), "{held:?}");
    kill(&mut replicas, 1);
    assert_eq!(draftable(&mut client, "ns", &first).await, 4);
    assert_eq!(draftable(&mut client, "ns", &second).await, 4);
}

/// A shard replica: its index, name, address, live data folder and process while it runs.
type Replica = (PathBuf, String, SocketAddr, PathBuf, Option<Process>);

/// Kills (SIGKILL) replica `r` of every shard.
fn kill(replicas: &mut [Replica], r: usize) {
    for (_, _, _, _, child) in replicas.iter_mut().skip(r).step_by(2) {
        drop(child.take());
    }
}

/// `request` sent until the router's set takes it (its replicas are described again after a
/// restart within `refresh_secs`).
async fn retry(
    client: &mut SidecarClient<Channel>,
    request: pb::AddDocumentsRequest,
) -> pb::AddDocumentsResponse {
    for _ in 0..100 {
        match client.add_documents(request.clone()).await {
            Ok(answer) => return answer.into_inner(),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("the append was never taken");
}
