//! What one index knows of a query, in the form several indexes' answers merge into the answer a
//! single index over all their shards gives (`cluster::merge`; the protocol is written down in
//! `cluster`). A shard server answers with these; the router merges them.

use std::collections::BTreeMap;

use crate::index::query::{Matches, Spread};
use crate::index::sampling;
use crate::index::shard::{RankRange, Shard};
use crate::index::{Index, Result};

/// One suffix array's next tokens after a prompt, in suffix-array order and run-length coded:
/// every match when it has at most the cap, else its `min(cap, matches)` fine samples
/// ([`sampling`]), from which the merge picks the ranks a single index would read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalSample {
    pub matches: u64,
    pub runs: Vec<(u32, u64)>,
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
            true => self.longest_suffix(prompt),
            false => (prompt.len(), self.locate(self.encode(prompt), None)),
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
