//! vLLM (its CPU build, `ensure_vllm` in scripts/env.sh) with the sidecar as its drafter and as its
//! mixer, through the client package's `infini_sidecar.vllm`, against a real sidecar over a mini-Pile
//! index: `eval/vllm_sidecar.py check` runs SmolLM2 (converted from the project's GGUF) in float32,
//! where vLLM's speculation verifies exactly on CPU.
//!
//! - The proposer changes no output: each chat prompt, twice (the second drafts from the live index
//!   what the first taught it), decodes to plain greedy decoding's tokens, and drafts were accepted.
//! - The mixer's distribution is the sidecar's: at every step of a mixed greedy generation, vLLM's
//!   processed log-probs of the mix's top tokens equal a unary `Mix` of the same context given the
//!   raw log-probs of the same pass (a plain engine's prompt log-probs), under λ1/λ2 = 0.4/0.05.
//!
//! Needs `VLLM_PYTHON` and `VLLM_MODEL` (scripts/env.sh's `ensure_vllm_model`). On a CPU vLLM's build
//! cannot run on, it says so in one line naming the missing feature.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::common::server::{build_index, config, start, Running};

fn required(var: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{var}: set by scripts/env.sh (ensure_vllm_model)"));
    assert!(
        path.exists(),
        "{}: missing; run scripts/test.sh",
        path.display()
    );
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_with_sidecar_drafts_decodes_as_plain_and_mixes_as_the_sidecar_does() {
    let (python, model) = (required("VLLM_PYTHON"), required("VLLM_MODEL"));
    let dir = tempfile::tempdir().unwrap();
    let Running { addr, stop, .. } =
        start(config(dir.path(), build_index(dir.path()), false)).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/vllm_sidecar.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args(["check", "--model"])
            .arg(model)
            .args(["--addr", &addr.to_string()])
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // vLLM logs to stdout too: the report is the last line that is a JSON object.
    let report: Value = stdout
        .lines()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(Value::is_object)
        })
        .expect("no report");
    if let Some(why) = report.get("skipped") {
        println!("vLLM not run: {why}");
        stop.send(()).ok();
        return;
    }
    println!("{report}");
    let proposer = &report["proposer"];
    assert_eq!(proposer["identical"], proposer["requests"], "{report}");
    assert!(proposer["accepted"].as_u64().unwrap() > 0, "{report}");
    let mixer = &report["mixer"];
    assert!(mixer["steps"].as_u64().unwrap() >= 20, "{report}");
    let worst = mixer["max_abs_prob_difference"].as_f64().unwrap();
    assert!(
        worst < 1e-4,
        "mixed probabilities differ by {worst}: {report}"
    );
    stop.send(()).ok();
}
