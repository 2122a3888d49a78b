//! The engine's RPCs: tokenizer, counts, next-token distributions, document search, the ∞-gram's
//! own generation (selective back-off) and maximal matching spans.

use std::collections::BTreeMap;

use rayon::prelude::*;
use tonic::Status;

use super::valid::{ValidCount, ValidGenerate, ValidHints, ValidNtd, ValidSearch, ValidTrace};
use super::{index_status, pb, tokenizer_status, State};
use crate::index::backoff::BackoffGeneration;
use crate::index::docs::{Document, SearchResult};
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
    let ids = s.tokenizer.encode(&text).map_err(tokenizer_status)?;
    Ok(pb::TokenizeResponse { ids })
}

pub(super) fn detokenize(
    s: &State,
    r: pb::DetokenizeRequest,
) -> Result<pb::DetokenizeResponse, Status> {
    let ids = r.ids;
    s.corpus()?.check_ids(&ids).map_err(index_status)?;
    let text = s.tokenizer.decode(&ids).map_err(tokenizer_status)?;
    Ok(pb::DetokenizeResponse { text })
}

pub(super) fn count(s: &State, r: ValidCount) -> Result<pb::CountResponse, Status> {
    let count = s.corpus()?.count(&r.ids).map_err(index_status)?;
    Ok(pb::CountResponse {
        count,
        partial: None,
    })
}

pub(super) fn next_token_distribution(
    s: &State,
    r: ValidNtd,
) -> Result<pb::NextTokenDistributionResponse, Status> {
    let (ntd, suffix_len, sparse) = match r.infinite {
        true => {
            let a = s
                .corpus()?
                .infgram_ntd(&r.prompt, r.max_support)
                .map_err(index_status)?;
            (a.ntd, a.suffix_len, a.sparse)
        }
        false => {
            let a = s
                .corpus()?
                .ntd(&r.prompt, r.max_support)
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

pub(super) fn search_documents(
    s: &State,
    r: ValidSearch,
) -> Result<pb::SearchDocumentsResponse, Status> {
    let found = s
        .corpus()?
        .search_docs_cnf(&r.cnf, r.opts)
        .map_err(index_status)?;
    Ok(search_response(found, None))
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

pub(super) fn generate(s: &State, r: ValidGenerate) -> Result<pb::GenerateResponse, Status> {
    let made = (s.corpus()?)
        .backoff_generate(&r.prompt, &r.spec, r.draw)
        .map_err(index_status)?;
    Ok(generate_response(&s.tokenizer, made))
}

pub(super) fn trace(s: &State, r: ValidTrace) -> Result<pb::TraceResponse, Status> {
    let opts = r.opts;
    let ids = r.ids(&s.tokenizer)?;
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

/// `Hints`: every sequence hinted in parallel.
pub(super) fn hints(s: &State, r: ValidHints) -> Result<pb::HintsResponse, Status> {
    let opts = r.opts;
    let index = s
        .corpus()?
        .suffix_array("training hints")
        .map_err(index_status)?;
    let signal = crate::interrupt::current();
    let hinted = r
        .sequences
        .par_iter()
        .map(|seq| crate::interrupt::run_under(signal.as_ref(), || index.hints(seq, &opts)))
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
