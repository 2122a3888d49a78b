//! n-gram and ∞-gram queries over the compressed parts, answered as `index::query` answers them
//! over suffix arrays: counts add up over parts, separators and part ends count as eos.
//!
//! A subsampled distribution (`max_support`) is the suffix array's own: it reads the tokens at
//! evenly spread ranks of a range sorted by what follows, and the exact counts in that order
//! say which token sits at each such rank, so the same samples come out without reading a rank.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::index::fm::part::FmPart;
use crate::index::fm::CompressedIndex;
use crate::index::query::{NtdResult, Spread};
use crate::index::ranks::RankRange;
use crate::index::read::next_tokens::token_of_key;
use crate::index::read::part::NextKey;
use crate::index::sampling;
use crate::index::suffix::{Counted, Occurrences};
use crate::index::Result;

/// One query's rows in every part, with its length in tokens (the empty query's rows hold the
/// parts' ends, which it does not count).
#[derive(Clone)]
pub struct FmMatches {
    pub(crate) ranges: Vec<RankRange>,
    pub(crate) tokens: usize,
}

impl Counted for FmMatches {
    fn count(&self) -> u64 {
        let ends = if self.tokens == 0 {
            self.ranges.len()
        } else {
            0
        };
        self.ranges.iter().map(|r| r.len()).sum::<u64>() - ends as u64
    }
    fn rank_ranges(&self) -> &[RankRange] {
        &self.ranges
    }
}

/// One part's next tokens of a range as the suffix array orders the same matches (by what
/// follows), counted: the token at any rank of the suffix array's range, without reading a rank.
pub(crate) struct SuffixOrdered {
    counts: Vec<(NextKey, u64)>,
    run: usize,
    run_start: u64,
}

impl SuffixOrdered {
    /// Matches in the range (the empty query's leave the part's end out).
    pub(crate) fn len(&self) -> u64 {
        self.counts.iter().map(|&(_, n)| n).sum()
    }

    /// `(next key, count)` runs in order.
    pub(crate) fn runs(&self) -> &[(NextKey, u64)] {
        &self.counts
    }

    /// The next key at `offset` into the range, and the offset among the matches it follows.
    /// Offsets must ascend from one call to the next and stay below [`Self::len`].
    pub(crate) fn at(&mut self, offset: u64) -> (NextKey, u64) {
        while offset >= self.run_start + self.counts[self.run].1 {
            self.run_start += self.counts[self.run].1;
            self.run += 1;
        }
        (self.counts[self.run].0, offset - self.run_start)
    }
}

impl Occurrences for CompressedIndex {
    type Matches = FmMatches;
    fn eos_token_id(&self) -> u32 {
        self.eos_token_id
    }
    fn vocab_size(&self) -> u64 {
        CompressedIndex::vocab_size(self)
    }
    fn check_query(&self, ids: &[u32]) -> Result<()> {
        self.check_ids(ids)
    }
    fn matches_of(&self, ids: &[u32]) -> FmMatches {
        self.locate(ids)
    }
    fn grow_matches(&self, m: &mut FmMatches, token: u32) {
        *m = self.extend(m, token)
    }
    fn cont_count(&self, m: &FmMatches, token: u32) -> u64 {
        CompressedIndex::cont_count(self, m, token)
    }
    fn spread(&self, m: &FmMatches) -> Spread {
        CompressedIndex::spread(self, m)
    }
    fn next_counts(&self, m: &FmMatches) -> Result<Cow<'_, BTreeMap<u32, u64>>> {
        Ok(Cow::Owned(self.ntd_given(m, None).dist))
    }
    fn ntd_given(&self, m: &FmMatches, max_support: Option<u64>) -> Result<NtdResult> {
        Ok(CompressedIndex::ntd_given(self, m, max_support))
    }
}

impl CompressedIndex {
    pub(crate) fn token_of(&self, key: NextKey) -> u32 {
        token_of_key(key, self.width.separator(), self.eos_token_id)
    }

    /// The rows of `ids` in every part, read left to right.
    pub fn locate(&self, ids: &[u32]) -> FmMatches {
        FmMatches {
            ranges: FmPart::find_all(&self.parts, ids),
            tokens: ids.len(),
        }
    }

    /// The matches of `m` followed by `token`: one LF step a part.
    pub(crate) fn extend(&self, m: &FmMatches, token: u32) -> FmMatches {
        let mut ranges = m.ranges.clone();
        FmPart::extend_all(&self.parts, &mut ranges, token);
        FmMatches {
            ranges,
            tokens: m.tokens + 1,
        }
    }

    /// How often the matches are followed by `cont`, separators and part ends counting as eos.
    pub(crate) fn cont_count(&self, m: &FmMatches, cont: u32) -> u64 {
        let separator = self.width.separator();
        let followed_by = |token: u32| self.extend(m, token).count();
        let mut total = followed_by(cont);
        if cont == self.eos_token_id {
            if separator != cont {
                total += followed_by(separator);
            }
            let ends = self.parts.iter().zip(&m.ranges);
            total += ends
                .filter(|&(part, &range)| m.tokens > 0 && part.holds_end(range))
                .count() as u64;
        }
        total
    }

    /// One part's next-token counts of its rows `range` (the part's end left out for the
    /// empty query, which counts tokens), at least `limit` of them when there are more.
    fn part_counts(
        &self,
        s: usize,
        range: RankRange,
        m: &FmMatches,
        limit: usize,
    ) -> Vec<(NextKey, u64)> {
        let mut counts = Vec::new();
        self.parts[s].next_counts(range, limit, &mut counts);
        if m.tokens == 0 {
            counts.retain(|&(key, _)| key != crate::index::read::part::END);
        }
        counts
    }

    /// Part `s`'s next tokens of its rows `range` of `m`, in the suffix array's order.
    pub(crate) fn suffix_ordered(
        &self,
        s: usize,
        range: RankRange,
        m: &FmMatches,
    ) -> SuffixOrdered {
        let mut counts = self.part_counts(s, range, m, usize::MAX);
        self.parts[s].suffix_order(&mut counts);
        SuffixOrdered {
            counts,
            run: 0,
            run_start: 0,
        }
    }

    pub(crate) fn ntd_given(&self, m: &FmMatches, max_support: Option<u64>) -> NtdResult {
        let prompt_cnt = m.count();
        let approx = max_support.is_some_and(|cap| prompt_cnt > cap);
        let mut dist = BTreeMap::new();
        for (s, &range) in m.ranges.iter().enumerate() {
            match max_support {
                Some(cap) if approx => {
                    // The suffix array's samples: ranks spread over the range in its order.
                    let mut ordered = self.suffix_ordered(s, range, m);
                    let len = ordered.len();
                    for offset in sampling::offsets(len, cap, sampling::share(cap, len, prompt_cnt))
                    {
                        *dist.entry(self.token_of(ordered.at(offset).0)).or_insert(0) += 1;
                    }
                }
                _ => {
                    for (key, n) in self.part_counts(s, range, m, usize::MAX) {
                        *dist.entry(self.token_of(key)).or_insert(0) += n;
                    }
                }
            }
        }
        NtdResult {
            prompt_cnt,
            dist,
            approx,
        }
    }

    /// Which tokens follow the matches: none, one or several (reading at most a few symbols a
    /// part, as separators, part ends and eos all mean eos).
    pub(crate) fn spread(&self, m: &FmMatches) -> Spread {
        let mut spread = Spread::None;
        for (s, &range) in m.ranges.iter().enumerate() {
            for (key, _) in self.part_counts(s, range, m, 4) {
                spread = spread.merge(Spread::Single(self.token_of(key)));
            }
            if spread == Spread::Several {
                break;
            }
        }
        spread
    }
}
