//! Fitting λ on validation tokens. The log-likelihood Σ ln(λ·p∞ + (1−λ)·p_nn) is concave in λ, and
//! EM (λ ← mean posterior responsibility of the ∞-gram) climbs it monotonically to the maximum, which
//! is the minimum perplexity the paper tunes for.

use serde::{Deserialize, Serialize};

use super::features::GateFeatures;
use super::gate::{Gate, GateOptions};
use super::{mixed_prob, responsibility, MixError, LAMBDA_MAX, LAMBDA_MIN};

/// One scored token, as fitting and evaluation need it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoredToken {
    /// ∞-gram probability of the actual token.
    pub p_infgram: f64,
    /// Neural probability of the actual token.
    pub p_neural: f64,
    pub sparse: bool,
    pub features: GateFeatures,
}

const EM_MAX_ROUNDS: usize = 500;
const EM_TOLERANCE: f64 = 1e-10;

/// The λ that maximises the likelihood of these tokens.
pub fn fit_lambda<'a>(tokens: impl Iterator<Item = &'a ScoredToken> + Clone) -> f64 {
    let n = tokens.clone().count();
    if n == 0 {
        return 0.5;
    }
    let mut lambda = 0.5;
    for _ in 0..EM_MAX_ROUNDS {
        let next = tokens
            .clone()
            .map(|t| responsibility(t.p_infgram, t.p_neural, lambda))
            .sum::<f64>()
            / n as f64;
        let next = next.clamp(LAMBDA_MIN, LAMBDA_MAX);
        let done = (next - lambda).abs() < EM_TOLERANCE;
        lambda = next;
        if done {
            break;
        }
    }
    lambda
}

/// The paper's two λ: (λ for sparse ∞-gram estimates, λ for the rest), each fitted on its tokens.
pub fn fit_split(tokens: &[ScoredToken]) -> (f64, f64) {
    (
        fit_lambda(tokens.iter().filter(|t| t.sparse)),
        fit_lambda(tokens.iter().filter(|t| !t.sparse)),
    )
}

/// λ of each token under the two-λ rule.
pub fn split_lambdas(tokens: &[ScoredToken], split: (f64, f64)) -> Vec<f64> {
    tokens
        .iter()
        .map(|t| if t.sparse { split.0 } else { split.1 })
        .collect()
}

/// Trains the gate by EM rounds starting from the two-λ rule (see [`Gate`] for why).
pub fn fit_gate(
    tokens: &[ScoredToken],
    split: (f64, f64),
    options: GateOptions,
) -> Result<Gate, MixError> {
    let features: Vec<GateFeatures> = tokens.iter().map(|t| t.features).collect();
    let mut lambdas = split_lambdas(tokens, split);
    let mut gate = None;
    for _ in 0..options.rounds.max(1) {
        let targets: Vec<f64> = tokens
            .iter()
            .zip(&lambdas)
            .map(|(t, &l)| responsibility(t.p_infgram, t.p_neural, l))
            .collect();
        let g = Gate::train(&features, &targets, options)?;
        lambdas = g.predict(&features);
        gate = Some(g);
    }
    gate.ok_or_else(|| MixError::Gate("no rounds".into()))
}

/// Mean negative log-likelihood (nats) of tokens under per-token λ.
pub fn mean_nll(tokens: &[ScoredToken], lambdas: &[f64]) -> f64 {
    if tokens.is_empty() {
        return 0.0;
    }
    tokens
        .iter()
        .zip(lambdas)
        .map(|(t, &l)| -mixed_prob(t.p_infgram, t.p_neural, l).ln())
        .sum::<f64>()
        / tokens.len() as f64
}

pub fn perplexity(tokens: &[ScoredToken], lambdas: &[f64]) -> f64 {
    mean_nll(tokens, lambdas).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(p_infgram: f64, p_neural: f64, sparse: bool) -> ScoredToken {
        ScoredToken {
            p_infgram,
            p_neural,
            sparse,
            features: [0.0; super::super::NUM_FEATURES],
        }
    }

    /// EM's λ against a fine grid search of the same likelihood.
    #[test]
    fn em_finds_the_grid_optimum() {
        let tokens: Vec<ScoredToken> = (0..200)
            .map(|i| {
                let p_inf = if i % 3 == 0 {
                    0.9
                } else if i % 3 == 1 {
                    0.0
                } else {
                    0.2
                };
                token(p_inf, 0.05 + (i % 7) as f64 / 20.0, i % 2 == 0)
            })
            .collect();
        let lambda = fit_lambda(tokens.iter());
        let nll = |l: f64| mean_nll(&tokens, &vec![l; tokens.len()]);
        let best = (1..10_000)
            .map(|i| i as f64 / 10_000.0)
            .min_by(|a, b| nll(*a).total_cmp(&nll(*b)))
            .unwrap();
        assert!((lambda - best).abs() < 2e-4, "EM {lambda} vs grid {best}");
        let (ls, ld) = fit_split(&tokens);
        let split = split_lambdas(&tokens, (ls, ld));
        assert!(mean_nll(&tokens, &split) <= nll(lambda) + 1e-12);
    }

    #[test]
    fn lambda_follows_which_side_is_right() {
        let good: Vec<ScoredToken> = (0..50).map(|_| token(1.0, 0.01, true)).collect();
        assert!(fit_lambda(good.iter()) > 0.98);
        let bad: Vec<ScoredToken> = (0..50).map(|_| token(0.0, 0.3, false)).collect();
        assert!(fit_lambda(bad.iter()) < 0.01);
    }
}
