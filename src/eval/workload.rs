//! `eval workload`: replays a workload file (JSON lines of chat requests with a namespace and an
//! optional reference text) in order through the real decoding loop, once without drafts and once
//! per draft configuration, each configuration with a live index of its own that learns as it goes;
//! and reports per request and for the cold (first fifth) and warm (last fifth) parts: tokens/s,
//! speed-up over plain greedy decoding, acceptance by source, the drafter's µs per drafted token, and
//! the live index's size. Greedy outputs must equal plain decoding's (counted as mismatches).

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{EvalError, Result};
use crate::decoding::spec::{decode, Rows, SourceTally, SpecOptions, SpecRun, MAX_VERIFY_ROWS};
use crate::decoding::{Extras, Sequence};
use crate::draft::{DraftOptions, DraftSource};
use crate::evidence::{EvidenceIndex, EvidenceSource};
use crate::live::{LiveConfig, LiveIndex, Vocabulary};
use crate::model::Model;

/// One request of a workload file.
#[derive(Debug, Clone, Deserialize)]
pub struct WorkloadRequest {
    pub id: String,
    /// A chat; `prompt` is a single user message.
    #[serde(default)]
    pub messages: Vec<Message>,
    pub prompt: Option<String>,
    #[serde(default = "default_new_tokens")]
    pub max_new_tokens: usize,
    /// The live namespace (default "default").
    pub namespace: Option<String>,
    /// Text the answer is expected to resemble.
    pub reference: Option<String>,
}

fn default_new_tokens() -> usize {
    256
}

/// A chat message: its text, or (`answer_of`) the answer the model generated for an earlier request.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Option<String>,
    pub answer_of: Option<String>,
}

/// Reads a workload file, checking every line before anything runs.
pub fn read(path: &std::path::Path) -> Result<Vec<WorkloadRequest>> {
    let text = std::fs::read_to_string(path)
        .map_err(EvalError::io(format!("reading {}", path.display())))?;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = |m: String| EvalError::Invalid(format!("{}:{}: {m}", path.display(), i + 1));
        let r: WorkloadRequest = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        if r.messages.is_empty() == r.prompt.is_none() {
            return Err(bad("give either `messages` or `prompt`".into()));
        }
        for m in &r.messages {
            match (&m.content, &m.answer_of) {
                (Some(_), None) => {}
                (None, Some(earlier)) if seen.contains(earlier) => {}
                (None, Some(earlier)) => {
                    return Err(bad(format!("answer_of {earlier:?}: no earlier request")))
                }
                _ => return Err(bad("a message needs `content` or `answer_of`".into())),
            }
        }
        if r.max_new_tokens == 0 {
            return Err(bad("max_new_tokens must be at least 1".into()));
        }
        seen.insert(r.id.clone());
        out.push(r);
    }
    if out.is_empty() {
        return Err(EvalError::Invalid(format!(
            "{}: no requests",
            path.display()
        )));
    }
    Ok(out)
}

/// SmolLM2-Instruct's chat template (ChatML, with its default system message), ready for the
/// assistant's answer.
pub fn chatml(messages: &[(String, String)]) -> String {
    let mut out = String::new();
    if messages.first().is_none_or(|(role, _)| role != "system") {
        out.push_str(
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
        );
    }
    for (role, content) in messages {
        out.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

/// A draft configuration of the replay.
#[derive(Debug, Clone, Copy)]
pub struct Configuration {
    pub name: &'static str,
    pub source: DraftSource,
}

/// Every source; the live index alone (no prompt lookup); prompt lookup alone (what a server
/// without the sidecar's memory gets).
pub const CONFIGURATIONS: [Configuration; 3] = [
    Configuration {
        name: "all",
        source: DraftSource::All,
    },
    Configuration {
        name: "live",
        source: DraftSource::Live,
    },
    Configuration {
        name: "prompt",
        source: DraftSource::Prompt,
    },
];

#[derive(Debug, Clone, Serialize)]
pub struct RequestResult {
    pub id: String,
    pub prompt_tokens: usize,
    pub tokens: usize,
    pub plain_seconds: f64,
    /// Per configuration: decode seconds, speed-up, steps, drafted and accepted tokens.
    pub configurations: Vec<RequestRun>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RequestRun {
    pub name: String,
    pub seconds: f64,
    pub speedup: f64,
    pub steps: usize,
    pub drafted: usize,
    pub accepted: usize,
    pub draft_seconds: f64,
    pub matches_plain: bool,
    pub by_source: std::collections::BTreeMap<&'static str, SourceTally>,
}

/// One configuration over a part of the workload (all, cold or warm).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PartSummary {
    pub configuration: String,
    pub part: String,
    pub requests: usize,
    pub tokens: usize,
    pub plain_tokens_per_second: f64,
    pub tokens_per_second: f64,
    pub speedup: f64,
    /// Accepted draft tokens per target pass.
    pub accepted_per_step: f64,
    pub draft_us_per_drafted_token: f64,
    pub by_source: std::collections::BTreeMap<&'static str, SourceTally>,
    pub mismatches: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct WorkloadReport {
    /// The CPU every figure was measured on (`CpuInfo::summary`), set by the caller.
    pub cpu: String,
    pub requests: Vec<RequestResult>,
    pub summary: Vec<PartSummary>,
    /// Tokens in each configuration's live index at the end.
    pub live_tokens: Vec<(String, u64)>,
    pub peak_rss_bytes: u64,
    /// Each request's prompt and plain greedy output, for replays through other drafters.
    pub replay: Vec<(Vec<u32>, Vec<u32>)>,
    /// Each request's reference tokens (empty for none).
    #[serde(skip)]
    pub references: Vec<Vec<u32>>,
    /// The cost-model replays: ours, and SuffixDecoding's when it was run.
    pub simulated: Vec<Simulated>,
    /// The draft settings of the real decoding and of our replays.
    pub draft: DraftOptions,
    /// The cost model's price of a drafted row, as a share of a decoding step (set by the caller
    /// with the replays).
    pub row_cost: f64,
}

/// The replay's drafts, real and simulated: the defaults, as long as a verification pass allows.
pub fn draft_options() -> DraftOptions {
    DraftOptions {
        max_tokens: MAX_VERIFY_ROWS - 1,
        ..DraftOptions::default()
    }
}

/// Replays `requests` in order: plain greedy first, then each configuration.
pub fn run(
    model: &Model,
    index: Arc<dyn EvidenceIndex>,
    requests: &[WorkloadRequest],
    draft: &DraftOptions,
) -> Result<WorkloadReport> {
    let tokenizer = model.tokenizer();
    let stop = tokenizer
        .encode("<|im_end|>")
        .ok()
        .filter(|ids| ids.len() == 1)
        .map(|ids| ids[0]);
    let vocab = Vocabulary::of(&*index);
    let evidence: Arc<dyn EvidenceSource> = index;
    let lives = CONFIGURATIONS
        .iter()
        .map(|_| LiveIndex::open(LiveConfig::default(), vocab).map(Arc::new))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| EvalError::Invalid(format!("live index: {e}")))?;
    let bar = crate::progress::token_bar(
        requests
            .iter()
            .map(|r| r.max_new_tokens as u64)
            .sum::<u64>()
            * (1 + CONFIGURATIONS.len() as u64),
        "replay",
    );
    let mut answers: HashMap<String, String> = HashMap::new();
    let mut results = Vec::new();
    let mut replay = Vec::new();
    let references = references_of(model, requests)?;
    for (r, reference) in requests.iter().zip(&references) {
        let prompt = prompt_of(r, &answers);
        let prompt = tokenizer.encode(&chatml(&prompt)).map_err(tokenizing)?;
        let spec = |draft: Option<DraftOptions>| SpecOptions {
            max_new_tokens: r.max_new_tokens,
            draft,
            temperature: None,
            seed: 0,
            stop_token: stop,
        };
        let plain = decode(
            model.transformer(),
            &evidence,
            &prompt,
            &spec(None),
            Extras::default(),
        )?;
        bar.inc(r.max_new_tokens as u64);
        let mut runs = Vec::new();
        for (config, live) in CONFIGURATIONS.iter().zip(&lives) {
            let extras = Extras {
                live: Some(live.clone()),
                namespace: r.namespace.clone().unwrap_or_else(|| "default".into()),
                learn: true,
                reference: reference.clone(),
            };
            let opts = spec(Some(DraftOptions {
                source: config.source,
                ..*draft
            }));
            let run = decode(model.transformer(), &evidence, &prompt, &opts, extras)?;
            bar.inc(r.max_new_tokens as u64);
            runs.push(request_run(config.name, &run, &plain));
        }
        let text = tokenizer
            .decode(strip_stop(&plain.tokens, stop))
            .map_err(tokenizing)?;
        answers.insert(r.id.clone(), text);
        results.push(RequestResult {
            id: r.id.clone(),
            prompt_tokens: prompt.len(),
            tokens: plain.tokens.len(),
            plain_seconds: plain.seconds,
            configurations: runs,
        });
        replay.push((prompt, plain.tokens));
    }
    bar.finish_and_clear();
    Ok(WorkloadReport {
        summary: summarize(&results),
        live_tokens: CONFIGURATIONS
            .iter()
            .zip(&lives)
            .map(|(c, l)| (c.name.to_string(), l.stats().tokens))
            .collect(),
        requests: results,
        peak_rss_bytes: crate::progress::peak_rss_bytes(),
        replay,
        references,
        draft: *draft,
        ..WorkloadReport::default()
    })
}

/// Each request's reference text in the model's tokens (empty for none).
pub fn references_of(model: &Model, requests: &[WorkloadRequest]) -> Result<Vec<Vec<u32>>> {
    requests
        .iter()
        .map(|r| match &r.reference {
            Some(text) => model.tokenizer().encode(text).map_err(tokenizing),
            None => Ok(Vec::new()),
        })
        .collect()
}

/// The prompts and outputs an earlier run of `requests` recorded (its replay.json), for replaying
/// them through the drafters without decoding again.
pub fn read_replay(
    path: &std::path::Path,
    requests: &[WorkloadRequest],
) -> Result<Vec<(Vec<u32>, Vec<u32>)>> {
    let text = std::fs::read_to_string(path)
        .map_err(EvalError::io(format!("reading {}", path.display())))?;
    let replay: Vec<(Vec<u32>, Vec<u32>)> = serde_json::from_str(&text)
        .map_err(|e| EvalError::Invalid(format!("{}: {e}", path.display())))?;
    if replay.len() != requests.len() {
        return Err(EvalError::Invalid(format!(
            "{} holds {} requests, the workload {}: it was recorded from another workload",
            path.display(),
            replay.len(),
            requests.len()
        )));
    }
    Ok(replay)
}

fn tokenizing(e: impl std::fmt::Display) -> EvalError {
    EvalError::Invalid(format!("workload text: {e}"))
}

fn strip_stop(tokens: &[u32], stop: Option<u32>) -> &[u32] {
    match tokens.split_last() {
        Some((last, rest)) if Some(*last) == stop => rest,
        _ => tokens,
    }
}

/// The request's chat, with earlier answers filled in.
fn prompt_of(r: &WorkloadRequest, answers: &HashMap<String, String>) -> Vec<(String, String)> {
    if let Some(p) = &r.prompt {
        return vec![("user".into(), p.clone())];
    }
    r.messages
        .iter()
        .map(|m| {
            let text = match (&m.content, &m.answer_of) {
                (Some(c), _) => c.clone(),
                (None, Some(id)) => answers.get(id).cloned().unwrap_or_default(),
                (None, None) => String::new(),
            };
            (m.role.clone(), text)
        })
        .collect()
}

fn request_run(name: &str, run: &SpecRun, plain: &SpecRun) -> RequestRun {
    RequestRun {
        name: name.to_string(),
        seconds: run.seconds,
        speedup: plain.seconds / run.seconds,
        steps: run.steps,
        drafted: run.drafted,
        accepted: run.accepted,
        draft_seconds: run.draft_seconds,
        matches_plain: run.tokens == plain.tokens,
        by_source: run.by_source.clone(),
    }
}

/// Every configuration over the whole workload, its first fifth (cold) and its last (warm).
fn summarize(results: &[RequestResult]) -> Vec<PartSummary> {
    let n = results.len();
    let fifth = n.div_ceil(5);
    let parts = [
        ("all", results),
        ("cold", &results[..fifth]),
        ("warm", &results[n - fifth..]),
    ];
    let mut out = Vec::new();
    for (c, config) in CONFIGURATIONS.iter().enumerate() {
        for (part, rows) in parts {
            let mut s = PartSummary {
                configuration: config.name.to_string(),
                part: part.to_string(),
                requests: rows.len(),
                ..PartSummary::default()
            };
            let (mut plain_s, mut spec_s, mut steps, mut accepted, mut drafted, mut draft_s) =
                (0.0, 0.0, 0, 0, 0, 0.0);
            for row in rows {
                let run = &row.configurations[c];
                s.tokens += row.tokens;
                plain_s += row.plain_seconds;
                spec_s += run.seconds;
                steps += run.steps;
                accepted += run.accepted;
                drafted += run.drafted;
                draft_s += run.draft_seconds;
                s.mismatches += usize::from(!run.matches_plain);
                for (source, t) in &run.by_source {
                    let sum = s.by_source.entry(source).or_default();
                    sum.drafts += t.drafts;
                    sum.drafted += t.drafted;
                    sum.accepted += t.accepted;
                }
            }
            s.plain_tokens_per_second = s.tokens as f64 / plain_s;
            s.tokens_per_second = s.tokens as f64 / spec_s;
            s.speedup = plain_s / spec_s;
            s.accepted_per_step = accepted as f64 / steps.max(1) as f64;
            s.draft_us_per_drafted_token = draft_s * 1e6 / drafted.max(1) as f64;
            out.push(s);
        }
    }
    out
}

/// The cost model of the simulated replays (ours and SuffixDecoding's, eval/suffix_decoding_replay.py):
/// a verification step costs one decoding step plus a price per drafted row, and emits the accepted
/// tokens plus one. By default the price is this, about what our short passes cost a row on a CPU
/// (eval/MODEL.md); `eval workload --row-cost` takes the one measured on the machine at hand (`cargo
/// bench --bench model`: the k-row pass's time over the one-row pass's, less one, over k − 1).
pub const DEFAULT_ROW_COST: f64 = 0.2;

/// A configuration's simulated replay: each request's plain greedy output drafted for step by step
/// with the cost model above, no model run; a live index of its own learns as it goes, compacting
/// in the replaying thread between steps, so a replay drafts the same every time.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Simulated {
    pub configuration: String,
    pub part: String,
    pub tokens: usize,
    pub speedup: f64,
    pub accepted_per_step: f64,
    /// The draft calls alone (ours: `Sequence::draft`; SuffixDecoding: `speculate`) per drafted
    /// token.
    pub draft_calls_us_per_drafted_token: f64,
    /// All the drafter's work per drafted token: taking in the prompt, drafting, appending and
    /// letting the sequence go (SuffixDecoding: `start_request`, `speculate`,
    /// `add_active_response`, `stop_request`). A server's compaction of the live index runs in
    /// the background and is not counted.
    pub all_work_us_per_drafted_token: f64,
}

/// One request's simulated replay.
struct ReplayCost {
    tokens: usize,
    cost: f64,
    steps: usize,
    accepted: usize,
    drafted: usize,
    /// The drafter's own time (taking in the prompt, drafting and appending).
    seconds: f64,
    /// The draft calls' part of it.
    drafting_seconds: f64,
}

pub fn simulate(
    index: Arc<dyn EvidenceIndex>,
    requests: &[WorkloadRequest],
    replay: &[(Vec<u32>, Vec<u32>)],
    references: &[Vec<u32>],
    draft: &DraftOptions,
    row_cost: f64,
) -> Result<Vec<Simulated>> {
    let vocab = Vocabulary::of(&*index);
    let mut out = Vec::new();
    for config in CONFIGURATIONS {
        // Compaction in this thread after every step, at the same points every time: the replay
        // is deterministic.
        let inline = LiveConfig {
            background: false,
            ..LiveConfig::default()
        };
        let live = LiveIndex::open(inline, vocab)
            .map(Arc::new)
            .map_err(|e| EvalError::Invalid(format!("live index: {e}")))?;
        let opts = DraftOptions {
            source: config.source,
            ..*draft
        };
        let mut costs: Vec<ReplayCost> = Vec::new();
        for ((r, (prompt, truth)), reference) in requests.iter().zip(replay).zip(references) {
            let extras = Extras {
                live: Some(live.clone()),
                namespace: r.namespace.clone().unwrap_or_else(|| "default".into()),
                learn: true,
                reference: reference.clone(),
            };
            // The drafter's time counts taking in the prompt, as the real loop's does.
            let prompt = prompt.clone();
            let started = std::time::Instant::now();
            let mut seq = Sequence::new(index.clone(), prompt)?
                .with_extras(extras)
                .map_err(|e| EvalError::Invalid(format!("live index: {e}")))?;
            let mut seconds = started.elapsed().as_secs_f64();
            // Compaction is a server's background work: outside the drafter's time.
            live.compact();
            let (mut done, mut cost, mut steps, mut accepted, mut drafted) =
                (0usize, 0.0, 0usize, 0usize, 0usize);
            let mut drafting_seconds = 0.0;
            while done < truth.len() {
                let room = (truth.len() - done - 1).min(MAX_VERIFY_ROWS - 1);
                let started = std::time::Instant::now();
                let rows = Rows::of(&seq.draft(&opts)?, room, opts.tree);
                let drafting = started.elapsed().as_secs_f64();
                drafting_seconds += drafting;
                seconds += drafting;
                let agree = rows.accepted(|_, depth| truth[done + depth]).0.len();
                let emit = (agree + 1).min(truth.len() - done);
                let started = std::time::Instant::now();
                seq.append(&truth[done..done + emit])?;
                seconds += started.elapsed().as_secs_f64();
                live.compact();
                cost += 1.0 + row_cost * rows.len() as f64;
                steps += 1;
                accepted += agree;
                drafted += rows.len();
                done += emit;
            }
            let started = std::time::Instant::now();
            drop(seq);
            seconds += started.elapsed().as_secs_f64();
            costs.push(ReplayCost {
                tokens: truth.len(),
                cost,
                steps,
                accepted,
                drafted,
                seconds,
                drafting_seconds,
            });
        }
        let n = costs.len();
        let fifth = n.div_ceil(5);
        for (part, sel) in [
            ("all", &costs[..]),
            ("cold", &costs[..fifth]),
            ("warm", &costs[n - fifth..]),
        ] {
            let sum = |f: fn(&ReplayCost) -> f64| -> f64 { sel.iter().map(f).sum() };
            let tokens = sum(|r| r.tokens as f64);
            let drafted = sum(|r| r.drafted as f64).max(1.0);
            out.push(Simulated {
                configuration: format!("ours: {}", config.name),
                part: part.to_string(),
                tokens: tokens as usize,
                speedup: tokens / sum(|r| r.cost),
                accepted_per_step: sum(|r| r.accepted as f64) / sum(|r| r.steps as f64).max(1.0),
                all_work_us_per_drafted_token: sum(|r| r.seconds) * 1e6 / drafted,
                draft_calls_us_per_drafted_token: sum(|r| r.drafting_seconds) * 1e6 / drafted,
            });
        }
    }
    Ok(out)
}

/// The summary as a Markdown table.
pub fn markdown(report: &WorkloadReport) -> String {
    let mut md = format!("CPU: {}\n\n", report.cpu);
    if !report.summary.is_empty() {
        md.push_str("| configuration | part | requests | tokens | plain tok/s | tok/s | speed-up | accepted/step | drafter µs/drafted token | accepted/drafted by source | mismatches |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    }
    for s in &report.summary {
        let sources: Vec<String> = s
            .by_source
            .iter()
            .map(|(k, t)| format!("{k} {}/{}", t.accepted, t.drafted))
            .collect();
        md.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.2}× | {:.2} | {:.1} | {} | {} |\n",
            s.configuration,
            s.part,
            s.requests,
            s.tokens,
            s.plain_tokens_per_second,
            s.tokens_per_second,
            s.speedup,
            s.accepted_per_step,
            s.draft_us_per_drafted_token,
            sources.join(", "),
            s.mismatches
        ));
    }
    if !report.simulated.is_empty() {
        md.push_str(&format!(
            "{}Simulated replays of the same outputs (a step costs 1 + {} × rows drafted and emits the accepted tokens + 1). µs per drafted token, of the draft calls alone and of all the drafter's work (taking in the prompt, drafting, appending):\n\n| drafter | part | tokens | speed-up | accepted/step | µs/drafted token: drafts | µs/drafted token: all work |\n|---|---|---|---|---|---|---|\n",
            if report.summary.is_empty() { "" } else { "\n" },
            report.row_cost
        ));
        for s in &report.simulated {
            md.push_str(&format!(
                "| {} | {} | {} | {:.2}× | {:.2} | {:.2} | {:.2} |\n",
                s.configuration,
                s.part,
                s.tokens,
                s.speedup,
                s.accepted_per_step,
                s.draft_calls_us_per_drafted_token,
                s.all_work_us_per_drafted_token
            ));
        }
    }
    for (name, tokens) in &report.live_tokens {
        md.push_str(&format!("\nlive index of `{name}`: {tokens} tokens"));
    }
    if report.peak_rss_bytes > 0 {
        md.push_str(&format!(
            "\npeak RSS: {:.0} MB\n",
            report.peak_rss_bytes as f64 / 1e6
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_adds_the_default_system_message_and_opens_the_answer() {
        let text = chatml(&[("user".into(), "Hi".into())]);
        assert_eq!(
            text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn a_workload_that_quotes_a_later_answer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.jsonl");
        std::fs::write(
            &path,
            r#"{"id": "a", "messages": [{"role": "assistant", "answer_of": "b"}]}
{"id": "b", "prompt": "x"}"#,
        )
        .unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("answer_of \"b\""), "{e}");
    }
}
