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

use std::collections::BTreeMap;

use rand::distr::weighted::WeightedIndex;
use rand::distr::Distribution;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::index::query::Matches;
use crate::index::suffix::SuffixMatch;
use crate::index::{Index, IndexError, Result};

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
pub struct Level {
    pub suffix_len: usize,
    matches: Matches,
}

impl Level {
    pub fn count(&self) -> u64 {
        self.matches.count()
    }
}

impl Index {
    /// The levels of `context` (ids checked by the caller): its longest occurring suffix (of
    /// `longest` tokens, with `matches`), then each shorter suffix whose count grows, at most `max`.
    /// Each is found by binary search over the lengths below the last (counts only grow as a
    /// suffix shrinks), O(log n) lookups a level.
    pub(crate) fn backoff_levels(
        &self,
        context: &[u32],
        longest: usize,
        matches: Matches,
        max: Option<usize>,
    ) -> Vec<Level> {
        let n = context.len();
        let total = self.everything().count();
        let mut levels = vec![Level {
            suffix_len: longest,
            matches,
        }];
        while max.is_none_or(|k| levels.len() < k) {
            let last = &levels[levels.len() - 1];
            let (above, seen) = (last.suffix_len, last.count());
            if above == 0 || total <= seen {
                break;
            }
            // count(good) > seen ≥ count(bad).
            let (mut good, mut bad) = (0, above);
            let mut good_m = None;
            while bad - good > 1 {
                let mid = good + (bad - good) / 2;
                let m = self.locate(self.encode(&context[n - mid..]));
                if m.count() > seen {
                    (good, good_m) = (mid, Some(m));
                } else {
                    bad = mid;
                }
            }
            levels.push(Level {
                suffix_len: good,
                matches: good_m.unwrap_or_else(|| self.everything()),
            });
        }
        levels
    }

    /// The back-off probability of `next` after the levels: one count per level.
    pub(crate) fn backoff_prob(&self, levels: &[Level], next: u32, spec: &Backoff) -> f64 {
        let (mut num, mut den, mut w) = (0.0, 0.0, 1.0);
        for level in levels {
            let m = level.count() as f64;
            let c = self.cont_count(&level.matches, next) as f64;
            match spec.weighting {
                Weighting::Counts => (num, den) = (num + w * c, den + w * m),
                Weighting::Distributions => (num, den) = (num + w * c / m, den + w),
            }
            w *= spec.decay;
        }
        let mixed = if den > 0.0 { num / den } else { 0.0 };
        (1.0 - spec.floor) * mixed + spec.floor / self.vocab_size() as f64
    }

    /// The whole back-off distribution after the levels (the floor left out: it is the same for
    /// every token), as probabilities that sum to 1 − floor.
    pub(crate) fn backoff_distribution(
        &self,
        levels: &[Level],
        spec: &Backoff,
    ) -> Result<BTreeMap<u32, f64>> {
        let mut mixed: BTreeMap<u32, f64> = BTreeMap::new();
        let (mut den, mut w) = (0.0, 1.0);
        for level in levels {
            let m = level.count() as f64;
            let scale = match spec.weighting {
                Weighting::Counts => w,
                Weighting::Distributions => w / m,
            };
            for (&token, &c) in self.exact_counts(&level.matches)?.iter() {
                *mixed.entry(token).or_default() += scale * c as f64;
            }
            den += scale * m;
            w *= spec.decay;
        }
        let keep = 1.0 - spec.floor;
        for p in mixed.values_mut() {
            *p *= keep / den;
        }
        Ok(mixed)
    }
}

/// What [`Index::backoff_generate`] made.
#[derive(Debug, Clone, PartialEq)]
pub struct BackoffGeneration {
    /// The new tokens (the prompt left out), ending at the end of text if one was drawn.
    pub tokens: Vec<u32>,
    /// For each new token, each level's suffix length and match count (the post's n − 1 and m).
    pub levels: Vec<Vec<(usize, u64)>>,
}

impl Index {
    /// The back-off probability of every token of `seq` given the tokens before it (the first given
    /// the empty context): the standalone language model's scores. The longest suffix is kept up to
    /// date token by token, the shorter levels are searched at each position.
    pub fn backoff_score(&self, seq: &[u32], spec: &Backoff) -> Result<Vec<f64>> {
        spec.check()?;
        self.check_ids(seq)?;
        let mut suffix = SuffixMatch::new(self);
        let mut probs = Vec::with_capacity(seq.len());
        for (i, &token) in seq.iter().enumerate() {
            if i % 1024 == 1023 && crate::interrupt::interrupted() {
                return Err(IndexError::Interrupted);
            }
            let levels = self.backoff_levels(
                &seq[..i],
                suffix.suffix_len(),
                suffix.matches().clone(),
                spec.levels,
            );
            probs.push(self.backoff_prob(&levels, token, spec));
            suffix.advance(self, &seq[..=i]);
        }
        Ok(probs)
    }

    /// Up to `max_new` tokens after `prompt`, each drawn from the back-off distribution raised to
    /// `1 / temperature` (the most likely token when the temperature is 0) with a seeded generator;
    /// stops after an end of text.
    pub fn backoff_generate(
        &self,
        prompt: &[u32],
        spec: &Backoff,
        max_new: usize,
        temperature: f64,
        seed: u64,
    ) -> Result<BackoffGeneration> {
        spec.check()?;
        self.check_ids(prompt)?;
        if !(temperature >= 0.0 && temperature.is_finite()) {
            return Err(IndexError::Invalid(format!(
                "temperature must be finite and at least 0, not {temperature}"
            )));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut seq = prompt.to_vec();
        let mut suffix = SuffixMatch::of(self, prompt)?;
        let mut out = BackoffGeneration {
            tokens: Vec::new(),
            levels: Vec::new(),
        };
        while out.tokens.len() < max_new {
            if crate::interrupt::interrupted() {
                return Err(IndexError::Interrupted);
            }
            let levels = self.backoff_levels(
                &seq,
                suffix.suffix_len(),
                suffix.matches().clone(),
                spec.levels,
            );
            let dist = self.backoff_distribution(&levels, spec)?;
            let token = draw(&dist, temperature, &mut rng);
            out.levels
                .push(levels.iter().map(|l| (l.suffix_len, l.count())).collect());
            out.tokens.push(token);
            if token == self.eos_token_id() {
                break;
            }
            seq.push(token);
            suffix.advance(self, &seq);
        }
        Ok(out)
    }
}

/// A token from `dist` (probabilities; the floor's even share is left out, so a token the corpus
/// never shows is never drawn): the most likely at temperature 0, else drawn from `p^(1/T)`.
fn draw(dist: &BTreeMap<u32, f64>, temperature: f64, rng: &mut StdRng) -> u32 {
    if temperature == 0.0 {
        return dist
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(a.0)))
            .map_or(0, |(&t, _)| t);
    }
    let weights: Vec<f64> = dist.values().map(|p| p.powf(1.0 / temperature)).collect();
    match WeightedIndex::new(&weights) {
        Ok(pick) => dist.keys().nth(pick.sample(rng)).copied().unwrap_or(0),
        Err(_) => draw(dist, 0.0, rng),
    }
}
