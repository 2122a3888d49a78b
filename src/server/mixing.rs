//! `Mix` and the mixing step of sessions: the neural side from the caller (full logits or top-k
//! log-probs) or from the sidecar's own model, λ fixed, λ1/λ2 or from the gate.

use tonic::Status;

use super::kv_budget::KvReservation;
use super::{mix_status, model_status, pb, State};
use crate::evidence;
use crate::index::dense::TokenScore;
use crate::index::query::InfgramNtdResult;
use crate::mix::features::{
    feature_names, gate_features, GateFeatures, InfgramContext, NeuralContext, NUM_FEATURES,
};
use crate::mix::{self, LambdaRule, NeuralDistribution, SparseDistribution};

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
                }
            }
        }
    };
}
lambda_from!(pb::mix_request::Lambda);
lambda_from!(pb::session_mix::Lambda);
lambda_from!(pb::score_request::Lambda);

impl LambdaChoice {
    /// λ1/λ2 when the request names no rule.
    pub(super) fn or_split(choice: Option<Self>) -> Result<Self, Status> {
        match choice.unwrap_or(Self::Split) {
            Self::Fixed(l) if !(0.0..=1.0).contains(&l) => {
                Err(Status::invalid_argument(format!("λ {l} is outside [0, 1]")))
            }
            c => Ok(c),
        }
    }

    /// The rule of the mixing file, which must then be configured.
    pub(super) fn rule(self, s: &State) -> Result<LambdaRule, Status> {
        match self {
            Self::Fixed(l) => Ok(LambdaRule::Fixed(l)),
            _ if s.mixing.is_none() => Err(Status::failed_precondition(
                "no mixing file is configured: pass fixed_lambda",
            )),
            Self::Split => Ok(LambdaRule::DomainSplit),
            Self::Gate => Ok(LambdaRule::Gate),
        }
    }
}

/// The neural distribution of a request; `own_logits` runs the sidecar's model when asked to.
pub(super) fn neural_distribution(
    s: &State,
    input: Option<NeuralInput>,
    own_logits: impl FnOnce() -> Result<Vec<f32>, Status>,
) -> Result<NeuralDistribution, Status> {
    let vocab = s.index.vocab_size() as usize;
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

/// The mixed distribution after `context`, whose ∞-gram view is `infgram`.
pub(super) fn mixed(
    s: &State,
    context: &[u32],
    infgram: &InfgramNtdResult,
    neural: &NeuralDistribution,
    lambda: LambdaChoice,
    top_k: usize,
) -> Result<pb::MixResponse, Status> {
    let rule = lambda.rule(s)?;
    let features = match lambda {
        LambdaChoice::Gate => Some(gate_input(s, context, infgram, neural)?),
        _ => None,
    };
    let lambda = evidence::lambdas(
        rule,
        s.mixing.as_ref(),
        None,
        &[infgram.sparse],
        &[features.unwrap_or([0.0; NUM_FEATURES])],
    )
    .map_err(mix_status)?
    .first()
    .copied()
    .ok_or_else(|| Status::internal("no λ for the token"))?;
    let sparse = SparseDistribution::from_ntd(&infgram.ntd);
    let mixed = mix::mix(&sparse, neural, lambda, top_k);
    Ok(pb::MixResponse {
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
        lambda,
        suffix_len: infgram.suffix_len as u32,
        prompt_cnt: infgram.ntd.prompt_cnt,
        sparse: infgram.sparse,
        gate_feature_names: features.map(|_| feature_names()).unwrap_or_default(),
        gate_features: features.map(|f| f.to_vec()).unwrap_or_default(),
    })
}

/// The unary `Mix`: the ∞-gram looked up afresh, the own model run over the whole context.
pub(super) fn mix(s: &State, r: pb::MixRequest) -> Result<pb::MixResponse, Status> {
    s.check_len("the context", r.context.len())?;
    let top_k = s.check_top_k(r.top_k)?;
    let lambda = LambdaChoice::or_split(r.lambda.map(Into::into))?;
    let infgram = s
        .index
        .infgram_ntd(&r.context, None)
        .map_err(super::index_status)?;
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
    mixed(s, &r.context, &infgram, &neural, lambda, top_k)
}

/// The gate's features for a context, from the ∞-gram's match and the neural distribution.
fn gate_input(
    s: &State,
    context: &[u32],
    infgram: &InfgramNtdResult,
    neural: &NeuralDistribution,
) -> Result<GateFeatures, Status> {
    let score = TokenScore {
        prob: 0.0,
        suffix_len: infgram.suffix_len,
        prompt_cnt: infgram.ntd.prompt_cnt,
        cont_cnt: 0,
        sparse: infgram.sparse,
    };
    let ctx = InfgramContext::new(&s.index, context, &score).map_err(mix_status)?;
    let (entropy, top_prob) = neural.entropy_and_top();
    Ok(gate_features(&ctx, &NeuralContext { entropy, top_prob }))
}
