//! Speculative drafting from the ∞-gram: chains and trees of draft tokens for a sequence, from the
//! reference index (what followed the longest matching suffix, REST-style) and from the sequence's
//! own tokens (prompt lookup), with per-sequence state so a step costs O(new tokens); and a
//! speculative decoding loop that verifies drafts with the model.

pub mod lookup;
pub mod spec;
pub mod tree;

use serde::{Deserialize, Serialize};

use crate::index::suffix::SuffixMatch;
use crate::index::{Index, Result};
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
    /// Both: the draft with the higher expected acceptance.
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
/// positions, both kept up to date as tokens come and go.
pub struct Sequence {
    tokens: Vec<u32>,
    suffix: SuffixMatch,
    lookup: PromptLookup,
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
        }
        self.lookup.extend(&self.tokens, from);
        Ok(())
    }

    /// Keeps the first `len` tokens (`len` must not exceed the length).
    pub fn truncate(&mut self, index: &Index, len: usize) {
        if len >= self.tokens.len() {
            return;
        }
        self.lookup.truncate(&self.tokens[len..], len);
        self.tokens.truncate(len);
        self.suffix.truncate(index, &self.tokens);
    }

    /// A draft continuing the sequence.
    pub fn draft(&self, index: &Index, opts: &DraftOptions) -> DraftTree {
        let from_index = || {
            let depth = opts.depth_for(self.suffix.suffix_len());
            let conts = self.suffix.continuations(index, opts.index_samples, depth);
            opts.draft_from(&conts, self.suffix.suffix_len())
        };
        let from_prompt = || {
            let (conts, len) = self.lookup.continuations(&self.tokens, opts.max_tokens);
            opts.draft_from(&conts, len)
        };
        match opts.source {
            DraftSource::Index => from_index(),
            DraftSource::Prompt => from_prompt(),
            DraftSource::Both => {
                let (a, b) = (from_index(), from_prompt());
                if b.score > a.score {
                    b
                } else {
                    a
                }
            }
        }
    }
}
