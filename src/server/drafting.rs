//! `Draft`, `AddDocuments`, and the sequences of drafts and sessions, made with the live namespace
//! and reference text a request names. Sessions use this file; it knows nothing of sessions.

use std::sync::Arc;

use tonic::Status;

use super::valid::ValidAddDocuments;
use super::{index_status, live_status, pb, State};
use crate::decoding::{Extras, Sequence};
use crate::draft::{DraftOptions, DraftTree};

pub(super) fn response(tree: DraftTree) -> pb::DraftResponse {
    pb::DraftResponse {
        token_ids: tree.token_ids,
        parents: tree.parents,
        probs: tree.probs,
        score: tree.score,
        match_len: tree.match_len as u32,
    }
}

/// A sequence for `context` with the extras a request asked for (`live` is filled in here); what
/// the edge could not check (the reference's ids, whether this sidecar serves them) checked here.
pub(super) fn sequence(s: &State, context: Vec<u32>, extras: Extras) -> Result<Sequence, Status> {
    if s.evidence.over_bytes() && s.model.is_none() {
        return Err(Status::failed_precondition(
            "sessions and drafts over a byte-level index follow a model's tokens: set `model` in \
             the sidecar's config",
        ));
    }
    s.evidence
        .check_ids(&extras.reference)
        .map_err(index_status)?;
    let live = match extras.namespace.is_empty() {
        true => None,
        false => Some(s.live.clone().ok_or_else(|| {
            Status::failed_precondition("the live index is off in this sidecar's config ([live])")
        })?),
    };
    Sequence::new(Arc::clone(&s.evidence), context)
        .map_err(index_status)?
        .with_extras(Extras { live, ..extras })
        .map_err(live_status)
}

/// The unary `Draft` for a context matched afresh (an open session's is `session::draft`).
pub(super) fn draft_context(
    s: &State,
    context: Vec<u32>,
    extras: Extras,
    opts: &DraftOptions,
) -> Result<DraftTree, Status> {
    sequence(s, context, extras)?
        .draft(opts)
        .map_err(index_status)
}

/// `AddDocuments`: every document is tokenized and checked before any is added, and the live
/// index then adds them all or none.
pub(super) fn add_documents(
    s: &State,
    r: ValidAddDocuments,
) -> Result<pb::AddDocumentsResponse, Status> {
    let live = s.live.as_ref().ok_or_else(|| {
        Status::failed_precondition("the live index is off in this sidecar's config ([live])")
    })?;
    let r = r.tokenized(s.sequence_tokenizer())?;
    let docs = r.documents;
    for doc in &docs {
        s.evidence.check_ids(doc).map_err(index_status)?;
    }
    let appended = live
        .add_documents(&r.namespace, &docs, &r.request_id)
        .map_err(live_status)?;
    Ok(pb::AddDocumentsResponse {
        documents: docs.len() as u64,
        tokens: docs.iter().map(|d| d.len() as u64).sum(),
        repeated: appended == crate::live::Appended::Repeated,
    })
}
