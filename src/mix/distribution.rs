//! The mixed next-token distribution, built without a vocabulary-wide ∞-gram vector: the ∞-gram
//! puts mass on the few tokens that followed the matched suffix, so only those and the neural
//! model's own top tokens can lead the mixture.

use serde::Serialize;

use super::{mixed_prob, MixError};
use crate::index::query::NtdResult;
use crate::softmax::log_softmax;

/// The ∞-gram's next-token distribution: the tokens seen after the matched suffix, with probabilities
/// that sum to one, sorted by token so a lookup is a binary search (the support of a short suffix
/// can be most of the vocabulary).
///
/// From a byte-level index the entries cover what the model's candidates spell and sum to less, and
/// the mass they leave (`model_share`) is given to every token in proportion to the model's
/// probability of it (see `evidence::bytes`). From a token index that share is 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SparseDistribution {
    entries: Vec<(u32, f64)>,
    model_share: f64,
}

impl SparseDistribution {
    pub fn new(mut entries: Vec<(u32, f64)>) -> Self {
        entries.sort_by_key(|(t, _)| *t);
        Self {
            entries,
            model_share: 0.0,
        }
    }

    /// Entries that sum to 1 − `model_share`, the rest given out in the model's shape.
    pub fn deferring(entries: Vec<(u32, f64)>, model_share: f64) -> Self {
        Self {
            model_share,
            ..Self::new(entries)
        }
    }

    /// Memory held, for callers that keep distributions around.
    pub fn heap_bytes(&self) -> usize {
        self.entries.len() * std::mem::size_of::<(u32, f64)>()
    }

    /// (token, probability), by token.
    pub fn entries(&self) -> &[(u32, f64)] {
        &self.entries
    }

    /// From an engine answer (counts, or samples when `approx`), normalised.
    pub fn from_ntd(ntd: &NtdResult) -> Self {
        let total: u64 = ntd.dist.values().sum();
        let entries = match total {
            0 => Vec::new(),
            t => ntd
                .dist
                .iter()
                .map(|(&token, &c)| (token, c as f64 / t as f64))
                .collect(),
        };
        Self::new(entries)
    }

    /// P∞(token), where the model gives the distribution `neural`.
    pub fn prob(&self, token: u32, neural: &NeuralDistribution) -> f64 {
        self.prob_beside(token, neural.prob(token))
    }

    /// P∞(token), where the model gives the token `neural_prob`.
    pub fn prob_beside(&self, token: u32, neural_prob: f64) -> f64 {
        let entry = self
            .entries
            .binary_search_by_key(&token, |(t, _)| *t)
            .map_or(0.0, |i| self.entries[i].1);
        self.with_share(entry, neural_prob)
    }

    /// P∞ of a token whose entry is `entry` (0 for none), where the model gives it `neural_prob`.
    fn with_share(&self, entry: f64, neural_prob: f64) -> f64 {
        entry + self.model_share * neural_prob
    }
}

/// A neural next-token distribution as an inference server has it: every log-prob, or only the top
/// tokens plus the mass left over for the rest of the vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub enum NeuralDistribution {
    Full {
        logprobs: Vec<f32>,
    },
    /// Built by [`NeuralDistribution::from_top_k`], which checks and sorts it.
    TopK(TopKProbs),
}

/// The top-k tokens' probabilities plus the rest, sorted by token: a lookup is a binary search,
/// and `mix` walks the list along the ∞-gram's support (a caller may send thousands of entries).
/// The caller's log-probs are exponentiated once, here: a step reads each several times.
#[derive(Debug, Clone, PartialEq)]
pub struct TopKProbs {
    entries: Vec<(u32, f64)>,
    /// Probability of all other tokens together; spread evenly over them when one is asked for.
    rest_mass: f64,
    vocab_size: usize,
}

impl TopKProbs {
    /// The probability of each token outside the list.
    fn other_prob(&self) -> f64 {
        self.rest_mass / (self.vocab_size - self.entries.len()).max(1) as f64
    }
}

impl NeuralDistribution {
    /// From raw logits.
    pub fn from_logits(logits: &[f32]) -> Result<Self, MixError> {
        if logits.is_empty() || logits.iter().any(|l| !l.is_finite()) {
            return Err(MixError::Invalid(
                "logits must be non-empty and finite".into(),
            ));
        }
        Ok(Self::Full {
            logprobs: log_softmax(logits),
        })
    }

    /// From a caller's logits, which must cover the vocabulary of `vocab_size` ids exactly.
    pub fn from_vocab_logits(logits: &[f32], vocab_size: usize) -> Result<Self, MixError> {
        if logits.len() != vocab_size {
            return Err(MixError::Invalid(format!(
                "{} logits for a vocabulary of {vocab_size}",
                logits.len()
            )));
        }
        Self::from_logits(logits)
    }

    /// From top-k log-probs and the remaining mass, checked for consistency.
    pub fn from_top_k(
        entries: Vec<(u32, f32)>,
        rest_mass: f64,
        vocab_size: usize,
    ) -> Result<Self, MixError> {
        if entries
            .iter()
            .any(|(t, lp)| *t as usize >= vocab_size || lp.is_nan() || *lp > 0.0)
        {
            return Err(MixError::Invalid(
                "top-k entries need ids inside the vocabulary and log-probs ≤ 0".into(),
            ));
        }
        let mut entries: Vec<(u32, f64)> = (entries.into_iter())
            .map(|(t, lp)| (t, (lp as f64).exp()))
            .collect();
        let listed: f64 = entries.iter().map(|(_, p)| p).sum();
        if !(0.0..=1.0).contains(&rest_mass) || (listed + rest_mass - 1.0).abs() > 1e-3 {
            return Err(MixError::Invalid(format!(
                "top-k mass {listed:.6} plus the rest {rest_mass:.6} must be 1"
            )));
        }
        if entries.len() > vocab_size {
            return Err(MixError::Invalid(
                "more top-k entries than the vocabulary".into(),
            ));
        }
        entries.sort_by_key(|(t, _)| *t);
        if entries.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(MixError::Invalid(
                "a token appears twice in the top-k".into(),
            ));
        }
        Ok(Self::TopK(TopKProbs {
            entries,
            rest_mass,
            vocab_size,
        }))
    }

    /// Memory held, for callers that keep distributions around.
    pub fn heap_bytes(&self) -> usize {
        match self {
            Self::Full { logprobs } => logprobs.len() * 4,
            Self::TopK(t) => t.entries.len() * std::mem::size_of::<(u32, f64)>(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Full { logprobs } => logprobs.len(),
            Self::TopK(t) => t.vocab_size,
        }
    }

    pub fn prob(&self, token: u32) -> f64 {
        match self {
            Self::Full { logprobs } => logprobs
                .get(token as usize)
                .map_or(0.0, |lp| (*lp as f64).exp()),
            Self::TopK(t) => match t.entries.binary_search_by_key(&token, |(tok, _)| *tok) {
                Ok(i) => t.entries[i].1,
                Err(_) => t.other_prob(),
            },
        }
    }

    /// [`Self::prob`] for tokens asked in ascending order: over top-k input a cursor walks the list
    /// once, where a search per token cost most of a mix (an ∞-gram's support runs to thousands).
    fn ascending_prob(&self) -> impl FnMut(u32) -> f64 + '_ {
        let mut at = 0;
        move |token| match self {
            Self::Full { .. } => self.prob(token),
            Self::TopK(t) => {
                while t.entries.get(at).is_some_and(|&(listed, _)| listed < token) {
                    at += 1;
                }
                match t.entries.get(at) {
                    Some(&(listed, p)) if listed == token => p,
                    _ => t.other_prob(),
                }
            }
        }
    }

    /// The `k` most likely tokens with their probabilities, most likely first.
    pub fn top(&self, k: usize) -> Vec<(u32, f64)> {
        let mut all: Vec<(u32, f64)> = match self {
            Self::Full { logprobs } => {
                let mut idx: Vec<u32> = (0..logprobs.len() as u32).collect();
                let k = k.min(idx.len());
                if k > 0 && k < idx.len() {
                    idx.select_nth_unstable_by(k - 1, |a, b| {
                        logprobs[*b as usize].total_cmp(&logprobs[*a as usize])
                    });
                }
                idx[..k]
                    .iter()
                    .map(|&t| (t, (logprobs[t as usize] as f64).exp()))
                    .collect()
            }
            Self::TopK(t) => t.entries.clone(),
        };
        if k > 0 && k < all.len() {
            all.select_nth_unstable_by(k - 1, most_likely_first);
        }
        all.truncate(k);
        all.sort_by(most_likely_first);
        all
    }

    /// Entropy (nats) and top probability; for top-k input the rest is taken as spread evenly.
    pub fn entropy_and_top(&self) -> (f64, f64) {
        let h = |p: f64| if p > 0.0 { -p * p.ln() } else { 0.0 };
        match self {
            Self::Full { logprobs } => logprobs.iter().fold((0.0, 0.0), |(e, top), &lp| {
                let p = (lp as f64).exp();
                (e + h(p), f64::max(top, p))
            }),
            Self::TopK(t) => {
                let others = (t.vocab_size - t.entries.len()).max(1) as f64;
                let (mut e, mut top) = (others * h(t.other_prob()), t.other_prob());
                for &(_, p) in &t.entries {
                    e += h(p);
                    top = top.max(p);
                }
                (e, top)
            }
        }
    }
}

/// The head of a mixed distribution.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MixedDistribution {
    /// (token, probability), most likely first.
    pub top: Vec<(u32, f64)>,
    /// Probability of every token not listed, together.
    pub rest_mass: f64,
    pub lambda: f64,
}

/// The order of a top list: most likely first, ties by token id.
fn most_likely_first(a: &(u32, f64), b: &(u32, f64)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The `top_k` most likely tokens of λ·P∞ + (1−λ)·P_neural. Only tokens in the ∞-gram's support or
/// the neural top-k can be among them: any other token has at most (1−λ) times the k-th neural
/// probability, which every neural top-k token reaches (with a model share s, (1−λ+λs) times it).
/// The support of a short suffix runs to thousands of tokens, so each is scored once and the top
/// selected, not sorted (a batch step mixes tens of sequences).
pub fn mix(
    infgram: &SparseDistribution,
    neural: &NeuralDistribution,
    lambda: f64,
    top_k: usize,
) -> MixedDistribution {
    if top_k == 0 {
        return MixedDistribution {
            top: Vec::new(),
            rest_mass: 1.0,
            lambda,
        };
    }
    let vocab = neural.vocab_size();
    let score = |token: u32, entry: f64, neural_prob: f64| {
        let p_infgram = infgram.with_share(entry, neural_prob);
        (token, mixed_prob(p_infgram, neural_prob, lambda))
    };
    let head = neural.top(top_k);
    let mut top: Vec<(u32, f64)> = Vec::with_capacity(infgram.entries.len() + head.len());
    let mut neural_prob = neural.ascending_prob();
    top.extend(
        (infgram.entries.iter())
            .filter(|(t, _)| (*t as usize) < vocab)
            .map(|&(t, p)| score(t, p, neural_prob(t))),
    );
    top.extend(
        head.into_iter()
            .filter(|(t, _)| infgram.entries.binary_search_by_key(t, |e| e.0).is_err())
            .map(|(t, p)| score(t, 0.0, p)),
    );
    if top.len() > top_k {
        top.select_nth_unstable_by(top_k - 1, most_likely_first);
        top.truncate(top_k);
    }
    top.sort_by(most_likely_first);
    let listed: f64 = top.iter().map(|(_, p)| p).sum();
    MixedDistribution {
        top,
        rest_mass: (1.0 - listed).max(0.0),
        lambda,
    }
}

/// The whole mixed distribution as one vector (for callers that want every probability).
pub fn mix_full(
    infgram: &SparseDistribution,
    neural: &NeuralDistribution,
    lambda: f64,
) -> Vec<f64> {
    let neural_weight = 1.0 - lambda + lambda * infgram.model_share;
    let mut out: Vec<f64> = (0..neural.vocab_size() as u32)
        .map(|t| neural_weight * neural.prob(t))
        .collect();
    for &(t, p) in &infgram.entries {
        if let Some(slot) = out.get_mut(t as usize) {
            *slot += lambda * p;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![2.0, 1.0, 0.5, -1.0, 3.0, 0.0]
    }

    /// The full mixture sums to one, and `mix`'s top 3 and rest are the brute-force ones: the full
    /// vector sorted.
    fn agrees_with_brute_force(inf: &SparseDistribution, nn: &NeuralDistribution, lambda: f64) {
        let full = mix_full(inf, nn, lambda);
        assert!((full.iter().sum::<f64>() - 1.0).abs() < 1e-6);
        let mixed = mix(inf, nn, lambda, 3);
        let mut order: Vec<(u32, f64)> = full
            .iter()
            .enumerate()
            .map(|(t, p)| (t as u32, *p))
            .collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        assert_eq!(mixed.top.len(), 3);
        for (got, want) in mixed.top.iter().zip(&order) {
            assert_eq!(got.0, want.0, "λ={lambda}");
            assert!((got.1 - want.1).abs() < 1e-12);
        }
        let listed: f64 = order[..3].iter().map(|x| x.1).sum();
        assert!((mixed.rest_mass - (1.0 - listed)).abs() < 1e-12);
    }

    /// A support of hundreds of tokens, ties included, under full and top-k neural input: the
    /// selected head is the sorted full mixture's.
    #[test]
    fn a_wide_support_selects_the_brute_force_head() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let vocab = 1_000;
        for round in 0..20 {
            let logits: Vec<f32> = (0..vocab).map(|_| rng.random_range(-8.0..4.0)).collect();
            let full = NeuralDistribution::from_logits(&logits).unwrap();
            let mut head = full.top(64);
            let listed: f64 = head.iter().map(|e| e.1).sum();
            head.iter_mut().for_each(|e| e.1 = e.1.ln());
            let entries = head.iter().map(|&(t, lp)| (t, lp as f32)).collect();
            let top64 = NeuralDistribution::from_top_k(entries, 1.0 - listed, vocab).unwrap();
            // Counts out of a small total, so many probabilities tie.
            let counts: Vec<(u32, f64)> = (0..400)
                .map(|_| {
                    (
                        rng.random_range(0..vocab as u32),
                        rng.random_range(1..6) as f64,
                    )
                })
                .collect();
            let total: f64 = counts.iter().map(|c| c.1).sum();
            let mut support: Vec<(u32, f64)> = Vec::new();
            for (t, c) in counts {
                match support.iter_mut().find(|e| e.0 == t) {
                    Some(e) => e.1 += c / total,
                    None => support.push((t, c / total)),
                }
            }
            let inf = SparseDistribution::new(support);
            for nn in [&full, &top64] {
                let lambda = [0.1, 0.5, 0.9][round % 3];
                let want = {
                    let mut all: Vec<(u32, f64)> = mix_full(&inf, nn, lambda)
                        .into_iter()
                        .enumerate()
                        .map(|(t, p)| (t as u32, p))
                        .collect();
                    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                    all
                };
                for k in [0, 1, 16, 64] {
                    let got = mix(&inf, nn, lambda, k);
                    assert_eq!(got.top.len(), k);
                    // The same sums in the same order (no model share): ties fall alike.
                    for (g, w) in got.top.iter().zip(&want) {
                        assert_eq!(g, w, "round {round} k {k}");
                    }
                }
            }
        }
    }

    #[test]
    fn full_mixture_sums_to_one_and_top_k_agrees_with_it() {
        let nn = NeuralDistribution::from_logits(&logits()).unwrap();
        let inf = SparseDistribution::new(vec![(3, 0.75), (5, 0.25)]);
        for lambda in [0.0, 0.2, 0.5, 0.9] {
            agrees_with_brute_force(&inf, &nn, lambda);
        }
    }

    /// A byte-level ∞-gram's distribution: entries on some tokens, the rest of its mass given out in
    /// the model's shape. The full mixture still sums to one, and the top-k, led by tokens the
    /// entries give little, is the brute-force one.
    #[test]
    fn the_model_share_follows_the_model() {
        let nn = NeuralDistribution::from_logits(&logits()).unwrap();
        // Entries on the model's top two, 4 and 0, with little mass; 0.95 of the ∞-gram's mass in
        // the model's shape.
        let inf = SparseDistribution::deferring(vec![(4, 0.0), (0, 0.05)], 0.95);
        assert!((inf.prob(1, &nn) - 0.95 * nn.prob(1)).abs() < 1e-12);
        assert!((inf.prob(0, &nn) - 0.05 - 0.95 * nn.prob(0)).abs() < 1e-12);
        let total: f64 = (0..6).map(|t| inf.prob(t, &nn)).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        for lambda in [0.1, 0.5, 0.9] {
            let full = mix_full(&inf, &nn, lambda);
            for t in 0..6 {
                let want = mixed_prob(inf.prob(t, &nn), nn.prob(t), lambda);
                assert!((full[t as usize] - want).abs() < 1e-12);
            }
            agrees_with_brute_force(&inf, &nn, lambda);
        }
    }

    #[test]
    fn by_hand() {
        // p_nn = softmax([0, 0]) = (0.5, 0.5); ∞-gram: all on token 1; λ = 0.4.
        let nn = NeuralDistribution::from_logits(&[0.0, 0.0]).unwrap();
        let unsorted = SparseDistribution::new(vec![(9, 0.5), (2, 0.25), (4, 0.25)]);
        assert_eq!(
            (
                unsorted.prob(2, &nn),
                unsorted.prob(9, &nn),
                unsorted.prob(3, &nn)
            ),
            (0.25, 0.5, 0.0)
        );
        let inf = SparseDistribution::new(vec![(1, 1.0)]);
        let m = mix(&inf, &nn, 0.4, 2);
        assert_eq!(m.top[0].0, 1);
        assert!((m.top[0].1 - 0.7).abs() < 1e-7);
        assert!((m.top[1].1 - 0.3).abs() < 1e-7);
    }

    #[test]
    fn top_k_input_spreads_the_rest_evenly() {
        let nn =
            NeuralDistribution::from_top_k(vec![(0, 0.5f32.ln()), (1, 0.25f32.ln())], 0.25, 10)
                .unwrap();
        // 8 other tokens share 0.25.
        assert!((nn.prob(7) - 0.25 / 8.0).abs() < 1e-9);
        let inf = SparseDistribution::new(vec![(7, 1.0)]);
        let m = mix(&inf, &nn, 0.5, 2);
        assert_eq!(m.top[0].0, 7);
        assert!((m.top[0].1 - (0.5 + 0.5 * 0.25 / 8.0)).abs() < 1e-7);
        assert!(NeuralDistribution::from_top_k(vec![(0, -0.1)], 0.5, 10).is_err());
        assert!(NeuralDistribution::from_top_k(vec![(12, -0.1)], 0.0, 10).is_err());
    }

    /// Huge finite logits (hardening item 13): a log-normaliser of max + ln Σ loses ln Σ to the
    /// rounding of max, which gave every one of 49152 equal logits of 1e20 probability 1, and at 1e17
    /// put probabilities ≈ 180× off.
    #[test]
    fn huge_logits_still_normalise() {
        for big in [1e17f32, 1e20, f32::MAX] {
            let nn = NeuralDistribution::from_logits(&vec![big; 49152]).unwrap();
            let total: f64 = (0..49152).map(|t| nn.prob(t)).sum();
            assert!((total - 1.0).abs() < 1e-5, "logits {big:e}: Σp = {total}");
            assert!((nn.prob(7) * 49152.0 - 1.0).abs() < 1e-5, "{big:e}");
        }
        // The two ends of f32: all the mass on the one top logit.
        let mut logits = vec![f32::MIN; 49152];
        logits[5] = f32::MAX;
        let nn = NeuralDistribution::from_logits(&logits).unwrap();
        assert_eq!((nn.prob(5), nn.prob(6)), (1.0, 0.0));
    }

    #[test]
    fn entropy_by_hand() {
        let nn = NeuralDistribution::from_logits(&[0.0, 0.0, 0.0, 0.0]).unwrap();
        let (h, top) = nn.entropy_and_top();
        assert!((h - 4f64.ln()).abs() < 1e-6);
        assert!((top - 0.25).abs() < 1e-6);
    }
}
