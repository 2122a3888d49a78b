//! A rolling restart under load (issue 52, item 4): every shard server of a set of 3 shards × 2
//! replicas is stopped (SIGTERM: it drains, finishing its calls in flight) and started again at the
//! same address, one at a time, while a steady workload of counts and ∞-gram distributions runs
//! through a router. The router fails over to each shard's other replica: not one call fails, and
//! every answer is the single index's.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::server::pb;
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use tonic_health::pb::health_check_response::ServingStatus;

use super::cluster::{build_set, serve, wait_ready, Process};
use crate::common::server::{connect, free_port, spawn_serve};

/// A shard server over `index` listening at `bind`.
async fn shard_at(dir: &Path, name: &str, index: &Path, bind: SocketAddr) -> Process {
    let path = dir.join(format!("{name}.toml"));
    let config = format!(
        "bind = \"{bind}\"\nindex = \"{}\"\n[cluster]\nrole = \"shard\"\n[live]\nenabled = false\n",
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
            let child = shard_at(dir.path(), &format!("s{k}r{r}"), d, bind).await;
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
        *child = Some(shard_at(dir.path(), name, index, *bind).await);
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
