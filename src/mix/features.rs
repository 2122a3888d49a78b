//! What the gate sees at each position, before the next token is known: the paper's features (the
//! suffix lengths up to the effective n and how often each suffix occurs in the reference data), plus
//! cheap extras: the sparse flag, how many distinct tokens followed the match, the ∞-gram's top
//! probability, and the neural model's entropy and top probability.

use serde::{Deserialize, Serialize};

use super::MixError;
use crate::index::corpus::Corpus;
use crate::index::dense::TokenScore;
use crate::index::query::{InfgramNtdResult, NtdResult};
use crate::index::IndexError;

/// What the gate's view of a context reads of an index: counts, and the distribution after a
/// suffix sampled to at most `max_support` matches. Every [`Corpus`] answers it.
pub trait ContextCounts {
    fn count(&self, ids: &[u32]) -> Result<u64, IndexError>;
    fn ntd(&self, prompt: &[u32], max_support: Option<u64>) -> Result<NtdResult, IndexError>;
}

impl<C: Corpus + ?Sized> ContextCounts for C {
    fn count(&self, ids: &[u32]) -> Result<u64, IndexError> {
        Corpus::count(self, ids)
    }
    fn ntd(&self, prompt: &[u32], max_support: Option<u64>) -> Result<NtdResult, IndexError> {
        Corpus::ntd(self, prompt, max_support)
    }
}

/// Suffix lengths whose corpus counts the gate sees (a fixed-size vector, log-spaced).
pub const SUFFIX_LENGTHS: [usize; 10] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32];
/// Matches sampled to estimate the ∞-gram's distinct continuations and top probability: exact below
/// this count, the engine's even subsample above it (one read per sample).
pub const SUPPORT_SAMPLES: u64 = 256;

pub const NUM_FEATURES: usize = 7 + SUFFIX_LENGTHS.len();
pub type GateFeatures = [f64; NUM_FEATURES];

/// Names of the features, in vector order (for reports and feature importances).
pub fn feature_names() -> Vec<String> {
    let mut names: Vec<String> = [
        "ln(1+suffix_len)",
        "sparse",
        "ln(1+prompt_cnt)",
        "ln(distinct continuations)",
        "infgram top prob",
        "neural entropy",
        "neural top prob",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.extend(
        SUFFIX_LENGTHS
            .iter()
            .map(|k| format!("ln(1+cnt of last {k})")),
    );
    names
}

/// What the ∞-gram knows about a context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InfgramContext {
    /// Longest suffix of the context found in the reference data (effective n − 1).
    pub suffix_len: usize,
    pub prompt_cnt: u64,
    pub sparse: bool,
    /// Distinct next tokens after that suffix (estimated from at most [`SUPPORT_SAMPLES`] matches).
    pub distinct: u64,
    pub top_prob: f64,
    /// Count of the last k tokens, for k in [`SUFFIX_LENGTHS`] (0 beyond the longest match).
    pub suffix_counts: [u64; SUFFIX_LENGTHS.len()],
}

/// What the neural model knows about a context.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NeuralContext {
    pub entropy: f64,
    pub top_prob: f64,
}

impl InfgramContext {
    /// The context of the token scored by `score`, whose preceding tokens are `prefix`.
    pub fn new(
        index: &(impl ContextCounts + ?Sized),
        prefix: &[u32],
        score: &TokenScore,
    ) -> Result<Self, MixError> {
        let len = score.suffix_len.min(prefix.len());
        let support = index.ntd(&prefix[prefix.len() - len..], Some(SUPPORT_SAMPLES))?;
        Self::with_support(index, prefix, score, &support)
    }

    /// The context from the matched suffix's sampled `support`, counting the shorter suffixes.
    fn with_support(
        index: &(impl ContextCounts + ?Sized),
        prefix: &[u32],
        score: &TokenScore,
        support: &NtdResult,
    ) -> Result<Self, MixError> {
        Self::from_evidence(score, support, |k| {
            let from = prefix.len().checked_sub(k).ok_or_else(|| {
                MixError::Invalid(format!(
                    "a match of {} tokens after a context of {}",
                    score.suffix_len,
                    prefix.len()
                ))
            })?;
            Ok(index.count(&prefix[from..])?)
        })
    }

    /// The context from what the reference data says of it: the token's dense `score`, the
    /// distribution after its matched suffix sampled to at most [`SUPPORT_SAMPLES`] matches
    /// (`support`), and `count_last(k)`, the count of the last k tokens, for the lengths in
    /// [`SUFFIX_LENGTHS`] shorter than the match. A router builds it from its shards' answers.
    pub fn from_evidence(
        score: &TokenScore,
        support: &NtdResult,
        mut count_last: impl FnMut(usize) -> Result<u64, MixError>,
    ) -> Result<Self, MixError> {
        let total: u64 = support.dist.values().sum();
        let top = support.dist.values().copied().max().unwrap_or(0);
        let mut suffix_counts = [0u64; SUFFIX_LENGTHS.len()];
        for (slot, &k) in suffix_counts.iter_mut().zip(&SUFFIX_LENGTHS) {
            *slot = match k {
                k if k > score.suffix_len => 0,
                k if k == score.suffix_len => score.prompt_cnt,
                k => count_last(k)?,
            };
        }
        Ok(Self {
            suffix_len: score.suffix_len,
            prompt_cnt: score.prompt_cnt,
            sparse: score.sparse,
            distinct: support.dist.len() as u64,
            top_prob: if total == 0 {
                0.0
            } else {
                top as f64 / total as f64
            },
            suffix_counts,
        })
    }

    /// The context after `prefix`, whose ∞-gram distribution `infgram` was looked up already (a
    /// decoding step: the next token is not known yet). An exact distribution of at most
    /// [`SUPPORT_SAMPLES`] matches is the sample itself, and a larger one's `sample` (the
    /// subsample [`Self::new`] would read, found with the exact answer) stands for it: either way
    /// the search is not repeated.
    pub fn after(
        index: &(impl ContextCounts + ?Sized),
        prefix: &[u32],
        infgram: &InfgramNtdResult,
        sample: Option<&NtdResult>,
    ) -> Result<Self, MixError> {
        let score = step_score(infgram);
        let sampled = infgram.ntd.approx || infgram.ntd.prompt_cnt > SUPPORT_SAMPLES;
        match (sampled, sample) {
            (false, _) => Self::with_support(index, prefix, &score, &infgram.ntd),
            (true, Some(sample)) => Self::with_support(index, prefix, &score, sample),
            (true, None) => Self::new(index, prefix, &score),
        }
    }

    /// Contexts of every position of a document, from its dense scores.
    pub fn for_document(
        index: &(impl ContextCounts + ?Sized),
        tokens: &[u32],
        scores: &[TokenScore],
    ) -> Result<Vec<Self>, MixError> {
        scores
            .iter()
            .enumerate()
            .map(|(i, s)| Self::new(index, &tokens[..i], s))
            .collect()
    }
}

/// What a decoding step's ∞-gram answer says of the position before its token is known, as the
/// dense score of that position would (the token's own probability and count left at 0).
pub fn step_score(infgram: &InfgramNtdResult) -> TokenScore {
    TokenScore {
        prob: 0.0,
        suffix_len: infgram.suffix_len,
        prompt_cnt: infgram.ntd.prompt_cnt,
        cont_cnt: 0,
        sparse: infgram.sparse,
    }
}

/// The gate's input vector.
pub fn gate_features(inf: &InfgramContext, nn: &NeuralContext) -> GateFeatures {
    let ln1p = |x: f64| x.ln_1p();
    let mut f = [0.0; NUM_FEATURES];
    f[0] = ln1p(inf.suffix_len as f64);
    f[1] = inf.sparse as u8 as f64;
    f[2] = ln1p(inf.prompt_cnt as f64);
    f[3] = (inf.distinct.max(1) as f64).ln();
    f[4] = inf.top_prob;
    f[5] = nn.entropy;
    f[6] = nn.top_prob;
    for (slot, &c) in f[7..].iter_mut().zip(&inf.suffix_counts) {
        *slot = ln1p(c as f64);
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::collections::BTreeMap;

    /// Counts by brute force over a token list, and how many distributions were asked for.
    struct BruteForce {
        tokens: Vec<u32>,
        ntd_calls: Cell<usize>,
    }

    impl BruteForce {
        fn ends_after(&self, ids: &[u32]) -> impl Iterator<Item = usize> + '_ {
            let ids = ids.to_vec();
            (ids.len()..=self.tokens.len())
                .filter(move |&end| self.tokens[end - ids.len()..end] == ids[..])
        }
    }

    impl ContextCounts for BruteForce {
        fn count(&self, ids: &[u32]) -> Result<u64, IndexError> {
            Ok(self.ends_after(ids).count() as u64)
        }

        fn ntd(&self, prompt: &[u32], max_support: Option<u64>) -> Result<NtdResult, IndexError> {
            self.ntd_calls.set(self.ntd_calls.get() + 1);
            let mut dist = BTreeMap::new();
            for end in self.ends_after(prompt).filter(|&e| e < self.tokens.len()) {
                *dist.entry(self.tokens[end]).or_insert(0) += 1;
            }
            let prompt_cnt = self.count(prompt)?;
            assert!(
                max_support.is_some_and(|cap| prompt_cnt <= cap),
                "only exact answers here"
            );
            Ok(NtdResult {
                prompt_cnt,
                dist,
                approx: false,
            })
        }
    }

    /// A decoding step's context reuses its exact ∞-gram distribution as the gate's sample, and
    /// comes out as the context searched afresh: at every position of a repetitive text.
    #[test]
    fn a_step_context_reuses_a_small_exact_distribution() {
        let tokens: Vec<u32> = (0..600u32).map(|i| (i * i / 7 + i / 13) % 9).collect();
        let index = BruteForce {
            tokens: tokens.clone(),
            ntd_calls: Cell::new(0),
        };
        for end in 1..tokens.len() {
            let prefix = &tokens[..end];
            let suffix_len = (1..=end.min(40))
                .take_while(|&k| index.count(&prefix[end - k..]).unwrap() > 0)
                .last()
                .unwrap_or(0);
            let matched = &prefix[end - suffix_len..];
            if index.count(matched).unwrap() > SUPPORT_SAMPLES {
                continue;
            }
            let ntd = index.ntd(matched, Some(SUPPORT_SAMPLES)).unwrap();
            let sparse = ntd.dist.len() == 1;
            let infgram = InfgramNtdResult {
                ntd,
                suffix_len,
                sparse,
            };
            let before = index.ntd_calls.get();
            let reused = InfgramContext::after(&index, prefix, &infgram, None).unwrap();
            assert_eq!(index.ntd_calls.get(), before, "at {end}: searched again");
            let searched = InfgramContext::new(&index, prefix, &step_score(&infgram)).unwrap();
            assert_eq!(reused, searched, "at {end}");
        }
    }
}
