//! Speculative drafting from the ∞-gram: chains and trees of draft tokens for a sequence, from the
//! reference index (what followed the longest matching suffix, REST-style), the live index of what
//! was generated before in the sequence's namespace, a reference text the caller expects the output
//! to resemble, and the sequence's own tokens (prompt lookup); with per-sequence state so a step
//! costs O(new tokens); and a speculative decoding loop that verifies drafts with the model.

pub mod calibration;
pub mod lookup;
pub mod spec;
pub mod tree;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::evidence::{EvidenceError, Followed, ReferenceData, StepInfgram};
use crate::index::Result;
use crate::live::{LiveError, LiveStore};
use crate::mix::NeuralDistribution;
pub use calibration::Origin;
use calibration::{Calibrated, Calibration};
use lookup::PromptLookup;
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
    fn includes(self, origin: Origin) -> bool {
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

    fn draft_from(&self, continuations: &[Vec<u32>], match_len: usize) -> DraftTree {
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

/// A sequence being decoded, with what drafting needs of it: its ∞-gram match (as its reference
/// follows it) and its own tokens' positions, both kept up to date as tokens come and go, its live namespace and reference text if
/// it has them, and how each source's drafts have fared.
pub struct Sequence {
    tokens: Vec<u32>,
    followed: Followed,
    lookup: PromptLookup,
    live: Option<LiveLink>,
    reference: Option<Reference>,
    calibration: Calibration,
    /// The source of the last draft handed out (`None` for a union of several, or no draft).
    last_origin: Option<Origin>,
    /// Why the sequence stopped learning into its namespace, if it did.
    warning: Option<String>,
}

/// The live namespace a sequence drafts from, and the live document its tokens go to when it
/// learns.
struct LiveLink {
    live: Arc<dyn LiveStore>,
    namespace: String,
    learning: Option<Learning>,
}

/// The live document a learning sequence's tokens go to: it holds the sequence's tokens from
/// `start` to `held`.
struct Learning {
    doc: u64,
    start: usize,
    held: usize,
}

/// What a sequence may draft from beyond the reference index and its own tokens.
#[derive(Clone, Default)]
pub struct Extras {
    /// A live index and the namespace to draft from ("" for none).
    pub live: Option<Arc<dyn LiveStore>>,
    pub namespace: String,
    /// Add the sequence's tokens to the namespace as a document.
    pub learn: bool,
    /// Text the output is expected to resemble; ids must have been checked.
    pub reference: Vec<u32>,
}

/// Text the caller expects the output to resemble (the file being edited, a predicted answer).
struct Reference {
    tokens: Vec<u32>,
    lookup: PromptLookup,
}

impl Sequence {
    pub fn new(reference: &dyn ReferenceData, context: Vec<u32>) -> Result<Self> {
        let followed = reference.follow(&context)?;
        let mut lookup = PromptLookup::default();
        lookup.extend(&context, 0);
        Ok(Self {
            tokens: context,
            followed,
            lookup,
            live: None,
            reference: None,
            calibration: Calibration::default(),
            last_origin: None,
            warning: None,
        })
    }

    /// The sequence with `extras`: a live namespace (when both a live index and a namespace are
    /// given) and a reference text (when not empty).
    pub fn with_extras(self, extras: Extras) -> Result<Self, LiveError> {
        let mut seq = match (extras.live, extras.namespace.is_empty()) {
            (Some(live), false) => self.with_live(live, &extras.namespace, extras.learn)?,
            _ => self,
        };
        if !extras.reference.is_empty() {
            seq = seq.with_reference(extras.reference);
        }
        Ok(seq)
    }

    /// Drafts also from `namespace` of the live index; with `learn`, the sequence's tokens (those
    /// it has and those appended later) are added to it as a document, for every sequence of the
    /// namespace to draft from at once. Learning is best effort: refused (the namespace limit, a
    /// full disk), the sequence does without it and says why in [`Sequence::warning`].
    pub fn with_live(
        mut self,
        live: Arc<dyn LiveStore>,
        namespace: &str,
        learn: bool,
    ) -> Result<Self, LiveError> {
        crate::live::namespace::check_name(namespace)?;
        let learning = learn.then(|| Learning {
            doc: live.new_document(),
            start: 0,
            held: 0,
        });
        self.live = Some(LiveLink {
            live,
            namespace: namespace.to_string(),
            learning,
        });
        self.learn();
        Ok(self)
    }

    /// Why the sequence does less than it was started for (it stopped learning), if it does.
    pub fn warning(&self) -> Option<&str> {
        self.warning.as_deref()
    }

    /// Drafts also from `tokens`, for this sequence only. Ids must have been checked.
    pub fn with_reference(mut self, tokens: Vec<u32>) -> Self {
        let mut lookup = PromptLookup::default();
        lookup.extend(&tokens, 0);
        self.reference = Some(Reference { tokens, lookup });
        self
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Length of the longest suffix of the sequence found in the reference data (tokens, or bytes
    /// over a byte-level index).
    pub fn suffix_len(&self) -> usize {
        self.followed.suffix_len()
    }

    /// Occurrences of that suffix.
    pub fn prompt_cnt(&self) -> u64 {
        self.followed.prompt_cnt()
    }

    /// What the ∞-gram says of the next token, whose model distribution is `neural`
    /// ([`ReferenceData::step_followed`]).
    pub fn step(
        &self,
        reference: &dyn ReferenceData,
        neural: &NeuralDistribution,
    ) -> Result<StepInfgram, EvidenceError> {
        reference.step_followed(&self.followed, &self.tokens, neural)
    }

    /// Appends tokens (checked against the vocabulary first, so a bad id changes nothing; a
    /// reference that fails to follow them leaves the sequence as it was).
    pub fn append(&mut self, reference: &dyn ReferenceData, tokens: &[u32]) -> Result<()> {
        reference.check_ids(tokens)?;
        let from = self.tokens.len();
        self.tokens.extend_from_slice(tokens);
        if let Err(e) = reference.advance(&mut self.followed, &self.tokens, from) {
            self.tokens.truncate(from);
            return Err(e);
        }
        for &t in tokens {
            self.calibration.appended(t);
        }
        self.lookup.extend(&self.tokens, from);
        self.learn();
        Ok(())
    }

    /// Keeps the first `len` tokens (`len` must not exceed the length). A reference that fails
    /// to follow the cut leaves the sequence as it was.
    pub fn truncate(&mut self, reference: &dyn ReferenceData, len: usize) -> Result<()> {
        if len >= self.tokens.len() {
            return Ok(());
        }
        reference.truncate(&mut self.followed, &self.tokens[..len])?;
        self.calibration.release();
        self.lookup.truncate(&self.tokens[len..], len);
        self.tokens.truncate(len);
        if let Some(LiveLink {
            live,
            namespace,
            learning: Some(learning),
        }) = &mut self.live
        {
            if learning.held > len {
                // Taken back from the live document while it is in memory; once it is built into
                // a run it cannot be, and the sequence goes on in a new document from the cut.
                // Either way what the sequence teaches is at most what it appended, never its
                // kept tokens again at each cut.
                let back = learning.held - len;
                if len < learning.start || !live.retract(namespace, learning.doc, back) {
                    *learning = Learning {
                        doc: live.new_document(),
                        start: len,
                        held: len,
                    };
                }
                learning.held = len;
            }
        }
        Ok(())
    }

    /// Sends the tokens the live document lacks. Learning is best effort: a failure (the namespace
    /// limit, a full disk) stops it for this sequence, with a warning, and never fails decoding.
    fn learn(&mut self) {
        let Some(link) = &mut self.live else {
            return;
        };
        let Some(learning) = &mut link.learning else {
            return;
        };
        let new = &self.tokens[learning.held..];
        if new.is_empty() {
            return;
        }
        match link.live.append(&link.namespace, learning.doc, new) {
            Ok(()) => learning.held = self.tokens.len(),
            Err(e) => {
                tracing::warn!(namespace = %link.namespace, error = %e, "a sequence stopped learning into the live index");
                self.warning = Some(format!(
                    "stopped learning into namespace {:?}: {e}",
                    link.namespace
                ));
                link.learning = None;
            }
        }
    }

    /// A draft continuing the sequence. The tokens appended next tell the sequence how much of it
    /// was accepted.
    /// A draft that fails (the reference data did not answer) leaves the sequence as it was.
    pub fn draft(
        &mut self,
        reference: &dyn ReferenceData,
        opts: &DraftOptions,
    ) -> Result<DraftTree> {
        let before = (self.calibration.clone(), self.last_origin);
        let drafted = self.draft_here(reference, opts);
        if drafted.is_err() {
            (self.calibration, self.last_origin) = before;
        }
        drafted
    }

    fn draft_here(
        &mut self,
        reference: &dyn ReferenceData,
        opts: &DraftOptions,
    ) -> Result<DraftTree> {
        self.calibration.release();
        self.last_origin = None;
        let mut offers = Vec::new();
        // The static index is read last: its reads are the dearest (pages of a large mapped
        // file), and a chain from it is not read at all when even a certain one of its depth
        // would score below the best offer in hand. Such a step leaves its record as it is,
        // where a read that came back empty would have let it drift back. Offers keep
        // `Origin::ALL`'s order, which decides ties.
        let (index_first, others) = Origin::ALL.split_at(1);
        for &origin in others.iter().chain(index_first) {
            if !opts.source.includes(origin) || !self.has(origin) {
                continue;
            }
            // A source whose record keeps even a certain token under the bar is not consulted
            // (its reads cost more than a drafted token is worth), only nudged back towards trust.
            let mut nothing_to_read = self.calibration.factor(origin) < opts.min_path_prob;
            if origin == Origin::Index && !opts.tree {
                let depth = opts.depth_for(self.followed.matched_tokens());
                let bound = self
                    .calibration
                    .chain_bound(origin, depth, opts.min_path_prob);
                let outscored = |(_, d): &(Origin, Calibrated)| d.tree.score > bound;
                if bound > 0.0 && offers.iter().any(outscored) {
                    continue;
                }
                // A chain that can score nothing is empty for certain: idle, as if read.
                nothing_to_read |= bound <= 0.0;
            }
            let tree = match nothing_to_read {
                true => DraftTree::default(),
                false => self.raw_draft(origin, reference, opts)?,
            };
            let draft = self.calibrate(origin, tree, opts);
            if draft.tree.is_empty() {
                self.calibration.idle(origin);
            }
            let at = offers
                .partition_point(|(o, _): &(Origin, Calibrated)| (*o as usize) < (origin as usize));
            offers.insert(at, (origin, draft));
        }
        if opts.tree && offers.len() > 1 {
            let union = offers
                .iter()
                .map(|(_, d)| &d.tree)
                .fold(DraftTree::default(), |u, t| u.union(t))
                .best(opts.tree_budget);
            for (origin, draft) in offers {
                self.calibration.drafted(origin, draft);
            }
            return Ok(union);
        }
        let best = offers.into_iter().reduce(|a, b| {
            if b.1.tree.score > a.1.tree.score {
                b
            } else {
                a
            }
        });
        Ok(match best {
            Some((origin, draft)) => {
                let tree = draft.tree.clone();
                self.last_origin = (!tree.is_empty()).then_some(origin);
                self.calibration.drafted(origin, draft);
                tree
            }
            None => DraftTree::default(),
        })
    }

    /// Where the last draft came from: `None` for a union of several sources, or no draft.
    pub fn last_origin(&self) -> Option<Origin> {
        self.last_origin
    }

    fn has(&self, origin: Origin) -> bool {
        match origin {
            Origin::Index | Origin::Prompt => true,
            Origin::Live => self.live.is_some(),
            Origin::Reference => self.reference.is_some(),
        }
    }

    /// `origin`'s draft before calibration.
    fn raw_draft(
        &self,
        origin: Origin,
        reference: &dyn ReferenceData,
        opts: &DraftOptions,
    ) -> Result<DraftTree> {
        let (conts, len) = match origin {
            Origin::Index => {
                let len = self.followed.matched_tokens();
                let depth = opts.depth_for(len);
                let conts = reference.continuations(
                    &self.followed,
                    &self.tokens,
                    opts.index_samples,
                    depth,
                )?;
                (conts, len)
            }
            Origin::Prompt => self.lookup.continuations(&self.tokens, opts.max_tokens),
            Origin::Live => match &self.live {
                Some(link) => link.live.continuations(
                    &link.namespace,
                    &self.tokens,
                    opts.index_samples,
                    opts.max_tokens,
                ),
                None => (Vec::new(), 0),
            },
            Origin::Reference => match &self.reference {
                Some(r) => r
                    .lookup
                    .continuations_in(&r.tokens, &self.tokens, opts.max_tokens),
                None => (Vec::new(), 0),
            },
        };
        Ok(opts.draft_from(&conts, len))
    }

    fn calibrate(&self, origin: Origin, tree: DraftTree, opts: &DraftOptions) -> Calibrated {
        self.calibration.calibrate(origin, tree, opts.min_path_prob)
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
