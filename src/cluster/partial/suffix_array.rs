//! A suffix-array index's answers to a router, part by part: each suffix array's fine samples and
//! continuations read at their ranks.

use xxhash_rust::xxh3::Xxh3;

use super::{run_length, LocalContinuations, LocalParts, LocalSample};
use crate::index::format::ShardSetRecord;
use crate::index::ranks::RankRange;
use crate::index::read::part::Part;
use crate::index::read::query::Matches;
use crate::index::sampling;
use crate::index::{Index, Result};

impl LocalParts for Index {
    fn fine_samples(&self, m: &Matches, cap: u64) -> Result<Vec<LocalSample>> {
        self.parts
            .iter()
            .zip(&m.ranges)
            .map(|(part, &range)| {
                Ok(LocalSample {
                    matches: range.len(),
                    runs: self.ordered_next_tokens(part, range, m.bytes.len(), cap)?,
                })
            })
            .collect()
    }

    fn fine_continuations(&self, m: &Matches, cap: u64, depth: usize) -> Vec<LocalContinuations> {
        self.parts
            .iter()
            .zip(&m.ranges)
            .map(|(part, range)| {
                let fine = range.len().min(cap);
                LocalContinuations {
                    matches: range.len(),
                    fine: (0..fine)
                        .map(|k| {
                            let rank = range.lo + sampling::fine_offset(k, range.len(), fine);
                            self.continuation_at(part, rank, m.bytes.len(), depth)
                        })
                        .collect(),
                }
            })
            .collect()
    }

    fn checked_count(&self, ids: &[u32]) -> Result<u64> {
        self.count(ids)
    }

    fn shard_set(&self) -> Option<ShardSetRecord> {
        self.manifest().and_then(|m| m.shard_set.clone())
    }

    fn content_id(&self) -> String {
        let mut hasher = Xxh3::new();
        if let Some(m) = self.manifest() {
            for file in m.parts.iter().flat_map(|s| &s.files) {
                hasher.update(file.name.as_bytes());
                hasher.update(file.xxh3.as_bytes());
            }
        }
        format!("{:016x}", hasher.digest())
    }
}

impl Index {
    /// The next tokens of `range`'s fine samples under `cap`, run-length coded in rank order.
    fn ordered_next_tokens(
        &self,
        part: &Part,
        range: RankRange,
        query_bytes: usize,
        cap: u64,
    ) -> Result<Vec<(u32, u64)>> {
        let keys: Vec<(u64, u64)> = if range.len() <= cap {
            let mut runs = Vec::new();
            crate::index::read::next_tokens::ordered_runs(part, range, query_bytes, &mut runs)?;
            runs
        } else {
            (0..cap)
                .map(|k| {
                    let rank = range.lo + sampling::fine_offset(k, range.len(), cap);
                    (part.next_key(rank, query_bytes), 1)
                })
                .collect()
        };
        Ok(run_length(
            keys.into_iter().map(|(key, n)| (self.token_of(key), n)),
        ))
    }
}
