//! The real gRPC server on a loopback port, called with a real tonic client: answers equal the
//! library's, bad inputs get their status codes, and the bearer token is enforced.

use crate::common;
use std::sync::Arc;

use common::server::{authed, build_index, config, open_session, start, step, Running};
use infini_sidecar::decoding::Sequence;
use infini_sidecar::draft::DraftOptions;
use infini_sidecar::index::backoff::{Backoff, Draw};
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::docs::SearchOptions;
use infini_sidecar::index::trace::TraceOptions;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::mix::features::{feature_names, GateFeatures};
use infini_sidecar::mix::{
    self, LambdaRule, MixingParams, NeuralDistribution, SequenceTrust, SparseDistribution,
    NUM_FEATURES,
};
use infini_sidecar::server::config::ServeConfig;
use infini_sidecar::server::pb::{self, draft_request, mix_request, session_request};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_answers_as_the_library_does() {
    let dir = tempfile::tempdir().unwrap();
    let index_dir = build_index(dir.path());
    let Running {
        mut client, stop, ..
    } = start(config(dir.path(), index_dir, true)).await;
    let index = Arc::new(Index::open(&dir.path().join("index"), &OpenOptions::default()).unwrap());
    let tokenizer = common::smollm2_tokenizer();

    // Without the token: refused.
    let err = client.info(pb::InfoRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    let info = client
        .info(authed(pb::InfoRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.index_tokens, index.total_tokens());
    assert_eq!(info.vocab_size, index.vocab_size());
    assert_eq!(info.tokenizer_fingerprint, tokenizer.fingerprint());

    let text = "The kernel uses a";
    let ids = client
        .tokenize(authed(pb::TokenizeRequest { text: text.into() }))
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert_eq!(ids, tokenizer.encode(text).unwrap());
    let back = client
        .detokenize(authed(pb::DetokenizeRequest { ids: ids.clone() }))
        .await
        .unwrap()
        .into_inner()
        .text;
    assert_eq!(back, text);

    let count = client
        .count(authed(pb::CountRequest {
            allow_partial: false,
            ids: ids[..2].to_vec(),
        }))
        .await
        .unwrap()
        .into_inner()
        .count;
    assert_eq!(count, index.count(&ids[..2]).unwrap());

    let ntd = client
        .next_token_distribution(authed(pb::NextTokenDistributionRequest {
            allow_partial: false,
            prompt: ids.clone(),
            infinite: true,
            max_support: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    let want = index.infgram_ntd(&ids, None).unwrap();
    assert_eq!(ntd.suffix_len as usize, want.suffix_len);
    assert_eq!(ntd.sparse, want.sparse);
    assert_eq!(ntd.prompt_cnt, want.ntd.prompt_cnt);
    let got: Vec<(u32, u64)> = ntd.dist.iter().map(|t| (t.token, t.cont_cnt)).collect();
    let want_dist: Vec<(u32, u64)> = want.ntd.dist.iter().map(|(&t, &c)| (t, c)).collect();
    assert_eq!(got, want_dist);

    // Documents: one n-gram, then a CNF (n-gram AND (n-gram OR n-gram)).
    let ngram = |ids: &[u32]| pb::NGram { ids: ids.to_vec() };
    let search = |cnf: Vec<Vec<&[u32]>>| pb::SearchDocumentsRequest {
        allow_partial: false,
        cnf: cnf
            .into_iter()
            .map(|c| pb::Clause {
                ngrams: c.into_iter().map(ngram).collect(),
            })
            .collect(),
        maxnum: 3,
        max_disp_len: 50,
        max_clause_freq: 0,
    };
    let opts = SearchOptions {
        maxnum: 3,
        max_disp_len: 50,
        ..SearchOptions::default()
    };
    for cnf in [
        vec![vec![&ids[1..3]]],
        vec![vec![&ids[1..2]], vec![&ids[2..3], &ids[3..4]]],
    ] {
        let got = client
            .search_documents(authed(search(cnf.clone())))
            .await
            .unwrap()
            .into_inner();
        let lib_cnf: Vec<Vec<Vec<u32>>> = cnf
            .iter()
            .map(|c| c.iter().map(|g| g.to_vec()).collect())
            .collect();
        let want = index.search_docs_cnf(&lib_cnf, opts).unwrap();
        assert_eq!((got.cnt, got.approx), (want.cnt, want.approx));
        let got_docs: Vec<(u64, Vec<u32>)> = got
            .documents
            .iter()
            .map(|d| (d.doc_ix, d.token_ids.clone()))
            .collect();
        let want_docs: Vec<(u64, Vec<u32>)> = want
            .documents
            .iter()
            .map(|d| (d.doc_ix, d.token_ids.clone()))
            .collect();
        assert_eq!(got_docs, want_docs);
    }
    let empty = pb::SearchDocumentsRequest {
        allow_partial: false,
        cnf: vec![],
        maxnum: 1,
        max_disp_len: 0,
        max_clause_freq: 0,
    };
    let err = client.search_documents(authed(empty)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    // Mix with caller logits, against the library's mixture.
    let vocab = index.vocab_size() as usize;
    let logits: Vec<f32> = (0..vocab)
        .map(|i| ((i * 7919) % 1000) as f32 / 200.0)
        .collect();
    let mixed = client
        .mix(authed(pb::MixRequest {
            context: ids.clone(),
            neural: Some(mix_request::Neural::Logits(pb::NeuralLogits {
                logits: logits.clone(),
            })),
            lambda: Some(mix_request::Lambda::FixedLambda(0.3)),
            top_k: 5,
            sequence_id: String::new(),
            max_match: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    let lib = mix::mix(
        &SparseDistribution::from_ntd(&want.ntd),
        &NeuralDistribution::from_logits(&logits).unwrap(),
        0.3,
        5,
    );
    let got: Vec<(u32, f64)> = mixed.top.iter().map(|t| (t.token, t.prob)).collect();
    assert_eq!(got, lib.top);
    assert_eq!(mixed.suffix_len as usize, want.suffix_len);

    // Bad inputs: status codes with messages, the server keeps serving.
    let bad_id = pb::CountRequest {
        allow_partial: false,
        ids: vec![vocab as u32 + 5],
    };
    assert_eq!(
        client.count(authed(bad_id)).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let mut nan = logits.clone();
    nan[3] = f32::NAN;
    let bad_mix = |neural, top_k, lambda| pb::MixRequest {
        context: ids.clone(),
        neural,
        lambda,
        top_k,
        sequence_id: String::new(),
        max_match: 0,
    };
    let fixed = Some(mix_request::Lambda::FixedLambda(0.3));
    for (req, what) in [
        (
            bad_mix(
                Some(mix_request::Neural::Logits(pb::NeuralLogits {
                    logits: nan,
                })),
                5,
                fixed,
            ),
            "NaN",
        ),
        (
            bad_mix(
                Some(mix_request::Neural::Logits(pb::NeuralLogits {
                    logits: vec![0.0; 10],
                })),
                5,
                fixed,
            ),
            "short",
        ),
        (
            bad_mix(
                Some(mix_request::Neural::Logits(pb::NeuralLogits {
                    logits: logits.clone(),
                })),
                0,
                fixed,
            ),
            "top_k 0",
        ),
        (bad_mix(None, 5, fixed), "no neural"),
        (
            bad_mix(
                Some(mix_request::Neural::Logits(pb::NeuralLogits {
                    logits: logits.clone(),
                })),
                5,
                Some(mix_request::Lambda::FixedLambda(1.5)),
            ),
            "λ",
        ),
    ] {
        let err = client.mix(authed(req)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{what}: {err:?}");
        assert!(!err.message().is_empty());
    }
    // λ1/λ2 and the gate of the mixing file.
    let params = MixingParams::load(&dir.path().join("mixing.json")).unwrap();
    let with = |lambda| {
        let neural = mix_request::Neural::Logits(pb::NeuralLogits {
            logits: logits.clone(),
        });
        bad_mix(Some(neural), 5, lambda)
    };
    let split = client
        .mix(authed(with(Some(mix_request::Lambda::Split(true)))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(split.lambda, if split.sparse { 0.4 } else { 0.05 });
    // A fixed λ of 1 is used as the largest usable λ, as by `Score` and the evaluator: the tokens
    // the ∞-gram never saw keep some probability.
    let edge = client
        .mix(authed(with(Some(mix_request::Lambda::FixedLambda(1.0)))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(edge.lambda, mix::LAMBDA_MAX);
    let lib = mix::mix(
        &SparseDistribution::from_ntd(&want.ntd),
        &NeuralDistribution::from_logits(&logits).unwrap(),
        mix::LAMBDA_MAX,
        5,
    );
    let got: Vec<(u32, f64)> = edge.top.iter().map(|t| (t.token, t.prob)).collect();
    assert_eq!(got, lib.top);
    assert!(edge.rest_mass > 0.0);
    let gated = client
        .mix(authed(with(Some(mix_request::Lambda::Gate(true)))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gated.gate_features.len(), NUM_FEATURES);
    assert_eq!(gated.gate_feature_names.len(), NUM_FEATURES);
    assert_eq!(gated.gate_features[0], (gated.suffix_len as f64).ln_1p());
    let features: GateFeatures = gated.gate_features.clone().try_into().unwrap();
    let want = params.gate.as_ref().unwrap().predict(&[features])[0];
    assert_eq!(gated.lambda, want);
    // Drafts: for a context, and for an open session by id (the same sequence), as the library's.
    let doc = &index.search_docs(&ids[1..3], opts).unwrap().documents[0].token_ids;
    let context = doc[..doc.len() / 2].to_vec();
    let want = Sequence::new(index.clone(), context.clone())
        .unwrap()
        .draft(&DraftOptions::default())
        .unwrap();
    assert!(!want.is_empty());
    let draft_of = |target| {
        authed(pb::DraftRequest {
            target: Some(target),
            options: None,
            ..Default::default()
        })
    };
    let got = client
        .draft(draft_of(draft_request::Target::Context(pb::TokenIds {
            ids: context.clone(),
        })))
        .await
        .unwrap()
        .into_inner();
    let as_tree = |r: &pb::DraftResponse| (r.token_ids.clone(), r.parents.clone(), r.probs.clone());
    assert_eq!(
        as_tree(&got),
        (
            want.token_ids.clone(),
            want.parents.clone(),
            want.probs.clone()
        )
    );
    let (tx, mut replies) = open_session(&mut client).await;
    let started = step(
        &tx,
        &mut replies,
        session_request::Step::Start(pb::SessionStart {
            context: context.clone(),
            use_model: false,
            ..Default::default()
        }),
    )
    .await;
    let id = started.state.unwrap().session_id;
    let in_session = step(
        &tx,
        &mut replies,
        session_request::Step::Draft(Default::default()),
    )
    .await;
    let Some(pb::session_response::Result::Draft(in_session)) = in_session.result else {
        panic!("no draft in the session's answer");
    };
    assert_eq!(in_session, got);
    let by_id = client
        .draft(draft_of(draft_request::Target::SessionId(id)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_id, got);
    drop(tx);
    while replies.message().await.unwrap().is_some() {}
    let gone = client
        .draft(draft_of(draft_request::Target::SessionId(id)))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    let bad = pb::DraftRequest {
        target: Some(draft_request::Target::Context(pb::TokenIds {
            ids: context,
        })),
        options: Some(pb::DraftOptions {
            min_token_prob: Some(2.0),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        client.draft(authed(bad)).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    let still = client.info(authed(pb::InfoRequest {})).await.unwrap();
    assert_eq!(still.into_inner().index_tokens, index.total_tokens());
    let _ = stop.send(());
}

/// The adaptive λ, by a session and by `Mix` calls naming a sequence: each λ is the library's
/// posterior mean after exactly the tokens before it (replayed here from the same ∞-gram and neural
/// probabilities), both paths agree, taking tokens back restores λ bit for bit, and a call with no
/// sequence keeps λ1/λ2 as before. The session names the gate's features in its first answer
/// only; every unary answer names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_lambda_follows_each_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let index_dir = build_index(dir.path());
    let cfg = config(dir.path(), index_dir, true);
    let path = dir.path().join("mixing.json");
    let mut params = MixingParams::load(&path).unwrap();
    params.default_rule = LambdaRule::Adaptive;
    params.save(&path).unwrap();
    let Running {
        mut client, stop, ..
    } = start(cfg).await;
    let info = client.info(authed(pb::InfoRequest {})).await.unwrap();
    assert_eq!(info.into_inner().default_rule, "adaptive");
    let index = Arc::new(Index::open(&dir.path().join("index"), &OpenOptions::default()).unwrap());
    let doc = index.get_document(3).unwrap().token_ids;
    let tokens = &doc[..60];
    let logits: Vec<f32> = (0..index.vocab_size() as usize)
        .map(|i| ((i * 7919) % 1000) as f32 / 200.0)
        .collect();
    let neural = NeuralDistribution::from_logits(&logits).unwrap();
    let gate = params.gate.as_ref().unwrap();

    let (tx, mut replies) = open_session(&mut client).await;
    step(
        &tx,
        &mut replies,
        session_request::Step::Start(pb::SessionStart {
            context: tokens[..20].to_vec(),
            ..Default::default()
        }),
    )
    .await;
    let session_mix = || {
        session_request::Step::Mix(pb::SessionMix {
            neural: Some(pb::session_mix::Neural::Logits(pb::NeuralLogits {
                logits: logits.clone(),
            })),
            lambda: None,
            top_k: 5,
            max_match: 0,
        })
    };
    let mix_call = |end: usize, sequence_id: &str| {
        authed(pb::MixRequest {
            context: tokens[..end].to_vec(),
            neural: Some(mix_request::Neural::Logits(pb::NeuralLogits {
                logits: logits.clone(),
            })),
            lambda: None,
            top_k: 5,
            sequence_id: sequence_id.into(),
            max_match: 0,
        })
    };
    let mut trust = SequenceTrust::new(&params.adaptive);
    let mut lambdas = Vec::new();
    for i in 20..tokens.len() {
        let reply = step(&tx, &mut replies, session_mix()).await;
        let Some(pb::session_response::Result::Mix(m)) = reply.result else {
            panic!("no mix in {reply:?}");
        };
        let features: GateFeatures = m.gate_features.clone().try_into().unwrap();
        let base = gate.predict(&[features])[0];
        assert_eq!(m.lambda, trust.lambda(base), "token {i}");
        let names_once = if i == 20 { feature_names() } else { Vec::new() };
        assert_eq!(m.gate_feature_names, names_once, "token {i}");
        let by_id = client.mix(mix_call(i, "a")).await.unwrap().into_inner();
        assert_eq!(by_id.lambda, m.lambda, "token {i}");
        assert_eq!(by_id.gate_feature_names, feature_names(), "token {i}");
        lambdas.push(m.lambda);
        let infgram = index.infgram_ntd(&tokens[..i], None).unwrap();
        let p_inf = SparseDistribution::from_ntd(&infgram.ntd).prob(tokens[i], &neural);
        trust.observe(base, p_inf, neural.prob(tokens[i]));
        let append = session_request::Step::Append(pb::SessionAppend {
            tokens: vec![tokens[i]],
        });
        step(&tx, &mut replies, append).await;
    }
    assert_eq!(trust.observed(), 40);
    assert!(
        lambdas.iter().any(|l| (l - lambdas[0]).abs() > 1e-3),
        "λ never moved: {lambdas:?}"
    );
    // Taken back to 30 tokens: λ there again, by both paths; a sequence id of its own starts afresh.
    let truncate = session_request::Step::Truncate(pb::SessionTruncate { length: 30 });
    step(&tx, &mut replies, truncate).await;
    let reply = step(&tx, &mut replies, session_mix()).await;
    let Some(pb::session_response::Result::Mix(m)) = reply.result else {
        panic!("no mix in {reply:?}");
    };
    assert_eq!(m.lambda.to_bits(), lambdas[10].to_bits());
    let again = client.mix(mix_call(30, "a")).await.unwrap().into_inner();
    assert_eq!(again.lambda.to_bits(), lambdas[10].to_bits());
    let fresh = client.mix(mix_call(30, "b")).await.unwrap().into_inner();
    let features: GateFeatures = fresh.gate_features.clone().try_into().unwrap();
    let prior = SequenceTrust::new(&params.adaptive);
    assert_eq!(fresh.lambda, prior.lambda(gate.predict(&[features])[0]));
    // No sequence, no λ named: λ1/λ2 as before.
    let stateless = client.mix(mix_call(30, "")).await.unwrap().into_inner();
    assert_eq!(stateless.lambda, if stateless.sparse { 0.4 } else { 0.05 });
    // The copy guard: at a match of at least `max_match` tokens the file's rules give the ∞-gram
    // nothing; a fixed λ is taken as asked.
    let guarded = |lambda| {
        let mut request = mix_call(30, "");
        request.get_mut().max_match = 1;
        request.get_mut().lambda = Some(lambda);
        request
    };
    let split = client
        .mix(guarded(mix_request::Lambda::Split(true)))
        .await
        .unwrap()
        .into_inner();
    assert!(split.suffix_len >= 1);
    assert_eq!(split.lambda, mix::LAMBDA_MIN);
    let fixed = client
        .mix(guarded(mix_request::Lambda::FixedLambda(0.3)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fixed.lambda, 0.3);
    let long_id = "x".repeat(300);
    let err = client.mix(mix_call(30, &long_id)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    drop(tx);
    let _ = stop.send(());
}

/// `Generate` and `Trace` over a real server: a byte-level index (text in, spans over its bytes)
/// and the token index, each answer equal to the library's, bad requests refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_and_trace_answer_as_the_library_does() {
    let dir = tempfile::tempdir().unwrap();
    let texts = common::minipile_texts("train", 60, "");
    let index = crate::byte_level::byte_index(dir.path(), &texts, None);
    let Running {
        mut client, stop, ..
    } = start(ServeConfig {
        mixing: None,
        ..config(dir.path(), index.dir().to_path_buf(), false)
    })
    .await;

    // A passage of an indexed document between two novel phrases.
    let passage: String = texts[3].chars().skip(200).take(300).collect();
    let inner: String = passage.chars().skip(10).take(280).collect();
    let text = format!("Zqx wvk plorb: {passage} -- fnarg quux blee.");
    let traced = client
        .trace(pb::TraceRequest {
            text: text.clone(),
            min_len: 40,
            maxnum: 2,
            max_disp_len: 80,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
    assert_eq!(traced.ids, bytes);
    let want = index
        .trace(
            &bytes,
            TraceOptions {
                min_len: 40,
                max_documents: 2,
                max_disp_len: 80,
                ..TraceOptions::default()
            },
        )
        .unwrap();
    let got: Vec<(u32, u32, u64)> = traced
        .spans
        .iter()
        .map(|s| (s.start, s.end, s.count))
        .collect();
    let want_spans: Vec<(u32, u32, u64)> = want
        .iter()
        .map(|s| (s.start as u32, s.end as u32, s.count))
        .collect();
    assert_eq!(got, want_spans);
    assert!(
        traced.spans.iter().any(|s| s.text.contains(&inner)),
        "{:?}",
        traced.spans.iter().map(|s| &s.text).collect::<Vec<_>>()
    );

    let prompt: Vec<u32> = b"The ".iter().map(|&b| u32::from(b)).collect();
    for (levels, temperature) in [(None, 0.0), (Some(0), 1.0), (Some(3), 0.7)] {
        let made = client
            .generate(pb::GenerateRequest {
                prompt: prompt.clone(),
                max_new_tokens: 40,
                levels,
                temperature,
                seed: 5,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let spec = Backoff {
            levels: match levels {
                None => Backoff::default().levels,
                Some(0) => None,
                Some(k) => Some(k as usize),
            },
            ..Backoff::default()
        };
        let want = index
            .backoff_generate(
                &prompt,
                &spec,
                Draw {
                    max_new: 40,
                    temperature,
                    seed: 5,
                },
            )
            .unwrap();
        assert_eq!(made.tokens, want.tokens, "{levels:?}");
        assert_eq!(made.steps.len(), want.levels.len());
        assert_eq!(
            made.text,
            String::from_utf8_lossy(&want.tokens.iter().map(|&t| t as u8).collect::<Vec<_>>())
        );
    }

    for (bad, what) in [
        (
            pb::TraceRequest {
                ids: vec![97],
                text: "a".into(),
                ..Default::default()
            },
            "not both",
        ),
        (
            pb::TraceRequest {
                ids: vec![300],
                ..Default::default()
            },
            "vocabulary",
        ),
        (
            pb::TraceRequest {
                text: "a".into(),
                maxnum: 5000,
                ..Default::default()
            },
            "maxnum",
        ),
    ] {
        let err = client.trace(bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(what), "{}", err.message());
    }
    let err = client
        .generate(pb::GenerateRequest {
            prompt: prompt.clone(),
            max_new_tokens: 1 << 20,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = client
        .generate(pb::GenerateRequest {
            prompt,
            max_new_tokens: 4,
            temperature: -1.0,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let _ = stop.send(());
}

/// Every call runs in an `rpc` span: with DEBUG on, its end is logged with the method, the bytes
/// read and written, and the time its work waited for a worker and ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_logged_with_its_sizes_and_stages() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build_index(tmp.path());
    let path = tmp.path().join("serve.toml");
    let toml = format!(
        "bind = \"127.0.0.1:0\"\nindex = \"{}\"\n[live]\nenabled = false\n",
        index.display()
    );
    std::fs::write(&path, toml).unwrap();
    let (mut child, addr, log) =
        common::server::spawn_serve_with(&path, &[("RUST_LOG", "infini_sidecar=debug")]).await;
    let mut client = pb::sidecar_client::SidecarClient::new(common::server::connect(addr).await);
    let ids = vec![29u32, 34, 30];
    client
        .count(pb::CountRequest {
            ids: ids.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let line = (0..200)
        .find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            let log = log.lock().unwrap();
            log.lines()
                .find(|l| l.contains("method=\"Count\"") && l.contains(" call "))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("no Count call logged: {}", log.lock().unwrap()));
    let _ = child.kill();
    let _ = child.wait();
    // The request: a 5-byte gRPC frame header and the message (a tag, a length, three ids).
    let field = |name: &str| -> u64 {
        let at = line
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("{name}: {line}"));
        let digits: String = line[at + name.len() + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap_or_else(|_| panic!("{name}: {line}"))
    };
    assert_eq!(field("read"), 5 + 2 + 3, "{line}");
    assert!(field("written") > 5, "{line}");
    // The work's stages, as numbers (a count of three ids may well take under a microsecond).
    field("queued_us");
    field("work_us");
    assert!(line.contains("code=Ok"), "{line}");
}
