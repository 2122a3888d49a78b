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
//! - End of text (the model's eos) is a document end: count(s then a separator or the shard's end) /
//!   count(s), as the ∞-gram's eos everywhere in the engine.
//! - A byte-fallback token is its one byte, even when that is part of a character: the index holds
//!   bytes, so the chain rule is the same.
//! - A control token (BOS, chat markers) spells no text and gets probability 0 from the index.
//! - Bytes 0xFE and 0xFF never occur in UTF-8 (the index uses them for eos and the separator): a
//!   token spelling one gets 0, and a context's text starts after its last one, as it starts after
//!   its last end of text (a new document).
//!
//! Nothing mixes a model with a byte index yet: this is the routine that will.

use crate::index::query::Matches;
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
        if !self.is_byte_level() {
            return Err(IndexError::Invalid(
                "this index holds a tokenizer's ids, not UTF-8 bytes: build it with --bytes".into(),
            ));
        }
        let start = text
            .iter()
            .rposition(|&b| u32::from(b) >= BYTE_EOS)
            .map_or(0, |i| i + 1);
        let ids: Vec<u32> = text[start..].iter().map(|&b| u32::from(b)).collect();
        let (suffix_len, matches) = self.longest_suffix(&ids);
        Ok(ByteContext {
            suffix_len,
            matches,
        })
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
                Spelling::EndOfText => {
                    probs[i] = index.cont_count(&self.matches, index.eos_token_id()) as f64 / total;
                }
                _ => {}
            }
        }
        order.sort_unstable_by_key(|&(_, b)| b);
        // path[d]: the matches after the first d bytes of the spelling walked last.
        let mut path: Vec<Matches> = Vec::new();
        let mut prev: &[u8] = &[];
        for (i, bytes) in order {
            let common = prev.iter().zip(bytes).take_while(|(a, b)| a == b).count();
            path.truncate(common);
            while path.len() < bytes.len() {
                let last = path.last().unwrap_or(&self.matches);
                if last.count() == 0 {
                    break;
                }
                path.push(index.extend(last, u32::from(bytes[path.len()])));
            }
            if path.len() == bytes.len() {
                probs[i] = path.last().map_or(0, Matches::count) as f64 / total;
            }
            prev = bytes;
        }
        probs
    }
}
