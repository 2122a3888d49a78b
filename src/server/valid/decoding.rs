//! The decoding requests (`Mix`, `Draft`, `Score`, `AddDocuments`, and every step of `Session` and
//! `Batch` streams), checked: a step refused here has changed nothing.

use super::{top_k_within, within_text_limit, within_token_limit, Invalid, Validate};
use crate::decoding::Extras;
use crate::draft::{DraftOptions, DraftSource};
use crate::live::namespace::check_name;
use crate::mix::LambdaRule;
use crate::server::config::Limits;
use crate::server::pb;
use crate::tokenizer::Tokenizer;

/// Where a mixing step's neural distribution comes from.
pub(in crate::server) enum NeuralInput {
    /// Logits over the whole vocabulary.
    Logits(Vec<f32>),
    /// The top tokens' log-probs (equal in number) and the mass of the rest.
    TopK(pb::NeuralTopK),
    OwnModel,
}

/// The requests' oneofs, one generated type per message, mapped onto the shared choices.
macro_rules! neural_from {
    ($neural:ty) => {
        impl From<$neural> for NeuralInput {
            fn from(n: $neural) -> Self {
                use $neural as N;
                match n {
                    N::Logits(l) => Self::Logits(l.logits),
                    N::TopKLogprobs(t) => Self::TopK(t),
                    N::OwnModel(_) => Self::OwnModel,
                }
            }
        }
    };
}
neural_from!(pb::mix_request::Neural);
neural_from!(pb::session_mix::Neural);

/// The requests' oneofs, one generated type per message, mapped onto the library's rules ("split"
/// is the domain's λ1/λ2).
macro_rules! lambda_from {
    ($lambda:ty) => {
        impl From<$lambda> for LambdaRule {
            fn from(l: $lambda) -> Self {
                use $lambda as L;
                match l {
                    L::FixedLambda(v) => Self::Fixed(v),
                    L::Split(_) => Self::DomainSplit,
                    L::Gate(_) => Self::Gate,
                    L::Adaptive(_) => Self::Adaptive,
                }
            }
        }
    };
}
lambda_from!(pb::mix_request::Lambda);
lambda_from!(pb::session_mix::Lambda);
lambda_from!(pb::score_request::Lambda);

fn neural(neural: Option<NeuralInput>) -> Result<NeuralInput, Invalid> {
    match neural {
        Some(NeuralInput::TopK(t)) if t.tokens.len() != t.logprobs.len() => Err(Invalid::Argument(
            "top-k tokens and log-probs differ in length".into(),
        )),
        Some(n) => Ok(n),
        None => Err(Invalid::Argument(
            "the request needs logits, top-k log-probs or own_model".into(),
        )),
    }
}

/// What a mixing step asks, of a `Mix` call or a session.
pub(in crate::server) struct ValidMixAsk {
    pub top_k: usize,
    /// `None`: the mixing file's default rule.
    pub lambda: Option<LambdaRule>,
    /// The copy guard's longest match; 0: the mixing file's.
    pub max_match: u32,
    pub neural: NeuralInput,
}

impl ValidMixAsk {
    fn new(
        limits: &Limits,
        asked_top_k: u32,
        lambda: Option<LambdaRule>,
        max_match: u32,
        neural_input: Option<NeuralInput>,
    ) -> Result<Self, Invalid> {
        Ok(ValidMixAsk {
            top_k: top_k_within(limits, "top_k", asked_top_k)?,
            lambda,
            max_match,
            neural: neural(neural_input)?,
        })
    }
}

impl Validate for pb::SessionMix {
    type Valid = ValidMixAsk;
    fn validate(self, limits: &Limits) -> Result<ValidMixAsk, Invalid> {
        let lambda = self.lambda.map(Into::into);
        let neural = self.neural.map(Into::into);
        ValidMixAsk::new(limits, self.top_k, lambda, self.max_match, neural)
    }
}

const MAX_SEQUENCE_ID_BYTES: usize = 256;

/// A unary `Mix` call: its whole context, and the sequence it continues ("" for none).
pub(in crate::server) struct ValidMix {
    pub context: Vec<u32>,
    pub sequence_id: String,
    pub ask: ValidMixAsk,
}

impl Validate for pb::MixRequest {
    type Valid = ValidMix;
    fn validate(self, limits: &Limits) -> Result<ValidMix, Invalid> {
        within_token_limit(limits, "the context", self.context.len())?;
        if self.sequence_id.len() > MAX_SEQUENCE_ID_BYTES {
            return Err(Invalid::Argument(format!(
                "sequence_id has {} bytes, over {MAX_SEQUENCE_ID_BYTES}",
                self.sequence_id.len()
            )));
        }
        let lambda = self.lambda.map(Into::into);
        let neural = self.neural.map(Into::into);
        let ask = ValidMixAsk::new(limits, self.top_k, lambda, self.max_match, neural)?;
        if matches!(ask.neural, NeuralInput::OwnModel) && self.context.is_empty() {
            return Err(Invalid::Argument(
                "the own model needs a non-empty context".into(),
            ));
        }
        Ok(ValidMix {
            context: self.context,
            sequence_id: self.sequence_id,
            ask,
        })
    }
}

/// Longest draft path and largest tree a request may ask for.
pub(super) const MAX_DRAFT_TOKENS: u32 = 64;
const MAX_TREE_BUDGET: u32 = 1024;

impl Validate for pb::DraftOptions {
    type Valid = DraftOptions;
    fn validate(self, _limits: &Limits) -> Result<DraftOptions, Invalid> {
        let defaults = DraftOptions::default();
        if self.max_tokens > MAX_DRAFT_TOKENS || self.tree_budget > MAX_TREE_BUDGET {
            return Err(Invalid::Argument(format!(
                "max_tokens must be at most {MAX_DRAFT_TOKENS} and tree_budget at most {MAX_TREE_BUDGET}"
            )));
        }
        let source = match pb::DraftSource::try_from(self.source) {
            Ok(pb::DraftSource::All) => DraftSource::All,
            Ok(pb::DraftSource::Index) => DraftSource::Index,
            Ok(pb::DraftSource::Prompt) => DraftSource::Prompt,
            Ok(pb::DraftSource::Live) => DraftSource::Live,
            Ok(pb::DraftSource::Reference) => DraftSource::Reference,
            Err(_) => return Err(Invalid::Argument(format!("unknown source {}", self.source))),
        };
        let options = DraftOptions {
            max_tokens: match self.max_tokens {
                0 => defaults.max_tokens,
                n => n as usize,
            },
            tree_budget: self.tree_budget as usize,
            tree: self.tree_budget > 0,
            min_token_prob: self.min_token_prob.unwrap_or(defaults.min_token_prob),
            min_path_prob: self.min_path_prob.unwrap_or(defaults.min_path_prob),
            match_len_factor: self.match_len_factor.unwrap_or(defaults.match_len_factor),
            source,
            ..defaults
        };
        options.check().map_err(Invalid::Argument)?;
        Ok(options)
    }
}

/// A new sequence: its context and extras (a live namespace to draft from and learn into, a
/// reference text), and whether it keeps the own model's KV cache.
pub(in crate::server) struct ValidSequenceStart {
    pub context: Vec<u32>,
    pub use_model: bool,
    /// Without a live index yet: the sidecar's is filled in where the sequence is made.
    pub extras: Extras,
}

fn extras(
    limits: &Limits,
    namespace: String,
    learn: bool,
    reference: Vec<u32>,
) -> Result<Extras, Invalid> {
    within_token_limit(limits, "the reference", reference.len())?;
    if learn && namespace.is_empty() {
        return Err(Invalid::Argument("learn needs a namespace".into()));
    }
    Ok(Extras {
        live: None,
        namespace,
        learn,
        reference,
    })
}

impl Validate for pb::SessionStart {
    type Valid = ValidSequenceStart;
    fn validate(self, limits: &Limits) -> Result<ValidSequenceStart, Invalid> {
        within_token_limit(limits, "the context", self.context.len())?;
        Ok(ValidSequenceStart {
            context: self.context,
            use_model: self.use_model,
            extras: extras(limits, self.namespace, self.learn, self.reference)?,
        })
    }
}

/// What a unary `Draft` continues.
pub(in crate::server) enum DraftTarget {
    /// An open session, with the namespace and reference it was started with.
    Session(u64),
    /// A context matched afresh.
    Context { ids: Vec<u32>, extras: Extras },
}

pub(in crate::server) struct ValidDraft {
    pub target: DraftTarget,
    pub options: DraftOptions,
}

impl Validate for pb::DraftRequest {
    type Valid = ValidDraft;
    fn validate(self, limits: &Limits) -> Result<ValidDraft, Invalid> {
        let options = self.options.unwrap_or_default().validate(limits)?;
        let target = match self.target {
            Some(pb::draft_request::Target::SessionId(_))
                if !self.namespace.is_empty() || !self.reference.is_empty() =>
            {
                return Err(Invalid::Argument(
                    "a session drafts from the namespace and reference text it was started with"
                        .into(),
                ))
            }
            Some(pb::draft_request::Target::SessionId(id)) => DraftTarget::Session(id),
            Some(pb::draft_request::Target::Context(c)) => {
                within_token_limit(limits, "the context", c.ids.len())?;
                DraftTarget::Context {
                    ids: c.ids,
                    extras: extras(limits, self.namespace, false, self.reference)?,
                }
            }
            None => return Err(Invalid::Argument("name a session_id or a context".into())),
        };
        Ok(ValidDraft { target, options })
    }
}

/// A message of a `Session` stream: the session's start, or a step after it.
pub(in crate::server) enum ValidSessionRequest {
    Start(ValidSequenceStart),
    Step(ValidSessionStep),
}

/// A step of a session after its start.
pub(in crate::server) enum ValidSessionStep {
    Append(Vec<u32>),
    /// Keep the first this many tokens.
    Truncate(u64),
    Mix(ValidMixAsk),
    Draft(DraftOptions),
}

impl Validate for pb::session_request::Step {
    type Valid = ValidSessionRequest;
    fn validate(self, limits: &Limits) -> Result<ValidSessionRequest, Invalid> {
        use pb::session_request::Step;
        Ok(ValidSessionRequest::Step(match self {
            Step::Start(s) => return Ok(ValidSessionRequest::Start(s.validate(limits)?)),
            // Its length with the session's is checked where the session is.
            Step::Append(a) => ValidSessionStep::Append(a.tokens),
            Step::Truncate(t) => ValidSessionStep::Truncate(t.length),
            Step::Mix(m) => ValidSessionStep::Mix(m.validate(limits)?),
            Step::Draft(o) => ValidSessionStep::Draft(o.validate(limits)?),
        }))
    }
}

/// One sequence's part of a `Batch` step, run in this order: start, keep, append, mix, draft.
pub(in crate::server) struct ValidBatchPart {
    pub start: Option<ValidSequenceStart>,
    pub keep: Option<u64>,
    pub append: Vec<u32>,
    pub mix: Option<ValidMixAsk>,
    pub draft: Option<DraftOptions>,
}

impl Validate for pb::SequenceStep {
    type Valid = ValidBatchPart;
    fn validate(self, limits: &Limits) -> Result<ValidBatchPart, Invalid> {
        Ok(ValidBatchPart {
            start: self.start.map(|s| s.validate(limits)).transpose()?,
            keep: self.keep,
            append: self.append,
            mix: self.mix.map(|m| m.validate(limits)).transpose()?,
            draft: self.draft.map(|d| d.validate(limits)).transpose()?,
        })
    }
}

/// A document to score, and the domain its λ1/λ2 are read for ("" for none).
pub(in crate::server) struct ScoredDocument {
    pub tokens: Vec<u32>,
    pub domain: String,
}

pub(in crate::server) struct ValidScore {
    pub documents: Vec<ScoredDocument>,
    pub lambda: Option<LambdaRule>,
    pub per_token: bool,
}

impl Validate for pb::ScoreRequest {
    type Valid = ValidScore;
    fn validate(self, limits: &Limits) -> Result<ValidScore, Invalid> {
        let documents = (self.documents.into_iter().enumerate())
            .map(|(i, d)| {
                if d.token_ids.is_empty() {
                    return Err(Invalid::Argument(format!("document {i} is empty")));
                }
                within_token_limit(limits, &format!("document {i}"), d.token_ids.len())?;
                Ok(ScoredDocument {
                    tokens: d.token_ids,
                    domain: d.domain,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(ValidScore {
            documents,
            lambda: self.lambda.map(Into::into),
            per_token: self.per_token,
        })
    }
}

/// A document for the live index: tokens, or text still to tokenize (its size checked).
enum LiveContent {
    Tokens(Vec<u32>),
    Text(String),
}

/// An `AddDocuments` call, checked but for its texts' tokens, which
/// [`ValidAddDocuments::tokenized`] checks once the sequences' tokenizer has made them.
pub(in crate::server) struct ValidAddDocuments {
    namespace: String,
    request_id: String,
    documents: Vec<LiveContent>,
    limits: Limits,
}

/// An `AddDocuments` call with every document in tokens, each and all within the limits.
pub(in crate::server) struct LiveDocuments {
    pub namespace: String,
    pub request_id: String,
    pub documents: Vec<Vec<u32>>,
}

impl Validate for pb::AddDocumentsRequest {
    type Valid = ValidAddDocuments;
    fn validate(self, limits: &Limits) -> Result<ValidAddDocuments, Invalid> {
        check_name(&self.namespace)?;
        let documents = (self.documents.into_iter())
            .map(|doc| match doc.content {
                Some(pb::live_document::Content::Tokens(t)) => {
                    within_token_limit(limits, "a document", t.ids.len())?;
                    Ok(LiveContent::Tokens(t.ids))
                }
                Some(pb::live_document::Content::Text(t)) => {
                    within_text_limit(limits, "a document", &t)?;
                    Ok(LiveContent::Text(t))
                }
                None => Err(Invalid::Argument("a document with no content".into())),
            })
            .collect::<Result<_, _>>()?;
        Ok(ValidAddDocuments {
            namespace: self.namespace,
            request_id: self.request_id,
            documents,
            limits: *limits,
        })
    }
}

impl ValidAddDocuments {
    /// Every document's tokens (texts in `tokenizer`'s), within the limits each and together.
    pub(in crate::server) fn tokenized(
        self,
        tokenizer: &Tokenizer,
    ) -> Result<LiveDocuments, Invalid> {
        let docs = (self.documents.into_iter())
            .map(|doc| match doc {
                LiveContent::Tokens(ids) => Ok(ids),
                LiveContent::Text(text) => {
                    let ids = tokenizer
                        .encode(&text)
                        .map_err(|e| Invalid::Argument(e.to_string()))?;
                    within_token_limit(&self.limits, "a document", ids.len())?;
                    Ok(ids)
                }
            })
            .collect::<Result<Vec<_>, Invalid>>()?;
        let together = docs.iter().map(Vec::len).sum();
        within_token_limit(&self.limits, "the request's documents together", together)?;
        Ok(LiveDocuments {
            namespace: self.namespace,
            request_id: self.request_id,
            documents: docs,
        })
    }
}
