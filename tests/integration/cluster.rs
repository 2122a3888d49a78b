//! Scale-out on loopback, as separate processes: 3 shard servers (shard 1 with a second replica)
//! built by `index build --shard K/3` over real mini-Pile documents, and 2 routers over them, the
//! routers and a single sidecar running SmolLM2 with the same mixing file. Every answer of a router
//! must equal a single sidecar's over one index of all the documents (exact answers: counts,
//! distributions, searches, `Mix` and `Score` under the split, fixed and adaptive λ, a session's
//! states and mixtures) and the library's over the three shards joined (subsampled answers: the
//! gate's features, drafts); dense scores merged from the shards' evidence must equal the single
//! index's. Killing replicas mid-run gives retries, then UNAVAILABLE naming the shard (or a flagged
//! partial answer), never a wrong count.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use infini_sidecar::cluster::merge;
use infini_sidecar::decoding::Sequence;
use infini_sidecar::draft::DraftOptions;
use infini_sidecar::evidence::{document_records, mix_tokens, EvidenceSource};
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::dense::TokenEvidence;
use infini_sidecar::index::query::Spread;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::mix::features::{gate_features, GateFeatures, NeuralContext};
use infini_sidecar::mix::{Gate, GateOptions, LambdaRule, MixingParams, NUM_FEATURES};
use infini_sidecar::model::{LoadOptions, Model, WindowOptions};
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::{self, Clause, NGram};
use infini_sidecar::server::pb::{draft_request, mix_request, score_request, session_request};
use infini_sidecar::server::shard_pb::{self as spb, shard_client::ShardClient};
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::common::server::{
    connect, open_session, own_mix, save_mixing, scores, spawn_serve_with, step,
};
use crate::common::{assets, smollm2_gguf};

const DOCUMENTS: usize = 600;
const SHARDS: usize = 3;

/// A child process killed when the test ends, however it ends.
pub(super) struct Process(Child);

impl Process {
    /// A process of the test's own, killed when dropped.
    pub(super) fn of(child: Child) -> Self {
        Self(child)
    }

    /// Stops it as Kubernetes does (SIGTERM: it drains) and waits for it to exit.
    pub(super) fn terminate(mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let _ = self.0.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sidecar(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_infini-sidecar"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The first `DOCUMENTS` mini-Pile train documents as a JSON-lines file.
pub(super) fn corpus(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(assets().join("minipile/train.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().take(DOCUMENTS).collect();
    let path = dir.join("docs.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn build(input: &Path, out: &Path, shard: Option<usize>) {
    build_with(input, out, shard, &[]);
}

/// The corpus built whole and as a set of `SHARDS` shards, under `dir`: (whole, shards).
pub(super) fn build_set(dir: &Path) -> (PathBuf, Vec<PathBuf>) {
    let input = corpus(dir);
    let whole = dir.join("whole");
    build(&input, &whole, None);
    let shards: Vec<PathBuf> = (0..SHARDS).map(|k| dir.join(format!("s{k}"))).collect();
    for (k, d) in shards.iter().enumerate() {
        build(&input, d, Some(k));
    }
    (whole, shards)
}

/// [`build`] with more arguments of `index build`.
pub(super) fn build_with(input: &Path, out: &Path, shard: Option<usize>, extra: &[&str]) {
    let tokenizer = smollm2_gguf();
    let mut args = vec![
        "index".to_string(),
        "build".into(),
        "--input".into(),
        input.display().to_string(),
        "--tokenizer".into(),
        tokenizer.display().to_string(),
        "--out".into(),
        out.display().to_string(),
        "--memory-gib".into(),
        "1".into(),
    ];
    if let Some(k) = shard {
        args.extend(["--shard".into(), format!("{k}/{SHARDS}")]);
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    sidecar(&args.iter().map(String::as_str).collect::<Vec<_>>());
}

/// Starts `infini-sidecar serve` on a config written from `toml` (bind is added, and `[live]` off
/// unless `toml` has it).
pub(super) async fn serve(dir: &Path, name: &str, toml: &str) -> (Process, std::net::SocketAddr) {
    serve_with(dir, name, toml, &[]).await
}

/// [`serve`] with more environment variables.
pub(super) async fn serve_with(
    dir: &Path,
    name: &str,
    toml: &str,
    envs: &[(&str, &str)],
) -> (Process, std::net::SocketAddr) {
    let path = dir.join(format!("{name}.toml"));
    let live = match toml.contains("[live]") {
        true => "",
        false => "\n[live]\nenabled = false\n",
    };
    let config = format!("bind = \"127.0.0.1:0\"\n{toml}{live}");
    std::fs::write(&path, config).unwrap();
    let (child, addr, _) = spawn_serve_with(&path, envs).await;
    (Process(child), addr)
}

pub(super) async fn shard_server(
    dir: &Path,
    name: &str,
    index: &Path,
) -> (Process, std::net::SocketAddr) {
    let toml = format!(
        "index = \"{}\"\n[cluster]\nrole = \"shard\"\n[live]\nenabled = true\n",
        index.display()
    );
    serve(dir, name, &toml).await
}

/// A router over `shards`, once it is ready; `top` holds its top-level settings (a model and mixing
/// file, a metrics endpoint).
pub(super) async fn router(
    dir: &Path,
    name: &str,
    shards: &[String],
    top: &str,
) -> (Process, SidecarClient<Channel>, Channel) {
    let (process, client, channel) = router_over(dir, name, shards, top).await;
    wait_ready(&channel, ServingStatus::Serving).await;
    (process, client, channel)
}

async fn router_over(
    dir: &Path,
    name: &str,
    shards: &[String],
    top: &str,
) -> (Process, SidecarClient<Channel>, Channel) {
    let list: Vec<String> = shards.iter().map(|a| format!("\"{a}\"")).collect();
    let toml = format!(
        "{top}[cluster]\nrole = \"router\"\nshards = [{}]\nshard_timeout_ms = 1000\nrefresh_secs = 1\n",
        list.join(", ")
    );
    let (process, addr) = serve(dir, name, &toml).await;
    let channel = connect(addr).await;
    (process, SidecarClient::new(channel.clone()), channel)
}

pub(super) async fn readiness(channel: &Channel) -> ServingStatus {
    let answer = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: "sidecar.v1.Sidecar".into(),
        })
        .await;
    match answer {
        Ok(r) => r.into_inner().status(),
        Err(_) => ServingStatus::Unknown,
    }
}

pub(super) async fn wait_ready(channel: &Channel, want: ServingStatus) {
    for _ in 0..200 {
        if readiness(channel).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the router's readiness never became {want:?}");
}

/// Deterministic pseudo-random numbers (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Queries from the corpus: n-grams taken at random places of its documents (some with a token
/// changed, so they rarely occur), of 1 to 12 tokens.
fn queries(single: &Index, n: usize) -> Vec<Vec<u32>> {
    let docs: Vec<Vec<u32>> = single.documents().collect();
    let mut rng = Rng(0x5eed);
    (0..n)
        .map(|i| {
            let doc = &docs[rng.below(docs.len())];
            let len = 1 + rng.below(12).min(doc.len().saturating_sub(1));
            let at = rng.below(doc.len().saturating_sub(len) + 1);
            let mut q = doc[at..at + len].to_vec();
            if i % 7 == 0 {
                let last = q.len() - 1;
                q[last] = rng.below(49_152) as u32;
            }
            q
        })
        .collect()
}

fn ntd(prompt: &[u32], infinite: bool, max_support: u64) -> pb::NextTokenDistributionRequest {
    pb::NextTokenDistributionRequest {
        prompt: prompt.to_vec(),
        infinite,
        max_support,
        allow_partial: false,
    }
}

fn search(cnf: Vec<Vec<Vec<u32>>>, maxnum: u32) -> pb::SearchDocumentsRequest {
    pb::SearchDocumentsRequest {
        cnf: cnf
            .into_iter()
            .map(|c| Clause {
                ngrams: c.into_iter().map(|ids| NGram { ids }).collect(),
            })
            .collect(),
        maxnum,
        max_disp_len: 40,
        ..Default::default()
    }
}

/// The dense evidence of every shard server, merged, for `ids`.
async fn merged_scores(
    shards: &[String],
    ids: &[u32],
) -> Vec<infini_sidecar::index::dense::TokenScore> {
    let mut parts = Vec::new();
    for addr in shards {
        let mut client = ShardClient::new(connect(addr.parse().unwrap()).await);
        let answer = client
            .score_tokens(spb::ScoreTokensRequest {
                ids: ids.to_vec(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        parts.push(
            answer
                .tokens
                .into_iter()
                .map(|t| TokenEvidence {
                    suffix_len: t.suffix_len as usize,
                    prompt_cnt: t.prompt_cnt,
                    cont_cnt: t.cont_cnt,
                    spread: match t.spread() {
                        spb::Spread::None => Spread::None,
                        spb::Spread::Single => Spread::Single(t.single),
                        spb::Spread::Several => Spread::Several,
                    },
                })
                .collect(),
        );
    }
    merge::token_scores(&parts).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn routers_answer_as_one_index_and_name_the_shard_that_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let (single_dir, shard_dirs) = build_set(dir.path());
    let open = |p: &Path| Index::open(p, &OpenOptions::default()).unwrap();
    let single = open(&single_dir);
    let joined = Arc::new(Index::join(shard_dirs.iter().map(|p| open(p)).collect()).unwrap());
    assert_eq!(joined.total_documents(), DOCUMENTS as u64);

    // Shard servers (shard 1 twice: replicas), then two routers over all four.
    let mut processes = Vec::new();
    let mut addrs = Vec::new();
    for (k, d) in shard_dirs.iter().enumerate() {
        let (p, a) = shard_server(dir.path(), &format!("shard-{k}"), d).await;
        processes.push(p);
        addrs.push(a.to_string());
    }
    let (replica, replica_addr) = shard_server(dir.path(), "shard-1b", &shard_dirs[1]).await;
    let mut replica = Some(replica);
    let mut all = addrs.clone();
    all.push(replica_addr.to_string());
    // The single sidecar and the routers run the same model and mixing file.
    let mixing = write_mixing(dir.path());
    let neural = format!(
        "model = \"{}\"\nmixing = \"{}\"\n",
        smollm2_gguf().display(),
        mixing.display()
    );
    let (_single_process, single_addr) = serve(
        dir.path(),
        "single",
        &format!("index = \"{}\"\n{neural}", single_dir.display()),
    )
    .await;
    let mut reference = SidecarClient::new(connect(single_addr).await);
    let (_ra, mut router_a, channel_a) = router(dir.path(), "router-a", &all, &neural).await;
    let (_rb, mut router_b, _) = router(dir.path(), "router-b", &all, &neural).await;

    let info = router_a
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let expected = reference
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.index_documents, expected.index_documents);
    assert_eq!(info.index_tokens, expected.index_tokens);
    assert_eq!(info.tokenizer_fingerprint, expected.tokenizer_fingerprint);
    assert_eq!(info.index_shards, 3);

    let text = "The quick brown fox jumps over the lazy dog.";
    let ids = reference
        .tokenize(pb::TokenizeRequest { text: text.into() })
        .await
        .unwrap()
        .into_inner()
        .ids;
    let routed = router_b
        .tokenize(pb::TokenizeRequest { text: text.into() })
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert_eq!(routed, ids);

    let qs = queries(&single, 240);
    let mut saw_approx = false;
    for (i, q) in qs.iter().enumerate() {
        let router = if i % 2 == 0 {
            &mut router_a
        } else {
            &mut router_b
        };
        let count = |c: pb::CountResponse| c.count;
        let req = pb::CountRequest {
            ids: q.clone(),
            allow_partial: false,
        };
        assert_eq!(
            count(router.count(req.clone()).await.unwrap().into_inner()),
            count(reference.count(req).await.unwrap().into_inner()),
            "count {q:?}"
        );
        for infinite in [false, true] {
            // Exact distributions: identical to the single index over all the documents.
            let r = ntd(q, infinite, 0);
            assert_eq!(
                router
                    .next_token_distribution(r.clone())
                    .await
                    .unwrap()
                    .into_inner(),
                reference
                    .next_token_distribution(r)
                    .await
                    .unwrap()
                    .into_inner(),
                "ntd {q:?} infinite={infinite}"
            );
            // Subsampled ones: identical to one index over the same three suffix arrays.
            let cap = 16;
            let got = router
                .next_token_distribution(ntd(q, infinite, cap))
                .await
                .unwrap()
                .into_inner();
            let prompt = q.clone();
            let want = match infinite {
                true => joined.infgram_ntd(&prompt, Some(cap)).unwrap(),
                false => {
                    let n = joined.ntd(&prompt, Some(cap)).unwrap();
                    infini_sidecar::index::query::InfgramNtdResult {
                        sparse: n.dist.len() == 1,
                        ntd: n,
                        suffix_len: prompt.len(),
                    }
                }
            };
            saw_approx |= want.ntd.approx;
            assert_eq!(got.prompt_cnt, want.ntd.prompt_cnt);
            assert_eq!(got.approx, want.ntd.approx, "{q:?}");
            assert_eq!(got.suffix_len as usize, want.suffix_len);
            assert_eq!(got.sparse, want.sparse);
            let dist: Vec<(u32, u64)> = got.dist.iter().map(|t| (t.token, t.cont_cnt)).collect();
            let want_dist: Vec<(u32, u64)> = want.ntd.dist.into_iter().collect();
            assert_eq!(dist, want_dist, "sampled ntd {q:?} infinite={infinite}");
        }
    }
    assert!(
        saw_approx,
        "no query was subsampled: the test lost its point"
    );

    // Document searches: one n-gram, a clause of two, and two clauses; documents keep their
    // numbers, text and metadata.
    let common = &qs[3][..1];
    for cnf in [
        vec![vec![qs[1].clone()]],
        vec![vec![qs[2].clone(), qs[5].clone()]],
        vec![vec![common.to_vec()], vec![qs[8][..1].to_vec()]],
        vec![vec![common.to_vec()]],
    ] {
        let r = search(cnf.clone(), 5);
        assert_eq!(
            router_a
                .search_documents(r.clone())
                .await
                .unwrap()
                .into_inner(),
            reference.search_documents(r).await.unwrap().into_inner(),
            "search {cnf:?}"
        );
    }
    // A clause common enough to be subsampled.
    let mut r = search(vec![vec![common.to_vec()]], 3);
    r.max_clause_freq = 7;
    let got = router_b
        .search_documents(r.clone())
        .await
        .unwrap()
        .into_inner();
    let want = reference.search_documents(r).await.unwrap().into_inner();
    assert!(got.approx && want.approx);
    assert_eq!(got.cnt, want.cnt);

    // Subsampled searches are estimates of the suffix arrays' layout: equal to one index over the
    // same three suffix arrays, for one clause and for two.
    for cnf in [
        vec![vec![common.to_vec()]],
        vec![vec![common.to_vec()], vec![qs[8][..1].to_vec()]],
    ] {
        let mut r = search(cnf.clone(), 4);
        r.max_clause_freq = 9;
        let got = router_a.search_documents(r).await.unwrap().into_inner();
        let opts = infini_sidecar::index::docs::SearchOptions {
            maxnum: 4,
            max_disp_len: 40,
            max_clause_freq: 9,
            ..Default::default()
        };
        let want = joined.search_docs_cnf(&cnf, opts).unwrap();
        assert!(want.approx, "{cnf:?} was not subsampled");
        assert_eq!(
            (got.cnt, got.doc_cnt, got.approx),
            (want.cnt, want.doc_cnt, want.approx),
            "{cnf:?}"
        );
        let ixs = |d: &[pb::Document]| d.iter().map(|d| d.doc_ix).collect::<Vec<_>>();
        let want_ixs: Vec<u64> = want.documents.iter().map(|d| d.doc_ix).collect();
        assert_eq!(ixs(&got.documents), want_ixs);
    }
    let status = router_b
        .next_token_distribution(ntd(&qs[0], true, 1 << 40))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // Dense scoring: the shards' per-token evidence merges into the single index's scores.
    for doc in single.documents().take(6) {
        let ids = &doc[..doc.len().min(300)];
        assert_eq!(merged_scores(&addrs, ids).await, single.score(ids).unwrap());
    }

    mixing_scoring_drafts_and_sessions(
        [&mut router_a, &mut router_b],
        &mut reference,
        &joined,
        &mixing,
    )
    .await;
    live_namespaces_behind_routers([&mut router_a, &mut router_b]).await;

    // Errors are the single sidecar's.
    let bad = pb::CountRequest {
        ids: vec![1 << 30],
        allow_partial: false,
    };
    let status = router_a.count(bad).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // Kill one replica of shard 1 in the middle of a stream of queries: the other answers.
    let probe = qs[4].clone();
    let want = single.count(&probe).unwrap();
    let shard1 = Index::open(&shard_dirs[1], &OpenOptions::default())
        .unwrap()
        .count(&probe)
        .unwrap();
    let count_req = |allow_partial| pb::CountRequest {
        ids: probe.clone(),
        allow_partial,
    };
    for i in 0..60 {
        if i == 20 {
            drop(replica.take());
        }
        let got = router_a.count(count_req(false)).await.unwrap().into_inner();
        assert_eq!((got.count, got.partial), (want, None));
    }
    // Then the other: shard 1 is down. Every answer is either right or UNAVAILABLE naming it.
    drop(processes.remove(1));
    for _ in 0..20 {
        match router_b.count(count_req(false)).await {
            Ok(got) => assert_eq!(got.into_inner().count, want),
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert!(status.message().contains("shard 1 of 3"), "{status:?}");
            }
        }
    }
    let status = router_b.count(count_req(false)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("shard 1 of 3"),
        "{}",
        status.message()
    );
    let partial = router_b.count(count_req(true)).await.unwrap().into_inner();
    assert_eq!(
        partial.partial,
        Some(pb::Partial {
            missing_shards: vec![1]
        })
    );
    assert_eq!(partial.count, want - shard1);
    let status = router_a
        .next_token_distribution(ntd(&probe, true, 0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    // Not ready while a shard has no replica.
    wait_ready(&channel_a, ServingStatus::NotServing).await;
    // Mixing and scoring in the router name the shard too.
    let status = router_a
        .mix(own_mix(&probe, Some(mix_request::Lambda::Split(true))))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shard 1 of 3"), "{status:?}");
    let score = pb::ScoreRequest {
        documents: vec![pb::ScoreDocument {
            token_ids: qs[5].clone(),
            ..Default::default()
        }],
        lambda: Some(score_request::Lambda::Split(true)),
        per_token: false,
    };
    let status = match router_a.score(score).await {
        Err(status) => status,
        Ok(answer) => {
            let mut stream = answer.into_inner();
            loop {
                match stream.message().await {
                    Err(status) => break status,
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("scored with a shard down"),
                }
            }
        }
    };
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shard 1 of 3"), "{status:?}");

    // A router over part of a set never becomes ready, and says what is missing.
    let (_rc, _, channel_c) = router_over(dir.path(), "router-c", &addrs[..1], "").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(readiness(&channel_c).await, ServingStatus::NotServing);
    let status = SidecarClient::new(channel_c)
        .info(pb::InfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("shard 1 of 3 has no replica"),
        "{}",
        status.message()
    );
}

/// A mixing file whose gate reads every feature: trained on features that all vary, so a λ
/// computed from any wrong feature would show.
fn write_mixing(dir: &Path) -> PathBuf {
    let mut rng = Rng(0xfea7);
    let rows: Vec<GateFeatures> = (0..400)
        .map(|_| std::array::from_fn(|_| rng.below(1000) as f64 / 100.0))
        .collect();
    let targets: Vec<f64> = rows
        .iter()
        .map(|f| (f.iter().sum::<f64>() / 200.0).min(0.9))
        .collect();
    let opts = GateOptions {
        trees: 6,
        min_samples_leaf: 3,
        ..GateOptions::default()
    };
    save_mixing(dir, Gate::train(&rows, &targets, opts).unwrap())
}

fn draft_tree(r: &pb::DraftResponse) -> (Vec<u32>, Vec<i32>, Vec<f64>) {
    (r.token_ids.clone(), r.parents.clone(), r.probs.clone())
}

fn library_tree(t: &infini_sidecar::draft::DraftTree) -> (Vec<u32>, Vec<i32>, Vec<f64>) {
    (t.token_ids.clone(), t.parents.clone(), t.probs.clone())
}

/// `Mix`, `Score`, `Draft` and a `Session` on routers: the model runs in the router over the
/// shards' evidence. Exact answers equal the single sidecar's; those that read subsamples (the
/// gate's support estimate, drafts) equal the library's over the three shards joined.
async fn mixing_scoring_drafts_and_sessions(
    routers: [&mut SidecarClient<Channel>; 2],
    reference: &mut SidecarClient<Channel>,
    joined: &Arc<Index>,
    mixing: &Path,
) {
    let [router_a, router_b] = routers;
    let params = MixingParams::load(mixing).unwrap();
    // Held-out text: short matches with many occurrences, so the gate's support and drafts sample.
    let tokenizer = crate::common::smollm2_tokenizer();
    let docs: Vec<Vec<u32>> = crate::common::minipile_docs("test", 40)
        .into_iter()
        .filter_map(|d| match d.content {
            infini_sidecar::corpus::Content::Text(t) => Some(tokenizer.encode(&t).unwrap()),
            infini_sidecar::corpus::Content::Tokens(_) => None,
        })
        .filter(|d| d.len() > 40)
        .take(3)
        .map(|d| d[..d.len().min(160)].to_vec())
        .collect();
    use mix_request::Lambda as L;
    for doc in &docs {
        let context = &doc[..doc.len() / 2];
        for lambda in [
            None,
            Some(L::Split(true)),
            Some(L::Adaptive(true)),
            Some(L::FixedLambda(0.3)),
        ] {
            let r = own_mix(context, lambda);
            assert_eq!(
                router_a.mix(r.clone()).await.unwrap().into_inner(),
                reference.mix(r).await.unwrap().into_inner(),
                "mix {lambda:?}"
            );
        }
        // The gate's features: its support estimate samples the matches, so the router's are the
        // joined shards'; the neural ones are the model's, as in the single sidecar.
        let got = router_b
            .mix(own_mix(context, Some(L::Gate(true))))
            .await
            .unwrap()
            .into_inner();
        let single_gated = reference
            .mix(own_mix(context, Some(L::Gate(true))))
            .await
            .unwrap()
            .into_inner();
        let infgram = EvidenceSource::infgram(&**joined, context).unwrap();
        let ctx = joined.context_after(context, &infgram, None).unwrap();
        let nn = NeuralContext {
            entropy: single_gated.gate_features[5],
            top_prob: single_gated.gate_features[6],
        };
        let want = gate_features(&ctx, &nn);
        assert_eq!(got.gate_features, want.to_vec());
        assert_eq!(got.gate_features.len(), NUM_FEATURES);
    }

    // Scoring: exact rules as the single sidecar; the gate's λ as the library's over the joined
    // shards, with the same model.
    use score_request::Lambda as S;
    for lambda in [None, Some(S::Split(true)), Some(S::Adaptive(true))] {
        assert_eq!(
            scores(router_a, &docs, lambda).await,
            scores(reference, &docs, lambda).await,
            "score {lambda:?}"
        );
    }
    let model = Model::load(&smollm2_gguf(), &LoadOptions::default()).unwrap();
    let gated = scores(router_b, &docs, Some(S::Gate(true))).await;
    let mut sampled = false;
    for (i, doc) in docs.iter().enumerate() {
        let records =
            document_records(&model, &**joined, WindowOptions::default(), i, doc, |_| {}).unwrap();
        let mixed = mix_tokens(&records.tokens, LambdaRule::Gate, Some(&params), None).unwrap();
        sampled |= records
            .tokens
            .iter()
            .any(|r| r.prompt_cnt > infini_sidecar::mix::features::SUPPORT_SAMPLES);
        let got: Vec<(f64, f64)> = gated[i]
            .token_scores
            .iter()
            .map(|t| (t.lambda, t.mixed_logprob))
            .collect();
        let want: Vec<(f64, f64)> = mixed.iter().map(|m| (m.lambda, m.logprob)).collect();
        assert_eq!(got, want, "gated score of document {i}");
    }
    assert!(
        sampled,
        "no support was subsampled: the test lost its point"
    );

    // Drafts, a chain and a wide tree of the index's continuations alone (every sampled path
    // shows, with its share of the samples), as the library's over the joined shards.
    let mut drafted = 0;
    for (budget, min_token_prob, min_path_prob) in [(0u32, None, None), (64, Some(0.0), Some(0.0))]
    {
        let wire = pb::DraftOptions {
            tree_budget: budget,
            min_token_prob,
            min_path_prob,
            match_len_factor: min_path_prob.map(|_| 0.0),
            source: match budget {
                0 => pb::DraftSource::All,
                _ => pb::DraftSource::Index,
            } as i32,
            ..Default::default()
        };
        let defaults = DraftOptions::default();
        let opts = DraftOptions {
            tree: budget > 0,
            tree_budget: budget as usize,
            min_token_prob: min_token_prob.unwrap_or(defaults.min_token_prob),
            min_path_prob: min_path_prob.unwrap_or(defaults.min_path_prob),
            match_len_factor: min_path_prob.map_or(defaults.match_len_factor, |_| 0.0),
            source: match budget {
                0 => infini_sidecar::draft::DraftSource::All,
                _ => infini_sidecar::draft::DraftSource::Index,
            },
            ..defaults
        };
        for doc in &docs {
            // The longest prefix whose match has more occurrences than a draft reads.
            let context = (2..doc.len())
                .rev()
                .map(|i| doc[..i].to_vec())
                .find(|c| {
                    EvidenceSource::infgram(&**joined, c)
                        .unwrap()
                        .ntd
                        .prompt_cnt
                        > 200
                })
                .unwrap();
            let want = Sequence::new(joined.clone(), context.clone())
                .unwrap()
                .draft(&opts)
                .unwrap();
            let got = router_a
                .draft(pb::DraftRequest {
                    target: Some(draft_request::Target::Context(pb::TokenIds {
                        ids: context,
                    })),
                    options: Some(wire),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(draft_tree(&got), library_tree(&want), "{wire:?}");
            drafted += want.token_ids.len();
        }
    }
    assert!(drafted > 0, "no draft: the test lost its point");

    // A session: start, mix, append, mix, take back, mix, draft; states and mixtures as the
    // single sidecar's, the draft as the library's sequence after the same steps.
    let doc = &docs[0];
    let half = doc.len() / 2;
    let (tx_r, mut rx_r) = open_session(router_b).await;
    let (tx_s, mut rx_s) = open_session(reference).await;
    use session_request::Step;
    let mix_step = |lambda| {
        Step::Mix(pb::SessionMix {
            neural: Some(pb::session_mix::Neural::OwnModel(true)),
            lambda,
            top_k: 8,
            ..Default::default()
        })
    };
    let steps = vec![
        Step::Start(pb::SessionStart {
            context: doc[..half].to_vec(),
            use_model: true,
            ..Default::default()
        }),
        mix_step(None),
        Step::Append(pb::SessionAppend {
            tokens: doc[half..half + 3].to_vec(),
        }),
        mix_step(Some(pb::session_mix::Lambda::Split(true))),
        mix_step(None),
        Step::Truncate(pb::SessionTruncate {
            length: half as u64 + 1,
        }),
        mix_step(None),
    ];
    for s in steps {
        let mut got = step(&tx_r, &mut rx_r, s.clone()).await;
        let mut want = step(&tx_s, &mut rx_s, s).await;
        assert!(
            !matches!(got.result, Some(pb::session_response::Result::Error(_))),
            "{got:?}"
        );
        // Session ids are each server's own.
        got.state.as_mut().unwrap().session_id = 0;
        want.state.as_mut().unwrap().session_id = 0;
        assert_eq!(got, want);
    }
    // A Batch step of two sequences, each started, appended and mixed (with the model's cache).
    let batch_step = |doc_a: &[u32], doc_b: &[u32]| pb::BatchStep {
        sequences: [(1, doc_a), (2, doc_b)]
            .into_iter()
            .map(|(id, d)| pb::SequenceStep {
                id,
                start: Some(pb::SessionStart {
                    context: d[..d.len() / 2].to_vec(),
                    use_model: true,
                    ..Default::default()
                }),
                append: d[d.len() / 2..d.len() / 2 + 2].to_vec(),
                mix: Some(pb::SessionMix {
                    neural: Some(pb::session_mix::Neural::OwnModel(true)),
                    top_k: 8,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
    };
    let mut batch_answers = Vec::new();
    for client in [&mut *router_a, &mut *reference] {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut answers = client
            .batch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        tx.send(batch_step(&docs[1], &docs[2])).await.unwrap();
        let mut answer = answers.message().await.unwrap().unwrap();
        for s in &mut answer.sequences {
            assert!(s.error.is_none(), "{s:?}");
            s.state.as_mut().unwrap().session_id = 0;
        }
        batch_answers.push(answer);
    }
    assert_eq!(batch_answers[0], batch_answers[1]);

    let got = step(&tx_r, &mut rx_r, Step::Draft(Default::default())).await;
    let Some(pb::session_response::Result::Draft(got)) = got.result else {
        panic!("no draft in the session's answer: {got:?}");
    };
    let mut seq = Sequence::new(joined.clone(), doc[..half].to_vec()).unwrap();
    seq.append(&doc[half..half + 3]).unwrap();
    seq.truncate(half + 1).unwrap();
    let want = seq.draft(&DraftOptions::default()).unwrap();
    assert_eq!(draft_tree(&got), library_tree(&want));
}

fn live_draft(context: &[u32], namespace: &str) -> pb::DraftRequest {
    pb::DraftRequest {
        target: Some(draft_request::Target::Context(pb::TokenIds {
            ids: context.to_vec(),
        })),
        options: Some(pb::DraftOptions {
            source: pb::DraftSource::Live as i32,
            // A one-off draft has no record, so its source is trusted at 0.7 of its word; a bar
            // this low lets a certain continuation run to the full 8 tokens (0.7^8 = 0.058).
            min_path_prob: Some(0.01),
            ..Default::default()
        }),
        namespace: namespace.into(),
        ..Default::default()
    }
}

/// A namespace lives on one shard server whichever router its sequences come through: documents
/// added and tokens learnt behind one router are drafted behind the other.
async fn live_namespaces_behind_routers(routers: [&mut SidecarClient<Channel>; 2]) {
    let [router_a, router_b] = routers;
    // Token runs the corpus does not hold, so only the live index can draft them.
    let added: Vec<u32> = (0..24).map(|i| 30_000 + 7 * i).collect();
    let learnt: Vec<u32> = (0..24).map(|i| 31_000 + 5 * i).collect();
    router_a
        .add_documents(pb::AddDocumentsRequest {
            namespace: "manuals".into(),
            request_id: String::new(),
            documents: vec![pb::LiveDocument {
                content: Some(pb::live_document::Content::Tokens(pb::TokenIds {
                    ids: added.clone(),
                })),
            }],
        })
        .await
        .unwrap();
    let got = router_b
        .draft(live_draft(&added[..10], "manuals"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.token_ids, added[10..18]);

    let (tx, mut replies) = open_session(router_a).await;
    let started = step(
        &tx,
        &mut replies,
        session_request::Step::Start(pb::SessionStart {
            context: learnt[..6].to_vec(),
            namespace: "generations".into(),
            learn: true,
            ..Default::default()
        }),
    )
    .await;
    assert!(started.state.is_some(), "{started:?}");
    let appended = step(
        &tx,
        &mut replies,
        session_request::Step::Append(pb::SessionAppend {
            tokens: learnt[6..].to_vec(),
        }),
    )
    .await;
    assert!(appended.result.is_none(), "{appended:?}");
    let got = router_b
        .draft(live_draft(&learnt[..9], "generations"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.token_ids, learnt[9..17]);
    // Other namespaces see none of it.
    let got = router_b
        .draft(live_draft(&learnt[..9], "manuals"))
        .await
        .unwrap()
        .into_inner();
    assert!(got.token_ids.is_empty());
}
