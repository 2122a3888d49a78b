//! Selective back-off interpolation (the tiny-infini-gram post): the ∞-gram as a standalone language
//! model that does not copy its corpus verbatim and has a finite perplexity.
//!
//! The ∞-gram's own distribution is usually sparse (one match, one next token), so sampling from it
//! copies a document and scoring with it gives held-out text probability 0. Instead take k levels:
//! the longest suffix of the context that occurs, then each next shorter suffix whose count grows (a
//! suffix with the same count has the same matches, hence the same distribution), and mix their
//! next-token distributions with weights decaying as `decay^i` (0.1 in the post).
//!
//! How the levels mix ([`Weighting`]): the post's code adds `decay^i × count` (so a level with
//! ten times the matches speaks ten times louder), which is what its perplexity table measured; the
//! alternative averages the levels' normalised distributions. A `floor` of probability mass spread
//! evenly over the vocabulary keeps every token possible (a byte that never occurs in the corpus).

use std::borrow::Cow;
use std::collections::BTreeMap;

use rand::distr::weighted::WeightedIndex;
use rand::distr::Distribution;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::index::suffix::{Counted, Occurrences, SuffixMatch};
use crate::index::{IndexError, Result};

/// How the levels' counts are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weighting {
    /// `Σ decay^i · count_i(t)`, normalised: the post's rule.
    #[default]
    Counts,
    /// `Σ decay^i · count_i(t) / matches_i`, normalised: a mixture of the levels' distributions.
    Distributions,
}

impl std::str::FromStr for Weighting {
    type Err = IndexError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "counts" => Ok(Weighting::Counts),
            "distributions" => Ok(Weighting::Distributions),
            other => Err(IndexError::Invalid(format!(
                "weighting must be counts or distributions, not {other:?}"
            ))),
        }
    }
}

/// The back-off model's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Levels to mix (k); `None` takes every level down to the empty suffix.
    pub levels: Option<usize>,
    /// Weight of level i is `decay^i`.
    pub decay: f64,
    pub weighting: Weighting,
    /// Probability mass spread evenly over the vocabulary.
    pub floor: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            levels: Some(2),
            decay: 0.1,
            weighting: Weighting::Counts,
            floor: 1e-6,
        }
    }
}

impl Backoff {
    /// Refuses settings that give no distribution.
    pub fn check(&self) -> Result<()> {
        let ok = self.levels != Some(0)
            && self.decay > 0.0
            && self.decay <= 1.0
            && (0.0..1.0).contains(&self.floor);
        if ok {
            Ok(())
        } else {
            Err(IndexError::Invalid(format!(
                "back-off needs at least one level, a decay in (0, 1] and a floor in [0, 1): {self:?}"
            )))
        }
    }
}

/// One level: a suffix of the context and its matches.
struct Level<M> {
    suffix_len: usize,
    matches: M,
}

impl<M: Counted> Level<M> {
    fn count(&self) -> u64 {
        self.matches.count()
    }
}

/// The levels of `context` (ids checked by the caller): its longest occurring suffix (of
/// `longest` tokens, with `matches`), then each shorter suffix whose count grows, at most `max`.
/// Each is found by binary search over the lengths below the last (counts only grow as a
/// suffix shrinks), O(log n) lookups a level.
fn levels<I: Occurrences + ?Sized>(
    index: &I,
    context: &[u32],
    longest: usize,
    matches: I::Matches,
    max: Option<usize>,
) -> Vec<Level<I::Matches>> {
    let n = context.len();
    let everything = || index.matches_of(&[]);
    let total = everything().count();
    let mut levels = vec![Level {
        suffix_len: longest,
        matches,
    }];
    while max.is_none_or(|k| levels.len() < k) {
        let last = &levels[levels.len() - 1];
        let Some(mut search) = LevelSearch::below(last.suffix_len, last.count(), total) else {
            break;
        };
        let mut found = None;
        while let Some(len) = search.next_probe() {
            let m = index.matches_of(&context[n - len..]);
            if search.counted(len, m.count()) {
                found = Some(m);
            }
        }
        levels.push(Level {
            suffix_len: search.found(),
            matches: found.unwrap_or_else(everything),
        });
    }
    levels
}

/// The search for the level below a suffix of `above` tokens matched `seen` times: the longest
/// shorter suffix matched more often, by binary search (counts only grow as a suffix shrinks),
/// O(log n) counts. Whoever counts (an index, a router's shards) feeds it.
pub struct LevelSearch {
    /// count(good) > seen ≥ count(bad).
    good: usize,
    bad: usize,
    seen: u64,
}

impl LevelSearch {
    /// `None` when there is no level below: the suffix is empty, or matches all `total` places.
    pub fn below(above: usize, seen: u64, total: u64) -> Option<Self> {
        (above > 0 && seen < total).then_some(Self {
            good: 0,
            bad: above,
            seen,
        })
    }

    /// The suffix length to count next, until the search is done.
    pub fn next_probe(&self) -> Option<usize> {
        (self.bad - self.good > 1).then(|| self.good + (self.bad - self.good) / 2)
    }

    /// Takes in the count of the suffix of `len` tokens: true when it is the longest found yet.
    pub fn counted(&mut self, len: usize, count: u64) -> bool {
        match count > self.seen {
            true => self.good = len,
            false => self.bad = len,
        }
        count > self.seen
    }

    /// The level's suffix length (0: the empty suffix, every place).
    pub fn found(&self) -> usize {
        self.good
    }
}

/// The back-off probability of `next` after the levels: one count per level.
fn probability<I: Occurrences + ?Sized>(
    index: &I,
    levels: &[Level<I::Matches>],
    next: u32,
    spec: &Backoff,
) -> f64 {
    let (mut num, mut den, mut w) = (0.0, 0.0, 1.0);
    for level in levels {
        let m = level.count() as f64;
        let c = index.cont_count(&level.matches, next) as f64;
        match spec.weighting {
            Weighting::Counts => (num, den) = (num + w * c, den + w * m),
            Weighting::Distributions => (num, den) = (num + w * c / m, den + w),
        }
        w *= spec.decay;
    }
    let mixed = if den > 0.0 { num / den } else { 0.0 };
    (1.0 - spec.floor) * mixed + spec.floor / index.vocab_size() as f64
}

/// One level as generation reads it: its suffix length, its matches and what followed them.
pub struct CountedLevel<'a> {
    pub suffix_len: usize,
    pub count: u64,
    pub next: Cow<'a, BTreeMap<u32, u64>>,
}

/// The whole back-off distribution after the levels (the floor left out: it is the same for
/// every token), as probabilities that sum to 1 − floor.
fn mix(levels: &[CountedLevel], spec: &Backoff) -> BTreeMap<u32, f64> {
    let mut mixed: BTreeMap<u32, f64> = BTreeMap::new();
    let (mut den, mut w) = (0.0, 1.0);
    for level in levels {
        let m = level.count as f64;
        let scale = match spec.weighting {
            Weighting::Counts => w,
            Weighting::Distributions => w / m,
        };
        for (&token, &c) in level.next.iter() {
            *mixed.entry(token).or_default() += scale * c as f64;
        }
        den += scale * m;
        w *= spec.decay;
    }
    let keep = 1.0 - spec.floor;
    for p in mixed.values_mut() {
        *p *= keep / den;
    }
    mixed
}

/// What [`generate`] made.
#[derive(Debug, Clone, PartialEq)]
pub struct BackoffGeneration {
    /// The new tokens (the prompt left out), ending at the end of text if one was drawn.
    pub tokens: Vec<u32>,
    /// For each new token, each level's suffix length and match count (the post's n − 1 and m).
    pub levels: Vec<Vec<(usize, u64)>>,
}

/// The back-off probability of every token of `seq` given the tokens before it (the first given
/// the empty context): the standalone language model's scores. The longest suffix is kept up to
/// date token by token, the shorter levels are searched at each position.
pub fn score<I: Occurrences + ?Sized>(index: &I, seq: &[u32], spec: &Backoff) -> Result<Vec<f64>> {
    spec.check()?;
    index.check_query(seq)?;
    let mut suffix = SuffixMatch::new(index);
    let mut probs = Vec::with_capacity(seq.len());
    for (i, &token) in seq.iter().enumerate() {
        if i % 1024 == 1023 && crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted);
        }
        let levels = levels(
            index,
            &seq[..i],
            suffix.suffix_len(),
            suffix.matches().clone(),
            spec.levels,
        );
        probs.push(probability(index, &levels, token, spec));
        suffix.advance(index, &seq[..=i]);
    }
    Ok(probs)
}

/// How [`generate`] draws its tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    /// Tokens to draw at most.
    pub max_new: usize,
    /// Each is drawn from the back-off distribution raised to `1 / temperature` (the most likely
    /// token when the temperature is 0)...
    pub temperature: f64,
    /// ...with a generator seeded so.
    pub seed: u64,
}

impl Draw {
    /// Refuses a temperature that gives no distribution.
    pub fn check(&self) -> Result<()> {
        match self.temperature >= 0.0 && self.temperature.is_finite() {
            true => Ok(()),
            false => Err(IndexError::Invalid(format!(
                "temperature must be finite and at least 0, not {}",
                self.temperature
            ))),
        }
    }
}

/// Where generation reads each step's levels: an index, or a router's shard servers.
pub trait LevelSource {
    fn eos_token_id(&self) -> u32;
    /// The levels after `seq`, at most `max`. `seq` is the prompt at the first call and one token
    /// longer at each call after it ([`generate_from`] calls so), which lets a source follow it.
    fn levels(&mut self, seq: &[u32], max: Option<usize>) -> Result<Vec<CountedLevel<'_>>>;
}

/// An index's levels, its longest suffix's match followed token by token.
struct IndexLevels<'a, I: Occurrences + ?Sized> {
    index: &'a I,
    suffix: SuffixMatch<I::Matches>,
}

impl<I: Occurrences + ?Sized> LevelSource for IndexLevels<'_, I> {
    fn eos_token_id(&self) -> u32 {
        self.index.eos_token_id()
    }

    fn levels(&mut self, seq: &[u32], max: Option<usize>) -> Result<Vec<CountedLevel<'_>>> {
        if crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted);
        }
        // The token drawn last, taken in (the prompt was at the start).
        if seq.len() > self.suffix.seen() {
            self.suffix.advance(self.index, seq);
        }
        let (len, matches) = (self.suffix.suffix_len(), self.suffix.matches().clone());
        levels(self.index, seq, len, matches, max)
            .into_iter()
            .map(|level| {
                Ok(CountedLevel {
                    suffix_len: level.suffix_len,
                    count: level.count(),
                    next: self.index.next_counts(&level.matches)?,
                })
            })
            .collect()
    }
}

/// Tokens after `prompt` drawn from `index`'s back-off distribution as `draw` says; stops after
/// an end of text.
pub fn generate<I: Occurrences + ?Sized>(
    index: &I,
    prompt: &[u32],
    spec: &Backoff,
    draw: Draw,
) -> Result<BackoffGeneration> {
    spec.check()?;
    draw.check()?;
    let suffix = SuffixMatch::of(index, prompt)?;
    generate_from(&mut IndexLevels { index, suffix }, prompt, spec, draw)
}

/// Tokens after `prompt` drawn from the back-off distribution of `source`'s levels as `draw`
/// says; stops after an end of text. The caller has checked the prompt's ids, `spec` and `draw`
/// (before any work: a router's shards are asked nothing for a request refused).
pub(crate) fn generate_from(
    source: &mut impl LevelSource,
    prompt: &[u32],
    spec: &Backoff,
    draw: Draw,
) -> Result<BackoffGeneration> {
    let Draw {
        max_new,
        temperature,
        seed,
    } = draw;
    let eos = source.eos_token_id();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seq = prompt.to_vec();
    let mut out = BackoffGeneration {
        tokens: Vec::new(),
        levels: Vec::new(),
    };
    while out.tokens.len() < max_new {
        let levels = source.levels(&seq, spec.levels)?;
        let token = draw_from(&mix(&levels, spec), temperature, &mut rng);
        out.levels
            .push(levels.iter().map(|l| (l.suffix_len, l.count)).collect());
        out.tokens.push(token);
        if token == eos {
            break;
        }
        seq.push(token);
    }
    Ok(out)
}

/// A token from `dist` (probabilities; the floor's even share is left out, so a token the corpus
/// never shows is never drawn): the most likely at temperature 0, else drawn from `p^(1/T)`.
fn draw_from(dist: &BTreeMap<u32, f64>, temperature: f64, rng: &mut StdRng) -> u32 {
    if temperature == 0.0 {
        return dist
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(a.0)))
            .map_or(0, |(&t, _)| t);
    }
    let weights: Vec<f64> = dist.values().map(|p| p.powf(1.0 / temperature)).collect();
    match WeightedIndex::new(&weights) {
        Ok(pick) => dist.keys().nth(pick.sample(rng)).copied().unwrap_or(0),
        Err(_) => draw_from(dist, 0.0, rng),
    }
}
