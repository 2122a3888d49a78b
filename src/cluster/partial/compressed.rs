//! A compressed index's answers to a router, part by part as the suffix array it was compressed
//! from gives them: each sample's token is the one at the suffix array's rank (read from the
//! exact counts in its order), and a draft reads on from another occurrence, as a single
//! compressed index's drafts do ([`crate::index::fm::suffix`]).

use super::{run_length, LocalContinuations, LocalParts, LocalSample};
use crate::index::corpus::Corpus;
use crate::index::fm::query::FmMatches;
use crate::index::fm::CompressedIndex;
use crate::index::format::ShardSetRecord;
use crate::index::sampling::fine_offset;
use crate::index::Result;

impl LocalParts for CompressedIndex {
    fn fine_samples(&self, m: &FmMatches, cap: u64) -> Result<Vec<LocalSample>> {
        Ok((0..self.parts.len())
            .map(|s| {
                let mut ordered = self.suffix_ordered(s, m.ranges[s], m);
                let len = ordered.len();
                let runs = match len <= cap {
                    true => {
                        run_length((ordered.runs().iter()).map(|&(key, n)| (self.token_of(key), n)))
                    }
                    false => run_length(
                        (0..cap)
                            .map(|k| (self.token_of(ordered.at(fine_offset(k, len, cap)).0), 1)),
                    ),
                };
                LocalSample { matches: len, runs }
            })
            .collect())
    }

    fn fine_continuations(&self, m: &FmMatches, cap: u64, depth: usize) -> Vec<LocalContinuations> {
        (self.parts.iter().zip(&m.ranges).enumerate())
            .map(|(s, (part, &range))| {
                let mut ordered = self.suffix_ordered(s, range, m);
                let len = ordered.len();
                let fine = len.min(cap);
                LocalContinuations {
                    matches: len,
                    fine: (0..fine)
                        .map(|k| {
                            let offset = fine_offset(k, len, fine);
                            self.continuation_at(part, range, &mut ordered, offset, depth)
                        })
                        .collect(),
                }
            })
            .collect()
    }

    fn checked_count(&self, ids: &[u32]) -> Result<u64> {
        Corpus::count(self, ids)
    }

    fn shard_set(&self) -> Option<ShardSetRecord> {
        self.shard_set.clone()
    }

    fn content_id(&self) -> String {
        self.content_id.clone()
    }
}
