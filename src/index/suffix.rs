//! The longest matching suffix of a growing sequence, kept up to date as tokens are appended or taken
//! back. The effective n after one more token is at most one more than before (App. A), so an append
//! either extends the match inside its own ranges or shrinks it by binary search over a suffix of at
//! most the old length: the cost depends on the match length, never on how long the sequence is.
//! Dense scoring, decoding sessions and the drafter stand on it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::index::query::{InfgramNtdResult, InfgramProbResult, NtdResult, ProbResult, Spread};
use crate::index::ranks::RankRange;
use crate::index::read::part::{NextKey, Part, END};
use crate::index::read::query::Matches;
use crate::index::sampling;
use crate::index::{Index, Result};

/// How many occurrences a set of matches holds, and the rank range of its index's rows in each
/// part that hold them (for the empty query a compressed index's ranges also hold each part's
/// end, which the count leaves out).
pub trait Counted {
    fn count(&self) -> u64;
    fn rank_ranges(&self) -> &[RankRange];
}

impl Counted for Matches {
    fn count(&self) -> u64 {
        Matches::count(self)
    }
    fn rank_ranges(&self) -> &[RankRange] {
        &self.ranges
    }
}

/// What following a sequence asks of an index: the matches of a query and of a match one token
/// longer, and what follows matches. Suffix arrays and compressed indexes both answer it, so one
/// [`SuffixMatch`], one search for the longest occurring suffix, and the answers built on them
/// (dense evidence, the ∞-gram's probability, back-off, a shard's partial answers) serve both.
pub trait Occurrences {
    type Matches: Clone + Counted;
    fn eos_token_id(&self) -> u32;
    fn vocab_size(&self) -> u64;
    /// Refuses ids outside the vocabulary.
    fn check_query(&self, ids: &[u32]) -> Result<()>;
    fn matches_of(&self, ids: &[u32]) -> Self::Matches;
    /// Grows `m` by a token to the right, in place (the match is not kept on its own).
    fn grow_matches(&self, m: &mut Self::Matches, token: u32);
    /// How often the matches are followed by `token`, separators and part ends counting as eos.
    fn cont_count(&self, m: &Self::Matches, token: u32) -> u64;
    /// Which tokens follow the matches: none, one or several.
    fn spread(&self, m: &Self::Matches) -> Spread;
    /// Every token's count after the matches.
    fn next_counts(&self, m: &Self::Matches) -> Result<Cow<'_, BTreeMap<u32, u64>>>;
    /// The next-token distribution after the matches: exact, or under `max_support` the suffix
    /// array's own subsample.
    fn ntd_given(&self, m: &Self::Matches, max_support: Option<u64>) -> Result<NtdResult>;
    /// The exact distribution after the matches and, where the index finds it without searching
    /// again, the subsample `ntd_given` gives under a cap of `cap` matches (more than `cap`
    /// only: at most `cap`, the exact distribution is its own sample).
    fn ntd_and_sample(
        &self,
        m: &Self::Matches,
        _cap: Option<u64>,
    ) -> Result<(NtdResult, Option<NtdResult>)> {
        Ok((self.ntd_given(m, None)?, None))
    }
    /// Given `m`, the matches of `seq`'s suffix of `len` tokens: how many more tokens, at most
    /// `max_extra`, the longest occurring suffix has, exactly, when the index can tell from `m`
    /// alone; `None`: search. The ids must have been checked against the vocabulary.
    fn extension_by_scan(
        &self,
        _m: &Self::Matches,
        _seq: &[u32],
        _len: usize,
        _max_extra: usize,
    ) -> Option<usize> {
        None
    }
}

impl Occurrences for Index {
    type Matches = Matches;
    fn eos_token_id(&self) -> u32 {
        Index::eos_token_id(self)
    }
    fn vocab_size(&self) -> u64 {
        Index::vocab_size(self)
    }
    fn check_query(&self, ids: &[u32]) -> Result<()> {
        self.check_ids(ids)
    }
    fn matches_of(&self, ids: &[u32]) -> Matches {
        self.locate(self.encode(ids))
    }
    fn grow_matches(&self, m: &mut Matches, token: u32) {
        self.grow(m, token)
    }
    fn cont_count(&self, m: &Matches, token: u32) -> u64 {
        Index::cont_count(self, m, token)
    }
    fn spread(&self, m: &Matches) -> Spread {
        Index::spread(self, m)
    }
    fn next_counts(&self, m: &Matches) -> Result<Cow<'_, BTreeMap<u32, u64>>> {
        self.exact_counts(m)
    }
    fn ntd_given(&self, m: &Matches, max_support: Option<u64>) -> Result<NtdResult> {
        Index::ntd_given(self, m, max_support)
    }
    fn ntd_and_sample(
        &self,
        m: &Matches,
        cap: Option<u64>,
    ) -> Result<(NtdResult, Option<NtdResult>)> {
        Index::ntd_and_sample(self, m, cap)
    }
    /// Reads the tokens before each of a few occurrences: every occurrence of a longer suffix
    /// ends in one of them, so the longest left agreement is the longest match. A search costs a
    /// dozen cache misses one after another; these reads do not wait on each other.
    fn extension_by_scan(
        &self,
        m: &Matches,
        seq: &[u32],
        len: usize,
        max_extra: usize,
    ) -> Option<usize> {
        // A match may end at a part's end, where no suffix starts: the empty suffix's matches
        // do not hold every place a longer suffix ends.
        if len == 0 || len > seq.len() || m.count() > SCAN_LIMIT {
            return None;
        }
        let before = &seq[..seq.len() - len];
        let w = self.width().bytes();
        let mut longest = 0;
        for (part, range) in self.parts.iter().zip(&m.ranges) {
            for rank in range.lo..range.hi {
                let at = part.ptr(rank) as usize;
                // A corrupt pointer, past the text, has no tokens before it.
                if at > part.token_bytes().len() {
                    continue;
                }
                let agree = (before.iter().rev().take(max_extra).enumerate())
                    .take_while(|&(j, &t)| {
                        at >= (j + 1) * w && part.key_at(at - (j + 1) * w) == t as NextKey
                    })
                    .count();
                longest = longest.max(agree);
                if longest == max_extra {
                    return Some(longest);
                }
            }
        }
        Some(longest)
    }
}

/// The ∞-gram's probability of `cont` after `prompt`: from the longest occurring suffix of it.
pub fn infgram_prob<I: Occurrences + ?Sized>(
    index: &I,
    prompt: &[u32],
    cont: u32,
) -> Result<InfgramProbResult> {
    index.check_query(prompt)?;
    index.check_query(&[cont])?;
    let (suffix_len, m) = longest_suffix(index, prompt);
    Ok(InfgramProbResult {
        prob: ProbResult::of_counts(m.count(), index.cont_count(&m, cont)),
        suffix_len,
        sparse: index.spread(&m).is_sparse(),
    })
}

/// The ∞-gram's next-token distribution after `prompt`: from the longest occurring suffix of it.
pub fn infgram_ntd<I: Occurrences + ?Sized>(
    index: &I,
    prompt: &[u32],
    max_support: Option<u64>,
) -> Result<InfgramNtdResult> {
    index.check_query(prompt)?;
    let (suffix_len, m) = longest_suffix(index, prompt);
    infgram_ntd_after(index, suffix_len, &m, max_support)
}

/// The ∞-gram distribution after a suffix of `suffix_len` tokens already located (`m`).
fn infgram_ntd_after<I: Occurrences + ?Sized>(
    index: &I,
    suffix_len: usize,
    m: &I::Matches,
    max_support: Option<u64>,
) -> Result<InfgramNtdResult> {
    let ntd = index.ntd_given(m, max_support)?;
    Ok(InfgramNtdResult::new(ntd, suffix_len, || {
        index.spread(m).is_sparse()
    }))
}

/// Occurrences few enough that reading what precedes each beats a search for a longer suffix.
const SCAN_LIMIT: u64 = 32;

/// The longest suffix of a sequence that occurs in the reference data, with its matches.
pub struct SuffixMatch<M = Matches> {
    /// Tokens seen before the first entry of `lens`: a sequence taken in whole ([`Self::of`])
    /// searches only for its end's match, and a truncation to fewer tokens searches again.
    first: usize,
    /// `lens[i]`: the match length after the first `first + i` tokens, so a truncation to any of
    /// them restores it at once.
    lens: Vec<u32>,
    matches: M,
}

impl<M> SuffixMatch<M> {
    /// Memory held for the sequence: a match length per token (the matches themselves are a few
    /// ranks).
    pub fn heap_bytes(&self) -> usize {
        self.lens.capacity() * 4
    }
}

impl<M: Clone + Counted> SuffixMatch<M> {
    /// The match of the empty sequence: every position of the corpus.
    pub fn new<I: Occurrences<Matches = M> + ?Sized>(index: &I) -> Self {
        Self {
            first: 0,
            lens: vec![0],
            matches: index.matches_of(&[]),
        }
    }

    /// The match of `seq`'s end, found by one doubling search (O(log L) lookups), not token by
    /// token: a long prompt costs microseconds, not one search per token.
    pub fn of<I: Occurrences<Matches = M> + ?Sized>(index: &I, seq: &[u32]) -> Result<Self> {
        index.check_query(seq)?;
        Ok(Self::at_end(index, seq))
    }

    fn at_end<I: Occurrences<Matches = M> + ?Sized>(index: &I, seq: &[u32]) -> Self {
        let (len, matches) = longest_suffix(index, seq);
        Self {
            first: seq.len(),
            lens: vec![len as u32],
            matches,
        }
    }

    /// Tokens seen.
    pub fn seen(&self) -> usize {
        self.first + self.lens.len() - 1
    }

    /// Length of the longest matching suffix (effective n − 1).
    pub fn suffix_len(&self) -> usize {
        self.lens.last().copied().unwrap_or(0) as usize
    }

    /// Occurrences of the matched suffix.
    pub fn prompt_cnt(&self) -> u64 {
        self.matches.count()
    }

    pub(crate) fn matches(&self) -> &M {
        &self.matches
    }

    /// The ∞-gram next-token distribution after the sequence, as [`infgram_ntd`] gives it.
    pub fn infgram_ntd<I: Occurrences<Matches = M> + ?Sized>(
        &self,
        index: &I,
        max_support: Option<u64>,
    ) -> Result<InfgramNtdResult> {
        infgram_ntd_after(index, self.suffix_len(), &self.matches, max_support)
    }

    /// The ∞-gram distribution after the sequence, as [`Self::infgram_ntd`] gives it exactly, and
    /// the subsample of `cap` of its matches where the index finds it without searching again
    /// ([`Occurrences::ntd_and_sample`]; none without a cap).
    pub fn infgram_ntd_and_sample<I: Occurrences<Matches = M> + ?Sized>(
        &self,
        index: &I,
        cap: Option<u64>,
    ) -> Result<(InfgramNtdResult, Option<NtdResult>)> {
        let (ntd, sample) = index.ntd_and_sample(&self.matches, cap)?;
        let result = InfgramNtdResult::new(ntd, self.suffix_len(), || {
            index.spread(&self.matches).is_sparse()
        });
        Ok((result, sample))
    }

    /// Takes in the last token of `seq` (the whole sequence so far; only its tail is read). Returns how
    /// often the old suffix was followed by that literal token. Ids must have been checked.
    pub fn advance<I: Occurrences<Matches = M> + ?Sized>(&mut self, index: &I, seq: &[u32]) -> u64 {
        let Some(&token) = seq.last() else {
            return 0;
        };
        let len = self.suffix_len();
        index.grow_matches(&mut self.matches, token);
        let followed = self.matches.count();
        let new_len = if followed > 0 {
            len + 1
        } else {
            let (l, m) = longest_between(index, tail(seq, len), 0, index.matches_of(&[]));
            self.matches = m;
            l
        };
        self.lens.push(new_len as u32);
        followed
    }

    /// Forgets every token past `seq.len()` (`seq` is the sequence truncated): one lookup, whatever
    /// was taken back, or a doubling search to before the tokens taken in whole.
    pub fn truncate<I: Occurrences<Matches = M> + ?Sized>(&mut self, index: &I, seq: &[u32]) {
        if seq.len() >= self.seen() {
            return;
        }
        if seq.len() < self.first {
            *self = Self::at_end(index, seq);
            return;
        }
        self.lens.truncate(seq.len() - self.first + 1);
        let len = self.suffix_len();
        self.matches = index.matches_of(&seq[seq.len() - len..]);
    }
}

/// The longest suffix of `seq` that occurs, by binary search above a suffix of `good` tokens
/// known to occur (`good_m`, its matches): counts only shrink as a suffix grows. A search up to
/// some length passes only that many of the sequence's last tokens ([`tail`]).
fn longest_between<I: Occurrences + ?Sized>(
    index: &I,
    seq: &[u32],
    good: usize,
    good_m: I::Matches,
) -> (usize, I::Matches) {
    let n = seq.len();
    let (mut good, mut good_m) = (good, good_m);
    let mut bad = n + 1;
    while bad - good > 1 {
        if let Some(extra) = index.extension_by_scan(&good_m, seq, good, bad - 1 - good) {
            return settled(index, seq, good, good_m, extra);
        }
        let mid = good + (bad - good) / 2;
        let m = index.matches_of(&seq[n - mid..]);
        if m.count() > 0 {
            (good, good_m) = (mid, m);
        } else {
            bad = mid;
        }
    }
    (good, good_m)
}

/// The last `len` tokens of `seq` (all of them when it is shorter).
pub(crate) fn tail(seq: &[u32], len: usize) -> &[u32] {
    &seq[seq.len() - len.min(seq.len())..]
}

/// The longest suffix of `prompt` that occurs (the empty suffix always does), with its matches:
/// doubling, then binary search, O(log L) lookups (App. A).
pub(crate) fn longest_suffix<I: Occurrences + ?Sized>(
    index: &I,
    prompt: &[u32],
) -> (usize, I::Matches) {
    longest_above(index, prompt, 0, index.matches_of(&[]), prompt.len())
}

/// The longest suffix of `seq` of at most `max_len` tokens that occurs, above a suffix of `good`
/// tokens known to occur (`good_m`, its matches): the excess over `good` doubles, then a binary
/// search, O(log(L − good)) lookups, so a match no longer than `good` costs at most one.
fn longest_above<I: Occurrences + ?Sized>(
    index: &I,
    seq: &[u32],
    good: usize,
    good_m: I::Matches,
    max_len: usize,
) -> (usize, I::Matches) {
    let (n, max_len) = (seq.len(), max_len.min(seq.len()));
    debug_assert!(
        good <= max_len,
        "a known match of {good} over a limit of {max_len}"
    );
    let (mut good, mut good_m) = (good, good_m);
    let mut excess = 1;
    while good < max_len {
        if let Some(extra) = index.extension_by_scan(&good_m, seq, good, max_len - good) {
            return settled(index, seq, good, good_m, extra);
        }
        let len = (good + excess).min(max_len);
        let m = index.matches_of(&seq[n - len..]);
        if m.count() == 0 {
            return longest_between(index, tail(seq, len - 1), good, good_m);
        }
        (good, good_m) = (len, m);
        excess *= 2;
    }
    (good, good_m)
}

/// The match `extra` tokens longer than `good`'s, found by [`Occurrences::extension_by_scan`]:
/// searched only when it is longer.
fn settled<I: Occurrences + ?Sized>(
    index: &I,
    seq: &[u32],
    good: usize,
    good_m: I::Matches,
    extra: usize,
) -> (usize, I::Matches) {
    match extra {
        0 => (good, good_m),
        _ => {
            let len = good + extra;
            (len, index.matches_of(&seq[seq.len() - len..]))
        }
    }
}

impl SuffixMatch {
    /// What followed the matched suffix in the reference data: up to `samples` of its occurrences,
    /// spread evenly over the suffix array (which sorts them by what follows, so each continuation
    /// is sampled in proportion to its count), each with at most `depth` following tokens, cut at
    /// the end of its document. Nothing when no suffix matched.
    pub fn continuations(&self, index: &Index, samples: usize, depth: usize) -> Vec<Vec<u32>> {
        let total = self.matches.count();
        index.sample_continuations(self.suffix_len(), &self.matches, samples, depth, total)
    }
}

/// The longest suffix of a sequence found in an index by [`Index::longest_suffix_from`].
pub struct LongestSuffix {
    pub len: usize,
    matches: Matches,
}

impl LongestSuffix {
    /// Its occurrences.
    pub fn count(&self) -> u64 {
        self.matches.count()
    }
}

impl Index {
    /// The longest suffix of `seq` of at most `max_len` tokens that occurs in the corpus, if it is
    /// at least `min_len` long (one search decides that, so indexes that cannot beat a match found
    /// elsewhere cost little): for a sequence this index follows no `SuffixMatch` for (a live run,
    /// which compaction replaces). The ids must have been checked against the vocabulary.
    pub fn longest_suffix_from(
        &self,
        seq: &[u32],
        min_len: usize,
        max_len: usize,
    ) -> Option<LongestSuffix> {
        let max_len = max_len.min(seq.len());
        if min_len > max_len {
            return None;
        }
        let start = self.locate(self.encode(&seq[seq.len() - min_len..]));
        if min_len > 0 && start.count() == 0 {
            return None;
        }
        let (len, matches) = longest_above(self, seq, min_len, start, max_len);
        Some(LongestSuffix { len, matches })
    }

    /// What followed `found`'s occurrences, sampled as [`SuffixMatch::continuations`] samples,
    /// when `pooled` matches (these and those of other indexes, as many as `found` at least) share
    /// the `samples`: this index takes its share, as each part of one index does, so that
    /// indexes searched one by one are sampled as one index over all of them would be.
    pub fn continuations_of(
        &self,
        found: &LongestSuffix,
        samples: usize,
        depth: usize,
        pooled: u64,
    ) -> Vec<Vec<u32>> {
        let total = pooled.max(found.count());
        self.sample_continuations(found.len, &found.matches, samples, depth, total)
    }

    /// Continuations at evenly spread ranks of every part's matches, each part taking its share
    /// of `samples` among `total` matches.
    fn sample_continuations(
        &self,
        suffix_len: usize,
        matches: &Matches,
        samples: usize,
        depth: usize,
        total: u64,
    ) -> Vec<Vec<u32>> {
        if suffix_len == 0 || total == 0 || samples == 0 {
            return Vec::new();
        }
        let qlen = matches.bytes.len();
        let mut out = Vec::with_capacity(samples.min(total as usize));
        for (part, range) in self.parts.iter().zip(&matches.ranges) {
            if range.is_empty() {
                continue;
            }
            let cap = samples as u64;
            for offset in
                sampling::offsets(range.len(), cap, sampling::share(cap, range.len(), total))
            {
                out.push(self.continuation_at(part, range.lo + offset, qlen, depth));
            }
        }
        out
    }

    /// The up to `depth` tokens after the match at `rank` of `part` (`qlen` bytes long), cut
    /// at the end of its document.
    pub(crate) fn continuation_at(
        &self,
        part: &Part,
        rank: u64,
        qlen: usize,
        depth: usize,
    ) -> Vec<u32> {
        let width = self.width().bytes();
        let stop = |key: NextKey| {
            key == END
                || key == self.width().separator() as NextKey
                || key == self.eos_token_id() as NextKey
        };
        // The pointer read once: each token after it is then one read of the text.
        let after = part.ptr(rank) as usize + qlen;
        (0..depth)
            .map(|j| part.key_at(after + j * width))
            .take_while(|&key| !stop(key))
            .map(|key| key as u32)
            .collect()
    }
}
