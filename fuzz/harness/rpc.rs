//! Target `rpc`: every RPC of the service and of the shard protocol, called in-process through the
//! generated `Sidecar` and `Shard` traits as the server would call them, over a tiny index with the
//! tiny tokenizer, a mixing file and no model.
//!
//! The input's first byte picks the RPC (`% RPCS`; with its top bit set the request carries a
//! deadline that has passed). `AddDocuments` writes into a live index with a small budget, so the
//! other RPCs that take a namespace draft from what earlier inputs added. For unary RPCs and `Score` the rest is the request's protobuf
//! encoding; for the streams (`Session`, `Batch`) it is a series of messages, each `len: u16` (little-endian) and `len`
//! bytes, framed as gRPC frames and decoded by tonic's own decoder as a client's stream would be.
//! Besides not panicking, no call may answer INTERNAL: the index is sound, so any failure is the
//! request's and must say so.

use std::path::Path;

use infini_sidecar::index::TokenWidth;
use infini_sidecar::mix::features::GateFeatures;
use infini_sidecar::mix::params::FitRecord;
use infini_sidecar::mix::{Gate, GateOptions, MixingParams, NUM_FEATURES};
use infini_sidecar::server::config::{LiveSection, ServeConfig};
use infini_sidecar::server::pb::sidecar_server::Sidecar;
use infini_sidecar::server::pb::{self, session_request::Step};
use infini_sidecar::server::shard_pb::{self as spb, shard_server::Shard};
use infini_sidecar::server::SidecarService;
use prost::bytes::BufMut;
use prost::Message;
use tokio_stream::StreamExt;
use tonic::codec::{EncodeBody, EncodeBuf, Encoder, Streaming};
use tonic::{Code, Request, Status};

use super::tiny;

/// RPCs in the order the selector byte picks them (new ones go last, so kept inputs keep their RPC).
const RPCS: [&str; 21] = [
    "Info",
    "Tokenize",
    "Detokenize",
    "Count",
    "NextTokenDistribution",
    "SearchDocuments",
    "Mix",
    "Draft",
    "Score",
    "Session",
    "AddDocuments",
    "Batch",
    // sidecar.shard.v1, which routers call on shard servers.
    "Shard/Count",
    "Shard/Continuations",
    "Shard/ScoreTokens",
    "Shard/SearchDocuments",
    "Shard/LiveAppend",
    "Shard/LiveContinuations",
    "Generate",
    "Trace",
    "Hints",
];
const PAST_DEADLINE: u8 = 0x80;

pub struct Fixture {
    service: SidecarService,
    runtime: tokio::runtime::Runtime,
}

/// A mixing file with λ1/λ2 = 0.4/0.05 and a small gate, for the `split` and `gate` λ rules.
fn write_mixing(dir: &Path, fingerprint: &str) -> std::path::PathBuf {
    let rows: Vec<GateFeatures> = (0..100)
        .map(|i| {
            let mut f = [0.0; NUM_FEATURES];
            f[0] = (i % 7) as f64;
            f
        })
        .collect();
    let targets: Vec<f64> = rows.iter().map(|f| f[0] / 10.0).collect();
    let opts = GateOptions {
        trees: 2,
        min_samples_leaf: 5,
        ..GateOptions::default()
    };
    let gate = Gate::train(&rows, &targets, opts).unwrap();
    let params = MixingParams::new(
        "fuzz".into(),
        "fuzz".into(),
        fingerprint.into(),
        (0.4, 0.05),
        Some(gate),
        FitRecord::default(),
    );
    let path = dir.join("mixing.json");
    params.save(&path).unwrap();
    path
}

impl Fixture {
    /// Builds the index and mixing file in `dir`, which must outlive the fixture.
    pub fn new(dir: &Path) -> Self {
        let tokenizer = tiny::tokenizer(dir);
        let spec = tiny::Spec {
            width: TokenWidth::U16,
            eos: tiny::EOS,
            vocab: tiny::VOCAB,
            tokenizer: Some(&tokenizer),
            docs: tiny::documents(30, &tiny::WORDS),
            part_tokens: 96,
        };
        let config = ServeConfig {
            cluster: Default::default(),
            bind: "127.0.0.1:0".parse().unwrap(),
            index: tiny::build_index(dir, "rpc-index", &spec),
            // Fuzzed queries search the sampled ranks too.
            sample_ranks: true,
            mixing: Some(write_mixing(dir, tokenizer.fingerprint())),
            model: None,
            model_threads: None,
            cpu: None,
            metrics_bind: None,
            auth_token_env: None,
            limits: Default::default(),
            // Small enough that a long fuzzing run evicts instead of growing, and freezes tails
            // into runs now and then.
            live: LiveSection {
                budget_tokens: 1 << 16,
                freeze_tokens: 1 << 12,
                ..LiveSection::default()
            },
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        Fixture {
            service: SidecarService::open(&config).unwrap(),
            runtime,
        }
    }

    pub fn run(&self, input: &[u8]) {
        let Some((&selector, body)) = input.split_first() else {
            return;
        };
        let rpc = RPCS[(selector & !PAST_DEADLINE) as usize % RPCS.len()];
        let past_deadline = selector & PAST_DEADLINE != 0;
        self.runtime.block_on(self.call(rpc, body, past_deadline));
    }

    async fn call(&self, rpc: &str, body: &[u8], past_deadline: bool) {
        /// Decodes the body as the RPC's request (a message that does not decode is refused by
        /// tonic before the service sees it) and checks the service's answer.
        macro_rules! unary {
            ($method:ident, $request:ty) => {
                unary!(Sidecar, $method, $request)
            };
            ($service:ident, $method:ident, $request:ty) => {{
                let Ok(message) = <$request>::decode(body) else {
                    return;
                };
                check(
                    rpc,
                    <SidecarService as $service>::$method(
                        &self.service,
                        request(message, past_deadline),
                    )
                    .await
                    .map(drop),
                );
            }};
        }
        let s = &self.service;
        match rpc {
            "Shard/Count" => unary!(Shard, count, spb::CountRequest),
            "Shard/Continuations" => unary!(Shard, continuations, spb::ContinuationsRequest),
            "Shard/ScoreTokens" => unary!(Shard, score_tokens, spb::ScoreTokensRequest),
            "Shard/SearchDocuments" => unary!(Shard, search_documents, spb::SearchRequest),
            "Shard/LiveAppend" => unary!(Shard, live_append, spb::LiveAppendRequest),
            "Shard/LiveContinuations" => {
                unary!(Shard, live_continuations, spb::LiveContinuationsRequest)
            }
            "Info" => unary!(info, pb::InfoRequest),
            "Tokenize" => unary!(tokenize, pb::TokenizeRequest),
            "Detokenize" => unary!(detokenize, pb::DetokenizeRequest),
            "Count" => unary!(count, pb::CountRequest),
            "NextTokenDistribution" => {
                unary!(next_token_distribution, pb::NextTokenDistributionRequest)
            }
            "SearchDocuments" => unary!(search_documents, pb::SearchDocumentsRequest),
            "Mix" => unary!(mix, pb::MixRequest),
            "Draft" => unary!(draft, pb::DraftRequest),
            "AddDocuments" => unary!(add_documents, pb::AddDocumentsRequest),
            "Generate" => unary!(generate, pb::GenerateRequest),
            "Trace" => unary!(trace, pb::TraceRequest),
            "Hints" => unary!(hints, pb::HintsRequest),
            "Score" => {
                let Ok(message) = pb::ScoreRequest::decode(body) else {
                    return;
                };
                match s.score(request(message, past_deadline)).await {
                    Ok(stream) => {
                        let mut stream = stream.into_inner();
                        while let Some(item) = stream.next().await {
                            check(rpc, item.map(drop));
                        }
                    }
                    Err(status) => check(rpc, Err(status)),
                }
            }
            "Session" => {
                let inbound = request(inbound::<pb::SessionRequest>(body), past_deadline);
                match s.session(inbound).await {
                    Ok(stream) => {
                        drain(rpc, stream.into_inner(), |reply| match reply.result {
                            Some(pb::session_response::Result::Error(e)) => vec![e],
                            _ => vec![],
                        })
                        .await
                    }
                    Err(status) => check(rpc, Err(status)),
                }
            }
            "Batch" => {
                let inbound = request(inbound::<pb::BatchStep>(body), past_deadline);
                match s.batch(inbound).await {
                    Ok(stream) => {
                        drain(rpc, stream.into_inner(), |reply| {
                            reply
                                .sequences
                                .into_iter()
                                .filter_map(|r| r.error)
                                .collect()
                        })
                        .await
                    }
                    Err(status) => check(rpc, Err(status)),
                }
            }
            other => unreachable!("{other} is not in RPCS"),
        }
    }
}

/// A stream's body as the service receives it: the input's frames, decoded as `T` one by one.
fn inbound<T: Message + Default + Send + 'static>(body: &[u8]) -> Streaming<T> {
    let frames = EncodeBody::new_client(
        RawFrames,
        tokio_stream::iter(split_frames(body).into_iter().map(Ok)),
        None,
        None,
    );
    Streaming::new_request(
        tonic_prost::ProstDecoder::<T>::default(),
        frames,
        None,
        None,
    )
}

/// Reads a stream's answers to the end, checking the stream's status and every refused step.
async fn drain<T>(
    rpc: &str,
    mut stream: impl tokio_stream::Stream<Item = Result<T, Status>> + Unpin,
    step_errors: impl Fn(T) -> Vec<pb::StepError>,
) {
    while let Some(item) = stream.next().await {
        match item {
            Ok(reply) => {
                for e in step_errors(reply) {
                    check(rpc, Err(Status::new(Code::from(e.code), e.message)));
                }
            }
            Err(status) => check(rpc, Err(status)),
        }
    }
}

fn request<T>(message: T, past_deadline: bool) -> Request<T> {
    let mut request = Request::new(message);
    if past_deadline {
        request
            .metadata_mut()
            .insert("grpc-timeout", "1n".parse().unwrap());
    }
    request
}

/// A sound index answers a bad request with the request's fault, never INTERNAL (which is also
/// what a panic on tokio's blocking pool turns into).
fn check(rpc: &str, outcome: Result<(), Status>) {
    if let Err(status) = outcome {
        assert_ne!(
            status.code(),
            Code::Internal,
            "{rpc} answered INTERNAL: {}",
            status.message()
        );
    }
}

/// A stream's messages: `len: u16` and `len` bytes each (fewer at the end).
fn split_frames(mut body: &[u8]) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    while body.len() >= 2 {
        let len = u16::from_le_bytes([body[0], body[1]]) as usize;
        let end = (2 + len).min(body.len());
        frames.push(body[2..end].to_vec());
        body = &body[end..];
    }
    frames
}

/// Puts bytes into gRPC frames as they are, so the service's decoder sees exactly the input.
struct RawFrames;

impl Encoder for RawFrames {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

/// A stream's input: the selector byte, then each message framed as `len: u16` and its bytes.
fn frames(rpc: &str, messages: impl IntoIterator<Item = impl Message>) -> Vec<u8> {
    let mut body = vec![RPCS.iter().position(|&r| r == rpc).unwrap() as u8];
    for message in messages {
        let bytes = message.encode_to_vec();
        body.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        body.extend_from_slice(&bytes);
    }
    body
}

/// Inputs for one RPC: the selector byte and the encoded request.
fn seed(rpc: &str, message: &impl Message) -> Vec<u8> {
    let selector = RPCS.iter().position(|&r| r == rpc).unwrap() as u8;
    [vec![selector], message.encode_to_vec()].concat()
}

/// A sensible request for every RPC, a session going through every step, and one past deadline.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut logits = vec![0.0f32; tiny::VOCAB as usize];
    logits[97] = 3.0;
    let logits = pb::NeuralLogits { logits };
    let top_k = pb::NeuralTopK {
        tokens: vec![97, 259],
        logprobs: vec![0.5f32.ln(), 0.3f32.ln()],
        rest_mass: 0.2,
    };
    let draft_options = pb::DraftOptions {
        max_tokens: 4,
        tree_budget: 6,
        min_token_prob: Some(0.1),
        source: pb::DraftSource::Index as i32,
        ..Default::default()
    };
    let session: Vec<Step> = vec![
        Step::Start(pb::SessionStart {
            context: vec![259, 97],
            use_model: false,
            ..Default::default()
        }),
        Step::Append(pb::SessionAppend {
            tokens: vec![98, 32],
        }),
        Step::Mix(pb::SessionMix {
            neural: Some(pb::session_mix::Neural::TopKLogprobs(top_k.clone())),
            lambda: Some(pb::session_mix::Lambda::Gate(true)),
            top_k: 3,
            max_match: 0,
        }),
        Step::Draft(draft_options),
        Step::Truncate(pb::SessionTruncate { length: 1 }),
        Step::Start(pb::SessionStart::default()),
    ];
    let session_body = frames(
        "Session",
        session
            .into_iter()
            .map(|step| pb::SessionRequest { step: Some(step) }),
    );
    // A batch: two sequences join, one mixes and drafts, one is named twice, one leaves.
    let batch_step = |sequences| pb::BatchStep { sequences };
    let batch_body = frames(
        "Batch",
        [
            batch_step(vec![
                pb::SequenceStep {
                    id: 1,
                    start: Some(pb::SessionStart {
                        context: vec![259, 97],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                pb::SequenceStep {
                    id: 2,
                    start: Some(pb::SessionStart::default()),
                    append: vec![98],
                    ..Default::default()
                },
            ]),
            batch_step(vec![
                pb::SequenceStep {
                    id: 1,
                    keep: Some(1),
                    append: vec![97, 98],
                    mix: Some(pb::SessionMix {
                        neural: Some(pb::session_mix::Neural::TopKLogprobs(top_k.clone())),
                        top_k: 3,
                        ..Default::default()
                    }),
                    draft: Some(draft_options),
                    ..Default::default()
                },
                pb::SequenceStep {
                    id: 2,
                    finish: true,
                    ..Default::default()
                },
                pb::SequenceStep {
                    id: 2,
                    ..Default::default()
                },
            ]),
        ],
    );
    let mut past_deadline = seed(
        "Count",
        &pb::CountRequest {
            allow_partial: false,
            ids: vec![259],
        },
    );
    past_deadline[0] |= PAST_DEADLINE;
    vec![
        (
            "generate",
            seed(
                "Generate",
                &pb::GenerateRequest {
                    prompt: vec![259, 97],
                    max_new_tokens: 8,
                    levels: Some(0),
                    temperature: 1.0,
                    seed: 3,
                    ..Default::default()
                },
            ),
        ),
        (
            "trace",
            seed(
                "Trace",
                &pb::TraceRequest {
                    text: "a b a b".into(),
                    min_len: 1,
                    maxnum: 2,
                    ..Default::default()
                },
            ),
        ),
        (
            "hints",
            seed(
                "Hints",
                &pb::HintsRequest {
                    sequences: vec![pb::TokenIds {
                        ids: vec![259, 97, 259, 97],
                    }],
                    samples: 3,
                    min_plateau: 2,
                    seed: 5,
                    ..Default::default()
                },
            ),
        ),
        (
            "shard-count",
            seed(
                "Shard/Count",
                &spb::CountRequest {
                    ngrams: vec![spb::NGram { ids: vec![259] }, spb::NGram { ids: vec![] }],
                },
            ),
        ),
        (
            "shard-continuations",
            seed(
                "Shard/Continuations",
                &spb::ContinuationsRequest {
                    prompt: vec![257, 258],
                    infinite: true,
                    max_support: 3,
                    count_lengths: vec![1, 2],
                    depth: 0,
                },
            ),
        ),
        (
            "shard-drafts",
            seed(
                "Shard/Continuations",
                &spb::ContinuationsRequest {
                    prompt: vec![97, 256],
                    infinite: true,
                    max_support: 4,
                    count_lengths: vec![],
                    depth: 3,
                },
            ),
        ),
        (
            "shard-score-tokens",
            seed(
                "Shard/ScoreTokens",
                &spb::ScoreTokensRequest {
                    ids: vec![259, 97, 256, 261],
                    support_samples: 4,
                    count_lengths: vec![1, 2, 3],
                },
            ),
        ),
        (
            "shard-search",
            seed(
                "Shard/SearchDocuments",
                &spb::SearchRequest {
                    cnf: vec![spb::Clause {
                        ngrams: vec![spb::NGram { ids: vec![259] }],
                    }],
                    strides: vec![2],
                    maxnum: 2,
                    max_disp_len: 4,
                },
            ),
        ),
        (
            "shard-live-append",
            seed(
                "Shard/LiveAppend",
                &spb::LiveAppendRequest {
                    namespace: "fuzz".into(),
                    request_id: String::new(),
                    sync: false,
                    pieces: vec![spb::LivePiece {
                        doc: 1 << 63 | 7,
                        tokens: vec![259, 97, 256, 261],
                    }],
                },
            ),
        ),
        (
            "shard-live-continuations",
            seed(
                "Shard/LiveContinuations",
                &spb::LiveContinuationsRequest {
                    namespace: "fuzz".into(),
                    pattern: vec![259, 97],
                    samples: 4,
                    depth: 3,
                },
            ),
        ),
        ("info", seed("Info", &pb::InfoRequest {})),
        (
            "tokenize",
            seed(
                "Tokenize",
                &pb::TokenizeRequest {
                    text: "the bin.\u{e9}r".into(),
                },
            ),
        ),
        (
            "detokenize",
            seed(
                "Detokenize",
                &pb::DetokenizeRequest {
                    ids: vec![259, 97, 256, 261],
                },
            ),
        ),
        (
            "count",
            seed(
                "Count",
                &pb::CountRequest {
                    allow_partial: false,
                    ids: vec![259, 260],
                },
            ),
        ),
        (
            "ntd",
            seed(
                "NextTokenDistribution",
                &pb::NextTokenDistributionRequest {
                    allow_partial: false,
                    prompt: vec![257, 258],
                    infinite: true,
                    max_support: 3,
                },
            ),
        ),
        (
            "search",
            seed(
                "SearchDocuments",
                &pb::SearchDocumentsRequest {
                    allow_partial: false,
                    cnf: vec![
                        pb::Clause {
                            ngrams: vec![
                                pb::NGram { ids: vec![259] },
                                pb::NGram {
                                    ids: vec![260, 261],
                                },
                            ],
                        },
                        pb::Clause {
                            ngrams: vec![pb::NGram { ids: vec![97] }],
                        },
                    ],
                    maxnum: 3,
                    max_disp_len: 4,
                    max_clause_freq: 2,
                },
            ),
        ),
        (
            "mix-logits",
            seed(
                "Mix",
                &pb::MixRequest {
                    context: vec![259, 97],
                    neural: Some(pb::mix_request::Neural::Logits(logits)),
                    lambda: Some(pb::mix_request::Lambda::Split(true)),
                    top_k: 5,
                    sequence_id: String::new(),
                    max_match: 0,
                },
            ),
        ),
        (
            "mix-sequence",
            seed(
                "Mix",
                &pb::MixRequest {
                    context: vec![259, 97, 98],
                    neural: Some(pb::mix_request::Neural::TopKLogprobs(top_k.clone())),
                    lambda: Some(pb::mix_request::Lambda::Adaptive(true)),
                    top_k: 3,
                    sequence_id: "s".into(),
                    max_match: 0,
                },
            ),
        ),
        (
            "mix-top-k",
            seed(
                "Mix",
                &pb::MixRequest {
                    context: vec![98],
                    neural: Some(pb::mix_request::Neural::TopKLogprobs(top_k)),
                    lambda: Some(pb::mix_request::Lambda::FixedLambda(0.3)),
                    top_k: 2,
                    sequence_id: String::new(),
                    max_match: 0,
                },
            ),
        ),
        (
            "draft",
            seed(
                "Draft",
                &pb::DraftRequest {
                    target: Some(pb::draft_request::Target::Context(pb::TokenIds {
                        ids: vec![259, 97, 98],
                    })),
                    options: Some(pb::DraftOptions {
                        tree_budget: 8,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ),
        ),
        (
            "score",
            seed(
                "Score",
                &pb::ScoreRequest {
                    documents: vec![pb::ScoreDocument {
                        token_ids: vec![259, 97],
                        domain: "web".into(),
                    }],
                    lambda: Some(pb::score_request::Lambda::FixedLambda(0.5)),
                    per_token: true,
                },
            ),
        ),
        (
            "add-documents",
            seed(
                "AddDocuments",
                &pb::AddDocumentsRequest {
                    namespace: "agent-1".into(),
                    request_id: String::new(),
                    documents: vec![
                        pb::LiveDocument {
                            content: Some(pb::live_document::Content::Tokens(pb::TokenIds {
                                ids: vec![259, 97, 98, 259, 97],
                            })),
                        },
                        pb::LiveDocument {
                            content: Some(pb::live_document::Content::Text("the bin".into())),
                        },
                    ],
                },
            ),
        ),
        (
            "draft-namespace",
            seed(
                "Draft",
                &pb::DraftRequest {
                    target: Some(pb::draft_request::Target::Context(pb::TokenIds {
                        ids: vec![259, 97],
                    })),
                    namespace: "agent-1".into(),
                    ..Default::default()
                },
            ),
        ),
        ("session", session_body),
        ("batch", batch_body),
        ("past-deadline", past_deadline),
    ]
}
