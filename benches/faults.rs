//! Routers and shards on a real network with faulty links (`cargo bench --bench faults`, as root;
//! needs the assets of `scripts/run-default.sh`). The first 2,000 mini-Pile train documents are
//! built whole and as 3 shards; a router, 3 shards × 2 replicas and a single sidecar over the whole
//! index each run in a network namespace of their own (`tests/integration/common/netns.rs`), and
//! every link, the client's included, delays each chunk 1 ms ± 0.2 ms and ends its connection at
//! 1% of chunks. For `Count`, `NextTokenDistribution` (the ∞-gram) and a session step (append a
//! token, mix with a caller's top-k at a fixed λ) it measures p50/p99 of sequential calls through
//! the router and to the single sidecar, and the floor: the same `Count` to one shard server over
//! one such link (one bare gRPC call of the same size). The router's added p50 (router − single) is
//! set against that floor. Calls that fail (a dropped connection the client sees) are counted, not
//! timed. Writes `eval/results/faults.json`; eval/CLUSTER.md discusses it.

mod common;
// The bench uses part of the tests' harness.
#[allow(dead_code)]
#[path = "../tests/integration/common/netns.rs"]
mod netns;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::{self, session_request::Step};
use netns::{Faults, Host, Link, Net, Server};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const DOCUMENTS: usize = 2_000;
const CALLS: usize = 1_000;
const PORT: u16 = 50051;
const FAULTS: Faults = Faults {
    latency: Duration::from_micros(1_000),
    jitter: Duration::from_micros(200),
    drop_share: 0.01,
};

/// `infini-sidecar serve` inside `host` with `toml` (its `bind` added), once it listens.
fn serve_on(dir: &Path, host: &Host, name: &str, toml: &str) -> Server {
    let path = dir.join(format!("{name}.toml"));
    let config = format!(
        "bind = \"{}\"\n{toml}[live]\nenabled = false\n",
        host.at(PORT)
    );
    std::fs::write(&path, config).unwrap();
    Server::start(host.command(env!("CARGO_BIN_EXE_infini-sidecar")), &path)
}

async fn client(addr: SocketAddr) -> SidecarClient<Channel> {
    loop {
        match SidecarClient::connect(format!("http://{addr}")).await {
            Ok(c) => return c,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Waits until a `Count` through `addr` answers (a router has formed its set).
async fn until_answering(addr: SocketAddr) {
    let mut c = client(addr).await;
    let started = Instant::now();
    while c
        .count(pb::CountRequest {
            ids: vec![1],
            allow_partial: false,
        })
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{addr} never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[derive(Clone, Copy)]
enum Call {
    Count,
    InfgramNtd,
    SessionStep,
}

type Session = (
    mpsc::Sender<pb::SessionRequest>,
    tonic::Streaming<pb::SessionResponse>,
);

/// One call; `Err` when it failed (a session that failed is opened again at the next step).
async fn call(
    c: &mut SidecarClient<Channel>,
    session: &mut Option<Session>,
    what: Call,
    prompt: &[u32],
) -> Result<(), String> {
    let e = |s: tonic::Status| s.to_string();
    match what {
        Call::Count => c
            .count(pb::CountRequest {
                ids: prompt[4..].to_vec(),
                allow_partial: false,
            })
            .await
            .map(|_| ())
            .map_err(e),
        Call::InfgramNtd => c
            .next_token_distribution(pb::NextTokenDistributionRequest {
                prompt: prompt.to_vec(),
                infinite: true,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(e),
        Call::SessionStep => {
            if session.is_none() {
                let (tx, rx) = mpsc::channel(2);
                let replies = c
                    .session(ReceiverStream::new(rx))
                    .await
                    .map_err(e)?
                    .into_inner();
                let mut opened = (tx, replies);
                step(
                    &mut opened,
                    Step::Start(pb::SessionStart {
                        context: prompt.to_vec(),
                        ..Default::default()
                    }),
                )
                .await?;
                *session = Some(opened);
            }
            let Some(open) = session.as_mut() else {
                return Err("no session".into());
            };
            let steps = [
                Step::Append(pb::SessionAppend {
                    tokens: prompt[prompt.len() - 1..].to_vec(),
                }),
                Step::Mix(pb::SessionMix {
                    neural: Some(pb::session_mix::Neural::TopKLogprobs(common::neural_top_k())),
                    lambda: Some(pb::session_mix::Lambda::FixedLambda(0.3)),
                    top_k: 8,
                    ..Default::default()
                }),
            ];
            for s in steps {
                if let Err(why) = step(open, s).await {
                    *session = None;
                    return Err(why);
                }
            }
            Ok(())
        }
    }
}

async fn step(session: &mut Session, step: Step) -> Result<(), String> {
    let (tx, replies) = session;
    tx.send(pb::SessionRequest { step: Some(step) })
        .await
        .map_err(|e| e.to_string())?;
    match replies.message().await {
        Ok(Some(pb::SessionResponse {
            result: Some(pb::session_response::Result::Error(e)),
            ..
        })) => Err(format!("{e:?}")),
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err("the session ended".into()),
        Err(s) => Err(s.to_string()),
    }
}

/// p50/p99 (µs) of the calls that answered, and how many failed.
async fn measure(addr: SocketAddr, what: Call, prompts: &[Vec<u32>]) -> serde_json::Value {
    let mut c = client(addr).await;
    let mut session = None;
    let (mut micros, mut failed) = (Vec::new(), 0usize);
    for i in 0..CALLS + CALLS / 10 {
        let t = Instant::now();
        let ok = call(&mut c, &mut session, what, &prompts[i % prompts.len()]).await;
        match (ok, i >= CALLS / 10) {
            (Ok(()), true) => micros.push(t.elapsed().as_secs_f64() * 1e6),
            (Err(_), true) => failed += 1,
            _ => {}
        }
    }
    assert!(!micros.is_empty(), "every call through {addr} failed");
    micros.sort_by(f64::total_cmp);
    let at = |p: f64| micros[((micros.len() - 1) as f64 * p).round() as usize];
    json!({"calls": CALLS, "failed": failed, "p50_us": at(0.5), "p99_us": at(0.99)})
}

fn main() {
    let net = match Net::new(8) {
        Ok(net) => net,
        Err(why) => {
            println!("faults: skipped, network namespaces cannot be made here ({why})");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(common::assets().join("minipile/train.jsonl")).unwrap();
    let input = dir.path().join("docs.jsonl");
    let lines: Vec<&str> = text.lines().take(DOCUMENTS).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let whole = dir.path().join("whole");
    common::build_index(&input, &whole, None);
    let shards: Vec<PathBuf> = (0..3).map(|k| dir.path().join(format!("s{k}"))).collect();
    for (k, s) in shards.iter().enumerate() {
        common::build_index(&input, s, Some((k, 3)));
    }
    let index = Index::open(&whole, &OpenOptions::default()).unwrap();
    let docs: Vec<Vec<u32>> = index.documents().filter(|d| d.len() > 64).collect();
    let prompts: Vec<Vec<u32>> = (0..256)
        .map(|i| {
            let d = &docs[(i * 7919) % docs.len()];
            let at = (i * 104_729) % (d.len() - 8);
            d[at..at + 8].to_vec()
        })
        .collect();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut children = Vec::new();
    // Hosts: 0 the router, 1..=6 shard k's replica r at 1 + 2k + r, 7 the single sidecar.
    let shard_toml = |index: &Path| {
        format!(
            "index = \"{}\"\n[cluster]\nrole = \"shard\"\n",
            index.display()
        )
    };
    for (k, s) in shards.iter().enumerate() {
        for r in 0..2 {
            let host = net.host(1 + 2 * k + r);
            children.push(serve_on(
                dir.path(),
                host,
                &format!("s{k}r{r}"),
                &shard_toml(s),
            ));
        }
    }
    let single = net.host(7);
    children.push(serve_on(
        dir.path(),
        single,
        "single",
        &format!("index = \"{}\"\n", whole.display()),
    ));
    let router = net.host(0);
    let results = runtime.block_on(async {
        let mut links = Vec::new();
        for i in 1..=6 {
            links.push(Link::start(router.here.into(), net.host(i).at(PORT), FAULTS));
        }
        let shard_list: Vec<String> = links
            .iter()
            .map(|l| format!("\"{}\"", l.addr))
            .collect();
        let toml = format!(
            "[cluster]\nrole = \"router\"\nshards = [{}]\nshard_timeout_ms = 2000\nrefresh_secs = 2\n",
            shard_list.join(", ")
        );
        children.push(serve_on(dir.path(), router, "router", &toml));
        // The client's own links: to the router, to the single sidecar, to one shard server.
        let loopback = IpAddr::from([127, 0, 0, 1]);
        let to_router = Link::start(loopback, router.at(PORT), FAULTS);
        let to_single = Link::start(loopback, single.at(PORT), FAULTS);
        let to_shard = Link::start(loopback, net.host(1).at(PORT), FAULTS);
        let here = |l: &Link| l.addr;
        until_answering(here(&to_router)).await;
        until_answering(here(&to_single)).await;
        let mut out = serde_json::Map::new();
        let bare = measure(here(&to_shard), Call::Count, &prompts).await;
        for (name, what) in [
            ("count", Call::Count),
            ("infgram_ntd", Call::InfgramNtd),
            ("session_step", Call::SessionStep),
        ] {
            let routed = measure(here(&to_router), what, &prompts).await;
            let alone = measure(here(&to_single), what, &prompts).await;
            let added = routed["p50_us"].as_f64().unwrap() - alone["p50_us"].as_f64().unwrap();
            let floor = bare["p50_us"].as_f64().unwrap();
            println!(
                "{name:>13}: router p50 {:.0} µs p99 {:.0} µs ({} failed) | single p50 {:.0} µs p99 {:.0} µs ({} failed) | added p50 {added:.0} µs = {:.2}× one bare call ({floor:.0} µs)",
                routed["p50_us"].as_f64().unwrap(),
                routed["p99_us"].as_f64().unwrap(),
                routed["failed"],
                alone["p50_us"].as_f64().unwrap(),
                alone["p99_us"].as_f64().unwrap(),
                alone["failed"],
                added / floor
            );
            out.insert(
                name.into(),
                json!({"router": routed, "single": alone, "added_p50_us": added, "added_over_bare": added / floor}),
            );
        }
        out.insert("bare_count_one_link".into(), bare);
        out
    });
    drop(children);
    let report = json!({
        "cpu": infini_sidecar::cpu::CpuInfo::detect().summary(),
        "documents": DOCUMENTS,
        "faults": {
            "latency_us": FAULTS.latency.as_micros() as u64,
            "jitter_us": FAULTS.jitter.as_micros() as u64,
            "dropped_chunk_share": FAULTS.drop_share,
        },
        "layout": "router, 3 shards x 2 replicas, single sidecar: a network namespace each",
        "calls": results,
    });
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("eval/results/faults.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap() + "\n").unwrap();
    println!("wrote {}", path.display());
}
