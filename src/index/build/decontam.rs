//! Decontamination of a reference corpus against evaluation data (paper §5): a reference document is
//! dropped when at least `threshold` of its n-grams (13-grams in the paper) also occur in the
//! evaluation documents, so the ∞-gram cannot score test text by having memorised it.

use std::collections::HashSet;
use std::path::PathBuf;

use rayon::prelude::*;
use xxhash_rust::xxh3::Xxh3;

use crate::corpus::{self, Content, CorpusError};
use crate::index::format::DecontaminationRecord;
use crate::index::{IndexError, Result};
use crate::tokenizer::Tokenizer;

/// What the paper used: 13-grams, 80% overlap.
pub const DEFAULT_NGRAM: usize = 13;
pub const DEFAULT_THRESHOLD: f64 = 0.8;

/// The n-grams of the evaluation data, hashed.
pub struct Decontaminator {
    ngrams: HashSet<u64>,
    documents: u64,
    n: usize,
    threshold: f64,
}

/// Streams the tokens into the hasher: no allocation per n-gram (a build hashes every position).
fn hash(gram: &[u32]) -> u64 {
    let mut h = Xxh3::new();
    for t in gram {
        h.update(&t.to_le_bytes());
    }
    h.digest()
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
            .flat_map(|doc| doc.windows(n).map(hash))
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

    /// Share of the document's n-grams that occur in the evaluation data (0 when it has none).
    pub fn overlap(&self, tokens: &[u32]) -> f64 {
        if tokens.len() < self.n {
            return 0.0;
        }
        let grams = tokens.len() + 1 - self.n;
        let seen = tokens
            .windows(self.n)
            .filter(|g| self.ngrams.contains(&hash(g)))
            .count();
        seen as f64 / grams as f64
    }

    pub fn is_contaminated(&self, tokens: &[u32]) -> bool {
        tokens.len() >= self.n && self.overlap(tokens) >= self.threshold
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
    fn overlap_matches_brute_force() {
        let eval: Vec<Vec<u32>> = vec![(0..40).collect(), (100..130).collect()];
        let docs: Vec<Vec<u32>> = vec![
            (0..40).collect(),                // the same document
            (20..60).collect(),               // half overlapping
            (200..260).collect(),             // disjoint
            (0..5).collect(),                 // shorter than n
            (95..135).chain(0..13).collect(), // pieces of both
        ];
        let d = Decontaminator::new(eval.iter().map(|v| v.as_slice()), 13, 0.8).unwrap();
        for doc in &docs {
            let want = brute_overlap(&eval, doc, 13);
            assert!((d.overlap(doc) - want).abs() < 1e-12, "{doc:?}");
        }
        assert!(d.is_contaminated(&docs[0]));
        assert!(!d.is_contaminated(&docs[1]));
        assert!(!d.is_contaminated(&docs[2]));
        assert!(!d.is_contaminated(&docs[3]));
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
