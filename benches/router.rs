//! What a router adds over a single sidecar (`cargo bench --bench router`; needs the assets of
//! `scripts/run-default.sh`). The first 4,000 mini-Pile train documents are built whole and as sets
//! of 1, 3 and 8 shards (`--shard K/N`); every server runs in this process on loopback. For `Count`,
//! `NextTokenDistribution` (the ∞-gram, exact), `Mix` (a caller's top-k log-probs) and a session
//! step (append a token, mix) it measures p50/p99 of sequential calls and the throughput of 8
//! concurrent clients, against the single sidecar over the whole index in the same run. Writes `eval/results/cluster.json`; eval/CLUSTER.md discusses it.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{assets, build_index, loopback_floor, measure, neural_top_k};
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::server::config::{ClusterSection, Role, ServeConfig};
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::{self, mix_request, session_request::Step};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const DOCUMENTS: usize = 4_000;
const CALLS: usize = 2_000;
const CLIENTS: usize = 8;
const THROUGHPUT_FOR: Duration = Duration::from_secs(3);

fn config(index: PathBuf, cluster: ClusterSection) -> ServeConfig {
    let mut c: ServeConfig = toml::from_str("[live]\nenabled = false\n").unwrap();
    c.index = index;
    c.cluster = cluster;
    c
}

/// Serves `config` on a loopback port in this process; the sender stops it.
async fn start(config: ServeConfig) -> (std::net::SocketAddr, oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(infini_sidecar::server::serve(config, listener, async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

async fn client(addr: std::net::SocketAddr) -> SidecarClient<Channel> {
    for _ in 0..500 {
        if let Ok(c) = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
        {
            let mut client = SidecarClient::new(c);
            if client.info(pb::InfoRequest {}).await.is_ok() {
                return client;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{addr} never answered");
}

/// Queries from the corpus: 8-token windows of its documents.
fn prompts(index: &Index, n: usize) -> Vec<Vec<u32>> {
    let docs: Vec<Vec<u32>> = index.documents().filter(|d| d.len() > 64).collect();
    (0..n)
        .map(|i| {
            let d = &docs[(i * 7919) % docs.len()];
            let at = (i * 104_729) % (d.len() - 8);
            d[at..at + 8].to_vec()
        })
        .collect()
}

#[derive(Clone, Copy)]
enum Call {
    Count,
    InfgramNtd,
    /// `Mix` of the ∞-gram after the prompt with a caller's top-32 log-probs at a fixed λ.
    Mix,
    /// One step of a decoding session: append a token, then mix as `Mix` does.
    SessionStep,
}

const CALLS_MEASURED: [(&str, Call); 4] = [
    ("count", Call::Count),
    ("infgram_ntd", Call::InfgramNtd),
    ("mix", Call::Mix),
    ("session_step", Call::SessionStep),
];

/// One client: its connection, and its session once it has one.
struct Caller {
    client: SidecarClient<Channel>,
    session: Option<(
        mpsc::Sender<pb::SessionRequest>,
        tonic::Streaming<pb::SessionResponse>,
    )>,
}

impl Caller {
    async fn new(addr: std::net::SocketAddr) -> Self {
        Self {
            client: client(addr).await,
            session: None,
        }
    }

    async fn call(&mut self, what: Call, prompt: &[u32]) {
        match what {
            Call::Count => {
                self.client
                    .count(pb::CountRequest {
                        ids: prompt[4..].to_vec(),
                        allow_partial: false,
                    })
                    .await
                    .unwrap();
            }
            Call::InfgramNtd => {
                self.client
                    .next_token_distribution(pb::NextTokenDistributionRequest {
                        prompt: prompt.to_vec(),
                        infinite: true,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
            }
            Call::Mix => {
                self.client
                    .mix(pb::MixRequest {
                        context: prompt.to_vec(),
                        neural: Some(mix_request::Neural::TopKLogprobs(neural_top_k())),
                        lambda: Some(mix_request::Lambda::FixedLambda(0.3)),
                        top_k: 8,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
            }
            Call::SessionStep => self.session_step(prompt).await,
        }
    }

    /// Appends the prompt's last token to this caller's session (opened on the prompt), then mixes.
    async fn session_step(&mut self, prompt: &[u32]) {
        if self.session.is_none() {
            let (tx, rx) = mpsc::channel(2);
            let replies = self
                .client
                .session(ReceiverStream::new(rx))
                .await
                .unwrap()
                .into_inner();
            self.session = Some((tx, replies));
            self.send(Step::Start(pb::SessionStart {
                context: prompt.to_vec(),
                ..Default::default()
            }))
            .await;
        }
        self.send(Step::Append(pb::SessionAppend {
            tokens: prompt[prompt.len() - 1..].to_vec(),
        }))
        .await;
        self.send(Step::Mix(pb::SessionMix {
            neural: Some(pb::session_mix::Neural::TopKLogprobs(neural_top_k())),
            lambda: Some(pb::session_mix::Lambda::FixedLambda(0.3)),
            top_k: 8,
            ..Default::default()
        }))
        .await;
    }

    async fn send(&mut self, step: Step) {
        let Some((tx, replies)) = &mut self.session else {
            return;
        };
        tx.send(pb::SessionRequest { step: Some(step) })
            .await
            .unwrap();
        let answer = replies.message().await.unwrap().unwrap();
        assert!(
            !matches!(answer.result, Some(pb::session_response::Result::Error(_))),
            "{answer:?}"
        );
    }
}

/// Calls per second of `CLIENTS` clients, each on its own connection, calling in a loop.
async fn throughput(addr: std::net::SocketAddr, what: Call, prompts: &[Vec<u32>]) -> f64 {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let mut caller = Caller::new(addr).await;
        let prompts = prompts.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut done = 0usize;
            while start.elapsed() < THROUGHPUT_FOR {
                caller
                    .call(what, &prompts[(c * 131 + done) % prompts.len()])
                    .await;
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

async fn profile(addr: std::net::SocketAddr, prompts: &[Vec<u32>]) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (name, what) in CALLS_MEASURED {
        let caller = Arc::new(Mutex::new(Caller::new(addr).await));
        let latency = measure(CALLS, |i| {
            let (caller, p) = (Arc::clone(&caller), prompts[i % prompts.len()].clone());
            async move { caller.lock().await.call(what, &p).await }
        })
        .await;
        let per_second = throughput(addr, what, prompts).await;
        out.insert(
            name.into(),
            json!({"sequential": latency, "clients": CLIENTS, "concurrent_per_second": per_second}),
        );
    }
    serde_json::Value::Object(out)
}

fn overhead(single: &serde_json::Value, routed: &serde_json::Value) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (call, _) in CALLS_MEASURED {
        let at = |v: &serde_json::Value, p: &str| v[call]["sequential"][p].as_f64().unwrap();
        out.insert(
            call.into(),
            json!({
                "p50_us": at(routed, "p50_us") - at(single, "p50_us"),
                "p99_us": at(routed, "p99_us") - at(single, "p99_us"),
                "throughput_ratio": routed[call]["concurrent_per_second"].as_f64().unwrap()
                    / single[call]["concurrent_per_second"].as_f64().unwrap(),
            }),
        );
    }
    serde_json::Value::Object(out)
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(assets().join("minipile/train.jsonl")).unwrap();
    let input = dir.path().join("docs.jsonl");
    std::fs::write(
        &input,
        text.lines().take(DOCUMENTS).collect::<Vec<_>>().join("\n"),
    )
    .unwrap();
    let single_dir = dir.path().join("single");
    build_index(&input, &single_dir, None);
    let index = Index::open(&single_dir, &OpenOptions::default()).unwrap();
    let prompts = prompts(&index, 512);
    let tokens = index.total_tokens();
    drop(index);
    let report = runtime.block_on(async {
        let (single_addr, _stop_single) =
            start(config(single_dir.clone(), ClusterSection::default())).await;
        let single = profile(single_addr, &prompts).await;
        eprintln!("single: {single}");
        let floor = loopback_floor(2000);
        eprintln!("loopback floor: {floor}");
        let mut sets = serde_json::Map::new();
        for n in [1usize, 3, 8] {
            let mut stops = Vec::new();
            let mut addrs = Vec::new();
            for k in 0..n {
                let out = dir.path().join(format!("set{n}-{k}"));
                build_index(&input, &out, Some((k, n)));
                let shard = ClusterSection {
                    role: Role::Shard,
                    ..ClusterSection::default()
                };
                let (addr, stop) = start(config(out, shard)).await;
                addrs.push(addr.to_string());
                stops.push(stop);
            }
            let router = ClusterSection {
                role: Role::Router,
                shards: addrs,
                ..ClusterSection::default()
            };
            let (router_addr, stop) = start(config(PathBuf::new(), router)).await;
            stops.push(stop);
            let routed = profile(router_addr, &prompts).await;
            eprintln!("{n} shards: {routed}");
            sets.insert(
                n.to_string(),
                json!({"router": routed, "overhead_vs_single": overhead(&single, &routed)}),
            );
        }
        json!({
            "bench": "router",
            "cpu": infini_sidecar::cpu::CpuInfo::detect().summary(),
            "documents": DOCUMENTS,
            "tokens": tokens,
            "loopback_floor": floor,
            "single": single,
            "shards": sets,
        })
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/results/cluster.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap() + "\n").unwrap();
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
