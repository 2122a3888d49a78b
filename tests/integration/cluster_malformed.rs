//! A router does not trust its shards (issue 49, item 10): a replica that answers nonsense — the
//! corruptions of the probe's `fake_shard.py`, made here by a proxy in front of a real shard server
//! — is down as one that does not answer. Behind a router with an honest second replica every
//! answer is the single index's (the shard server's own `sidecar.v1` answer, the oracle), the
//! refusals counted per replica in the router's metrics and the replica listed down in its `Info`;
//! with the corrupt replica alone, the call fails with UNAVAILABLE naming its address (or, allowed,
//! comes back partial), never with the corrupted values. The real shard's own answers, many and of
//! every kind, pass the validation.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use infini_sidecar::cluster::set::ShardIdentity;
use infini_sidecar::cluster::validate::ShardAnswer;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::mix::features::SUFFIX_LENGTHS;
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::{self, draft_request, mix_request};
use infini_sidecar::server::shard_pb::shard_client::ShardClient;
use infini_sidecar::server::shard_pb::shard_server::{Shard, ShardServer};
use infini_sidecar::server::shard_pb::{self as spb};
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;

use super::cluster::{build_with, corpus, router, shard_server, wait_ready};
use crate::common::server::{connect, free_port, sample, scrape};

/// How the proxy corrupts the answers it forwards (the modes of `fake_shard.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Honest,
    /// Every count 2^64 − 1.
    CountMax,
    /// No counts at all.
    CountShort,
    /// A token id past the vocabulary in the distribution (its count added to prompt_cnt).
    OovDist,
    /// A single next token past the vocabulary.
    OovSingle,
    /// prompt_cnt 0 beside the distribution.
    ZeroCnt,
    /// A match of 4e9 tokens.
    HugeLen,
    /// prompt_cnt and a count 2^64 − 1.
    CntMax,
    /// Draft continuations of ids past the vocabulary.
    OovDraft,
    /// Documents numbered 2^64 − 1 with their needle at 2^63.
    SearchBad,
    /// Spans that run past the end of the traced text.
    SpanPastEnd,
}

const BIG: u32 = 4_000_000_000;

/// A shard replica that forwards to a real shard server and corrupts its answers as `mode` says.
#[derive(Clone)]
struct Corrupting {
    upstream: ShardClient<Channel>,
    mode: Arc<Mutex<Mode>>,
    /// Answers it changed.
    corrupted: Arc<AtomicUsize>,
}

impl Corrupting {
    /// Serves a proxy of the shard server at `upstream` on a fresh loopback port.
    async fn start(upstream: SocketAddr) -> (Self, String) {
        let proxy = Self {
            upstream: ShardClient::new(connect(upstream).await)
                .max_decoding_message_size(usize::MAX),
            mode: Arc::new(Mutex::new(Mode::Honest)),
            corrupted: Arc::new(AtomicUsize::new(0)),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let service = ShardServer::new(proxy.clone())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (proxy, addr)
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn corrupted(&self) -> usize {
        self.corrupted.load(Ordering::SeqCst)
    }

    /// The upstream's `answer`, corrupted as the mode says (counted when that changed it).
    fn serve<T: Clone + PartialEq>(
        &self,
        answer: Result<Response<T>, Status>,
        corrupt: impl FnOnce(Mode, &mut T),
    ) -> Result<Response<T>, Status> {
        let honest = answer?.into_inner();
        let mut sent = honest.clone();
        corrupt(*self.mode.lock().unwrap(), &mut sent);
        if sent != honest {
            self.corrupted.fetch_add(1, Ordering::SeqCst);
        }
        Ok(Response::new(sent))
    }
}

#[tonic::async_trait]
impl Shard for Corrupting {
    async fn describe(
        &self,
        r: Request<spb::DescribeRequest>,
    ) -> Result<Response<spb::ShardDescription>, Status> {
        self.upstream.clone().describe(r.into_inner()).await
    }

    async fn count(
        &self,
        r: Request<spb::CountRequest>,
    ) -> Result<Response<spb::CountAnswer>, Status> {
        let answer = self.upstream.clone().count(r.into_inner()).await;
        self.serve(answer, |mode, a| match mode {
            Mode::CountMax => a.counts.fill(u64::MAX),
            Mode::CountShort => a.counts.clear(),
            _ => {}
        })
    }

    async fn continuations(
        &self,
        r: Request<spb::ContinuationsRequest>,
    ) -> Result<Response<spb::ContinuationsAnswer>, Status> {
        let answer = self.upstream.clone().continuations(r.into_inner()).await;
        self.serve(answer, |mode, a| match mode {
            Mode::OovDist => {
                a.dist_tokens.push(BIG);
                a.dist_counts.push(5);
                a.prompt_cnt += 5;
            }
            Mode::OovSingle => {
                a.spread = spb::Spread::Single as i32;
                a.single = BIG;
            }
            Mode::ZeroCnt => a.prompt_cnt = 0,
            Mode::HugeLen => a.suffix_len = BIG,
            Mode::CntMax => {
                a.prompt_cnt = u64::MAX;
                if let Some(first) = a.dist_counts.first_mut() {
                    *first = u64::MAX;
                }
            }
            Mode::OovDraft => {
                for c in a.drafts.iter_mut().flat_map(|d| &mut d.fine) {
                    c.tokens = vec![BIG; c.tokens.len().max(1)];
                }
            }
            _ => {}
        })
    }

    async fn score_tokens(
        &self,
        r: Request<spb::ScoreTokensRequest>,
    ) -> Result<Response<spb::ScoreTokensAnswer>, Status> {
        self.upstream.clone().score_tokens(r.into_inner()).await
    }

    async fn search_documents(
        &self,
        r: Request<spb::SearchRequest>,
    ) -> Result<Response<spb::SearchAnswer>, Status> {
        let answer = self.upstream.clone().search_documents(r.into_inner()).await;
        self.serve(answer, |mode, a| {
            if mode == Mode::SearchBad {
                for d in &mut a.documents {
                    d.doc_ix = u64::MAX;
                    d.needle_offset = 1 << 63;
                }
            }
        })
    }

    async fn span_lengths(
        &self,
        r: Request<spb::SpanLengthsRequest>,
    ) -> Result<Response<spb::SpanLengthsAnswer>, Status> {
        let answer = self.upstream.clone().span_lengths(r.into_inner()).await;
        self.serve(answer, |mode, a| {
            if mode == Mode::SpanPastEnd {
                a.lengths.fill(BIG);
            }
        })
    }

    async fn live_append(
        &self,
        r: Request<spb::LiveAppendRequest>,
    ) -> Result<Response<spb::LiveAppendAnswer>, Status> {
        self.upstream.clone().live_append(r.into_inner()).await
    }

    async fn live_continuations(
        &self,
        r: Request<spb::LiveContinuationsRequest>,
    ) -> Result<Response<spb::LiveContinuationsAnswer>, Status> {
        self.upstream
            .clone()
            .live_continuations(r.into_inner())
            .await
    }
}

/// The calls of the probe, each on a 40-token context of the corpus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Count,
    Ntd,
    Mix,
    Draft,
    Search,
    Trace,
}

const CALLS: [Call; 6] = [
    Call::Count,
    Call::Ntd,
    Call::Mix,
    Call::Draft,
    Call::Search,
    Call::Trace,
];

/// The calls each mode corrupts an answer of.
fn corrupted_calls(mode: Mode) -> &'static [Call] {
    match mode {
        Mode::Honest => &[],
        // A search counts its n-grams first, and a trace its spans.
        Mode::CountMax | Mode::CountShort => &[Call::Count, Call::Search, Call::Trace],
        Mode::OovDist | Mode::OovSingle | Mode::ZeroCnt | Mode::HugeLen | Mode::CntMax => {
            &[Call::Ntd, Call::Mix, Call::Draft]
        }
        Mode::OovDraft => &[Call::Draft],
        // A trace finds its spans' documents by a search.
        Mode::SearchBad => &[Call::Search, Call::Trace],
        Mode::SpanPastEnd => &[Call::Trace],
    }
}

#[derive(Debug, PartialEq)]
enum Answer {
    Count(pb::CountResponse),
    Ntd(pb::NextTokenDistributionResponse),
    Mix(pb::MixResponse),
    Draft(pb::DraftResponse),
    Search(pb::SearchDocumentsResponse),
    Trace(pb::TraceResponse),
}

async fn call(
    client: &mut SidecarClient<Channel>,
    what: Call,
    context: &[u32],
    allow_partial: bool,
) -> Result<Answer, Status> {
    Ok(match what {
        Call::Count => Answer::Count(
            client
                .count(pb::CountRequest {
                    ids: context[..3].to_vec(),
                    allow_partial,
                })
                .await?
                .into_inner(),
        ),
        Call::Ntd => Answer::Ntd(
            client
                .next_token_distribution(pb::NextTokenDistributionRequest {
                    prompt: context.to_vec(),
                    infinite: true,
                    max_support: 0,
                    allow_partial,
                })
                .await?
                .into_inner(),
        ),
        Call::Mix => Answer::Mix(
            client
                .mix(pb::MixRequest {
                    context: context.to_vec(),
                    neural: Some(mix_request::Neural::Logits(pb::NeuralLogits {
                        logits: vec![0.0; 49_152],
                    })),
                    lambda: Some(mix_request::Lambda::FixedLambda(0.5)),
                    top_k: 3,
                    ..Default::default()
                })
                .await?
                .into_inner(),
        ),
        Call::Draft => Answer::Draft(
            client
                .draft(pb::DraftRequest {
                    target: Some(draft_request::Target::Context(pb::TokenIds {
                        ids: context.to_vec(),
                    })),
                    options: Some(pb::DraftOptions {
                        max_tokens: 8,
                        min_token_prob: Some(0.0),
                        min_path_prob: Some(0.0),
                        source: pb::DraftSource::Index as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await?
                .into_inner(),
        ),
        Call::Search => Answer::Search(
            client
                .search_documents(pb::SearchDocumentsRequest {
                    cnf: vec![pb::Clause {
                        ngrams: vec![pb::NGram {
                            ids: context[..3].to_vec(),
                        }],
                    }],
                    maxnum: 2,
                    max_disp_len: 40,
                    allow_partial,
                    ..Default::default()
                })
                .await?
                .into_inner(),
        ),
        Call::Trace => Answer::Trace(
            client
                .trace(pb::TraceRequest {
                    ids: context.to_vec(),
                    min_len: 4,
                    maxnum: 1,
                    max_disp_len: 8,
                    ..Default::default()
                })
                .await?
                .into_inner(),
        ),
    })
}

/// The real shard server's answers to many requests of every kind pass the validation.
async fn real_answers_pass(shard: SocketAddr, docs: &[Vec<u32>]) {
    let mut client = ShardClient::new(connect(shard).await).max_decoding_message_size(usize::MAX);
    // The shard's description, as a router checks answers against it.
    let description = client
        .describe(spb::DescribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let id = ShardIdentity::from(&description);
    assert!(
        id.local_parts > 1,
        "one suffix array: the samples' checks lost their point"
    );
    let lengths: Vec<u32> = SUFFIX_LENGTHS.iter().map(|&k| k as u32).collect();
    let mut checked = 0;
    for doc in docs {
        for end in [1, 2, 5, 13, 40, 90]
            .into_iter()
            .filter(|&e| e <= doc.len())
        {
            let prompt = doc[end.saturating_sub(12)..end].to_vec();
            let mut altered = prompt.clone();
            *altered.last_mut().unwrap() = (altered[0] * 7 + 11) % 49_152;
            for p in [&prompt, &altered] {
                let ask = spb::CountRequest {
                    ngrams: vec![
                        spb::NGram { ids: p.clone() },
                        spb::NGram { ids: vec![p[0]] },
                    ],
                };
                let a = client.count(ask.clone()).await.unwrap().into_inner();
                assert_eq!(a.validate(&ask, &id), Ok(()), "count {p:?}");
                for (infinite, max_support, depth) in [
                    (false, 0, 0),
                    (true, 0, 0),
                    (false, 16, 0),
                    (true, 16, 0),
                    (true, 8, 8),
                ] {
                    let ask = spb::ContinuationsRequest {
                        prompt: p.clone(),
                        infinite,
                        max_support,
                        count_lengths: lengths.clone(),
                        depth,
                    };
                    let a = client
                        .continuations(ask.clone())
                        .await
                        .unwrap()
                        .into_inner();
                    assert_eq!(a.validate(&ask, &id), Ok(()), "{ask:?}");
                }
                for stride in [1, 3] {
                    let ask = spb::SearchRequest {
                        cnf: vec![spb::Clause {
                            ngrams: vec![spb::NGram {
                                ids: p[p.len().saturating_sub(2)..].to_vec(),
                            }],
                        }],
                        strides: vec![stride],
                        maxnum: 5,
                        max_disp_len: 40,
                    };
                    let a = client
                        .search_documents(ask.clone())
                        .await
                        .unwrap()
                        .into_inner();
                    assert_eq!(a.validate(&ask, &id), Ok(()), "{ask:?}");
                }
                checked += 1;
            }
        }
        let ask = spb::ScoreTokensRequest {
            ids: doc[..doc.len().min(200)].to_vec(),
            support_samples: 16,
            count_lengths: lengths.clone(),
        };
        let a = client.score_tokens(ask.clone()).await.unwrap().into_inner();
        assert_eq!(a.validate(&ask, &id), Ok(()));
    }
    assert!(checked > 40, "{checked}");
    // The live index: what was appended comes back as a draft.
    let append = spb::LiveAppendRequest {
        namespace: "n".into(),
        pieces: vec![spb::LivePiece {
            doc: 1 << 63,
            tokens: (0..24).map(|i| 30_000 + 7 * i).collect(),
        }],
        request_id: String::new(),
        sync: false,
    };
    let a = client
        .live_append(append.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.validate(&append, &id), Ok(()));
    let ask = spb::LiveContinuationsRequest {
        namespace: "n".into(),
        pattern: (0..6).map(|i| 30_000 + 7 * i).collect(),
        samples: 4,
        depth: 8,
    };
    let a = client
        .live_continuations(ask.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(!a.continuations.is_empty());
    assert_eq!(a.validate(&ask, &id), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_that_answers_nonsense_is_down_and_never_relayed() {
    let dir = tempfile::tempdir().unwrap();
    let input = corpus(dir.path());
    // A set of one: the whole index on one shard server, which is also the oracle; in several
    // suffix arrays, whose samples and drafts a router merges.
    let index_dir = dir.path().join("whole");
    build_with(&input, &index_dir, None, &["--max-shard-tokens", "200000"]);
    let (_shard, shard_addr) = shard_server(dir.path(), "shard", &index_dir).await;
    let mut oracle = SidecarClient::new(connect(shard_addr).await);
    let docs: Vec<Vec<u32>> = Index::open(&index_dir, &OpenOptions::default())
        .unwrap()
        .documents()
        .filter(|d| d.len() > 60)
        .take(8)
        .collect();
    let context = docs[0][..40].to_vec();
    real_answers_pass(shard_addr, &docs).await;

    let (proxy, proxy_addr) = Corrupting::start(shard_addr).await;
    let honest = shard_addr.to_string();
    let modes = [
        Mode::CountMax,
        Mode::CountShort,
        Mode::OovDist,
        Mode::OovSingle,
        Mode::ZeroCnt,
        Mode::HugeLen,
        Mode::CntMax,
        Mode::OovDraft,
        Mode::SearchBad,
        Mode::SpanPastEnd,
    ];

    // With an honest replica beside it, every answer is the oracle's. Each (mode, call) gets a
    // router of its own: a replica refused once is tried last from then on.
    for mode in modes {
        for &what in corrupted_calls(mode) {
            proxy.set(mode);
            let metrics = free_port();
            let top = format!("metrics_bind = \"{metrics}\"\n");
            let pair = [honest.clone(), proxy_addr.clone()];
            let (_router, mut client, _) = router(dir.path(), "pair", &pair, &top).await;
            let before = proxy.corrupted();
            // Fan-outs take turns leading with each replica (the turn starts again at each refresh
            // of the set); a Count after every other call moves it on for calls that fan out
            // twice (a draft: its ∞-gram, then its drafts). Until the proxy was asked once.
            for i in 0..24 {
                let want = call(&mut oracle, what, &context, false).await.unwrap();
                let got = call(&mut client, what, &context, false).await;
                assert_eq!(got.unwrap(), want, "{mode:?} {what:?}");
                if proxy.corrupted() > before {
                    break;
                }
                if i % 2 == 0 {
                    call(&mut client, Call::Count, &context, false)
                        .await
                        .unwrap();
                }
            }
            let refused = proxy.corrupted() - before;
            assert!(
                refused > 0,
                "{mode:?} {what:?}: the proxy never corrupted an answer"
            );
            // Every corrupted answer was refused and counted against the proxy's address.
            let text = tokio::task::spawn_blocking(move || scrape(metrics))
                .await
                .unwrap();
            let line = format!("sidecar_shard_malformed_answers_total{{replica=\"{proxy_addr}\"}}");
            assert_eq!(
                sample(&text, &line),
                refused as f64,
                "{mode:?} {what:?}\n{text}"
            );
            let info = client.info(pb::InfoRequest {}).await.unwrap().into_inner();
            let down = format!("{proxy_addr} (malformed answer: ");
            assert!(
                info.replicas_down.iter().any(|r| r.starts_with(&down)),
                "{mode:?} {what:?}: {:?}",
                info.replicas_down
            );
        }
    }

    // The corrupt replica alone: honest, it answers as the oracle; corrupting, the calls it spoils
    // fail naming it, the others still answer.
    proxy.set(Mode::Honest);
    let (_solo, mut solo, solo_channel) =
        router(dir.path(), "solo", std::slice::from_ref(&proxy_addr), "").await;
    for what in CALLS {
        let want = call(&mut oracle, what, &context, false).await.unwrap();
        assert_eq!(call(&mut solo, what, &context, false).await.unwrap(), want);
    }
    for mode in modes {
        proxy.set(mode);
        for what in CALLS {
            let got = call(&mut solo, what, &context, false).await;
            if !corrupted_calls(mode).contains(&what) {
                let want = call(&mut oracle, what, &context, false).await.unwrap();
                assert_eq!(got.unwrap(), want, "{mode:?} {what:?}");
                continue;
            }
            let status = match got {
                Err(status) => status,
                Ok(answer) => panic!("{mode:?} {what:?}: relayed {answer:?}"),
            };
            assert_eq!(
                status.code(),
                Code::Unavailable,
                "{mode:?} {what:?}: {status:?}"
            );
            assert!(
                status.message().contains("shard 0 of 1")
                    && status
                        .message()
                        .contains(&format!("{proxy_addr}: malformed answer: ")),
                "{mode:?} {what:?}: {}",
                status.message()
            );
        }
        // Where the caller allows partial answers: the shard is missing, and flagged.
        if corrupted_calls(mode).contains(&Call::Count) {
            let got = call(&mut solo, Call::Count, &context, true).await.unwrap();
            let want = pb::CountResponse {
                count: 0,
                partial: Some(pb::Partial {
                    missing_shards: vec![0],
                }),
            };
            assert_eq!(got, Answer::Count(want));
        }
    }
    // A replica that answers nonsense is not ready, though it still answers Describe.
    wait_ready(&solo_channel, ServingStatus::NotServing).await;
}
