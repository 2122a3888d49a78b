//! n-gram and ∞-gram queries over the compressed shards, answered as `index::query` answers them
//! over suffix arrays: counts add up over shards, separators and shard ends count as eos.
//!
//! A subsampled distribution (`max_support`) is the suffix array's own: it reads the tokens at
//! evenly spread ranks of a range sorted by what follows, and the exact counts in that order
//! say which token sits at each such rank, so the same samples come out without reading a rank.

use std::collections::BTreeMap;

use crate::index::fm::CompressedIndex;
use crate::index::next_tokens::token_of_key;
use crate::index::query::{
    FindResult, InfgramNtdResult, InfgramProbResult, NtdResult, ProbResult, Spread,
};
use crate::index::ranks::RankRange;
use crate::index::sampling;
use crate::index::shard::NextKey;
use crate::index::suffix::{longest_suffix, Counted, Occurrences};
use crate::index::Result;

/// One query's rows in every shard, with its length in tokens (the empty query's rows hold the
/// shards' ends, which it does not count).
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
}

impl Occurrences for CompressedIndex {
    type Matches = FmMatches;
    fn check_query(&self, ids: &[u32]) -> Result<()> {
        self.check_ids(ids)
    }
    fn matches_of(&self, ids: &[u32]) -> FmMatches {
        self.locate(ids)
    }
    fn grow_matches(&self, m: &mut FmMatches, token: u32) {
        *m = self.extend(m, token)
    }
}

impl CompressedIndex {
    pub(crate) fn token_of(&self, key: NextKey) -> u32 {
        token_of_key(key, self.width.separator(), self.eos_token_id)
    }

    /// The rows of `ids` in every shard, read left to right.
    pub fn locate(&self, ids: &[u32]) -> FmMatches {
        FmMatches {
            ranges: self.shards.iter().map(|s| s.find(ids)).collect(),
            tokens: ids.len(),
        }
    }

    /// The matches of `m` followed by `token`: one LF step a shard.
    pub(crate) fn extend(&self, m: &FmMatches, token: u32) -> FmMatches {
        FmMatches {
            ranges: self
                .shards
                .iter()
                .zip(&m.ranges)
                .map(|(s, &r)| s.extend(r, token))
                .collect(),
            tokens: m.tokens + 1,
        }
    }

    /// Rank ranges are this index's rows, not the suffix array's (their lengths agree).
    pub fn find(&self, ids: &[u32]) -> Result<FindResult> {
        self.check_ids(ids)?;
        let m = self.locate(ids);
        Ok(FindResult {
            cnt: m.count(),
            segment_by_shard: m.ranges.iter().map(|r| (r.lo, r.hi)).collect(),
        })
    }

    pub fn count(&self, ids: &[u32]) -> Result<u64> {
        self.check_ids(ids)?;
        Ok(self.locate(ids).count())
    }

    pub fn prob(&self, prompt: &[u32], cont: u32) -> Result<ProbResult> {
        self.check_ids(prompt)?;
        self.check_ids(&[cont])?;
        Ok(self.prob_given(&self.locate(prompt), cont))
    }

    /// How often the matches are followed by `cont`, separators and shard ends counting as eos.
    pub(crate) fn cont_count(&self, m: &FmMatches, cont: u32) -> u64 {
        let separator = self.width.separator();
        let mut total = 0;
        for (shard, &range) in self.shards.iter().zip(&m.ranges) {
            total += shard.extend(range, cont).len();
            if cont == self.eos_token_id {
                if separator != cont {
                    total += shard.extend(range, separator).len();
                }
                total += u64::from(m.tokens > 0 && shard.holds_end(range));
            }
        }
        total
    }

    pub(crate) fn prob_given(&self, m: &FmMatches, cont: u32) -> ProbResult {
        ProbResult::of_counts(m.count(), self.cont_count(m, cont))
    }

    /// One shard's next-token counts of its rows `range` (the shard's end left out for the
    /// empty query, which counts tokens), at least `limit` of them when there are more.
    fn shard_counts(
        &self,
        s: usize,
        range: RankRange,
        m: &FmMatches,
        limit: usize,
    ) -> Vec<(NextKey, u64)> {
        let mut counts = Vec::new();
        self.shards[s].next_counts(range, limit, &mut counts);
        if m.tokens == 0 {
            counts.retain(|&(key, _)| key != crate::index::shard::END);
        }
        counts
    }

    pub fn ntd(&self, prompt: &[u32], max_support: Option<u64>) -> Result<NtdResult> {
        self.check_ids(prompt)?;
        Ok(self.ntd_given(&self.locate(prompt), max_support))
    }

    pub(crate) fn ntd_given(&self, m: &FmMatches, max_support: Option<u64>) -> NtdResult {
        let prompt_cnt = m.count();
        let approx = max_support.is_some_and(|cap| prompt_cnt > cap);
        let mut dist = BTreeMap::new();
        for (s, &range) in m.ranges.iter().enumerate() {
            let mut counts = self.shard_counts(s, range, m, usize::MAX);
            match max_support {
                Some(cap) if approx => {
                    // The suffix array's samples: ranks spread over the range in its order.
                    self.shards[s].suffix_order(&mut counts);
                    let len: u64 = counts.iter().map(|&(_, n)| n).sum();
                    let (mut run, mut run_end) = (0, counts.first().map_or(0, |c| c.1));
                    for offset in sampling::offsets(len, cap, sampling::share(cap, len, prompt_cnt))
                    {
                        while offset >= run_end {
                            run += 1;
                            run_end += counts[run].1;
                        }
                        *dist.entry(self.token_of(counts[run].0)).or_insert(0) += 1;
                    }
                }
                _ => {
                    for (key, n) in counts {
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
    /// shard, as separators, shard ends and eos all mean eos).
    pub(crate) fn spread(&self, m: &FmMatches) -> Spread {
        let mut spread = Spread::None;
        for (s, &range) in m.ranges.iter().enumerate() {
            for (key, _) in self.shard_counts(s, range, m, 4) {
                spread = spread.merge(Spread::Single(self.token_of(key)));
            }
            if spread == Spread::Several {
                break;
            }
        }
        spread
    }

    pub fn infgram_prob(&self, prompt: &[u32], cont: u32) -> Result<InfgramProbResult> {
        self.check_ids(prompt)?;
        self.check_ids(&[cont])?;
        let (suffix_len, m) = longest_suffix(self, prompt);
        Ok(InfgramProbResult {
            prob: self.prob_given(&m, cont),
            suffix_len,
            sparse: self.spread(&m).is_sparse(),
        })
    }

    pub fn infgram_ntd(
        &self,
        prompt: &[u32],
        max_support: Option<u64>,
    ) -> Result<InfgramNtdResult> {
        self.check_ids(prompt)?;
        let (suffix_len, m) = longest_suffix(self, prompt);
        Ok(self.infgram_ntd_given(suffix_len, &m, max_support))
    }

    pub(crate) fn infgram_ntd_given(
        &self,
        suffix_len: usize,
        m: &FmMatches,
        max_support: Option<u64>,
    ) -> InfgramNtdResult {
        let ntd = self.ntd_given(m, max_support);
        InfgramNtdResult::new(ntd, suffix_len, || self.spread(m).is_sparse())
    }
}
