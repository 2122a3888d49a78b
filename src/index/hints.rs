//! ∞-gram hints for training (infini-LLM): for every position of a training sequence, the ∞-gram's
//! next-token distribution after it, as S samples (or the exact top S), for a trainer to feed the
//! Transformer beside its input.
//!
//! **The plateau regulariser.** A training sequence is usually in the datastore itself, so the
//! longest match runs back through the sequence's own copy and always predicts its next token. The
//! n-gram profile shows it: the counts c(n) of the context's last n tokens stay the same from some
//! n = a up to the longest match L (every occurrence of the a-gram is the copy, or its duplicates).
//! When that plateau is at least `min_plateau` long (5 in infini-LLM), its occurrences are excluded
//! and the hint comes from the suffix of a − 1 tokens: its occurrences less those of the a-gram,
//! that is those not preceded by the context's token before it (down to the empty suffix, when
//! even the last token occurs only in the copy: every token's count, less the copy's). Only the top plateau, the matched n-gram's,
//! is judged: a document that repeats a passage of itself has, inside the repeat, a short top run
//! (the copy alone) over a long run of two (the copy and the passage it repeats), and keeps its
//! hint. Judging every run would cost a search per run and position, not O(1) amortised.
//!
//! **Left to right.** The longest match is kept as each token comes ([`SuffixMatch`]): one
//! extension a token while it grows (a sequence the index holds), a binary search over lengths
//! where it breaks. The plateau's bottom a rises by at most one a token (if the a-gram's
//! occurrences all extend to the L-gram, so do they with the next token appended), so it is found
//! by walking down from the last one plus one: each walked step is one count, and the walk
//! goes down at most as far as it went up. The first count, of the (a − 1)-gram, is the last
//! position's (a − 1)-gram extended by the new token, searched inside its range; its matches are
//! the hint's when the plateau is left out. So a position costs O(1) searches of O(log N) memory
//! accesses, amortised (about two: the match's extension and that one), where a fresh binary
//! search over lengths for L and again for a costs O(log L) searches each ([`HintCost`] counts
//! both).
//!
//! **Samples** are occurrences drawn uniformly (the next token after each), from a generator seeded
//! by the seed and the sequence: a sequence's samples depend only on them and the index. Under
//! exclusion, occurrences are drawn and rejected when preceded by the excluded token; where there
//! are few (at most 256) and few of them are kept, they are read one by one instead, and where
//! rejection would take too long the exact counts are drawn from.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::index::read::part::{NextKey, Part};
use crate::index::read::query::Matches;
use crate::index::suffix::SuffixMatch;
use crate::index::{Index, IndexError, Result};

/// infini-LLM's S.
pub const DEFAULT_SAMPLES: usize = 20;
/// infini-LLM's shortest excluded plateau.
pub const DEFAULT_MIN_PLATEAU: usize = 5;
/// Most samples (or top tokens) a position may ask for.
pub const MAX_SAMPLES: usize = 256;
/// Most occurrences read one by one when the regulariser excludes some; above it, rejection sampling.
const SCAN_LIMIT: u64 = 256;
/// Draws per wanted sample before rejection sampling gives way to the exact counts.
const REJECTION_DRAWS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HintOptions {
    /// S: samples a position, or the top S tokens with `exact`.
    pub samples: usize,
    /// The exact top S with their counts instead of samples.
    pub exact: bool,
    /// Exclude the sequence's own copies (module notes).
    pub regularise: bool,
    pub min_plateau: usize,
    pub seed: u64,
}

impl Default for HintOptions {
    fn default() -> Self {
        Self {
            samples: DEFAULT_SAMPLES,
            exact: false,
            regularise: true,
            min_plateau: DEFAULT_MIN_PLATEAU,
            seed: 0,
        }
    }
}

/// What the ∞-gram says of the token after one position.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hint {
    /// Tokens of the suffix the hint comes from: the longest match, or the suffix below an
    /// excluded plateau.
    pub suffix_len: usize,
    /// Occurrences it comes from (the suffix's count less the excluded ones).
    pub count: u64,
    /// Occurrences the regulariser excluded (the plateau's count), 0 when none.
    pub excluded: u64,
    /// S sampled next tokens, or the exact top S, most frequent first.
    pub tokens: Vec<u32>,
    /// With `exact`: each top token's count.
    pub counts: Vec<u64>,
}

/// Suffix-array searches (each O(log N) memory accesses) that hints cost, and what the same
/// answers would cost searched afresh at each position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct HintCost {
    pub positions: u64,
    pub searches: u64,
    /// A binary search over lengths for the longest match, and one for the plateau's bottom.
    pub fresh_searches: u64,
}

impl HintCost {
    pub fn add(&mut self, other: HintCost) {
        self.positions += other.positions;
        self.searches += other.searches;
        self.fresh_searches += other.fresh_searches;
    }
}

/// Probes of a binary search over `0..=n`.
fn probes(n: usize) -> u64 {
    u64::from(usize::BITS - n.leading_zeros()) + 1
}

/// The occurrences a hint leaves out: those of the suffix one token longer than the hint's, the
/// bottom of the plateau.
struct Exclusion<'a> {
    /// The token before the hint's suffix in the context.
    before: NextKey,
    count: u64,
    /// The longest match's: its occurrences end where the plateau bottom's do (their counts are
    /// equal and one holds the other), so they are followed by the same tokens.
    plateau: &'a Matches,
}

impl Index {
    /// The hints after every position of `seq` (module notes).
    pub fn hints(&self, seq: &[u32], opts: &HintOptions) -> Result<(Vec<Hint>, HintCost)> {
        if opts.samples == 0 || opts.samples > MAX_SAMPLES || opts.min_plateau < 2 {
            return Err(IndexError::Invalid(format!(
                "hints take 1..={MAX_SAMPLES} samples and a plateau of at least 2 lengths, not {} and {}",
                opts.samples, opts.min_plateau
            )));
        }
        if let Some(bad) = seq.iter().find(|&&t| u64::from(t) >= self.vocab_size()) {
            return Err(IndexError::Invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.vocab_size()
            )));
        }
        // Seeded by the sequence too: sequences of one batch draw independently, and a sequence
        // draws the same wherever it stands in a batch.
        let tokens: Vec<u8> = seq.iter().flat_map(|t| t.to_le_bytes()).collect();
        let mut rng = StdRng::seed_from_u64(opts.seed ^ xxh3_64(&tokens));
        let mut cost = HintCost::default();
        let mut hints = Vec::with_capacity(seq.len());
        let mut matched = SuffixMatch::new(self);
        // The plateau's bottom a at the last position, and the matches of its (a − 1)-gram there.
        let mut bottom = 0;
        let mut below: Option<Matches> = None;
        for end in 1..=seq.len() {
            if crate::interrupt::interrupted() {
                return Err(IndexError::Interrupted);
            }
            let context = &seq[..end];
            let before = matched.suffix_len();
            if matched.advance(self, context) == 0 {
                cost.searches += probes(before);
            }
            cost.searches += 1;
            let longest = matched.suffix_len();
            cost.positions += 1;
            cost.fresh_searches += probes(longest);
            let top = matched.prompt_cnt();
            let suffix = |n: usize| &context[end - n..];
            if !opts.regularise || longest == 0 {
                (bottom, below) = (longest, None);
                hints.push(self.hint(longest, matched.matches(), None, opts, &mut rng)?);
                continue;
            }
            cost.fresh_searches += probes(longest);
            // The (a − 1)-gram's matches: the last position's extended by the new token when a
            // rose by one, as it does while the match grows.
            let mut a = (bottom + 1).min(longest);
            let mut under = match below.take() {
                _ if a == 1 => self.everything(),
                Some(mut m) if a == bottom + 1 => {
                    cost.searches += 1;
                    self.grow(&mut m, context[end - 1]);
                    m
                }
                _ => {
                    cost.searches += 1;
                    self.locate(self.encode(suffix(a - 1)))
                }
            };
            while a > 1 && under.count() == top {
                a -= 1;
                under = match a {
                    1 => self.everything(),
                    _ => {
                        cost.searches += 1;
                        self.locate(self.encode(suffix(a - 1)))
                    }
                };
            }
            bottom = a;
            let hint = match longest + 1 - a >= opts.min_plateau {
                true => {
                    let exclusion = Exclusion {
                        before: NextKey::from(context[end - a]),
                        count: top,
                        plateau: matched.matches(),
                    };
                    self.hint(a - 1, &under, Some(&exclusion), opts, &mut rng)?
                }
                false => self.hint(longest, matched.matches(), None, opts, &mut rng)?,
            };
            below = Some(under);
            hints.push(hint);
        }
        Ok((hints, cost))
    }

    fn hint(
        &self,
        suffix_len: usize,
        matches: &Matches,
        exclusion: Option<&Exclusion>,
        opts: &HintOptions,
        rng: &mut StdRng,
    ) -> Result<Hint> {
        let excluded = exclusion.map_or(0, |ex| ex.count);
        let count = matches.count().saturating_sub(excluded);
        let (tokens, counts) = match opts.exact {
            true => {
                let mut top = self.kept_counts(matches, exclusion)?;
                let by_count = |a: &(u32, u64), b: &(u32, u64)| b.1.cmp(&a.1).then(a.0.cmp(&b.0));
                if top.len() > opts.samples {
                    top.select_nth_unstable_by(opts.samples, by_count);
                    top.truncate(opts.samples);
                }
                top.sort_by(by_count);
                top.into_iter().unzip()
            }
            false => (
                self.sample_next(matches, exclusion, opts.samples, rng)?,
                Vec::new(),
            ),
        };
        Ok(Hint {
            suffix_len,
            count,
            excluded,
            tokens,
            counts,
        })
    }

    /// Exact next-token counts of the matches less the excluded occurrences' (the empty suffix's
    /// from the index's kept unigram counts, read without a copy).
    fn kept_counts(
        &self,
        matches: &Matches,
        exclusion: Option<&Exclusion>,
    ) -> Result<Vec<(u32, u64)>> {
        let excluded = match exclusion {
            Some(ex) => self.ntd_given(ex.plateau, None)?.dist,
            None => BTreeMap::new(),
        };
        let kept = |(&token, &n): (&u32, &u64)| {
            let n = n.saturating_sub(excluded.get(&token).copied().unwrap_or(0));
            (n > 0).then_some((token, n))
        };
        Ok(self
            .exact_counts(matches)?
            .iter()
            .filter_map(kept)
            .collect())
    }

    /// `samples` next tokens of occurrences drawn uniformly from the matches less the excluded.
    fn sample_next(
        &self,
        matches: &Matches,
        exclusion: Option<&Exclusion>,
        samples: usize,
        rng: &mut StdRng,
    ) -> Result<Vec<u32>> {
        let total = matches.count();
        let qlen = matches.bytes.len();
        let next = |(part, rank): (&Part, u64)| self.token_of(part.next_key(rank, qlen));
        let Some(ex) = exclusion else {
            return Ok(match total {
                0 => Vec::new(),
                _ => (0..samples)
                    .filter_map(|_| self.occurrence(matches, rng.random_range(0..total)))
                    .map(next)
                    .collect(),
            });
        };
        // A part's first position has no token before it: under the empty suffix it stands for
        // no occurrence the counts know (they count a part's last token as followed by its end),
        // so it is not drawn; under a longer one it is an occurrence like any other.
        let kept = |(part, rank): (&Part, u64)| match part.prev_key(rank) {
            Some(p) => p != ex.before,
            None => qlen > 0,
        };
        // At most this many are kept (fewer only by a part's first position).
        let most_kept = total.saturating_sub(ex.count);
        if most_kept == 0 {
            return Ok(Vec::new());
        }
        // A scan reads every occurrence once, in rank order; a draw reads a random one (its
        // pointer too, about twice the cost) and keeps it one time in total / kept. Drawing costs
        // less once more than twice the samples are kept, and when its draws are likely enough.
        let draws_enough = total <= REJECTION_DRAWS as u64 / 2 * most_kept;
        if total <= SCAN_LIMIT && (most_kept <= 2 * samples as u64 || !draws_enough) {
            let pool: Vec<u32> = (0..total)
                .filter_map(|k| self.occurrence(matches, k))
                .filter(|&at| kept(at))
                .map(next)
                .collect();
            return Ok(match pool.len() {
                0 => Vec::new(),
                n => (0..samples).map(|_| pool[rng.random_range(0..n)]).collect(),
            });
        }
        let mut out = Vec::with_capacity(samples);
        for _ in 0..samples * REJECTION_DRAWS {
            match self.occurrence(matches, rng.random_range(0..total)) {
                Some(at) if kept(at) => out.push(next(at)),
                _ => continue,
            }
            if out.len() == samples {
                return Ok(out);
            }
        }
        // Most occurrences are excluded: the rest come from the exact counts.
        let rest = draw(
            &self.kept_counts(matches, exclusion)?,
            samples - out.len(),
            rng,
        );
        out.extend(rest);
        Ok(out)
    }

    /// The part and rank of the `k`-th occurrence of the matches (over the parts in order).
    fn occurrence<'a>(&'a self, matches: &Matches, mut k: u64) -> Option<(&'a Part, u64)> {
        for (part, range) in self.parts.iter().zip(&matches.ranges) {
            if k < range.len() {
                return Some((part, range.lo + k));
            }
            k -= range.len();
        }
        None
    }
}

/// `samples` tokens drawn from `counts` in proportion.
fn draw(counts: &[(u32, u64)], samples: usize, rng: &mut StdRng) -> Vec<u32> {
    let mut cumulative = Vec::with_capacity(counts.len());
    let mut sum = 0u64;
    for &(token, n) in counts {
        sum += n;
        cumulative.push((sum, token));
    }
    if sum == 0 {
        return Vec::new();
    }
    (0..samples)
        .filter_map(|_| {
            let pick = rng.random_range(0..sum);
            let at = cumulative.partition_point(|&(upto, _)| upto <= pick);
            cumulative.get(at).map(|&(_, token)| token)
        })
        .collect()
}
