//! What one index knows of a query, in the form several indexes' answers merge into the answer a
//! single index over all their shards gives (`cluster::merge`; the protocol is written down in
//! `cluster`). A shard server answers with these; the router merges them.

use std::collections::BTreeMap;

use crate::index::query::{Matches, Spread};
use crate::index::ranks::RankRange;
use crate::index::sampling;
use crate::index::shard::Shard;
use crate::index::suffix::longest_suffix;
use crate::index::{Index, Result};

/// One suffix array's next tokens after a prompt, in suffix-array order and run-length coded:
/// every match when it has at most the cap, else its `min(cap, matches)` fine samples
/// ([`sampling`]), from which the merge picks the ranks a single index would read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalSample {
    pub matches: u64,
    pub runs: Vec<(u32, u64)>,
}

/// One suffix array's continuations of a suffix, for drafts: `matches` in all, and the following
/// tokens of its `min(cap, matches)` fine samples, in rank order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalContinuations {
    pub matches: u64,
    pub fine: Vec<Vec<u32>>,
}

/// What followed the longest suffix of a sequence found in this index, for drafts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialDrafts {
    pub suffix_len: usize,
    /// One per suffix array, in order.
    pub suffix_arrays: Vec<LocalContinuations>,
}

/// What follows a prompt in this index, or the longest suffix of it found in this index.
#[derive(Debug, Clone, PartialEq)]
pub struct PartialContinuations {
    pub suffix_len: usize,
    pub prompt_cnt: u64,
    /// The exact distribution (asked without a cap).
    pub dist: BTreeMap<u32, u64>,
    /// Per suffix array, when asked with a cap.
    pub samples: Vec<LocalSample>,
    pub spread: Spread,
}

impl Index {
    /// What follows `prompt` (or, `infinite`, its longest suffix found here): the exact
    /// distribution, or with `max_support` every suffix array's fine samples.
    pub fn partial_continuations(
        &self,
        prompt: &[u32],
        infinite: bool,
        max_support: Option<u64>,
    ) -> Result<PartialContinuations> {
        self.check_ids(prompt)?;
        let (suffix_len, m) = match infinite {
            true => longest_suffix(self, prompt),
            false => (prompt.len(), self.locate(self.encode(prompt))),
        };
        // An exact distribution shows its spread; samples need the matches' ends read.
        let (dist, samples, spread) = match max_support {
            None => {
                let dist = self.ntd_given(&m, None)?.dist;
                let spread = Spread::of_dist(&dist);
                (dist, Vec::new(), spread)
            }
            Some(cap) => (
                BTreeMap::new(),
                self.fine_samples(&m, cap)?,
                self.spread(&m),
            ),
        };
        Ok(PartialContinuations {
            suffix_len,
            prompt_cnt: m.count(),
            dist,
            samples,
            spread,
        })
    }

    /// The counts of `prompt`'s last k tokens for each k of `lengths` up to `suffix_len` (the
    /// suffix matched here; longer ones do not occur here), in order. Ids must have been checked.
    pub fn suffix_counts(
        &self,
        prompt: &[u32],
        suffix_len: usize,
        lengths: &[usize],
    ) -> Result<Vec<u64>> {
        lengths
            .iter()
            .filter(|&&k| k <= suffix_len.min(prompt.len()))
            .map(|&k| self.count(&prompt[prompt.len() - k..]))
            .collect()
    }

    /// Every suffix array's fine samples (under `cap`) of what followed the last `len` tokens of
    /// `prefix`: what the gate's support estimate of a position needs from this index. Ids must
    /// have been checked.
    pub fn support(&self, prefix: &[u32], len: usize, cap: u64) -> Result<Vec<LocalSample>> {
        let len = len.min(prefix.len());
        let m = self.locate(self.encode(&prefix[prefix.len() - len..]));
        self.fine_samples(&m, cap)
    }

    /// What followed the longest suffix of `prompt` found here, for drafts: its length and count,
    /// and every suffix array's fine samples under `cap`, each with up to `depth` following tokens
    /// ([`crate::index::suffix::SuffixMatch::continuations`] reads the picks among them).
    pub fn partial_drafts(&self, prompt: &[u32], cap: u64, depth: usize) -> Result<PartialDrafts> {
        self.check_ids(prompt)?;
        let (suffix_len, m) = longest_suffix(self, prompt);
        let suffix_arrays = self
            .shards
            .iter()
            .zip(&m.ranges)
            .map(|(shard, range)| {
                let fine = range.len().min(cap);
                LocalContinuations {
                    matches: range.len(),
                    fine: match suffix_len {
                        0 => Vec::new(),
                        _ => (0..fine)
                            .map(|k| {
                                let rank = range.lo + sampling::fine_offset(k, range.len(), fine);
                                self.continuation_at(shard, rank, m.bytes.len(), depth)
                            })
                            .collect(),
                    },
                }
            })
            .collect();
        Ok(PartialDrafts {
            suffix_len,
            suffix_arrays,
        })
    }

    fn fine_samples(&self, m: &Matches, cap: u64) -> Result<Vec<LocalSample>> {
        self.shards
            .iter()
            .zip(&m.ranges)
            .map(|(shard, &range)| {
                Ok(LocalSample {
                    matches: range.len(),
                    runs: self.ordered_next_tokens(shard, range, m.bytes.len(), cap)?,
                })
            })
            .collect()
    }

    /// The next tokens of `range`'s fine samples under `cap`, run-length coded in rank order.
    fn ordered_next_tokens(
        &self,
        shard: &Shard,
        range: RankRange,
        query_bytes: usize,
        cap: u64,
    ) -> Result<Vec<(u32, u64)>> {
        let keys: Vec<(u64, u64)> = if range.len() <= cap {
            let mut runs = Vec::new();
            crate::index::next_tokens::ordered_runs(shard, range, query_bytes, &mut runs)?;
            runs
        } else {
            (0..cap)
                .map(|k| {
                    let rank = range.lo + sampling::fine_offset(k, range.len(), cap);
                    (shard.next_key(rank, query_bytes), 1)
                })
                .collect()
        };
        let mut runs: Vec<(u32, u64)> = Vec::new();
        for (key, n) in keys {
            let token = self.token_of(key);
            match runs.last_mut() {
                Some((last, count)) if *last == token => *count += n,
                _ => runs.push((token, n)),
            }
        }
        Ok(runs)
    }
}
