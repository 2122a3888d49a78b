//! Byte-level indexes (`index build --bytes`): one suffix array over raw UTF-8, 1-byte tokens, that
//! gives a probability to a token of any tokenizer (the byte-level mixing paper's marginalisation).
//!
//! The probability of a token spelled b₁…bₙ after context c is the chain rule over its bytes,
//! Π P∞(bᵢ | c b₁…bᵢ₋₁), each factor an ∞-gram probability with the context grown by one byte. If s is
//! the longest suffix of c that occurs and s·b₁ occurs too, the longest suffix of c·b₁ that occurs is
//! s·b₁ (a longer one would end in a suffix of c longer than s, which does not occur). So each factor's
//! match is the last one extended by a byte, searched inside its ranges, never a fresh search, and the
//! product telescopes to count(s·b₁…bₙ) / count(s); the first factor of 0 ends the walk at 0.
//!
//! - End of text (the model's eos) is a document end: count(s then a separator or the part's end) /
//!   count(s), as the ∞-gram's eos everywhere in the engine.
//! - A byte-fallback token is its one byte, even when that is part of a character: the index holds
//!   bytes, so the chain rule is the same.
//! - A control token (BOS, chat markers) spells no text and gets probability 0 from the index.
//! - Bytes 0xFE and 0xFF never occur in UTF-8 (the index uses them for eos and the separator): a
//!   token spelling one gets 0, and a context's text starts after its last one, as it starts after
//!   its last end of text (a new document).
//!
//! `evidence::bytes` mixes a model with a byte index through this routine.

use crate::index::ranks::RankRange;
use crate::index::read::query::Matches;
use crate::index::suffix::{longest_suffix, SuffixMatch};
use crate::index::{Index, IndexError, Result};
use crate::tokenizer::{Spelling, Tokenizer, BYTE_EOS};

/// The longest suffix of a byte context that occurs in a byte-level index.
pub struct ByteContext {
    suffix_len: usize,
    matches: Matches,
}

impl Index {
    /// Whether this index holds UTF-8 bytes (built with `--bytes`).
    pub fn is_byte_level(&self) -> bool {
        self.tokenizer().is_some_and(Tokenizer::is_utf8_bytes)
    }

    /// The ∞-gram context of `text` (raw bytes, from after its last 0xFE or 0xFF on; only its
    /// longest occurring suffix is kept).
    pub fn byte_context(&self, text: &[u8]) -> Result<ByteContext> {
        self.require_byte_level()?;
        let start = text
            .iter()
            .rposition(|&b| u32::from(b) >= BYTE_EOS)
            .map_or(0, |i| i + 1);
        let ids: Vec<u32> = text[start..].iter().map(|&b| u32::from(b)).collect();
        let (suffix_len, matches) = longest_suffix(self, &ids);
        Ok(ByteContext {
            suffix_len,
            matches,
        })
    }

    fn require_byte_level(&self) -> Result<()> {
        match self.is_byte_level() {
            true => Ok(()),
            false => Err(IndexError::Invalid(
                "this index holds a tokenizer's ids, not UTF-8 bytes: build it with --bytes".into(),
            )),
        }
    }

    /// The byte context of a model's token ids: their spellings from the last end of text on.
    pub fn byte_context_of_tokens(
        &self,
        tokenizer: &Tokenizer,
        ids: &[u32],
    ) -> Result<ByteContext> {
        self.byte_context(&text_after_last_end(tokenizer, ids))
    }
}

/// The text of a model's token sequence read a token at a time, with the longest suffix of it that
/// occurs in a byte-level index kept up to date byte by byte (a document's positions in one pass, or
/// a session's steps, as [`Index::byte_context_of_tokens`] would give each afresh).
pub struct ByteText {
    /// Byte ids of all the text read.
    bytes: Vec<u32>,
    /// Where the text restarted last (after an end of text or a byte ≥ 0xFE).
    start: usize,
    matched: SuffixMatch,
    /// After each token read: the text's length and how many pieces came before the current one,
    /// what [`Self::truncate`] goes back to.
    marks: Vec<(usize, usize)>,
    /// Each earlier piece of the text (before a restart): where it started and its match.
    earlier: Vec<(usize, SuffixMatch)>,
}

impl ByteText {
    /// Memory held: the text's bytes, a mark per token and the matches' lengths.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() * 4
            + self.marks.capacity() * std::mem::size_of::<(usize, usize)>()
            + self.matched.heap_bytes()
            + self
                .earlier
                .iter()
                .map(|(_, m)| m.heap_bytes())
                .sum::<usize>()
    }

    pub fn new(index: &Index) -> Result<Self> {
        index.require_byte_level()?;
        Ok(Self {
            bytes: Vec::new(),
            start: 0,
            matched: SuffixMatch::new(index),
            marks: Vec::new(),
            earlier: Vec::new(),
        })
    }

    /// Reads one more token of `tokenizer`.
    pub fn push(&mut self, index: &Index, tokenizer: &Tokenizer, id: u32) {
        match tokenizer.spelling(id) {
            Spelling::Bytes(spelled) => {
                for &b in spelled.iter() {
                    if u32::from(b) >= BYTE_EOS {
                        self.restart(index);
                        continue;
                    }
                    self.bytes.push(u32::from(b));
                    self.matched.advance(index, &self.bytes[self.start..]);
                }
            }
            Spelling::EndOfText => self.restart(index),
            Spelling::Nothing => {}
        }
        self.marks.push((self.bytes.len(), self.earlier.len()));
    }

    /// Forgets every token past the first `tokens`: one lookup, across an end of text too (the
    /// match of the text before it was kept).
    pub fn truncate(&mut self, index: &Index, tokens: usize) {
        if tokens >= self.marks.len() {
            return;
        }
        let (len, pieces) = match tokens {
            0 => (0, 0),
            n => self.marks[n - 1],
        };
        self.marks.truncate(tokens);
        self.bytes.truncate(len);
        while self.earlier.len() > pieces {
            let Some((earlier_start, earlier)) = self.earlier.pop() else {
                break;
            };
            (self.start, self.matched) = (earlier_start, earlier);
        }
        self.matched.truncate(index, &self.bytes[self.start..]);
    }

    fn restart(&mut self, index: &Index) {
        let done = std::mem::replace(&mut self.matched, SuffixMatch::new(index));
        self.earlier.push((self.start, done));
        self.start = self.bytes.len();
    }

    /// All the text read, as byte ids.
    pub fn bytes(&self) -> &[u32] {
        &self.bytes
    }

    /// The part of [`Self::bytes`] the next token's context reads: since the text last restarted.
    pub fn span(&self) -> std::ops::Range<usize> {
        self.start..self.bytes.len()
    }

    /// Bytes of the longest suffix of the text (since it last restarted) that occurs.
    pub fn suffix_len(&self) -> usize {
        self.matched.suffix_len()
    }

    /// Occurrences of that suffix.
    pub fn prompt_cnt(&self) -> u64 {
        self.matched.prompt_cnt()
    }

    /// Tokens read whose bytes all lie inside that suffix (never the one that ended a document:
    /// the match starts after it).
    pub fn matched_tokens(&self) -> usize {
        let from = self.bytes.len().saturating_sub(self.suffix_len());
        // Token i starts where token i − 1 ended, and restarted the text if the pieces before the
        // current one grew as it was read.
        let mut matched = 0;
        for i in (0..self.marks.len()).rev() {
            let (start, pieces) = match i {
                0 => (0, 0),
                _ => self.marks[i - 1],
            };
            if start < from || pieces != self.earlier.len() {
                break;
            }
            matched += 1;
        }
        matched
    }

    /// That suffix's bytes.
    pub fn matched_suffix(&self) -> &[u32] {
        &self.bytes[self.bytes.len().saturating_sub(self.matched.suffix_len())..]
    }

    /// What followed that suffix in the index, as [`SuffixMatch::continuations`] gives it.
    pub fn continuations(&self, index: &Index, samples: usize, depth: usize) -> Vec<Vec<u32>> {
        self.matched.continuations(index, samples, depth)
    }

    /// The context of the next token.
    pub fn context(&self) -> ByteContext {
        ByteContext {
            suffix_len: self.matched.suffix_len(),
            matches: self.matched.matches().clone(),
        }
    }

    /// The context of the next token without its suffix's bytes, for a caller that keeps one a
    /// position (a copied passage's suffix can be most of a document): rebuilt from the text by
    /// [`KeptContext::context`].
    pub fn kept_context(&self) -> KeptContext {
        KeptContext {
            suffix_len: self.matched.suffix_len(),
            ranges: self.matched.matches().ranges.clone(),
        }
    }
}

/// A [`ByteContext`] less its suffix's bytes (see [`ByteText::kept_context`]).
pub struct KeptContext {
    suffix_len: usize,
    ranges: Vec<RankRange>,
}

impl KeptContext {
    /// The context again, from the text it ends (at least its matched suffix).
    pub fn context(&self, text: &[u32]) -> ByteContext {
        let suffix = &text[text.len().saturating_sub(self.suffix_len)..];
        ByteContext {
            suffix_len: self.suffix_len,
            matches: Matches {
                bytes: suffix.iter().map(|&b| b as u8).collect(),
                ranges: self.ranges.clone(),
            },
        }
    }
}

/// The bytes `ids` spell, from the last end of text on.
pub fn text_after_last_end(tokenizer: &Tokenizer, ids: &[u32]) -> Vec<u8> {
    let start = ids
        .iter()
        .rposition(|&id| *tokenizer.spelling(id) == Spelling::EndOfText)
        .map_or(0, |i| i + 1);
    let mut text = Vec::new();
    for &id in &ids[start..] {
        if let Spelling::Bytes(b) = tokenizer.spelling(id) {
            text.extend_from_slice(b);
        }
    }
    text
}

impl ByteContext {
    /// Bytes of the longest suffix that occurs (effective n − 1).
    pub fn suffix_len(&self) -> usize {
        self.suffix_len
    }

    /// Occurrences of that suffix.
    pub fn prompt_cnt(&self) -> u64 {
        self.matches.count()
    }

    /// The probability that the text ends here (a document's end follows the suffix).
    pub fn end_prob(&self, index: &Index) -> f64 {
        match self.matches.count() {
            0 => 0.0,
            n => index.cont_count(&self.matches, index.eos_token_id()) as f64 / n as f64,
        }
    }

    /// The chain-rule probability of each spelling after this context (see the module notes).
    /// Spellings are walked in sorted order so that tokens sharing a prefix share its extensions.
    pub fn token_probs(&self, index: &Index, spellings: &[&Spelling]) -> Vec<f64> {
        let total = self.matches.count() as f64;
        let mut probs = vec![0.0; spellings.len()];
        if total == 0.0 {
            return probs;
        }
        let mut order: Vec<(usize, &[u8])> = Vec::with_capacity(spellings.len());
        for (i, spelling) in spellings.iter().enumerate() {
            match spelling {
                Spelling::Bytes(b)
                    if !b.is_empty() && b.iter().all(|&x| u32::from(x) < BYTE_EOS) =>
                {
                    order.push((i, b))
                }
                Spelling::EndOfText => probs[i] = self.end_prob(index),
                _ => {}
            }
        }
        order.sort_unstable_by_key(|&(_, b)| b);
        self.walk_sorted(
            index,
            order.len(),
            |k| order[k].1,
            |k, count| {
                probs[order[k].0] = count as f64 / total;
            },
        );
        probs
    }

    /// Every token of `tokenizer` whose spelling starts with one of `roots` and can follow this
    /// context (the model's candidates and every longer token the text could go on with), with the
    /// count of the context followed by its spelling: its chain-rule probability times
    /// [`Self::prompt_cnt`]. In spelling order; a run of tokens whose common prefix never follows
    /// the context costs one extension.
    pub fn extensions(
        &self,
        index: &Index,
        tokenizer: &Tokenizer,
        roots: &[&[u8]],
    ) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        let order = tokenizer.spelling_order();
        let spelled = |id: u32| tokenizer.spelling(id).bytes();
        let mut roots = roots.to_vec();
        roots.sort_unstable();
        let mut walked_to = 0;
        for root in roots {
            let lo = order
                .partition_point(|&id| spelled(id) < root)
                .max(walked_to);
            let run = order[lo..].partition_point(|&id| spelled(id).starts_with(root));
            let run = &order[lo..lo + run];
            self.walk_sorted(
                index,
                run.len(),
                |k| spelled(run[k]),
                |k, count| {
                    out.push((run[k], count));
                },
            );
            walked_to = lo + run.len();
        }
        out
    }

    /// Walks `n` spellings in sorted order (`spelling(k)`) from this context, each prefix's
    /// extension shared with the spellings after it: `visit(k, count)` hears the count of the
    /// context followed by spelling k, for every spelling whose prefixes all follow; the run of
    /// spellings after one whose prefix never follows is skipped.
    fn walk_sorted<'s>(
        &self,
        index: &Index,
        n: usize,
        spelling: impl Fn(usize) -> &'s [u8],
        mut visit: impl FnMut(usize, u64),
    ) {
        // path[d]: the matches after the first d bytes of the spelling walked last.
        let mut path: Vec<Matches> = Vec::new();
        let mut prev: &[u8] = &[];
        let mut k = 0;
        while k < n {
            let bytes = spelling(k);
            let common = prev.iter().zip(bytes).take_while(|(a, b)| a == b).count();
            path.truncate(common);
            while path.len() < bytes.len() && path.last().is_none_or(|m| m.count() > 0) {
                let last = path.last().unwrap_or(&self.matches);
                path.push(index.extend(last, u32::from(bytes[path.len()])));
            }
            prev = bytes;
            let count = path.last().map_or(self.matches.count(), Matches::count);
            if count > 0 {
                visit(k, count);
                k += 1;
                continue;
            }
            // bytes[..path.len()] never follows: neither does any spelling starting with it, and
            // those are the sorted run from k on (found by bisection: a run can be most of a
            // vocabulary).
            let dead = &bytes[..path.len()];
            let (mut lo, mut hi) = (k + 1, n);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if spelling(mid).starts_with(dead) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            k = lo;
        }
    }
}
