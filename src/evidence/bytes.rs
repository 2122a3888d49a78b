//! The ∞-gram's evidence over a model's tokens from a byte-level index (`index build --bytes`), so
//! one index serves every tokenizer. A token's chain-rule probability over its bytes
//! ([`ByteContext::token_probs`]) is the probability that the next bytes start with its spelling.
//! Tokens overlap (" t", " th" and " the" all start " the"), so these sum past 1 and are no
//! distribution. The ∞-gram's distribution after a context is:
//! - The walked tokens: the model's [`BYTE_CANDIDATES`] most likely tokens and every longer token
//!   that starts with one of their spellings and can follow the context ([`ByteContext::extensions`]:
//!   runs of the vocabulary in spelling order, prefixes shared, a run whose prefix never follows
//!   skipped at once; of tokens spelled alike, the one the tokenizer encodes those bytes to).
//! - The text after the context splits into disjoint events by the longest walked token it starts
//!   with, v: how often, by exact counts, v's count less those of its nearest walked extensions.
//!   Each event goes to v. Every token of SmolLM2's and Gemma-3's vocabularies encodes to itself, so
//!   a tokenizer at a token boundary before v's bytes mostly cuts v; not always, as merges depend on
//!   the bytes after and the pre-tokenizer on the context (eval/RESULTS.md measures what is lost).
//! - The end of text, when it is a candidate, is an event of its own: the matched suffix ends a
//!   document.
//! - What is left, the ∞-gram's probability of text that starts with no candidate, is given to every
//!   token in proportion to the model's probability of it: the model's guess of which token that
//!   text starts. Walking the whole vocabulary instead would cost up to 262k spellings a position,
//!   however unlikely the model finds them.
//!
//! So P∞ sums to one over the vocabulary; the ∞-gram decides what text comes, the model only what
//! the ∞-gram cannot say; when the ∞-gram can say nothing of the candidates P∞ is the model's, and
//! so is the mixture. The paper's `sparse` (the ∞-gram is certain, λ1's tokens): one token gets all
//! of P∞. The gate sees the byte context: suffix lengths and counts of its last k bytes, and the
//! distinct next bytes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{EvidenceError, StepInfgram};
use crate::index::bytes::{text_after_last_end, ByteContext, ByteText};
use crate::index::dense::TokenScore;
use crate::index::{Index, IndexError};
use crate::mix::features::InfgramContext;
use crate::mix::{NeuralDistribution, SparseDistribution};
use crate::model::{DocumentScore, Model, WindowOptions};
use crate::tokenizer::{Spelling, Tokenizer};

/// The model's most likely tokens whose runs of the vocabulary are walked at each position (the
/// cost per token is in eval/RESULTS.md, beside the model's).
pub const BYTE_CANDIDATES: usize = 64;

/// The ∞-gram's view of a model's next token from a byte-level index.
#[derive(Debug, Clone, PartialEq)]
pub struct ByteStep {
    /// Over the walked tokens, the rest in the model's shape (module notes).
    pub dist: SparseDistribution,
    /// Bytes of the longest suffix of the context's text that occurs.
    pub suffix_len: usize,
    pub prompt_cnt: u64,
    pub sparse: bool,
}

impl ByteStep {
    /// What it says of the position as a token index's dense score would, the token's own
    /// probability left at 0.
    pub fn score(&self) -> TokenScore {
        TokenScore {
            prob: 0.0,
            suffix_len: self.suffix_len,
            prompt_cnt: self.prompt_cnt,
            cont_cnt: 0,
            sparse: self.sparse,
        }
    }
}

/// A decoding step after the model's tokens `context`, whose distribution is `neural`: the
/// ∞-gram's view from a byte-level index, its byte context looked up afresh.
pub fn decode_step(
    index: &Index,
    tokenizer: &Tokenizer,
    context: &[u32],
    neural: &NeuralDistribution,
) -> Result<StepInfgram, EvidenceError> {
    let text = text_after_last_end(tokenizer, context);
    let byte_context = index.byte_context(&text)?;
    let step = marginalise(index, tokenizer, &byte_context, &candidates(neural));
    let suffix = &text[text.len().saturating_sub(step.suffix_len)..];
    // The context's last tokens that lie whole inside the match (what the copy guard counts).
    let mut matched_tokens = 0;
    let mut covered = 0;
    for &id in context.iter().rev() {
        covered += tokenizer.spelling(id).byte_len();
        if covered > step.suffix_len || *tokenizer.spelling(id) == Spelling::EndOfText {
            break;
        }
        matched_tokens += 1;
    }
    Ok(StepInfgram::Bytes {
        step,
        text: suffix.iter().map(|&b| u32::from(b)).collect(),
        matched_tokens,
    })
}

/// The same step after a sequence whose text `followed` has read token by token (a session's).
pub fn followed_step(
    index: &Index,
    tokenizer: &Tokenizer,
    followed: &ByteText,
    neural: &NeuralDistribution,
) -> StepInfgram {
    let step = marginalise(index, tokenizer, &followed.context(), &candidates(neural));
    StepInfgram::Bytes {
        step,
        text: followed.matched_suffix().to_vec(),
        matched_tokens: followed.matched_tokens(),
    }
}

/// The model's [`BYTE_CANDIDATES`] most likely tokens.
fn candidates(neural: &NeuralDistribution) -> Vec<u32> {
    neural
        .top(BYTE_CANDIDATES)
        .into_iter()
        .map(|(t, _)| t)
        .collect()
}

/// The ∞-gram's distribution after `context` over a model whose most likely tokens are `candidates`,
/// spelled by `tokenizer` (module notes).
pub fn marginalise(
    index: &Index,
    tokenizer: &Tokenizer,
    context: &ByteContext,
    candidates: &[u32],
) -> ByteStep {
    let spelled = |id: u32| tokenizer.spelling(id).bytes();
    let roots: Vec<&[u8]> = candidates
        .iter()
        .map(|&t| spelled(t))
        .filter(|b| !b.is_empty())
        .collect();
    let walked = context.extensions(index, tokenizer, &roots);
    let total = context.prompt_cnt() as f64;
    let mut entries: Vec<(u32, f64)> = Vec::with_capacity(walked.len() + 1);
    for (k, &(id, count)) in walked.iter().enumerate() {
        // Its event: its count less those of its nearest extensions, the walked tokens right after
        // it in spelling order that extend it and no token between.
        let mut own = count;
        let mut next = k + 1;
        while next < walked.len() && spelled(walked[next].0).starts_with(spelled(id)) {
            own -= walked[next].1;
            let child = spelled(walked[next].0);
            next += 1;
            while next < walked.len() && spelled(walked[next].0).starts_with(child) {
                next += 1;
            }
        }
        if own > 0 {
            entries.push((id, own as f64 / total));
        }
    }
    if let Some(&eos) = candidates
        .iter()
        .find(|&&t| *tokenizer.spelling(t) == Spelling::EndOfText)
    {
        entries.push((eos, context.end_prob(index)));
    }
    entries.retain(|&(_, p)| p > 0.0);
    let covered: f64 = entries.iter().map(|(_, p)| p).sum();
    let sparse = entries.len() == 1 && covered >= 1.0 - 1e-12;
    ByteStep {
        dist: SparseDistribution::deferring(entries, (1.0 - covered).max(0.0)),
        suffix_len: context.suffix_len(),
        prompt_cnt: context.prompt_cnt(),
        sparse,
    }
}

/// What a byte-level index says at one scored token of a document.
pub struct BytePosition {
    /// As a token index's dense score: P∞ of the token, its byte suffix length and count.
    pub score: TokenScore,
    pub context: InfgramContext,
}

/// A document scored by the model with the window protocol and by a byte-level index at each of
/// tokens `1..n`, where the model's whole distribution is at hand. Also the seconds of wall time
/// the index's share took (its walks run beside the logits, on every thread).
pub fn document(
    model: &Model,
    index: &Index,
    window: WindowOptions,
    tokens: &[u32],
    progress: impl FnMut(usize),
) -> Result<(DocumentScore, Vec<BytePosition>, f64), EvidenceError> {
    let tokenizer = model.tokenizer();
    let started = Instant::now();
    // Each position's context (less its suffix's bytes) and the span of the text it ends.
    let mut text = ByteText::new(index)?;
    let mut contexts = Vec::with_capacity(tokens.len());
    for &token in tokens {
        contexts.push((text.kept_context(), text.span()));
        text.push(index, tokenizer, token);
    }
    let mut seconds = started.elapsed().as_secs_f64();
    let walks_ns = AtomicU64::new(0);
    let (neural, steps) =
        model
            .transformer()
            .score_document_with(tokens, window, progress, |position, row| {
                let t = Instant::now();
                let candidates: Vec<u32> = row
                    .top(BYTE_CANDIDATES)
                    .into_iter()
                    .map(|(id, _)| id)
                    .collect();
                let (kept, span) = &contexts[position];
                let context = kept.context(&text.bytes()[span.clone()]);
                let step = marginalise(index, tokenizer, &context, &candidates);
                let prob = step
                    .dist
                    .prob_beside(tokens[position], row.prob(tokens[position]));
                walks_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                (step, prob)
            })?;
    // The walks ran beside the logits on every thread: their share of the wall time.
    seconds += walks_ns.into_inner() as f64 * 1e-9 / rayon::current_num_threads() as f64;
    let started = Instant::now();
    let mut out = Vec::with_capacity(steps.len());
    for (position, (step, prob)) in (1..).zip(steps) {
        if crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted.into());
        }
        let score = TokenScore {
            prob,
            ..step.score()
        };
        let prefix = &text.bytes()[contexts[position].1.clone()];
        let context = InfgramContext::new(index, prefix, &score)?;
        out.push(BytePosition { score, context });
    }
    seconds += started.elapsed().as_secs_f64();
    Ok((neural, out, seconds))
}
