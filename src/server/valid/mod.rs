//! The server's edge: every request, and every step of a stream, is checked once here against the
//! service's limits and the API's rules, before any work, into a typed value (`Valid*`) that the
//! handlers take as given. What only the index, the live index or the model can judge (ids in the
//! vocabulary, a namespace's room) the library checks, and `status` maps its typed errors.

mod decoding;
mod engine;
mod shard;

pub(super) use decoding::{
    DraftTarget, NeuralInput, ScoredDocument, ValidAddDocuments, ValidBatchPart, ValidMix,
    ValidMixAsk, ValidScore, ValidSequenceStart, ValidSessionRequest, ValidSessionStep,
};
pub(super) use engine::{
    ValidCount, ValidGenerate, ValidHints, ValidNtd, ValidSearch, ValidTrace, BYTES_PER_SHOWN_TOKEN,
};
pub(super) use shard::{
    ValidContinuations, ValidLiveAppend, ValidLiveContinuations, ValidScoreTokens, ValidShardSearch,
};

use std::time::{Duration, Instant};

use tonic::Request;

use super::config::Limits;
use crate::index::IndexError;
use crate::live::LiveError;

/// Why a request was refused at the edge; `status` maps each to its gRPC code.
#[derive(Debug, thiserror::Error)]
pub(super) enum Invalid {
    /// A part the API does not allow, or one past a limit.
    #[error("{0}")]
    Argument(String),
    /// A search's or trace's documents that could not be sent within the message limit.
    #[error("{0}")]
    AnswerTooLarge(String),
    /// A rule of the library's own (back-off settings, a traced sequence's length, a CNF's
    /// shape).
    #[error(transparent)]
    Index(#[from] IndexError),
    /// A live namespace's name.
    #[error(transparent)]
    Live(#[from] LiveError),
}

/// A request message as the edge checks it.
pub(super) trait Validate {
    type Valid;
    fn validate(self, limits: &Limits) -> Result<Self::Valid, Invalid>;
}

/// A request's deadline and its message, checked.
pub(super) fn accept<R: Validate>(
    request: Request<R>,
    limits: &Limits,
) -> Result<(Option<Instant>, R::Valid), Invalid> {
    let deadline = deadline_of(&request);
    Ok((deadline, request.into_inner().validate(limits)?))
}

/// When the caller's `grpc-timeout` runs out, if it sent one.
pub(super) fn deadline_of<T>(request: &Request<T>) -> Option<Instant> {
    let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    let timeout = match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Some(Instant::now() + timeout)
}

/// Refuses a `max_support` above the limit (0, exact, is always allowed).
fn max_support_within(limits: &Limits, max_support: u64) -> Result<Option<u64>, Invalid> {
    if max_support > limits.max_support {
        return Err(Invalid::Argument(format!(
            "max_support must be at most {}",
            limits.max_support
        )));
    }
    Ok((max_support > 0).then_some(max_support))
}

/// Refuses a request part longer than `max_context_tokens`.
pub(super) fn within_token_limit(limits: &Limits, what: &str, len: usize) -> Result<(), Invalid> {
    if len > limits.max_context_tokens {
        return Err(Invalid::Argument(format!(
            "{what} has {len} tokens, more than the limit of {}",
            limits.max_context_tokens
        )));
    }
    Ok(())
}

/// Bytes of text a token stands for at most on average, however the text is written: text longer
/// than the token limit times this is refused before it is tokenized (tokenizing megabytes to then
/// refuse the ids on their count would be the work the limit is there to stop).
const MAX_TEXT_BYTES_PER_TOKEN: usize = 16;

fn within_text_limit(limits: &Limits, what: &str, text: &str) -> Result<(), Invalid> {
    let most = limits
        .max_context_tokens
        .saturating_mul(MAX_TEXT_BYTES_PER_TOKEN);
    if text.len() > most {
        return Err(Invalid::Argument(format!(
            "{what} has {} bytes of text, more than the {most} that the limit of {} tokens allows",
            text.len(),
            limits.max_context_tokens
        )));
    }
    Ok(())
}

/// A `top_k` within 1..=`max_top_k`.
fn top_k_within(limits: &Limits, name: &str, top_k: u32) -> Result<usize, Invalid> {
    if top_k == 0 || top_k as usize > limits.max_top_k {
        return Err(Invalid::Argument(format!(
            "{name} must be in 1..={}",
            limits.max_top_k
        )));
    }
    Ok(top_k as usize)
}

/// A `maxnum` of documents: at most `max_top_k`.
fn maxnum_within(limits: &Limits, maxnum: usize) -> Result<usize, Invalid> {
    if maxnum > limits.max_top_k {
        return Err(Invalid::Argument(format!(
            "maxnum must be at most {}",
            limits.max_top_k
        )));
    }
    Ok(maxnum)
}

/// Refuses a search whose documents could not be sent within the message limit.
fn answer_size(limits: &Limits, maxnum: usize, max_disp_len: usize) -> Result<(), Invalid> {
    let worst_case = (maxnum as u64)
        .saturating_mul(max_disp_len as u64)
        .saturating_mul(BYTES_PER_SHOWN_TOKEN);
    if worst_case > limits.max_message_bytes as u64 {
        return Err(Invalid::AnswerTooLarge(format!(
            "maxnum × max_disp_len = {maxnum} × {max_disp_len} tokens could take {worst_case} bytes, more than the message limit of {}: ask for fewer or shorter documents",
            limits.max_message_bytes
        )));
    }
    Ok(())
}

/// A request's value, or `default` where it left the field 0 (unset).
fn or_default<T: PartialEq + Default>(value: T, default: T) -> T {
    if value == T::default() {
        default
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{pb, shard_pb as spb};

    fn limits() -> Limits {
        Limits {
            max_context_tokens: 8,
            max_top_k: 4,
            max_support: 100,
            ..Limits::default()
        }
    }

    /// The kind a refusal has, or "ok".
    fn kind<T>(checked: Result<T, Invalid>) -> &'static str {
        match checked {
            Ok(_) => "ok",
            Err(Invalid::Argument(_)) => "argument",
            Err(Invalid::AnswerTooLarge(_)) => "too large",
            Err(Invalid::Index(_)) => "index",
            Err(Invalid::Live(_)) => "live",
        }
    }

    #[test]
    fn each_limit_admits_its_value_and_refuses_one_past_it() {
        let l = limits();
        let count = |n: usize| pb::CountRequest {
            ids: vec![1; n],
            ..Default::default()
        };
        assert_eq!(kind(count(8).validate(&l)), "ok");
        assert_eq!(kind(count(9).validate(&l)), "argument");
        let ntd = |max_support: u64| pb::NextTokenDistributionRequest {
            prompt: vec![1],
            max_support,
            ..Default::default()
        };
        assert_eq!(kind(ntd(100).validate(&l)), "ok");
        assert_eq!(kind(ntd(101).validate(&l)), "argument");
        let mix = |top_k: u32| pb::MixRequest {
            context: vec![1],
            top_k,
            neural: Some(pb::mix_request::Neural::OwnModel(true)),
            ..Default::default()
        };
        assert_eq!(kind(mix(4).validate(&l)), "ok");
        assert_eq!(kind(mix(5).validate(&l)), "argument");
        assert_eq!(kind(mix(0).validate(&l)), "argument");
        let generate = |max_new_tokens: u32| pb::GenerateRequest {
            max_new_tokens,
            ..Default::default()
        };
        let most = engine::MAX_GENERATED_TOKENS;
        assert_eq!(kind(generate(most).validate(&l)), "ok");
        assert_eq!(kind(generate(most + 1).validate(&l)), "argument");
        let text_bytes = l.max_context_tokens * MAX_TEXT_BYTES_PER_TOKEN;
        let trace = |bytes: usize| pb::TraceRequest {
            text: "a".repeat(bytes),
            ..Default::default()
        };
        assert_eq!(kind(trace(text_bytes).validate(&l)), "ok");
        assert_eq!(kind(trace(text_bytes + 1).validate(&l)), "argument");
    }

    #[test]
    fn a_search_is_refused_before_work_its_answer_could_not_carry() {
        let l = Limits {
            max_message_bytes: 21 * 2 * 10,
            ..limits()
        };
        let search = |clauses: usize, maxnum: u32, max_disp_len: u32| pb::SearchDocumentsRequest {
            cnf: (0..clauses)
                .map(|_| pb::Clause {
                    ngrams: vec![pb::NGram { ids: vec![1] }],
                })
                .collect(),
            maxnum,
            max_disp_len,
            ..Default::default()
        };
        assert_eq!(kind(search(1, 2, 10).validate(&l)), "ok");
        assert_eq!(kind(search(1, 2, 11).validate(&l)), "too large");
        assert_eq!(kind(search(1, 5, 1).validate(&l)), "argument");
        assert_eq!(kind(search(0, 1, 1).validate(&l)), "index");
        // A router's search of a shard: the same limits on what it may send back.
        let shard = |maxnum: u32, max_disp_len: u32| spb::SearchRequest {
            cnf: vec![spb::Clause {
                ngrams: vec![spb::NGram { ids: vec![1] }],
            }],
            maxnum,
            max_disp_len,
            ..Default::default()
        };
        assert_eq!(kind(shard(2, 10).validate(&l)), "ok");
        assert_eq!(kind(shard(2, 11).validate(&l)), "too large");
    }

    #[test]
    fn requests_that_contradict_themselves_are_refused() {
        let l = limits();
        let both = pb::TraceRequest {
            ids: vec![1],
            text: "a".into(),
            ..Default::default()
        };
        assert_eq!(kind(both.validate(&l)), "argument");
        let own_model_without_context = pb::MixRequest {
            top_k: 1,
            neural: Some(pb::mix_request::Neural::OwnModel(true)),
            ..Default::default()
        };
        assert_eq!(kind(own_model_without_context.validate(&l)), "argument");
        let uneven_top_k = pb::MixRequest {
            context: vec![1],
            top_k: 1,
            neural: Some(pb::mix_request::Neural::TopKLogprobs(pb::NeuralTopK {
                tokens: vec![1, 2],
                logprobs: vec![-1.0],
                rest_mass: 0.5,
            })),
            ..Default::default()
        };
        assert_eq!(kind(uneven_top_k.validate(&l)), "argument");
        let session_with_namespace = pb::DraftRequest {
            target: Some(pb::draft_request::Target::SessionId(7)),
            namespace: "docs".into(),
            ..Default::default()
        };
        assert_eq!(kind(session_with_namespace.validate(&l)), "argument");
        assert_eq!(kind(pb::DraftRequest::default().validate(&l)), "argument");
        let learn_without_namespace = pb::SessionStart {
            learn: true,
            ..Default::default()
        };
        assert_eq!(kind(learn_without_namespace.validate(&l)), "argument");
        let drafts_without_support = spb::ContinuationsRequest {
            prompt: vec![1],
            infinite: true,
            depth: 4,
            ..Default::default()
        };
        assert_eq!(kind(drafts_without_support.validate(&l)), "argument");
        let descending = spb::ScoreTokensRequest {
            ids: vec![1],
            count_lengths: vec![3, 2],
            ..Default::default()
        };
        assert_eq!(kind(descending.validate(&l)), "argument");
    }

    #[test]
    fn live_documents_are_checked_before_and_after_tokenizing() {
        let l = limits();
        let add = |namespace: &str, documents: Vec<pb::LiveDocument>| pb::AddDocumentsRequest {
            namespace: namespace.into(),
            documents,
            ..Default::default()
        };
        let tokens = |n: usize| pb::LiveDocument {
            content: Some(pb::live_document::Content::Tokens(pb::TokenIds {
                ids: vec![1; n],
            })),
        };
        assert_eq!(kind(add("../up", vec![tokens(1)]).validate(&l)), "live");
        let empty = pb::LiveDocument { content: None };
        assert_eq!(kind(add("docs", vec![empty]).validate(&l)), "argument");
        assert_eq!(kind(add("docs", vec![tokens(9)]).validate(&l)), "argument");
        // Each document within the limit, together past it: refused once the tokens are known.
        let two = add("docs", vec![tokens(5), tokens(5)])
            .validate(&l)
            .unwrap();
        let tokenizer = crate::tokenizer::Tokenizer::utf8_bytes();
        assert_eq!(kind(two.tokenized(&tokenizer)), "argument");
        let one = add("docs", vec![tokens(8)]).validate(&l).unwrap();
        assert_eq!(
            one.tokenized(&tokenizer).unwrap().documents,
            vec![vec![1; 8]]
        );
    }
}
