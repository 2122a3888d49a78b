//! The engine's requests (`Count`, `NextTokenDistribution`, `SearchDocuments`, `Generate`, `Trace`,
//! `Hints`), checked: a sidecar and a router take the same values.

use super::{
    answer_size, max_support_within, maxnum_within, or_default, within_text_limit,
    within_token_limit, Invalid, Validate,
};
use crate::index::backoff::{Backoff, Draw, Weighting};
use crate::index::docs::{self, Cnf, SearchOptions};
use crate::index::hints::HintOptions;
use crate::index::trace::{self, TraceOptions};
use crate::server::config::Limits;
use crate::server::pb;
use crate::tokenizer::Tokenizer;

/// Bytes a shown document token may take in an answer: its id (a varint of up to 5 bytes) and its
/// text (a token of the supported tokenizers decodes to at most a few dozen bytes; 16 covers all
/// but rare long tokens, and the codec still refuses an answer over the limit).
pub(in crate::server) const BYTES_PER_SHOWN_TOKEN: u64 = 21;

pub(in crate::server) struct ValidCount {
    pub ids: Vec<u32>,
    pub allow_partial: bool,
}

impl Validate for pb::CountRequest {
    type Valid = ValidCount;
    fn validate(self, limits: &Limits) -> Result<ValidCount, Invalid> {
        within_token_limit(limits, "the n-gram", self.ids.len())?;
        Ok(ValidCount {
            ids: self.ids,
            allow_partial: self.allow_partial,
        })
    }
}

pub(in crate::server) struct ValidNtd {
    pub prompt: Vec<u32>,
    pub infinite: bool,
    /// `None`: exact.
    pub max_support: Option<u64>,
    pub allow_partial: bool,
}

impl Validate for pb::NextTokenDistributionRequest {
    type Valid = ValidNtd;
    fn validate(self, limits: &Limits) -> Result<ValidNtd, Invalid> {
        within_token_limit(limits, "the prompt", self.prompt.len())?;
        Ok(ValidNtd {
            max_support: max_support_within(limits, self.max_support)?,
            prompt: self.prompt,
            infinite: self.infinite,
            allow_partial: self.allow_partial,
        })
    }
}

/// A search's CNF and options: an answer that could not be sent is refused up front.
pub(in crate::server) struct ValidSearch {
    pub cnf: Cnf,
    pub opts: SearchOptions,
    pub allow_partial: bool,
}

impl Validate for pb::SearchDocumentsRequest {
    type Valid = ValidSearch;
    fn validate(self, limits: &Limits) -> Result<ValidSearch, Invalid> {
        let cnf: Cnf = (self.cnf.into_iter())
            .map(|c| c.ngrams.into_iter().map(|g| g.ids).collect())
            .collect();
        within_token_limit(limits, "the CNF", cnf.iter().flatten().map(Vec::len).sum())?;
        docs::check_cnf_shape(&cnf, limits.max_cnf_clauses)?;
        let defaults = SearchOptions::default();
        let opts = SearchOptions {
            maxnum: maxnum_within(limits, or_default(self.maxnum as usize, defaults.maxnum))?,
            max_disp_len: or_default(self.max_disp_len as usize, defaults.max_disp_len),
            max_clause_freq: or_default(self.max_clause_freq, defaults.max_clause_freq),
            max_clauses: limits.max_cnf_clauses,
            max_places: limits.max_search_places,
        };
        if opts.max_clause_freq > limits.max_clause_freq {
            return Err(Invalid::Argument(format!(
                "max_clause_freq must be at most {}",
                limits.max_clause_freq
            )));
        }
        answer_size(limits, opts.maxnum, opts.max_disp_len)?;
        Ok(ValidSearch {
            cnf,
            opts,
            allow_partial: self.allow_partial,
        })
    }
}

/// Tokens a `Generate` request may ask for. Each costs a search or two per level and a distribution
/// per level; the request's deadline stops a long one.
pub(super) const MAX_GENERATED_TOKENS: u32 = 8192;

/// A `Generate` request's prompt, back-off settings and draw.
pub(in crate::server) struct ValidGenerate {
    pub prompt: Vec<u32>,
    pub spec: Backoff,
    pub draw: Draw,
}

impl Validate for pb::GenerateRequest {
    type Valid = ValidGenerate;
    fn validate(self, limits: &Limits) -> Result<ValidGenerate, Invalid> {
        within_token_limit(limits, "the prompt", self.prompt.len())?;
        if self.max_new_tokens > MAX_GENERATED_TOKENS {
            return Err(Invalid::Argument(format!(
                "max_new_tokens must be at most {MAX_GENERATED_TOKENS}"
            )));
        }
        let defaults = Backoff::default();
        let spec = Backoff {
            levels: match self.levels {
                None => defaults.levels,
                Some(0) => None,
                Some(k) => Some(k as usize),
            },
            decay: or_default(self.decay, defaults.decay),
            weighting: match self.weigh_distributions {
                true => Weighting::Distributions,
                false => Weighting::Counts,
            },
            ..defaults
        };
        let draw = Draw {
            max_new: self.max_new_tokens as usize,
            temperature: self.temperature,
            seed: self.seed,
        };
        spec.check()?;
        draw.check()?;
        Ok(ValidGenerate {
            prompt: self.prompt,
            spec,
            draw,
        })
    }
}

/// What a `Trace` request traces: ids, or text still to tokenize (its size checked).
enum Traced {
    Ids(Vec<u32>),
    Text(String),
}

/// A `Trace` request, checked but for its text's tokens, which [`ValidTrace::ids`] checks once the
/// tokenizer that serves it has made them.
pub(in crate::server) struct ValidTrace {
    traced: Traced,
    pub opts: TraceOptions,
    limits: Limits,
}

impl Validate for pb::TraceRequest {
    type Valid = ValidTrace;
    fn validate(self, limits: &Limits) -> Result<ValidTrace, Invalid> {
        let traced = match (self.ids.is_empty(), self.text.is_empty()) {
            (false, false) => {
                return Err(Invalid::Argument(
                    "give the ids or the text to trace, not both".into(),
                ))
            }
            (true, false) => {
                within_text_limit(limits, "the traced text", &self.text)?;
                Traced::Text(self.text)
            }
            _ => {
                check_traced_len(limits, self.ids.len())?;
                Traced::Ids(self.ids)
            }
        };
        let defaults = TraceOptions::default();
        let opts = TraceOptions {
            min_len: or_default(self.min_len as usize, defaults.min_len),
            max_documents: maxnum_within(
                limits,
                or_default(self.maxnum as usize, defaults.max_documents),
            )?,
            max_disp_len: or_default(self.max_disp_len as usize, defaults.max_disp_len),
            max_shown_tokens: limits.max_message_bytes as u64 / BYTES_PER_SHOWN_TOKEN,
        };
        answer_size(limits, opts.max_documents, opts.max_disp_len)?;
        Ok(ValidTrace {
            traced,
            opts,
            limits: *limits,
        })
    }
}

impl ValidTrace {
    /// The traced ids: the request's, or its text in `tokenizer`'s tokens.
    pub(in crate::server) fn ids(self, tokenizer: &Tokenizer) -> Result<Vec<u32>, Invalid> {
        match self.traced {
            Traced::Ids(ids) => Ok(ids),
            Traced::Text(text) => {
                let ids = tokenizer
                    .encode(&text)
                    .map_err(|e| Invalid::Argument(format!("tokenizing the text: {e}")))?;
                check_traced_len(&self.limits, ids.len())?;
                Ok(ids)
            }
        }
    }
}

/// The traced sequence within the service's limit and the engine's.
fn check_traced_len(limits: &Limits, len: usize) -> Result<(), Invalid> {
    within_token_limit(limits, "the traced sequence", len)?;
    Ok(trace::check_len(len)?)
}

/// Most bytes an answer spends on a hinted position beyond its tokens: its suffix length, count
/// and excluded count (varints), the packed lists' tags and lengths, the message's own framing.
const BYTES_PER_HINT: usize = 48;
/// Most bytes a hinted token takes: a varint id, and with `exact` its varint count.
const BYTES_PER_HINT_TOKEN: usize = 5;
const BYTES_PER_HINT_COUNT: usize = 10;

/// A `Hints` batch whose answer fits in a message.
pub(in crate::server) struct ValidHints {
    pub sequences: Vec<Vec<u32>>,
    pub opts: HintOptions,
}

impl Validate for pb::HintsRequest {
    type Valid = ValidHints;
    fn validate(self, limits: &Limits) -> Result<ValidHints, Invalid> {
        let defaults = HintOptions::default();
        let opts = HintOptions {
            samples: or_default(self.samples as usize, defaults.samples),
            exact: self.exact,
            regularise: !self.keep_own_copies,
            min_plateau: or_default(self.min_plateau as usize, defaults.min_plateau),
            seed: self.seed,
        };
        let positions: usize = self.sequences.iter().map(|seq| seq.ids.len()).sum();
        within_token_limit(limits, "the sequences", positions)?;
        let per_token = BYTES_PER_HINT_TOKEN + if opts.exact { BYTES_PER_HINT_COUNT } else { 0 };
        let answer =
            positions.saturating_mul(opts.samples.saturating_mul(per_token) + BYTES_PER_HINT);
        if answer > limits.max_message_bytes {
            return Err(Invalid::Argument(format!(
                "{positions} positions with {} samples each would answer about {answer} bytes, more \
                 than the message limit of {}: send fewer sequences or ask for fewer samples",
                opts.samples, limits.max_message_bytes
            )));
        }
        Ok(ValidHints {
            sequences: self.sequences.into_iter().map(|s| s.ids).collect(),
            opts,
        })
    }
}
