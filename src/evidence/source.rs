//! Where scoring, mixing and drafting get the ∞-gram's evidence: an index in this process, or the
//! shard servers behind a router ([`crate::cluster::remote`]), whose merged answers are those of one index
//! over all their documents (`crate::cluster` says why). The callers above cannot tell which.

use std::sync::Arc;

use super::{EvidenceError, StepInfgram};
use crate::index::corpus::Corpus;
use crate::index::dense::TokenScore;
use crate::index::fm::suffix::FmSuffixMatch;
use crate::index::fm::CompressedIndex;
use crate::index::query::{InfgramNtdResult, NtdResult};
use crate::index::suffix::{Occurrences, SuffixMatch};
use crate::index::{Index, IndexError};
use crate::mix::features::{InfgramContext, SUPPORT_SAMPLES};
use crate::mix::{MixError, NeuralDistribution};

/// The reference data's answers that scoring, mixing and drafting ask for.
pub trait EvidenceSource: Send + Sync {
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
        Ok(StepInfgram::tokens(self.infgram(context)?))
    }

    /// The gate's view of the next token after `context`, whose ∞-gram answer is `infgram` (and
    /// the gate's subsample of its matches, `gate_sample`, when the step found it).
    fn context_after(
        &self,
        context: &[u32],
        infgram: &InfgramNtdResult,
        gate_sample: Option<&NtdResult>,
    ) -> Result<InfgramContext, MixError>;

    /// The dense score of every token of `tokens`, and the gate's view of each.
    fn document(&self, tokens: &[u32]) -> Result<(Vec<TokenScore>, Vec<InfgramContext>), MixError>;

    /// Starts following a sequence being decoded; refuses ids outside the vocabulary. What it
    /// gives keeps this source, so the sequence's later steps are answered by the one that
    /// follows it.
    fn follow(self: Arc<Self>, seq: &[u32]) -> Result<Box<dyn Followed>, IndexError>;
}

/// An index in this process as the evaluator reads it: its shape and answers ([`Corpus`]) and the
/// evidence it gives scoring ([`EvidenceSource`]); either kind of index is one.
pub trait EvidenceIndex: Corpus + EvidenceSource {}

impl<T: Corpus + EvidenceSource> EvidenceIndex for T {}

/// A byte-level index's token answers are over bytes, not a model's tokens: only a source that
/// reads it through the model's tokenizer ([`super::ByteSource`]) gives a decoding step.
fn refuse_bytes(source: &(impl EvidenceSource + ?Sized)) -> Result<(), IndexError> {
    match source.over_bytes() {
        true => Err(IndexError::Invalid(
            "a byte-level index mixes with a model's tokens only through the model's tokenizer"
                .into(),
        )),
        false => Ok(()),
    }
}

/// A sequence an [`EvidenceSource`] follows: that source and what it keeps of the sequence, so a
/// step costs what the new tokens cost. `seq` is always the whole sequence followed.
pub trait Followed: Send + Sync {
    /// The source that follows it.
    fn source(&self) -> &dyn EvidenceSource;

    /// Length of the longest suffix of the sequence found in the reference data (tokens, or bytes
    /// over a byte-level index).
    fn suffix_len(&self) -> usize;

    /// Tokens of the sequence inside that suffix (over a byte-level index, whose suffix is
    /// counted in bytes, those whose bytes lie inside it).
    fn matched_tokens(&self) -> usize {
        self.suffix_len()
    }

    /// Occurrences of that suffix.
    fn prompt_cnt(&self) -> u64;

    /// Memory held for the sequence.
    fn heap_bytes(&self) -> usize;

    /// Takes in the tokens of `seq` from `from` on, appended since the last call.
    fn advance(&mut self, seq: &[u32], from: usize) -> Result<(), IndexError>;

    /// Forgets the tokens past `seq`, the sequence after a cut.
    fn truncate(&mut self, seq: &[u32]) -> Result<(), IndexError>;

    /// What the ∞-gram says of a decoding step after the sequence, whose model distribution is
    /// `neural` (which a byte-level index reads). `for_gate`: the gate will read the step, so an
    /// index here finds the gate's subsample of the matches with the answer.
    fn step(
        &self,
        seq: &[u32],
        neural: &NeuralDistribution,
        for_gate: bool,
    ) -> Result<StepInfgram, EvidenceError>;

    /// What followed the matched suffix of `seq` in the reference data: up to `samples` of its
    /// occurrences, spread evenly, each with at most `depth` following tokens cut at the end of
    /// its document ([`SuffixMatch::continuations`]).
    fn continuations(
        &self,
        seq: &[u32],
        samples: usize,
        depth: usize,
    ) -> Result<Vec<Vec<u32>>, IndexError>;
}

/// An index in this process, of either kind: it follows a sequence with a [`SuffixMatch`] over its
/// own matches, so one [`EvidenceSource`] serves both (a compressed index's drafts' tokens after the
/// first aside: `FmSuffixMatch::continuations` says why). Over bytes it gives no decoding steps: a
/// byte-level index mixes through `ByteSource`, which reads suffix arrays.
pub(crate) trait LocalSource: Corpus + Occurrences + Sized + 'static {
    /// What followed a followed match: up to `samples` occurrences, `depth` tokens each.
    fn continue_after(
        &self,
        m: &SuffixMatch<Self::Matches>,
        samples: usize,
        depth: usize,
    ) -> Vec<Vec<u32>>;
}

impl LocalSource for Index {
    fn continue_after(&self, m: &SuffixMatch, samples: usize, depth: usize) -> Vec<Vec<u32>> {
        m.continuations(self, samples, depth)
    }
}

impl LocalSource for CompressedIndex {
    fn continue_after(&self, m: &FmSuffixMatch, samples: usize, depth: usize) -> Vec<Vec<u32>> {
        m.continuations(self, samples, depth)
    }
}

/// A sequence an index here follows: the matches of its longest suffix, advanced a token at a time.
struct FollowedHere<T: LocalSource> {
    index: Arc<T>,
    m: SuffixMatch<T::Matches>,
}

impl<T: LocalSource> Followed for FollowedHere<T>
where
    T::Matches: Send + Sync,
{
    fn source(&self) -> &dyn EvidenceSource {
        &*self.index
    }

    fn suffix_len(&self) -> usize {
        self.m.suffix_len()
    }

    fn prompt_cnt(&self) -> u64 {
        self.m.prompt_cnt()
    }

    fn heap_bytes(&self) -> usize {
        self.m.heap_bytes()
    }

    fn advance(&mut self, seq: &[u32], from: usize) -> Result<(), IndexError> {
        for end in from + 1..=seq.len() {
            self.m.advance(&*self.index, &seq[..end]);
        }
        Ok(())
    }

    fn truncate(&mut self, seq: &[u32]) -> Result<(), IndexError> {
        self.m.truncate(&*self.index, seq);
        Ok(())
    }

    fn step(
        &self,
        _seq: &[u32],
        _neural: &NeuralDistribution,
        for_gate: bool,
    ) -> Result<StepInfgram, EvidenceError> {
        refuse_bytes(&*self.index)?;
        let cap = for_gate.then_some(SUPPORT_SAMPLES);
        let (answer, gate_sample) = self.m.infgram_ntd_and_sample(&*self.index, cap)?;
        Ok(StepInfgram::Tokens {
            answer,
            gate_sample,
        })
    }

    fn continuations(
        &self,
        _seq: &[u32],
        samples: usize,
        depth: usize,
    ) -> Result<Vec<Vec<u32>>, IndexError> {
        Ok(self.index.continue_after(&self.m, samples, depth))
    }
}

impl<T: LocalSource> EvidenceSource for T
where
    T::Matches: Send + Sync,
{
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
        gate_sample: Option<&NtdResult>,
    ) -> Result<InfgramContext, MixError> {
        InfgramContext::after(self, context, infgram, gate_sample)
    }

    fn document(&self, tokens: &[u32]) -> Result<(Vec<TokenScore>, Vec<InfgramContext>), MixError> {
        let scores = self.score(tokens)?;
        let contexts = InfgramContext::for_document(self, tokens, &scores)?;
        Ok((scores, contexts))
    }

    fn follow(self: Arc<Self>, seq: &[u32]) -> Result<Box<dyn Followed>, IndexError> {
        let m = SuffixMatch::of(&*self, seq)?;
        Ok(Box::new(FollowedHere { index: self, m }))
    }
}
