//! `eval generate`: sampling with mixing. The founding blog post found that an interpolated model
//! "goes off the rail into regurgitating from the training data" when it generates, since sparse
//! ∞-gram estimates are over-confident. This samples continuations of test prompts from the model
//! alone and with each rule, the same seed per prompt for every rule, and measures what mixing does
//! to the text: the share of generated tokens inside verbatim spans of the reference data, distinct
//! n-grams, and the model's own perplexity of what was generated.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use candle_core::{Device, Tensor};
use candle_transformers::generation::LogitsProcessor;
use serde::Serialize;

use super::documents::EvalDocument;
use super::{EvalError, Result};
use crate::decoding::{MixRule, Sequence};
use crate::evidence::EvidenceIndex;
use crate::index::corpus::Corpus;
use crate::mix::distribution::mix_full;
use crate::mix::{LambdaRule, MixingParams, NeuralDistribution};
use crate::model::{Model, ModelError};
use crate::progress::token_bar;

/// How prompts are drawn and continued.
#[derive(Debug, Clone)]
pub struct GenerationEvalOptions {
    pub prompts_per_domain: usize,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub temperature: f64,
    pub top_p: f64,
    pub seed: u64,
    /// A generated token counts as copied when it lies in a span of at least this many tokens that
    /// occurs in the reference data.
    pub verbatim_span: usize,
}

impl Default for GenerationEvalOptions {
    fn default() -> Self {
        Self {
            prompts_per_domain: 64,
            prompt_tokens: 64,
            new_tokens: 48,
            temperature: 1.0,
            top_p: 0.9,
            seed: 7,
            verbatim_span: 16,
        }
    }
}

/// What is sampled from: the model alone, or a mixture under a rule of the mixing file, with or
/// without the copy guard (`max_match`, see [`crate::evidence::guard_copying`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampler {
    Neural,
    Mixed {
        rule: LambdaRule,
        max_match: Option<usize>,
    },
}

impl Sampler {
    /// `neural`, the rule's name, and `@N` for a guard at N tokens.
    pub fn name(self) -> String {
        match self {
            Self::Neural => "neural".into(),
            Self::Mixed {
                rule,
                max_match: None,
            } => rule.name().into(),
            Self::Mixed {
                rule,
                max_match: Some(n),
            } => format!("{}@{n}", rule.name()),
        }
    }
}

/// One domain's generations under one sampler.
#[derive(Debug, Clone, Serialize)]
pub struct GenerationRow {
    pub domain: String,
    pub sampler: String,
    pub prompts: usize,
    pub tokens: usize,
    /// Share of generated tokens inside a verbatim span of the reference data.
    pub verbatim_share: f64,
    /// Distinct n-grams over all n-grams of the domain's generations, n = 1, 2, 3.
    pub distinct: [f64; 3],
    /// The model's own perplexity of the generated tokens.
    pub model_perplexity: f64,
    /// Mean λ over the generated tokens (0 for the model alone).
    pub mean_lambda: f64,
}

/// A prompt: a document's tokens from some offset.
struct Prompt<'a> {
    domain: &'a str,
    tokens: &'a [u32],
}

/// Up to `per_domain` prompts per domain, taken from the documents in order at offsets a
/// continuation apart, so prompts of one document do not overlap.
fn prompts<'a>(docs: &'a [EvalDocument], opts: &GenerationEvalOptions) -> Vec<Prompt<'a>> {
    let step = opts.prompt_tokens + opts.new_tokens;
    let mut taken: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for d in docs {
        let mut start = 0;
        while start + opts.prompt_tokens <= d.tokens.len() {
            let n = taken.entry(&d.domain).or_default();
            if *n >= opts.prompts_per_domain {
                break;
            }
            *n += 1;
            out.push(Prompt {
                domain: &d.domain,
                tokens: &d.tokens[start..start + opts.prompt_tokens],
            });
            start += step;
        }
    }
    out
}

/// One sampled continuation.
struct Sample {
    tokens: Vec<u32>,
    /// The model's log-prob of each generated token.
    neural_logprobs: Vec<f64>,
    lambdas: Vec<f64>,
}

fn sample(
    model: &Model,
    index: &Arc<dyn EvidenceIndex>,
    params: &MixingParams,
    prompt: &[u32],
    sampler: Sampler,
    opts: &GenerationEvalOptions,
    seed: u64,
) -> Result<Sample> {
    let transformer = model.transformer();
    let vocab = Corpus::vocab_size(&**index) as usize;
    let mut processor = LogitsProcessor::new(seed, Some(opts.temperature), Some(opts.top_p));
    // The model alone never reads the index.
    let seq = match sampler {
        Sampler::Neural => Sequence::model_only(prompt.to_vec()),
        Sampler::Mixed { .. } => Sequence::new(index.clone(), prompt.to_vec())?,
    };
    let mut seq = seq.with_model(transformer, None);
    let candle = |e: candle_core::Error| EvalError::from(ModelError::from(e));
    // A token drawn from `probs`, and the model's own log-prob of it.
    let mut pick = |probs: &[f64], neural: &NeuralDistribution| -> Result<(u32, f64)> {
        let log_probs: Vec<f32> = probs.iter().map(|&p| p.ln() as f32).collect();
        let token = Tensor::new(log_probs, &Device::Cpu)
            .and_then(|t| processor.sample(&t))
            .map_err(candle)?;
        Ok((token, neural.prob(token).ln()))
    };
    let mut out = Sample {
        tokens: Vec::with_capacity(opts.new_tokens),
        neural_logprobs: Vec::with_capacity(opts.new_tokens),
        lambdas: Vec::with_capacity(opts.new_tokens),
    };
    for _ in 0..opts.new_tokens {
        if crate::interrupt::interrupted() {
            return Err(ModelError::Interrupted.into());
        }
        let mut logits = seq.logits(transformer)?;
        logits.resize(vocab, f32::MIN);
        let neural = NeuralDistribution::from_logits(&logits)?;
        let ((token, neural_logprob), lambda) = match sampler {
            Sampler::Neural => {
                let probs: Vec<f64> = (0..vocab as u32).map(|t| neural.prob(t)).collect();
                (pick(&probs, &neural)?, 0.0)
            }
            Sampler::Mixed { rule, max_match } => {
                let how = MixRule {
                    rule,
                    params: Some(params),
                    max_match,
                };
                // Drawn inside the step, which then keeps the model's distribution for the
                // adaptive λ.
                let step = seq.mix(how, neural, |sparse, neural, lambda| {
                    pick(&mix_full(sparse, neural, lambda), neural)
                })?;
                (step.output?, step.lambda.lambda)
            }
        };
        out.neural_logprobs.push(neural_logprob);
        out.lambdas.push(lambda);
        out.tokens.push(token);
        seq.append(&[token])?;
    }
    Ok(out)
}

/// Which tokens of `seq[from..]` lie inside a span of at least `span` tokens of `seq` that occurs in
/// the index. The longest occurring span ending at each position grows by at most one per position,
/// so the spans are found with O(len) counts.
pub fn verbatim_mask(
    index: &dyn EvidenceIndex,
    seq: &[u32],
    from: usize,
    span: usize,
) -> Result<Vec<bool>> {
    let mut longest = Vec::with_capacity(seq.len());
    let mut m = 0usize;
    for end in 0..seq.len() {
        m = (m + 1).min(end + 1);
        while m > 0 && index.count(&seq[end + 1 - m..=end])? == 0 {
            m -= 1;
        }
        longest.push(m);
    }
    let mut covered = vec![false; seq.len() - from.min(seq.len())];
    let mut earliest_start = usize::MAX;
    for end in (from..seq.len()).rev() {
        if longest[end] >= span {
            earliest_start = earliest_start.min(end + 1 - longest[end]);
        }
        // A span ending later covers `end` when it starts at or before it.
        covered[end - from] = earliest_start <= end;
    }
    Ok(covered)
}

/// Distinct n-grams over all n-grams of `texts`, for n = 1, 2, 3.
pub fn distinct_n(texts: &[&[u32]]) -> [f64; 3] {
    let mut out = [0.0; 3];
    for (n, slot) in (1..=3).zip(out.iter_mut()) {
        let mut seen: HashSet<&[u32]> = HashSet::new();
        let mut total = 0usize;
        for t in texts {
            for w in t.windows(n) {
                seen.insert(w);
                total += 1;
            }
        }
        *slot = if total == 0 {
            0.0
        } else {
            seen.len() as f64 / total as f64
        };
    }
    out
}

/// Samples every prompt under every sampler and measures the generations per domain and sampler.
pub fn run(
    model: &Model,
    index: Arc<dyn EvidenceIndex>,
    params: &MixingParams,
    docs: &[EvalDocument],
    samplers: &[Sampler],
    opts: &GenerationEvalOptions,
) -> Result<Vec<GenerationRow>> {
    let prompts = prompts(docs, opts);
    let bar = token_bar(
        (prompts.len() * samplers.len() * opts.new_tokens) as u64,
        "generate",
    );
    let mut rows = Vec::new();
    for &sampler in samplers {
        let mut by_domain: BTreeMap<&str, Vec<(Sample, Vec<bool>)>> = BTreeMap::new();
        for (i, p) in prompts.iter().enumerate() {
            let s = sample(
                model,
                &index,
                params,
                p.tokens,
                sampler,
                opts,
                opts.seed + i as u64,
            )?;
            let whole: Vec<u32> = p.tokens.iter().chain(&s.tokens).copied().collect();
            let mask = verbatim_mask(&*index, &whole, p.tokens.len(), opts.verbatim_span)?;
            by_domain.entry(p.domain).or_default().push((s, mask));
            bar.inc(opts.new_tokens as u64);
        }
        for (domain, samples) in by_domain {
            let tokens: usize = samples.iter().map(|(s, _)| s.tokens.len()).sum();
            let copied: usize = samples
                .iter()
                .map(|(_, m)| m.iter().filter(|&&c| c).count())
                .sum();
            let nll: f64 = samples
                .iter()
                .flat_map(|(s, _)| &s.neural_logprobs)
                .map(|l| -l)
                .sum();
            let lambda: f64 = samples.iter().flat_map(|(s, _)| &s.lambdas).sum();
            let texts: Vec<&[u32]> = samples.iter().map(|(s, _)| s.tokens.as_slice()).collect();
            rows.push(GenerationRow {
                domain: domain.to_string(),
                sampler: sampler.name(),
                prompts: samples.len(),
                tokens,
                verbatim_share: copied as f64 / tokens.max(1) as f64,
                distinct: distinct_n(&texts),
                model_perplexity: (nll / tokens.max(1) as f64).exp(),
                mean_lambda: lambda / tokens.max(1) as f64,
            });
        }
    }
    bar.finish_and_clear();
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn markdown(rows: &[GenerationRow]) -> String {
    let mut out = String::from(
        "| domain | sampler | prompts | tokens | verbatim ≥ span | distinct-1 | distinct-2 | distinct-3 | model PPL | mean λ |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out += &format!(
            "| {} | {} | {} | {} | {:.2}% | {:.3} | {:.3} | {:.3} | {:.2} | {:.3} |\n",
            r.domain,
            r.sampler,
            r.prompts,
            r.tokens,
            r.verbatim_share * 100.0,
            r.distinct[0],
            r.distinct[1],
            r.distinct[2],
            r.model_perplexity,
            r.mean_lambda
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{Content, InputDoc};
    use crate::index::build::{build, BuildOptions};
    use crate::index::{Index, OpenOptions, TokenWidth};

    /// The mask against brute force: every span of the sequence that occurs in the corpus (by a
    /// plain substring search of the documents), marking what it covers after `from`.
    #[test]
    fn verbatim_mask_against_brute_force() {
        let docs: Vec<Vec<u32>> = vec![
            vec![1, 2, 3, 4, 5, 6, 7, 8],
            vec![9, 3, 4, 5, 1, 2],
            vec![7, 7, 7, 7, 2],
        ];
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("idx");
        let inputs = docs.iter().map(|d| {
            Ok(InputDoc {
                content: Content::Tokens(d.clone()),
                metadata: None,
                input_bytes: 0,
            })
        });
        build(
            inputs,
            &BuildOptions::new(out.clone(), TokenWidth::U16, 0, 100),
        )
        .unwrap();
        let index = Index::open(&out, &OpenOptions::default()).unwrap();
        let occurs = |w: &[u32]| docs.iter().any(|d| d.windows(w.len()).any(|x| x == w));
        let seqs: [&[u32]; 4] = [
            &[9, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 1, 2],
            &[7, 7, 7, 7, 7, 7, 2, 1, 2, 3],
            &[10, 11, 12],
            &[1, 2, 3, 4, 5, 6, 7, 8],
        ];
        for seq in seqs {
            for span in 1..5 {
                for from in 0..seq.len() {
                    let mut want = vec![false; seq.len() - from];
                    for a in 0..seq.len() {
                        for b in a + span..=seq.len() {
                            if occurs(&seq[a..b]) {
                                for i in a.max(from)..b {
                                    want[i - from] = true;
                                }
                            }
                        }
                    }
                    let got = verbatim_mask(&index, seq, from, span).unwrap();
                    assert_eq!(got, want, "{seq:?} span {span} from {from}");
                }
            }
        }
    }

    #[test]
    fn distinct_by_hand() {
        let a: &[u32] = &[1, 2, 1, 2];
        let b: &[u32] = &[3];
        // 1-grams: 1,2,1,2,3 → 3 distinct of 5; 2-grams: 12,21,12 → 2 of 3; 3-grams: 121,212 → 2 of 2.
        let d = distinct_n(&[a, b]);
        assert_eq!(d, [0.6, 2.0 / 3.0, 1.0]);
    }
}
