//! The longest matching suffix of a growing sequence over a compressed index, as
//! `index::suffix` keeps it over suffix arrays: a token appended is one LF step when the match
//! grows, a binary search over shorter suffixes when it does not. Dense scores, sessions and
//! drafts stand on it.

use crate::index::dense::TokenScore;
use crate::index::fm::query::FmMatches;
use crate::index::fm::CompressedIndex;
use crate::index::query::InfgramNtdResult;
use crate::index::sampling;
use crate::index::shard::END;
use crate::index::{IndexError, Result};

/// The longest suffix of a sequence that occurs in a compressed index, with its matches.
#[derive(Clone)]
pub struct FmSuffixMatch {
    /// `lens[i]`: the match length after the first `i` tokens.
    lens: Vec<u32>,
    matches: FmMatches,
}

impl FmSuffixMatch {
    pub fn new(index: &CompressedIndex) -> Self {
        Self {
            lens: vec![0],
            matches: index.locate(&[]),
        }
    }

    /// The match of `seq`, built one token at a time.
    pub fn of(index: &CompressedIndex, seq: &[u32]) -> Result<Self> {
        index.check_ids(seq)?;
        let mut m = Self::new(index);
        for end in 1..=seq.len() {
            m.advance(index, &seq[..end]);
        }
        Ok(m)
    }

    pub fn suffix_len(&self) -> usize {
        self.lens.last().copied().unwrap_or(0) as usize
    }

    pub fn prompt_cnt(&self) -> u64 {
        self.matches.count()
    }

    /// Takes in the last token of `seq` (the whole sequence so far). Returns how often the old
    /// suffix was followed by that literal token. Ids must have been checked.
    pub fn advance(&mut self, index: &CompressedIndex, seq: &[u32]) -> u64 {
        let Some(&token) = seq.last() else {
            return 0;
        };
        let len = self.suffix_len();
        let extended = index.extend(&self.matches, token);
        let followed = extended.count();
        let new_len = if followed > 0 {
            self.matches = extended;
            len + 1
        } else {
            let (l, m) = index.longest_suffix(seq, len);
            self.matches = m;
            l
        };
        self.lens.push(new_len as u32);
        followed
    }

    /// Forgets every token past `seq.len()` (`seq` is the sequence truncated).
    pub fn truncate(&mut self, index: &CompressedIndex, seq: &[u32]) {
        if seq.len() + 1 >= self.lens.len() {
            return;
        }
        self.lens.truncate(seq.len() + 1);
        let len = self.suffix_len();
        self.matches = index.locate(&seq[seq.len() - len..]);
    }

    pub fn infgram_ntd(
        &self,
        index: &CompressedIndex,
        max_support: Option<u64>,
    ) -> InfgramNtdResult {
        index.infgram_ntd_given(self.suffix_len(), &self.matches, max_support)
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
        let total = self.matches.count();
        if self.suffix_len() == 0 || total == 0 || samples == 0 {
            return Vec::new();
        }
        let (separator, eos) = (index.width.separator(), index.eos_token_id);
        let stop = |t: u32| t == separator || t == eos;
        let cap = samples as u64;
        let mut out = Vec::new();
        for (shard, &range) in index.shards.iter().zip(&self.matches.ranges) {
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
            let sparse = self.spread(&state.matches).is_sparse();
            // Separators and shard ends also count as eos, beyond the literal token.
            let eos_cnt =
                (token == self.eos_token_id).then(|| self.cont_count(&state.matches, token));
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
