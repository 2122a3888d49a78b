//! The perplexity report of `eval ppl`: per domain and overall, neural vs mixed perplexity with the
//! paper's two λ and with the gate, Δ, ∞-gram agreement and sparsity, effective n; plus agreement by
//! effective n (the paper's Figure 3) and perplexity against a fixed λ.

use std::collections::BTreeMap;

use serde::Serialize;

use super::records::DomainRecords;
use crate::evidence::{self, mix_tokens, usable_lambda, MixedToken, TokenRecord};
use crate::mix::fit::{perplexity, ScoredToken};
use crate::mix::{improvement_percent, LambdaRule, MixError, MixingParams};
use crate::tokenizer::Tokenizer;

/// P∞(true token) above this counts as the ∞-gram agreeing with the text (paper §4).
pub const AGREEMENT_PROB: f64 = 0.5;
/// Effective n beyond this is pooled into the last bucket of the agreement curve.
pub const MAX_PLOTTED_N: usize = 32;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub domain: String,
    pub documents: usize,
    pub tokens_scored: usize,
    pub neural_perplexity: f64,
    /// With the global λ1/λ2 (the paper's rule).
    pub split_perplexity: f64,
    /// Δ of the two-λ mixture over the neural model, in percent.
    pub split_improvement: f64,
    /// With each domain's own λ1/λ2.
    pub domain_split_perplexity: f64,
    pub domain_split_improvement: f64,
    pub gate_perplexity: Option<f64>,
    pub gate_improvement: Option<f64>,
    /// With the adaptive λ (each document a sequence).
    pub adaptive_perplexity: f64,
    pub adaptive_improvement: f64,
    /// The mixing file's default rule, and its figures (one of the above).
    pub default_rule: String,
    pub default_perplexity: f64,
    pub default_improvement: f64,
    /// Per rule: the shares of tokens whose probability mixing raised and lowered by over 1%.
    pub helped_hurt: BTreeMap<String, HelpedHurt>,
    /// Share of tokens with P∞(true token) > 0.5.
    pub agreement: f64,
    /// The same, among sparse estimates.
    pub agreement_sparse: f64,
    pub sparse_share: f64,
    pub mean_effective_n: f64,
    pub median_effective_n: f64,
    /// UTF-8 bytes of the scored tokens' text.
    pub bytes_scored: usize,
    /// Total NLL in bits over those bytes, for the neural model (`neural`) and each rule: what
    /// compares models with different tokenizers.
    pub bits_per_byte: BTreeMap<String, f64>,
}

/// A token counts as helped or hurt by mixing when its log-prob moved by more than this (1%): any
/// λ inside (0, 1) raises exactly the tokens the ∞-gram gave more than the model did, so counting
/// every move would say the same of every rule.
pub const HELPED_HURT_NATS: f64 = 0.01;

/// Shares of tokens whose probability a rule's mixture raised and lowered by more than
/// [`HELPED_HURT_NATS`] against the model alone.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HelpedHurt {
    pub helped: f64,
    pub hurt: f64,
}

impl HelpedHurt {
    fn of(tokens: &[&TokenRecord], mixed: &[MixedToken]) -> Self {
        let (mut helped, mut hurt) = (0, 0);
        for (t, m) in tokens.iter().zip(mixed) {
            let moved = m.logprob - t.neural_logprob as f64;
            helped += (moved > HELPED_HURT_NATS) as usize;
            hurt += (moved < -HELPED_HURT_NATS) as usize;
        }
        Self {
            helped: share(helped, tokens.len()),
            hurt: share(hurt, tokens.len()),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct AgreementPoint {
    pub effective_n: usize,
    pub tokens: usize,
    pub agreement: f64,
    pub sparse_tokens: usize,
    pub agreement_sparse: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Timing {
    pub neural_seconds: f64,
    pub infgram_seconds: f64,
    /// ∞-gram time as a share of neural time.
    pub infgram_over_neural: f64,
    pub tokens_per_second: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PplReport {
    pub model: String,
    pub index: String,
    pub window: usize,
    pub stride: usize,
    pub lambda_sparse: f64,
    pub lambda_dense: f64,
    /// The rule used where a caller names none.
    pub default_rule: String,
    pub total: Summary,
    pub by_domain: Vec<Summary>,
    pub agreement_by_n: Vec<AgreementPoint>,
    /// (λ, perplexity) for a fixed λ over all tokens.
    pub perplexity_by_lambda: Vec<(f64, f64)>,
    pub timing: Timing,
}

fn share(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn median(mut v: Vec<usize>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) as f64 / 2.0
    } else {
        v[m] as f64
    }
}

/// λ and the mixed log-prob of one group of tokens under each rule of the mixing file.
pub(crate) struct RuleMixtures {
    pub split: Vec<MixedToken>,
    /// The domain's own λ1/λ2 where fitted.
    pub domain_split: Vec<MixedToken>,
    /// None without a gate.
    pub gate: Option<Vec<MixedToken>>,
    pub adaptive: Vec<MixedToken>,
    /// The mixing file's default rule.
    default_rule: LambdaRule,
}

impl RuleMixtures {
    pub fn of(domain: &DomainRecords, params: &MixingParams) -> Result<Self, MixError> {
        let mix = |rule, name| mix_tokens(&domain.tokens, rule, Some(params), name);
        Ok(Self {
            split: mix(LambdaRule::Split, None)?,
            domain_split: mix(LambdaRule::DomainSplit, Some(&domain.domain))?,
            gate: match params.gate {
                Some(_) => Some(mix(LambdaRule::Gate, None)?),
                None => None,
            },
            adaptive: mix(LambdaRule::Adaptive, None)?,
            default_rule: params.default_rule,
        })
    }

    fn empty(params: &MixingParams) -> Self {
        Self {
            split: Vec::new(),
            domain_split: Vec::new(),
            gate: params.gate.as_ref().map(|_| Vec::new()),
            adaptive: Vec::new(),
            default_rule: params.default_rule,
        }
    }

    fn extend(&mut self, other: RuleMixtures) {
        self.split.extend(other.split);
        self.domain_split.extend(other.domain_split);
        if let (Some(a), Some(b)) = (self.gate.as_mut(), other.gate) {
            a.extend(b);
        }
        self.adaptive.extend(other.adaptive);
    }

    /// Each rule's name and mixture (the gate's when there is one).
    fn by_rule(&self) -> Vec<(LambdaRule, &[MixedToken])> {
        let mut rules = vec![
            (LambdaRule::Split, self.split.as_slice()),
            (LambdaRule::DomainSplit, self.domain_split.as_slice()),
        ];
        if let Some(g) = &self.gate {
            rules.push((LambdaRule::Gate, g.as_slice()));
        }
        rules.push((LambdaRule::Adaptive, self.adaptive.as_slice()));
        rules
    }
}

fn summarise(
    domain: &str,
    documents: usize,
    tokens: &[&TokenRecord],
    mixed: &RuleMixtures,
    tokenizer: &Tokenizer,
) -> Summary {
    let unmixed: Vec<ScoredToken> = tokens.iter().map(|t| t.evidence()).collect();
    let neural = perplexity(&unmixed, &vec![0.0; unmixed.len()]);
    let split = evidence::perplexity(&mixed.split);
    let domain_split = evidence::perplexity(&mixed.domain_split);
    let gate = mixed.gate.as_deref().map(evidence::perplexity);
    let adaptive = evidence::perplexity(&mixed.adaptive);
    let rules = mixed.by_rule();
    // A fixed λ as the default is not one of the file's rules: reported as the λ1/λ2 row then.
    let default_rule = rules
        .iter()
        .find(|(r, _)| *r == mixed.default_rule)
        .unwrap_or(&rules[0]);
    let default = evidence::perplexity(default_rule.1);
    let helped_hurt = rules
        .iter()
        .map(|(r, m)| (r.name().to_string(), HelpedHurt::of(tokens, m)))
        .collect();
    let agrees = |t: &&&TokenRecord| t.infgram_prob > AGREEMENT_PROB;
    let sparse: Vec<&&TokenRecord> = tokens.iter().filter(|t| t.sparse).collect();
    let n: Vec<usize> = tokens.iter().map(|t| t.effective_n()).collect();
    let bytes: usize = tokens
        .iter()
        .map(|t| tokenizer.spelling(t.token).byte_len())
        .sum();
    let mut bits_per_byte: BTreeMap<String, f64> = rules
        .iter()
        .map(|(r, m)| {
            let nll: f64 = m.iter().map(|t| -t.logprob).sum();
            (r.name().to_string(), evidence::bits_per_byte(nll, bytes))
        })
        .collect();
    let neural_nll: f64 = tokens.iter().map(|t| -(t.neural_logprob as f64)).sum();
    bits_per_byte.insert("neural".into(), evidence::bits_per_byte(neural_nll, bytes));
    Summary {
        domain: domain.to_string(),
        documents,
        tokens_scored: tokens.len(),
        neural_perplexity: neural,
        split_perplexity: split,
        split_improvement: improvement_percent(split, neural),
        domain_split_perplexity: domain_split,
        domain_split_improvement: improvement_percent(domain_split, neural),
        gate_perplexity: gate,
        gate_improvement: gate.map(|g| improvement_percent(g, neural)),
        adaptive_perplexity: adaptive,
        adaptive_improvement: improvement_percent(adaptive, neural),
        default_rule: default_rule.0.name().to_string(),
        default_perplexity: default,
        default_improvement: improvement_percent(default, neural),
        helped_hurt,
        agreement: share(tokens.iter().filter(agrees).count(), tokens.len()),
        agreement_sparse: share(sparse.iter().filter(|t| agrees(t)).count(), sparse.len()),
        sparse_share: share(sparse.len(), tokens.len()),
        mean_effective_n: n.iter().sum::<usize>() as f64 / n.len().max(1) as f64,
        median_effective_n: median(n),
        bytes_scored: bytes,
        bits_per_byte,
    }
}

fn agreement_by_n(tokens: &[&TokenRecord]) -> Vec<AgreementPoint> {
    let mut buckets = vec![(0usize, 0usize, 0usize, 0usize); MAX_PLOTTED_N + 1];
    for t in tokens {
        let b = &mut buckets[t.effective_n().min(MAX_PLOTTED_N)];
        let agrees = (t.infgram_prob > AGREEMENT_PROB) as usize;
        b.0 += 1;
        b.1 += agrees;
        if t.sparse {
            b.2 += 1;
            b.3 += agrees;
        }
    }
    buckets
        .into_iter()
        .enumerate()
        .filter(|(_, b)| b.0 > 0)
        .map(|(n, (all, agree, sparse, agree_sparse))| AgreementPoint {
            effective_n: n,
            tokens: all,
            agreement: share(agree, all),
            sparse_tokens: sparse,
            agreement_sparse: share(agree_sparse, sparse),
        })
        .collect()
}

/// The report over all domains' records.
pub fn build_report(
    model: String,
    index: String,
    window: (usize, usize),
    domains: &[DomainRecords],
    params: &MixingParams,
    tokenizer: &Tokenizer,
) -> Result<PplReport, MixError> {
    let mut by_domain = Vec::new();
    let mut all_mixed = RuleMixtures::empty(params);
    for d in domains {
        let tokens: Vec<&TokenRecord> = d.tokens.iter().collect();
        let mixed = RuleMixtures::of(d, params)?;
        by_domain.push(summarise(
            &d.domain,
            d.documents,
            &tokens,
            &mixed,
            tokenizer,
        ));
        all_mixed.extend(mixed);
    }
    let all: Vec<&TokenRecord> = domains.iter().flat_map(|d| &d.tokens).collect();
    let documents = domains.iter().map(|d| d.documents).sum();
    let total = summarise("all", documents, &all, &all_mixed, tokenizer);
    let perplexity_by_lambda = (0..=20)
        .map(|i| {
            let lambda = i as f64 / 20.0;
            let mut mixed = Vec::with_capacity(all.len());
            for d in domains {
                mixed.extend(mix_tokens(
                    &d.tokens,
                    LambdaRule::Fixed(lambda),
                    None,
                    None,
                )?);
            }
            Ok((usable_lambda(lambda), evidence::perplexity(&mixed)))
        })
        .collect::<Result<_, MixError>>()?;
    let neural_seconds: f64 = domains.iter().map(|d| d.neural_seconds).sum();
    let infgram_seconds: f64 = domains.iter().map(|d| d.infgram_seconds).sum();
    Ok(PplReport {
        model,
        index,
        window: window.0,
        stride: window.1,
        lambda_sparse: params.lambda_sparse,
        lambda_dense: params.lambda_dense,
        default_rule: params.default_rule.name().to_string(),
        total,
        by_domain,
        agreement_by_n: agreement_by_n(&all),
        perplexity_by_lambda,
        timing: Timing {
            neural_seconds,
            infgram_seconds,
            infgram_over_neural: infgram_seconds / neural_seconds.max(1e-9),
            tokens_per_second: all.len() as f64 / (neural_seconds + infgram_seconds).max(1e-9),
        },
    })
}

/// The report as a Markdown table, one row per domain and one for all.
pub fn markdown(report: &PplReport) -> String {
    let mut out = String::from(
        "| domain | tokens | neural PPL | mixed PPL (λ1/λ2) | Δ | mixed PPL (domain λ1/λ2) | Δ | mixed PPL (gate) | Δ | mixed PPL (adaptive) | Δ | default: helped / hurt | agreement | agreement (sparse) | sparse | mean n | median n |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let opt = |v: Option<f64>, decimals: usize, suffix: &str| {
        v.map_or("–".into(), |v| format!("{v:.decimals$}{suffix}"))
    };
    for s in report
        .by_domain
        .iter()
        .chain(std::iter::once(&report.total))
    {
        let default_shares = s
            .helped_hurt
            .get(&s.default_rule)
            .copied()
            .unwrap_or(HelpedHurt {
                helped: 0.0,
                hurt: 0.0,
            });
        out += &format!(
            "| {} | {} | {:.2} | {:.2} | {:.1}% | {:.2} | {:.1}% | {} | {} | {:.2} | {:.1}% | {:.1}% / {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.1} | {:.1} |\n",
            s.domain,
            s.tokens_scored,
            s.neural_perplexity,
            s.split_perplexity,
            s.split_improvement,
            s.domain_split_perplexity,
            s.domain_split_improvement,
            opt(s.gate_perplexity, 2, ""),
            opt(s.gate_improvement, 1, "%"),
            s.adaptive_perplexity,
            s.adaptive_improvement,
            default_shares.helped * 100.0,
            default_shares.hurt * 100.0,
            s.agreement * 100.0,
            s.agreement_sparse * 100.0,
            s.sparse_share * 100.0,
            s.mean_effective_n,
            s.median_effective_n,
        );
    }
    out += "\nBits per byte (total NLL in bits over the UTF-8 bytes of the scored text):\n\n| domain | bytes | neural | λ1/λ2 | domain λ1/λ2 | gate | adaptive |\n|---|---|---|---|---|---|---|\n";
    for s in report
        .by_domain
        .iter()
        .chain(std::iter::once(&report.total))
    {
        let bpb = |rule: &str| {
            s.bits_per_byte
                .get(rule)
                .map_or("–".into(), |v| format!("{v:.4}"))
        };
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            s.domain,
            s.bytes_scored,
            bpb("neural"),
            bpb(LambdaRule::Split.name()),
            bpb(LambdaRule::DomainSplit.name()),
            bpb(LambdaRule::Gate.name()),
            bpb(LambdaRule::Adaptive.name()),
        );
    }
    out += &format!(
        "\nDefault rule: {}. Global λ1 (sparse) = {:.4}, λ2 (non-sparse) = {:.4}. Time: neural {:.1} s, ∞-gram {:.1} s ({:.1}% of neural), {:.1} tokens/s overall.\n",
        report.default_rule,
        report.lambda_sparse,
        report.lambda_dense,
        report.timing.neural_seconds,
        report.timing.infgram_seconds,
        report.timing.infgram_over_neural * 100.0,
        report.timing.tokens_per_second
    );
    out
}
