//! Following a sequence over a compressed index (`index::suffix`'s [`SuffixMatch`] over its
//! rows: a token appended is one LF step when the match grows): the ∞-gram after it, what
//! followed its match (drafts), and dense scores.

use crate::index::dense::TokenScore;
use crate::index::fm::query::FmMatches;
use crate::index::fm::CompressedIndex;
use crate::index::query::InfgramNtdResult;
use crate::index::sampling;
use crate::index::shard::END;
use crate::index::suffix::SuffixMatch;
use crate::index::{IndexError, Result};

/// The longest suffix of a sequence that occurs in a compressed index, with its matches.
pub type FmSuffixMatch = SuffixMatch<FmMatches>;

impl SuffixMatch<FmMatches> {
    pub fn infgram_ntd(
        &self,
        index: &CompressedIndex,
        max_support: Option<u64>,
    ) -> InfgramNtdResult {
        index.infgram_ntd_given(self.suffix_len(), self.matches(), max_support)
    }

    /// What followed the matched suffix: up to `samples` occurrences, each with at most `depth`
    /// following tokens cut at the end of its document. The suffix array's samples sit at
    /// evenly spread ranks of a range sorted by what follows; here each takes the first token
    /// at that rank (so first tokens come in the suffix array's proportions, exactly), then one
    /// occurrence of it, read on by LF steps.
    pub fn continuations(
        &self,
        index: &CompressedIndex,
        samples: usize,
        depth: usize,
    ) -> Vec<Vec<u32>> {
        let total = self.prompt_cnt();
        if self.suffix_len() == 0 || total == 0 || samples == 0 {
            return Vec::new();
        }
        let (separator, eos) = (index.width.separator(), index.eos_token_id);
        let stop = |t: u32| t == separator || t == eos;
        let cap = samples as u64;
        let mut out = Vec::new();
        for (shard, &range) in index.shards.iter().zip(&self.matches().ranges) {
            let mut counts = Vec::new();
            shard.next_counts(range, usize::MAX, &mut counts);
            shard.suffix_order(&mut counts);
            let len = range.len();
            let (mut run, mut run_start) = (0usize, 0u64);
            for offset in sampling::offsets(len, cap, sampling::share(cap, len, total)) {
                while offset >= run_start + counts[run].1 {
                    run_start += counts[run].1;
                    run += 1;
                }
                let key = counts[run].0;
                if depth == 0 || key == END || stop(key as u32) {
                    out.push(Vec::new());
                    continue;
                }
                let token = key as u32;
                let row = shard.extend(range, token).lo + (offset - run_start);
                let mut continuation = vec![token];
                continuation.extend(shard.following(row, depth - 1, stop));
                out.push(continuation);
            }
        }
        out
    }
}

impl CompressedIndex {
    /// Scores every token of `ids` given all tokens before it, as [`crate::index::Index::score`]
    /// does; stops when interrupted.
    pub fn score(&self, ids: &[u32]) -> Result<Vec<TokenScore>> {
        self.check_ids(ids)?;
        let mut out = Vec::with_capacity(ids.len());
        let mut state = FmSuffixMatch::new(self);
        for (i, &token) in ids.iter().enumerate() {
            if crate::interrupt::interrupted() {
                return Err(IndexError::Interrupted);
            }
            let (suffix_len, prompt_cnt) = (state.suffix_len(), state.prompt_cnt());
            let sparse = self.spread(state.matches()).is_sparse();
            // Separators and shard ends also count as eos, beyond the literal token.
            let eos_cnt =
                (token == self.eos_token_id).then(|| self.cont_count(state.matches(), token));
            let followed = state.advance(self, &ids[..=i]);
            let cont_cnt = eos_cnt.unwrap_or(followed);
            out.push(TokenScore {
                prob: cont_cnt as f64 / prompt_cnt as f64,
                suffix_len,
                prompt_cnt,
                cont_cnt,
                sparse,
            });
        }
        Ok(out)
    }
}
