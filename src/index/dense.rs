//! Dense ∞-gram scoring of a whole sequence: for every position, the ∞-gram probability of the token
//! that is there, with the features the mixing gate needs.
//!
//! The suffix match advances one token at a time ([`SuffixMatch`]): when the previous continuation
//! occurred, its matches are exactly the next prompt's and cost nothing. Amortised O(log N) per token.

use serde::Serialize;

use crate::index::query::Spread;
use crate::index::suffix::{Occurrences, SuffixMatch};
use crate::index::{Index, IndexError, Result};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenScore {
    /// ∞-gram probability of the actual token (0 when it never followed the matched suffix).
    pub prob: f64,
    /// Length of the longest suffix of the preceding tokens found in the corpus (effective n − 1).
    pub suffix_len: usize,
    pub prompt_cnt: u64,
    pub cont_cnt: u64,
    pub sparse: bool,
}

/// What one index knows of a position before its token: its own longest matching suffix, and
/// counts there. Several indexes' evidence merges into a [`TokenScore`] (`cluster::merge`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenEvidence {
    pub suffix_len: usize,
    pub prompt_cnt: u64,
    pub cont_cnt: u64,
    pub spread: Spread,
}

impl TokenEvidence {
    pub fn score(&self) -> TokenScore {
        TokenScore {
            prob: self.cont_cnt as f64 / self.prompt_cnt as f64,
            suffix_len: self.suffix_len,
            prompt_cnt: self.prompt_cnt,
            cont_cnt: self.cont_cnt,
            sparse: self.spread.is_sparse(),
        }
    }
}

impl Index {
    /// Scores every token of `ids` given all tokens before it; stops when interrupted (checked per
    /// token: each costs a few suffix-array searches).
    pub fn score(&self, ids: &[u32]) -> Result<Vec<TokenScore>> {
        score(self, ids)
    }
}

/// Every token's dense score given all tokens before it.
pub fn score<I: Occurrences + ?Sized>(index: &I, ids: &[u32]) -> Result<Vec<TokenScore>> {
    Ok(evidence(index, ids)?
        .iter()
        .map(TokenEvidence::score)
        .collect())
}

/// What [`score`] knows of each token of `ids`, before it is merged into a score; stops when
/// interrupted.
pub fn evidence<I: Occurrences + ?Sized>(index: &I, ids: &[u32]) -> Result<Vec<TokenEvidence>> {
    index.check_query(ids)?;
    let eos = index.eos_token_id();
    let mut out = Vec::with_capacity(ids.len());
    let mut state = SuffixMatch::new(index);
    for (i, &token) in ids.iter().enumerate() {
        if crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted);
        }
        let (suffix_len, prompt_cnt) = (state.suffix_len(), state.prompt_cnt());
        let spread = index.spread(state.matches());
        // Separators and part ends also count as eos, beyond the literal token.
        let eos_cnt = (token == eos).then(|| index.cont_count(state.matches(), token));
        let followed = state.advance(index, &ids[..=i]);
        out.push(TokenEvidence {
            suffix_len,
            prompt_cnt,
            cont_cnt: eos_cnt.unwrap_or(followed),
            spread,
        });
    }
    Ok(out)
}
