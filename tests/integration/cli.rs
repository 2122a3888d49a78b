//! The command line as a person uses it: exit codes, error lines that do not stop a batch, pass-through
//! fields, and a build from a pre-tokenized file answered the same as the brute-force count.

use std::io::Write;
use std::process::{Command, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infini-sidecar"))
}

#[test]
fn build_from_tokens_then_query_a_batch() {
    let tmp = tempfile::tempdir().unwrap();
    // Two documents of u16 tokens, each preceded by the separator: [5 6 7 5 6] [6 7 5]
    let tokens: Vec<u16> = vec![0xFFFF, 5, 6, 7, 5, 6, 0xFFFF, 6, 7, 5];
    let file = tmp.path().join("tokens.u16");
    std::fs::write(
        &file,
        tokens
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let idx = tmp.path().join("idx");
    let build = bin()
        .args([
            "index",
            "build",
            "--token-width",
            "16",
            "--eos-id",
            "0",
            "--vocab-size",
            "100",
            "--from-tokens",
        ])
        .arg(&file)
        .arg("--out")
        .arg(&idx)
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let again = bin()
        .args([
            "index",
            "build",
            "--token-width",
            "16",
            "--eos-id",
            "0",
            "--from-tokens",
        ])
        .arg(&file)
        .arg("--out")
        .arg(&idx)
        .output()
        .unwrap();
    assert_eq!(
        again.status.code(),
        Some(2),
        "an existing index is not overwritten without --force"
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));

    let mut child = bin()
        .arg("query")
        .arg("--index")
        .arg(&idx)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let queries = [
        r#"{"qid":"a","op":"count","ids":[5,6]}"#,
        "not json",
        r#"{"qid":"b","op":"count","ids":[500]}"#,
        r#"{"qid":"c","op":"prob","prompt":[7,5],"cont":0}"#,
        r#"{"qid":"d","op":"infgram_ntd","prompt":[9,9,6,7]}"#,
    ];
    child
        .stdin
        .take()
        .unwrap()
        .write_all(queries.join("\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(
        (lines[0]["qid"].as_str(), lines[0]["count"].as_u64()),
        (Some("a"), Some(2))
    );
    assert!(lines[1]["error"].as_str().unwrap().contains("not JSON"));
    assert!(lines[2]["error"]
        .as_str()
        .unwrap()
        .contains("outside the vocabulary"));
    // "7 5" is followed by 6 in the first document and by the corpus end in the second (eos).
    assert_eq!(
        (
            lines[3]["prompt_cnt"].as_u64(),
            lines[3]["cont_cnt"].as_u64()
        ),
        (Some(2), Some(1))
    );
    assert_eq!(lines[4]["suffix_len"].as_u64(), Some(2));
    assert_eq!(lines[4]["dist"], serde_json::json!({"5": 2}));
    assert_eq!(lines[4]["sparse"], serde_json::json!(true));
}

#[test]
fn bad_invocations_exit_nonzero_with_a_message() {
    let out = bin()
        .args(["query", "--index", "/nonexistent/idx"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such index folder"));
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("odd.u16");
    std::fs::write(&bad, [1u8, 2, 3]).unwrap();
    let out = bin()
        .args([
            "index",
            "build",
            "--token-width",
            "16",
            "--eos-id",
            "0",
            "--out",
        ])
        .arg(tmp.path().join("x"))
        .arg("--from-tokens")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("whole number"));
    assert!(
        !tmp.path().join("x").exists(),
        "a failed build leaves nothing behind"
    );
}
