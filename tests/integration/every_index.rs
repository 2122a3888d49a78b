//! Every kind of index through every entry point (issue 50): mini-Pile documents indexed in
//! SmolLM2's tokens and in bytes, each as a suffix array and compressed, and each suffix array
//! built again as three shards behind a router. Through `query` (every op) and `serve` (every engine
//! RPC), each kind answers as the suffix-array index over the same text does, or refuses with the
//! message the README documents for that cell.

use std::path::{Path, PathBuf};
use std::process::Command;

use infini_sidecar::server::config::ServeConfig;
use infini_sidecar::server::pb;
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use serde_json::{json, Value};
use tonic::transport::Channel;

use crate::cluster::{corpus, router, shard_server, Process};
use crate::common::server::{config, start, Running};
use crate::common::smollm2_gguf;

const SHARDS: usize = 3;

fn sidecar(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_infini-sidecar"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

fn succeeds(args: &[&str]) -> String {
    let out = sidecar(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `index build` of `input` into `out` in SmolLM2's tokens or in bytes; with `shard`, shard K of
/// three; `extra` arguments after those.
fn build_with(input: &Path, out: &Path, bytes: bool, shard: Option<usize>, extra: &[&str]) {
    let (input, out) = (input.display().to_string(), out.display().to_string());
    let tokenizer = smollm2_gguf().display().to_string();
    let mut args = vec![
        "index",
        "build",
        "--input",
        &input,
        "--out",
        &out,
        "--memory-gib",
        "1",
    ];
    match bytes {
        true => args.push("--bytes"),
        false => args.extend(["--tokenizer", &tokenizer]),
    }
    let part = shard.map(|k| format!("{k}/{SHARDS}"));
    if let Some(part) = &part {
        args.extend(["--shard", part]);
    }
    args.extend(extra);
    succeeds(&args);
}

fn build(input: &Path, out: &Path, bytes: bool, shard: Option<usize>) {
    build_with(input, out, bytes, shard, &[]);
}

/// The files of a compressed index's folder, by name.
fn files_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

fn compress(from: &Path, to: &Path) {
    let (from, to) = (from.display().to_string(), to.display().to_string());
    succeeds(&[
        "index",
        "compress",
        "--threads",
        "1",
        "--index",
        &from,
        "--out",
        &to,
    ]);
}

/// One text's indexes of one granularity: the suffix array (the oracle), its compressed form, and
/// the three shards of a router.
struct Kinds {
    sa: PathBuf,
    fm: PathBuf,
    shards: Vec<PathBuf>,
}

fn kinds(dir: &Path, input: &Path, name: &str, bytes: bool) -> Kinds {
    let sa = dir.join(format!("{name}-sa"));
    build(input, &sa, bytes, None);
    let fm = dir.join(format!("{name}-fm"));
    compress(&sa, &fm);
    let shards = (0..SHARDS)
        .map(|k| {
            let out = dir.join(format!("{name}-shard-{k}"));
            build(input, &out, bytes, Some(k));
            out
        })
        .collect();
    Kinds { sa, fm, shards }
}

/// Answers of `query` over `index`, one JSON value per query.
fn query(dir: &Path, index: &Path, queries: &[Value]) -> Vec<Value> {
    let input = dir.join("queries.jsonl");
    let lines: Vec<String> = queries.iter().map(Value::to_string).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = succeeds(&[
        "query",
        "--index",
        &index.display().to_string(),
        "--input",
        &input.display().to_string(),
    ]);
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A document of the suffix-array index longer than `len` tokens, as its ids.
fn a_document(dir: &Path, sa: &Path, len: usize) -> Vec<u32> {
    (3..40)
        .map(|doc_ix| {
            let got = query(dir, sa, &[json!({"op": "get_doc", "doc_ix": doc_ix})]);
            serde_json::from_value::<Vec<u32>>(got[0]["token_ids"].clone()).unwrap()
        })
        .find(|ids| ids.len() > len)
        .expect("a long enough document")
}

/// A benchmark of three items: two lifted from the indexed documents (contaminated), one not.
fn bench_items(input: &Path) -> String {
    let text = std::fs::read_to_string(input).unwrap();
    let docs: Vec<Value> = text
        .lines()
        .take(40)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let lifted = |i: usize| {
        let t = docs[i]["text"].as_str().unwrap();
        t.chars().take(600).collect::<String>()
    };
    let items = [
        lifted(5),
        lifted(30),
        "Purple giraffes compose sonnets about quantum marmalade every other Thursday.".into(),
    ];
    items
        .iter()
        .map(|t| json!({"text": t, "meta": {"pile_set_name": "bench"}}).to_string() + "\n")
        .collect()
}

/// Where in `doc` a 6-gram starts that occurs more than once but rarely enough that a compressed
/// index visits all its places (a broad one it refuses, below).
fn a_rare_gram(dir: &Path, sa: &Path, doc: &[u32]) -> usize {
    let counts = query(
        dir,
        sa,
        &(20..80)
            .map(|at| json!({"op": "count", "ids": &doc[at..at + GRAM]}))
            .collect::<Vec<_>>(),
    );
    let rare = |c: &Value| (2..=500).contains(&c["count"].as_u64().unwrap());
    20 + counts.iter().position(rare).expect("a rare 6-gram")
}

const GRAM: usize = 6;

/// Every op of the query protocol, over pieces of `doc` (ids of the index's granularity); the
/// n-gram queried starts at `at`, a rare one of `other` at `rare`.
fn every_op(doc: &[u32], other: &[u32], at: usize, rare: usize) -> Vec<Value> {
    let gram = &doc[at..at + GRAM];
    let traced: Vec<u32> = [&doc[10..70], &other[5..40], &doc[100..130]].concat();
    vec![
        json!({"op": "count", "ids": gram}),
        json!({"op": "count", "ids": []}),
        json!({"op": "prob", "prompt": &doc[at..at + 3], "cont": doc[at + 3]}),
        json!({"op": "ntd", "prompt": &doc[at..at + 2]}),
        json!({"op": "ntd", "prompt": &doc[at + 1..at + 2], "max_support": 4}),
        json!({"op": "infgram_prob", "prompt": &doc[..60], "cont": doc[60]}),
        json!({"op": "infgram_ntd", "prompt": &doc[..60]}),
        json!({"op": "infgram_ntd", "prompt": &doc[..61], "max_support": 3}),
        json!({"op": "find", "ids": gram}),
        json!({"op": "search_docs", "ids": gram, "maxnum": 3, "max_disp_len": 20}),
        json!({"op": "search_docs", "cnf": [[gram], [&doc[at..at + GRAM + 1], &other[rare..rare + GRAM]]], "maxnum": 2}),
        json!({"op": "get_doc", "doc_ix": 7}),
        json!({"op": "score", "ids": &doc[..90]}),
        json!({"op": "trace", "ids": traced, "min_len": 4, "maxnum": 2, "max_disp_len": 16}),
        json!({"op": "hints", "ids": &doc[..30]}),
        json!({"op": "count", "ids": [1u64 << 31]}),
        json!({"op": "search_docs", "ids": &doc[at..at + 1], "max_clause_freq": 10}),
    ]
}

/// A compressed index's answer to `op` beside the suffix array's: equal, but for `find`, whose
/// ranks are the compressed index's own rows (the counts and range lengths agree), and `hints`,
/// refused naming the suffix array.
fn assert_answers_alike(op: &Value, got: &Value, want: &Value) {
    match op["op"].as_str().unwrap() {
        "find" => {
            assert_eq!(got["cnt"], want["cnt"], "{op}");
            let lens = |v: &Value| -> Vec<u64> {
                (v["segment_by_shard"].as_array().unwrap().iter())
                    .map(|r| r[1].as_u64().unwrap() - r[0].as_u64().unwrap())
                    .collect()
            };
            assert_eq!(lens(got), lens(want), "{op}");
        }
        "hints" => {
            assert!(want.get("hints").is_some(), "{want}");
            let error = got["error"].as_str().unwrap_or_default();
            assert!(error.contains("needs a suffix-array index"), "{got}");
        }
        // A search the suffix array subsamples, in its rank order.
        "search_docs" if want["approx"] == json!(true) => {
            let error = got["error"].as_str().unwrap_or_default();
            assert!(error.contains("search the suffix-array index"), "{got}");
        }
        _ => assert_eq!(got, want, "{op}"),
    }
}

/// `query` over each kind and granularity: every op answered as the suffix array answers it.
#[test]
fn query_answers_over_every_kind_of_index() {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path());
    for (name, bytes) in [("tokens", false), ("bytes", true)] {
        let sa = tmp.path().join(format!("{name}-sa"));
        let fm = tmp.path().join(format!("{name}-fm"));
        build(&input, &sa, bytes, None);
        compress(&sa, &fm);
        // Built both ways, the compressed index is the same, file for file: straight from the
        // text (`index build --compressed`, the same parts as the suffix array's) and from the
        // suffix-array index (`index compress`).
        let direct = tmp.path().join(format!("{name}-fm-direct"));
        build_with(
            &input,
            &direct,
            bytes,
            None,
            &["--compressed", "--threads", "1"],
        );
        assert!(
            files_of(&direct) == files_of(&fm),
            "{name}: the two builds differ"
        );
        let doc = a_document(tmp.path(), &sa, 140);
        let other = a_document(tmp.path(), &sa, 60 + doc.len()).split_off(60);
        let at = a_rare_gram(tmp.path(), &sa, &doc);
        let rare = a_rare_gram(tmp.path(), &sa, &other);
        let ops = every_op(&doc, &other, at, rare);
        let want = query(tmp.path(), &sa, &ops);
        let got = query(tmp.path(), &fm, &ops);
        for ((op, got), want) in ops.iter().zip(&got).zip(&want) {
            if op["op"] != "hints" && op["ids"] != json!([1u64 << 31]) {
                assert!(want.get("error").is_none(), "{name} {op}: {want}");
            }
            assert_answers_alike(op, got, want);
        }
        // `eval contamination`: the same report, the folder it names aside.
        let bench = tmp.path().join("bench.jsonl");
        std::fs::write(&bench, bench_items(&input)).unwrap();
        let report = |index: &Path| -> Value {
            let (index, bench) = (index.display().to_string(), bench.display().to_string());
            let out = succeeds(&[
                "eval",
                "contamination",
                "--index",
                &index,
                "--input",
                &bench,
                "--json",
            ]);
            let mut report: Value = serde_json::from_str(&out).unwrap();
            report["index"] = Value::Null;
            report
        };
        let want_report = report(&sa);
        assert!(
            want_report["summaries"][0]["contaminated"]
                .as_u64()
                .unwrap()
                > 0,
            "{want_report}"
        );
        assert_eq!(report(&fm), want_report, "{name}");
        // `eval backoff`: the same perplexities and the same generated text (times aside).
        let backoff = |index: &Path| -> Value {
            let (index, bench) = (index.display().to_string(), bench.display().to_string());
            let out = succeeds(&[
                "eval",
                "backoff",
                "--index",
                &index,
                "--input",
                &bench,
                "--generate",
                "40",
                "--json",
            ]);
            let mut report: Value = serde_json::from_str(&out).unwrap();
            for row in report["rows"].as_array_mut().unwrap() {
                row["seconds"] = Value::Null;
            }
            for time in ["seconds", "bytes_per_second"] {
                report["generation"][time] = Value::Null;
            }
            report
        };
        let want_backoff = backoff(&sa);
        assert!(want_backoff["generation"]["tokens"].as_u64().unwrap() > 0);
        assert_eq!(backoff(&fm), want_backoff, "{name}");
        // The trace found spans from both documents; the broad search was subsampled.
        let spans = want[13]["spans"].as_array().unwrap();
        assert!(spans.len() >= 2, "{name}: {spans:?}");
        assert_eq!(want[16]["approx"], json!(true), "{name}: {}", want[16]);
    }
}

/// `eval fit`, `eval ppl`, `eval generate` and `eval spec` with SmolLM2 over a compressed index of
/// tokens: the same fitted mixing, the same report and the same samples as over the suffix-array
/// index, and the same greedy outputs (equal to plain decoding's); over a compressed byte index,
/// refused.
#[test]
fn eval_ppl_over_every_kind_of_index() {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path());
    let test_docs = crate::common::assets().join("minipile/test.jsonl");
    let eval = |op: &str, index: &Path, extra: &[&str]| {
        let (index, docs) = (index.display().to_string(), test_docs.display().to_string());
        let model = smollm2_gguf().display().to_string();
        let mut args = vec!["eval", op, "--cpu", "--max-tokens", "60", "--model", &model];
        args.extend(["--index", &index, "--input", &docs, "--json"]);
        args.extend(extra);
        sidecar(&args)
    };
    let json = |out: std::process::Output| -> Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
        // The folder and the seconds differ; every figure does not.
        v["index"] = Value::Null;
        v["timing"] = Value::Null;
        v
    };
    // A decoding evaluation's rows, from the JSON it writes.
    let decoding = |op: &str, index: &Path, extra: &[&str]| -> Result<Value, String> {
        let out = tmp
            .path()
            .join(format!("{op}-{}", index.display()).replace('/', "_"));
        let (index, docs) = (index.display().to_string(), test_docs.display().to_string());
        let (model, dir) = (
            smollm2_gguf().display().to_string(),
            out.display().to_string(),
        );
        let mut args = vec!["eval", op, "--cpu", "--model", &model, "--index", &index];
        args.extend(["--input", &docs, "--prompts-per-domain", "1"]);
        args.extend([
            "--prompt-tokens",
            "32",
            "--new-tokens",
            "12",
            "--out-dir",
            &dir,
        ]);
        args.extend(extra);
        let run = sidecar(&args);
        if !run.status.success() {
            return Err(String::from_utf8_lossy(&run.stderr).into_owned());
        }
        let written = std::fs::read_to_string(out.join(format!("{op}.json"))).unwrap();
        Ok(serde_json::from_str(&written).unwrap())
    };
    // What greedy speculative decoding must keep whatever drafts the index gives: every output
    // equal to plain decoding's, token for token.
    let outputs = |rows: Value| -> Vec<Value> {
        let rows = rows.as_array().unwrap().iter();
        rows.map(|r| json!([r["domain"], r["source"], r["tokens"], r["mismatches"]]))
            .collect()
    };
    for (name, bytes) in [("tokens", false), ("bytes", true)] {
        let sa = tmp.path().join(format!("{name}-sa"));
        let fm = tmp.path().join(format!("{name}-fm"));
        build(&input, &sa, bytes, None);
        compress(&sa, &fm);
        let mixing = tmp.path().join(format!("{name}-mixing.json"));
        let m = mixing.display().to_string();
        json(eval("fit", &sa, &["--gate-trees", "4", "--out", &m]));
        let want = json(eval("ppl", &sa, &["--mixing", &m]));
        if bytes {
            let refused = eval("ppl", &fm, &["--mixing", &m]);
            assert!(!refused.status.success());
            let said = String::from_utf8_lossy(&refused.stderr);
            assert!(said.contains("compressed byte-level index"), "{said}");
            let said = decoding("spec", &fm, &[]).unwrap_err();
            assert!(said.contains("compressed byte-level index"), "{said}");
            continue;
        }
        let m_fm = tmp.path().join("fm-mixing.json");
        let fitted = m_fm.display().to_string();
        json(eval("fit", &fm, &["--gate-trees", "4", "--out", &fitted]));
        let lambdas = |p: &Path| -> Value {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
            json!([v["lambda_sparse"], v["lambda_dense"]])
        };
        assert_eq!(lambdas(&m_fm), lambdas(&mixing));
        assert_eq!(json(eval("ppl", &fm, &["--mixing", &m])), want);
        let generate = |index: &Path| decoding("generate", index, &["--mixing", &m]).unwrap();
        assert_eq!(generate(&fm), generate(&sa));
        let spec = outputs(decoding("spec", &sa, &[]).unwrap());
        assert!(spec.iter().all(|r| r[3] == json!(0)), "{spec:?}");
        assert_eq!(outputs(decoding("spec", &fm, &[]).unwrap()), spec);
    }
}

/// A call's answer, or its refusal's code and message.
type Answer<T> = Result<T, (tonic::Code, String)>;

fn answer<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Answer<T> {
    r.map(tonic::Response::into_inner)
        .map_err(|s| (s.code(), s.message().to_string()))
}

/// The engine RPCs of `sidecar.v1` a client makes of any index: their answers, in order, as text
/// (the messages differ in type).
async fn engine_calls(
    client: &mut SidecarClient<Channel>,
    doc: &[u32],
    other: &[u32],
    (at, rare): (usize, usize),
) -> Vec<String> {
    let gram = doc[at..at + GRAM].to_vec();
    let ntd = |prompt: &[u32], infinite, max_support| pb::NextTokenDistributionRequest {
        prompt: prompt.to_vec(),
        infinite,
        max_support,
        ..Default::default()
    };
    let search = pb::SearchDocumentsRequest {
        cnf: vec![
            pb::Clause {
                ngrams: vec![pb::NGram { ids: gram.clone() }],
            },
            pb::Clause {
                ngrams: vec![
                    pb::NGram {
                        ids: doc[at..at + GRAM + 1].to_vec(),
                    },
                    pb::NGram {
                        ids: other[rare..rare + GRAM].to_vec(),
                    },
                ],
            },
        ],
        maxnum: 2,
        max_disp_len: 20,
        ..Default::default()
    };
    let trace = pb::TraceRequest {
        ids: [&doc[10..70], &other[5..40]].concat(),
        min_len: 4,
        maxnum: 2,
        max_disp_len: 16,
        ..Default::default()
    };
    let draft = pb::DraftRequest {
        target: Some(pb::draft_request::Target::Context(pb::TokenIds {
            ids: doc[..50].to_vec(),
        })),
        options: Some(pb::DraftOptions {
            tree_budget: 16,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut out = Vec::new();
    let mut info = client.info(pb::InfoRequest {}).await.unwrap().into_inner();
    info.index_dir.clear();
    out.push(format!("{info:?}"));
    let text = client
        .detokenize(pb::DetokenizeRequest {
            ids: doc[..30].to_vec(),
        })
        .await;
    out.push(format!("{:?}", answer(text)));
    out.push(format!(
        "{:?}",
        answer(
            client
                .count(pb::CountRequest {
                    ids: gram.clone(),
                    ..Default::default()
                })
                .await
        )
    ));
    for r in [
        ntd(&doc[at..at + 2], false, 0),
        ntd(&doc[..60], true, 0),
        ntd(&doc[..61], true, 3),
    ] {
        out.push(format!(
            "{:?}",
            answer(client.next_token_distribution(r).await)
        ));
    }
    out.push(format!(
        "{:?}",
        answer(client.search_documents(search).await)
    ));
    out.push(format!("{:?}", answer(client.trace(trace).await)));
    let score = pb::ScoreRequest {
        documents: vec![pb::ScoreDocument {
            token_ids: doc[..90].to_vec(),
            ..Default::default()
        }],
        per_token: true,
        ..Default::default()
    };
    out.push(match answer(client.score(score).await) {
        Ok(mut stream) => format!("{:?}", stream.message().await),
        Err(e) => format!("{e:?}"),
    });
    // Drafts: their first tokens and probabilities come from the same samples over both kinds.
    out.push(match answer(client.draft(draft).await) {
        Ok(d) => format!("{} {:?}", d.match_len, roots(&d)),
        Err(e) => format!("{e:?}"),
    });
    out
}

fn assert_calls_alike(got: &[String], want: &[String], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (got, want)) in got.iter().zip(want).enumerate() {
        assert_eq!(got, want, "{what}: call {i}");
    }
}

/// A distribution's answer less its tokens.
fn without_dist(answer: &str) -> String {
    match (answer.find("dist: ["), answer.find("], approx")) {
        (Some(from), Some(to)) => format!("{}{}", &answer[..from], &answer[to + 3..]),
        _ => answer.to_string(),
    }
}

fn roots(d: &pb::DraftResponse) -> Vec<(u32, u64)> {
    (d.parents.iter().zip(&d.token_ids).zip(&d.probs))
        .filter(|((&p, _), _)| p < 0)
        .map(|((_, &t), &p)| (t, (p * 1e9).round() as u64))
        .collect()
}

/// Back-off generation and training hints (which only a suffix array answers): their answers as
/// text, or their refusals.
async fn generate_and_hints(
    client: &mut SidecarClient<Channel>,
    doc: &[u32],
) -> Vec<Answer<String>> {
    // Three levels, then every level down to the empty suffix, drawn at temperature 1: every
    // level's distribution decides the draws.
    let generate = |levels| pb::GenerateRequest {
        prompt: doc[..20].to_vec(),
        max_new_tokens: 12,
        levels: Some(levels),
        temperature: 1.0,
        seed: 7,
        ..Default::default()
    };
    let hints = pb::HintsRequest {
        sequences: vec![pb::TokenIds {
            ids: doc[..30].to_vec(),
        }],
        ..Default::default()
    };
    vec![
        answer(client.generate(generate(3)).await).map(|a| format!("{a:?}")),
        answer(client.generate(generate(0)).await).map(|a| format!("{a:?}")),
        answer(client.hints(hints).await).map(|a| format!("{a:?}")),
    ]
}

/// Three shard servers over `shards` behind a router: their processes, and a client of the router.
async fn routed(
    dir: &Path,
    name: &str,
    shards: &[PathBuf],
) -> (Vec<Process>, Process, SidecarClient<Channel>) {
    let mut held = Vec::new();
    let mut addrs = Vec::new();
    for (k, shard) in shards.iter().enumerate() {
        let (process, addr) = shard_server(dir, &format!("{name}-{k}"), shard).await;
        held.push(process);
        addrs.push(addr.to_string());
    }
    let (router, client, _) = router(dir, &format!("{name}-router"), &addrs, "").await;
    (held, router, client)
}

fn serving(index: PathBuf, dir: &Path) -> ServeConfig {
    ServeConfig {
        mixing: None,
        ..config(dir, index, false)
    }
}

/// `serve` over each kind and granularity, and a router over three shard servers of each kind:
/// every engine call answered as a single suffix-array sidecar answers it (back-off generation
/// too); a compressed index refuses hints naming the suffix array.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_over_every_kind_of_index() {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path());
    for (name, bytes) in [("tokens", false), ("bytes", true)] {
        let kinds = kinds(tmp.path(), &input, name, bytes);
        let doc = a_document(tmp.path(), &kinds.sa, 140);
        let other = a_document(tmp.path(), &kinds.sa, 60 + doc.len()).split_off(60);
        let at = (
            a_rare_gram(tmp.path(), &kinds.sa, &doc),
            a_rare_gram(tmp.path(), &kinds.sa, &other),
        );
        let mut sa: Running = start(serving(kinds.sa.clone(), tmp.path())).await;
        let mut fm: Running = start(serving(kinds.fm.clone(), tmp.path())).await;
        let want = engine_calls(&mut sa.client, &doc, &other, at).await;
        assert!(
            want.iter().all(|a| !a.starts_with("Err")) || bytes,
            "{name}: {want:?}"
        );
        let got = engine_calls(&mut fm.client, &doc, &other, at).await;
        assert_calls_alike(&got, &want, name);
        // Back-off generation over both kinds; hints refused over a compressed index.
        let want_extra = generate_and_hints(&mut sa.client, &doc).await;
        assert!(
            want_extra.iter().all(Result::is_ok),
            "{name}: {want_extra:?}"
        );
        let got_extra = generate_and_hints(&mut fm.client, &doc).await;
        assert_eq!(got_extra[..2], want_extra[..2], "{name}: Generate");
        let (code, message) = got_extra[2].clone().unwrap_err();
        assert_eq!(code, tonic::Code::FailedPrecondition, "{message}");
        assert!(message.contains("needs a suffix-array index"), "{message}");

        // Three shard servers behind a router answer as the single index.
        let (_held, _router, mut routed_sa) =
            routed(tmp.path(), &format!("{name}-sa"), &kinds.shards).await;
        let mut got = engine_calls(&mut routed_sa, &doc, &other, at).await;
        let mut want = want.clone();
        // The router names no folder and counts its shards.
        got.remove(0);
        want.remove(0);
        // Back-off generation as the single index draws it; hints, which a router does not yet
        // answer across shards, refused (the README's table).
        let routed_extra = generate_and_hints(&mut routed_sa, &doc).await;
        assert_eq!(
            routed_extra[..2],
            want_extra[..2],
            "{name}: routed Generate"
        );
        let (code, message) = routed_extra[2].clone().unwrap_err();
        assert_eq!(code, tonic::Code::Unimplemented, "{name}: {message}");
        // Its settings are checked before any shard is asked.
        let cold = pb::GenerateRequest {
            prompt: doc[..4].to_vec(),
            temperature: -1.0,
            ..Default::default()
        };
        let (code, message) = answer(routed_sa.generate(cold).await).unwrap_err();
        assert_eq!(code, tonic::Code::InvalidArgument, "{name}: {message}");
        // Every engine call, maximal spans included.
        // A subsampled distribution is the one of the shards' joined index, sampled in its own
        // order (`tests/integration/cluster.rs` compares it so): its count and suffix agree.
        let routed_want = got.clone();
        for answers in [&mut got, &mut want] {
            answers[4] = without_dist(&answers[4]);
        }
        assert_calls_alike(&got[..8], &want[..8], &format!("{name} router"));

        // Shard servers over the shards compressed, behind a router: every engine call as the
        // router over the suffix-array shards answers it, samples and drafts included.
        let fm_shards: Vec<PathBuf> = (kinds.shards.iter().enumerate())
            .map(|(k, shard)| {
                let out = tmp.path().join(format!("{name}-fm-shard-{k}"));
                compress(shard, &out);
                out
            })
            .collect();
        let (_held, _router, mut routed_fm) =
            routed(tmp.path(), &format!("{name}-fm"), &fm_shards).await;
        let mut got = engine_calls(&mut routed_fm, &doc, &other, at).await;
        got.remove(0);
        assert_calls_alike(
            &got,
            &routed_want,
            &format!("{name} router over compressed shards"),
        );
        let routed_extra = generate_and_hints(&mut routed_fm, &doc).await;
        assert_eq!(
            routed_extra[..2],
            want_extra[..2],
            "{name}: Generate over compressed shards"
        );
        // A search the router subsamples: over suffix-array shards in their order; compressed
        // shards refuse it as one compressed index does, and the router says so.
        let broad = pb::SearchDocumentsRequest {
            cnf: vec![pb::Clause {
                ngrams: vec![pb::NGram {
                    ids: doc[at.0..at.0 + 1].to_vec(),
                }],
            }],
            maxnum: 1,
            max_clause_freq: 10,
            ..Default::default()
        };
        let subsampled = routed_sa.search_documents(broad.clone()).await.unwrap();
        assert!(subsampled.into_inner().approx, "{name}");
        let (code, message) = answer(routed_fm.search_documents(broad).await).unwrap_err();
        assert_eq!(code, tonic::Code::FailedPrecondition, "{name}: {message}");
        assert!(
            message.contains("search the suffix-array index"),
            "{message}"
        );
        for running in [sa, fm] {
            let _ = running.stop.send(());
            running.task.await.unwrap().unwrap();
        }
    }
}
