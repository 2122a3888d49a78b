//! The service with its own model (real SmolLM2): `Score` equals the evaluator's records mixed by
//! hand, sessions equal the library's cached decoding and fresh ∞-gram lookups, bad steps are
//! answered in-band and change nothing, metrics count what was served, deadlines stop `Score`, and a
//! shutdown lets a running `Score` finish while refusing new calls.

use crate::common;

use std::sync::OnceLock;
use std::time::Duration;

use common::server::{
    build_index, config, free_port, open_session, sample, scrape, start, step, with_model, Running,
};
use infini_sidecar::corpus::Content;
use infini_sidecar::cpu::{CpuInfo, KernelFlavour};
use infini_sidecar::eval::documents::{load_documents, TokenBudget};
use infini_sidecar::eval::records::Collector;
use infini_sidecar::eval::report::build_report;
use infini_sidecar::evidence::{self, document_records};
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::mix::{self, LambdaRule, MixingParams, NeuralDistribution, SparseDistribution};
use infini_sidecar::model::{Model, WindowOptions};
use infini_sidecar::server::config::ServeConfig;
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::{self, mix_request, score_response, session_mix, session_request};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::Code;

fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| Model::load(&common::smollm2_gguf(), &Default::default()).unwrap())
}

/// Real test-split documents, tokenized with the model's BOS.
fn test_documents(n: usize, max_tokens: usize) -> Vec<Vec<u32>> {
    common::minipile_docs("test", n)
        .iter()
        .map(|d| match &d.content {
            Content::Text(t) => {
                let mut ids = model().encode_document(t).unwrap();
                ids.truncate(max_tokens);
                ids
            }
            Content::Tokens(_) => unreachable!(),
        })
        .collect()
}

fn top_k_request(context: &[u32], lambda: Option<mix_request::Lambda>) -> pb::MixRequest {
    pb::MixRequest {
        context: context.to_vec(),
        neural: Some(mix_request::Neural::TopKLogprobs(caller_top_k())),
        lambda,
        top_k: 8,
        sequence_id: String::new(),
        max_match: 0,
    }
}

/// A caller's top-k log-probs over a few ids, the rest of the mass spread.
fn caller_top_k() -> pb::NeuralTopK {
    pb::NeuralTopK {
        tokens: vec![13, 198, 256, 1000],
        logprobs: vec![-1.0, -2.0, -2.5, -3.0],
        rest_mass: 1.0
            - [-1.0f64, -2.0, -2.5, -3.0]
                .iter()
                .map(|l| l.exp())
                .sum::<f64>(),
    }
}

async fn score_all(
    client: &mut SidecarClient<Channel>,
    request: tonic::Request<pb::ScoreRequest>,
) -> Result<Vec<score_response::Item>, tonic::Status> {
    let mut stream = client.score(request).await?.into_inner();
    let mut items = Vec::new();
    while let Some(r) = stream.message().await? {
        items.extend(r.item);
    }
    Ok(items)
}

fn step_error(r: &pb::SessionResponse) -> Option<(Code, String)> {
    match &r.result {
        Some(pb::session_response::Result::Error(e)) => {
            Some((Code::from(e.code), e.message.clone()))
        }
        _ => None,
    }
}

fn mix_of(r: pb::SessionResponse) -> pb::MixResponse {
    match r.result {
        Some(pb::session_response::Result::Mix(m)) => m,
        other => panic!("expected a mix, got {other:?}"),
    }
}

fn session_mix(neural: session_mix::Neural) -> session_request::Step {
    session_request::Step::Mix(pb::SessionMix {
        neural: Some(neural),
        lambda: Some(session_mix::Lambda::FixedLambda(0.3)),
        top_k: 8,
        max_match: 0,
    })
}

/// The library's top 8 of the mixture at λ 0.3 for `context`, with these model logits.
fn library_mix(index: &Index, context: &[u32], logits: &[f32]) -> Vec<(u32, f64)> {
    let infgram = index.infgram_ntd(context, None).unwrap();
    mix::mix(
        &SparseDistribution::from_ntd(&infgram.ntd),
        &NeuralDistribution::from_logits(logits).unwrap(),
        0.3,
        8,
    )
    .top
}

fn top_of(m: &pb::MixResponse) -> Vec<(u32, f64)> {
    m.top.iter().map(|t| (t.token, t.prob)).collect()
}

/// One `mix` step with the sidecar's own model.
async fn own_model_mix(
    tx: &mpsc::Sender<pb::SessionRequest>,
    replies: &mut tonic::Streaming<pb::SessionResponse>,
) -> pb::MixResponse {
    mix_of(
        step(
            tx,
            replies,
            session_mix(session_mix::Neural::OwnModel(true)),
        )
        .await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_sessions_and_own_model_match_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_model(dir.path());
    let index = Index::open(&config.index, &OpenOptions::default()).unwrap();
    let params = MixingParams::load(config.mixing.as_ref().unwrap()).unwrap();
    // A free port for the metrics endpoint.
    let metrics_port = free_port();
    let config = ServeConfig {
        metrics_bind: Some(metrics_port),
        ..config
    };
    let Running {
        mut client, stop, ..
    } = start(config).await;
    let model = model();

    // Info names the CPU and the kernel flavour the model runs (the one INFINI_SIDECAR_CPU asks
    // for, else the best this CPU has).
    let info = client.info(pb::InfoRequest {}).await.unwrap().into_inner();
    let flavour = KernelFlavour::requested(None).unwrap();
    assert_eq!(info.kernel_flavour, flavour.name());
    assert_eq!(info.cpu_model, CpuInfo::detect().model);

    // Score: two documents, the second of a domain; split λ (domain pair falls back to global).
    let docs = test_documents(2, 300);
    let request = pb::ScoreRequest {
        documents: docs
            .iter()
            .enumerate()
            .map(|(i, d)| pb::ScoreDocument {
                token_ids: d.clone(),
                domain: if i == 1 {
                    "linux-doc".into()
                } else {
                    String::new()
                },
            })
            .collect(),
        lambda: Some(pb::score_request::Lambda::Split(true)),
        per_token: true,
    };
    let items = score_all(&mut client, tonic::Request::new(request))
        .await
        .unwrap();
    assert_eq!(items.len(), 3);
    let (mut neural_nll, mut mixed_nll, mut tokens) = (0.0, 0.0, 0u64);
    for (i, (item, doc)) in items.iter().zip(&docs).enumerate() {
        let score_response::Item::Document(got) = item else {
            panic!("document {i} missing");
        };
        let records =
            document_records(model, &index, WindowOptions::default(), i, doc, |_| {}).unwrap();
        let want = &records.tokens;
        assert_eq!(got.tokens as usize, doc.len() - 1);
        assert_eq!(got.token_scores.len(), want.len());
        let domain = (i == 1).then_some("linux-doc");
        let sparse: Vec<bool> = want.iter().map(|r| r.sparse).collect();
        let lambdas =
            evidence::lambdas(LambdaRule::DomainSplit, Some(&params), domain, &sparse, &[])
                .unwrap();
        for ((g, w), l) in got.token_scores.iter().zip(want).zip(&lambdas) {
            assert_eq!(g.token, w.token);
            assert_eq!(g.infgram_prob, w.infgram_prob);
            assert_eq!((g.sparse, g.suffix_len as usize), (w.sparse, w.suffix_len));
            assert!((g.neural_logprob - w.neural_logprob).abs() < 1e-4);
            assert_eq!(g.lambda, *l);
            let p = mix::mixed_prob(w.infgram_prob, (g.neural_logprob as f64).exp(), *l);
            assert!((g.mixed_logprob - p.ln()).abs() < 1e-9);
        }
        neural_nll += got.neural_nll;
        mixed_nll += got.mixed_nll;
        tokens += got.tokens;
    }
    let score_response::Item::Totals(totals) = &items[2] else {
        panic!("totals missing");
    };
    assert_eq!(totals.tokens, tokens);
    assert!((totals.mixed_nll - mixed_nll).abs() < 1e-6);
    assert!((totals.neural_perplexity - (neural_nll / tokens as f64).exp()).abs() < 1e-6);

    // Unary Mix with the own model: the library's next-token logits over the context.
    let context = &docs[0][..120];
    let own = client
        .mix(pb::MixRequest {
            context: context.to_vec(),
            neural: Some(mix_request::Neural::OwnModel(true)),
            lambda: Some(mix_request::Lambda::FixedLambda(0.3)),
            top_k: 8,
            sequence_id: String::new(),
            max_match: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let t = model.transformer();
    let logits: Vec<f32> = t
        .forward_last(context, &mut t.new_cache())
        .unwrap()
        .to_vec1()
        .unwrap();
    let infgram = index.infgram_ntd(context, None).unwrap();
    let want = library_mix(&index, context, &logits);
    assert_eq!(top_of(&own), want);

    // A session: every step's ∞-gram view equals a fresh lookup of the whole context, and its own
    // model equals the library's cached decoding (prefill, then one token at a time).
    let (tx, mut replies) = open_session(&mut client).await;
    let early = step(
        &tx,
        &mut replies,
        session_mix(session_mix::Neural::OwnModel(true)),
    )
    .await;
    assert_eq!(step_error(&early).unwrap().0, Code::FailedPrecondition);
    let started = step(
        &tx,
        &mut replies,
        session_request::Step::Start(pb::SessionStart {
            context: context.to_vec(),
            use_model: true,
            ..Default::default()
        }),
    )
    .await;
    let state = started.state.unwrap();
    assert_eq!(state.length as usize, context.len());
    assert_eq!(state.suffix_len as usize, infgram.suffix_len);
    let first = own_model_mix(&tx, &mut replies).await;
    assert_eq!(top_of(&first), want);

    let mut cache = t.new_cache();
    t.forward_last(context, &mut cache).unwrap();
    let mut seq = context.to_vec();
    for &next in &docs[0][120..130] {
        seq.push(next);
        let logits: Vec<f32> = t
            .forward_last(&[next], &mut cache)
            .unwrap()
            .to_vec1()
            .unwrap();
        let appended = step(
            &tx,
            &mut replies,
            session_request::Step::Append(pb::SessionAppend { tokens: vec![next] }),
        )
        .await;
        assert!(step_error(&appended).is_none());
        let m = own_model_mix(&tx, &mut replies).await;
        let infgram = index.infgram_ntd(&seq, None).unwrap();
        assert_eq!(top_of(&m), library_mix(&index, &seq, &logits));
        assert_eq!(m.suffix_len as usize, infgram.suffix_len);
        assert_eq!(m.prompt_cnt, infgram.ntd.prompt_cnt);
    }
    // Caller top-k in a session equals the unary Mix of the same context, with λ1/λ2.
    let split_mix = session_request::Step::Mix(pb::SessionMix {
        neural: Some(session_mix::Neural::TopKLogprobs(caller_top_k())),
        lambda: Some(session_mix::Lambda::Split(true)),
        top_k: 8,
        max_match: 0,
    });
    let in_session = mix_of(step(&tx, &mut replies, split_mix.clone()).await);
    let unary = client
        .mix(top_k_request(&seq, Some(mix_request::Lambda::Split(true))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(in_session, unary);

    // Taking tokens back: the state is that of the shorter context, own model included.
    let back = step(
        &tx,
        &mut replies,
        session_request::Step::Truncate(pb::SessionTruncate { length: 125 }),
    )
    .await;
    assert_eq!(back.state.as_ref().unwrap().length, 125);
    let after = mix_of(step(&tx, &mut replies, split_mix.clone()).await);
    let unary = client
        .mix(top_k_request(
            &seq[..125],
            Some(mix_request::Lambda::Split(true)),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after, unary);
    // The session's cache holds the context's prefill, then tokens decoded one at a time.
    let mut cache = t.new_cache();
    t.forward_last(context, &mut cache).unwrap();
    let mut logits = Vec::new();
    for &next in &seq[120..125] {
        logits = t
            .forward_last(&[next], &mut cache)
            .unwrap()
            .to_vec1()
            .unwrap();
    }
    let m = own_model_mix(&tx, &mut replies).await;
    assert_eq!(top_of(&m), library_mix(&index, &seq[..125], &logits));

    // Bad steps: answered in-band, the session unchanged.
    let vocab = index.vocab_size() as u32;
    for (bad, code) in [
        (
            session_request::Step::Append(pb::SessionAppend {
                tokens: vec![5, vocab + 1],
            }),
            Code::InvalidArgument,
        ),
        (
            session_request::Step::Truncate(pb::SessionTruncate { length: 10_000 }),
            Code::InvalidArgument,
        ),
        (
            session_request::Step::Start(pb::SessionStart {
                context: vec![1],
                use_model: false,
                ..Default::default()
            }),
            Code::FailedPrecondition,
        ),
        (
            session_request::Step::Mix(pb::SessionMix {
                neural: Some(session_mix::Neural::TopKLogprobs(caller_top_k())),
                lambda: None,
                top_k: 0,
                max_match: 0,
            }),
            Code::InvalidArgument,
        ),
    ] {
        let r = step(&tx, &mut replies, bad).await;
        assert_eq!(step_error(&r).unwrap().0, code, "{r:?}");
        assert_eq!(r.state.as_ref().unwrap().length, 125);
    }
    let again = mix_of(step(&tx, &mut replies, split_mix).await);
    assert_eq!(again, after);
    drop(tx);
    assert!(replies.message().await.unwrap().is_none());

    // A session without the model cannot use it.
    let (tx, mut replies) = open_session(&mut client).await;
    let start = session_request::Step::Start(pb::SessionStart {
        context: context.to_vec(),
        use_model: false,
        ..Default::default()
    });
    assert!(step_error(&step(&tx, &mut replies, start).await).is_none());
    let r = step(
        &tx,
        &mut replies,
        session_mix(session_mix::Neural::OwnModel(true)),
    )
    .await;
    assert_eq!(step_error(&r).unwrap().0, Code::FailedPrecondition);
    drop(tx);

    // A deadline stops Score between documents.
    let long = test_documents(3, 1000);
    let mut request = tonic::Request::new(pb::ScoreRequest {
        documents: long
            .into_iter()
            .map(|d| pb::ScoreDocument {
                token_ids: d,
                domain: String::new(),
            })
            .collect(),
        lambda: Some(pb::score_request::Lambda::FixedLambda(0.2)),
        per_token: false,
    });
    request.set_timeout(Duration::from_millis(300));
    let err = score_all(&mut client, request).await.unwrap_err();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );

    // Metrics: what was served, by method and code.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = tokio::task::spawn_blocking(move || scrape(metrics_port))
        .await
        .unwrap();
    assert_eq!(
        sample(
            &text,
            "sidecar_requests_total{method=\"Score\",code=\"Ok\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(&text, "sidecar_requests_total{method=\"Mix\",code=\"Ok\"}"),
        3.0
    );
    assert_eq!(
        sample(
            &text,
            "sidecar_requests_total{method=\"Session.append\",code=\"InvalidArgument\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "sidecar_request_seconds_count{method=\"Session.append\"}"
        ),
        11.0
    );
    assert_eq!(sample(&text, "sidecar_in_flight "), 0.0);
    assert_eq!(sample(&text, "sidecar_sessions "), 0.0);
    let _ = stop.send(());
}

/// Relative difference.
fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

/// `Score` and `eval ppl` give the same figures for the same documents and rule: λ1/λ2 (the domain's
/// pair), the gate, and a fixed λ at both ends, 0 and 1, which neither may take literally (λ = 1 gives
/// a token the ∞-gram never saw probability 0, an infinite NLL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_matches_eval_ppl_for_every_rule_and_lambda_0_and_1() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_model(dir.path());
    let index = Index::open(&config.index, &OpenOptions::default()).unwrap();
    let params = MixingParams::load(config.mixing.as_ref().unwrap()).unwrap();
    let Running {
        mut client, stop, ..
    } = start(config).await;
    let model = model();

    // eval ppl's figures over a few documents of every domain.
    let test_jsonl = common::assets().join("minipile/test.jsonl");
    let mut docs =
        load_documents(&[test_jsonl], model, TokenBudget::PerDomain(150), Some(150)).unwrap();
    // The evaluator goes through the domains in order: so does the request, for the same sums.
    docs.sort_by(|a, b| a.domain.cmp(&b.domain));
    let window = WindowOptions::default();
    let domains = Collector {
        model,
        index: &index,
        window,
        work_dir: None,
    }
    .collect(&docs)
    .unwrap();
    let report = build_report(
        String::new(),
        String::new(),
        (window.window, window.stride),
        &domains,
        &params,
        model.tokenizer(),
    )
    .unwrap();
    let unseen = domains
        .iter()
        .flat_map(|d| &d.tokens)
        .filter(|t| t.infgram_prob == 0.0)
        .count();
    assert!(
        unseen > 0,
        "no token the ∞-gram never saw: λ = 1 tests nothing"
    );
    let (lambda_0, ppl_0) = report.perplexity_by_lambda[0];
    let (lambda_1, ppl_1) = *report.perplexity_by_lambda.last().unwrap();

    let total = &report.total;
    let cases = [
        (
            pb::score_request::Lambda::Split(true),
            total.domain_split_perplexity,
            None,
        ),
        (
            pb::score_request::Lambda::Gate(true),
            total.gate_perplexity.unwrap(),
            None,
        ),
        (
            pb::score_request::Lambda::FixedLambda(0.0),
            ppl_0,
            Some(lambda_0),
        ),
        (
            pb::score_request::Lambda::FixedLambda(1.0),
            ppl_1,
            Some(lambda_1),
        ),
    ];
    // Every case is checked before the test fails, so a failure shows all that disagree.
    let mut disagreements = Vec::new();
    for (lambda, want_ppl, want_lambda) in cases {
        let request = pb::ScoreRequest {
            documents: docs
                .iter()
                .map(|d| pb::ScoreDocument {
                    token_ids: d.tokens.clone(),
                    domain: d.domain.clone(),
                })
                .collect(),
            lambda: Some(lambda),
            per_token: true,
        };
        let items = score_all(&mut client, tonic::Request::new(request))
            .await
            .unwrap();
        let Some(score_response::Item::Totals(totals)) = items.last() else {
            panic!("totals missing");
        };
        assert_eq!(totals.tokens as usize, total.tokens_scored);
        assert_eq!(totals.bytes as usize, total.bytes_scored);
        assert!(rel(totals.neural_bits_per_byte, total.bits_per_byte["neural"]) < 1e-6);
        assert!(
            rel(totals.neural_perplexity, total.neural_perplexity) < 1e-6,
            "{lambda:?}: neural {} vs eval ppl {}",
            totals.neural_perplexity,
            total.neural_perplexity
        );
        // Written so that an infinite or NaN perplexity counts as a disagreement.
        let agrees = rel(totals.mixed_perplexity, want_ppl) < 1e-6;
        if !agrees {
            disagreements.push(format!(
                "{lambda:?}: Score {} vs eval ppl {want_ppl}",
                totals.mixed_perplexity
            ));
        }
        if let Some(want) = want_lambda {
            for item in &items[..items.len() - 1] {
                let score_response::Item::Document(d) = item else {
                    panic!("a document expected");
                };
                if let Some(t) = d.token_scores.iter().find(|t| t.lambda != want) {
                    disagreements.push(format!(
                        "{lambda:?}: Score's λ {} vs eval ppl's {want}",
                        t.lambda
                    ));
                    break;
                }
            }
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_model_or_mixing_file_the_preconditions_fail() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let Running {
        mut client, stop, ..
    } = start(ServeConfig {
        mixing: None,
        ..config(dir.path(), index, false)
    })
    .await;
    let context = vec![504, 3458, 281];
    let err = client
        .mix(top_k_request(
            &context,
            Some(mix_request::Lambda::Split(true)),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let err = client
        .mix(top_k_request(
            &context,
            Some(mix_request::Lambda::Gate(true)),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let ok = client
        .mix(top_k_request(
            &context,
            Some(mix_request::Lambda::FixedLambda(0.5)),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.lambda, 0.5);
    let own = pb::MixRequest {
        neural: Some(mix_request::Neural::OwnModel(true)),
        ..top_k_request(&context, Some(mix_request::Lambda::FixedLambda(0.5)))
    };
    assert_eq!(
        client.mix(own).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    let score = pb::ScoreRequest {
        documents: vec![pb::ScoreDocument {
            token_ids: context.clone(),
            domain: String::new(),
        }],
        lambda: Some(pb::score_request::Lambda::FixedLambda(0.5)),
        per_token: false,
    };
    let err = score_all(&mut client, tonic::Request::new(score))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_work_and_refuses_new_calls() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_model(dir.path());
    let Running {
        mut client,
        addr,
        stop,
        task,
    } = start(config).await;
    let docs = test_documents(3, 400);
    let request = pb::ScoreRequest {
        documents: docs
            .iter()
            .map(|d| pb::ScoreDocument {
                token_ids: d.clone(),
                domain: String::new(),
            })
            .collect(),
        lambda: Some(pb::score_request::Lambda::FixedLambda(0.2)),
        per_token: false,
    };
    let mut stream = client.score(request).await.unwrap().into_inner();
    // Scoring has begun when the first document arrives; then the shutdown starts.
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        first.item,
        Some(score_response::Item::Document(_))
    ));
    let _ = stop.send(());
    let mut rest = Vec::new();
    while let Some(r) = stream.message().await.unwrap() {
        rest.extend(r.item);
    }
    assert_eq!(rest.len(), 3, "two more documents and the totals");
    assert!(matches!(rest[2], score_response::Item::Totals(_)));
    task.await.unwrap().unwrap();
    // The listener is gone: a new connection is refused.
    let refused = tokio::time::timeout(
        Duration::from_secs(2),
        tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect(),
    )
    .await;
    assert!(!matches!(refused, Ok(Ok(_))), "a new call was accepted");
}
