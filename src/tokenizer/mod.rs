//! Tokenizers, from a `tokenizer.json` or rebuilt from a GGUF model's metadata, with a fingerprint that
//! says whether two tokenizers give token ids the same meaning.

pub mod gguf;

use std::path::Path;

use sha2::{Digest, Sha256};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::AddedToken;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{0}")]
    Load(String),
    #[error("tokenizer: {0}")]
    Run(String),
}

type Result<T> = std::result::Result<T, TokenizerError>;

/// GGUF `token_type` of control tokens (`<|endoftext|>` and the like).
const GGUF_CONTROL: u64 = 3;

#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    fingerprint: String,
    source: String,
    eos_token_id: Option<u32>,
}

impl Tokenizer {
    /// Loads a `tokenizer.json`, or the tokenizer inside a `.gguf` model file.
    pub fn from_file(path: &Path) -> Result<Self> {
        if path.extension().is_some_and(|e| e == "gguf") {
            Self::from_gguf(path)
        } else {
            let inner = tokenizers::Tokenizer::from_file(path)
                .map_err(|e| TokenizerError::Load(format!("{}: {e}", path.display())))?;
            let eos = document_end_token(&inner);
            Self::wrap(inner, path, eos)
        }
    }

    /// A tokenizer from `tokenizer.json` text (what [`Tokenizer::to_json`] writes), named `source`:
    /// how a router gets its shards' tokenizer.
    pub fn from_json(json: &str, source: &str) -> Result<Self> {
        let inner: tokenizers::Tokenizer = json
            .parse()
            .map_err(|e| TokenizerError::Load(format!("{source}: {e}")))?;
        let eos = document_end_token(&inner);
        Self::wrap(inner, Path::new(source), eos)
    }

    /// Rebuilds a byte-level BPE tokenizer from `tokenizer.ggml.*` metadata (GPT-2 style models such as
    /// SmolLM2: vocabulary, merges, control tokens, and the pre-tokenizer the `pre` name stands for).
    pub fn from_gguf(path: &Path) -> Result<Self> {
        let load = |msg: String| TokenizerError::Load(format!("{}: {msg}", path.display()));
        let meta = gguf::read_metadata(path).map_err(|e| load(e.to_string()))?;
        let get = |key: &str| {
            meta.get(key)
                .ok_or_else(|| load(format!("no {key} in the GGUF metadata")))
        };
        let model = get("tokenizer.ggml.model")?.as_str().unwrap_or_default();
        if model != "gpt2" {
            return Err(load(format!(
                "tokenizer model {model:?} is not byte-level BPE; give a tokenizer.json instead"
            )));
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            get(key)?
                .as_array()
                .ok_or_else(|| load(format!("{key} is not an array")))?
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| load(format!("{key} holds a non-string")))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| load(format!("bad merge {m:?}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| load(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let byte_level = ByteLevel::new(false, true, true);
        let pre = meta
            .get("tokenizer.ggml.pre")
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        match pre {
            "smollm" => inner.with_pre_tokenizer(Some(Sequence::new(vec![
                Digits::new(true).into(),
                byte_level.into(),
            ]))),
            "gpt2" | "default" => inner.with_pre_tokenizer(Some(byte_level)),
            other => {
                return Err(load(format!(
                    "pre-tokenizer {other:?} is not supported; give a tokenizer.json instead"
                )))
            }
        };
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        if let Some(types) = meta
            .get("tokenizer.ggml.token_type")
            .and_then(|v| v.as_array())
        {
            let specials: Vec<AddedToken> = types
                .iter()
                .zip(&tokens)
                .filter(|(t, _)| t.as_u64() == Some(GGUF_CONTROL))
                .map(|(_, tok)| AddedToken::from(tok.clone(), true))
                .collect();
            inner.add_special_tokens(&specials);
        }
        let eos = document_end_token(&inner).or_else(|| {
            meta.get("tokenizer.ggml.eos_token_id")
                .and_then(|v| v.as_u64())
                .map(|v| v as u32)
        });
        Self::wrap(inner, path, eos)
    }

    fn wrap(
        inner: tokenizers::Tokenizer,
        source: &Path,
        eos_token_id: Option<u32>,
    ) -> Result<Self> {
        let fingerprint = fingerprint(&inner)?;
        Ok(Tokenizer {
            inner,
            fingerprint,
            source: source.display().to_string(),
            eos_token_id,
        })
    }

    /// Token ids of `text`, with no special tokens added. A text longer than [`PIECE_BYTES`] is
    /// encoded in pieces (see [`pieces`]), so memory stays bounded whatever the length of a document.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        for piece in pieces(text, PIECE_BYTES) {
            let encoding = self
                .inner
                .encode_fast(piece, false)
                .map_err(|e| TokenizerError::Run(e.to_string()))?;
            ids.extend_from_slice(encoding.get_ids());
        }
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Run(e.to_string()))
    }

    pub fn vocab_size(&self) -> u64 {
        self.inner.get_vocab_size(true) as u64
    }

    /// The token that ends a document, which an index uses for document ends (see `document_end_token`).
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The tokenizer as `tokenizer.json` text, so an index can carry it.
    pub fn to_json(&self) -> Result<String> {
        self.inner
            .to_string(true)
            .map_err(|e| TokenizerError::Run(e.to_string()))
    }
}

/// Longest text encoded in one call. The tokenizers crate keeps alignment data for every byte and a
/// string for every token while it encodes, about 100 bytes of memory per input byte: a 20 MB
/// one-line document took 2.5 GB at once. Pieces of 256 KiB take some 30 MB each.
pub const PIECE_BYTES: usize = 256 << 10;

/// `text` cut into pieces of at most `max` bytes (more only for a single character). Each cut is just
/// before a space that has a non-space character on both sides: byte-level BPE pre-tokenizers (GPT-2's
/// and Llama 3's patterns) always split there and their merges never cross a split, so the pieces
/// encode to the very ids of the whole. Only where no such space lies in the last half of a window (a
/// run of text without one) is the cut at a character boundary, where the tokens may differ.
pub fn pieces(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut end = rest.len().min(max.max(1));
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        if end < rest.len() {
            let window = &rest[..end];
            let mut half = end / 2;
            while !rest.is_char_boundary(half) {
                half += 1;
            }
            let safe = window[half..]
                .rmatch_indices(' ')
                .map(|(i, _)| half + i)
                .find(|&at| {
                    let before = window[..at].chars().next_back();
                    let after = rest[at + 1..].chars().next();
                    before.is_some_and(|c| !c.is_whitespace())
                        && after.is_some_and(|c| !c.is_whitespace())
                });
            if let Some(at) = safe {
                end = at;
            }
        }
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

/// The end-of-document token of pretraining. Instruct models' GGUF files name their end-of-turn token
/// (`<|im_end|>`) as eos, which is not what separates the documents of a corpus.
fn document_end_token(tokenizer: &tokenizers::Tokenizer) -> Option<u32> {
    ["<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>"]
        .iter()
        .find_map(|t| tokenizer.token_to_id(t))
}

/// sha256 over what decides the ids: the model (vocabulary, merges), normaliser, pre-tokenizer and
/// added tokens. Decoder, padding and truncation do not change ids, so they are left out.
fn fingerprint(tokenizer: &tokenizers::Tokenizer) -> Result<String> {
    let json = tokenizer
        .to_string(false)
        .map_err(|e| TokenizerError::Run(e.to_string()))?;
    let value: serde_json::Value =
        serde_json::from_str(&json).map_err(|e| TokenizerError::Run(e.to_string()))?;
    let added: Vec<_> = value["added_tokens"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| (t["id"].clone(), t["content"].clone(), t["special"].clone()))
                .collect()
        })
        .unwrap_or_default();
    let canonical = serde_json::json!({
        "model": value["model"],
        "normalizer": value["normalizer"],
        "pre_tokenizer": value["pre_tokenizer"],
        "added_tokens": added,
    });
    let mut hasher = Sha256::new();
    hasher.update(canonical.to_string().as_bytes());
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn pieces_cover_the_text_and_cut_before_a_space_between_words() {
        let text = "één  twee drie\tvier vijf zes zeven acht negen tien ".repeat(50);
        for max in [1, 7, 16, 100, 1000, 1 << 20] {
            let cut: Vec<&str> = pieces(&text, max).collect();
            assert_eq!(cut.concat(), text, "max {max}");
            for (i, piece) in cut.iter().enumerate() {
                assert!(!piece.is_empty());
                assert!(
                    piece.len() <= max || piece.chars().count() == 1,
                    "max {max}: {piece:?}"
                );
                if i > 0 && max >= 64 {
                    // A space with a word character on both sides.
                    let prev = cut[i - 1].chars().next_back().unwrap();
                    assert!(
                        piece.starts_with(' ') && !prev.is_whitespace(),
                        "{:?}|{piece:?}",
                        cut[i - 1]
                    );
                    assert!(!piece[1..].starts_with(char::is_whitespace));
                }
            }
        }
        let no_spaces = "x".repeat(100);
        assert_eq!(
            pieces(&no_spaces, 30).map(str::len).collect::<Vec<_>>(),
            [30, 30, 30, 10]
        );
        assert_eq!(pieces("", 10).count(), 0);
    }
}
