//! n-gram queries over a suffix-array index's parts (the ∞-gram's are written once over any kind,
//! in `index::suffix`): counts add up, distributions merge.
//!
//! The token after a match is the eos token when the match is followed by a document separator or sits
//! at the very end of a part, as in the reference; unlike the reference, a prompt that also occurs at the
//! end of the corpus still gets its full distribution.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::index::query::{check_vocabulary, NtdResult, Spread};
use crate::index::ranks::RankRange;
use crate::index::read::next_tokens;
use crate::index::read::part::{NextKey, Part};
use crate::index::sampling;
use crate::index::{Index, Result};

/// Runs reserved before a walk: the runs of most ranges a step walks, without regrowing.
const RUNS_RESERVED: u64 = 512;

/// What follows a query's matches, walked: every part's runs in one list, part `i`'s at
/// `parts[i]`.
struct Walked {
    runs: Vec<(NextKey, u64)>,
    parts: Vec<std::ops::Range<usize>>,
    /// Whether every part's runs came in rank order (none from its next-token table).
    in_rank_order: bool,
}

/// The samples of `cap` of a query's `total` matches, part by part: the part's index, its range,
/// and the samples' offsets in it (increasing).
fn sample_offsets(
    prompt: &Matches,
    total: u64,
    cap: u64,
) -> impl Iterator<Item = (usize, RankRange, impl Iterator<Item = u64>)> + '_ {
    prompt
        .ranges
        .iter()
        .enumerate()
        .filter(|(_, range)| !range.is_empty())
        .map(move |(i, range)| {
            let share = sampling::share(cap, range.len(), total);
            (i, *range, sampling::offsets(range.len(), cap, share))
        })
}

/// The key at each of `offsets` (increasing) in a range whose `runs` are in rank order, counted
/// into `keys`: one entry per run sampled, which keeps the list short to sort.
fn keys_at(
    runs: &[(NextKey, u64)],
    offsets: impl Iterator<Item = u64>,
    keys: &mut Vec<(NextKey, u64)>,
) {
    let mut runs = runs.iter();
    let (mut key, mut run_end) = (0, 0);
    let mut counted = false;
    for offset in offsets {
        while run_end <= offset {
            let Some(&(next, n)) = runs.next() else {
                debug_assert!(false, "runs shorter than their range");
                return;
            };
            (key, run_end, counted) = (next, run_end + n, false);
        }
        match keys.last_mut() {
            Some(last) if counted => last.1 += 1,
            _ => keys.push((key, 1)),
        }
        counted = true;
    }
}

/// Per-part ranges of one query, with the query's byte encoding.
#[derive(Clone)]
pub struct Matches {
    pub(crate) bytes: Vec<u8>,
    pub(crate) ranges: Vec<RankRange>,
}

impl Matches {
    pub fn count(&self) -> u64 {
        self.ranges.iter().map(|r| r.len()).sum()
    }
}

impl Index {
    /// Rejects ids the vocabulary does not have and queries beyond `MAX_QUERY_TOKENS`.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        check_vocabulary(ids, self.vocab_size())
    }

    pub(crate) fn encode(&self, ids: &[u32]) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(ids.len() * self.width().bytes());
        self.width().encode_into(ids, &mut bytes);
        bytes
    }

    /// Ranges of `bytes` in every part.
    pub(crate) fn locate(&self, bytes: Vec<u8>) -> Matches {
        let ranges = self
            .parts
            .iter()
            .map(|s| s.find(&bytes, s.full_range(), 0))
            .collect();
        Matches { bytes, ranges }
    }

    /// The whole suffix array of every part: the matches of the empty query.
    pub(crate) fn everything(&self) -> Matches {
        Matches {
            bytes: Vec::new(),
            ranges: self.parts.iter().map(|s| s.full_range()).collect(),
        }
    }

    pub fn count(&self, ids: &[u32]) -> Result<u64> {
        self.check_ids(ids)?;
        if let Some(count) = self.short_counts.get(ids) {
            return Ok(count);
        }
        let count = self.locate(self.encode(ids)).count();
        self.short_counts.put(ids, count);
        Ok(count)
    }

    /// Matches of the prompt followed by `cont`, searched inside the prompt's ranges. For eos this is only
    /// the literal eos token; `cont_count` adds separators and part ends.
    pub(crate) fn extend(&self, prompt: &Matches, cont: u32) -> Matches {
        let mut grown = prompt.clone();
        self.grow(&mut grown, cont);
        grown
    }

    /// [`Index::extend`] in place, for a match that is not kept: nothing is copied, and only the
    /// new token's bytes are compared, inside the match's own ranges.
    pub(crate) fn grow(&self, m: &mut Matches, cont: u32) {
        let shared = m.bytes.len();
        self.width().encode_into(&[cont], &mut m.bytes);
        for (part, range) in self.parts.iter().zip(&mut m.ranges) {
            *range = part.find(&m.bytes, *range, shared);
        }
    }

    /// How often the prompt is followed by `cont`, counting separators and part ends as eos.
    pub(crate) fn cont_count(&self, prompt: &Matches, cont: u32) -> u64 {
        let mut total = self.extend(prompt, cont).count();
        let sep = self.width().separator();
        if cont == self.eos_token_id() {
            if sep != cont {
                total += self.extend(prompt, sep).count();
            }
            if !prompt.bytes.is_empty() {
                total += self
                    .parts
                    .iter()
                    .filter(|s| s.ends_with(&prompt.bytes))
                    .count() as u64;
            }
        }
        total
    }

    pub(crate) fn token_of(&self, key: NextKey) -> u32 {
        next_tokens::token_of_key(key, self.width().separator(), self.eos_token_id())
    }

    pub(crate) fn ntd_given(
        &self,
        prompt: &Matches,
        max_support: Option<u64>,
    ) -> Result<NtdResult> {
        let prompt_cnt = prompt.count();
        let approx = max_support.is_some_and(|cap| prompt_cnt > cap);
        let dist = match max_support {
            Some(cap) if approx => self.sampled(prompt, prompt_cnt, cap),
            _ => self.exact_counts(prompt)?.into_owned(),
        };
        Ok(NtdResult {
            prompt_cnt,
            dist,
            approx,
        })
    }

    /// Exact counts of what follows the prompt's matches. The empty prompt (a context whose last
    /// token the data never saw) matches the whole corpus: every token's count, a walk of
    /// milliseconds, kept after the first and lent from then on.
    pub(crate) fn exact_counts(&self, prompt: &Matches) -> Result<Cow<'_, BTreeMap<u32, u64>>> {
        Ok(match prompt.bytes.is_empty() {
            true => Cow::Borrowed(self.unigram()?),
            false => Cow::Owned(self.counted(prompt)?),
        })
    }

    /// Every token's count after the empty prompt, worked out at the first call and kept.
    fn unigram(&self) -> Result<&BTreeMap<u32, u64>> {
        if let Some(dist) = self.unigram.get() {
            return Ok(dist);
        }
        let dist = self.counted(&self.everything())?;
        Ok(self.unigram.get_or_init(|| dist))
    }

    /// Exact counts of what follows the prompt's matches, walked.
    fn counted(&self, prompt: &Matches) -> Result<BTreeMap<u32, u64>> {
        Ok(self.merge_runs(self.walked(prompt)?.runs))
    }

    /// The runs of what follows the prompt's matches in every part.
    fn walked(&self, prompt: &Matches) -> Result<Walked> {
        // A run per match at most; a wide range's runs are far fewer, and the vector grows.
        let mut walked = Walked {
            runs: Vec::with_capacity(prompt.count().min(RUNS_RESERVED) as usize),
            parts: Vec::with_capacity(self.parts.len()),
            in_rank_order: true,
        };
        let query_bytes = prompt.bytes.len();
        for (part, range) in self.parts.iter().zip(&prompt.ranges) {
            let start = walked.runs.len();
            walked.in_rank_order &=
                next_tokens::collect_runs(part, *range, query_bytes, &mut walked.runs)?;
            walked.parts.push(start..walked.runs.len());
        }
        Ok(walked)
    }

    /// The exact distribution after the prompt's matches and, when they are more than `cap`, the
    /// subsample [`Index::ntd_given`] reads under that cap: found in the walked runs instead of
    /// read, or read when a part's counts came from its next-token table (which keeps no rank
    /// order). `None` without a cap or for the empty prompt.
    pub(crate) fn ntd_and_sample(
        &self,
        prompt: &Matches,
        cap: Option<u64>,
    ) -> Result<(NtdResult, Option<NtdResult>)> {
        let prompt_cnt = prompt.count();
        let cap = match cap {
            Some(cap) if !prompt.bytes.is_empty() && prompt_cnt > cap => cap,
            _ => return Ok((self.ntd_given(prompt, None)?, None)),
        };
        let walked = self.walked(prompt)?;
        let dist = match walked.in_rank_order {
            true => {
                let mut keys = Vec::with_capacity(cap as usize + prompt.ranges.len());
                for (i, _, offsets) in sample_offsets(prompt, prompt_cnt, cap) {
                    keys_at(&walked.runs[walked.parts[i].clone()], offsets, &mut keys);
                }
                self.merge_runs(keys)
            }
            false => self.sampled(prompt, prompt_cnt, cap),
        };
        let sample = Some(NtdResult {
            prompt_cnt,
            dist,
            approx: true,
        });
        let exact = NtdResult {
            prompt_cnt,
            dist: self.merge_runs(walked.runs),
            approx: false,
        };
        Ok((exact, sample))
    }

    /// What follows `cap` of the prompt's `total` matches spread evenly over its ranges (each part
    /// its share).
    ///
    /// The samples' reads are gathered first and counted after: reads that wait on nothing but
    /// their own pointer overlap, where counting each as it came made every miss wait on a map.
    fn sampled(&self, prompt: &Matches, total: u64, cap: u64) -> BTreeMap<u32, u64> {
        let mut keys = Vec::with_capacity(cap as usize + prompt.ranges.len());
        for (i, range, offsets) in sample_offsets(prompt, total, cap) {
            let part = &self.parts[i];
            keys.extend(
                offsets.map(|offset| (part.next_key(range.lo + offset, prompt.bytes.len()), 1)),
            );
        }
        self.merge_runs(keys)
    }

    /// One count per token from runs of keys, in any order (bytes, not token values; a token may
    /// have a run per part, and separators and part ends all mean eos): sorted once, then built in
    /// bulk.
    fn merge_runs(&self, runs: Vec<(NextKey, u64)>) -> BTreeMap<u32, u64> {
        let counts = runs
            .into_iter()
            .map(|(key, n)| (self.token_of(key), n))
            .collect();
        next_tokens::sum_by_token(counts).into_iter().collect()
    }

    /// What follows the prompt's matches over all parts.
    pub(crate) fn spread(&self, prompt: &Matches) -> Spread {
        let mut spread = Spread::None;
        for (part, range) in self.parts.iter().zip(&prompt.ranges) {
            spread = spread.merge(self.continuations(part, *range, prompt));
            if spread == Spread::Several {
                break;
            }
        }
        spread
    }

    fn continuations(&self, part: &Part, range: RankRange, prompt: &Matches) -> Spread {
        if range.is_empty() {
            return Spread::None;
        }
        let qlen = prompt.bytes.len();
        let (first, last) = (
            part.next_key(range.lo, qlen),
            part.next_key(range.hi - 1, qlen),
        );
        if first == last {
            return Spread::Single(self.token_of(first));
        }
        let eos = self.eos_token_id();
        if self.token_of(first) != eos || self.token_of(last) != eos {
            return Spread::Several;
        }
        // The ends disagree in raw value but both mean eos (end of part, eos id, separator): the range is
        // all eos only if those three account for every match.
        let sub = |t: u32| {
            let mut bytes = prompt.bytes.clone();
            self.width().encode_into(&[t], &mut bytes);
            part.find(&bytes, range, prompt.bytes.len()).len()
        };
        let sep = self.width().separator();
        let eos_like = sub(eos)
            + if sep != eos { sub(sep) } else { 0 }
            + u64::from(qlen > 0 && part.ends_with(&prompt.bytes));
        if eos_like == range.len() {
            Spread::Single(eos)
        } else {
            Spread::Several
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::index::build::{build_token_docs, random_token_docs, BuildOptions};
    use crate::index::format::NextTableSpec;
    use crate::index::suffix::Occurrences;
    use crate::index::{Index, OpenOptions, TokenWidth};
    use rand::{Rng, SeedableRng};

    /// The subsample found in the walked runs, or read where a next-token table answered, is the
    /// one `ntd_given` reads, over several parts, with and without next-token tables; the exact
    /// answer is `ntd_given`'s. Only an empty prompt, or a call without a cap, goes without one.
    #[test]
    fn a_sample_found_in_the_runs_is_the_one_read() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for next_table in [
            None,
            Some(NextTableSpec {
                max_prompt_tokens: 2,
                min_count: 40,
                ..NextTableSpec::default()
            }),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("idx");
            // Few symbols, eos among them: long runs, separators and part ends in the samples.
            let docs = random_token_docs(&mut rng, 60, 80, 0..6);
            let opts = BuildOptions {
                next_table,
                max_part_tokens: Some(700),
                ..BuildOptions::new(out.clone(), TokenWidth::U16, 0, 10)
            };
            build_token_docs(&docs, &opts);
            let index = Index::open(&out, &OpenOptions::default()).unwrap();
            assert!(index.parts.len() > 2, "{} parts", index.parts.len());
            let text: Vec<u32> = docs.concat();
            let mut found = 0;
            for _ in 0..1500 {
                let len = rng.random_range(0..4);
                let at = rng.random_range(0..text.len() - len);
                let m = index.matches_of(&text[at..at + len]);
                let cap = rng.random_range(1..64);
                let (exact, sample) = index.ntd_and_sample(&m, Some(cap)).unwrap();
                assert_eq!(exact, index.ntd_given(&m, None).unwrap());
                match sample {
                    Some(sample) => {
                        assert_eq!(sample, index.ntd_given(&m, Some(cap)).unwrap());
                        found += 1;
                    }
                    None => assert!(
                        len == 0 || m.count() <= cap,
                        "no sample of {:?} under {cap}",
                        &text[at..at + len]
                    ),
                }
                assert_eq!(index.ntd_and_sample(&m, None).unwrap(), (exact, None));
            }
            assert!(found > 300, "{found} samples found");
        }
    }
}
