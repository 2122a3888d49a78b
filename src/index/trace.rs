//! Maximal matching spans (OLMoTrace): the spans of a text, such as a model's output, that occur
//! verbatim in the reference data and cannot grow on either side, with their counts and documents.
//!
//! For each start i, one search finds e(i), the end of the longest span from i that occurs. The
//! span (i, e(i)) cannot grow to the right by definition, and it can grow to the left exactly when
//! (i − 1, e(i)) occurs, that is when e(i − 1) ≥ e(i). So the maximal spans are those with
//! e(i) > e(i − 1). The searches, one per suffix of the text, run in parallel chunks; within a
//! chunk each starts from what the one before found (e(i) ≥ e(i − 1)). Each is exact (the engine's
//! count), and each span's documents come from the document search, refused before it starts
//! when the spans' documents would show more than `max_shown_tokens`.

use std::ops::Range;

use rayon::prelude::*;
use serde::Serialize;

use crate::index::docs::{search_docs_cnf, Document, DocumentIndex, SearchOptions};
use crate::index::suffix::{Counted, Occurrences};
use crate::index::{IndexError, Result};

/// Longest text traced at once (tokens): one search per token, each up to the span's length.
pub const MAX_TRACE_TOKENS: usize = 8192;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceOptions {
    /// Shortest span reported (tokens).
    pub min_len: usize,
    /// Documents listed per span.
    pub max_documents: usize,
    /// Tokens shown of each document, around the span.
    pub max_disp_len: usize,
    /// Most document tokens shown over all spans (each span's shown documents times
    /// `max_disp_len`): a trace that would show more is refused before its documents are read.
    pub max_shown_tokens: u64,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            min_len: 8,
            max_documents: 3,
            max_disp_len: 64,
            max_shown_tokens: 1 << 22,
        }
    }
}

/// A maximal matching span `ids[start..end]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceSpan {
    pub start: usize,
    pub end: usize,
    /// Occurrences in the reference data.
    pub count: u64,
    /// Places in documents that hold it (at most `max_documents`, spread over its matches as the
    /// document search spreads them), each shown around the span.
    pub documents: Vec<Document>,
}

/// The maximal spans of `ids` of at least `min_len` tokens that occur in `index`: written once
/// for every index that follows matches and finds documents (suffix arrays and compressed ones).
pub(crate) fn trace<I>(index: &I, ids: &[u32], opts: TraceOptions) -> Result<Vec<TraceSpan>>
where
    I: Occurrences + DocumentIndex + Sync,
{
    let lengths = span_lengths(index, ids)?;
    let spans: Vec<(usize, usize, u64)> =
        maximal_spans(lengths.iter().map(|&(len, _)| len), opts.min_len)
            .into_iter()
            .map(|(start, end)| (start, end, lengths[start].1))
            .collect();
    check_shown(spans.iter().map(|s| s.2), opts)?;
    let signal = crate::interrupt::current();
    let search = SearchOptions {
        maxnum: opts.max_documents,
        max_disp_len: opts.max_disp_len,
        ..SearchOptions::default()
    };
    spans
        .into_par_iter()
        .map(|(start, end, count)| {
            let documents = if opts.max_documents == 0 {
                Vec::new()
            } else {
                crate::interrupt::run_under(signal.as_ref(), || {
                    search_docs_cnf(index, &[vec![ids[start..end].to_vec()]], search)
                })?
                .documents
            };
            Ok(TraceSpan {
                start,
                end,
                count,
                documents,
            })
        })
        .collect()
}

/// Refuses a text of more tokens than a trace takes.
pub fn check_len(tokens: usize) -> Result<()> {
    match tokens <= MAX_TRACE_TOKENS {
        true => Ok(()),
        false => Err(IndexError::Invalid(format!(
            "a trace takes at most {MAX_TRACE_TOKENS} tokens, not {tokens}"
        ))),
    }
}

/// For every start of `ids`, the length of the longest span from it that occurs in `index`, and
/// its count. A router takes each start's longest over its shards: a span occurs in the shards
/// together exactly when it occurs in one of them.
pub fn span_lengths<I>(index: &I, ids: &[u32]) -> Result<Vec<(usize, u64)>>
where
    I: Occurrences + Sync + ?Sized,
{
    check_len(ids.len())?;
    index.check_query(ids)?;
    // Chunks of starts in parallel; within one, e(i) ≥ e(i − 1) lets each search start from
    // what the last one found, so a chunk costs O(its length) searches, not O(length × span).
    let signal = crate::interrupt::current();
    let chunk = ids.len().div_ceil(rayon::current_num_threads()).max(32);
    let starts: Vec<usize> = (0..ids.len()).step_by(chunk).collect();
    Ok(starts
        .par_iter()
        .map(|&from| {
            let to = (from + chunk).min(ids.len());
            crate::interrupt::run_under(signal.as_ref(), || longest_spans(index, ids, from..to))
        })
        .collect::<Result<Vec<_>>>()?
        .concat())
}

/// The maximal spans `(start, end)` of at least `min_len` tokens, from each start's longest span
/// (module notes).
pub fn maximal_spans(lengths: impl Iterator<Item = usize>, min_len: usize) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut prev_end = 0;
    for (start, len) in lengths.enumerate() {
        let end = start + len;
        if end > prev_end && len >= min_len.max(1) {
            spans.push((start, end));
        }
        prev_end = prev_end.max(end);
    }
    spans
}

/// Refuses spans of these counts whose documents would show more than `opts.max_shown_tokens`,
/// before any document is read.
pub fn check_shown(counts: impl ExactSizeIterator<Item = u64>, opts: TraceOptions) -> Result<()> {
    let spans = counts.len();
    let shown: u64 = counts
        .map(|count| count.min(opts.max_documents as u64))
        .sum::<u64>()
        .saturating_mul(opts.max_disp_len as u64);
    if shown > opts.max_shown_tokens {
        return Err(IndexError::Invalid(format!(
            "the {} spans' documents would show {shown} tokens, more than {}: ask for fewer or shorter documents, or longer spans",
            spans,
            opts.max_shown_tokens
        )));
    }
    Ok(())
}

/// For each start in `starts`, the length of the longest span of `ids` from it that occurs,
/// and its count: the span the last start found, less its first token, is located (it
/// occurs), then grown one token at a time inside its own ranges.
fn longest_spans<I: Occurrences + ?Sized>(
    index: &I,
    ids: &[u32],
    starts: Range<usize>,
) -> Result<Vec<(usize, u64)>> {
    let mut out = Vec::with_capacity(starts.len());
    let mut carried = 0;
    for i in starts {
        if crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted);
        }
        let mut matches = index.matches_of(&ids[i..i + carried]);
        let (mut len, mut count) = (carried, matches.count());
        while let Some(&next) = ids.get(i + len) {
            index.grow_matches(&mut matches, next);
            match matches.count() {
                0 => break,
                grown => (len, count) = (len + 1, grown),
            }
        }
        out.push((len, count));
        carried = len.saturating_sub(1);
    }
    Ok(out)
}
