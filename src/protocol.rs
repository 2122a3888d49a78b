//! The batch query protocol of `infini-sidecar query`: one JSON object per input line, one per output
//! line, in order. Field names follow the reference engine; fields of the input other than the query's
//! own (such as `qid`) are copied to the output, except `error` and `latency`, which only the answer
//! writes, and where the answer has a field of the same name, the answer's wins. A bad line
//! (not JSON, not UTF-8, longer than [`MAX_LINE_BYTES`]) gets `{"error": ...}` and the run goes on.

use std::collections::BTreeMap;
use std::io::{BufRead, ErrorKind, Write};

use rayon::prelude::*;
use serde::de::IgnoredAny;
use serde_json::{json, Map, Value};

use crate::index::corpus::Corpus;
use crate::index::docs::SearchOptions;
use crate::index::hints::HintOptions;
use crate::index::trace::{TraceOptions, TraceSpan};

/// Fields that belong to a query and are not copied through.
const QUERY_FIELDS: &[&str] = &[
    "op",
    "ids",
    "prompt",
    "cont",
    "max_support",
    "cnf",
    "maxnum",
    "max_disp_len",
    "max_clause_freq",
    "doc_ix",
    "text",
    "min_len",
    "samples",
    "exact",
    "regularise",
    "min_plateau",
    "seed",
];
/// Fields only an answer writes: an input field of these names is not copied through, so that a
/// successful answer never carries an `error`, nor a `latency` that is not ours.
const RESERVED_FIELDS: &[&str] = &["error", "latency"];
/// Longest input line accepted (bytes); a longer one is read past, not kept, and refused.
pub const MAX_LINE_BYTES: usize = 64 << 20;
/// Lines answered in parallel at a time.
const CHUNK_LINES: usize = 256;

fn ids_of(v: Option<&Value>, field: &str) -> Result<Vec<u32>, String> {
    let arr = v
        .and_then(Value::as_array)
        .ok_or_else(|| format!("\"{field}\" must be a list of token ids"))?;
    arr.iter()
        .map(|x| {
            x.as_u64()
                .filter(|&n| n <= u32::MAX as u64)
                .map(|n| n as u32)
                .ok_or_else(|| format!("\"{field}\" holds {x}, not a token id"))
        })
        .collect()
}

fn u64_of(v: Option<&Value>, field: &str) -> Result<Option<u64>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .filter(|&n| n > 0)
            .map(Some)
            .ok_or_else(|| format!("\"{field}\" must be a positive integer")),
    }
}

fn token_of(v: Option<&Value>, field: &str) -> Result<u32, String> {
    v.and_then(Value::as_u64)
        .filter(|&n| n <= u32::MAX as u64)
        .map(|n| n as u32)
        .ok_or_else(|| format!("\"{field}\" must be a token id"))
}

fn cnf_of(v: &Value) -> Result<Vec<Vec<Vec<u32>>>, String> {
    let clauses = v
        .as_array()
        .ok_or("\"cnf\" must be a list of clauses, each a list of n-grams")?;
    clauses
        .iter()
        .map(|c| {
            c.as_array()
                .ok_or("each CNF clause must be a list of n-grams".to_string())?
                .iter()
                .map(|ng| ids_of(Some(ng), "cnf"))
                .collect()
        })
        .collect()
}

/// The query's `text` in the index's tokens, or its `ids`.
fn ids_or_text(index: &dyn Corpus, q: &Map<String, Value>) -> Result<Vec<u32>, String> {
    match q.get("text") {
        Some(text) => {
            let text = text.as_str().ok_or("\"text\" must be a string")?;
            let tokenizer = index
                .tokenizer()
                .ok_or("this index carries no tokenizer: give \"ids\"")?;
            tokenizer.encode(text).map_err(|err| err.to_string())
        }
        None => ids_of(q.get("ids"), "ids"),
    }
}

/// An answer's fields as JSON text, serialized straight from the result: a distribution of thousands
/// of tokens never becomes a tree of `Value`s.
fn to_text<T: serde::Serialize>(x: T) -> Result<String, String> {
    serde_json::to_string(&x).map_err(|e| e.to_string())
}

/// Answers one parsed query with the text of a JSON object.
fn answer_query(index: &dyn Corpus, q: &Map<String, Value>) -> Result<String, String> {
    let op = q
        .get("op")
        .and_then(Value::as_str)
        .ok_or("missing \"op\"")?;
    let e = |err: crate::index::IndexError| err.to_string();
    match op {
        "count" => to_text(json!({"count": index.count(&ids_of(q.get("ids"), "ids")?).map_err(e)?, "approx": false})),
        "prob" => to_text(index.prob(&ids_of(q.get("prompt"), "prompt")?, token_of(q.get("cont"), "cont")?).map_err(e)?),
        "ntd" => to_text(index.ntd(&ids_of(q.get("prompt"), "prompt")?, u64_of(q.get("max_support"), "max_support")?).map_err(e)?),
        "infgram_prob" => to_text(index.infgram_prob(&ids_of(q.get("prompt"), "prompt")?, token_of(q.get("cont"), "cont")?).map_err(e)?),
        "infgram_ntd" => to_text(index.infgram_ntd(&ids_of(q.get("prompt"), "prompt")?, u64_of(q.get("max_support"), "max_support")?).map_err(e)?),
        "find" => to_text(index.find(&ids_of(q.get("ids"), "ids")?).map_err(e)?),
        "search_docs" => {
            let defaults = SearchOptions::default();
            let opts = SearchOptions {
                maxnum: u64_of(q.get("maxnum"), "maxnum")?.map_or(defaults.maxnum, |n| n.min(1000) as usize),
                max_disp_len: u64_of(q.get("max_disp_len"), "max_disp_len")?.map_or(defaults.max_disp_len, |n| n.min(1 << 20) as usize),
                max_clause_freq: u64_of(q.get("max_clause_freq"), "max_clause_freq")?.unwrap_or(defaults.max_clause_freq),
                ..defaults
            };
            let cnf = match q.get("cnf") {
                Some(c) => cnf_of(c)?,
                None => match q.get("ids") {
                    Some(Value::Array(a)) if a.first().is_some_and(Value::is_array) => cnf_of(&Value::Array(a.clone()))?,
                    ids => vec![vec![ids_of(ids, "ids")?]],
                },
            };
            to_text(index.search_docs_cnf(&cnf, opts).map_err(e)?)
        }
        "get_doc" => to_text(index.get_document(q.get("doc_ix").and_then(Value::as_u64).ok_or("\"doc_ix\" must be a document index")?).map_err(e)?),
        "score" => {
            let scores = index.score(&ids_of(q.get("ids"), "ids")?).map_err(e)?;
            to_text(json!({
                "prob": scores.iter().map(|s| s.prob).collect::<Vec<_>>(),
                "suffix_len": scores.iter().map(|s| s.suffix_len).collect::<Vec<_>>(),
                "prompt_cnt": scores.iter().map(|s| s.prompt_cnt).collect::<Vec<_>>(),
                "cont_cnt": scores.iter().map(|s| s.cont_cnt).collect::<Vec<_>>(),
                "sparse": scores.iter().map(|s| s.sparse).collect::<Vec<_>>(),
            }))
        }
        "trace" => {
            let defaults = TraceOptions::default();
            let opts = TraceOptions {
                min_len: u64_of(q.get("min_len"), "min_len")?.map_or(defaults.min_len, |n| n as usize),
                max_documents: u64_of(q.get("maxnum"), "maxnum")?.map_or(defaults.max_documents, |n| n.min(100) as usize),
                max_disp_len: u64_of(q.get("max_disp_len"), "max_disp_len")?.map_or(defaults.max_disp_len, |n| n.min(1 << 20) as usize),
                ..defaults
            };
            let ids = ids_or_text(index, q)?;
            let spans = index.trace(&ids, opts).map_err(e)?;
            let text_of = |span: &TraceSpan| index.tokenizer().and_then(|t| t.decode(&ids[span.start..span.end]).ok());
            to_text(json!({
                "tokens": ids.len(),
                "spans": spans.iter().map(|span| json!({
                    "start": span.start,
                    "end": span.end,
                    "count": span.count,
                    "text": text_of(span),
                    "documents": span.documents,
                })).collect::<Vec<_>>(),
            }))
        }
        "hints" => {
            let defaults = HintOptions::default();
            let flag = |field: &str, default: bool| match q.get(field) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_bool().ok_or(format!("\"{field}\" must be true or false")),
            };
            let opts = HintOptions {
                samples: u64_of(q.get("samples"), "samples")?.map_or(defaults.samples, |n| n.min(usize::MAX as u64) as usize),
                exact: flag("exact", defaults.exact)?,
                regularise: flag("regularise", defaults.regularise)?,
                min_plateau: u64_of(q.get("min_plateau"), "min_plateau")?.map_or(defaults.min_plateau, |n| n.min(usize::MAX as u64) as usize),
                seed: match q.get("seed") {
                    None | Some(Value::Null) => defaults.seed,
                    Some(v) => v.as_u64().ok_or("\"seed\" must be a non-negative integer")?,
                },
            };
            let ids = ids_or_text(index, q)?;
            let (hints, cost) = index.suffix_array("training hints").and_then(|i| i.hints(&ids, &opts)).map_err(e)?;
            to_text(json!({"tokens": ids.len(), "hints": hints, "cost": cost}))
        }
        other => Err(format!("unknown op {other:?} (count, prob, ntd, infgram_prob, infgram_ntd, find, search_docs, get_doc, score, trace, hints)")),
    }
}

/// CPU time of the calling thread, in seconds.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Answers one input line. With `timing`, adds `latency` (ms of this thread's CPU time).
pub fn answer_line(index: &dyn Corpus, line: &str, timing: bool) -> String {
    answer(index, line, timing).0
}

/// The answer line, and whether it is an error.
fn answer(index: &dyn Corpus, line: &str, timing: bool) -> (String, bool) {
    let parsed: Result<Map<String, Value>, String> = serde_json::from_str::<Value>(line)
        .map_err(|e| format!("not JSON: {e}"))
        .and_then(|v| match v {
            Value::Object(m) => Ok(m),
            _ => Err("a query must be a JSON object".into()),
        });
    let q = match parsed {
        Ok(q) => q,
        Err(err) => return (json!({ "error": err }).to_string(), true),
    };
    let copied = || {
        q.iter().filter(|(k, _)| {
            !QUERY_FIELDS.contains(&k.as_str()) && !RESERVED_FIELDS.contains(&k.as_str())
        })
    };
    let start = thread_cpu_seconds();
    let body = answer_query(index, &q);
    let latency = timing.then(|| (thread_cpu_seconds() - start) * 1e3);
    let (body, failed) = match body {
        Ok(body) => (body, false),
        Err(err) => (json!({ "error": err }).to_string(), true),
    };
    match join_fields(copied(), &body, latency) {
        Ok(line) => (line, failed),
        Err(err) => {
            let error = json!({ "error": err }).to_string();
            let line = join_fields(copied(), &error, None).unwrap_or(error);
            (line, true)
        }
    }
}

/// One JSON object of the query's copied fields, then the answer's (`body`, an object's text, whose
/// fields win), then `latency`. The answer is spliced in as text: it is scanned once for its top-level
/// keys but never built into `Value`s, so a distribution of thousands of tokens costs one pass over it.
fn join_fields<'a>(
    copied: impl Iterator<Item = (&'a String, &'a Value)>,
    body: &str,
    latency: Option<f64>,
) -> Result<String, String> {
    let keys: BTreeMap<String, IgnoredAny> =
        serde_json::from_str(body).map_err(|e| format!("answer is not a JSON object: {e}"))?;
    let mut parts: Vec<String> = copied
        .filter(|(k, _)| !keys.contains_key(*k))
        .map(|(key, value)| format!("{}:{value}", Value::from(key.as_str())))
        .collect();
    // `keys` parsed, so the text is one object: its fields lie between the outer braces.
    let inner = body.trim();
    let inner = inner[1..inner.len() - 1].trim();
    if !inner.is_empty() {
        parts.push(inner.to_string());
    }
    if let Some(ms) = latency {
        parts.push(format!("\"latency\":{}", json!(ms)));
    }
    Ok(format!("{{{}}}", parts.join(",")))
}

/// One input line: a query's text, or why it cannot be one.
enum Line {
    Query(String),
    Refused(String),
}

/// Reads the next line into `buf` without its `\n`, keeping at most `max` bytes: the rest of a longer
/// line is read and dropped, so memory stays bounded whatever the input. Returns the line's full
/// length, or `None` at the end of the input.
fn read_line_bounded(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<usize>> {
    buf.clear();
    let mut total = 0usize;
    loop {
        let available = match input.fill_buf() {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok((total > 0).then_some(total));
        }
        let newline = available.iter().position(|&b| b == b'\n');
        let part = &available[..newline.unwrap_or(available.len())];
        let room = max.saturating_sub(buf.len()).min(part.len());
        buf.extend_from_slice(&part[..room]);
        total += part.len();
        let used = newline.map_or(available.len(), |at| at + 1);
        input.consume(used);
        if newline.is_some() {
            return Ok(Some(total));
        }
    }
}

/// The next non-blank line, or `None` at the end of the input.
fn next_line(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<Line>> {
    loop {
        let Some(len) = read_line_bounded(input, buf, max)? else {
            return Ok(None);
        };
        if len > max {
            return Ok(Some(Line::Refused(format!(
                "line of {len} bytes exceeds the limit of {max}"
            ))));
        }
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        match std::str::from_utf8(buf) {
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => return Ok(Some(Line::Query(text.to_owned()))),
            Err(e) => {
                return Ok(Some(Line::Refused(format!(
                    "not UTF-8 (invalid byte at {})",
                    e.valid_up_to()
                ))))
            }
        }
    }
}

/// Reads queries from `input` and writes answers to `output`, in order; returns (queries, errors).
pub fn run_batch(
    index: &dyn Corpus,
    input: impl BufRead,
    output: &mut impl Write,
    timing: bool,
) -> std::io::Result<(u64, u64)> {
    run_batch_limited(index, input, output, timing, MAX_LINE_BYTES)
}

/// [`run_batch`] with lines limited to `max_line` bytes. A chunk answered in parallel holds at most
/// `CHUNK_LINES` lines and about `max_line` bytes of them.
fn run_batch_limited(
    index: &dyn Corpus,
    mut input: impl BufRead,
    output: &mut impl Write,
    timing: bool,
    max_line: usize,
) -> std::io::Result<(u64, u64)> {
    let (mut queries, mut errors) = (0u64, 0u64);
    let mut buf = Vec::new();
    loop {
        let mut chunk = Vec::with_capacity(CHUNK_LINES);
        let mut chunk_bytes = 0;
        while chunk.len() < CHUNK_LINES && chunk_bytes < max_line {
            match next_line(&mut input, &mut buf, max_line)? {
                Some(line) => {
                    chunk_bytes += buf.len();
                    chunk.push(line);
                }
                None => break,
            }
        }
        if chunk.is_empty() {
            return Ok((queries, errors));
        }
        let answers: Vec<(String, bool)> = chunk
            .par_iter()
            .map(|line| match line {
                Line::Query(text) => answer(index, text, timing),
                Line::Refused(why) => (json!({ "error": why }).to_string(), true),
            })
            .collect();
        for (a, failed) in answers {
            queries += 1;
            errors += u64::from(failed);
            writeln!(output, "{a}")?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{Content, InputDoc};
    use crate::index::build::{build, BuildOptions};
    use crate::index::{Index, OpenOptions, TokenWidth};

    #[test]
    fn lines_are_bounded_and_bad_ones_answered_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("idx");
        let doc = InputDoc {
            content: Content::Tokens(vec![5, 6, 5]),
            metadata: None,
            input_bytes: 0,
        };
        build(
            std::iter::once(Ok(doc)),
            &BuildOptions::new(out.clone(), TokenWidth::U16, 0, 100),
        )
        .unwrap();
        let index = Index::open(&out, &OpenOptions::default()).unwrap();
        let query = r#"{"op":"count","ids":[5]}"#;
        let max = query.len() + 2;
        let mut input = Vec::new();
        input.extend_from_slice(format!("{query} \r\n").as_bytes()); // exactly max, with the \r
        input.extend_from_slice(format!("{query}   \n").as_bytes()); // one byte over
        input.extend_from_slice(&[b'x'; 5000]);
        input.extend_from_slice(b"\n\xc3\n \n\n");
        input.extend_from_slice(query.as_bytes()); // no newline at the end
        let mut output = Vec::new();
        let (queries, errors) =
            run_batch_limited(&index, &input[..], &mut output, false, max).unwrap();
        let answers: Vec<Value> = String::from_utf8(output)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!((queries, errors), (5, 3));
        assert_eq!(answers[0]["count"], 2);
        let over = format!("line of {} bytes exceeds the limit of {max}", max + 1);
        assert_eq!(answers[1]["error"], over.as_str());
        assert_eq!(
            answers[2]["error"],
            format!("line of 5000 bytes exceeds the limit of {max}").as_str()
        );
        assert!(answers[3]["error"].as_str().unwrap().contains("UTF-8"));
        assert_eq!(answers[4]["count"], 2);
    }
}
