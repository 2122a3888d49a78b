//! The Python client of `examples/python` against the real server: its JSON-lines scorer reports
//! what a tonic client's `Score` gets, and every step of its decoding loop chose the top token of the
//! unary `Mix` of the same context and distribution.
//!
//! Needs Python with grpcio and grpcio-tools: `$SIDECAR_PYTHON`, else the venv `scripts/test.sh`
//! makes at `~/.cache/infini-sidecar/venv-client`.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::server::{start, with_model, Running};
use infini_sidecar::corpus::Content;
use infini_sidecar::server::pb::{self, mix_request, score_response};
use serde_json::Value;

fn python() -> PathBuf {
    let path = std::env::var_os("SIDECAR_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/infini-sidecar/venv-client/bin/python")
        });
    assert!(
        path.exists(),
        "{}: no Python with grpcio; run scripts/test.sh or set SIDECAR_PYTHON",
        path.display()
    );
    path
}

/// Runs an example script; its stdout as JSON values, one per line.
async fn run_example(script: &str, args: Vec<String>) -> Vec<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/python")
        .join(script);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(&script)
            .args(args)
            .env(
                "SIDECAR_PY_STUBS",
                std::env::temp_dir().join("sidecar-py-stubs-test"),
            )
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_examples_agree_with_the_tonic_client() {
    let dir = tempfile::tempdir().unwrap();
    let Running {
        mut client,
        addr,
        stop,
        ..
    } = start(with_model(dir.path())).await;
    let tokenizer = common::smollm2_tokenizer();

    // The scorer, against Score with the same tokens.
    let texts: Vec<String> = common::minipile_docs("test", 2)
        .iter()
        .map(|d| match &d.content {
            Content::Text(t) => t.chars().take(800).collect(),
            Content::Tokens(_) => unreachable!(),
        })
        .collect();
    let input = dir.path().join("docs.jsonl");
    let lines: Vec<String> = texts
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string())
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let got = run_example(
        "score_jsonl.py",
        vec![
            "--addr".into(),
            addr.to_string(),
            "--input".into(),
            input.display().to_string(),
            "--fixed-lambda".into(),
            "0.25".into(),
        ],
    )
    .await;
    let request = pb::ScoreRequest {
        documents: texts
            .iter()
            .map(|t| pb::ScoreDocument {
                token_ids: tokenizer.encode(t).unwrap(),
                domain: String::new(),
            })
            .collect(),
        lambda: Some(pb::score_request::Lambda::FixedLambda(0.25)),
        per_token: false,
    };
    let mut stream = client.score(request).await.unwrap().into_inner();
    let mut want = Vec::new();
    while let Some(r) = stream.message().await.unwrap() {
        want.extend(r.item);
    }
    assert_eq!(got.len(), 3);
    for (g, w) in got.iter().zip(&want) {
        match w {
            score_response::Item::Document(d) => {
                assert_eq!(g["tokens"].as_u64().unwrap(), d.tokens);
                assert_eq!(g["neural_nll"].as_f64().unwrap(), d.neural_nll);
                assert_eq!(g["mixed_nll"].as_f64().unwrap(), d.mixed_nll);
            }
            score_response::Item::Totals(t) => {
                assert_eq!(g["mixed_perplexity"].as_f64().unwrap(), t.mixed_perplexity);
            }
        }
    }

    // The decoding loop: each step's choice is the top of the unary Mix of that context.
    let prompt = "The kernel uses a";
    let steps = run_example(
        "decode_loop.py",
        vec![
            "--addr".into(),
            addr.to_string(),
            "--prompt".into(),
            prompt.into(),
            "--steps".into(),
            "6".into(),
            "--fixed-lambda".into(),
            "0.5".into(),
        ],
    )
    .await;
    assert_eq!(steps.len(), 7);
    let mut context = tokenizer.encode(prompt).unwrap();
    for s in &steps[..6] {
        let ids = |key: &str| -> Vec<Value> { s[key].as_array().unwrap().clone() };
        let top_k = pb::NeuralTopK {
            tokens: ids("tokens")
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect(),
            logprobs: ids("logprobs")
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect(),
            rest_mass: s["rest_mass"].as_f64().unwrap(),
        };
        assert_eq!(s["length"].as_u64().unwrap() as usize, context.len());
        let mixed = client
            .mix(pb::MixRequest {
                context: context.clone(),
                neural: Some(mix_request::Neural::TopKLogprobs(top_k)),
                lambda: Some(mix_request::Lambda::FixedLambda(0.5)),
                top_k: 8,
                sequence_id: String::new(),
                max_match: 0,
            })
            .await
            .unwrap()
            .into_inner();
        let chosen = s["chosen"].as_u64().unwrap() as u32;
        assert_eq!(chosen, mixed.top[0].token);
        context.push(chosen);
    }
    let sequence: Vec<u32> = steps[6]["sequence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(sequence, context);
    let _ = stop.send(());
}
