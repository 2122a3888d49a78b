//! The answers of n-gram and ∞-gram queries, which every kind of index gives (each kind's own
//! queries: `read::query` over suffix arrays, `fm::query` over compressed parts), and the checks of
//! a query's ids.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::index::{IndexError, Result};

/// Longest query accepted, in tokens: far beyond any useful n, small enough to bound the work.
pub const MAX_QUERY_TOKENS: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FindResult {
    pub cnt: u64,
    /// Half-open rank range per part.
    pub segment_by_shard: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbResult {
    pub prompt_cnt: u64,
    pub cont_cnt: u64,
    /// cont_cnt / prompt_cnt, or -1 when the prompt never occurs.
    pub prob: f64,
}

impl ProbResult {
    /// `cont_cnt / prompt_cnt`, or -1 for a prompt that never occurs.
    pub fn of_counts(prompt_cnt: u64, cont_cnt: u64) -> Self {
        let prob = if prompt_cnt == 0 {
            -1.0
        } else {
            cont_cnt as f64 / prompt_cnt as f64
        };
        ProbResult {
            prompt_cnt,
            cont_cnt,
            prob,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NtdResult {
    pub prompt_cnt: u64,
    /// Next token id → count (exact), or → number of samples (`approx`).
    pub dist: BTreeMap<u32, u64>,
    /// True when the distribution was estimated from a subsample of at most `max_support` matches.
    pub approx: bool,
}

impl NtdResult {
    /// Probability of `token` under the distribution (counts normalised by their sum).
    pub fn prob_of(&self, token: u32) -> f64 {
        let total: u64 = self.dist.values().sum();
        if total == 0 {
            return 0.0;
        }
        self.dist.get(&token).copied().unwrap_or(0) as f64 / total as f64
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InfgramProbResult {
    #[serde(flatten)]
    pub prob: ProbResult,
    /// Length of the longest suffix of the prompt that occurs in the corpus (effective n − 1).
    pub suffix_len: usize,
    /// The ∞-gram distribution has a single possible next token.
    pub sparse: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InfgramNtdResult {
    #[serde(flatten)]
    pub ntd: NtdResult,
    pub suffix_len: usize,
    pub sparse: bool,
}

impl InfgramNtdResult {
    /// The ∞-gram answer of a suffix of `suffix_len` tokens whose distribution is `ntd`; a
    /// subsample cannot tell sparseness, which `sparse` then works out from the matches.
    pub fn new(ntd: NtdResult, suffix_len: usize, sparse: impl FnOnce() -> bool) -> Self {
        let sparse = if ntd.approx {
            sparse()
        } else {
            ntd.dist.len() == 1
        };
        InfgramNtdResult {
            ntd,
            suffix_len,
            sparse,
        }
    }
}

/// Rejects ids outside a vocabulary of `vocab_size` and queries beyond `MAX_QUERY_TOKENS`.
pub fn check_vocabulary(ids: &[u32], vocab_size: u64) -> Result<()> {
    if ids.len() > MAX_QUERY_TOKENS {
        return Err(IndexError::Invalid(format!(
            "query of {} tokens exceeds the limit of {MAX_QUERY_TOKENS}",
            ids.len()
        )));
    }
    if let Some(bad) = ids.iter().find(|&&id| id as u64 >= vocab_size) {
        return Err(IndexError::Invalid(format!(
            "token id {bad} is outside the vocabulary (size {vocab_size})"
        )));
    }
    Ok(())
}

/// Which tokens follow the matches of a prompt: none (no match), a single one, or several; found
/// with O(1) reads per part (paper App. A), and merged over parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    None,
    Single(u32),
    Several,
}

impl Spread {
    /// What follows the matches of two sets of parts together.
    pub fn merge(self, other: Spread) -> Spread {
        match (self, other) {
            (Spread::None, x) | (x, Spread::None) => x,
            (Spread::Single(a), Spread::Single(b)) if a == b => Spread::Single(a),
            _ => Spread::Several,
        }
    }

    /// The spread of an exact distribution: what its tokens are, no read needed.
    pub fn of_dist(dist: &BTreeMap<u32, u64>) -> Spread {
        let mut tokens = dist.keys();
        match (tokens.next(), tokens.next()) {
            (None, _) => Spread::None,
            (Some(&t), None) => Spread::Single(t),
            _ => Spread::Several,
        }
    }

    /// The ∞-gram distribution has one possible next token.
    pub fn is_sparse(self) -> bool {
        matches!(self, Spread::Single(_))
    }
}
