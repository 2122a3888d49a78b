//! The service's costs on the default index (`cargo bench --bench service`; needs the assets of
//! `scripts/run-default.sh`): `Mix` latency and throughput with caller top-64 log-probs and with a
//! full 49,152-float vector, in-process (the handler called directly) and over gRPC on loopback, and
//! the cost of a `Session` step (append one token, mix) at context 40 and 4,000 against resending
//! the context in a unary `Mix`, and a `Batch` engine step at batch 1 to 128 (each sequence a real
//! document: one token appended, then a top-64 mix or a chain draft), split into a fixed and a
//! per-sequence part, with the CPU the steps took (client and server together), how busy the cores
//! were, and what protobuf alone costs a step. Writes `eval/results/service.json`; eval/SERVICE.md
//! discusses it.

mod common;

use common::{assets, measure, median};

use prost::Message;

use std::cell::Cell;
use std::path::PathBuf;
use std::time::Instant;

use infini_sidecar::corpus::{expand_inputs, text_documents, Content};
use infini_sidecar::server::config::ServeConfig;
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::sidecar_server::Sidecar;
use infini_sidecar::server::pb::{self, mix_request, session_mix, session_request};
use infini_sidecar::server::SidecarService;
use infini_sidecar::tokenizer::Tokenizer;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

fn config() -> ServeConfig {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut c = ServeConfig::load(&repo.join("configs/default.toml")).unwrap();
    c.model = None;
    c.metrics_bind = None;
    c
}

/// 4,040 tokens of real test-split text.
fn long_context(service_tokenizer: &infini_sidecar::tokenizer::Tokenizer) -> Vec<u32> {
    let files = expand_inputs(&[assets().join("minipile/test.jsonl")]).unwrap();
    let mut ids = Vec::new();
    for doc in text_documents(files) {
        if let Content::Text(t) = doc.unwrap().content {
            ids.extend(service_tokenizer.encode(&t).unwrap());
        }
        if ids.len() >= 4_040 + 1_000 {
            break;
        }
    }
    ids
}

fn top_64() -> pb::NeuralTopK {
    let logprobs: Vec<f32> = (0..64).map(|k| -4.0 - 0.05 * k as f32).collect();
    pb::NeuralTopK {
        tokens: (0..64).map(|k| k * 701 + 11).collect(),
        rest_mass: 1.0 - logprobs.iter().map(|&l| (l as f64).exp()).sum::<f64>(),
        logprobs,
    }
}

fn full_logits() -> Vec<f32> {
    (0..49_152)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
        .collect()
}

fn mix_request(context: &[u32], neural: mix_request::Neural) -> pb::MixRequest {
    pb::MixRequest {
        context: context.to_vec(),
        neural: Some(neural),
        lambda: Some(mix_request::Lambda::Split(true)),
        top_k: 16,
        sequence_id: String::new(),
        max_match: 0,
    }
}

async fn session_steps(
    client: &mut SidecarClient<Channel>,
    context: &[u32],
    next: &[u32],
) -> serde_json::Value {
    let (tx, rx) = mpsc::channel(2);
    let mut replies = client
        .session(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let send = |step| pb::SessionRequest { step: Some(step) };
    tx.send(send(session_request::Step::Start(pb::SessionStart {
        context: context.to_vec(),
        use_model: false,
        ..Default::default()
    })))
    .await
    .unwrap();
    replies.message().await.unwrap().unwrap();
    let mix = session_request::Step::Mix(pb::SessionMix {
        neural: Some(session_mix::Neural::TopKLogprobs(top_64())),
        lambda: Some(session_mix::Lambda::Split(true)),
        top_k: 16,
        max_match: 0,
    });
    let tx = &tx;
    // Each measured call borrows the reply stream in turn.
    let replies = tokio::sync::Mutex::new(&mut replies);
    measure(next.len() * 10 / 11, |i| {
        let mix = mix.clone();
        let replies = &replies;
        async move {
            let append = session_request::Step::Append(pb::SessionAppend {
                tokens: vec![next[i]],
            });
            tx.send(send(append)).await.unwrap();
            tx.send(send(mix)).await.unwrap();
            let mut r = replies.lock().await;
            for _ in 0..2 {
                let reply = r.message().await.unwrap().unwrap();
                assert!(!matches!(
                    reply.result,
                    Some(pb::session_response::Result::Error(_))
                ));
            }
        }
    })
    .await
}

/// What each sequence asks for in a measured batch step.
#[derive(Clone, Copy)]
enum BatchWork {
    /// A top-64 mix by the mixing file's default rule.
    Mix,
    /// A top-64 mix with λ1/λ2.
    MixSplit,
    /// A chain draft of up to 8 tokens (all sources).
    Draft,
}

impl BatchWork {
    fn name(self) -> &'static str {
        match self {
            BatchWork::Mix => "mix_default_rule",
            BatchWork::MixSplit => "mix_split",
            BatchWork::Draft => "draft_chain",
        }
    }

    /// Sequence `id`'s part of a step after `token`, with the caller's `top` log-probs (copied, as
    /// an engine copies its own into each step).
    fn part(self, id: u64, token: u32, top: &pb::NeuralTopK) -> pb::SequenceStep {
        let mix = |lambda| pb::SessionMix {
            neural: Some(session_mix::Neural::TopKLogprobs(top.clone())),
            lambda,
            top_k: 16,
            max_match: 0,
        };
        let mut part = pb::SequenceStep {
            id,
            append: vec![token],
            ..Default::default()
        };
        match self {
            BatchWork::Mix => part.mix = Some(mix(None)),
            BatchWork::MixSplit => part.mix = Some(mix(Some(session_mix::Lambda::Split(true)))),
            BatchWork::Draft => part.draft = Some(pb::DraftOptions::default()),
        }
        part
    }
}

/// `Batch` steps of `batch` sequences (documents of `docs`, started after 64 tokens), each step
/// appending every sequence's next token and asking for `work`; with the timings, one more such
/// step and its answer (not timed), whose encoding and decoding [`codec_cost`] measures.
async fn batch_steps(
    client: &mut SidecarClient<Channel>,
    docs: &[Vec<u32>],
    batch: usize,
    work: BatchWork,
    steps: usize,
) -> (serde_json::Value, pb::BatchStep, pb::BatchStepResult) {
    let (tx, rx) = mpsc::channel(2);
    let mut replies = client
        .batch(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let start = (0..batch)
        .map(|b| pb::SequenceStep {
            id: b as u64,
            start: Some(pb::SessionStart {
                context: docs[b][..64].to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    tx.send(pb::BatchStep { sequences: start }).await.unwrap();
    replies.message().await.unwrap().unwrap();
    let next = Cell::new(0);
    let top = top_64();
    let step = |t: usize| pb::BatchStep {
        sequences: (0..batch)
            .map(|b| {
                let doc = &docs[b];
                work.part(b as u64, doc[64 + t % (doc.len() - 64)], &top)
            })
            .collect(),
    };
    let answered = |answer: &pb::BatchStepResult| {
        assert_eq!(answer.sequences.len(), batch);
        assert!(answer.sequences.iter().all(|s| s.error.is_none()));
    };
    let mut timed = {
        let replies = tokio::sync::Mutex::new(&mut replies);
        let (tx, replies, step, answered) = (&tx, &replies, &step, &answered);
        measure(steps, |_| {
            let request = step(next.replace(next.get() + 1));
            async move {
                tx.send(request).await.unwrap();
                answered(&replies.lock().await.message().await.unwrap().unwrap());
            }
        })
        .await
    };
    // The process's CPU over the timed steps (client and server, with the client building each
    // request and idle workers spinning), a sequence's share.
    timed["cpu_us_per_sequence"] = json!(timed["cpu_us_per_call"].as_f64().unwrap() / batch as f64);
    let last = step(next.get());
    tx.send(last.clone()).await.unwrap();
    let answer = replies.message().await.unwrap().unwrap();
    answered(&answer);
    (timed, last, answer)
}

/// What encoding and decoding a step and its answer cost in one thread (µs), the work of
/// protobuf alone: a floor under every step of this size whatever the sidecar computes, paid
/// once on each side of the connection. The median of several repeats, after one unmeasured, as
/// the server may still be closing the step's stream on the other core.
fn codec_cost(step: &pb::BatchStep, answer: &pb::BatchStepResult) -> serde_json::Value {
    const ROUNDS: u32 = 100;
    const REPEATS: usize = 7;
    let timed = |f: &dyn Fn()| {
        let repeats = (0..=REPEATS).map(|_| {
            let start = Instant::now();
            for _ in 0..ROUNDS {
                f();
            }
            start.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64
        });
        median(repeats.skip(1).collect())
    };
    let (step_bytes, answer_bytes) = (step.encode_to_vec(), answer.encode_to_vec());
    let encode = timed(&|| {
        std::hint::black_box((step.encode_to_vec(), answer.encode_to_vec()));
    });
    let decode = timed(&|| {
        let step = pb::BatchStep::decode(step_bytes.as_slice()).unwrap();
        let answer = pb::BatchStepResult::decode(answer_bytes.as_slice()).unwrap();
        std::hint::black_box((step, answer));
    });
    json!({
        "step_bytes": step_bytes.len(),
        "answer_bytes": answer_bytes.len(),
        "encode_us": encode,
        "decode_us": decode,
        "per_sequence_us": (encode + decode) / step.sequences.len() as f64,
    })
}

/// Mean step time (µs) at each batch size fitted as fixed + per-sequence × batch (least squares).
fn fixed_and_per_sequence(points: &[(usize, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0 as f64).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let cov: f64 = points
        .iter()
        .map(|p| (p.0 as f64 - mean_x) * (p.1 - mean_y))
        .sum();
    let var: f64 = points.iter().map(|p| (p.0 as f64 - mean_x).powi(2)).sum();
    let slope = cov / var;
    (mean_y - slope * mean_x, slope)
}

async fn batch_report(
    client: &mut SidecarClient<Channel>,
    tokenizer: &Tokenizer,
) -> serde_json::Value {
    let docs = common::test_documents(&assets(), tokenizer, 64 + 200, 128);
    let mut report = serde_json::Map::new();
    for work in [BatchWork::Mix, BatchWork::MixSplit, BatchWork::Draft] {
        let mut points = Vec::new();
        let mut sizes = serde_json::Map::new();
        for batch in [1, 8, 32, 64, 128] {
            // At least 120 steps at every size: the fit leans on the largest batches.
            let steps = (16_000 / batch).clamp(120, 600);
            let (m, step, answer) = batch_steps(client, &docs, batch, work, steps).await;
            let mean = 1e6 / m["per_second"].as_f64().unwrap();
            let codec = codec_cost(&step, &answer);
            println!(
                "Batch {} at {batch}: {m}, mean {mean:.0} µs; protobuf alone {codec}",
                work.name()
            );
            points.push((batch, mean));
            sizes.insert(
                batch.to_string(),
                json!({"step": m, "mean_us": mean, "per_sequence_us": mean / batch as f64,
                       "protobuf": codec}),
            );
        }
        let (fixed, per_sequence) = fixed_and_per_sequence(&points);
        println!(
            "Batch {}: fixed {fixed:.0} µs + {per_sequence:.1} µs a sequence",
            work.name()
        );
        report.insert(
            work.name().into(),
            json!({"sizes": sizes, "fixed_us": fixed, "per_sequence_us": per_sequence}),
        );
    }
    serde_json::Value::Object(report)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let config = config();
    let service = SidecarService::open(&config).unwrap();
    let tokenizer = Tokenizer::from_file(&config.index.join("tokenizer.json")).unwrap();
    let ids = long_context(&tokenizer);
    let (context_4000, next) = (&ids[..4_000], &ids[4_000..5_000]);
    let context_40 = &context_4000[4_000 - 40..];

    let served = common::Served::start(config);
    let client = served.client().await;
    // The floor: an RPC that does no work.
    let info = measure(3_000, |_| {
        let mut c = client.clone();
        async move {
            c.info(pb::InfoRequest {}).await.unwrap();
        }
    })
    .await;
    println!("Info: {info}");

    let mut report = serde_json::Map::new();
    report.insert("info_grpc".into(), info);
    let cases: [(&str, mix_request::Neural, usize); 2] = [
        ("top64", mix_request::Neural::TopKLogprobs(top_64()), 3_000),
        (
            "full_logits",
            mix_request::Neural::Logits(pb::NeuralLogits {
                logits: full_logits(),
            }),
            600,
        ),
    ];
    for (name, neural, n) in cases {
        let request = mix_request(context_40, neural);
        let in_process = measure(n, |_| {
            let r = request.clone();
            let s = &service;
            async move {
                s.mix(tonic::Request::new(r)).await.unwrap();
            }
        })
        .await;
        let grpc = measure(n, |_| {
            let r = request.clone();
            let mut c = client.clone();
            async move {
                c.mix(r).await.unwrap();
            }
        })
        .await;
        println!("Mix {name}: in-process {in_process}, gRPC {grpc}");
        report.insert(format!("mix_{name}_in_process"), in_process);
        report.insert(format!("mix_{name}_grpc"), grpc);
    }
    // Throughput with 4 clients at once.
    let request = mix_request(context_40, mix_request::Neural::TopKLogprobs(top_64()));
    let start = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (mut c, r) = (client.clone(), request.clone());
            tokio::spawn(async move {
                for _ in 0..1_000 {
                    c.mix(r.clone()).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let per_second = 4_000.0 / start.elapsed().as_secs_f64();
    println!("Mix top64, 4 clients: {per_second:.0}/s");
    report.insert(
        "mix_top64_grpc_4_clients_per_second".into(),
        json!(per_second),
    );

    for (name, context) in [("40", context_40), ("4000", context_4000)] {
        let mut c = client.clone();
        let step = session_steps(&mut c, context, next).await;
        // Resending: a unary Mix of the whole context, one token longer each call.
        let mut grown = context.to_vec();
        let resend = measure(300, |i| {
            grown.push(next[i % next.len()]);
            let r = mix_request(&grown, mix_request::Neural::TopKLogprobs(top_64()));
            let mut c = client.clone();
            async move {
                c.mix(r).await.unwrap();
            }
        })
        .await;
        println!("context {name}: session step {step}, resending {resend}");
        report.insert(format!("session_step_context_{name}"), step);
        report.insert(format!("resend_context_{name}"), resend);
    }
    let mut c = client.clone();
    report.insert("batch".into(), batch_report(&mut c, &tokenizer).await);
    report.insert(
        "cpu".into(),
        json!(infini_sidecar::cpu::CpuInfo::detect().summary()),
    );
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/results/service.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    println!("wrote {}", out.display());
    served.stop();
}
