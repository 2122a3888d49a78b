//! `Mix` and the requests' side of the mixing step of sessions: the neural side from the caller
//! (full logits or top-k log-probs) or from the sidecar's own model, the rule asked for, and the
//! answer; the step itself is the library's (`decoding`).

use tonic::Status;

use super::valid::{NeuralInput, ValidMix};
use super::{decode_status, evidence_status, mix_status, model_status, pb, State};
use crate::decoding::{mix_step, MixRule, MixedStep};
use crate::mix::features::feature_names;
use crate::mix::{self, LambdaRule, MixedDistribution, NeuralDistribution, SparseDistribution};
use crate::model::budget::KvReservation;

/// How a mixing request's λ is chosen: the rule ([`LambdaRule::resolve`]) and the copy guard, the
/// request's `max_match` or else the mixing file's.
pub(super) fn mix_rule(
    s: &State,
    asked: Option<LambdaRule>,
    follows_sequence: bool,
    max_match: u32,
) -> Result<MixRule<'_>, Status> {
    let params = s.mixing.as_ref();
    let rule = LambdaRule::resolve(asked, params, follows_sequence).map_err(mix_status)?;
    let max_match = match max_match {
        0 => params.and_then(|p| p.decode_max_match),
        n => Some(n as usize),
    };
    Ok(MixRule {
        rule,
        params,
        max_match,
    })
}

/// The neural distribution of a request; `own_logits` runs the sidecar's model when asked to.
pub(super) fn neural_distribution(
    s: &State,
    input: NeuralInput,
    own_logits: impl FnOnce() -> Result<Vec<f32>, Status>,
) -> Result<NeuralDistribution, Status> {
    let vocab = s.mix_vocab_size()? as usize;
    match input {
        NeuralInput::Logits(l) => {
            NeuralDistribution::from_vocab_logits(&l, vocab).map_err(mix_status)
        }
        NeuralInput::OwnModel => {
            // The model's and the tokenizer's vocabularies may differ by padding: ids the model
            // lacks get no mass, ids the tokenizer lacks are never produced.
            let mut logits = own_logits()?;
            logits.resize(vocab, f32::MIN);
            NeuralDistribution::from_logits(&logits).map_err(mix_status)
        }
        NeuralInput::TopK(t) => {
            let entries = t.tokens.into_iter().zip(t.logprobs).collect();
            NeuralDistribution::from_top_k(entries, t.rest_mass, vocab).map_err(mix_status)
        }
    }
}

/// The top `top_k` tokens of a step's mixture.
pub(super) fn top(
    top_k: usize,
) -> impl FnOnce(&SparseDistribution, &NeuralDistribution, f64) -> MixedDistribution {
    move |sparse, neural, lambda| mix::mix(sparse, neural, lambda, top_k)
}

/// A mixing step's answer; the gate's feature names with its features when `name_features` (a
/// stream names them once: they never change).
pub(super) fn response(step: MixedStep<MixedDistribution>, name_features: bool) -> pb::MixResponse {
    let MixedStep {
        output: mixed,
        infgram,
        lambda,
    } = step;
    pb::MixResponse {
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
        lambda: lambda.lambda,
        suffix_len: infgram.suffix_len() as u32,
        prompt_cnt: infgram.prompt_cnt(),
        sparse: infgram.sparse(),
        gate_feature_names: match (lambda.features, name_features) {
            (Some(_), true) => feature_names(),
            _ => Vec::new(),
        },
        gate_features: lambda.features.map(|f| f.to_vec()).unwrap_or_default(),
    }
}

/// The unary `Mix`: the ∞-gram looked up afresh (or, for an adaptive `sequence_id`, followed from
/// the sequence's last call), the own model run over the whole context. Over a byte-level index
/// the context is in the model's tokens, and the ∞-gram's view reads the model's distribution
/// (`evidence::bytes`).
pub(super) fn mix(s: &State, r: ValidMix) -> Result<pb::MixResponse, Status> {
    let ValidMix {
        context,
        sequence_id,
        ask,
    } = r;
    let follows_sequence = !sequence_id.is_empty();
    let how = mix_rule(s, ask.lambda, follows_sequence, ask.max_match)?;
    s.check_model_ids(&context)?;
    let neural = neural_distribution(s, ask.neural, || {
        let model = s.model()?.transformer();
        let _kv = KvReservation::new(&s.kv_budget, context.len()).map_err(model_status)?;
        let logits = model
            .forward_last(&context, &mut model.new_cache())
            .map_err(model_status)?;
        logits
            .to_vec1::<f32>()
            .map_err(|e| Status::internal(e.to_string()))
    })?;
    let top_k = ask.top_k;
    if !follows_sequence || how.rule != LambdaRule::Adaptive {
        let infgram = s
            .evidence
            .step(&context, &neural)
            .map_err(evidence_status)?;
        let step = mix_step(
            &*s.evidence,
            how,
            &context,
            infgram,
            neural,
            None,
            top(top_k),
        )
        .map_err(mix_status)?;
        return Ok(response(step, true));
    }
    let mut sequence = s.mix_sequences.take(&sequence_id, &context, s)?;
    let step = sequence.mix(how, neural, top(top_k));
    s.mix_sequences.put(sequence_id, sequence);
    step.map(|step| response(step, true)).map_err(decode_status)
}
