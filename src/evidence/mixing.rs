//! λ of each token under a rule, and the mixed log-prob it gives: decided here only, so `eval ppl`,
//! the per-token output and the `Score` and `Mix` RPCs cannot disagree.

use serde::Serialize;

use super::bytes::ByteStep;
use super::{EvidenceSource, TokenRecord};
use crate::index::query::{InfgramNtdResult, NtdResult};
use crate::mix::features::{gate_features, InfgramContext, NeuralContext, NUM_FEATURES};
use crate::mix::{
    mixed_prob, AdaptiveSequence, GateFeatures, LambdaRule, MixError, MixingParams,
    NeuralDistribution, SequenceTrust, SparseDistribution, LAMBDA_MAX, LAMBDA_MIN,
};

/// The λ a mixture uses when `lambda` is asked for: never 0 or 1, where a token that one side gives
/// probability zero (one the ∞-gram never saw after the suffix) would get zero under the mixture
/// too, an infinite NLL.
pub fn usable_lambda(lambda: f64) -> f64 {
    lambda.clamp(LAMBDA_MIN, LAMBDA_MAX)
}

/// λ of each token (`sparse` and `features` are the tokens') under `rule`; `domain` picks the
/// domain's own λ1/λ2 under [`LambdaRule::DomainSplit`]. Every rule but a fixed λ reads `params`.
/// [`LambdaRule::Adaptive`] gives its λ before any token of the sequence is observed (the prior);
/// [`mix_tokens`] follows one with a [`SequenceTrust`], decoding sequences with an
/// [`AdaptiveSequence`] (the same posterior, able to take tokens back).
pub fn lambdas(
    rule: LambdaRule,
    params: Option<&MixingParams>,
    domain: Option<&str>,
    sparse: &[bool],
    features: &[GateFeatures],
) -> Result<Vec<f64>, MixError> {
    let pick = |(l1, l2): (f64, f64)| -> Vec<f64> {
        sparse.iter().map(|&s| if s { l1 } else { l2 }).collect()
    };
    let asked = match (rule, params) {
        (LambdaRule::Fixed(l), _) => vec![l; sparse.len()],
        (LambdaRule::Split, Some(p)) => pick(p.split_for(None)),
        (LambdaRule::DomainSplit, Some(p)) => pick(p.split_for(domain)),
        (LambdaRule::Gate, Some(p)) => match &p.gate {
            Some(g) => g.predict(features),
            None => return Err(MixError::Invalid("the mixing file has no gate".into())),
        },
        (LambdaRule::Adaptive, Some(p)) => {
            let prior = SequenceTrust::new(&p.adaptive);
            lambdas(p.adaptive_base(), params, domain, sparse, features)?
                .into_iter()
                .map(|base| prior.lambda(base))
                .collect()
        }
        (rule, None) => {
            return Err(MixError::Invalid(format!(
                "λ rule {rule:?} needs a mixing file"
            )))
        }
    };
    Ok(asked.into_iter().map(usable_lambda).collect())
}

/// λ and the mixed log-prob of one scored token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MixedToken {
    pub lambda: f64,
    /// ln(λ·P∞ + (1 − λ)·P_neural) of the token.
    pub logprob: f64,
}

/// λ under `rule` and the mixed log-prob of every token of `records` (of one domain, when known).
/// Under [`LambdaRule::Adaptive`] each document (`doc`) is a sequence of its own, read in order.
pub fn mix_tokens(
    records: &[TokenRecord],
    rule: LambdaRule,
    params: Option<&MixingParams>,
    domain: Option<&str>,
) -> Result<Vec<MixedToken>, MixError> {
    let sparse: Vec<bool> = records.iter().map(|r| r.sparse).collect();
    let features: Vec<GateFeatures> = records.iter().map(|r| r.features).collect();
    let mixed = |r: &TokenRecord, lambda| MixedToken {
        lambda,
        logprob: mixed_prob(r.infgram_prob, r.neural_prob(), lambda).ln(),
    };
    let (LambdaRule::Adaptive, Some(p)) = (rule, params) else {
        let lambdas = lambdas(rule, params, domain, &sparse, &features)?;
        return Ok(records
            .iter()
            .zip(lambdas)
            .map(|(r, l)| mixed(r, l))
            .collect());
    };
    let bases = lambdas(p.adaptive_base(), params, domain, &sparse, &features)?;
    // Read in order, never taken back: the posterior alone, without a decoding sequence's history.
    let mut sequence: Option<(usize, SequenceTrust)> = None;
    Ok(records
        .iter()
        .zip(bases)
        .map(|(r, base)| {
            debug_assert!(
                sequence
                    .as_ref()
                    .is_none_or(|(doc, t)| *doc != r.doc || t.observed() + 1 == r.position),
                "records of a document must come in position order, from its second token"
            );
            let mixer = match &mut sequence {
                Some((doc, mixer)) if *doc == r.doc => mixer,
                _ => &mut sequence.insert((r.doc, SequenceTrust::new(&p.adaptive))).1,
            };
            let lambda = mixer.lambda(base);
            mixer.observe(base, r.infgram_prob, r.neural_prob());
            mixed(r, lambda)
        })
        .collect())
}

/// λ of the next token of a sequence being decoded, and what went into it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLambda {
    pub lambda: f64,
    /// The per-token rule's λ (the one the adaptive λ moves).
    pub base: f64,
    /// The gate's input, when the gate was asked.
    pub features: Option<GateFeatures>,
}

/// What the ∞-gram says before a decoding step's token: a token index's exact answer, or a
/// byte-level index's distribution over the model's tokens ([`super::bytes::decode_step`]) with the
/// context's matched suffix in byte ids (what the gate's features read) and how many of the
/// context's last tokens it covers.
pub enum StepInfgram {
    Tokens {
        answer: InfgramNtdResult,
        /// The gate's subsample of the matched suffix's occurrences, when the step was asked for
        /// the gate and the index found it with the exact answer, without searching again
        /// ([`crate::index::suffix::Occurrences::ntd_and_sample`]).
        gate_sample: Option<NtdResult>,
    },
    Bytes {
        step: ByteStep,
        /// The bytes of the context's longest suffix that occurs.
        text: Vec<u32>,
        matched_tokens: usize,
    },
}

impl StepInfgram {
    /// A token index's exact answer, with no subsample for the gate.
    pub fn tokens(answer: InfgramNtdResult) -> Self {
        Self::Tokens {
            answer,
            gate_sample: None,
        }
    }

    /// Length of the context's longest suffix found (tokens, or bytes).
    pub fn suffix_len(&self) -> usize {
        match self {
            Self::Tokens { answer: r, .. } => r.suffix_len,
            Self::Bytes { step, .. } => step.suffix_len,
        }
    }

    pub fn prompt_cnt(&self) -> u64 {
        match self {
            Self::Tokens { answer: r, .. } => r.ntd.prompt_cnt,
            Self::Bytes { step, .. } => step.prompt_cnt,
        }
    }

    /// Length of the context's longest match in the model's tokens (what the copy guard reads).
    pub fn matched_tokens(&self) -> usize {
        match self {
            Self::Tokens { answer: r, .. } => r.suffix_len,
            Self::Bytes { matched_tokens, .. } => *matched_tokens,
        }
    }

    pub fn sparse(&self) -> bool {
        match self {
            Self::Tokens { answer: r, .. } => r.sparse,
            Self::Bytes { step, .. } => step.sparse,
        }
    }

    /// The ∞-gram's next-token distribution.
    pub fn distribution(&self) -> SparseDistribution {
        match self {
            Self::Tokens { answer: r, .. } => SparseDistribution::from_ntd(&r.ntd),
            Self::Bytes { step, .. } => step.dist.clone(),
        }
    }

    /// The gate's view of the step after `context`.
    fn gate_context(
        &self,
        source: &dyn EvidenceSource,
        context: &[u32],
    ) -> Result<InfgramContext, MixError> {
        match (self, source.byte_index()) {
            (
                Self::Tokens {
                    answer,
                    gate_sample,
                },
                _,
            ) => source.context_after(context, answer, gate_sample.as_ref()),
            (Self::Bytes { step, text, .. }, Some(index)) => {
                InfgramContext::new(index, text, &step.score())
            }
            (Self::Bytes { .. }, None) => Err(MixError::Invalid(
                "a byte-level step over an evidence source that is not byte-level".into(),
            )),
        }
    }
}

/// What a decoding step knows before its token: the context, the ∞-gram's and the model's views.
#[derive(Clone, Copy)]
pub struct DecodeStep<'a> {
    pub context: &'a [u32],
    pub infgram: &'a StepInfgram,
    pub neural: &'a NeuralDistribution,
}

/// λ of a decoding step after `context` under `rule`, whose ∞-gram view is `infgram` and the
/// model's `neural`. Under [`LambdaRule::Adaptive`] `sequence` gives the sequence's posterior;
/// without one, the prior's λ. A rule of the file is then guarded against copying (`max_match`, see
/// [`guard_copying`]); a fixed λ is taken as asked. A caller that follows the sequence leaves the
/// step's distributions with [`AdaptiveSequence::await_token`].
pub fn step_lambda(
    source: &dyn EvidenceSource,
    params: Option<&MixingParams>,
    rule: LambdaRule,
    step: &DecodeStep,
    sequence: Option<&mut AdaptiveSequence>,
    max_match: Option<usize>,
) -> Result<StepLambda, MixError> {
    let DecodeStep {
        context,
        infgram,
        neural,
    } = *step;
    let base_rule = rule.per_token(params);
    let features = match base_rule {
        LambdaRule::Gate => {
            let ctx = infgram.gate_context(source, context)?;
            let (entropy, top_prob) = neural.entropy_and_top();
            Some(gate_features(&ctx, &NeuralContext { entropy, top_prob }))
        }
        _ => None,
    };
    let base = lambdas(
        base_rule,
        params,
        None,
        &[infgram.sparse()],
        &[features.unwrap_or([0.0; NUM_FEATURES])],
    )?
    .first()
    .copied()
    .ok_or_else(|| MixError::Invalid("no λ for the step".into()))?;
    let lambda = match (rule, params, sequence) {
        (LambdaRule::Adaptive, _, Some(seq)) => seq.lambda_at(context.len(), base),
        (LambdaRule::Adaptive, Some(p), None) => SequenceTrust::new(&p.adaptive).lambda(base),
        _ => base,
    };
    let lambda = match rule {
        LambdaRule::Fixed(_) => lambda,
        _ => guard_copying(lambda, infgram.matched_tokens(), max_match),
    };
    Ok(StepLambda {
        lambda,
        base,
        features,
    })
}

/// λ of a decoding step once the copy guard has been applied: the smallest usable λ when the
/// context's match (`matched_tokens` of the model's tokens) has reached `max_match`.
pub fn guard_copying(lambda: f64, matched_tokens: usize, max_match: Option<usize>) -> f64 {
    match max_match {
        Some(max) if matched_tokens >= max => LAMBDA_MIN,
        _ => lambda,
    }
}

/// Perplexity of mixed tokens: exp of the mean NLL (1 for none).
pub fn perplexity(tokens: &[MixedToken]) -> f64 {
    if tokens.is_empty() {
        return 1.0;
    }
    (tokens.iter().map(|t| -t.logprob).sum::<f64>() / tokens.len() as f64).exp()
}

/// `nll` nats over `bytes` bytes of text, in bits a byte: what compares models whose tokenizers
/// cut the same text into different numbers of tokens.
pub fn bits_per_byte(nll: f64, bytes: usize) -> f64 {
    nll / std::f64::consts::LN_2 / bytes.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mix::NUM_FEATURES;

    fn record(infgram_prob: f64, neural_prob: f64, sparse: bool) -> TokenRecord {
        TokenRecord {
            doc: 0,
            position: 1,
            token: 7,
            neural_logprob: neural_prob.ln() as f32,
            infgram_prob,
            suffix_len: 2,
            prompt_cnt: 3,
            sparse,
            features: [0.0; NUM_FEATURES],
        }
    }

    fn params() -> MixingParams {
        let mut p = crate::mix::params::split_only((0.4, 0.05));
        p.by_domain.insert(
            "code".into(),
            crate::mix::DomainLambdas {
                lambda_sparse: 0.7,
                lambda_dense: 0.2,
                tokens: 600,
            },
        );
        p
    }

    /// λ = 0 and λ = 1 are taken as the nearest usable λ: a token the ∞-gram never saw keeps a
    /// finite log-prob at λ = 1, and one the model all but rules out keeps one at λ = 0.
    #[test]
    fn fixed_lambda_never_reaches_0_or_1() {
        let unseen = record(0.0, 0.25, false);
        let p = unseen.neural_prob();
        let unseen = std::slice::from_ref(&unseen);
        let mixed = mix_tokens(unseen, LambdaRule::Fixed(1.0), None, None).unwrap();
        assert_eq!(mixed[0].lambda, LAMBDA_MAX);
        assert_eq!(mixed[0].logprob, ((1.0 - LAMBDA_MAX) * p).ln());
        assert!(mixed[0].logprob.is_finite());
        let mixed = mix_tokens(unseen, LambdaRule::Fixed(0.0), None, None).unwrap();
        assert_eq!(mixed[0].lambda, LAMBDA_MIN);
        // Inside (0, 1) λ is taken as asked.
        let seen = record(0.5, 0.25, true);
        let mixed = mix_tokens(&[seen], LambdaRule::Fixed(0.3), None, None).unwrap();
        assert_eq!(mixed[0].lambda, 0.3);
        assert!((mixed[0].logprob - (0.3 * 0.5 + 0.7 * p).ln()).abs() < 1e-15);
    }

    /// λ1 for sparse tokens, λ2 for the rest; the domain's pair where it was fitted.
    #[test]
    fn split_rules_by_hand() {
        let p = params();
        let sparse = [true, false];
        let l = |rule, domain| lambdas(rule, Some(&p), domain, &sparse, &[]).unwrap();
        assert_eq!(l(LambdaRule::Split, Some("code")), [0.4, 0.05]);
        assert_eq!(l(LambdaRule::DomainSplit, Some("code")), [0.7, 0.2]);
        assert_eq!(l(LambdaRule::DomainSplit, Some("prose")), [0.4, 0.05]);
        assert_eq!(l(LambdaRule::DomainSplit, None), [0.4, 0.05]);
        // A hand-written file may say 0 or 1: used as the nearest usable λ as well.
        let mut edge = params();
        edge.lambda_sparse = 1.0;
        edge.lambda_dense = 0.0;
        let got = lambdas(LambdaRule::Split, Some(&edge), None, &sparse, &[]).unwrap();
        assert_eq!(got, [LAMBDA_MAX, LAMBDA_MIN]);
    }

    #[test]
    fn rules_that_need_a_mixing_file_say_so() {
        assert!(lambdas(LambdaRule::Split, None, None, &[true], &[]).is_err());
        let no_gate = params();
        let features = [[0.0; NUM_FEATURES]];
        assert!(lambdas(LambdaRule::Gate, Some(&no_gate), None, &[true], &features).is_err());
    }

    /// Under the adaptive rule a token's λ depends on the tokens before it in its document only:
    /// changing a later token, or another document, leaves it as it was.
    #[test]
    fn adaptive_lambda_reads_only_the_past_of_its_document() {
        let p = params();
        let mut records: Vec<TokenRecord> = (0..12)
            .map(|i| {
                let mut r = record(if i % 3 == 0 { 0.0 } else { 0.8 }, 0.1, i % 2 == 0);
                r.doc = i / 6;
                r.position = i % 6 + 1;
                r
            })
            .collect();
        let before = mix_tokens(&records, LambdaRule::Adaptive, Some(&p), None).unwrap();
        records[4].infgram_prob = 0.0;
        let after = mix_tokens(&records, LambdaRule::Adaptive, Some(&p), None).unwrap();
        let lambda = |m: &[MixedToken]| m.iter().map(|t| t.lambda).collect::<Vec<_>>();
        assert_eq!(lambda(&before[..5]), lambda(&after[..5]));
        assert_eq!(before[..4], after[..4]);
        assert_ne!(before[5].lambda, after[5].lambda);
        assert_eq!(before[6..], after[6..], "the second document starts afresh");
        // Each document starts from the prior: its first λ is the rule's λ before any token.
        let prior = lambdas(
            LambdaRule::Adaptive,
            Some(&p),
            None,
            &[records[6].sparse],
            &[],
        );
        assert_eq!(after[6].lambda, prior.unwrap()[0]);
    }

    #[test]
    fn perplexity_by_hand() {
        let tokens = [
            MixedToken {
                lambda: 0.5,
                logprob: 0.25f64.ln(),
            },
            MixedToken {
                lambda: 0.5,
                logprob: 1.0f64.ln(),
            },
        ];
        // exp(−(ln ¼ + 0) / 2) = 2.
        assert!((perplexity(&tokens) - 2.0).abs() < 1e-12);
        assert_eq!(perplexity(&[]), 1.0);
    }
}
