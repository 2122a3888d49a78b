//! Speculative drafting from the ∞-gram: what drafts are made of. Chains and trees of draft tokens
//! (`tree`), the sequence's own tokens as a source (prompt lookup, `lookup`), each source's record
//! (`calibration`) and the options that shape a draft. The sequence that drafts, and the loop that
//! verifies its drafts with the model, are in [`crate::decoding`].

pub mod calibration;
pub mod lookup;
pub mod tree;

use serde::{Deserialize, Serialize};

pub use calibration::Origin;
pub use tree::{DraftTree, Trie};

/// Which tokens a draft may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftSource {
    /// Every source the sequence has: for trees their union, for chains the one with the highest
    /// expected acceptance (after calibration).
    All,
    /// The reference index only.
    Index,
    /// The sequence's own tokens only.
    Prompt,
    /// The live index of the sequence's namespace only.
    Live,
    /// The sequence's reference text only.
    Reference,
}

impl DraftSource {
    pub(crate) fn includes(self, origin: Origin) -> bool {
        match self {
            DraftSource::All => true,
            DraftSource::Index => origin == Origin::Index,
            DraftSource::Prompt => origin == Origin::Prompt,
            DraftSource::Live => origin == Origin::Live,
            DraftSource::Reference => origin == Origin::Reference,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DraftOptions {
    /// Longest path of a draft.
    pub max_tokens: usize,
    /// Most nodes of a tree; `tree: false` drafts a single chain.
    pub tree_budget: usize,
    pub tree: bool,
    /// A token whose probability given its parent is below this is not drafted. 0.4 measured best
    /// in `eval spec` (eval/RESULTS.md): a weaker bar spends verification rows on unlikely tokens.
    pub min_token_prob: f64,
    /// A node is drafted only when its path is at least this likely to be accepted, as the
    /// sequence's record calibrates its source (`calibration`): the cost of verifying one more
    /// token, as a share of a decoding step, plus the drafter's own: 0.2 measured best for SmolLM2
    /// on 2 CPU cores, where a row costs 0.16–0.26 of a step (eval/RESULTS.md); a few percent where
    /// verification is nearly free, as on a GPU.
    pub min_path_prob: f64,
    /// Adaptive length: at most this many draft tokens per matched token (0: off). Short matches
    /// predict poorly, so they get short drafts, and a rejected draft costs little.
    pub match_len_factor: f64,
    /// A source keeps two records (`calibration`): of its drafts after matches of at least this
    /// many tokens, and of the rest (0: one record). Misses after short matches, common and cheap,
    /// say little of a long match's draft, which is repeated text and runs true for dozens of
    /// tokens; with one record, a few of them cut the long drafts to a token or two. 12 measured
    /// best in the workload replays, chosen leave-one-workload-out (eval/RESULTS.md).
    pub long_match: usize,
    /// Occurrences of the matched suffix read from the index.
    pub index_samples: usize,
    pub source: DraftSource,
}

impl Default for DraftOptions {
    fn default() -> Self {
        Self {
            max_tokens: 8,
            tree_budget: 32,
            tree: false,
            min_token_prob: 0.4,
            min_path_prob: 0.2,
            match_len_factor: 1.0,
            long_match: 12,
            index_samples: 64,
            source: DraftSource::All,
        }
    }
}

impl DraftOptions {
    /// Whether the thresholds are in range, for every caller that takes them from outside (a
    /// request, a command line): the probabilities in [0, 1], the match length factor a finite
    /// number at least 0. The error names the first setting out of range.
    pub fn check(&self) -> Result<(), String> {
        for (name, p) in [
            ("min_token_prob", self.min_token_prob),
            ("min_path_prob", self.min_path_prob),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{name} {p}: a probability, in [0, 1]"));
            }
        }
        if !(self.match_len_factor >= 0.0 && self.match_len_factor.is_finite()) {
            return Err(format!(
                "match_len_factor {}: a number at least 0",
                self.match_len_factor
            ));
        }
        Ok(())
    }

    /// How deep a draft reads after a match of `match_len` tokens.
    pub fn depth_for(&self, match_len: usize) -> usize {
        if self.match_len_factor <= 0.0 {
            return self.max_tokens;
        }
        ((self.match_len_factor * match_len as f64).ceil() as usize).min(self.max_tokens)
    }

    /// Whether a draft after a match of `match_len` tokens counts in its source's long-match record.
    pub fn is_long(&self, match_len: usize) -> bool {
        self.long_match > 0 && match_len >= self.long_match
    }

    /// The draft the continuations of a match of `match_len` tokens make, as these options shape it.
    pub(crate) fn draft_from(&self, continuations: &[Vec<u32>], match_len: usize) -> DraftTree {
        let depth = self.depth_for(match_len);
        let nodes = continuations.iter().map(|c| c.len().min(depth)).sum();
        let mut trie = Trie::with_capacity(nodes);
        for c in continuations {
            trie.insert(&c[..c.len().min(depth)], 1.0);
        }
        let budget = if self.tree { self.tree_budget } else { depth };
        trie.best_draft(budget, depth, self.min_token_prob, !self.tree, match_len)
    }
}

#[cfg(test)]
mod tests {
    use super::DraftOptions;

    /// The defaults pass; each threshold out of range (NaN and infinities among them) is refused
    /// by name.
    #[test]
    fn check_refuses_each_threshold_out_of_range() {
        assert_eq!(DraftOptions::default().check(), Ok(()));
        let d = DraftOptions::default();
        let bad = [
            (
                "min_token_prob",
                DraftOptions {
                    min_token_prob: 1.5,
                    ..d
                },
            ),
            (
                "min_token_prob",
                DraftOptions {
                    min_token_prob: f64::NAN,
                    ..d
                },
            ),
            (
                "min_path_prob",
                DraftOptions {
                    min_path_prob: -0.1,
                    ..d
                },
            ),
            (
                "match_len_factor",
                DraftOptions {
                    match_len_factor: -1.0,
                    ..d
                },
            ),
            (
                "match_len_factor",
                DraftOptions {
                    match_len_factor: f64::INFINITY,
                    ..d
                },
            ),
            (
                "match_len_factor",
                DraftOptions {
                    match_len_factor: f64::NAN,
                    ..d
                },
            ),
        ];
        for (name, options) in bad {
            let err = options.check().unwrap_err();
            assert!(err.starts_with(name), "{err}");
        }
        let edges = DraftOptions {
            min_token_prob: 0.0,
            min_path_prob: 1.0,
            match_len_factor: 0.0,
            ..DraftOptions::default()
        };
        assert_eq!(edges.check(), Ok(()));
    }
}
