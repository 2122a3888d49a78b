//! The adaptive λ: how far to trust the fitted rule, learnt online from one sequence's own tokens.
//!
//! A fitted rule (the gate, or λ1/λ2) knows what the ∞-gram is worth on text like its validation
//! text. On text from elsewhere its sparse estimates are wrong far more often, and a per-token
//! feature cannot see that; the tokens of the sequence so far can. So each sequence keeps a
//! posterior over a few hypotheses: "the model alone", and "the rule's λ moved by b in logit space"
//! for each offset b. After a token is observed every hypothesis is weighted by the probability its
//! mixture gave that token (Bayes' rule), and the next token's λ is the posterior mean of the
//! hypotheses' λ. Because a mixture is linear in λ, that is exactly the Bayesian model average of
//! the hypotheses' mixtures, which gives the guarantee: over any sequence, its log-loss exceeds that
//! of every hypothesis h by at most ln(1 / prior(h)) nats. Against the model alone the whole sequence
//! can lose at most ln(1 / `prior_neural`) nats (plus 1e-4 a token: "the model alone" keeps the
//! smallest usable λ), however long it is and whatever its domain.

use serde::{Deserialize, Serialize};

use super::{mixed_prob, LAMBDA_MAX, LAMBDA_MIN};

/// The hypotheses and their prior.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveOptions {
    /// Offsets b added to logit(λ) of the base rule, one hypothesis each (0 is the rule as fitted).
    /// The default has none above 0: λ never exceeds the fitted rule's, so a decoder that feeds back
    /// tokens it sampled from the mixture cannot talk λ up past what the rule was fitted to.
    pub offsets: Vec<f64>,
    /// Prior weight of the model alone; the offsets share the rest equally.
    pub prior_neural: f64,
}

impl Default for AdaptiveOptions {
    fn default() -> Self {
        Self {
            offsets: vec![-4.0, -2.0, -1.0, 0.0],
            prior_neural: 0.3,
        }
    }
}

/// Offsets and prior beyond these are refused: they would only say the file is broken.
const MAX_OFFSETS: usize = 32;
const MAX_OFFSET: f64 = 20.0;

impl AdaptiveOptions {
    /// What is wrong with these options, if anything.
    pub fn validate(&self) -> Result<(), String> {
        if self.offsets.is_empty() || self.offsets.len() > MAX_OFFSETS {
            return Err(format!(
                "the adaptive λ needs 1 to {MAX_OFFSETS} offsets, not {}",
                self.offsets.len()
            ));
        }
        if let Some(b) = self
            .offsets
            .iter()
            .find(|b| !b.is_finite() || b.abs() > MAX_OFFSET)
        {
            return Err(format!(
                "adaptive offset {b} is outside [-{MAX_OFFSET}, {MAX_OFFSET}]"
            ));
        }
        if !(self.prior_neural > 0.0 && self.prior_neural < 1.0) {
            return Err(format!(
                "the prior of the model alone, {}, is not inside (0, 1)",
                self.prior_neural
            ));
        }
        Ok(())
    }
}

fn logit(p: f64) -> f64 {
    (p / (1.0 - p)).ln()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// λ of each hypothesis, the model alone and the base rule moved by each of `offsets` (on the
/// logit scale), when the base rule says `base`.
fn hypotheses(offsets: &[f64], base: f64) -> impl Iterator<Item = f64> + '_ {
    let base = logit(base.clamp(LAMBDA_MIN, LAMBDA_MAX));
    std::iter::once(LAMBDA_MIN).chain(
        offsets
            .iter()
            .map(move |b| sigmoid(base + b).clamp(LAMBDA_MIN, LAMBDA_MAX)),
    )
}

/// One sequence's posterior. Hypothesis 0 is the model alone; hypothesis i > 0 moves the base λ by
/// `offsets[i - 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceTrust {
    offsets: Vec<f64>,
    /// ln of the normalised posterior weights (logs: a long sequence would underflow products).
    log_weights: Vec<f64>,
    observed: usize,
}

impl SequenceTrust {
    /// The prior: nothing observed yet.
    pub fn new(options: &AdaptiveOptions) -> Self {
        let rest = (1.0 - options.prior_neural) / options.offsets.len() as f64;
        let log_weights = std::iter::once(options.prior_neural.ln())
            .chain(options.offsets.iter().map(|_| rest.ln()))
            .collect();
        Self {
            offsets: options.offsets.clone(),
            log_weights,
            observed: 0,
        }
    }

    /// Tokens observed so far.
    pub fn observed(&self) -> usize {
        self.observed
    }

    /// The next token's λ: the posterior mean of the hypotheses' λ.
    pub fn lambda(&self, base: f64) -> f64 {
        hypotheses(&self.offsets, base)
            .zip(&self.log_weights)
            .map(|(l, w)| l * w.exp())
            .sum::<f64>()
            .clamp(LAMBDA_MIN, LAMBDA_MAX)
    }

    /// Bayes' rule for the observed token, which the ∞-gram gave `p_infgram` and the model
    /// `p_neural`, at a position where the base rule said `base`.
    pub fn observe(&mut self, base: f64, p_infgram: f64, p_neural: f64) {
        // In place: a sequence observes every token it mixes.
        let weights = &mut self.log_weights;
        for (w, l) in weights.iter_mut().zip(hypotheses(&self.offsets, base)) {
            *w += mixed_prob(p_infgram, p_neural, l)
                .max(f64::MIN_POSITIVE)
                .ln();
        }
        let max = weights.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let norm = max + weights.iter().map(|w| (w - max).exp()).sum::<f64>().ln();
        weights.iter_mut().for_each(|w| *w -= norm);
        self.observed += 1;
    }

    /// Memory held.
    pub fn heap_bytes(&self) -> usize {
        (self.offsets.len() + self.log_weights.len()) * 8 + 2 * std::mem::size_of::<Vec<f64>>()
    }

    /// Posterior weight of the model alone.
    pub fn neural_weight(&self) -> f64 {
        self.log_weights[0].exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> AdaptiveOptions {
        AdaptiveOptions {
            offsets: vec![-2.0, 0.0, 1.0],
            prior_neural: 0.4,
        }
    }

    /// Before any token λ is the prior mean; each update is Bayes' rule over the hypotheses, checked
    /// against the same computation by hand in plain probabilities.
    #[test]
    fn posterior_by_hand() {
        let opts = options();
        let mut trust = SequenceTrust::new(&opts);
        let base = 0.3;
        let hyp = |b: f64| sigmoid(logit(base) + b);
        let lambdas = [LAMBDA_MIN, hyp(-2.0), hyp(0.0), hyp(1.0)];
        let mut w = [0.4, 0.2, 0.2, 0.2];
        let mean = |w: &[f64; 4]| w.iter().zip(&lambdas).map(|(w, l)| w * l).sum::<f64>();
        assert!((trust.lambda(base) - mean(&w)).abs() < 1e-15);
        for (p_inf, p_nn) in [(0.9, 0.1), (0.0, 0.3), (0.5, 0.5), (0.0, 0.01)] {
            trust.observe(base, p_inf, p_nn);
            for (wi, l) in w.iter_mut().zip(&lambdas) {
                *wi *= l * p_inf + (1.0 - l) * p_nn;
            }
            let s: f64 = w.iter().sum();
            w.iter_mut().for_each(|x| *x /= s);
            assert!((trust.lambda(base) - mean(&w)).abs() < 1e-12);
            assert!((trust.neural_weight() - w[0]).abs() < 1e-12);
        }
        assert_eq!(trust.observed(), 4);
    }

    /// The Bayes-mixture bound: over a sequence the ∞-gram only hurts, the adaptive λ loses at most
    /// ln(1 / prior_neural) nats to the model alone, and it gains when the ∞-gram is right.
    #[test]
    fn never_far_behind_the_model_alone() {
        let opts = options();
        let run = |tokens: &[(f64, f64)]| {
            let mut trust = SequenceTrust::new(&opts);
            let (mut adaptive, mut neural) = (0.0, 0.0);
            for &(p_inf, p_nn) in tokens {
                adaptive -= mixed_prob(p_inf, p_nn, trust.lambda(0.6)).ln();
                neural -= p_nn.ln();
                trust.observe(0.6, p_inf, p_nn);
            }
            (adaptive, neural, trust)
        };
        let wrong: Vec<(f64, f64)> = (0..500)
            .map(|i| (0.0, 0.05 + (i % 5) as f64 / 10.0))
            .collect();
        let (adaptive, neural, trust) = run(&wrong);
        // "The model alone" keeps λ = LAMBDA_MIN: 1e-4 nats a token dearer than the model itself.
        let floor = -(1.0 - LAMBDA_MIN).ln() * wrong.len() as f64;
        assert!(adaptive <= neural + floor + (1.0 / opts.prior_neural).ln() + 1e-9);
        assert!(adaptive > neural, "the ∞-gram never helped here");
        assert!(trust.neural_weight() > 0.99);
        assert!(trust.lambda(0.6) < 1e-3);
        let right: Vec<(f64, f64)> = (0..500).map(|_| (0.9, 0.05)).collect();
        let (adaptive, neural, trust) = run(&right);
        assert!(adaptive < neural - 500.0);
        assert!(trust.lambda(0.6) > 0.7);
    }

    #[test]
    fn options_are_checked() {
        assert!(AdaptiveOptions::default().validate().is_ok());
        let bad = |offsets: Vec<f64>, prior_neural| AdaptiveOptions {
            offsets,
            prior_neural,
        };
        assert!(bad(vec![], 0.3).validate().is_err());
        assert!(bad(vec![f64::NAN], 0.3).validate().is_err());
        assert!(bad(vec![0.0], 0.0).validate().is_err());
        assert!(bad(vec![0.0], 1.0).validate().is_err());
    }
}
