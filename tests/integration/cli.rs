//! The command line as a person uses it: exit codes, error lines that do not stop a batch, pass-through
//! fields, and a build from a pre-tokenized file answered the same as the brute-force count.

use std::io::Write;
use std::path::{Path, PathBuf};
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

    let mut child = query_process(&idx);
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

/// A token file of two u16 documents, `[5 6 7 5 6] [6 7 5]`, in the infini-gram layout.
fn token_file(dir: &std::path::Path) -> std::path::PathBuf {
    let tokens: Vec<u16> = vec![0xFFFF, 5, 6, 7, 5, 6, 0xFFFF, 6, 7, 5];
    let file = dir.join("tokens.u16");
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(&file, bytes).unwrap();
    file
}

/// `index build --from-tokens FILE --out OUT` with the given extra arguments.
fn build_from(file: &std::path::Path, out: &str, extra: &[&str]) -> Command {
    let mut cmd = bin();
    cmd.args(["index", "build", "--token-width", "16", "--eos-id", "0"])
        .args(["--vocab-size", "100", "--from-tokens"])
        .arg(file)
        .args(["--out", out])
        .args(extra);
    cmd
}

/// Names in `dir` that start with `prefix`.
fn entries_starting(dir: &std::path::Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[test]
fn force_replaces_only_an_index_and_never_the_working_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let file = token_file(tmp.path());
    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();

    // A folder of someone's work is not an index: refused, untouched, nothing left beside it.
    let thesis = tmp.path().join("thesis");
    std::fs::create_dir(&thesis).unwrap();
    std::fs::write(thesis.join("thesis.txt"), "four years").unwrap();
    let out = build_from(&file, thesis.to_str().unwrap(), &["--force"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("thesis.txt") && stderr(&out).contains("only an index"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(thesis.join("thesis.txt")).unwrap(),
        "four years"
    );

    // `.`, `..` and `/` are refused, with or without --force, from inside a folder with files.
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("notes.txt"), "keep me").unwrap();
    for target in [".", "..", "/", "sub/.."] {
        for force in [&["--force"][..], &[]] {
            let out = build_from(&file, target, force)
                .current_dir(&work)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2), "{target}");
            assert!(
                stderr(&out).contains("current folder"),
                "{target}: {}",
                stderr(&out)
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(work.join("notes.txt")).unwrap(),
        "keep me"
    );

    // A plain file is not replaced either, and no finished .partial folder is left beside it.
    let plain = tmp.path().join("plain.bin");
    std::fs::write(&plain, "data").unwrap();
    let out = build_from(&file, plain.to_str().unwrap(), &["--force"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not a folder"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&plain).unwrap(), "data");

    // An index is replaced.
    let idx = tmp.path().join("idx");
    for _ in 0..2 {
        let out = build_from(&file, idx.to_str().unwrap(), &["--force"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    assert!(entries_starting(tmp.path(), "thesis.partial").is_empty());
    assert!(entries_starting(tmp.path(), "plain.bin.partial").is_empty());
    assert!(entries_starting(tmp.path(), "idx.partial").is_empty());
    assert!(entries_starting(&work, ".partial").is_empty());
}

#[test]
fn work_folders_of_killed_builds_are_removed_when_their_process_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let file = token_file(tmp.path());
    // A process id that is gone: a child that has exited and been reaped.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let alive = std::process::id();
    let partial = |pid: u32| tmp.path().join(format!("idx.partial-{pid}"));
    std::fs::create_dir(partial(dead)).unwrap();
    std::fs::write(partial(dead).join("tokenized.0"), [0xFF, 0xFF]).unwrap();
    std::fs::create_dir(partial(alive)).unwrap();
    std::fs::write(partial(alive).join("tokenized.0"), [0xFF, 0xFF]).unwrap();
    // Same name pattern, but holding a file no build writes: left alone.
    let odd = tmp.path().join("idx.partial-999999999");
    std::fs::create_dir(&odd).unwrap();
    std::fs::write(odd.join("notes.txt"), "mine").unwrap();

    let out = build_from(&file, tmp.path().join("idx").to_str().unwrap(), &[])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !partial(dead).exists(),
        "the dead build's folder is removed"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("removed"));
    assert!(partial(alive).exists(), "a running build's folder is kept");
    assert!(odd.join("notes.txt").exists());
}

/// An index at `dir/idx` over the generated token file.
fn built_index(dir: &Path) -> PathBuf {
    let file = token_file(dir);
    let idx = dir.join("idx");
    assert!(build_from(&file, idx.to_str().unwrap(), &[])
        .output()
        .unwrap()
        .status
        .success());
    idx
}

/// `query` over `idx`, reading and writing through pipes.
fn query_process(idx: &Path) -> std::process::Child {
    bin()
        .arg("query")
        .arg("--index")
        .arg(idx)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn one_bad_line_does_not_end_a_query_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = built_index(tmp.path());
    let mut child = query_process(&idx);
    let mut input = Vec::new();
    input.extend_from_slice(b"{\"qid\":1,\"op\":\"count\",\"ids\":[5]}\n");
    input.extend_from_slice(b"\xff\xfe not text\n");
    input.extend_from_slice(
        b"{\"qid\":3,\"op\":\"count\",\"ids\":[6],\"error\":\"x\",\"result\":1,\"latency\":-1,\"count\":99}\r\n",
    );
    input.extend_from_slice(b"\n   \n{\"qid\":4,\"op\":\"count\",\"ids\":[7]}");
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[0]["count"], 3);
    assert!(lines[1]["error"].as_str().unwrap().contains("UTF-8"));
    // Reserved names (error, latency) are not copied through; the answer's own fields win; the
    // caller's other fields (qid, result) come back as they were.
    assert_eq!(
        lines[2],
        serde_json::json!({"qid": 3, "result": 1, "count": 3, "approx": false})
    );
    assert_eq!(
        (lines[3]["qid"].as_u64(), lines[3]["count"].as_u64()),
        (Some(4), Some(2))
    );
}

#[test]
fn query_output_onto_its_own_input_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = built_index(tmp.path());
    let queries = tmp.path().join("q.jsonl");
    let text = "{\"op\":\"count\",\"ids\":[5]}\n";
    std::fs::write(&queries, text).unwrap();
    let link = tmp.path().join("link.jsonl");
    std::fs::hard_link(&queries, &link).unwrap();
    for output in [&queries, &link] {
        let out = bin()
            .arg("query")
            .arg("--index")
            .arg(&idx)
            .arg("--input")
            .arg(&queries)
            .arg("--output")
            .arg(output)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("is the --input file"));
        assert_eq!(std::fs::read_to_string(&queries).unwrap(), text);
    }
}

/// Runs `child` to its end and returns its peak resident memory in bytes.
fn peak_rss(child: std::process::Child) -> (i32, u64) {
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it for the child we spawned.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid);
    (status, usage.ru_maxrss as u64 * 1024)
}

#[test]
fn an_overlong_query_line_is_refused_without_being_held() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = built_index(tmp.path());
    let mut child = query_process(&idx);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).unwrap();
        text
    });
    // 256 MiB in one line, four times the limit, then a good query.
    let block = vec![b'a'; 1 << 20];
    for _ in 0..256 {
        stdin.write_all(&block).unwrap();
    }
    stdin
        .write_all(b"\n{\"op\":\"count\",\"ids\":[5]}\n")
        .unwrap();
    drop(stdin);
    let (status, peak) = peak_rss(child);
    let text = reader.join().unwrap();
    assert_eq!(status, 0);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text:.200}");
    assert!(lines[0].contains("exceeds"), "{}", lines[0]);
    assert!(lines[1].contains("\"count\":3"), "{}", lines[1]);
    assert!(
        peak < 160 << 20,
        "peak memory {} MiB: the line was held whole",
        peak >> 20
    );
}

#[test]
fn verify_fails_when_a_file_has_no_manifest_record() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = built_index(tmp.path());
    let manifest = idx.join(infini_sidecar::index::format::MANIFEST_FILE);
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    m["shards"][0]["files"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f["name"] != "table.0");
    std::fs::write(&manifest, m.to_string()).unwrap();
    // Garbage of the right size in place of the suffix array.
    let size = std::fs::metadata(idx.join("table.0")).unwrap().len() as usize;
    let garbage: Vec<u8> = (0..size).map(|i| (i * 131 + 17) as u8).collect();
    std::fs::write(idx.join("table.0"), garbage).unwrap();
    let out = bin()
        .args(["index", "verify", "--index"])
        .arg(&idx)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no record of") && err.contains("table.0"),
        "{err}"
    );
}

/// Mini-Pile training text on one line, about `bytes` long.
fn one_line_text(bytes: usize) -> String {
    let files = infini_sidecar::corpus::expand_inputs(&[
        crate::common::assets().join("minipile/train.jsonl")
    ])
    .unwrap();
    let mut text = String::new();
    for doc in infini_sidecar::corpus::text_documents(files) {
        if let infini_sidecar::corpus::Content::Text(t) = doc.unwrap().content {
            text.push_str(&t.replace(['\n', '\r'], " "));
            text.push(' ');
        }
        if text.len() >= bytes {
            break;
        }
    }
    text
}

#[test]
fn a_long_one_line_document_is_tokenized_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("one-line.txt");
    std::fs::write(&input, one_line_text(4 << 20)).unwrap();
    let child = bin()
        .args(["index", "build", "--threads", "2", "--tokenizer"])
        .arg(crate::common::smollm2_gguf())
        .arg("--input")
        .arg(&input)
        .arg("--out")
        .arg(tmp.path().join("idx"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (status, peak) = peak_rss(child);
    assert_eq!(status, 0);
    // Tokenizing the 4 MiB at once took some 500 MiB (2.5 GB for 20 MB).
    assert!(peak < 200 << 20, "peak memory {} MiB", peak >> 20);
}

#[test]
fn decontamination_settings_that_drop_documents_for_no_reason_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let train = tmp.path().join("train.txt");
    std::fs::write(&train, "the cat sat on the mat and looked at the dog").unwrap();
    let eval = tmp.path().join("eval.txt");
    std::fs::write(&eval, "the dog sat on the cat").unwrap();
    for (flag, value, says) in [
        ("--decontaminate-ngram", "0", "at least 1"),
        ("--decontaminate-threshold", "1.5", "(0, 1]"),
        ("--decontaminate-threshold", "0", "(0, 1]"),
    ] {
        let out = bin()
            .args(["index", "build", "--tokenizer"])
            .arg(crate::common::smollm2_gguf())
            .arg("--input")
            .arg(&train)
            .arg("--out")
            .arg(tmp.path().join("idx"))
            .arg("--decontaminate")
            .arg(&eval)
            .args([flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
}

/// A log written to a pipe (or a file) is plain text: no colour codes, even without `NO_COLOR`.
#[test]
fn logs_to_a_pipe_are_plain_text() {
    let tmp = tempfile::tempdir().unwrap();
    let file = token_file(tmp.path());
    let out = build_from(&file, &tmp.path().join("idx").display().to_string(), &[])
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains('\u{1b}'), "{log:?}");
}
