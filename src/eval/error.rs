//! Errors of the evaluator: the layers it drives, and its own (inputs, saved records, output).

use crate::corpus::CorpusError;
use crate::decoding::DecodeError;
use crate::evidence::EvidenceError;
use crate::index::IndexError;
use crate::mix::MixError;
use crate::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Mix(#[from] MixError),
    #[error(transparent)]
    Evidence(#[from] EvidenceError),
    /// An evaluation that cannot run as asked: nothing to score, a model and an index that do not
    /// belong together.
    #[error("{0}")]
    Invalid(String),
    #[error("tokenizing document {index} ({path})")]
    Tokenize {
        index: usize,
        path: String,
        source: ModelError,
    },
    #[error("fitting the gate")]
    FitGate(#[source] MixError),
    #[error("encoding token records")]
    Encode(#[source] bincode::Error),
    /// Reading or writing the evaluator's own files (saved records, per-token output).
    #[error("{context}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

impl EvalError {
    pub(crate) fn io(context: String) -> impl FnOnce(std::io::Error) -> Self {
        move |source| EvalError::Io { context, source }
    }

    /// Whether the evaluation stopped for Ctrl-C rather than failed.
    pub fn is_interrupted(&self) -> bool {
        match self {
            Self::Model(ModelError::Interrupted)
            | Self::Index(IndexError::Interrupted)
            | Self::Mix(MixError::Index(IndexError::Interrupted))
            | Self::Tokenize {
                source: ModelError::Interrupted,
                ..
            } => true,
            Self::Evidence(e) => e.is_interrupted(),
            _ => false,
        }
    }
}

/// What stopped a decoding sequence ([`crate::decoding`]), as the evaluator reports it.
impl From<DecodeError> for EvalError {
    fn from(e: DecodeError) -> Self {
        match e {
            DecodeError::Model(e) => e.into(),
            DecodeError::Index(e) => e.into(),
            DecodeError::Evidence(e) => e.into(),
            DecodeError::Mix(e) => e.into(),
            DecodeError::Live(e) => EvalError::Invalid(format!("decoding: {e}")),
        }
    }
}
