//! One mapping from the library's typed errors to gRPC statuses.

use tonic::Status;

use crate::decoding::DecodeError;
use crate::evidence::EvidenceError;
use crate::index::IndexError;
use crate::interrupt::{StopReason, StopSignal};
use crate::live::LiveError;
use crate::mix::MixError;
use crate::model::ModelError;
use crate::tokenizer::TokenizerError;

use super::valid::Invalid;

/// What a request gets when its work was stopped by its [`StopSignal`]; [`on_pool`] turns it into
/// the status that says why.
pub(super) fn stopped() -> Status {
    Status::cancelled("the work was stopped")
}

impl From<Invalid> for Status {
    fn from(e: Invalid) -> Self {
        match e {
            Invalid::Argument(m) => Status::invalid_argument(m),
            Invalid::AnswerTooLarge(m) => Status::resource_exhausted(m),
            Invalid::Index(e) => index_status(e),
            Invalid::Live(e) => live_status(e),
        }
    }
}

pub(super) fn index_status(e: IndexError) -> Status {
    match e {
        IndexError::Invalid(m) => Status::invalid_argument(m),
        IndexError::Unsupported(m) => Status::failed_precondition(m),
        IndexError::Interrupted => stopped(),
        IndexError::Remote { message, source } => match source.downcast::<Status>() {
            Ok(status) => *status,
            Err(_) => Status::unavailable(message),
        },
        other => Status::internal(other.to_string()),
    }
}

pub(super) fn evidence_status(e: EvidenceError) -> Status {
    match e {
        EvidenceError::Index(e) => index_status(e),
        EvidenceError::Mix(e) => mix_status(e),
        EvidenceError::Model(e) => model_status(e),
    }
}

pub(super) fn decode_status(e: DecodeError) -> Status {
    match e {
        DecodeError::Model(e) => model_status(e),
        DecodeError::Index(e) => index_status(e),
        DecodeError::Evidence(e) => evidence_status(e),
        DecodeError::Mix(e) => mix_status(e),
        DecodeError::Live(e) => live_status(e),
    }
}

pub(super) fn live_status(e: LiveError) -> Status {
    match e {
        LiveError::Invalid(m) => Status::invalid_argument(m),
        LiveError::Full(m) => Status::resource_exhausted(m),
        LiveError::Index(e) => index_status(e),
        other => Status::internal(other.to_string()),
    }
}

pub(super) fn mix_status(e: MixError) -> Status {
    match e {
        MixError::Invalid(m) => Status::invalid_argument(m),
        MixError::Unconfigured(m) => Status::failed_precondition(m),
        MixError::Index(e) => index_status(e),
        other => Status::internal(other.to_string()),
    }
}

pub(super) fn model_status(e: ModelError) -> Status {
    match e {
        ModelError::Invalid(m) => Status::invalid_argument(m),
        ModelError::Interrupted => stopped(),
        ModelError::Exhausted(m) => Status::resource_exhausted(m),
        other => Status::internal(other.to_string()),
    }
}

/// Text the tokenizer could not encode, or ids it could not decode, are the caller's.
pub(super) fn tokenizer_status(e: TokenizerError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The status of work that `signal` stopped (a deadline, the client leaving, or the drain deadline
/// of a shutdown); other outcomes pass unchanged.
pub(super) fn stop_status<T>(
    closing: bool,
    signal: &StopSignal,
    outcome: Result<T, Status>,
) -> Result<T, Status> {
    match (outcome, signal.reason()) {
        (Err(status), Some(reason)) if status.code() == tonic::Code::Cancelled => {
            Err(match reason {
                _ if closing => closing_status(),
                StopReason::Deadline => {
                    Status::deadline_exceeded("the deadline passed before the work was done")
                }
                StopReason::Cancelled => Status::cancelled("the client went away"),
            })
        }
        (outcome, _) => outcome,
    }
}

pub(super) fn closing_status() -> Status {
    Status::unavailable("the sidecar is shutting down")
}
