//! The brute-force oracle of the engine tests: answers computed by scanning the documents.

use std::collections::BTreeMap;

/// The corpus as documents, and the oracle answers computed from them alone.
pub struct Oracle {
    pub docs: Vec<Vec<u32>>,
    pub eos: u32,
}

impl Oracle {
    pub fn occurrences(&self, q: &[u32]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (d, doc) in self.docs.iter().enumerate() {
            if q.len() <= doc.len() {
                for i in 0..=doc.len() - q.len() {
                    if &doc[i..i + q.len()] == q {
                        out.push((d, i));
                    }
                }
            }
        }
        out
    }

    pub fn total_tokens(&self) -> u64 {
        self.docs.iter().map(|d| d.len() as u64 + 1).sum()
    }

    pub fn count(&self, q: &[u32]) -> u64 {
        if q.is_empty() {
            self.total_tokens()
        } else {
            self.occurrences(q).len() as u64
        }
    }

    /// Next-token counts; the end of a document (separator or end of corpus) is eos.
    pub fn ntd(&self, prompt: &[u32]) -> BTreeMap<u32, u64> {
        let mut dist = BTreeMap::new();
        if prompt.is_empty() {
            for doc in &self.docs {
                *dist.entry(self.eos).or_insert(0) += 1; // the separator before it
                for &t in doc {
                    *dist.entry(t).or_insert(0) += 1;
                }
            }
            return dist;
        }
        for (d, i) in self.occurrences(prompt) {
            let next = self.docs[d]
                .get(i + prompt.len())
                .copied()
                .unwrap_or(self.eos);
            *dist.entry(next).or_insert(0) += 1;
        }
        dist
    }

    pub fn suffix_len(&self, prompt: &[u32]) -> usize {
        (0..=prompt.len())
            .rev()
            .find(|&l| self.count(&prompt[prompt.len() - l..]) > 0)
            .unwrap_or(0)
    }
}
