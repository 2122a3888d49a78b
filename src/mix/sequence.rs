//! The adaptive λ of a decoding sequence (`decoding::Sequence`), where tokens arrive one step after
//! their distribution was mixed and drafts are taken back.
//!
//! A mixing step leaves its two distributions pending; when the token at that position arrives, the
//! posterior learns how each hypothesis would have scored it. Taking tokens back rolls the posterior
//! back too, so λ at a position depends only on the tokens before it, never on rejected drafts.
//! Only the token a step was mixed for teaches: a client that appends several tokens at once (an
//! accepted draft) teaches the first of them.

use super::adaptive::{AdaptiveOptions, SequenceTrust};
use super::distribution::{NeuralDistribution, SparseDistribution};

/// A mixing step whose token has not arrived yet.
#[derive(Debug, Clone)]
struct Pending {
    /// Length of the context it mixed after: the position of the token it awaits.
    position: usize,
    /// The base rule's λ there.
    base: f64,
    infgram: SparseDistribution,
    neural: NeuralDistribution,
}

/// An observed token, as the posterior learnt from it.
#[derive(Debug, Clone, Copy)]
struct Observation {
    position: usize,
    base: f64,
    p_infgram: f64,
    p_neural: f64,
}

/// The posterior is saved every this many observations; taking tokens back restores the last save
/// before the cut and replays the observations after it, which gives the very same floats.
const CHECKPOINT_EVERY: usize = 256;

#[derive(Debug, Clone)]
pub struct AdaptiveSequence {
    trust: SequenceTrust,
    /// Every observation, in increasing position (24 bytes each).
    history: Vec<Observation>,
    prior: SequenceTrust,
    /// (observations before it, the posterior then), one per [`CHECKPOINT_EVERY`].
    checkpoints: Vec<(usize, SequenceTrust)>,
    pending: Option<Pending>,
}

impl AdaptiveSequence {
    pub fn new(options: &AdaptiveOptions) -> Self {
        let prior = SequenceTrust::new(options);
        Self {
            trust: prior.clone(),
            history: Vec::new(),
            prior,
            checkpoints: Vec::new(),
            pending: None,
        }
    }

    /// The posterior over the tokens observed so far.
    pub fn trust(&self) -> &SequenceTrust {
        &self.trust
    }

    /// λ of the token at `position` (the context's length), whose base rule says `base`.
    pub fn lambda_at(&mut self, position: usize, base: f64) -> f64 {
        self.truncate(position);
        self.trust.lambda(base)
    }

    /// The distributions mixed at `position` wait there for the token.
    pub fn await_token(
        &mut self,
        position: usize,
        base: f64,
        infgram: SparseDistribution,
        neural: NeuralDistribution,
    ) {
        self.truncate(position);
        self.pending = Some(Pending {
            position,
            base,
            infgram,
            neural,
        });
    }

    /// The token at `position` is known: the posterior learns from it if a step awaited it.
    pub fn observe(&mut self, position: usize, token: u32) {
        let Some(p) = self.pending.take_if(|p| p.position == position) else {
            return;
        };
        let seen = Observation {
            position,
            base: p.base,
            p_infgram: p.infgram.prob(token, &p.neural),
            p_neural: p.neural.prob(token),
        };
        self.trust.observe(seen.base, seen.p_infgram, seen.p_neural);
        self.history.push(seen);
        if self.history.len().is_multiple_of(CHECKPOINT_EVERY) {
            self.checkpoints
                .push((self.history.len(), self.trust.clone()));
        }
    }

    /// The sequence was cut to `length` tokens: what was learnt from later tokens is forgotten.
    pub fn truncate(&mut self, length: usize) {
        if self.pending.as_ref().is_some_and(|p| p.position > length) {
            self.pending = None;
        }
        // Every step asks, and almost always nothing is to be cut: the last observation tells so
        // without a search through a history that is out of the cache by the next step.
        if self.history.last().is_none_or(|o| o.position < length) {
            return;
        }
        let keep = self.history.partition_point(|o| o.position < length);
        self.history.truncate(keep);
        while self.checkpoints.last().is_some_and(|(n, _)| *n > keep) {
            self.checkpoints.pop();
        }
        let (from, saved) = self
            .checkpoints
            .last()
            .map_or((0, &self.prior), |(n, t)| (*n, t));
        self.trust = saved.clone();
        for o in &self.history[from..] {
            self.trust.observe(o.base, o.p_infgram, o.p_neural);
        }
    }

    /// Memory held: the history, the saved posteriors and the pending distributions.
    pub fn heap_bytes(&self) -> usize {
        let pending = self
            .pending
            .as_ref()
            .map_or(0, |p| p.infgram.heap_bytes() + p.neural.heap_bytes());
        self.history.len() * std::mem::size_of::<Observation>()
            + (self.checkpoints.len() + 2) * self.trust.heap_bytes()
            + pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(seq: &mut AdaptiveSequence, position: usize) -> f64 {
        let infgram = SparseDistribution::new(vec![(1, 0.9), (2, 0.1)]);
        let neural = NeuralDistribution::from_logits(&[0.0, 0.0, 1.0, 0.5]).unwrap();
        let lambda = seq.lambda_at(position, 0.5);
        seq.await_token(position, 0.5, infgram, neural);
        lambda
    }

    /// Tokens the ∞-gram predicted raise λ; taking them back restores λ exactly; a token that no
    /// step awaited teaches nothing.
    #[test]
    fn learns_rolls_back_and_ignores_unawaited_tokens() {
        let mut seq = AdaptiveSequence::new(&AdaptiveOptions::default());
        let first = step(&mut seq, 3);
        seq.observe(3, 1);
        let second = step(&mut seq, 4);
        assert!(second > first);
        seq.observe(4, 1);
        let third = step(&mut seq, 5);
        assert!(third > second);
        seq.truncate(4);
        assert_eq!(step(&mut seq, 4).to_bits(), second.to_bits());
        seq.truncate(3);
        assert_eq!(step(&mut seq, 3).to_bits(), first.to_bits());
        seq.observe(7, 1);
        assert_eq!(seq.trust().observed(), 0);
        seq.observe(3, 2);
        assert_eq!(seq.trust().observed(), 1);
        assert!(
            step(&mut seq, 4) < first,
            "a token the model predicted lowers λ"
        );
    }
}
