//! Dense ∞-gram scoring of a whole sequence: for every position, the ∞-gram probability of the token
//! that is there, with the features the mixing gate needs.
//!
//! The effective n of position i+1 is at most that of position i plus one (App. A), so each step starts
//! from the previous match and only shrinks; when the previous continuation occurred, its matches are
//! exactly the next prompt's and cost nothing. Amortised O(log N) per token.

use serde::Serialize;

use crate::index::query::Matches;
use crate::index::{Index, Result};

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

impl Index {
    /// Scores every token of `ids` given all tokens before it.
    pub fn score(&self, ids: &[u32]) -> Result<Vec<TokenScore>> {
        self.check_ids(ids)?;
        let eos = self.eos_token_id();
        let mut out = Vec::with_capacity(ids.len());
        // Invariant: `prompt` holds the matches of ids[i - len .. i], which occur in the corpus.
        let (mut len, mut prompt) = (0usize, self.everything());
        for (i, &token) in ids.iter().enumerate() {
            let prompt_cnt = prompt.count();
            let extended = self.extend(&prompt, token);
            let cont_cnt = if token == eos {
                self.cont_count(&prompt, token)
            } else {
                extended.count()
            };
            out.push(TokenScore {
                prob: cont_cnt as f64 / prompt_cnt as f64,
                suffix_len: len,
                prompt_cnt,
                cont_cnt,
                sparse: self.is_sparse(&prompt),
            });
            if extended.count() > 0 {
                (len, prompt) = (len + 1, extended);
            } else {
                (len, prompt) = self.shrink_to_match(&ids[..=i], len);
            }
        }
        Ok(out)
    }

    /// The longest suffix of `seq` of at most `max_len` tokens that occurs in the corpus. Counts only
    /// shrink as a suffix grows, so the length is found by binary search.
    fn shrink_to_match(&self, seq: &[u32], max_len: usize) -> (usize, Matches) {
        let n = seq.len();
        let (mut good, mut good_m) = (0usize, self.everything());
        let mut bad = max_len.min(n) + 1;
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            let m = self.locate(self.encode(&seq[n - mid..]), None);
            if m.count() > 0 {
                (good, good_m) = (mid, m);
            } else {
                bad = mid;
            }
        }
        (good, good_m)
    }
}
