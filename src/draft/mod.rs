//! Speculative drafting from the ∞-gram: chains and trees of draft tokens for a sequence, from the
//! reference index (what followed the longest matching suffix, REST-style) and from the sequence's
//! own tokens (prompt lookup), with per-sequence state so a step costs O(new tokens); and a
//! speculative decoding loop that verifies drafts with the model.

pub mod calibration;
pub mod lookup;
pub mod spec;
pub mod tree;

use serde::{Deserialize, Serialize};

use crate::index::suffix::SuffixMatch;
use crate::index::{Index, Result};
use calibration::{Calibrated, Calibration, Origin};
use lookup::PromptLookup;
pub use tree::{DraftTree, Trie};

/// Which tokens a draft may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftSource {
    /// The reference index only.
    Index,
    /// The sequence's own tokens only.
    Prompt,
    /// Both: for trees their union, for chains the one with the higher expected acceptance
    /// (after calibration).
    Both,
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
            index_samples: 64,
            source: DraftSource::Both,
        }
    }
}

impl DraftOptions {
    fn depth_for(&self, match_len: usize) -> usize {
        if self.match_len_factor <= 0.0 {
            return self.max_tokens;
        }
        ((self.match_len_factor * match_len as f64).ceil() as usize).min(self.max_tokens)
    }

    fn draft_from(&self, continuations: &[Vec<u32>], match_len: usize) -> DraftTree {
        let depth = self.depth_for(match_len);
        let mut trie = Trie::new();
        for c in continuations {
            trie.insert(&c[..c.len().min(depth)], 1.0);
        }
        let budget = if self.tree { self.tree_budget } else { depth };
        trie.best_draft(budget, depth, self.min_token_prob, !self.tree, match_len)
    }
}

/// A sequence being decoded, with what drafting needs of it: its ∞-gram match and its own tokens'
/// positions, both kept up to date as tokens come and go, and how each source's drafts have fared.
pub struct Sequence {
    tokens: Vec<u32>,
    suffix: SuffixMatch,
    lookup: PromptLookup,
    calibration: Calibration,
}

impl Sequence {
    pub fn new(index: &Index, context: Vec<u32>) -> Result<Self> {
        let suffix = SuffixMatch::of(index, &context)?;
        let mut lookup = PromptLookup::default();
        lookup.extend(&context, 0);
        Ok(Self {
            tokens: context,
            suffix,
            lookup,
            calibration: Calibration::default(),
        })
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn suffix(&self) -> &SuffixMatch {
        &self.suffix
    }

    /// Appends tokens (checked against the vocabulary first, so a bad id changes nothing).
    pub fn append(&mut self, index: &Index, tokens: &[u32]) -> Result<()> {
        index.check_ids(tokens)?;
        let from = self.tokens.len();
        for &t in tokens {
            self.tokens.push(t);
            self.suffix.advance(index, &self.tokens);
            self.calibration.appended(t);
        }
        self.lookup.extend(&self.tokens, from);
        Ok(())
    }

    /// Keeps the first `len` tokens (`len` must not exceed the length).
    pub fn truncate(&mut self, index: &Index, len: usize) {
        if len >= self.tokens.len() {
            return;
        }
        self.calibration.release();
        self.lookup.truncate(&self.tokens[len..], len);
        self.tokens.truncate(len);
        self.suffix.truncate(index, &self.tokens);
    }

    /// A draft continuing the sequence. The tokens appended next tell the sequence how much of it
    /// was accepted.
    pub fn draft(&mut self, index: &Index, opts: &DraftOptions) -> DraftTree {
        self.calibration.release();
        // A source whose record keeps even a certain token under the bar is not consulted (its
        // index reads cost more than a drafted token is worth), only nudged back towards trust.
        let offer = |origin: Origin, tree: &dyn Fn() -> DraftTree| {
            let hopeless = self.calibration.factor(origin) < opts.min_path_prob;
            let tree = if hopeless {
                DraftTree::default()
            } else {
                tree()
            };
            (origin, self.calibrate(origin, tree, opts))
        };
        let from_index = || {
            offer(Origin::Index, &|| {
                let depth = opts.depth_for(self.suffix.suffix_len());
                let conts = self.suffix.continuations(index, opts.index_samples, depth);
                opts.draft_from(&conts, self.suffix.suffix_len())
            })
        };
        let from_prompt = || {
            offer(Origin::Prompt, &|| {
                let (conts, len) = self.lookup.continuations(&self.tokens, opts.max_tokens);
                opts.draft_from(&conts, len)
            })
        };
        let (index_draft, prompt_draft) = match opts.source {
            DraftSource::Index => (Some(from_index()), None),
            DraftSource::Prompt => (None, Some(from_prompt())),
            DraftSource::Both => (Some(from_index()), Some(from_prompt())),
        };
        let offers = [index_draft, prompt_draft];
        for (origin, draft) in offers.iter().flatten() {
            if draft.tree.is_empty() {
                self.calibration.idle(*origin);
            }
        }
        if let [Some((_, index_draft)), Some((_, prompt_draft))] = &offers {
            if opts.tree {
                let union = index_draft
                    .tree
                    .union(&prompt_draft.tree)
                    .best(opts.tree_budget);
                for (origin, draft) in offers.into_iter().flatten() {
                    self.calibration.drafted(origin, draft);
                }
                return union;
            }
        }
        let best = offers.into_iter().flatten().reduce(|a, b| {
            if b.1.tree.score > a.1.tree.score {
                b
            } else {
                a
            }
        });
        match best {
            Some((origin, draft)) => {
                let tree = draft.tree.clone();
                self.calibration.drafted(origin, draft);
                tree
            }
            None => DraftTree::default(),
        }
    }

    fn calibrate(&self, origin: Origin, tree: DraftTree, opts: &DraftOptions) -> Calibrated {
        self.calibration.calibrate(origin, tree, opts.min_path_prob)
    }
}
