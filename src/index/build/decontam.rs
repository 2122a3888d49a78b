//! Decontamination of a reference corpus against evaluation data (paper §5): a reference document is
//! dropped when at least `threshold` of its n-grams (13-grams in the paper) also occur in the
//! evaluation documents, so the ∞-gram cannot score test text by having memorised it.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::PathBuf;

use rayon::prelude::*;

use crate::corpus::{self, Content, CorpusError};
use crate::index::format::DecontaminationRecord;
use crate::index::{IndexError, Result};
use crate::tokenizer::Tokenizer;

/// What the paper used: 13-grams, 80% overlap.
pub const DEFAULT_NGRAM: usize = 13;
pub const DEFAULT_THRESHOLD: f64 = 0.8;

/// The n-grams of the evaluation data, hashed.
pub struct Decontaminator {
    ngrams: HashSet<u64, BuildHasherDefault<Premixed>>,
    documents: u64,
    n: usize,
    threshold: f64,
}

/// The n-gram hashes are mixed already: the set uses them as they are.
#[derive(Default)]
struct Premixed(u64);

impl Hasher for Premixed {
    fn write(&mut self, bytes: &[u8]) {
        // Not reached: the set's keys are u64.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The Mersenne prime 2^61 − 1: polynomial hashes modulo a prime collide for two different
/// n-grams with probability at most n / 2^61 over a random base (the base here is fixed, so that
/// is a guide, not a bound; modulo 2^64 such hashes can be made to collide).
const PRIME: u64 = (1 << 61) - 1;
/// The polynomial's base, a fixed number below the prime.
const BASE: u64 = 0x1f3d_5b79_a2c4_e681 % PRIME;

fn mul_mod(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    let folded = (product as u64 & PRIME) + (product >> 61) as u64;
    if folded >= PRIME {
        folded - PRIME
    } else {
        folded
    }
}

/// The hash of every window of `n` tokens of `tokens`, in order, each in O(1) by rolling a
/// polynomial hash (a build hashes every position of its text), mixed for the set's buckets.
fn window_hashes(tokens: &[u32], n: usize) -> impl Iterator<Item = u64> + '_ {
    // BASE^(n-1): what the token leaving a window weighed in it.
    let leaving = (1..n).fold(1, |p, _| mul_mod(p, BASE));
    let mut hash = tokens
        .iter()
        .take(n.saturating_sub(1))
        .fold(0, |h, &t| (mul_mod(h, BASE) + u64::from(t)) % PRIME);
    let entering = tokens.get(n.saturating_sub(1)..).unwrap_or_default();
    entering.iter().zip(tokens).map(move |(&new, &old)| {
        hash = (mul_mod(hash, BASE) + u64::from(new)) % PRIME;
        let mixed = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        hash = (hash + PRIME - mul_mod(leaving, u64::from(old))) % PRIME;
        mixed
    })
}

/// Refuses settings that would drop documents for no reason: n-grams of no tokens (every document
/// "overlaps"), or a share outside (0, 1] (0 drops everything; above 1 nothing can reach).
pub(crate) fn check_settings(n: usize, threshold: f64) -> Result<()> {
    if n == 0 {
        return Err(IndexError::Invalid(
            "the decontamination n-gram length must be at least 1".into(),
        ));
    }
    if !(threshold > 0.0 && threshold <= 1.0) {
        return Err(IndexError::Invalid(format!(
            "the decontamination threshold is a share of a document's n-grams, in (0, 1], not {threshold}"
        )));
    }
    Ok(())
}

impl Decontaminator {
    pub fn new<'a>(
        evaluation: impl IntoIterator<Item = &'a [u32]>,
        n: usize,
        threshold: f64,
    ) -> Result<Self> {
        check_settings(n, threshold)?;
        let mut documents = 0;
        let ngrams = evaluation
            .into_iter()
            .inspect(|_| documents += 1)
            .flat_map(|doc| window_hashes(doc, n))
            .collect();
        Ok(Self {
            ngrams,
            documents,
            n,
            threshold,
        })
    }

    /// The n-grams of evaluation text files (plain or Pile JSON lines), tokenized as the index is.
    pub fn from_files(
        paths: &[PathBuf],
        tokenizer: &Tokenizer,
        n: usize,
        threshold: f64,
    ) -> Result<Self> {
        check_settings(n, threshold)?;
        let inputs = corpus::text_documents(corpus::expand_inputs(paths)?)
            .collect::<Result<Vec<_>, CorpusError>>()?;
        let docs = inputs
            .into_par_iter()
            .map(|doc| match doc.content {
                Content::Text(text) => tokenizer
                    .encode(&text)
                    .map_err(|e| IndexError::Invalid(e.to_string())),
                Content::Tokens(tokens) => Ok(tokens),
            })
            .collect::<Result<Vec<Vec<u32>>>>()?;
        Self::new(docs.iter().map(|d| d.as_slice()), n, threshold)
    }

    /// Whether at least `threshold` of the document's n-grams occur in the evaluation data. It
    /// stops as soon as the n-grams not found rule that out: for clean text, after a fifth of
    /// them at the paper's 80%.
    pub fn is_contaminated(&self, tokens: &[u32]) -> bool {
        if tokens.len() < self.n {
            return false;
        }
        let grams = tokens.len() + 1 - self.n;
        let share = |seen: usize| seen as f64 / grams as f64;
        let (mut seen, mut missed) = (0, 0);
        for hash in window_hashes(tokens, self.n) {
            if self.ngrams.contains(&hash) {
                seen += 1;
            } else {
                missed += 1;
                if share(grams - missed) < self.threshold {
                    return false;
                }
            }
        }
        share(seen) >= self.threshold
    }

    /// An empty record with this decontaminator's settings.
    pub fn record(&self) -> DecontaminationRecord {
        DecontaminationRecord {
            ngram: self.n,
            threshold: self.threshold,
            evaluation_documents: self.documents,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: the share of the document's n-grams that appear verbatim in some eval document.
    fn brute_overlap(eval: &[Vec<u32>], doc: &[u32], n: usize) -> f64 {
        let grams: Vec<&[u32]> = doc.windows(n).collect();
        if grams.is_empty() {
            return 0.0;
        }
        let hits = grams
            .iter()
            .filter(|g| eval.iter().any(|e| e.windows(n).any(|w| w == **g)))
            .count();
        hits as f64 / grams.len() as f64
    }

    #[test]
    fn documents_are_dropped_as_brute_force_says_whatever_the_threshold() {
        let eval: Vec<Vec<u32>> = vec![(0..40).collect(), (100..130).collect()];
        let docs: Vec<Vec<u32>> = vec![
            (0..40).collect(),                 // the same document
            (20..60).collect(),                // half overlapping
            (200..260).collect(),              // disjoint
            (0..5).collect(),                  // shorter than n
            (95..135).chain(0..13).collect(),  // pieces of both
            (0..13).chain(200..202).collect(), // one n-gram in three
        ];
        for threshold in [0.1, 1.0 / 3.0, 0.5, 0.6, 0.8, 1.0] {
            let d = Decontaminator::new(eval.iter().map(|v| v.as_slice()), 13, threshold).unwrap();
            for doc in &docs {
                let want = doc.len() >= 13 && brute_overlap(&eval, doc, 13) >= threshold;
                assert_eq!(d.is_contaminated(doc), want, "{threshold} {doc:?}");
            }
        }
        let d = Decontaminator::new(eval.iter().map(|v| v.as_slice()), 13, 0.8).unwrap();
        assert!(d.is_contaminated(&docs[0]));
        assert!(!d.is_contaminated(&docs[1]));
    }

    #[test]
    fn rolling_hashes_are_those_of_each_window_and_do_not_collide() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let tokens: Vec<u32> = (0..200_000)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % 7) as u32 // few symbols, so windows repeat and nearly repeat
            })
            .collect();
        for n in [1, 2, 13, 48] {
            let hashes: Vec<u64> = window_hashes(&tokens, n).collect();
            assert_eq!(hashes.len(), tokens.len() + 1 - n);
            let mut by_hash = std::collections::HashMap::new();
            for (window, &hash) in tokens.windows(n).zip(&hashes) {
                // One window per hash: equal windows hash alike, different ones differently.
                assert_eq!(*by_hash.entry(hash).or_insert(window), window, "n = {n}");
            }
            // Hashed alone, a window hashes as it did in the text.
            assert_eq!(
                window_hashes(&tokens[500..500 + n], n).next(),
                Some(hashes[500])
            );
        }
        assert_eq!(window_hashes(&tokens[..3], 4).count(), 0);
    }

    #[test]
    fn settings_that_would_drop_documents_for_no_reason_are_refused() {
        let eval: Vec<u32> = (0..40).collect();
        let new = |n, threshold| Decontaminator::new([eval.as_slice()], n, threshold);
        let err = new(0, 0.8).err().unwrap().to_string();
        assert!(err.contains("at least 1"), "{err}");
        for threshold in [0.0, 1.5, -0.1, f64::NAN] {
            let err = new(13, threshold).err().unwrap().to_string();
            assert!(err.contains("(0, 1]"), "{threshold}: {err}");
        }
        assert!(new(1, 1.0).is_ok());
    }
}
