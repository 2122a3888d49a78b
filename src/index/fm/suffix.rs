//! Following a sequence over a compressed index (`index::suffix`'s [`SuffixMatch`] over its
//! rows: a token appended is one LF step when the match grows): the ∞-gram after it, what
//! followed its match (drafts), and dense scores.

use crate::index::dense::TokenScore;
use crate::index::fm::part::FmPart;
use crate::index::fm::query::{FmMatches, SuffixOrdered};
use crate::index::fm::CompressedIndex;
use crate::index::ranks::RankRange;
use crate::index::read::part::END;
use crate::index::sampling;
use crate::index::suffix::SuffixMatch;
use crate::index::Result;

/// The longest suffix of a sequence that occurs in a compressed index, with its matches.
pub type FmSuffixMatch = SuffixMatch<FmMatches>;

impl SuffixMatch<FmMatches> {
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
        let cap = samples as u64;
        let mut out = Vec::new();
        let ranges = &self.matches().ranges;
        for (s, (part, &range)) in index.parts.iter().zip(ranges).enumerate() {
            let mut ordered = index.suffix_ordered(s, range, self.matches());
            let len = ordered.len();
            for offset in sampling::offsets(len, cap, sampling::share(cap, len, total)) {
                out.push(index.continuation_at(part, range, &mut ordered, offset, depth));
            }
        }
        out
    }
}

impl CompressedIndex {
    /// The up to `depth` tokens after the match at `offset` into `range` in the suffix array's
    /// order, cut at the end of its document: the first token there exactly, the rest read on
    /// from one occurrence of it by LF steps.
    pub(crate) fn continuation_at(
        &self,
        part: &FmPart,
        range: RankRange,
        ordered: &mut SuffixOrdered,
        offset: u64,
        depth: usize,
    ) -> Vec<u32> {
        let (separator, eos) = (self.width.separator(), self.eos_token_id);
        let stop = |t: u32| t == separator || t == eos;
        let (key, within) = ordered.at(offset);
        if depth == 0 || key == END || stop(key as u32) {
            return Vec::new();
        }
        let token = key as u32;
        let row = part.extend(range, token).lo + within;
        let mut continuation = vec![token];
        continuation.extend(part.following(row, depth - 1, stop));
        continuation
    }

    /// Scores every token of `ids` given all tokens before it, as [`crate::index::Index::score`]
    /// does; stops when interrupted.
    pub fn score(&self, ids: &[u32]) -> Result<Vec<TokenScore>> {
        crate::index::dense::score(self, ids)
    }
}
