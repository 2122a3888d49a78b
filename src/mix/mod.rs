//! Mixing the ∞-gram with a neural LM (paper §5): P = λ·P∞ + (1−λ)·P_neural, with a fixed λ, the
//! paper's two λ (one for sparse ∞-gram estimates, one for the rest), or a per-token λ from a
//! random-forest gate over what the ∞-gram and the model know about the context.

pub mod adaptive;
pub mod distribution;
pub mod features;
pub mod fit;
mod forest;
pub mod gate;
pub mod params;
pub mod sequence;

pub use adaptive::{AdaptiveOptions, SequenceTrust};
pub use distribution::{mix, MixedDistribution, NeuralDistribution, SparseDistribution};
pub use features::{GateFeatures, InfgramContext, NeuralContext, NUM_FEATURES};
pub use gate::{Gate, GateOptions};
pub use params::{DomainLambdas, LambdaRule, MixingParams};
pub use sequence::AdaptiveSequence;

#[derive(thiserror::Error, Debug)]
pub enum MixError {
    #[error("{0}")]
    Io(String),
    #[error("bad mixing file: {0}")]
    Format(String),
    #[error("invalid input: {0}")]
    Invalid(String),
    /// What the caller asked for needs a mixing file the service has not got.
    #[error("{0}")]
    Unconfigured(String),
    #[error("gate: {0}")]
    Gate(String),
    #[error("index: {0}")]
    Index(#[from] crate::index::IndexError),
}

/// λ never reaches 0 or 1: either would give some token probability zero under the mixture.
pub const LAMBDA_MIN: f64 = 1e-4;
pub const LAMBDA_MAX: f64 = 1.0 - 1e-4;

/// P(y) under the mixture.
pub fn mixed_prob(p_infgram: f64, p_neural: f64, lambda: f64) -> f64 {
    lambda * p_infgram + (1.0 - lambda) * p_neural
}

/// The share of a token's mixed probability that the ∞-gram contributed: the posterior
/// responsibility of the ∞-gram component, which is what EM averages to fit λ.
pub fn responsibility(p_infgram: f64, p_neural: f64, lambda: f64) -> f64 {
    let mixed = mixed_prob(p_infgram, p_neural, lambda);
    if mixed <= 0.0 {
        return 0.0;
    }
    lambda * p_infgram / mixed
}

/// The paper's improvement metric: Δ = (1 − (PPL − 1) / (PPL₀ − 1)) · 100%.
pub fn improvement_percent(perplexity: f64, baseline: f64) -> f64 {
    (1.0 - (perplexity - 1.0) / (baseline - 1.0)) * 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn improvement_matches_the_paper() {
        // GPT-2 117M on Pile test: 22.86 → 13.58 is a 42% improvement.
        let d = improvement_percent(13.58, 22.86);
        assert!((d - 42.45).abs() < 0.01, "{d}");
        assert_eq!(improvement_percent(5.0, 5.0), 0.0);
    }

    #[test]
    fn responsibility_by_hand() {
        // λ = 0.25, p∞ = 0.8, p_nn = 0.1: mixed = 0.2 + 0.075 = 0.275, r = 0.2 / 0.275.
        assert!((mixed_prob(0.8, 0.1, 0.25) - 0.275).abs() < 1e-15);
        assert!((responsibility(0.8, 0.1, 0.25) - 0.2 / 0.275).abs() < 1e-15);
        assert_eq!(responsibility(0.0, 0.0, 0.5), 0.0);
    }
}
