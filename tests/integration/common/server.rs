//! A real sidecar on a loopback port for the service tests: an index over real mini-Pile documents,
//! a mixing file, and a tonic client.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use infini_sidecar::index::build::{build, BuildOptions};
use infini_sidecar::index::TokenWidth;
use infini_sidecar::mix::features::GateFeatures;
use infini_sidecar::mix::params::FitRecord;
use infini_sidecar::mix::{Gate, GateOptions, MixingParams, NUM_FEATURES};
use infini_sidecar::server::config::ServeConfig;
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::{self, session_request};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

pub const TOKEN: &str = "s3cret";

/// A serve config file for the real binary (port 0) with a live index in `data_dir`, and `extra` lines
/// of its `[live]` section.
pub fn config_file(dir: &Path, index: &Path, data_dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("serve.toml");
    std::fs::write(
        &path,
        format!(
            "bind = \"127.0.0.1:0\"\nindex = {:?}\n[live]\ndata_dir = {:?}\n{extra}",
            index, data_dir
        ),
    )
    .unwrap();
    path
}

/// An index over 200 real mini-Pile train documents, with the SmolLM2 tokenizer.
pub fn build_index(dir: &Path) -> std::path::PathBuf {
    let tokenizer = super::smollm2_tokenizer();
    let out = dir.join("index");
    let vocab = tokenizer.vocab_size();
    let opts = BuildOptions {
        tokenizer: Some(&tokenizer),
        ..BuildOptions::new(out.clone(), TokenWidth::for_vocab(vocab), 0, vocab)
    };
    let docs = super::minipile_docs("train", 200).into_iter().map(Ok);
    build(docs, &opts).unwrap();
    out
}

/// A mixing file with λ1/λ2 = 0.4/0.05 and a small gate trained on synthetic features.
pub fn write_mixing(dir: &Path) -> std::path::PathBuf {
    let rows: Vec<GateFeatures> = (0..300)
        .map(|i| {
            let mut f = [0.0; NUM_FEATURES];
            f[0] = (i % 7) as f64;
            f
        })
        .collect();
    let targets: Vec<f64> = rows.iter().map(|f| f[0] / 10.0).collect();
    let opts = GateOptions {
        trees: 4,
        min_samples_leaf: 5,
        ..GateOptions::default()
    };
    save_mixing(dir, Gate::train(&rows, &targets, opts).unwrap())
}

/// A mixing file for SmolLM2's tokenizer with λ1/λ2 = 0.4/0.05 and `gate`, in `dir`.
pub fn save_mixing(dir: &Path, gate: Gate) -> std::path::PathBuf {
    let fingerprint = super::smollm2_tokenizer().fingerprint().to_string();
    let params = MixingParams::new(
        "test".into(),
        "test".into(),
        fingerprint,
        (0.4, 0.05),
        Some(gate),
        FitRecord::default(),
    );
    let path = dir.join("mixing.json");
    params.save(&path).unwrap();
    path
}

/// A config over `index`, with the mixing file of [`write_mixing`] and, when `auth`, a bearer token.
pub fn config(dir: &Path, index: PathBuf, auth: bool) -> ServeConfig {
    let env = format!("SIDECAR_TEST_TOKEN_{}", std::process::id());
    std::env::set_var(&env, TOKEN);
    ServeConfig {
        cluster: Default::default(),
        bind: "127.0.0.1:0".parse().unwrap(),
        index,
        sample_ranks: false,
        mixing: Some(write_mixing(dir)),
        model: None,
        model_threads: None,
        cpu: None,
        metrics_bind: None,
        auth_token_env: auth.then_some(env),
        limits: Default::default(),
        live: Default::default(),
    }
}

/// [`config`] with the real SmolLM2 as the sidecar's own model, over a fresh index in `dir`.
pub fn with_model(dir: &Path) -> ServeConfig {
    let index = build_index(dir);
    ServeConfig {
        model: Some(super::smollm2_gguf()),
        ..config(dir, index, false)
    }
}

/// A serving sidecar: its client, the switch that starts its shutdown, and its task.
pub struct Running {
    pub client: SidecarClient<Channel>,
    pub addr: std::net::SocketAddr,
    pub stop: oneshot::Sender<()>,
    pub task: JoinHandle<Result<(), infini_sidecar::server::ServeError>>,
}

pub async fn start(config: ServeConfig) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        infini_sidecar::server::serve(config, listener, async {
            let _ = stopped.await;
        })
        .await
    });
    let client = SidecarClient::new(connect(addr).await);
    Running {
        client,
        addr,
        stop,
        task,
    }
}

/// A channel to `addr`, retried while the server comes up (it loads the index, maybe a model).
pub async fn connect(addr: std::net::SocketAddr) -> Channel {
    for _ in 0..1500 {
        if let Ok(c) = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
        {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the sidecar on {addr} did not come up");
}

pub fn authed<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    r
}

/// A session stream (with the bearer token, which a sidecar without auth ignores): steps go in through the sender, answers come out of the stream.
pub async fn open_session(
    client: &mut SidecarClient<Channel>,
) -> (
    mpsc::Sender<pb::SessionRequest>,
    tonic::Streaming<pb::SessionResponse>,
) {
    let (tx, rx) = mpsc::channel(4);
    let replies = client
        .session(authed(ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    (tx, replies)
}

pub async fn step(
    tx: &mpsc::Sender<pb::SessionRequest>,
    replies: &mut tonic::Streaming<pb::SessionResponse>,
    step: session_request::Step,
) -> pb::SessionResponse {
    tx.send(pb::SessionRequest { step: Some(step) })
        .await
        .unwrap();
    replies.message().await.unwrap().unwrap()
}

/// The metrics exposition served at `addr`.
pub fn scrape(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

/// The value of one sample line of the exposition (0 when absent).
pub fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// A free loopback port (for a metrics endpoint).
pub fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The real binary serving `config` (a TOML file whose `bind` port is 0), and where it listens once
/// it says so on its log; the log is drained in the background.
pub async fn spawn_serve(config: &Path) -> (std::process::Child, std::net::SocketAddr) {
    let (child, addr, _) = spawn_serve_with(config, &[]).await;
    (child, addr)
}

/// A served binary: its process, where it listens, and its log as it grows.
pub type Spawned = (
    std::process::Child,
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<String>>,
);

/// [`spawn_serve`] with more environment variables, and the log as it grows.
pub async fn spawn_serve_with(config: &Path, envs: &[(&str, &str)]) -> Spawned {
    let binary = std::process::Command::new(env!("CARGO_BIN_EXE_infini-sidecar"));
    spawn_serve_by(binary, config, envs).await
}

/// [`spawn_serve_with`] run by `command`: the binary, or a command that runs it (`ip netns exec`).
pub async fn spawn_serve_by(
    mut command: std::process::Command,
    config: &Path,
    envs: &[(&str, &str)],
) -> Spawned {
    use std::io::BufRead;
    let mut child = command
        .args(["serve", "--config"])
        .arg(config)
        .env("NO_COLOR", "1")
        .envs(envs.iter().copied())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = std::io::BufReader::new(child.stderr.take().unwrap());
    let kept = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let keeper = std::sync::Arc::clone(&kept);
    let addr = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        let mut before = String::new();
        loop {
            before.push_str(&line);
            line.clear();
            assert!(
                log.read_line(&mut line).unwrap() > 0,
                "the server exited; its log:\n{before}"
            );
            if let Some((_, at)) = line.split_once("serving on ") {
                let addr: std::net::SocketAddr = at.trim().parse().unwrap();
                // Keep draining the log so the server never blocks on a full pipe.
                std::thread::spawn(move || {
                    for line in log.lines() {
                        let Ok(line) = line else { break };
                        let mut kept = keeper.lock().unwrap();
                        kept.push_str(&line);
                        kept.push('\n');
                    }
                });
                return addr;
            }
        }
    })
    .await
    .unwrap();
    (child, addr, kept)
}

/// A `Mix` of the sidecar's own model after `context`, top 8.
pub fn own_mix(context: &[u32], lambda: Option<pb::mix_request::Lambda>) -> pb::MixRequest {
    pb::MixRequest {
        context: context.to_vec(),
        neural: Some(pb::mix_request::Neural::OwnModel(true)),
        lambda,
        top_k: 8,
        ..Default::default()
    }
}

/// Every document's per-token `Score` answer under `lambda`, in document order.
pub async fn scores(
    client: &mut SidecarClient<Channel>,
    docs: &[Vec<u32>],
    lambda: Option<pb::score_request::Lambda>,
) -> Vec<pb::DocumentScore> {
    let request = pb::ScoreRequest {
        documents: docs
            .iter()
            .map(|d| pb::ScoreDocument {
                token_ids: d.clone(),
                ..Default::default()
            })
            .collect(),
        lambda,
        per_token: true,
    };
    let mut stream = client.score(request).await.unwrap().into_inner();
    let mut out = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        if let Some(pb::score_response::Item::Document(d)) = m.item {
            out.push(d);
        }
    }
    out.sort_by_key(|d| d.document);
    out
}

/// Polls until a cheap call gets through, which needs a permit back when `max_in_flight` is 1;
/// fails if that takes longer than `within`. Returns how long it took.
pub async fn permit_comes_back(client: &mut SidecarClient<Channel>, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        match client
            .count(pb::CountRequest {
                allow_partial: false,
                ids: vec![13],
            })
            .await
        {
            Ok(_) => return started.elapsed(),
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
                assert!(
                    started.elapsed() < within,
                    "the permit was still held {within:?} after the work was abandoned"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// A document of `len` random ids of the SmolLM2 vocabulary from `rng` (xorshift state): its
/// 100-token head is continued by no other document, so a draft of what follows comes from it.
pub fn random_document(rng: &mut u64, len: usize) -> Vec<u32> {
    (0..len)
        .map(|_| {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            1 + (*rng % 40_000) as u32
        })
        .collect()
}

/// Whether `namespace` of the live index drafts the 4 tokens after `doc`'s 100-token head.
pub async fn live_draft_continues(
    client: &mut SidecarClient<Channel>,
    namespace: &str,
    doc: &[u32],
) -> bool {
    let request = pb::DraftRequest {
        target: Some(pb::draft_request::Target::Context(pb::TokenIds {
            ids: doc[..100].to_vec(),
        })),
        options: Some(pb::DraftOptions {
            max_tokens: 4,
            source: pb::DraftSource::Live as i32,
            min_path_prob: Some(0.0),
            min_token_prob: Some(0.0),
            ..Default::default()
        }),
        namespace: namespace.into(),
        reference: Vec::new(),
    };
    let drafted = client.draft(request).await.unwrap().into_inner().token_ids;
    drafted[..] == doc[100..104]
}

/// `n` random 300-token documents (`random_document`).
pub fn random_documents(seed: u64, n: usize) -> Vec<Vec<u32>> {
    let mut rng = seed | 1;
    (0..n).map(|_| random_document(&mut rng, 300)).collect()
}

pub fn add(namespace: &str, docs: &[Vec<u32>], request_id: &str) -> pb::AddDocumentsRequest {
    pb::AddDocumentsRequest {
        namespace: namespace.into(),
        documents: docs
            .iter()
            .map(|d| pb::LiveDocument {
                content: Some(pb::live_document::Content::Tokens(pb::TokenIds {
                    ids: d.clone(),
                })),
            })
            .collect(),
        request_id: request_id.into(),
    }
}

/// How many of `docs` the live namespace drafts the next tokens of.
pub async fn draftable(
    client: &mut SidecarClient<Channel>,
    namespace: &str,
    docs: &[Vec<u32>],
) -> usize {
    let mut found = 0;
    for d in docs {
        found += usize::from(live_draft_continues(client, namespace, d).await);
    }
    found
}

/// A real binary's process, killed if the test ends (a failed assertion) before it stops it.
pub struct Served(pub std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
