//! The engine's RPCs: tokenizer, counts, next-token distributions, document search, the ∞-gram's
//! own generation (selective back-off) and maximal matching spans.

use std::collections::BTreeMap;

use rayon::prelude::*;
use tonic::Status;

use super::checks::check_text;
use super::config::Limits;
use super::{check_len, check_max_support, index_status, pb, State};
use crate::index::backoff::{Backoff, BackoffGeneration, Draw, Weighting};
use crate::index::docs::{Cnf, Document, SearchOptions, SearchResult};
use crate::index::hints::HintOptions;
use crate::index::trace::{self, TraceOptions};
use crate::mix::MixingParams;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

pub(super) fn info(s: &State) -> Result<pb::InfoResponse, Status> {
    let corpus = s.corpus()?;
    Ok(pb::InfoResponse {
        version: env!("CARGO_PKG_VERSION").into(),
        index_dir: corpus.dir().display().to_string(),
        index_shards: corpus.num_parts() as u32,
        index_tokens: corpus.total_tokens(),
        index_documents: corpus.total_documents(),
        vocab_size: corpus.vocab_size(),
        eos_token_id: corpus.eos_token_id(),
        tokenizer_fingerprint: s.tokenizer.fingerprint().to_string(),
        cpu_model: s.cpu.model.clone(),
        cpu_features: s.cpu.features.iter().map(|f| f.to_string()).collect(),
        live: s.live.as_ref().and_then(|l| l.stats()).map(live_info),
        ..neural_info(s.mixing.as_ref(), s.model.as_ref())
    })
}

fn live_info(s: crate::live::LiveStats) -> pb::LiveInfo {
    pb::LiveInfo {
        namespaces: s.namespaces as u64,
        runs: s.runs as u64,
        tokens: s.tokens,
        tail_tokens: s.tail_tokens,
        evicted_runs: s.evicted_runs,
        failed_writes: s.failed_writes,
        runs_set_aside: s.runs_set_aside,
        namespaces_reclaimed: s.namespaces_reclaimed,
        write_failure: s.write_failure.unwrap_or_default(),
    }
}

/// What `Info` says of a mixing file and a model (the other fields left empty).
pub(super) fn neural_info(
    mixing: Option<&MixingParams>,
    model: Option<&Model>,
) -> pb::InfoResponse {
    let (lambda_sparse, lambda_dense, gate) = match mixing {
        Some(m) => (m.lambda_sparse, m.lambda_dense, m.gate.is_some()),
        None => (0.0, 0.0, false),
    };
    pb::InfoResponse {
        model: model
            .map(|m| m.source().display().to_string())
            .unwrap_or_default(),
        lambda_sparse,
        lambda_dense,
        gate,
        kernel_flavour: model
            .map(|m| m.kernel_name().to_string())
            .unwrap_or_default(),
        default_rule: mixing
            .map(|m| m.default_rule.name().to_string())
            .unwrap_or_default(),
        ..Default::default()
    }
}

pub(super) fn tokenize(s: &State, r: pb::TokenizeRequest) -> Result<pb::TokenizeResponse, Status> {
    let text = r.text;
    let ids = s
        .tokenizer
        .encode(&text)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(pb::TokenizeResponse { ids })
}

pub(super) fn detokenize(
    s: &State,
    r: pb::DetokenizeRequest,
) -> Result<pb::DetokenizeResponse, Status> {
    let ids = r.ids;
    s.corpus()?.check_ids(&ids).map_err(index_status)?;
    let text = s
        .tokenizer
        .decode(&ids)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(pb::DetokenizeResponse { text })
}

pub(super) fn count(s: &State, r: pb::CountRequest) -> Result<pb::CountResponse, Status> {
    let ids = r.ids;
    s.check_len("the n-gram", ids.len())?;
    let count = s.corpus()?.count(&ids).map_err(index_status)?;
    Ok(pb::CountResponse {
        count,
        partial: None,
    })
}

pub(super) fn next_token_distribution(
    s: &State,
    r: pb::NextTokenDistributionRequest,
) -> Result<pb::NextTokenDistributionResponse, Status> {
    s.check_len("the prompt", r.prompt.len())?;
    check_max_support(&s.limits, r.max_support)?;
    let max_support = (r.max_support > 0).then_some(r.max_support);
    let (ntd, suffix_len, sparse) = match r.infinite {
        true => {
            let a = s
                .corpus()?
                .infgram_ntd(&r.prompt, max_support)
                .map_err(index_status)?;
            (a.ntd, a.suffix_len, a.sparse)
        }
        false => {
            let a = s
                .corpus()?
                .ntd(&r.prompt, max_support)
                .map_err(index_status)?;
            let sparse = a.dist.len() == 1;
            (a, r.prompt.len(), sparse)
        }
    };
    Ok(pb::NextTokenDistributionResponse {
        prompt_cnt: ntd.prompt_cnt,
        dist: token_probs(&ntd.dist),
        approx: ntd.approx,
        suffix_len: suffix_len as u32,
        sparse,
        partial: None,
    })
}

/// Bytes a shown document token may take in a `SearchDocuments` answer: its id (a varint of up to
/// 5 bytes) and its text (a token of the supported tokenizers decodes to at most a few dozen bytes;
/// 16 covers all but rare long tokens, and the codec still refuses an answer over the limit).
const BYTES_PER_SHOWN_TOKEN: u64 = 21;

pub(super) fn search_documents(
    s: &State,
    r: pb::SearchDocumentsRequest,
) -> Result<pb::SearchDocumentsResponse, Status> {
    let (cnf, opts) = search_request(&s.limits, r)?;
    let found = s
        .corpus()?
        .search_docs_cnf(&cnf, opts)
        .map_err(index_status)?;
    Ok(search_response(found, None))
}

/// A search's CNF and options, checked against the limits before any work: an answer that could
/// not be sent is refused up front.
pub(super) fn search_request(
    limits: &Limits,
    r: pb::SearchDocumentsRequest,
) -> Result<(Cnf, SearchOptions), Status> {
    let cnf: Cnf = r
        .cnf
        .into_iter()
        .map(|c| c.ngrams.into_iter().map(|g| g.ids).collect())
        .collect();
    let tokens: usize = cnf.iter().flatten().map(Vec::len).sum();
    check_len(limits, "the CNF", tokens)?;
    let defaults = SearchOptions::default();
    let or_default = |v: u64, d: u64| if v == 0 { d } else { v };
    let maxnum = or_default(r.maxnum.into(), defaults.maxnum as u64) as usize;
    if maxnum > limits.max_top_k {
        return Err(Status::invalid_argument(format!(
            "maxnum must be at most {}",
            limits.max_top_k
        )));
    }
    let opts = SearchOptions {
        maxnum,
        max_disp_len: or_default(r.max_disp_len.into(), defaults.max_disp_len as u64) as usize,
        max_clause_freq: or_default(r.max_clause_freq, defaults.max_clause_freq),
        max_clauses: limits.max_cnf_clauses,
        max_places: limits.max_search_places,
    };
    if opts.max_clause_freq > limits.max_clause_freq {
        return Err(Status::invalid_argument(format!(
            "max_clause_freq must be at most {}",
            limits.max_clause_freq
        )));
    }
    check_answer_size(limits, opts.maxnum, opts.max_disp_len)?;
    Ok((cnf, opts))
}

/// Refuses a search whose documents could not be sent within the message limit.
pub(super) fn check_answer_size(
    limits: &Limits,
    maxnum: usize,
    max_disp_len: usize,
) -> Result<(), Status> {
    let worst_case = (maxnum as u64)
        .saturating_mul(max_disp_len as u64)
        .saturating_mul(BYTES_PER_SHOWN_TOKEN);
    if worst_case > limits.max_message_bytes as u64 {
        return Err(Status::resource_exhausted(format!(
            "maxnum × max_disp_len = {maxnum} × {max_disp_len} tokens could take {worst_case} bytes, more than the message limit of {}: ask for fewer or shorter documents",
            limits.max_message_bytes
        )));
    }
    Ok(())
}

pub(super) fn search_response(
    found: SearchResult,
    partial: Option<pb::Partial>,
) -> pb::SearchDocumentsResponse {
    pb::SearchDocumentsResponse {
        cnt: found.cnt,
        doc_cnt: found.doc_cnt,
        approx: found.approx,
        documents: found.documents.into_iter().map(document).collect(),
        partial,
    }
}

/// A document as the wire carries it (both protocols: a shard's have no text).
pub(super) fn document(d: Document) -> pb::Document {
    pb::Document {
        doc_ix: d.doc_ix,
        doc_len: d.doc_len,
        disp_len: d.disp_len,
        needle_offset: d.needle_offset,
        metadata: d.metadata.unwrap_or_default(),
        token_ids: d.token_ids,
        text: d.text.unwrap_or_default(),
    }
}

pub(super) fn token_probs(dist: &BTreeMap<u32, u64>) -> Vec<pb::TokenProb> {
    let total: u64 = dist.values().sum();
    dist.iter()
        .map(|(&token, &c)| pb::TokenProb {
            token,
            prob: if total == 0 {
                0.0
            } else {
                c as f64 / total as f64
            },
            cont_cnt: c,
        })
        .collect()
}

/// Tokens a `Generate` request may ask for. Each costs a search or two per level and a distribution
/// per level; the request's deadline stops a long one.
const MAX_GENERATED_TOKENS: u32 = 8192;

/// A `Generate` request's prompt, back-off settings and draw, checked.
pub(super) fn generate_request(
    limits: &Limits,
    r: pb::GenerateRequest,
) -> Result<(Vec<u32>, Backoff, Draw), Status> {
    check_len(limits, "the prompt", r.prompt.len())?;
    if r.max_new_tokens > MAX_GENERATED_TOKENS {
        return Err(Status::invalid_argument(format!(
            "max_new_tokens must be at most {MAX_GENERATED_TOKENS}"
        )));
    }
    let defaults = Backoff::default();
    let spec = Backoff {
        levels: match r.levels {
            None => defaults.levels,
            Some(0) => None,
            Some(k) => Some(k as usize),
        },
        decay: if r.decay == 0.0 {
            defaults.decay
        } else {
            r.decay
        },
        weighting: if r.weigh_distributions {
            Weighting::Distributions
        } else {
            Weighting::Counts
        },
        ..defaults
    };
    let draw = Draw {
        max_new: r.max_new_tokens as usize,
        temperature: r.temperature,
        seed: r.seed,
    };
    spec.check()
        .and_then(|_| draw.check())
        .map_err(index_status)?;
    Ok((r.prompt, spec, draw))
}

/// What back-off generation made, as `Generate` answers it.
pub(super) fn generate_response(
    tokenizer: &Tokenizer,
    made: BackoffGeneration,
) -> pb::GenerateResponse {
    pb::GenerateResponse {
        text: tokenizer.decode(&made.tokens).unwrap_or_default(),
        steps: made
            .levels
            .iter()
            .map(|levels| pb::GenerateStep {
                levels: levels
                    .iter()
                    .map(|&(suffix_len, count)| pb::BackoffLevel {
                        suffix_len: suffix_len as u32,
                        count,
                    })
                    .collect(),
            })
            .collect(),
        tokens: made.tokens,
    }
}

pub(super) fn generate(s: &State, r: pb::GenerateRequest) -> Result<pb::GenerateResponse, Status> {
    let (prompt, spec, draw) = generate_request(&s.limits, r)?;
    let made = (s.corpus()?)
        .backoff_generate(&prompt, &spec, draw)
        .map_err(index_status)?;
    Ok(generate_response(&s.tokenizer, made))
}

pub(super) fn trace(s: &State, r: pb::TraceRequest) -> Result<pb::TraceResponse, Status> {
    let (ids, opts) = trace_request(&s.limits, &s.tokenizer, r)?;
    let spans = s.corpus()?.trace(&ids, opts).map_err(index_status)?;
    let spans = spans
        .into_iter()
        .map(|span| {
            let documents = span.documents.into_iter().map(document).collect();
            trace_span(
                &s.tokenizer,
                &ids,
                (span.start, span.end, span.count),
                documents,
            )
        })
        .collect();
    Ok(pb::TraceResponse { spans, ids })
}

/// A `Trace` request's ids (its text in `tokenizer`'s tokens) and options, checked against the
/// limits before any work.
pub(super) fn trace_request(
    limits: &Limits,
    tokenizer: &Tokenizer,
    r: pb::TraceRequest,
) -> Result<(Vec<u32>, TraceOptions), Status> {
    let ids = match (r.ids.is_empty(), r.text.is_empty()) {
        (false, false) => {
            return Err(Status::invalid_argument(
                "give the ids or the text to trace, not both",
            ))
        }
        (true, false) => {
            check_text(limits, "the traced text", &r.text)?;
            tokenizer
                .encode(&r.text)
                .map_err(|e| Status::invalid_argument(format!("tokenizing the text: {e}")))?
        }
        _ => r.ids,
    };
    check_len(limits, "the traced sequence", ids.len())?;
    trace::check_len(ids.len()).map_err(index_status)?;
    let defaults = TraceOptions::default();
    let or_default = |v: u32, d: usize| if v == 0 { d } else { v as usize };
    let opts = TraceOptions {
        min_len: or_default(r.min_len, defaults.min_len),
        max_documents: or_default(r.maxnum, defaults.max_documents),
        max_disp_len: or_default(r.max_disp_len, defaults.max_disp_len),
        max_shown_tokens: limits.max_message_bytes as u64 / BYTES_PER_SHOWN_TOKEN,
    };
    if opts.max_documents > limits.max_top_k {
        return Err(Status::invalid_argument(format!(
            "maxnum must be at most {}",
            limits.max_top_k
        )));
    }
    check_answer_size(limits, opts.max_documents, opts.max_disp_len)?;
    Ok((ids, opts))
}

/// One span `(start, end, count)` of `ids` in an answer, with its text and documents.
pub(super) fn trace_span(
    tokenizer: &Tokenizer,
    ids: &[u32],
    (start, end, count): (usize, usize, u64),
    documents: Vec<pb::Document>,
) -> pb::TraceSpan {
    pb::TraceSpan {
        start: start as u32,
        end: end as u32,
        count,
        text: tokenizer.decode(&ids[start..end]).unwrap_or_default(),
        documents,
    }
}

/// Most bytes an answer spends on a hinted position beyond its tokens: its suffix length, count
/// and excluded count (varints), the packed lists' tags and lengths, the message's own framing.
const BYTES_PER_HINT: usize = 48;
/// Most bytes a hinted token takes: a varint id, and with `exact` its varint count.
const BYTES_PER_HINT_TOKEN: usize = 5;
const BYTES_PER_HINT_COUNT: usize = 10;

/// `Hints`: every sequence hinted in parallel, after checking the batch and its answer fit.
pub(super) fn hints(s: &State, r: pb::HintsRequest) -> Result<pb::HintsResponse, Status> {
    let defaults = HintOptions::default();
    let or_default = |v: u32, d: usize| if v == 0 { d } else { v as usize };
    let opts = HintOptions {
        samples: or_default(r.samples, defaults.samples),
        exact: r.exact,
        regularise: !r.keep_own_copies,
        min_plateau: or_default(r.min_plateau, defaults.min_plateau),
        seed: r.seed,
    };
    let positions: usize = r.sequences.iter().map(|seq| seq.ids.len()).sum();
    check_len(&s.limits, "the sequences", positions)?;
    let per_token = BYTES_PER_HINT_TOKEN + if opts.exact { BYTES_PER_HINT_COUNT } else { 0 };
    let answer = positions.saturating_mul(opts.samples.saturating_mul(per_token) + BYTES_PER_HINT);
    if answer > s.limits.max_message_bytes {
        return Err(Status::invalid_argument(format!(
            "{positions} positions with {} samples each would answer about {answer} bytes, more than \
             the message limit of {}: send fewer sequences or ask for fewer samples",
            opts.samples, s.limits.max_message_bytes
        )));
    }
    let index = s
        .corpus()?
        .suffix_array("training hints")
        .map_err(index_status)?;
    let signal = crate::interrupt::current();
    let hinted = r
        .sequences
        .par_iter()
        .map(|seq| crate::interrupt::run_under(signal.as_ref(), || index.hints(&seq.ids, &opts)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(index_status)?;
    Ok(pb::HintsResponse {
        sequences: hinted
            .into_iter()
            .map(|(hints, cost)| pb::SequenceHints {
                positions: hints
                    .into_iter()
                    .map(|h| pb::PositionHint {
                        suffix_len: h.suffix_len as u32,
                        count: h.count,
                        excluded: h.excluded,
                        tokens: h.tokens,
                        counts: h.counts,
                    })
                    .collect(),
                searches: cost.searches,
                fresh_searches: cost.fresh_searches,
            })
            .collect(),
    })
}
