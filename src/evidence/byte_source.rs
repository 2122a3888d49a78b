//! A byte-level index as the reference data of one model's token sequences, so sessions, `Batch`
//! and `Draft` take a byte index beside any model, as `Mix` and `Score` do. Ids are the model's; a
//! sequence's text is matched a byte at a time as tokens come ([`ByteText`]), and taken back with
//! them.
//!
//! - A step's distribution is [`super::bytes`]'s, from the kept match: no fresh search.
//! - Drafts: what followed the matched text in the index, cut into the model's tokens by its own
//!   tokenizer (the cut it would make of that text), less a last word the byte budget may have cut
//!   short ([`whole_word_tokens`]). Continuations that sampled the same bytes are cut once.
//! - The token-level answers ([`EvidenceSource::infgram`], the gate's context, a document's dense
//!   scores) need the model's distribution at each position, so they are refused here: callers
//!   take [`EvidenceSource::step`] and [`super::bytes::document`].

use std::collections::HashMap;
use std::sync::Arc;

use super::bytes::{decode_step, followed_step};
use super::{EvidenceError, EvidenceSource, Followed, StepInfgram};
use crate::index::bytes::ByteText;
use crate::index::dense::TokenScore;
use crate::index::query::{check_vocabulary, InfgramNtdResult, NtdResult};
use crate::index::{Index, IndexError};
use crate::mix::features::InfgramContext;
use crate::mix::{MixError, NeuralDistribution};
use crate::tokenizer::Tokenizer;

/// Bytes of index text read per draft token asked for: SmolLM2 cuts the mini-Pile into about 3.5
/// bytes a token (English prose more, code and numbers fewer).
const DRAFT_BYTES_PER_TOKEN: usize = 8;

/// Bytes read beyond those, so a last word the budget cuts (and leaves out) is seldom one the draft
/// needed.
const DRAFT_BYTES_SPARE: usize = 32;

/// A byte-level index read through a model's tokenizer.
pub struct ByteSource {
    index: Arc<Index>,
    tokenizer: Tokenizer,
}

impl ByteSource {
    /// Refuses an index that is not byte-level.
    pub fn new(index: Arc<Index>, tokenizer: Tokenizer) -> Result<Self, IndexError> {
        if !index.is_byte_level() {
            return Err(IndexError::Invalid(
                "a model's tokens read a byte-level index only: build it with --bytes".into(),
            ));
        }
        Ok(Self { index, tokenizer })
    }
}

/// What a model's sequences read of `index`: the index itself, or, when it is byte-level, the index
/// through the model's `tokenizer`.
pub fn for_model(index: Arc<Index>, tokenizer: &Tokenizer) -> Arc<dyn EvidenceSource> {
    match ByteSource::new(Arc::clone(&index), tokenizer.clone()) {
        Ok(bytes) => Arc::new(bytes),
        Err(_) => index,
    }
}

/// The tokens `tokenizer` cuts index text into, for a draft: `bytes` is what followed a match,
/// `cut` says the byte budget may have ended it inside a word, which is then left out (a word's
/// tokens depend on how it ends), so the tokens are those of the whole text's cut. Text that may be
/// cut with no whitespace before its last word gives nothing: how the word's tokens run depends on
/// where it ends (CJK, code and one long word go undrafted from a cut continuation).
pub fn whole_word_tokens(tokenizer: &Tokenizer, bytes: &[u8], cut: bool) -> Vec<u32> {
    let (mut text, cut) = match std::str::from_utf8(bytes) {
        Ok(text) => (text, cut),
        // A character the byte budget split (or text that starts inside one, after a byte-fallback
        // token): the whole characters before it.
        Err(e) => (
            std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
            true,
        ),
    };
    if cut {
        // Where the whitespace before the last word starts.
        let last_gap = text
            .char_indices()
            .rev()
            .skip_while(|(_, c)| !c.is_whitespace())
            .take_while(|(_, c)| c.is_whitespace())
            .last()
            .map(|(i, _)| i);
        match last_gap {
            Some(0) | None => return Vec::new(),
            Some(end) => text = &text[..end],
        }
    }
    tokenizer.encode(text).unwrap_or_default()
}

/// The token answers a byte index cannot give without the model's distribution.
fn needs_the_model() -> IndexError {
    IndexError::Invalid(
        "a byte-level index gives a model's tokens probabilities only beside the model's \
         distribution"
            .into(),
    )
}

impl EvidenceSource for ByteSource {
    fn vocab_size(&self) -> u64 {
        self.tokenizer.vocab_size()
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), IndexError> {
        check_vocabulary(ids, self.vocab_size())
    }

    fn byte_index(&self) -> Option<&Index> {
        Some(&self.index)
    }

    fn infgram(&self, _context: &[u32]) -> Result<InfgramNtdResult, IndexError> {
        Err(needs_the_model())
    }

    fn step(
        &self,
        context: &[u32],
        neural: &NeuralDistribution,
    ) -> Result<StepInfgram, EvidenceError> {
        self.check_ids(context)?;
        decode_step(&self.index, &self.tokenizer, context, neural)
    }

    fn context_after(
        &self,
        _context: &[u32],
        _infgram: &InfgramNtdResult,
        _gate_sample: Option<&NtdResult>,
    ) -> Result<InfgramContext, MixError> {
        Err(needs_the_model().into())
    }

    fn document(
        &self,
        _tokens: &[u32],
    ) -> Result<(Vec<TokenScore>, Vec<InfgramContext>), MixError> {
        Err(needs_the_model().into())
    }

    fn follow(self: Arc<Self>, seq: &[u32]) -> Result<Box<dyn Followed>, IndexError> {
        self.check_ids(seq)?;
        let mut text = ByteText::new(&self.index)?;
        for &id in seq {
            text.push(&self.index, &self.tokenizer, id);
        }
        Ok(Box::new(FollowedBytes { source: self, text }))
    }
}

/// A model's tokens followed over a byte-level index: their text, matched a byte at a time.
struct FollowedBytes {
    source: Arc<ByteSource>,
    text: ByteText,
}

impl Followed for FollowedBytes {
    fn source(&self) -> &dyn EvidenceSource {
        &*self.source
    }

    fn suffix_len(&self) -> usize {
        self.text.suffix_len()
    }

    fn matched_tokens(&self) -> usize {
        self.text.matched_tokens()
    }

    fn prompt_cnt(&self) -> u64 {
        self.text.prompt_cnt()
    }

    fn heap_bytes(&self) -> usize {
        self.text.heap_bytes()
    }

    fn advance(&mut self, seq: &[u32], from: usize) -> Result<(), IndexError> {
        let ByteSource { index, tokenizer } = &*self.source;
        for &id in seq.get(from..).unwrap_or_default() {
            self.text.push(index, tokenizer, id);
        }
        Ok(())
    }

    fn truncate(&mut self, seq: &[u32]) -> Result<(), IndexError> {
        self.text.truncate(&self.source.index, seq.len());
        Ok(())
    }

    fn step(
        &self,
        _seq: &[u32],
        neural: &NeuralDistribution,
        _for_gate: bool,
    ) -> Result<StepInfgram, EvidenceError> {
        let ByteSource { index, tokenizer } = &*self.source;
        Ok(followed_step(index, tokenizer, &self.text, neural))
    }

    fn continuations(
        &self,
        _seq: &[u32],
        samples: usize,
        depth: usize,
    ) -> Result<Vec<Vec<u32>>, IndexError> {
        let ByteSource { index, tokenizer } = &*self.source;
        let text = &self.text;
        let byte_depth = depth
            .saturating_mul(DRAFT_BYTES_PER_TOKEN)
            .saturating_add(DRAFT_BYTES_SPARE);
        let mut cut: HashMap<Vec<u32>, Vec<u32>> = HashMap::new();
        let mut out = Vec::new();
        for bytes in text.continuations(index, samples, byte_depth) {
            let tokens = cut.entry(bytes).or_insert_with_key(|bytes| {
                let raw: Vec<u8> = bytes.iter().map(|&b| b as u8).collect();
                // A continuation shorter than asked ended with its document.
                let mut tokens = whole_word_tokens(tokenizer, &raw, raw.len() == byte_depth);
                tokens.truncate(depth);
                tokens
            });
            // An empty one (the document ended, or only a cut word followed) still counts as a
            // sample, as a token index's does: it weighs against every draft.
            out.push(tokens.clone());
        }
        Ok(out)
    }
}
