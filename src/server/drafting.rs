//! `Draft` and the drafting step of sessions: request options checked and mapped onto the drafter's,
//! and sequences made with the live namespace and reference text a request names. Sessions use this
//! file; it knows nothing of sessions.

use std::sync::Arc;

use tonic::Status;

use super::{index_status, live_status, pb, State};
use crate::decoding::{Extras, Sequence};
use crate::draft::{DraftOptions, DraftSource, DraftTree};

/// Longest draft path and largest tree a request may ask for.
pub(super) const MAX_DRAFT_TOKENS: u32 = 64;
const MAX_TREE_BUDGET: u32 = 1024;

pub(super) fn options(o: Option<pb::DraftOptions>) -> Result<DraftOptions, Status> {
    let o = o.unwrap_or_default();
    let defaults = DraftOptions::default();
    if o.max_tokens > MAX_DRAFT_TOKENS || o.tree_budget > MAX_TREE_BUDGET {
        return Err(Status::invalid_argument(format!(
            "max_tokens must be at most {MAX_DRAFT_TOKENS} and tree_budget at most {MAX_TREE_BUDGET}"
        )));
    }
    let source = match pb::DraftSource::try_from(o.source) {
        Ok(pb::DraftSource::All) => DraftSource::All,
        Ok(pb::DraftSource::Index) => DraftSource::Index,
        Ok(pb::DraftSource::Prompt) => DraftSource::Prompt,
        Ok(pb::DraftSource::Live) => DraftSource::Live,
        Ok(pb::DraftSource::Reference) => DraftSource::Reference,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "unknown source {}",
                o.source
            )))
        }
    };
    let options = DraftOptions {
        max_tokens: if o.max_tokens == 0 {
            defaults.max_tokens
        } else {
            o.max_tokens as usize
        },
        tree_budget: o.tree_budget as usize,
        tree: o.tree_budget > 0,
        min_token_prob: o.min_token_prob.unwrap_or(defaults.min_token_prob),
        min_path_prob: o.min_path_prob.unwrap_or(defaults.min_path_prob),
        match_len_factor: o.match_len_factor.unwrap_or(defaults.match_len_factor),
        source,
        ..defaults
    };
    options.check().map_err(Status::invalid_argument)?;
    Ok(options)
}

pub(super) fn response(tree: DraftTree) -> pb::DraftResponse {
    pb::DraftResponse {
        token_ids: tree.token_ids,
        parents: tree.parents,
        probs: tree.probs,
        score: tree.score,
        match_len: tree.match_len as u32,
    }
}

/// A sequence for `context` with the extras a request asked for (`live` is filled in here), each
/// checked.
pub(super) fn sequence(s: &State, context: Vec<u32>, extras: Extras) -> Result<Sequence, Status> {
    if s.evidence.over_bytes() && s.model.is_none() {
        return Err(Status::failed_precondition(
            "sessions and drafts over a byte-level index follow a model's tokens: set `model` in \
             the sidecar's config",
        ));
    }
    s.check_len("the context", context.len())?;
    s.check_len("the reference", extras.reference.len())?;
    s.evidence
        .check_ids(&extras.reference)
        .map_err(index_status)?;
    if extras.learn && extras.namespace.is_empty() {
        return Err(Status::invalid_argument("learn needs a namespace"));
    }
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

/// `AddDocuments`: every document is checked (or tokenized) before any is added, and the live
/// index then adds them all or none.
pub(super) fn add_documents(
    s: &State,
    r: pb::AddDocumentsRequest,
) -> Result<pb::AddDocumentsResponse, Status> {
    let live = s.live.as_ref().ok_or_else(|| {
        Status::failed_precondition("the live index is off in this sidecar's config ([live])")
    })?;
    crate::live::namespace::check_name(&r.namespace).map_err(live_status)?;
    let mut docs = Vec::with_capacity(r.documents.len());
    for doc in r.documents {
        let tokens = match doc.content {
            Some(pb::live_document::Content::Tokens(t)) => t.ids,
            Some(pb::live_document::Content::Text(text)) => {
                s.check_text("a document", &text)?;
                s.sequence_tokenizer()
                    .encode(&text)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?
            }
            None => return Err(Status::invalid_argument("a document with no content")),
        };
        s.check_len("a document", tokens.len())?;
        s.evidence.check_ids(&tokens).map_err(index_status)?;
        docs.push(tokens);
    }
    s.check_len(
        "the request's documents together",
        docs.iter().map(Vec::len).sum(),
    )?;
    let appended = live
        .add_documents(&r.namespace, &docs, &r.request_id)
        .map_err(live_status)?;
    Ok(pb::AddDocumentsResponse {
        documents: docs.len() as u64,
        tokens: docs.iter().map(|d| d.len() as u64).sum(),
        repeated: appended == crate::live::Appended::Repeated,
    })
}
