//! The per-token evidence of a document and the mixture it gives: what the model and the index say
//! at each scored token, the gate's features there, λ under a rule, and the mixed log-prob. Below
//! both the evaluator (`eval ppl`, the per-token output) and the service (`Score`, `Mix`), so they
//! score and mix documents one way.

pub mod byte_source;
pub mod bytes;
mod mixing;
mod records;
mod source;

pub use byte_source::ByteSource;
pub use mixing::{
    bits_per_byte, guard_copying, lambdas, mix_tokens, perplexity, step_lambda, usable_lambda,
    DecodeStep, MixedToken, StepInfgram, StepLambda,
};
pub use records::{document_records, DocumentRecords, TokenRecord, RECORD_FORMAT};
pub use source::{EvidenceIndex, EvidenceSource, Followed};

use crate::index::IndexError;
use crate::mix::MixError;
use crate::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Mix(#[from] MixError),
}

impl EvidenceError {
    /// Whether the work stopped for an interrupt (Ctrl-C, a request's deadline) rather than failed.
    pub fn is_interrupted(&self) -> bool {
        matches!(
            self,
            Self::Model(ModelError::Interrupted)
                | Self::Index(IndexError::Interrupted)
                | Self::Mix(MixError::Index(IndexError::Interrupted))
        )
    }
}
