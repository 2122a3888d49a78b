//! `eval spec`: continue test documents from a prompt with greedy decoding, without drafts and with
//! each draft source, and report acceptance, drafter cost and end-to-end speed-up per domain, with
//! SuffixDecoding's simulator metrics (`avg_accept_toks`, `accept_rate`, `spec_ms_per_tok`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::documents::EvalDocument;
use super::Result;
use crate::decoding::spec::{decode, SpecOptions, SpecRun};
use crate::decoding::Extras;
use crate::draft::{DraftOptions, DraftSource};
use crate::evidence::EvidenceSource;
use crate::model::Model;

#[derive(Debug, Clone, Copy)]
pub struct SpecEvalOptions {
    pub prompts_per_domain: usize,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub draft: DraftOptions,
}

/// One domain (or all) under one draft source ("none" is plain greedy decoding).
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpecRow {
    pub domain: String,
    pub source: String,
    pub prompts: usize,
    pub tokens: usize,
    pub steps: usize,
    pub drafted: usize,
    pub accepted: usize,
    pub decode_seconds: f64,
    pub draft_seconds: f64,
    pub tokens_per_second: f64,
    /// Plain greedy decoding's time over this source's, on the same prompts.
    pub speedup: f64,
    /// Accepted draft tokens per target pass.
    pub avg_accept_toks: f64,
    /// Accepted over drafted tokens.
    pub accept_rate: f64,
    /// Drafter milliseconds per generated token.
    pub spec_ms_per_tok: f64,
    pub draft_us_per_drafted_token: f64,
    /// Prompts whose output differs from plain greedy decoding's (must be 0).
    pub mismatches: usize,
}

impl SpecRow {
    fn add(&mut self, run: &SpecRun, baseline: &[u32]) {
        self.prompts += 1;
        self.tokens += run.tokens.len();
        self.steps += run.steps;
        self.drafted += run.drafted;
        self.accepted += run.accepted;
        self.decode_seconds += run.seconds;
        self.draft_seconds += run.draft_seconds;
        self.mismatches += usize::from(run.tokens != baseline);
    }

    fn finish(&mut self, baseline_seconds: f64) {
        self.tokens_per_second = self.tokens as f64 / self.decode_seconds;
        self.speedup = baseline_seconds / self.decode_seconds;
        self.avg_accept_toks = self.accepted as f64 / self.steps.max(1) as f64;
        self.accept_rate = self.accepted as f64 / self.drafted.max(1) as f64;
        self.spec_ms_per_tok = self.draft_seconds * 1e3 / self.tokens.max(1) as f64;
        self.draft_us_per_drafted_token = self.draft_seconds * 1e6 / self.drafted.max(1) as f64;
    }
}

const SOURCES: [(&str, Option<DraftSource>); 4] = [
    ("none", None),
    ("index", Some(DraftSource::Index)),
    ("prompt", Some(DraftSource::Prompt)),
    ("both", Some(DraftSource::All)),
];

/// The first `prompts_per_domain` documents of each domain long enough for prompt and continuation.
fn prompts(docs: &[EvalDocument], opts: &SpecEvalOptions) -> BTreeMap<String, Vec<Vec<u32>>> {
    let mut by_domain: BTreeMap<String, Vec<Vec<u32>>> = BTreeMap::new();
    for d in docs {
        let list = by_domain.entry(d.domain.clone()).or_default();
        if list.len() < opts.prompts_per_domain
            && d.tokens.len() >= opts.prompt_tokens + opts.new_tokens
        {
            list.push(d.tokens[..opts.prompt_tokens].to_vec());
        }
    }
    by_domain.retain(|_, v| !v.is_empty());
    by_domain
}

/// Rows per domain and source, then the totals over all domains.
pub fn run(
    model: &Model,
    evidence: &Arc<dyn EvidenceSource>,
    docs: &[EvalDocument],
    opts: &SpecEvalOptions,
) -> Result<Vec<SpecRow>> {
    let mut rows = Vec::new();
    let mut all: Vec<SpecRow> = SOURCES
        .iter()
        .map(|(name, _)| SpecRow {
            domain: "all".into(),
            source: name.to_string(),
            ..SpecRow::default()
        })
        .collect();
    let prompts = prompts(docs, opts);
    let bar = crate::progress::token_bar(
        (prompts.values().map(Vec::len).sum::<usize>() * SOURCES.len() * opts.new_tokens) as u64,
        "decoding",
    );
    for (domain, list) in &prompts {
        let mut domain_rows: Vec<SpecRow> = SOURCES
            .iter()
            .map(|(name, _)| SpecRow {
                domain: domain.clone(),
                source: name.to_string(),
                ..SpecRow::default()
            })
            .collect();
        for prompt in list {
            let mut baseline = Vec::new();
            for (row, (i, (_, source))) in domain_rows.iter_mut().zip(SOURCES.iter().enumerate()) {
                let spec = SpecOptions {
                    max_new_tokens: opts.new_tokens,
                    draft: source.map(|source| DraftOptions {
                        source,
                        ..opts.draft
                    }),
                    temperature: None,
                    seed: 0,
                    stop_token: None,
                };
                let run = decode(
                    model.transformer(),
                    evidence,
                    prompt,
                    &spec,
                    Extras::default(),
                )?;
                if i == 0 {
                    baseline = run.tokens.clone();
                }
                row.add(&run, &baseline);
                all[i].add(&run, &baseline);
                bar.inc(opts.new_tokens as u64);
            }
        }
        let baseline_seconds = domain_rows[0].decode_seconds;
        for row in &mut domain_rows {
            row.finish(baseline_seconds);
        }
        rows.extend(domain_rows);
    }
    bar.finish_and_clear();
    let baseline_seconds = all[0].decode_seconds;
    for row in &mut all {
        row.finish(baseline_seconds);
    }
    rows.extend(all);
    Ok(rows)
}

pub fn markdown(rows: &[SpecRow]) -> String {
    let mut out = String::from(
        "| domain | source | tokens | tok/s | speed-up | avg_accept_toks | accept_rate | spec_ms_per_tok | µs/drafted token | mismatches |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.2}× | {:.2} | {:.1}% | {:.3} | {:.1} | {} |\n",
            r.domain,
            r.source,
            r.tokens,
            r.tokens_per_second,
            r.speedup,
            r.avg_accept_toks,
            100.0 * r.accept_rate,
            r.spec_ms_per_tok,
            r.draft_us_per_drafted_token,
            r.mismatches
        ));
    }
    out
}
