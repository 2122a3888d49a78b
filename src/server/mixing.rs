//! `Mix` and the mixing step of sessions: the neural side from the caller (full logits or top-k
//! log-probs) or from the sidecar's own model, λ fixed, λ1/λ2, from the gate or adaptive (learnt
//! from the sequence's own tokens, for sessions and `Mix` calls that name a sequence).

use tonic::Status;

use super::kv_budget::KvReservation;
use super::mix_sequences::check_sequence_id;
use super::{mix_status, model_status, pb, State};
use crate::evidence::{self, DecodeStep, StepInfgram};
use crate::mix::features::feature_names;
use crate::mix::{self, AdaptiveSequence, LambdaRule, NeuralDistribution};

/// Where the neural distribution comes from.
pub(super) enum NeuralInput {
    Logits(Vec<f32>),
    TopK(pb::NeuralTopK),
    OwnModel,
}

/// How λ is chosen.
#[derive(Clone, Copy)]
pub(super) enum LambdaChoice {
    Fixed(f64),
    Split,
    Gate,
    Adaptive,
}

/// The requests' oneofs, one generated type per message, mapped onto the shared choices.
macro_rules! neural_from {
    ($neural:ty) => {
        impl From<$neural> for NeuralInput {
            fn from(n: $neural) -> Self {
                use $neural as N;
                match n {
                    N::Logits(l) => Self::Logits(l.logits),
                    N::TopKLogprobs(t) => Self::TopK(t),
                    N::OwnModel(_) => Self::OwnModel,
                }
            }
        }
    };
}
neural_from!(pb::mix_request::Neural);
neural_from!(pb::session_mix::Neural);

macro_rules! lambda_from {
    ($lambda:ty) => {
        impl From<$lambda> for LambdaChoice {
            fn from(l: $lambda) -> Self {
                use $lambda as L;
                match l {
                    L::FixedLambda(v) => Self::Fixed(v),
                    L::Split(_) => Self::Split,
                    L::Gate(_) => Self::Gate,
                    L::Adaptive(_) => Self::Adaptive,
                }
            }
        }
    };
}
lambda_from!(pb::mix_request::Lambda);
lambda_from!(pb::session_mix::Lambda);
lambda_from!(pb::score_request::Lambda);

impl LambdaChoice {
    /// The rule of a request: the one it names, else the mixing file's default for a call that
    /// follows a sequence (a session, a scored document, a `Mix` with a sequence id), else λ1/λ2.
    /// Every rule but a fixed λ needs the mixing file.
    pub(super) fn resolve(
        choice: Option<Self>,
        s: &State,
        follows_sequence: bool,
    ) -> Result<LambdaRule, Status> {
        let params = match (choice, &s.mixing) {
            (Some(Self::Fixed(l)), _) if !(0.0..=1.0).contains(&l) => {
                return Err(Status::invalid_argument(format!("λ {l} is outside [0, 1]")))
            }
            (Some(Self::Fixed(l)), _) => return Ok(LambdaRule::Fixed(l)),
            (_, None) => {
                return Err(Status::failed_precondition(
                    "no mixing file is configured: pass fixed_lambda",
                ))
            }
            (_, Some(p)) => p,
        };
        Ok(match choice {
            Some(Self::Split) => LambdaRule::DomainSplit,
            Some(Self::Gate) => LambdaRule::Gate,
            Some(Self::Adaptive) => LambdaRule::Adaptive,
            None if follows_sequence => params.default_rule,
            _ => LambdaRule::DomainSplit,
        })
    }
}

/// The neural distribution of a request; `own_logits` runs the sidecar's model when asked to.
pub(super) fn neural_distribution(
    s: &State,
    input: Option<NeuralInput>,
    own_logits: impl FnOnce() -> Result<Vec<f32>, Status>,
) -> Result<NeuralDistribution, Status> {
    let vocab = s.mix_vocab_size()? as usize;
    match input {
        Some(NeuralInput::Logits(l)) if l.len() != vocab => Err(Status::invalid_argument(format!(
            "{} logits for a vocabulary of {vocab}",
            l.len()
        ))),
        Some(NeuralInput::Logits(l)) => NeuralDistribution::from_logits(&l).map_err(mix_status),
        Some(NeuralInput::OwnModel) => {
            // The model's and the tokenizer's vocabularies may differ by padding: ids the model
            // lacks get no mass, ids the tokenizer lacks are never produced.
            let mut logits = own_logits()?;
            logits.resize(vocab, f32::MIN);
            NeuralDistribution::from_logits(&logits).map_err(mix_status)
        }
        Some(NeuralInput::TopK(t)) => {
            if t.tokens.len() != t.logprobs.len() {
                return Err(Status::invalid_argument(
                    "top-k tokens and log-probs differ in length",
                ));
            }
            let entries = t.tokens.into_iter().zip(t.logprobs).collect();
            NeuralDistribution::from_top_k(entries, t.rest_mass, vocab).map_err(mix_status)
        }
        None => Err(Status::invalid_argument(
            "the request needs logits, top-k log-probs or own_model",
        )),
    }
}

/// What a mixing request asks beyond its inputs.
#[derive(Clone, Copy)]
pub(super) struct MixOptions {
    pub top_k: usize,
    /// The request's `max_match` (0: the mixing file's guard).
    pub max_match: u32,
}

/// The mixed distribution after `context`, whose ∞-gram view is `infgram`. Under the adaptive rule
/// `sequence` (when the caller follows one) gives λ and keeps the distributions for the next token.
pub(super) fn mixed(
    s: &State,
    context: &[u32],
    infgram: &StepInfgram,
    neural: NeuralDistribution,
    rule: LambdaRule,
    mut sequence: Option<&mut AdaptiveSequence>,
    options: MixOptions,
) -> Result<pb::MixResponse, Status> {
    let decode = DecodeStep {
        context,
        infgram,
        neural: &neural,
    };
    let max_match = match options.max_match {
        0 => s.mixing.as_ref().and_then(|p| p.decode_max_match),
        n => Some(n as usize),
    };
    let step = evidence::step_lambda(
        &*s.reference,
        s.mixing.as_ref(),
        rule,
        &decode,
        sequence.as_deref_mut(),
        max_match,
    )
    .map_err(mix_status)?;
    let sparse = infgram.distribution();
    let mixed = mix::mix(&sparse, &neural, step.lambda, options.top_k);
    let response = pb::MixResponse {
        top: mixed
            .top
            .iter()
            .map(|&(token, prob)| pb::TokenProb {
                token,
                prob,
                cont_cnt: 0,
            })
            .collect(),
        rest_mass: mixed.rest_mass,
        lambda: step.lambda,
        suffix_len: infgram.suffix_len() as u32,
        prompt_cnt: infgram.prompt_cnt(),
        sparse: infgram.sparse(),
        gate_feature_names: step.features.map(|_| feature_names()).unwrap_or_default(),
        gate_features: step.features.map(|f| f.to_vec()).unwrap_or_default(),
    };
    if let (LambdaRule::Adaptive, Some(seq)) = (rule, sequence) {
        seq.await_token(context.len(), step.base, sparse, neural);
    }
    Ok(response)
}

/// The unary `Mix`: the ∞-gram looked up afresh, the own model run over the whole context. Over a
/// byte-level index the context is in the model's tokens, and the ∞-gram's view reads the model's
/// distribution (`evidence::bytes`).
pub(super) fn mix(s: &State, r: pb::MixRequest) -> Result<pb::MixResponse, Status> {
    s.check_len("the context", r.context.len())?;
    let options = MixOptions {
        top_k: s.check_top_k(r.top_k)?,
        max_match: r.max_match,
    };
    check_sequence_id(&r.sequence_id)?;
    let follows_sequence = !r.sequence_id.is_empty();
    let rule = LambdaChoice::resolve(r.lambda.map(Into::into), s, follows_sequence)?;
    s.check_model_ids(&r.context)?;
    let neural = neural_distribution(s, r.neural.map(Into::into), || {
        if r.context.is_empty() {
            return Err(Status::invalid_argument(
                "the own model needs a non-empty context",
            ));
        }
        let model = s.model()?.transformer();
        let _kv = KvReservation::new(&s.kv_budget, r.context.len())?;
        let logits = model
            .forward_last(&r.context, &mut model.new_cache())
            .map_err(model_status)?;
        logits
            .to_vec1::<f32>()
            .map_err(|e| Status::internal(e.to_string()))
    })?;
    let infgram = s
        .reference
        .step(&r.context, &neural)
        .map_err(super::evidence_status)?;
    if !follows_sequence || rule != LambdaRule::Adaptive {
        return mixed(s, &r.context, &infgram, neural, rule, None, options);
    }
    let mut sequence = s.mix_sequences.take(&r.sequence_id, &r.context, s)?;
    let response = mixed(
        s,
        &r.context,
        &infgram,
        neural,
        rule,
        Some(&mut sequence.adaptive),
        options,
    );
    s.mix_sequences.put(r.sequence_id, sequence);
    response
}
