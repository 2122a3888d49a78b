//! `Draft` and the drafting step of sessions: request options checked and mapped onto the drafter's.
//! Sessions use this file; it knows nothing of sessions.

use tonic::Status;

use super::{index_status, pb, State};
use crate::draft::{DraftOptions, DraftSource, DraftTree, Sequence};

/// Longest draft path and largest tree a request may ask for.
const MAX_DRAFT_TOKENS: u32 = 64;
const MAX_TREE_BUDGET: u32 = 1024;

pub(super) fn options(o: Option<pb::DraftOptions>) -> Result<DraftOptions, Status> {
    let o = o.unwrap_or_default();
    let defaults = DraftOptions::default();
    if o.max_tokens > MAX_DRAFT_TOKENS || o.tree_budget > MAX_TREE_BUDGET {
        return Err(Status::invalid_argument(format!(
            "max_tokens must be at most {MAX_DRAFT_TOKENS} and tree_budget at most {MAX_TREE_BUDGET}"
        )));
    }
    let min_token_prob = o.min_token_prob.unwrap_or(defaults.min_token_prob);
    let min_path_prob = o.min_path_prob.unwrap_or(defaults.min_path_prob);
    let match_len_factor = o.match_len_factor.unwrap_or(defaults.match_len_factor);
    let probability = 0.0..=1.0;
    if !probability.contains(&min_token_prob)
        || !probability.contains(&min_path_prob)
        || !(0.0..=f64::MAX).contains(&match_len_factor)
    {
        return Err(Status::invalid_argument(
            "min_token_prob and min_path_prob must be in [0, 1] and match_len_factor at least 0",
        ));
    }
    let source = match pb::DraftSource::try_from(o.source) {
        Ok(pb::DraftSource::Both) => DraftSource::Both,
        Ok(pb::DraftSource::Index) => DraftSource::Index,
        Ok(pb::DraftSource::Prompt) => DraftSource::Prompt,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "unknown source {}",
                o.source
            )))
        }
    };
    Ok(DraftOptions {
        max_tokens: if o.max_tokens == 0 {
            defaults.max_tokens
        } else {
            o.max_tokens as usize
        },
        tree_budget: o.tree_budget as usize,
        tree: o.tree_budget > 0,
        min_token_prob,
        min_path_prob,
        match_len_factor,
        source,
        ..defaults
    })
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

/// The unary `Draft` for a context matched afresh (an open session's is `session::draft`).
pub(super) fn draft_context(
    s: &State,
    context: Vec<u32>,
    opts: &DraftOptions,
) -> Result<DraftTree, Status> {
    s.check_len("the context", context.len())?;
    Ok(Sequence::new(&s.index, context)
        .map_err(index_status)?
        .draft(&s.index, opts))
}
