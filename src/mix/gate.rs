//! The random-forest gate: a per-token λ predicted from [`GateFeatures`](super::GateFeatures).
//!
//! Trained by regression on the ∞-gram's posterior responsibility
//! r = λ·p∞(y) / (λ·p∞(y) + (1−λ)·p_nn(y)) under the current λ. The forest predicts E[r | features];
//! setting λ(features) to that is exactly EM's M-step for a feature-dependent mixture weight, so each
//! round can only raise the validation likelihood where the forest's estimate is good. A binary target
//! ("was the ∞-gram better?") throws away how much better, and a direct likelihood fit is not what a
//! regression forest can do.

use serde::{Deserialize, Serialize};
use smartcore::ensemble::random_forest_regressor::{
    RandomForestRegressor, RandomForestRegressorParameters,
};
use smartcore::linalg::basic::matrix::DenseMatrix;

use super::features::{feature_names, GateFeatures, NUM_FEATURES};
use super::forest::FlatForest;
use super::{MixError, LAMBDA_MAX, LAMBDA_MIN};

type Forest = RandomForestRegressor<f64, f64, DenseMatrix<f64>, Vec<f64>>;

/// Forest size and regularisation. Leaves of at least `min_samples_leaf` tokens keep the gate from
/// memorising validation noise.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GateOptions {
    pub trees: usize,
    pub max_depth: u16,
    pub min_samples_leaf: usize,
    /// EM rounds: each refits the forest on responsibilities under the previous round's λ.
    pub rounds: usize,
    pub seed: u64,
}

impl Default for GateOptions {
    fn default() -> Self {
        Self {
            trees: 48,
            max_depth: 10,
            min_samples_leaf: 40,
            rounds: 2,
            seed: 17,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(try_from = "StoredGate")]
pub struct Gate {
    pub feature_names: Vec<String>,
    pub options: GateOptions,
    #[serde(with = "exact")]
    forest: Forest,
    /// What predicts: the same trees, flattened (made from `forest` whenever one is made or read).
    #[serde(skip_serializing)]
    flat: FlatForest,
}

/// A gate as a mixing file holds it, before its flat copy is made.
#[derive(Deserialize)]
struct StoredGate {
    feature_names: Vec<String>,
    options: GateOptions,
    #[serde(with = "exact")]
    forest: Forest,
}

impl TryFrom<StoredGate> for Gate {
    type Error = MixError;

    fn try_from(stored: StoredGate) -> Result<Self, MixError> {
        Gate::new(stored.feature_names, stored.options, stored.forest)
    }
}

/// The forest as hex of its bincode bytes inside the JSON mixing file: JSON number parsing may be off
/// by one ulp, and a saved gate must predict exactly what the fitted one did.
mod exact {
    use serde::de::Error as _;
    use serde::ser::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Forest;

    pub fn serialize<S: Serializer>(forest: &Forest, s: S) -> Result<S::Ok, S::Error> {
        let bytes = bincode::serialize(forest).map_err(S::Error::custom)?;
        s.serialize_str(&hex::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Forest, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = hex::decode(text).map_err(D::Error::custom)?;
        bincode::deserialize(&bytes).map_err(D::Error::custom)
    }
}

fn matrix(rows: &[GateFeatures]) -> Result<DenseMatrix<f64>, MixError> {
    let rows: Vec<Vec<f64>> = rows.iter().map(|r| r.to_vec()).collect();
    DenseMatrix::from_2d_vec(&rows).map_err(|e| MixError::Gate(e.to_string()))
}

impl Gate {
    /// Fits a forest to targets in [0, 1].
    pub fn train(
        features: &[GateFeatures],
        targets: &[f64],
        options: GateOptions,
    ) -> Result<Self, MixError> {
        if features.is_empty() || features.len() != targets.len() {
            return Err(MixError::Gate(format!(
                "{} feature rows for {} targets",
                features.len(),
                targets.len()
            )));
        }
        let params = RandomForestRegressorParameters::default()
            .with_n_trees(options.trees)
            .with_max_depth(options.max_depth)
            .with_min_samples_leaf(options.min_samples_leaf)
            .with_min_samples_split(2 * options.min_samples_leaf)
            // Every feature at every split: smartcore draws its feature subset once per tree, and a
            // tree that never sees the sparse flag or the suffix length is mostly noise.
            .with_m(NUM_FEATURES)
            .with_seed(options.seed);
        let forest = Forest::fit(&matrix(features)?, &targets.to_vec(), params)
            .map_err(|e| MixError::Gate(e.to_string()))?;
        Self::new(feature_names(), options, forest)
    }

    fn new(
        feature_names: Vec<String>,
        options: GateOptions,
        forest: Forest,
    ) -> Result<Self, MixError> {
        let flat = FlatForest::from_smartcore(&forest)?;
        Ok(Self {
            feature_names,
            options,
            forest,
            flat,
        })
    }

    /// λ for each row, kept inside [`LAMBDA_MIN`], [`LAMBDA_MAX`].
    pub fn predict(&self, features: &[GateFeatures]) -> Vec<f64> {
        features
            .iter()
            .map(|row| self.flat.predict(row).clamp(LAMBDA_MIN, LAMBDA_MAX))
            .collect()
    }

    /// Normalised importance of each feature, in [`feature_names`] order.
    pub fn importances(&self) -> Result<Vec<f64>, MixError> {
        self.forest
            .compute_feature_importances()
            .map_err(|e| MixError::Gate(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Targets that depend on one feature only: the forest must follow them and keep them in range.
    #[test]
    fn learns_a_step_and_round_trips_exactly() {
        let rows: Vec<GateFeatures> = (0..400)
            .map(|i| {
                let mut f = [0.0; NUM_FEATURES];
                f[1] = (i % 2) as f64; // "sparse"
                f[5] = ((i * 37) % 101) as f64 / 10.0; // noise
                f
            })
            .collect();
        let targets: Vec<f64> = rows
            .iter()
            .map(|f| if f[1] > 0.5 { 0.9 } else { 0.1 })
            .collect();
        let opts = GateOptions {
            trees: 8,
            min_samples_leaf: 5,
            ..GateOptions::default()
        };
        let gate = Gate::train(&rows, &targets, opts).unwrap();
        let pred = gate.predict(&rows);
        for (p, t) in pred.iter().zip(&targets) {
            assert!((p - t).abs() < 0.05, "{p} vs {t}");
        }
        let imp = gate.importances().unwrap();
        assert!(imp[1] > 0.9, "{imp:?}");

        let json = serde_json::to_string(&gate).unwrap();
        let back: Gate = serde_json::from_str(&json).unwrap();
        let again = back.predict(&rows);
        assert!(pred
            .iter()
            .zip(&again)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    /// The flat copy predicts what smartcore's forest does, bit for bit: a deep forest over every
    /// feature, fitted on noisy targets, asked about its training rows and rows it never saw.
    #[test]
    fn the_flat_forest_predicts_exactly_what_smartcore_does() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        // Training rows in half steps; unseen ones in quarter steps, which land on the splits
        // (midpoints of training values) and so tell ≤ from <.
        // A value of 0 stands for −∞ (a feature that is a log of 0): smartcore then splits at −∞.
        let mut row = |step: f64| -> GateFeatures {
            std::array::from_fn(|_| match (next() * 4.0 / step).floor() * step {
                0.0 => f64::NEG_INFINITY,
                x => x,
            })
        };
        let rows: Vec<GateFeatures> = (0..3_000).map(|_| row(0.5)).collect();
        let targets: Vec<f64> = rows
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let x = f[0].max(0.0) * f[3].max(0.0) + f[9].max(-1.0) - f[12].max(0.0);
                (x.sin() + (i % 7) as f64 / 7.0) / 2.5 + 0.5
            })
            .collect();
        let options = GateOptions {
            // More trees than the flat forest walks together.
            trees: 20,
            max_depth: 14,
            min_samples_leaf: 2,
            ..GateOptions::default()
        };
        let gate = Gate::train(&rows, &targets, options).unwrap();
        let unseen: Vec<GateFeatures> = (0..3_000).map(|_| row(0.25)).collect();
        for asked in [&rows, &unseen] {
            let smartcore = gate.forest.predict(&matrix(asked).unwrap()).unwrap();
            let mut distinct: Vec<u64> = smartcore.iter().map(|p| p.to_bits()).collect();
            distinct.sort_unstable();
            distinct.dedup();
            assert!(
                distinct.len() > 500,
                "a forest this deep answers in many ways, not {}",
                distinct.len()
            );
            for (i, (row, want)) in asked.iter().zip(smartcore).enumerate() {
                let got = gate.flat.predict(row);
                assert_eq!(got.to_bits(), want.to_bits(), "row {i}: {got} vs {want}");
            }
        }
    }
}
