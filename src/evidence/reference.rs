//! Where scoring, mixing and drafting get the ∞-gram's evidence: an index in this process, or the
//! shard servers behind a router (`server::router`), whose merged answers are those of one index
//! over all their documents (`crate::cluster` says why). The callers above cannot tell which.

use super::{EvidenceError, StepInfgram};
use crate::index::bytes::ByteText;
use crate::index::corpus::Corpus;
use crate::index::dense::TokenScore;
use crate::index::fm::suffix::FmSuffixMatch;
use crate::index::fm::CompressedIndex;
use crate::index::query::InfgramNtdResult;
use crate::index::suffix::{Occurrences, SuffixMatch};
use crate::index::{Index, IndexError};
use crate::mix::features::InfgramContext;
use crate::mix::{MixError, NeuralDistribution};

/// The reference data's answers that scoring, mixing and drafting ask for.
pub trait ReferenceData: Send + Sync {
    fn vocab_size(&self) -> u64;

    /// Whether its answers come over the network (shard servers): callers then overlap requests on
    /// threads of their own rather than hold compute workers while they wait.
    fn waits_on_network(&self) -> bool {
        false
    }

    /// Refuses ids outside the vocabulary.
    fn check_ids(&self, ids: &[u32]) -> Result<(), IndexError>;

    /// The byte-level index behind it, if it is one: its evidence over a model's tokens needs the
    /// model's candidates at each position ([`super::bytes`]), so callers take that path instead of
    /// the token answers below.
    fn byte_index(&self) -> Option<&Index> {
        None
    }

    /// Whether its ids are UTF-8 bytes (a byte-level index of either kind): they give no
    /// decoding step over a model's tokens.
    fn over_bytes(&self) -> bool {
        self.byte_index().is_some()
    }

    /// The exact ∞-gram distribution after `context`; refuses ids outside the vocabulary.
    fn infgram(&self, context: &[u32]) -> Result<InfgramNtdResult, IndexError>;

    /// What the ∞-gram says of a decoding step after `context`, whose model distribution is
    /// `neural` (which a byte-level index reads; a token index gives [`Self::infgram`]).
    fn step(
        &self,
        context: &[u32],
        _neural: &NeuralDistribution,
    ) -> Result<StepInfgram, EvidenceError> {
        refuse_bytes(self)?;
        Ok(StepInfgram::Tokens(self.infgram(context)?))
    }

    /// The same after the followed sequence `seq`, from what `followed` keeps of it.
    fn step_followed(
        &self,
        followed: &Followed,
        _seq: &[u32],
        _neural: &NeuralDistribution,
    ) -> Result<StepInfgram, EvidenceError> {
        refuse_bytes(self)?;
        Ok(StepInfgram::Tokens(self.infgram_followed(followed)?))
    }

    /// The gate's view of the next token after `context`, whose ∞-gram answer is `infgram`.
    fn context_after(
        &self,
        context: &[u32],
        infgram: &InfgramNtdResult,
    ) -> Result<InfgramContext, MixError>;

    /// The dense score of every token of `tokens`, and the gate's view of each.
    fn document(&self, tokens: &[u32]) -> Result<(Vec<TokenScore>, Vec<InfgramContext>), MixError>;

    /// Starts following a sequence being decoded; refuses ids outside the vocabulary.
    fn follow(&self, seq: &[u32]) -> Result<Followed, IndexError>;

    /// Takes in the tokens of `seq` from `from` on, appended since the last call.
    fn advance(&self, followed: &mut Followed, seq: &[u32], from: usize) -> Result<(), IndexError>;

    /// Forgets the tokens past `seq`, the sequence after a cut.
    fn truncate(&self, followed: &mut Followed, seq: &[u32]) -> Result<(), IndexError>;

    /// The exact ∞-gram distribution after the followed sequence.
    fn infgram_followed(&self, followed: &Followed) -> Result<InfgramNtdResult, IndexError>;

    /// What followed the matched suffix of `seq` (the followed sequence) in the reference data: up
    /// to `samples` of its occurrences, spread evenly, each with at most `depth` following tokens
    /// cut at the end of its document ([`SuffixMatch::continuations`]).
    fn continuations(
        &self,
        followed: &Followed,
        seq: &[u32],
        samples: usize,
        depth: usize,
    ) -> Result<Vec<Vec<u32>>, IndexError>;
}

/// An index in this process as the evaluator reads it: its shape and answers ([`Corpus`]) and the
/// evidence it gives scoring ([`ReferenceData`]); either kind of index is one.
pub trait EvidenceIndex: Corpus + ReferenceData {}

impl<T: Corpus + ReferenceData> EvidenceIndex for T {}

/// A byte-level index's token answers are over bytes, not a model's tokens: only a reference that
/// reads it through the model's tokenizer ([`super::ByteReference`]) gives a decoding step.
fn refuse_bytes(reference: &(impl ReferenceData + ?Sized)) -> Result<(), IndexError> {
    match reference.over_bytes() {
        true => Err(IndexError::Invalid(
            "a byte-level index mixes with a model's tokens only through the model's tokenizer"
                .into(),
        )),
        false => Ok(()),
    }
}

/// What a [`ReferenceData`] keeps of a sequence it follows, so a step costs what the new tokens cost.
pub enum Followed {
    /// In an index here: the matches of the longest suffix, advanced a token at a time.
    Local(SuffixMatch),
    /// Behind a router: the shards' merged ∞-gram answer after the sequence, asked once per change.
    Remote(InfgramNtdResult),
    /// A model's tokens over a byte-level index: their text, matched a byte at a time.
    Bytes(ByteText),
    /// In a compressed index here: as `Local`, over its rows.
    Compressed(FmSuffixMatch),
}

impl Followed {
    /// Length of the longest suffix of the sequence found in the reference data (tokens, or bytes
    /// over a byte-level index).
    pub fn suffix_len(&self) -> usize {
        match self {
            Followed::Local(m) => m.suffix_len(),
            Followed::Remote(a) => a.suffix_len,
            Followed::Bytes(t) => t.suffix_len(),
            Followed::Compressed(m) => m.suffix_len(),
        }
    }

    /// Tokens of the sequence inside that suffix (over a byte-level index, whose suffix is
    /// counted in bytes, those whose bytes lie inside it).
    pub fn matched_tokens(&self) -> usize {
        match self {
            Followed::Bytes(t) => t.matched_tokens(),
            other => other.suffix_len(),
        }
    }

    /// Occurrences of that suffix.
    pub fn prompt_cnt(&self) -> u64 {
        match self {
            Followed::Local(m) => m.prompt_cnt(),
            Followed::Remote(a) => a.ntd.prompt_cnt,
            Followed::Bytes(t) => t.prompt_cnt(),
            Followed::Compressed(m) => m.prompt_cnt(),
        }
    }

    /// Memory held for the sequence (behind a router: the answer's distribution, a tree node a
    /// token, about three times its entry).
    pub fn heap_bytes(&self) -> usize {
        match self {
            Followed::Local(m) => m.heap_bytes(),
            Followed::Remote(a) => a.ntd.dist.len() * 3 * std::mem::size_of::<(u32, u64)>(),
            Followed::Bytes(t) => t.heap_bytes(),
            Followed::Compressed(m) => m.heap_bytes(),
        }
    }
}

/// A sequence handed to a reference other than the one that follows it: a bug, said as an error.
fn followed_elsewhere() -> IndexError {
    IndexError::Invalid("the sequence is followed by another reference".into())
}

impl Followed {
    /// The shards' answer a router keeps.
    pub(crate) fn remote(&self) -> Result<&InfgramNtdResult, IndexError> {
        match self {
            Followed::Remote(a) => Ok(a),
            _ => Err(followed_elsewhere()),
        }
    }

    /// The text a byte-level index follows.
    pub(crate) fn bytes(&self) -> Result<&ByteText, IndexError> {
        match self {
            Followed::Bytes(t) => Ok(t),
            _ => Err(followed_elsewhere()),
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> Result<&mut ByteText, IndexError> {
        match self {
            Followed::Bytes(t) => Ok(t),
            _ => Err(followed_elsewhere()),
        }
    }
}

/// An index in this process, of either kind: it follows a sequence with a [`SuffixMatch`] over its
/// own matches, so one [`ReferenceData`] serves both (a compressed index's drafts' tokens after the
/// first aside: `FmSuffixMatch::continuations` says why). Over bytes it gives no decoding steps: a
/// byte-level index mixes through `ByteReference`, which reads suffix arrays.
pub(crate) trait LocalReference: Corpus + Occurrences + Sized {
    /// A followed sequence's match held as this kind's, and read back.
    fn hold(m: SuffixMatch<Self::Matches>) -> Followed;
    fn held(followed: &Followed) -> Option<&SuffixMatch<Self::Matches>>;
    fn held_mut(followed: &mut Followed) -> Option<&mut SuffixMatch<Self::Matches>>;
    /// The ∞-gram distribution after a followed match.
    fn infgram_after(&self, m: &SuffixMatch<Self::Matches>)
        -> Result<InfgramNtdResult, IndexError>;
    /// What followed a followed match: up to `samples` occurrences, `depth` tokens each.
    fn continue_after(
        &self,
        m: &SuffixMatch<Self::Matches>,
        samples: usize,
        depth: usize,
    ) -> Vec<Vec<u32>>;
}

impl LocalReference for Index {
    fn hold(m: SuffixMatch) -> Followed {
        Followed::Local(m)
    }
    fn held(followed: &Followed) -> Option<&SuffixMatch> {
        match followed {
            Followed::Local(m) => Some(m),
            _ => None,
        }
    }
    fn held_mut(followed: &mut Followed) -> Option<&mut SuffixMatch> {
        match followed {
            Followed::Local(m) => Some(m),
            _ => None,
        }
    }
    fn infgram_after(&self, m: &SuffixMatch) -> Result<InfgramNtdResult, IndexError> {
        m.infgram_ntd(self, None)
    }
    fn continue_after(&self, m: &SuffixMatch, samples: usize, depth: usize) -> Vec<Vec<u32>> {
        m.continuations(self, samples, depth)
    }
}

impl LocalReference for CompressedIndex {
    fn hold(m: FmSuffixMatch) -> Followed {
        Followed::Compressed(m)
    }
    fn held(followed: &Followed) -> Option<&FmSuffixMatch> {
        match followed {
            Followed::Compressed(m) => Some(m),
            _ => None,
        }
    }
    fn held_mut(followed: &mut Followed) -> Option<&mut FmSuffixMatch> {
        match followed {
            Followed::Compressed(m) => Some(m),
            _ => None,
        }
    }
    fn infgram_after(&self, m: &FmSuffixMatch) -> Result<InfgramNtdResult, IndexError> {
        m.infgram_ntd(self, None)
    }
    fn continue_after(&self, m: &FmSuffixMatch, samples: usize, depth: usize) -> Vec<Vec<u32>> {
        m.continuations(self, samples, depth)
    }
}

impl<T: LocalReference> ReferenceData for T {
    fn vocab_size(&self) -> u64 {
        Corpus::vocab_size(self)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), IndexError> {
        Corpus::check_ids(self, ids)
    }

    /// A byte-level suffix array is read through a model's tokens (a compressed one is not).
    fn byte_index(&self) -> Option<&Index> {
        self.as_suffix_array().filter(|i| i.is_byte_level())
    }

    fn over_bytes(&self) -> bool {
        Corpus::is_byte_level(self)
    }

    fn infgram(&self, context: &[u32]) -> Result<InfgramNtdResult, IndexError> {
        self.infgram_ntd(context, None)
    }

    fn context_after(
        &self,
        context: &[u32],
        infgram: &InfgramNtdResult,
    ) -> Result<InfgramContext, MixError> {
        InfgramContext::after(self, context, infgram)
    }

    fn document(&self, tokens: &[u32]) -> Result<(Vec<TokenScore>, Vec<InfgramContext>), MixError> {
        let scores = self.score(tokens)?;
        let contexts = InfgramContext::for_document(self, tokens, &scores)?;
        Ok((scores, contexts))
    }

    fn follow(&self, seq: &[u32]) -> Result<Followed, IndexError> {
        Ok(T::hold(SuffixMatch::of(self, seq)?))
    }

    fn advance(&self, followed: &mut Followed, seq: &[u32], from: usize) -> Result<(), IndexError> {
        let m = T::held_mut(followed).ok_or_else(followed_elsewhere)?;
        for end in from + 1..=seq.len() {
            m.advance(self, &seq[..end]);
        }
        Ok(())
    }

    fn truncate(&self, followed: &mut Followed, seq: &[u32]) -> Result<(), IndexError> {
        T::held_mut(followed)
            .ok_or_else(followed_elsewhere)?
            .truncate(self, seq);
        Ok(())
    }

    fn infgram_followed(&self, followed: &Followed) -> Result<InfgramNtdResult, IndexError> {
        self.infgram_after(T::held(followed).ok_or_else(followed_elsewhere)?)
    }

    fn continuations(
        &self,
        followed: &Followed,
        _seq: &[u32],
        samples: usize,
        depth: usize,
    ) -> Result<Vec<Vec<u32>>, IndexError> {
        let m = T::held(followed).ok_or_else(followed_elsewhere)?;
        Ok(self.continue_after(m, samples, depth))
    }
}
