//! A sequence being decoded, and the one owner of everything it carries: its tokens, its ∞-gram
//! match (as its evidence source follows it), its own model's KV cache, its adaptive λ and how each draft
//! source has fared. Every step (append, truncate, mix, draft; learning into the live index rides
//! on append) applies whole or leaves the sequence as it was. Sessions, `Batch`, `Mix` with a
//! sequence id, `eval generate` and the speculative loop of `eval spec` and `eval workload` all
//! decode through it.

mod drafting;
mod learning;
mod mixing;
mod model_state;
pub mod spec;

use std::sync::Arc;

use crate::draft::calibration::{Calibration, Origin};
use crate::draft::lookup::PromptLookup;
use crate::evidence::{EvidenceError, EvidenceSource, Followed};
use crate::index::IndexError;
use crate::live::LiveError;
use crate::mix::{AdaptiveSequence, MixError};
use crate::model::budget::KvReservation;
use crate::model::{ModelError, Transformer};
pub use learning::Extras;
use learning::LiveLink;
pub use mixing::{mix_step, MixRule, MixedStep};
use model_state::ModelState;

/// Why a step of a sequence was refused: the model's failure, the reference data's, the mixing
/// rule's or the live index's.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Evidence(#[from] EvidenceError),
    #[error(transparent)]
    Mix(#[from] MixError),
    /// The live namespace the sequence drafts from and learns into.
    #[error(transparent)]
    Live(#[from] LiveError),
}

impl From<candle_core::Error> for DecodeError {
    fn from(e: candle_core::Error) -> Self {
        DecodeError::Model(e.into())
    }
}

/// A sequence being decoded. Its parts beyond the tokens and the match are there when asked for:
/// the model's state ([`Sequence::with_model`]), a live namespace and a reference text
/// ([`Sequence::with_extras`]), and the adaptive λ's posterior from its first adaptive mix on.
pub struct Sequence {
    tokens: Vec<u32>,
    /// Its match in the reference data; `None` for a sequence the model decodes alone
    /// ([`Sequence::model_only`]).
    followed: Option<Box<dyn Followed>>,
    lookup: PromptLookup,
    live: Option<LiveLink>,
    /// The reference text, when the caller gave one.
    reference: Option<ReferenceText>,
    calibration: Calibration,
    /// The source of the last draft handed out (`None` for a union of several, or no draft).
    last_origin: Option<Origin>,
    /// Why the sequence stopped learning into its namespace, if it did.
    warning: Option<String>,
    model: Option<ModelState>,
    adaptive: Option<AdaptiveSequence>,
}

/// Text the caller expects the output to resemble (the file being edited, a predicted answer).
struct ReferenceText {
    tokens: Vec<u32>,
    lookup: PromptLookup,
}

impl Sequence {
    /// A sequence that follows `source` from `context` on, and reads it in every step.
    pub fn new(source: Arc<dyn EvidenceSource>, context: Vec<u32>) -> Result<Self, IndexError> {
        let followed = source.follow(&context)?;
        Ok(Self::of(context, Some(followed)))
    }

    /// A sequence the model decodes alone (plain decoding, the baseline of speculative decoding):
    /// it never reads the reference data, so it cannot mix, and it drafts only from its own tokens
    /// and extras.
    pub fn model_only(context: Vec<u32>) -> Self {
        Self::of(context, None)
    }

    fn of(context: Vec<u32>, followed: Option<Box<dyn Followed>>) -> Self {
        let mut lookup = PromptLookup::default();
        lookup.extend(&context, 0);
        Self {
            tokens: context,
            followed,
            lookup,
            live: None,
            reference: None,
            calibration: Calibration::default(),
            last_origin: None,
            warning: None,
            model: None,
            adaptive: None,
        }
    }

    /// The sequence with `model`'s KV cache, which runs the tokens lazily, when logits are asked
    /// for. A `reservation` (of the sequence's length) holds the budget for the whole sequence
    /// from the moment tokens are appended, so a step that would pass the budget is refused before
    /// it changes anything.
    pub fn with_model(mut self, model: &Transformer, reservation: Option<KvReservation>) -> Self {
        self.model = Some(ModelState::new(model, reservation));
        self
    }

    /// Drafts also from `tokens`, for this sequence only. Ids must have been checked.
    fn with_reference(mut self, tokens: Vec<u32>) -> Self {
        let mut lookup = PromptLookup::default();
        lookup.extend(&tokens, 0);
        self.reference = Some(ReferenceText { tokens, lookup });
        self
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Length of the longest suffix of the sequence found in the reference data (tokens, or bytes
    /// over a byte-level index).
    pub fn suffix_len(&self) -> usize {
        self.followed.as_ref().map_or(0, |f| f.suffix_len())
    }

    /// Occurrences of that suffix.
    pub fn prompt_cnt(&self) -> u64 {
        self.followed.as_ref().map_or(0, |f| f.prompt_cnt())
    }

    /// Whether the sequence keeps a model's KV cache.
    pub fn has_model(&self) -> bool {
        self.model.is_some()
    }

    /// Why the sequence does less than it was started for (it stopped learning), if it does.
    pub fn warning(&self) -> Option<&str> {
        self.warning.as_deref()
    }

    /// Appends tokens. Checked against the KV budget and the vocabulary first, so a full budget or
    /// a bad id changes nothing; a source that fails to follow them leaves the sequence as it
    /// was. The adaptive λ learns from the first of them, if a mixing step awaited it.
    pub fn append(&mut self, tokens: &[u32]) -> Result<(), DecodeError> {
        let Some(&first) = tokens.first() else {
            return Ok(());
        };
        let from = self.tokens.len();
        if let Some(m) = &mut self.model {
            m.reserve(from + tokens.len())?;
        }
        if let Err(e) = self.follow_appended(tokens) {
            if let Some(m) = &mut self.model {
                m.unreserve(from);
            }
            return Err(e);
        }
        for &t in tokens {
            self.calibration.appended(t);
        }
        self.lookup.extend(&self.tokens, from);
        if let Some(m) = &mut self.model {
            m.appended();
        }
        if let Some(a) = &mut self.adaptive {
            a.observe(from, first);
        }
        self.learn();
        Ok(())
    }

    /// Adds `tokens` to the tokens and to the match, ids checked first; refused, neither changed.
    fn follow_appended(&mut self, tokens: &[u32]) -> Result<(), DecodeError> {
        let from = self.tokens.len();
        let Some(followed) = &mut self.followed else {
            self.tokens.extend_from_slice(tokens);
            return Ok(());
        };
        followed.source().check_ids(tokens)?;
        self.tokens.extend_from_slice(tokens);
        if let Err(e) = followed.advance(&self.tokens, from) {
            self.tokens.truncate(from);
            return Err(e.into());
        }
        Ok(())
    }

    /// Keeps the first `len` tokens (nothing changes when it has no more). A source that fails
    /// to follow the cut leaves the sequence as it was; the adaptive λ forgets what it learnt after
    /// the cut, the KV cache drops it, and a learning sequence takes it back from its live document.
    pub fn truncate(&mut self, len: usize) -> Result<(), DecodeError> {
        if len >= self.tokens.len() {
            return Ok(());
        }
        if let Some(followed) = &mut self.followed {
            followed.truncate(&self.tokens[..len])?;
        }
        self.calibration.release();
        self.lookup.truncate(&self.tokens[len..], len);
        self.tokens.truncate(len);
        self.unlearn(len);
        if let Some(a) = &mut self.adaptive {
            a.truncate(len);
        }
        if let Some(m) = &mut self.model {
            m.truncate(len);
        }
        Ok(())
    }

    /// Brings the sequence to `context`, for a caller that sends the whole context at each step:
    /// keeps what it shares with it (a truncate) and appends the rest. Over an evidence source,
    /// bad ids are refused before either, changing nothing (a model-only sequence leaves its ids
    /// to the model); a source that fails in the append leaves the sequence cut to
    /// the shared part, still whole.
    pub fn align(&mut self, context: &[u32]) -> Result<(), DecodeError> {
        let common = self
            .tokens
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count();
        if let Some(followed) = &self.followed {
            followed.source().check_ids(&context[common..])?;
        }
        self.truncate(common)?;
        self.append(&context[common..])
    }

    /// Memory held beyond the model's cache (budgeted on its own): the tokens, their match, the
    /// lookup of their positions and the adaptive λ's history.
    pub fn heap_bytes(&self) -> usize {
        self.tokens.capacity() * 4
            + self.followed.as_ref().map_or(0, |f| f.heap_bytes())
            + self.lookup.heap_bytes()
            + self
                .adaptive
                .as_ref()
                .map_or(0, AdaptiveSequence::heap_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{Content, InputDoc};
    use crate::draft::DraftOptions;
    use crate::index::build::{build, BuildOptions};
    use crate::index::{Index, OpenOptions, TokenWidth};
    use crate::mix::distribution::mix_full;
    use crate::mix::params::split_only;
    use crate::mix::{LambdaRule, NeuralDistribution};

    fn index(dir: &std::path::Path) -> Arc<dyn EvidenceSource> {
        let docs: Vec<Vec<u32>> = vec![
            vec![1, 2, 3, 4, 5, 1, 2, 3, 4, 6],
            vec![2, 3, 4, 7, 1, 2, 3, 9],
            vec![3, 4, 5, 6, 7, 8],
        ];
        let inputs = docs.into_iter().map(|d| {
            Ok(InputDoc {
                content: Content::Tokens(d),
                metadata: None,
                input_bytes: 0,
            })
        });
        let out = dir.join("idx");
        build(
            inputs,
            &BuildOptions::new(out.clone(), TokenWidth::U16, 0, 100),
        )
        .unwrap();
        Arc::new(Index::open(&out, &OpenOptions::default()).unwrap())
    }

    /// λ and the whole mixture of the next token, as bits.
    fn mixed(seq: &mut Sequence, how: MixRule) -> (u64, Vec<u64>) {
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
        let neural = NeuralDistribution::from_logits(&logits).unwrap();
        let step = seq.mix(how, neural, mix_full).unwrap();
        let probs = step.output.iter().map(|p| p.to_bits()).collect();
        (step.lambda.lambda.to_bits(), probs)
    }

    /// A refused step changes nothing, and a sequence brought to a context through drafts taken
    /// back (truncate, `align`) answers exactly as one that only ever saw the kept tokens: the same
    /// match, the same mixture, the same adaptive λ.
    #[test]
    fn steps_apply_whole_and_every_path_to_a_context_agrees() {
        let tmp = tempfile::tempdir().unwrap();
        let index = index(tmp.path());
        let params = split_only((0.6, 0.2));
        let how = MixRule {
            rule: LambdaRule::Adaptive,
            params: Some(&params),
            max_match: None,
        };
        let view = |s: &Sequence| (s.tokens().to_vec(), s.suffix_len(), s.prompt_cnt());

        let mut taken_back = Sequence::new(index.clone(), vec![1, 2, 3]).unwrap();
        let before = view(&taken_back);
        assert!(taken_back.append(&[4, 100]).is_err());
        assert_eq!(view(&taken_back), before, "a bad id appends nothing");
        mixed(&mut taken_back, how);
        taken_back.append(&[4]).unwrap();
        mixed(&mut taken_back, how);
        taken_back.append(&[5, 6, 7]).unwrap();
        mixed(&mut taken_back, how);
        taken_back.truncate(4).unwrap();

        let mut straight = Sequence::new(index.clone(), vec![1, 2, 3]).unwrap();
        mixed(&mut straight, how);
        straight.append(&[4]).unwrap();

        let mut aligned = Sequence::new(index.clone(), vec![1, 2, 3]).unwrap();
        mixed(&mut aligned, how);
        let before = view(&aligned);
        assert!(aligned.align(&[1, 2, 5, 100]).is_err());
        assert_eq!(
            view(&aligned),
            before,
            "a bad id in a new context changes nothing"
        );
        aligned.align(&[1, 2, 3, 4]).unwrap();

        let fresh = Sequence::new(index.clone(), vec![1, 2, 3, 4]).unwrap();
        assert_eq!(view(&taken_back), view(&fresh));
        assert_eq!(view(&straight), view(&fresh));
        assert_eq!(view(&aligned), view(&fresh));
        let want = mixed(&mut straight, how);
        assert_eq!(mixed(&mut taken_back, how), want);
        assert_eq!(mixed(&mut aligned, how), want);
        // The posterior learnt from the token 4: a fresh sequence's prior gives another λ.
        let mut fresh = fresh;
        assert_ne!(mixed(&mut fresh, how).0, want.0);
    }

    /// A sequence the model decodes alone never reads the reference data: no match, no mixing, no
    /// drafts from the index; its own tokens still draft.
    #[test]
    fn a_model_only_sequence_reads_no_reference() {
        let mut seq = Sequence::model_only(vec![1, 2, 3, 4, 5, 1, 2, 3]);
        seq.append(&[4]).unwrap();
        assert_eq!((seq.suffix_len(), seq.prompt_cnt()), (0, 0));
        let how = MixRule {
            rule: LambdaRule::Fixed(0.5),
            params: None,
            max_match: None,
        };
        let neural = NeuralDistribution::from_logits(&[0.0; 100]).unwrap();
        assert!(seq.mix(how, neural, mix_full).is_err());
        let draft = seq.draft(&DraftOptions::default()).unwrap();
        // What followed the earlier "1 2 3 4", as deep as its match is long.
        assert_eq!(draft.chain(), vec![5, 1, 2, 3], "prompt lookup's draft");
        assert_eq!(seq.last_origin(), Some(Origin::Prompt));
    }

    /// A source whose draft lost is still measured on what was appended: one early miss after a
    /// long match sinks the reference's record for long matches, and prompt lookup's short
    /// certain drafts then outscore it at every step; followed although not handed out, the
    /// reference's drafts prove right and it wins again. (Followed only when handed out, it never
    /// did: prompt lookup's four-token drafts won at every step.)
    #[test]
    fn a_source_that_lost_is_still_measured_and_wins_again() {
        let unit = [30, 31, 32, 33];
        let periodic = |n: usize| unit.iter().copied().cycle().take(n).collect::<Vec<u32>>();
        // The reference: a passage, then a long run of the unit (an earlier answer that repeated
        // a line).
        let passage: Vec<u32> = (50..70).collect();
        let reference = [passage.clone(), vec![71, 40, 41], periodic(200), vec![42]].concat();
        let extras = Extras {
            reference,
            ..Extras::default()
        };
        let mut seq = Sequence::model_only([vec![20, 21], passage].concat())
            .with_extras(extras)
            .unwrap();
        let opts = DraftOptions {
            max_tokens: 32,
            ..DraftOptions::default()
        };
        // A long match in the reference, and a miss at its first drafted token.
        let first = seq.draft(&opts).unwrap();
        assert_eq!(seq.last_origin(), Some(Origin::Reference));
        assert_eq!(first.chain()[0], 71);
        seq.append(&[44]).unwrap();
        // Then the text repeats the unit; each step takes what the draft got right and one token
        // more, as a verifier does.
        let mut done = 16;
        seq.append(&periodic(done)).unwrap();
        let mut drafts = Vec::new();
        for _ in 0..8 {
            let chain = seq.draft(&opts).unwrap().chain();
            drafts.push((chain.len(), seq.last_origin()));
            let truth = periodic(done + chain.len() + 1).split_off(done);
            let accepted = chain.iter().zip(&truth).take_while(|(a, b)| a == b).count();
            seq.append(&truth[..accepted + 1]).unwrap();
            done += accepted + 1;
        }
        // The reference's record climbs back within a few steps and its long draft wins.
        let won =
            |&(n, origin): &(usize, Option<Origin>)| n >= 8 && origin == Some(Origin::Reference);
        assert!(drafts[..6].iter().any(won), "{drafts:?}");
    }
}
