//! The Python package `clients/python` (`infini_sidecar`) against the real server: its own test suite
//! (typed methods and errors, the Batch stream against sessions, the lm_eval adapter against Score),
//! its examples (the JSON-lines scorer reports what a tonic client's `Score` gets, and every step of
//! the decoding loop chose the top token of the unary `Mix` of the same context), llama-cpp-python
//! decoding with sidecar drafts and mixing, and lm-evaluation-harness whose perplexities must equal
//! `eval ppl`'s on the same documents.
//!
//! Needs the Python that `scripts/test.sh` prepares (`ensure_client_python` in scripts/env.sh:
//! grpcio, llama-cpp-python, lm-eval and this package), or `$SIDECAR_PYTHON`. Also the cmake options
//! env.sh builds that llama.cpp with, from a CPU's flags.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::server::{start, with_model, Running};
use infini_sidecar::corpus::Content;
use infini_sidecar::server::pb::{self, mix_request, score_response};
use serde_json::Value;

fn python() -> PathBuf {
    let path = std::env::var_os("SIDECAR_PYTHON")
        .map(PathBuf::from)
        .expect("SIDECAR_PYTHON: the Python of scripts/env.sh's ensure_client_python");
    assert!(
        path.exists(),
        "{}: no such Python; run scripts/test.sh or set SIDECAR_PYTHON",
        path.display()
    );
    path
}

fn package_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/python")
}

/// Runs the Python package's `args` (a script or `-m module ...`) with the sidecar's address in
/// SIDECAR_ADDR; its stdout, after checking it succeeded.
async fn run_python(args: Vec<String>, addr: std::net::SocketAddr) -> String {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .args(&args)
            .current_dir(package_dir())
            .env("SIDECAR_ADDR", addr.to_string())
            .env("SIDECAR_GGUF", common::smollm2_gguf())
            .env("HF_DATASETS_OFFLINE", "1")
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs an example script; its stdout as JSON values, one per line.
async fn run_example(script: &str, args: Vec<String>, addr: std::net::SocketAddr) -> Vec<Value> {
    let mut all = vec![format!("examples/{script}")];
    all.extend(args);
    run_python(all, addr)
        .await
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The package's own tests (tests/test_client.py) against a sidecar with the real SmolLM2 (the
/// streams' timeout against a stalled server of their own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_package_tests_pass() {
    let dir = tempfile::tempdir().unwrap();
    let Running { addr, stop, .. } = start(with_model(dir.path())).await;
    let args = ["-m", "unittest", "-v", "tests/test_client.py"];
    run_python(args.iter().map(|a| a.to_string()).collect(), addr).await;
    let _ = stop.send(());
}

/// llama-cpp-python (the same SmolLM2 GGUF): greedy decoding with sidecar drafts equals plain
/// decoding, the logits processor mixes as asked, and the drafter goes on after a refused call
/// (tests/test_llama_cpp.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_cpp_with_sidecar_drafts_decodes_as_plain_llama_cpp() {
    let dir = tempfile::tempdir().unwrap();
    let Running { addr, stop, .. } = start(with_model(dir.path())).await;
    let args = ["-m", "unittest", "-v", "tests/test_llama_cpp.py"];
    run_python(args.iter().map(|a| a.to_string()).collect(), addr).await;
    let _ = stop.send(());
}

/// `lm_eval --model infini-sidecar` on Pile-style perplexity tasks reports, per domain, exactly the
/// log-loss `eval ppl` reports on the same documents (bits per byte × bytes × ln 2 = the summed NLL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lm_eval_perplexity_equals_eval_ppl() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_model(dir.path());
    let (index, mixing) = (config.index.clone(), config.mixing.clone().unwrap());
    let Running { addr, stop, .. } = start(config).await;
    // Two short documents of two domains.
    let mut per_domain = std::collections::BTreeMap::<String, Vec<String>>::new();
    for doc in common::minipile_docs("test", 400) {
        let meta: Value = serde_json::from_str(doc.metadata.as_deref().unwrap()).unwrap();
        let domain = meta["metadata"]["meta"]["pile_set_name"]
            .as_str()
            .unwrap()
            .to_string();
        let Content::Text(text) = doc.content else {
            continue;
        };
        let docs = per_domain.entry(domain).or_default();
        if docs.len() < 2 {
            docs.push(text.chars().take(500).collect());
        }
    }
    let domains = ["brown", "perl-doc"];
    let input = dir.path().join("docs.jsonl");
    let mut lines = Vec::new();
    for d in domains {
        for text in &per_domain[d] {
            lines.push(serde_json::json!({"text": text, "meta": {"pile_set_name": d}}).to_string());
        }
    }
    std::fs::write(&input, lines.join("\n")).unwrap();
    let out = dir.path().join("lm-eval");
    let args = vec![
        "-m".to_string(),
        "infini_sidecar.lm_eval".into(),
        "run".into(),
        "--model".into(),
        "infini-sidecar".into(),
        "--model_args".into(),
        format!("addr={addr}"),
        "mode=mixed".into(),
        "--tasks".into(),
        "sidecar_pile_brown".into(),
        "sidecar_pile_perl_doc".into(),
        "--metadata".into(),
        serde_json::json!({"path": input}).to_string(),
        "--output_path".into(),
        out.display().to_string(),
    ];
    run_python(args, addr).await;
    let results = find_results(&out);
    let report_dir = dir.path().join("ppl");
    let status = Command::new(env!("CARGO_BIN_EXE_infini-sidecar"))
        .args(["eval", "ppl", "--cpu", "--model"])
        .arg(common::smollm2_gguf())
        .arg("--index")
        .arg(&index)
        .arg("--mixing")
        .arg(&mixing)
        .arg("--input")
        .arg(&input)
        .arg("--out-dir")
        .arg(&report_dir)
        .status()
        .unwrap();
    assert!(status.success());
    let report: Value =
        serde_json::from_slice(&std::fs::read(report_dir.join("report.json")).unwrap()).unwrap();
    for d in domains {
        let bytes: usize = per_domain[d].iter().map(|t| t.len()).sum();
        let task = format!("sidecar_pile_{}", d.replace('-', "_"));
        let bpb = results["results"][&task]["bits_per_byte,none"]
            .as_f64()
            .unwrap();
        let lm_eval_nll = bpb * bytes as f64 * std::f64::consts::LN_2;
        let domain = report["by_domain"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["domain"] == d)
            .unwrap();
        let ppl = domain["default_perplexity"].as_f64().unwrap();
        let nll = ppl.ln() * domain["tokens_scored"].as_f64().unwrap();
        assert!(
            (lm_eval_nll - nll).abs() <= 1e-6 * nll,
            "{d}: lm_eval {lm_eval_nll} nats, eval ppl {nll}"
        );
    }
    let _ = stop.send(());
}

/// The results file lm_eval wrote somewhere under `dir`.
fn find_results(dir: &Path) -> Value {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("results_")
            {
                return serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            }
        }
    }
    panic!("no lm_eval results under {}", dir.display());
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
        addr,
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
        addr,
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

/// ggml's options as `ensure_llama_cpp` (scripts/env.sh) gives them for a CPU whose /proc/cpuinfo
/// lists `flags`: the names (GGML_ left off) turned on, after checking every option is given.
fn llama_cpp_options_on(flags: &str) -> Vec<String> {
    let script = "source scripts/env.sh && llama_cpp_cpu_options \"$1\"";
    let out = Command::new("bash")
        .args(["-c", script, "bash", flags])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let options = String::from_utf8(out.stdout).unwrap();
    let mut given = Vec::new();
    let mut on = Vec::new();
    for option in options.split_whitespace() {
        let (name, value) = option
            .strip_prefix("-DGGML_")
            .unwrap()
            .split_once('=')
            .unwrap();
        given.push(name.to_string());
        if value == "ON" {
            on.push(name.to_string());
        }
    }
    given.sort();
    let mut every = [
        "NATIVE",
        "SSE42",
        "AVX",
        "AVX2",
        "FMA",
        "F16C",
        "BMI2",
        "AVX_VNNI",
        "AVX512",
        "AVX512_VBMI",
        "AVX512_VNNI",
        "AVX512_BF16",
        "AMX_TILE",
        "AMX_INT8",
        "AMX_BF16",
    ];
    every.sort();
    assert_eq!(given, every);
    on
}

/// llama.cpp is built from the features the OS enables, never with -march=native (which died of
/// SIGILL on a Xeon VM): AVX-512 where its five base features are listed, AMX never. The expected
/// options are read off ggml's CMake (the -m flags each one compiles with).
#[test]
fn llama_cpp_builds_for_the_listed_cpu_features() {
    // A Sapphire Rapids VM (its relevant flags).
    let xeon = "flags : fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c bmi1 avx2 bmi2 avx512f \
                avx512dq avx512ifma avx512cd avx512bw avx512vl avx_vnni avx512_bf16 avx512vbmi \
                avx512_vbmi2 avx512_vnni avx512_vpopcntdq amx_bf16 avx512_fp16 amx_tile amx_int8";
    let xeon_on = [
        "SSE42",
        "AVX",
        "AVX2",
        "FMA",
        "F16C",
        "BMI2",
        "AVX_VNNI",
        "AVX512",
        "AVX512_VBMI",
        "AVX512_VNNI",
        "AVX512_BF16",
    ];
    assert_eq!(llama_cpp_options_on(xeon), xeon_on);
    // Zen 3: AVX2, no AVX-512 or VNNI.
    let zen3 = "flags : fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c bmi1 avx2 bmi2 sha_ni";
    let zen3_on = ["SSE42", "AVX", "AVX2", "FMA", "F16C", "BMI2"];
    assert_eq!(llama_cpp_options_on(zen3), zen3_on);
    // AVX-512 extensions without the base (Knights Landing has no VL, DQ or BW) stay off.
    let knl = format!("{zen3} avx512f avx512cd avx512er avx512pf avx512_vnni");
    assert_eq!(llama_cpp_options_on(&knl), zen3_on);
}
