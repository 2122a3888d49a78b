//! What one index knows of a query, in the form several indexes' answers merge into the answer a
//! single index over all their parts gives ([`super::merge`]; the protocol is written down in
//! [`super`]). A shard server answers with these ([`PartialAnswers`], over any kind of index:
//! `suffix_array`, `compressed`); the router merges them.

mod compressed;
mod suffix_array;

use std::collections::BTreeMap;

use crate::index::corpus::Corpus;
use crate::index::dense::{self, TokenEvidence};
use crate::index::docs::{self, DocumentIndex, PartialSearch, SearchOptions};
use crate::index::format::ShardSetRecord;
use crate::index::query::Spread;
use crate::index::suffix::{longest_suffix, Counted, Occurrences};
use crate::index::trace;
use crate::index::Result;

/// One suffix array's next tokens after a prompt, in suffix-array order and run-length coded:
/// every match when it has at most the cap, else its `min(cap, matches)` fine samples
/// ([`crate::index::sampling`]), from which the merge picks the ranks a single index would read.
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

/// What a shard server's answers read of an index natively, part by part (each suffix array, or
/// the FM-index compressed from it): the rest of [`PartialAnswers`] is written once over it.
pub(crate) trait LocalParts: Occurrences + DocumentIndex + Sync {
    /// Every part's next tokens after `m`, under `cap` ([`LocalSample`]).
    fn fine_samples(&self, m: &Self::Matches, cap: u64) -> Result<Vec<LocalSample>>;
    /// Every part's fine samples under `cap` of the matches `m` (of a non-empty suffix, or with a
    /// cap of 0), each with up to `depth` following tokens cut at the end of its document.
    fn fine_continuations(
        &self,
        m: &Self::Matches,
        cap: u64,
        depth: usize,
    ) -> Vec<LocalContinuations>;
    /// The count of `ids`, checked, as `Corpus::count` answers it (a suffix array keeps short
    /// n-grams' counts).
    fn checked_count(&self, ids: &[u32]) -> Result<u64>;
    /// Its place in a set of shards built apart (`index build --shard`), if it is one.
    fn shard_set(&self) -> Option<ShardSetRecord>;
    /// Its files' checksums, hashed: what replicas of a shard must agree on.
    fn content_id(&self) -> String;
}

/// What one index answers a router: each query's part here, which the router merges with the
/// other shards' (`cluster::merge`). Every kind of index answers it; the shard server reads it.
pub trait PartialAnswers: Corpus {
    /// What follows `prompt` (or, `infinite`, its longest suffix found here): the exact
    /// distribution, or with `max_support` every part's fine samples.
    fn partial_continuations(
        &self,
        prompt: &[u32],
        infinite: bool,
        max_support: Option<u64>,
    ) -> Result<PartialContinuations>;
    /// The counts of `prompt`'s last k tokens for each k of `lengths` up to `suffix_len` (the
    /// suffix matched here; longer ones do not occur here), in order. Ids must have been checked.
    fn suffix_counts(
        &self,
        prompt: &[u32],
        suffix_len: usize,
        lengths: &[usize],
    ) -> Result<Vec<u64>>;
    /// Every part's fine samples (under `cap`) of what followed the last `len` tokens of
    /// `prefix`: what the gate's support estimate of a position needs from this index. Ids must
    /// have been checked.
    fn support(&self, prefix: &[u32], len: usize, cap: u64) -> Result<Vec<LocalSample>>;
    /// What followed the longest suffix of `prompt` found here, for drafts: its length, and
    /// every part's fine samples under `cap`, each with up to `depth` following tokens
    /// ([`crate::index::suffix::SuffixMatch::continuations`] reads the picks among them).
    fn partial_drafts(&self, prompt: &[u32], cap: u64, depth: usize) -> Result<PartialDrafts>;
    /// What this index knows of each token of `ids` ([`crate::index::dense::evidence`]).
    fn evidence(&self, ids: &[u32]) -> Result<Vec<TokenEvidence>>;
    /// This index's part of a search whose strides a router chose
    /// ([`crate::index::docs::search_strided`]).
    fn search_strided(
        &self,
        cnf: &[Vec<Vec<u32>>],
        strides: &[u64],
        opts: SearchOptions,
    ) -> Result<PartialSearch>;
    /// Each start's longest span here ([`crate::index::trace::span_lengths`]).
    fn span_lengths(&self, ids: &[u32]) -> Result<Vec<(usize, u64)>>;
    fn shard_set(&self) -> Option<ShardSetRecord>;
    fn content_id(&self) -> String;
}

impl<I: LocalParts + Corpus> PartialAnswers for I {
    fn partial_continuations(
        &self,
        prompt: &[u32],
        infinite: bool,
        max_support: Option<u64>,
    ) -> Result<PartialContinuations> {
        self.check_query(prompt)?;
        let (suffix_len, m) = match infinite {
            true => longest_suffix(self, prompt),
            false => (prompt.len(), self.matches_of(prompt)),
        };
        // An exact distribution shows its spread; samples need the matches' ends read.
        let (dist, samples, spread) = match max_support {
            None => {
                let dist = self.next_counts(&m)?.into_owned();
                let spread = Spread::of_dist(&dist);
                (dist, Vec::new(), spread)
            }
            Some(cap) => (
                BTreeMap::new(),
                self.fine_samples(&m, cap)?,
                Occurrences::spread(self, &m),
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

    fn suffix_counts(
        &self,
        prompt: &[u32],
        suffix_len: usize,
        lengths: &[usize],
    ) -> Result<Vec<u64>> {
        lengths
            .iter()
            .filter(|&&k| k <= suffix_len.min(prompt.len()))
            .map(|&k| self.checked_count(&prompt[prompt.len() - k..]))
            .collect()
    }

    fn support(&self, prefix: &[u32], len: usize, cap: u64) -> Result<Vec<LocalSample>> {
        let len = len.min(prefix.len());
        self.fine_samples(&self.matches_of(&prefix[prefix.len() - len..]), cap)
    }

    fn partial_drafts(&self, prompt: &[u32], cap: u64, depth: usize) -> Result<PartialDrafts> {
        self.check_query(prompt)?;
        let (suffix_len, m) = longest_suffix(self, prompt);
        // No suffix matched: the counts say so, and nothing followed it.
        let cap = if suffix_len == 0 { 0 } else { cap };
        Ok(PartialDrafts {
            suffix_len,
            suffix_arrays: self.fine_continuations(&m, cap, depth),
        })
    }

    fn evidence(&self, ids: &[u32]) -> Result<Vec<TokenEvidence>> {
        dense::evidence(self, ids)
    }

    fn search_strided(
        &self,
        cnf: &[Vec<Vec<u32>>],
        strides: &[u64],
        opts: SearchOptions,
    ) -> Result<PartialSearch> {
        docs::search_strided(self, cnf, strides, opts)
    }

    fn span_lengths(&self, ids: &[u32]) -> Result<Vec<(usize, u64)>> {
        trace::span_lengths(self, ids)
    }

    fn shard_set(&self) -> Option<ShardSetRecord> {
        LocalParts::shard_set(self)
    }

    fn content_id(&self) -> String {
        LocalParts::content_id(self)
    }
}

/// Runs of equal tokens, in order, from `(token, count)` pairs.
pub(crate) fn run_length(pairs: impl IntoIterator<Item = (u32, u64)>) -> Vec<(u32, u64)> {
    let mut runs: Vec<(u32, u64)> = Vec::new();
    for (token, n) in pairs {
        match runs.last_mut() {
            Some((last, count)) if *last == token => *count += n,
            _ => runs.push((token, n)),
        }
    }
    runs
}
