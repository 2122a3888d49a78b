//! A mixing step: the ∞-gram's view of the next token, λ under the rule (the sequence's posterior
//! under the adaptive rule), and the mixed distribution in whatever form the caller wants it (the
//! top k for an answer, every token for sampling).

use super::{DecodeError, Sequence};
use crate::evidence::{self, DecodeStep, EvidenceSource, StepInfgram, StepLambda};
use crate::mix::{
    AdaptiveSequence, LambdaRule, MixError, MixingParams, NeuralDistribution, SparseDistribution,
};
use crate::model::{ModelError, Transformer};

/// How a step's λ is chosen.
#[derive(Clone, Copy)]
pub struct MixRule<'a> {
    pub rule: LambdaRule,
    /// The mixing file, which every rule but a fixed λ reads.
    pub params: Option<&'a MixingParams>,
    /// The copy guard ([`evidence::guard_copying`]): λ drops to its least once the context's
    /// match reaches this many tokens.
    pub max_match: Option<usize>,
}

/// What a mixing step gave: `output`'s form of the mixture, the ∞-gram's view and λ.
pub struct MixedStep<T> {
    pub output: T,
    pub infgram: StepInfgram,
    pub lambda: StepLambda,
}

/// One mixing step after `context`, whose ∞-gram view is `infgram` and the model's `neural`:
/// `output` gets the two distributions and λ. Under the adaptive rule `adaptive` (a caller that
/// follows a sequence) gives λ and keeps the distributions for the token that comes next.
pub fn mix_step<T>(
    source: &dyn EvidenceSource,
    how: MixRule,
    context: &[u32],
    infgram: StepInfgram,
    neural: NeuralDistribution,
    mut adaptive: Option<&mut AdaptiveSequence>,
    output: impl FnOnce(&SparseDistribution, &NeuralDistribution, f64) -> T,
) -> Result<MixedStep<T>, MixError> {
    let decode = DecodeStep {
        context,
        infgram: &infgram,
        neural: &neural,
    };
    let lambda = evidence::step_lambda(
        source,
        how.params,
        how.rule,
        &decode,
        adaptive.as_deref_mut(),
        how.max_match,
    )?;
    let sparse = infgram.distribution();
    let output = output(&sparse, &neural, lambda.lambda);
    if let (LambdaRule::Adaptive, Some(seq)) = (how.rule, adaptive) {
        seq.await_token(context.len(), lambda.base, sparse, neural);
    }
    Ok(MixedStep {
        output,
        infgram,
        lambda,
    })
}

impl Sequence {
    /// The mixing step after the sequence, whose model distribution is `neural`. Under the adaptive
    /// rule the sequence's posterior (from the prior at its first adaptive step) gives λ and
    /// learns from the token appended next. A refused step changes nothing.
    pub fn mix<T>(
        &mut self,
        how: MixRule,
        neural: NeuralDistribution,
        output: impl FnOnce(&SparseDistribution, &NeuralDistribution, f64) -> T,
    ) -> Result<MixedStep<T>, DecodeError> {
        let followed = self.followed.as_ref().ok_or_else(|| {
            MixError::Invalid("a sequence the model decodes alone does not mix".into())
        })?;
        let for_gate = how.rule.per_token(how.params) == LambdaRule::Gate;
        let infgram = followed.step(&self.tokens, &neural, for_gate)?;
        let first_adaptive = self.adaptive.is_none();
        let adaptive = match (how.rule, how.params) {
            (LambdaRule::Adaptive, Some(p)) => Some(
                self.adaptive
                    .get_or_insert_with(|| AdaptiveSequence::new(&p.adaptive)),
            ),
            _ => None,
        };
        let step = mix_step(
            followed.source(),
            how,
            &self.tokens,
            infgram,
            neural,
            adaptive,
            output,
        );
        // A refused first adaptive step leaves no posterior behind.
        if step.is_err() && first_adaptive {
            self.adaptive = None;
        }
        Ok(step?)
    }

    /// The model's logits after the sequence, running only the tokens its cache lacks.
    pub fn logits(&mut self, model: &Transformer) -> Result<Vec<f32>, DecodeError> {
        let state = self.model.as_mut().ok_or_else(|| {
            ModelError::Invalid("the sequence keeps no model state to run".into())
        })?;
        Ok(state.logits(model, &self.tokens)?)
    }
}
