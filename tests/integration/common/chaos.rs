//! A chaos run (issue 52, item 5): 2 routers and 3 shards × 2 replicas, each in a network namespace
//! of its own, every router-to-replica link through a faulty [`Link`]; a workload of mixed calls
//! (`Count`, the ∞-gram, `Mix`, `Score`, a `Session` that learns, mixes and drafts, and
//! `AddDocuments` to live namespaces) through both routers while a schedule kills (SIGKILL),
//! stops (SIGTERM), partitions, slows and makes lossy replicas at random.
//!
//! Every answer is checked against a single sidecar's over the whole index (the same model), asked
//! before the faults start: it must be equal, or UNAVAILABLE naming a shard, or a partial answer
//! flagged with its missing shards (counts no higher than the whole's; an ∞-gram match no longer,
//! and as long only with no more occurrences). Anything else that
//! fails is counted by its code. An append refused is sent again (same request id) until it is
//! acknowledged or the run ends, and then until the cluster, healed, takes it. At the end every
//! document acknowledged must be drafted through both routers, and be held exactly once by each
//! replica of its namespace's owner shard and by no other (asked with the shard API's
//! `LiveContinuations`, which returns one continuation per occurrence).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::{self, session_request::Step};
use infini_sidecar::server::shard_pb::shard_client::ShardClient;
use infini_sidecar::server::shard_pb::LiveContinuationsRequest;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::netns::{Faults, Link, Net, Server};

const PORT: u16 = 50051;
const SHARDS: usize = 3;
const REPLICAS: usize = 2;
const ROUTERS: usize = 2;
/// Every router-to-replica link when nothing is wrong with it.
const BASE: Faults = Faults {
    latency: Duration::from_micros(500),
    jitter: Duration::from_micros(100),
    drop_share: 0.0,
};
const SLOW: Faults = Faults {
    latency: Duration::from_millis(80),
    jitter: Duration::from_millis(40),
    drop_share: 0.0,
};
const LOSSY: Faults = Faults {
    latency: Duration::from_micros(500),
    jitter: Duration::from_micros(100),
    drop_share: 0.05,
};
/// Most faults in force at once.
const MOST_FAULTS: usize = 2;
/// A call's own deadline.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Live namespaces the documents go to (spread over the shards by their names' hash).
const NAMESPACES: usize = 4;
const DOC_TOKENS: usize = 120;

/// What a run needs: a scratch folder, the whole index and its 3 shards, the model the routers
/// and the single sidecar run for `Score`.
pub struct Setup<'a> {
    pub dir: &'a Path,
    pub whole: &'a Path,
    pub shards: &'a [PathBuf],
    pub model: &'a Path,
    pub duration: Duration,
    pub seed: u64,
}

/// One fault of the schedule.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub at_s: f64,
    pub fault: &'static str,
    pub replica: String,
    /// Routers whose links to the replica it touched (partitions, slow and lossy links).
    pub routers: Vec<usize>,
    pub for_s: f64,
}

/// The outcomes of one kind of call.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Tally {
    pub calls: u64,
    pub equal: u64,
    pub partial_flagged: u64,
    pub unavailable_named: u64,
    /// Failed otherwise, by gRPC code.
    pub failed: BTreeMap<String, u64>,
    /// The first message of each code that failed otherwise.
    pub failed_first: BTreeMap<String, String>,
    /// Neither answered nor failed within the call's deadline and 5 s more (a stream the server
    /// left open).
    pub hung: u64,
    pub wrong: u64,
}

impl Tally {
    pub fn failed_share(&self) -> f64 {
        let failed: u64 = self.failed.values().sum::<u64>() + self.unavailable_named + self.hung;
        failed as f64 / self.calls.max(1) as f64
    }
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Documents {
    pub sent: u64,
    /// Acknowledged during the run (at the first try or a retry).
    pub acknowledged: u64,
    /// Tries refused during the run (each sent again).
    pub refused_tries: u64,
    /// Acknowledged only after the run, once the cluster was healed.
    pub acknowledged_after: u64,
    /// Acknowledged, but not drafted through a router at the end.
    pub lost: u64,
    /// Acknowledged, but not held exactly once by exactly both replicas of its owner at the end
    /// (missing from one, or added twice).
    pub misplaced: u64,
    /// The first of those: the document, whether each router drafted it, and how many times each
    /// replica holds it.
    pub examples: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub seconds: f64,
    pub seed: u64,
    pub layout: &'static str,
    pub schedule: Vec<Event>,
    pub calls: BTreeMap<&'static str, Tally>,
    pub wrong_answers: u64,
    /// The first wrong answers, described.
    pub wrong_examples: Vec<String>,
    pub documents: Documents,
}

/// A replica: its host, config and process while it runs.
struct Replica {
    name: String,
    host: usize,
    config: PathBuf,
    server: Option<Server>,
}

/// The calls of the workload, each with the single sidecar's answer.
struct Pool {
    counts: Vec<(Vec<u32>, u64)>,
    ntds: Vec<(Vec<u32>, pb::NextTokenDistributionResponse)>,
    mixes: Vec<(pb::MixRequest, pb::MixResponse)>,
    scores: Vec<(pb::ScoreRequest, Vec<pb::ScoreResponse>)>,
    sessions: Vec<(Vec<Step>, Vec<Seen>)>,
}

/// What a session step's answer must be (its state and its result; not its warning, which says
/// whether learning still goes on).
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    length: u64,
    suffix_len: u32,
    prompt_cnt: u64,
    result: Option<pb::session_response::Result>,
}

/// An outcome of one call.
enum Outcome {
    Equal,
    Partial,
    Named,
    Failed(Status),
    Hung,
    Wrong(String),
}

/// The kinds of call, as the report names them.
const KINDS: [&str; 5] = ["count", "infgram_ntd", "mix", "score", "session"];

/// Longest a call may take before it counts as hung.
const HUNG: Duration = Duration::from_secs(15);

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_infini-sidecar")
}

async fn channel(addr: SocketAddr) -> Channel {
    loop {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(2));
        match endpoint.connect().await {
            Ok(channel) => return channel,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn connect(addr: SocketAddr) -> SidecarClient<Channel> {
    SidecarClient::new(channel(addr).await)
}

async fn shard_client(addr: SocketAddr) -> ShardClient<Channel> {
    ShardClient::new(channel(addr).await)
}

fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CALL_TIMEOUT);
    request
}

/// Runs the chaos of `setup` over the hosts of `net` (8 of them); the report says what happened.
pub async fn run(net: &Net, setup: &Setup<'_>) -> Report {
    let mut rng = StdRng::seed_from_u64(setup.seed);
    // Hosts: routers 0 and 1; shard k's replica r at 2 + 2k + r.
    let mut replicas = Vec::new();
    for k in 0..SHARDS {
        for r in 0..REPLICAS {
            let host = 2 + REPLICAS * k + r;
            let name = format!("s{k}r{r}");
            let live = setup.dir.join(format!("{name}-live"));
            let config = write(
                setup.dir,
                &name,
                &format!(
                    "bind = \"{}\"\nindex = \"{}\"\n[cluster]\nrole = \"shard\"\n[live]\ndata_dir = \"{}\"\n",
                    net.host(host).at(PORT),
                    setup.shards[k].display(),
                    live.display()
                ),
            );
            replicas.push(Replica {
                name,
                host,
                config,
                server: None,
            });
        }
    }
    let started = futures_util::future::join_all(replicas.iter().map(|r| {
        let (command, config) = (net.host(r.host).command(bin()), r.config.clone());
        tokio::task::spawn_blocking(move || Server::start(command, &config))
    }))
    .await;
    for (replica, server) in replicas.iter_mut().zip(started) {
        replica.server = Some(server.unwrap());
    }
    // links[i][j]: router i to replica j.
    let links: Vec<Vec<Link>> = (0..ROUTERS)
        .map(|i| {
            (replicas.iter())
                .map(|r| Link::start(net.host(i).here.into(), net.host(r.host).at(PORT), BASE))
                .collect()
        })
        .collect();
    let neural = format!("model = \"{}\"\n", setup.model.display());
    let mut routers = Vec::new();
    for (i, router_links) in links.iter().enumerate() {
        let list: Vec<String> = router_links
            .iter()
            .map(|l| format!("\"{}\"", l.addr))
            .collect();
        let config = write(
            setup.dir,
            &format!("router{i}"),
            &format!(
                "bind = \"{}\"\n{neural}[cluster]\nrole = \"router\"\nshards = [{}]\nshard_timeout_ms = 2000\nrefresh_secs = 1\nreplicas_per_shard = {REPLICAS}\n[live]\nenabled = false\n",
                net.host(i).at(PORT),
                list.join(", ")
            ),
        );
        let command = net.host(i).command(bin());
        routers.push(
            tokio::task::spawn_blocking(move || Server::start(command, &config))
                .await
                .unwrap(),
        );
    }
    let single_config = write(
        setup.dir,
        "single",
        &format!(
            "bind = \"127.0.0.1:0\"\nindex = \"{}\"\n{neural}",
            setup.whole.display()
        ),
    );
    let single =
        tokio::task::spawn_blocking(move || Server::start(Command::new(bin()), &single_config))
            .await
            .unwrap();

    let index = infini_sidecar::index::Index::open(setup.whole, &Default::default()).unwrap();
    let pool = pool(&index, &mut connect(single.addr).await, &mut rng).await;
    drop(single);
    let clients: Vec<SidecarClient<Channel>> =
        futures_util::future::join_all((0..ROUTERS).map(|i| connect(net.host(i).at(PORT)))).await;
    baseline(&clients, &pool).await;

    // The run: the workload, the documents and the schedule at once.
    let pool = Arc::new(pool);
    let stop = Arc::new(AtomicBool::new(false));
    let tallies: Arc<Mutex<BTreeMap<&'static str, Tally>>> = Arc::default();
    let wrong_examples: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..3u64 {
        let (pool, stop, tallies, wrong) = (
            Arc::clone(&pool),
            Arc::clone(&stop),
            Arc::clone(&tallies),
            Arc::clone(&wrong_examples),
        );
        let mut clients = clients.clone();
        let mut rng = StdRng::seed_from_u64(setup.seed ^ ((w + 1) * 0x9e37_79b9));
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let client = &mut clients[rng.random_range(0..ROUTERS)];
                let (kind, outcome) = call(client, &pool, &mut rng).await;
                record(&tallies, &wrong, kind, outcome);
            }
        }));
    }
    let documents = Arc::new(Mutex::new(DocumentLog::default()));
    let writer = {
        let (stop, documents, mut clients) =
            (Arc::clone(&stop), Arc::clone(&documents), clients.clone());
        let mut rng = StdRng::seed_from_u64(setup.seed ^ 0xd0c5);
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let next = documents.lock().unwrap().next_try(&mut rng, &mut n);
                let client = &mut clients[rng.random_range(0..ROUTERS)];
                let answer =
                    tokio::time::timeout(HUNG, client.add_documents(request(next.request()))).await;
                documents
                    .lock()
                    .unwrap()
                    .answered(next, matches!(answer, Ok(Ok(_))));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let began = Instant::now();
    let schedule = chaos(net, &mut replicas, &links, setup.duration, &mut rng, began).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    writer.await.unwrap();
    let seconds = began.elapsed().as_secs_f64();

    // Healed: every link whole, every replica up; what was refused is sent until it is taken.
    heal(net, &mut replicas, &links).await;
    let mut documents = Arc::try_unwrap(documents)
        .ok()
        .unwrap()
        .into_inner()
        .unwrap();
    let mut clients = clients;
    documents.settle(&mut clients).await;
    let mut replica_clients = Vec::new();
    for r in &replicas {
        replica_clients.push(shard_client(net.host(r.host).at(PORT)).await);
    }
    let tally = documents.check(&clients, &replica_clients).await;
    drop(routers);
    drop(replicas);
    let calls = Arc::try_unwrap(tallies).unwrap().into_inner().unwrap();
    let wrong_examples = Arc::try_unwrap(wrong_examples)
        .unwrap()
        .into_inner()
        .unwrap();
    Report {
        seconds,
        seed: setup.seed,
        layout: "2 routers, 3 shards x 2 replicas, each in a network namespace; router-to-replica links 0.5 ms +- 0.1 ms",
        schedule,
        wrong_answers: calls.values().map(|t| t.wrong).sum(),
        calls,
        wrong_examples,
        documents: tally,
    }
}

/// The calls of the workload from the whole index's documents, with the single sidecar's answers.
async fn pool(
    index: &infini_sidecar::index::Index,
    single: &mut SidecarClient<Channel>,
    rng: &mut StdRng,
) -> Pool {
    let docs: Vec<Vec<u32>> = index.documents().filter(|d| d.len() > 40).collect();
    let mut span = |n: usize| {
        let d = &docs[rng.random_range(0..docs.len())];
        let at = rng.random_range(0..d.len() - n);
        d[at..at + n].to_vec()
    };
    let (mut counts, mut ntds, mut mixes, mut scores, mut sessions) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..48 {
        let ids = span(1 + i % 4);
        let want = single
            .count(pb::CountRequest {
                ids: ids.clone(),
                allow_partial: false,
            })
            .await
            .unwrap()
            .into_inner();
        counts.push((ids, want.count));
        let prompt = span(8);
        let want = single.next_token_distribution(ntd(&prompt, false)).await;
        ntds.push((prompt, want.unwrap().into_inner()));
    }
    for _ in 0..24 {
        let mix = pb::MixRequest {
            context: span(8),
            neural: Some(pb::mix_request::Neural::TopKLogprobs(neural_top_k())),
            lambda: Some(pb::mix_request::Lambda::FixedLambda(0.3)),
            top_k: 8,
            ..Default::default()
        };
        let want = single.mix(mix.clone()).await.unwrap().into_inner();
        mixes.push((mix, want));
    }
    for _ in 0..12 {
        let score = pb::ScoreRequest {
            documents: vec![pb::ScoreDocument {
                token_ids: span(24),
                domain: String::new(),
            }],
            lambda: Some(pb::score_request::Lambda::FixedLambda(0.3)),
            per_token: false,
        };
        let want = scored(single, score.clone()).await.unwrap();
        scores.push((score, want));
    }
    // Sessions whose 12 tokens occur once: a draft breaks ties among a match's continuations by
    // its place in the suffix array, which differs between one index and its shards.
    while sessions.len() < 16 {
        let (i, tokens) = (sessions.len(), span(12));
        let steps = vec![
            Step::Start(pb::SessionStart {
                context: tokens[..8].to_vec(),
                namespace: format!("learn-{}", i % NAMESPACES),
                learn: true,
                ..Default::default()
            }),
            Step::Append(pb::SessionAppend {
                tokens: tokens[8..10].to_vec(),
            }),
            Step::Mix(pb::SessionMix {
                neural: Some(pb::session_mix::Neural::TopKLogprobs(neural_top_k())),
                lambda: Some(pb::session_mix::Lambda::FixedLambda(0.3)),
                top_k: 8,
                ..Default::default()
            }),
            Step::Append(pb::SessionAppend {
                tokens: tokens[10..].to_vec(),
            }),
            Step::Draft(pb::DraftOptions {
                source: pb::DraftSource::Index as i32,
                max_tokens: 4,
                ..Default::default()
            }),
        ];
        let want = session(single, &steps).await.unwrap();
        if want.last().is_some_and(|w| w.prompt_cnt == 1) {
            sessions.push((steps, want));
        }
    }
    Pool {
        counts,
        ntds,
        mixes,
        scores,
        sessions,
    }
}

fn ntd(prompt: &[u32], allow_partial: bool) -> pb::NextTokenDistributionRequest {
    pb::NextTokenDistributionRequest {
        prompt: prompt.to_vec(),
        infinite: true,
        max_support: 0,
        allow_partial,
    }
}

/// A caller's top 16 tokens' log-probs, falling geometrically; 10% of the mass on the others.
fn neural_top_k() -> pb::NeuralTopK {
    let q: f64 = 0.7;
    let norm = (1.0 - q.powi(16)) / (1.0 - q);
    pb::NeuralTopK {
        tokens: (0..16).map(|t| t * 131 + 17).collect(),
        logprobs: (0..16)
            .map(|r| (0.9 * q.powi(r) / norm).ln() as f32)
            .collect(),
        rest_mass: 0.1,
    }
}

async fn scored(
    client: &mut SidecarClient<Channel>,
    score: pb::ScoreRequest,
) -> Result<Vec<pb::ScoreResponse>, Status> {
    let mut stream = client.score(request(score)).await?.into_inner();
    let mut items = Vec::new();
    while let Some(item) = stream.message().await? {
        items.push(item);
    }
    Ok(items)
}

/// A session through `steps`; a step refused ends it with its error as a status.
async fn session(client: &mut SidecarClient<Channel>, steps: &[Step]) -> Result<Vec<Seen>, Status> {
    let (tx, rx) = mpsc::channel(steps.len());
    for step in steps {
        let _ = tx
            .send(pb::SessionRequest {
                step: Some(step.clone()),
            })
            .await;
    }
    let mut replies = client
        .session(request(ReceiverStream::new(rx)))
        .await?
        .into_inner();
    let mut seen = Vec::new();
    for _ in steps {
        let reply = replies
            .message()
            .await?
            .ok_or_else(|| Status::unknown("the session ended early"))?;
        if let Some(pb::session_response::Result::Error(e)) = &reply.result {
            return Err(Status::new(Code::from(e.code), e.message.clone()));
        }
        let state = reply.state.unwrap_or_default();
        seen.push(Seen {
            length: state.length,
            suffix_len: state.suffix_len,
            prompt_cnt: state.prompt_cnt,
            result: reply.result,
        });
    }
    Ok(seen)
}

/// Every call of the pool through every router, before any fault: each must equal the single
/// sidecar's, or the run would count differences the faults did not make.
async fn baseline(clients: &[SidecarClient<Channel>], pool: &Pool) {
    for client in clients {
        let mut client = client.clone();
        // The routers form their sets within a refresh or two.
        let started = Instant::now();
        while client
            .count(pb::CountRequest {
                ids: vec![1],
                allow_partial: false,
            })
            .await
            .is_err()
        {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "a router never answered"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for which in 0..5 {
            let n = [
                pool.counts.len(),
                pool.ntds.len(),
                pool.mixes.len(),
                pool.scores.len(),
                pool.sessions.len(),
            ][which];
            for i in 0..n {
                let (kind, outcome) = call_one(&mut client, pool, which, i, false).await;
                if let Some(why) = match outcome {
                    Outcome::Equal => None,
                    Outcome::Wrong(why) => Some(why),
                    Outcome::Failed(status) => Some(format!("failed: {status:?}")),
                    Outcome::Hung => Some("no answer".into()),
                    Outcome::Partial | Outcome::Named => Some("a shard missing".into()),
                } {
                    panic!("before any fault, {kind} {i} through a router differs from the single sidecar: {why}");
                }
            }
        }
    }
}

/// One call of the workload, drawn at random.
async fn call(
    client: &mut SidecarClient<Channel>,
    pool: &Pool,
    rng: &mut StdRng,
) -> (&'static str, Outcome) {
    // Weights: counts 30, ∞-gram 25, Mix 15, Score 10, sessions 20.
    let draw = rng.random_range(0..100);
    let which = [30, 55, 70, 80, 100]
        .iter()
        .position(|&w| draw < w)
        .unwrap_or(4);
    let n = [
        pool.counts.len(),
        pool.ntds.len(),
        pool.mixes.len(),
        pool.scores.len(),
        pool.sessions.len(),
    ][which];
    let partial = rng.random_bool(0.5);
    call_one(client, pool, which, rng.random_range(0..n), partial).await
}

/// Call `i` of kind `which`, judged; hung when it takes longer than [`HUNG`].
async fn call_one(
    client: &mut SidecarClient<Channel>,
    pool: &Pool,
    which: usize,
    i: usize,
    partial: bool,
) -> (&'static str, Outcome) {
    let outcome = tokio::time::timeout(HUNG, judged_call(client, pool, which, i, partial)).await;
    let outcome = outcome.unwrap_or_else(|_| {
        eprintln!(
            "chaos: a {} call hung ({} s without an answer)",
            KINDS[which],
            HUNG.as_secs()
        );
        Outcome::Hung
    });
    (KINDS[which], outcome)
}

/// Call `i` of kind `which` (partial answers allowed with `partial`, where a call takes them),
/// checked against the single sidecar's answer.
async fn judged_call(
    client: &mut SidecarClient<Channel>,
    pool: &Pool,
    which: usize,
    i: usize,
    partial: bool,
) -> Outcome {
    match which {
        0 => {
            let (ids, want) = &pool.counts[i];
            let got = client
                .count(request(pb::CountRequest {
                    ids: ids.clone(),
                    allow_partial: partial,
                }))
                .await;
            let outcome = judge(got.map(|r| r.into_inner()), |got| {
                match (&got.partial, got.count == *want) {
                    (None, true) => Outcome::Equal,
                    (Some(p), _) if !p.missing_shards.is_empty() && got.count <= *want => {
                        Outcome::Partial
                    }
                    _ => Outcome::Wrong(format!("count {ids:?}: {got:?}, want {want}")),
                }
            });
            outcome
        }
        1 => {
            let (prompt, want) = &pool.ntds[i];
            let got = client
                .next_token_distribution(request(ntd(prompt, partial)))
                .await;
            // Over fewer shards the longest match is no longer than over all, and as long only
            // with no more occurrences (a shorter one may have more).
            let within = |got: &pb::NextTokenDistributionResponse| {
                got.suffix_len < want.suffix_len
                    || (got.suffix_len == want.suffix_len && got.prompt_cnt <= want.prompt_cnt)
            };
            let outcome = judge(got.map(|r| r.into_inner()), |got| match &got.partial {
                None if got == *want => Outcome::Equal,
                Some(p) if !p.missing_shards.is_empty() && within(&got) => Outcome::Partial,
                _ => Outcome::Wrong(format!("∞-gram {prompt:?}: {got:?}, want {want:?}")),
            });
            outcome
        }
        2 => {
            let (mix, want) = &pool.mixes[i];
            let got = client.mix(request(mix.clone())).await;
            let outcome = judge(got.map(|r| r.into_inner()), |got| match got == *want {
                true => Outcome::Equal,
                false => Outcome::Wrong(format!("mix {:?}: {got:?}, want {want:?}", mix.context)),
            });
            outcome
        }
        3 => {
            let (score, want) = &pool.scores[i];
            let got = scored(client, score.clone()).await;
            let outcome = judge(got, |got| match got == *want {
                true => Outcome::Equal,
                false => Outcome::Wrong(format!("score: {got:?}, want {want:?}")),
            });
            outcome
        }
        _ => {
            let (steps, want) = &pool.sessions[i];
            let got = session(client, steps).await;
            let outcome = judge(got, |got| match got == *want {
                true => Outcome::Equal,
                false => Outcome::Wrong(format!("session {i}: {got:?}, want {want:?}")),
            });
            outcome
        }
    }
}

/// A call's outcome: its answer judged by `check`, or its failure classed.
fn judge<T>(got: Result<T, Status>, check: impl FnOnce(T) -> Outcome) -> Outcome {
    match got {
        Ok(answer) => check(answer),
        Err(status) if status.code() == Code::Unavailable && names_a_shard(status.message()) => {
            Outcome::Named
        }
        Err(status) => Outcome::Failed(status),
    }
}

/// Whether a refusal names the shard that is missing ("shard 1 of 3").
fn names_a_shard(message: &str) -> bool {
    (0..SHARDS).any(|k| message.contains(&format!("shard {k} of {SHARDS}")))
}

fn record(
    tallies: &Mutex<BTreeMap<&'static str, Tally>>,
    wrong: &Mutex<Vec<String>>,
    kind: &'static str,
    outcome: Outcome,
) {
    let mut tallies = tallies.lock().unwrap();
    let tally = tallies.entry(kind).or_default();
    tally.calls += 1;
    match outcome {
        Outcome::Equal => tally.equal += 1,
        Outcome::Partial => tally.partial_flagged += 1,
        Outcome::Named => tally.unavailable_named += 1,
        Outcome::Failed(status) => {
            let code = format!("{:?}", status.code());
            *tally.failed.entry(code.clone()).or_default() += 1;
            (tally.failed_first)
                .entry(code)
                .or_insert_with(|| status.message().to_string());
        }
        Outcome::Hung => tally.hung += 1,
        Outcome::Wrong(why) => {
            tally.wrong += 1;
            let mut wrong = wrong.lock().unwrap();
            if wrong.len() < 20 {
                wrong.push(why);
            }
        }
    }
}

/// A fault in force, undone at `until`.
struct Active {
    replica: usize,
    kind: &'static str,
    routers: Vec<usize>,
    until: Instant,
}

/// Faults at random for `duration`, each undone when its time is up; the schedule as it ran.
async fn chaos(
    net: &Net,
    replicas: &mut [Replica],
    links: &[Vec<Link>],
    duration: Duration,
    rng: &mut StdRng,
    began: Instant,
) -> Vec<Event> {
    let mut schedule = Vec::new();
    let mut active: Vec<Active> = Vec::new();
    let mut next = began + Duration::from_secs(2);
    while began.elapsed() < duration {
        let now = Instant::now();
        for done in (0..active.len()).rev() {
            if active[done].until <= now {
                let fault = active.swap_remove(done);
                undo(net, replicas, links, &fault).await;
            }
        }
        if now >= next && active.len() < MOST_FAULTS {
            let free: Vec<usize> = (0..replicas.len())
                .filter(|j| active.iter().all(|a| a.replica != *j))
                .collect();
            let j = free[rng.random_range(0..free.len())];
            let kind = ["kill", "stop", "partition", "slow", "lossy"][rng.random_range(0..5)];
            let routers: Vec<usize> = match rng.random_bool(0.5) {
                true => (0..ROUTERS).collect(),
                false => vec![rng.random_range(0..ROUTERS)],
            };
            let lasts = Duration::from_secs_f64(rng.random_range(3.0..10.0));
            let routers = match kind {
                "kill" | "stop" => Vec::new(),
                _ => routers,
            };
            schedule.push(Event {
                at_s: began.elapsed().as_secs_f64(),
                fault: kind,
                replica: replicas[j].name.clone(),
                routers: routers.clone(),
                for_s: lasts.as_secs_f64(),
            });
            match kind {
                "kill" => drop(replicas[j].server.take()),
                "stop" => {
                    if let Some(server) = replicas[j].server.take() {
                        tokio::task::spawn_blocking(move || server.terminate())
                            .await
                            .unwrap();
                    }
                }
                _ => {
                    for &i in &routers {
                        let link = &links[i][j];
                        match kind {
                            "partition" => link.cut(),
                            "slow" => link.set_faults(SLOW),
                            _ => link.set_faults(LOSSY),
                        }
                    }
                }
            }
            active.push(Active {
                replica: j,
                kind,
                routers,
                until: Instant::now() + lasts,
            });
            next = Instant::now() + Duration::from_secs_f64(rng.random_range(2.0..6.0));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for fault in active {
        undo(net, replicas, links, &fault).await;
    }
    schedule
}

/// Undoes a fault: a replica started again at its address with its data, a link healed.
async fn undo(net: &Net, replicas: &mut [Replica], links: &[Vec<Link>], fault: &Active) {
    let replica = &mut replicas[fault.replica];
    match fault.kind {
        "kill" | "stop" => {
            start(net, replica).await;
        }
        _ => {
            for &i in &fault.routers {
                let link = &links[i][fault.replica];
                link.heal();
                link.set_faults(BASE);
            }
        }
    }
}

/// Starts `replica` (again) in its host, with its config and data.
async fn start(net: &Net, replica: &mut Replica) {
    let (command, config) = (
        net.host(replica.host).command(bin()),
        replica.config.clone(),
    );
    let server = tokio::task::spawn_blocking(move || Server::start(command, &config))
        .await
        .unwrap();
    replica.server = Some(server);
}

/// Every link whole and every replica up; then waits for both routers to see every shard.
async fn heal(net: &Net, replicas: &mut [Replica], links: &[Vec<Link>]) {
    for router_links in links {
        for link in router_links {
            link.heal();
            link.set_faults(BASE);
        }
    }
    for replica in replicas.iter_mut().filter(|r| r.server.is_none()) {
        start(net, replica).await;
    }
    // Two refreshes: every replica described again.
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// The documents sent, and whether each was acknowledged.
#[derive(Default)]
struct DocumentLog {
    docs: Vec<Document>,
    /// Refused ones, sent again before new ones.
    waiting: Vec<usize>,
    tally: Documents,
}

struct Document {
    namespace: String,
    request_id: String,
    tokens: Vec<u32>,
    acknowledged: bool,
}

/// A try of one document.
struct Try {
    doc: usize,
    request: pb::AddDocumentsRequest,
}

impl Try {
    fn request(&self) -> pb::AddDocumentsRequest {
        self.request.clone()
    }
}

impl DocumentLog {
    /// A refused document again, or a new one.
    fn next_try(&mut self, rng: &mut StdRng, n: &mut u64) -> Try {
        // Refused ones half the time, so that one owner down does not hold back the others.
        let again = match rng.random_bool(0.5) {
            true => self.waiting.pop(),
            false => None,
        };
        let doc = match again {
            Some(doc) => doc,
            None => {
                *n += 1;
                self.docs.push(Document {
                    namespace: format!("docs-{}", *n as usize % NAMESPACES),
                    request_id: format!("chaos-{n}"),
                    tokens: (0..DOC_TOKENS)
                        .map(|_| rng.random_range(1..40_000))
                        .collect(),
                    acknowledged: false,
                });
                self.tally.sent += 1;
                self.docs.len() - 1
            }
        };
        let d = &self.docs[doc];
        Try {
            doc,
            request: add(d),
        }
    }

    fn answered(&mut self, tried: Try, acknowledged: bool) {
        match acknowledged {
            true => {
                self.docs[tried.doc].acknowledged = true;
                self.tally.acknowledged += 1;
            }
            false => {
                self.tally.refused_tries += 1;
                self.waiting.insert(0, tried.doc);
            }
        }
    }

    /// Sends what is still refused until the healed cluster takes it.
    async fn settle(&mut self, clients: &mut [SidecarClient<Channel>]) {
        let started = Instant::now();
        while let Some(doc) = self.waiting.pop() {
            let d = &self.docs[doc];
            loop {
                let added =
                    tokio::time::timeout(HUNG, clients[0].add_documents(request(add(d)))).await;
                match added.unwrap_or_else(|_| Err(Status::deadline_exceeded("hung"))) {
                    Ok(_) => {
                        self.docs[doc].acknowledged = true;
                        break;
                    }
                    Err(status) => {
                        assert!(
                            started.elapsed() < Duration::from_secs(120),
                            "the healed cluster refuses an append: {status:?}"
                        );
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            self.tally.acknowledged_after += 1;
        }
    }

    /// Whether each document acknowledged is drafted through both routers, and held once by each
    /// replica of one shard (its owner's) and by no other replica. Documents are checked 16 at a
    /// time.
    async fn check(
        mut self,
        routers: &[SidecarClient<Channel>],
        replicas: &[ShardClient<Channel>],
    ) -> Documents {
        use futures_util::StreamExt;
        let acknowledged = self.docs.iter().filter(|d| d.acknowledged);
        let mut checked = futures_util::stream::iter(acknowledged)
            .map(|d| {
                let (mut routers, mut replicas) = (routers.to_vec(), replicas.to_vec());
                async move {
                    let mut through = Vec::new();
                    for router in &mut routers {
                        through.push(drafts(router, d).await);
                    }
                    let mut held = Vec::new();
                    for replica in &mut replicas {
                        held.push(copies(replica, d).await);
                    }
                    (d, through, held)
                }
            })
            .buffer_unordered(16);
        while let Some((d, through, held)) = checked.next().await {
            let lost = through.iter().any(Result::is_err);
            let holders: Vec<usize> = (0..held.len()).filter(|&j| held[j] > 0).collect();
            let one_shard = holders.len() == REPLICAS
                && holders[0].is_multiple_of(REPLICAS)
                && (holders.windows(2)).all(|w| w[1] == w[0] + 1);
            let misplaced = !one_shard || holders.iter().any(|&j| held[j] != 1);
            self.tally.lost += u64::from(lost);
            self.tally.misplaced += u64::from(misplaced);
            if (lost || misplaced) && self.tally.examples.len() < 20 {
                self.tally.examples.push(format!(
                    "{} in {}: drafted through routers {through:?}; copies by replica {held:?}",
                    d.request_id, d.namespace
                ));
            }
        }
        drop(checked);
        self.tally
    }
}

fn add(d: &Document) -> pb::AddDocumentsRequest {
    pb::AddDocumentsRequest {
        namespace: d.namespace.clone(),
        request_id: d.request_id.clone(),
        documents: vec![pb::LiveDocument {
            content: Some(pb::live_document::Content::Tokens(pb::TokenIds {
                ids: d.tokens.clone(),
            })),
        }],
    }
}

/// How many times a replica's live namespace holds the document: its continuations after the
/// document's 100-token head that are the document's next 4 tokens (`u32::MAX` when it does not
/// answer).
async fn copies(client: &mut ShardClient<Channel>, d: &Document) -> u32 {
    let ask = LiveContinuationsRequest {
        namespace: d.namespace.clone(),
        pattern: d.tokens[..100].to_vec(),
        samples: 16,
        depth: 4,
    };
    match tokio::time::timeout(HUNG, client.live_continuations(request(ask))).await {
        Ok(Ok(answer)) => (answer.into_inner().continuations.iter())
            .filter(|c| c.tokens[..] == d.tokens[100..104])
            .count() as u32,
        _ => u32::MAX,
    }
}

/// Whether `client`'s live namespace drafts the 4 tokens after the document's 100-token head, or
/// what it did instead.
async fn drafts(client: &mut SidecarClient<Channel>, d: &Document) -> Result<(), String> {
    let draft = pb::DraftRequest {
        target: Some(pb::draft_request::Target::Context(pb::TokenIds {
            ids: d.tokens[..100].to_vec(),
        })),
        options: Some(pb::DraftOptions {
            max_tokens: 4,
            source: pb::DraftSource::Live as i32,
            min_path_prob: Some(0.0),
            min_token_prob: Some(0.0),
            ..Default::default()
        }),
        namespace: d.namespace.clone(),
        reference: Vec::new(),
    };
    match tokio::time::timeout(HUNG, client.draft(request(draft))).await {
        Ok(Ok(answer)) if answer.get_ref().token_ids[..] == d.tokens[100..104] => Ok(()),
        Ok(Ok(answer)) => Err(format!("drafted {:?}", answer.into_inner().token_ids)),
        Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
        Err(_) => Err("hung".into()),
    }
}
