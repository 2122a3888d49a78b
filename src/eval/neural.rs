//! Perplexity of the neural model alone over evaluation documents, with the window protocol: what
//! `infini-sidecar model score` reports.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use super::documents::EvalDocument;
use super::Result;
use crate::evidence::bits_per_byte;
use crate::model::{DocumentScore, Model, WindowOptions};
use crate::progress::token_bar;

#[derive(Debug, Clone, Serialize)]
pub struct DocumentReport {
    pub index: usize,
    pub domain: String,
    pub path: String,
    pub tokens_scored: usize,
    /// UTF-8 bytes of the scored tokens' text.
    pub bytes_scored: usize,
    pub nll: f64,
    pub perplexity: f64,
    pub bits_per_byte: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub documents: usize,
    pub tokens_scored: usize,
    pub bytes_scored: usize,
    pub nll: f64,
    pub perplexity: f64,
    /// Total NLL in bits over the UTF-8 bytes of the scored text: comparable across tokenizers.
    pub bits_per_byte: f64,
}

impl Totals {
    fn add(&mut self, tokens: usize, bytes: usize, nll: f64) {
        self.documents += 1;
        self.tokens_scored += tokens;
        self.bytes_scored += bytes;
        self.nll += nll;
        self.perplexity = (self.nll / self.tokens_scored.max(1) as f64).exp();
        self.bits_per_byte = bits_per_byte(self.nll, self.bytes_scored);
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ScoreReport {
    pub model: String,
    pub window: usize,
    pub stride: usize,
    pub total: Totals,
    pub by_domain: BTreeMap<String, Totals>,
    pub documents: Vec<DocumentReport>,
    pub seconds: f64,
    pub tokens_per_second: f64,
}

/// Scores every document, showing a progress bar of tokens. The per-token scores come back too,
/// for callers that mix them with other estimates.
pub fn score_documents(
    model: &Model,
    docs: &[EvalDocument],
    opts: WindowOptions,
) -> Result<(ScoreReport, Vec<DocumentScore>)> {
    let total_tokens: usize = docs.iter().map(|d| d.tokens.len() - 1).sum();
    let bar = token_bar(total_tokens as u64, "neural");
    let started = Instant::now();
    let mut report = ScoreReport {
        model: model.source().display().to_string(),
        window: opts.window,
        stride: opts.stride,
        total: Totals::default(),
        by_domain: BTreeMap::new(),
        documents: Vec::with_capacity(docs.len()),
        seconds: 0.0,
        tokens_per_second: 0.0,
    };
    let mut scores = Vec::with_capacity(docs.len());
    for doc in docs {
        let score = model
            .transformer()
            .score_document(&doc.tokens, opts, |n| bar.inc(n as u64))?;
        let (n, nll) = (score.positions.len(), score.nll());
        // Tokens 1.. are scored (the first is the context of the first prediction).
        let bytes = model.tokenizer().text_bytes(&doc.tokens[1..]);
        report.total.add(n, bytes, nll);
        report
            .by_domain
            .entry(doc.domain.clone())
            .or_default()
            .add(n, bytes, nll);
        report.documents.push(DocumentReport {
            index: doc.index,
            domain: doc.domain.clone(),
            path: doc.path.clone(),
            tokens_scored: n,
            bytes_scored: bytes,
            nll,
            perplexity: score.perplexity(),
            bits_per_byte: bits_per_byte(nll, bytes),
        });
        scores.push(score);
    }
    bar.finish_and_clear();
    report.seconds = started.elapsed().as_secs_f64();
    report.tokens_per_second = report.total.tokens_scored as f64 / report.seconds.max(1e-9);
    Ok((report, scores))
}
