//! Tokenizers, from a `tokenizer.json` or rebuilt from a GGUF model's metadata, with a fingerprint that
//! says whether two tokenizers give token ids the same meaning; and the UTF-8 byte "tokenizer" of
//! byte-level indexes (one index for every model's tokenizer, see [`crate::index::bytes`]).

pub mod gguf;
mod spelling;

pub use spelling::Spelling;

use std::path::Path;
use std::sync::{Arc, OnceLock};

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
    engine: Engine,
    fingerprint: String,
    source: String,
    eos_token_id: Option<u32>,
    /// Ids are below this. Kept: the Hugging Face tokenizer builds its whole vocabulary to say.
    vocab_size: u64,
    /// Every token's bytes, worked out on first use (only byte-level mixing asks).
    spellings: Arc<OnceLock<Vec<Spelling>>>,
    /// Ids in order of their spelling, one a spelling (see [`Tokenizer::spelling_order`]).
    spelling_order: Arc<OnceLock<Vec<u32>>>,
}

#[derive(Clone)]
enum Engine {
    /// A Hugging Face tokenizer: BPE, SentencePiece-style, with its added tokens.
    Hf(Box<tokenizers::Tokenizer>),
    /// Token id = byte value of UTF-8 text, [`BYTE_EOS`] for document ends.
    Utf8Bytes,
}

/// Vocabulary of the byte tokenizer: every byte value but 0xFF, which is the 1-byte separator. UTF-8
/// never uses 0xFE or 0xFF, so text gives ids up to 0xF4 and 0xFE is free to mean end of document.
pub const BYTE_VOCAB_SIZE: u64 = 255;
/// The byte tokenizer's end of document (a byte UTF-8 never holds).
pub const BYTE_EOS: u32 = 0xFE;
/// What a byte index's `tokenizer.json` holds: a marker, not a Hugging Face tokenizer.
const BYTES_JSON: &str = r#"{"infini_sidecar_tokenizer":"utf8-bytes"}"#;
const BYTES_FINGERPRINT: &str = "utf8-bytes";

impl Tokenizer {
    /// Loads a `tokenizer.json` (or a byte index's marker), or the tokenizer inside a `.gguf` model file.
    pub fn from_file(path: &Path) -> Result<Self> {
        if path.extension().is_some_and(|e| e == "gguf") {
            Self::from_gguf(path)
        } else {
            let json = std::fs::read_to_string(path)
                .map_err(|e| TokenizerError::Load(format!("{}: {e}", path.display())))?;
            Self::from_json(&json, &path.display().to_string())
        }
    }

    /// A tokenizer from `tokenizer.json` text (what [`Tokenizer::to_json`] writes), named `source`:
    /// how a router gets its shards' tokenizer.
    pub fn from_json(json: &str, source: &str) -> Result<Self> {
        if json.trim() == BYTES_JSON {
            return Ok(Self::utf8_bytes());
        }
        let inner: tokenizers::Tokenizer = json
            .parse()
            .map_err(|e| TokenizerError::Load(format!("{source}: {e}")))?;
        let eos = document_end_token(&inner);
        Self::wrap(inner, Path::new(source), eos)
    }

    /// The tokenizer of byte-level indexes: UTF-8 bytes as ids (see [`BYTE_VOCAB_SIZE`]).
    pub fn utf8_bytes() -> Self {
        Tokenizer {
            engine: Engine::Utf8Bytes,
            fingerprint: BYTES_FINGERPRINT.to_owned(),
            source: "UTF-8 bytes".to_owned(),
            eos_token_id: Some(BYTE_EOS),
            vocab_size: BYTE_VOCAB_SIZE,
            spellings: Arc::default(),
            spelling_order: Arc::default(),
        }
    }

    /// Whether ids are UTF-8 bytes (a byte-level index's tokenizer).
    pub fn is_utf8_bytes(&self) -> bool {
        matches!(self.engine, Engine::Utf8Bytes)
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
            vocab_size: inner.get_vocab_size(true) as u64,
            engine: Engine::Hf(Box::new(inner)),
            fingerprint,
            source: source.display().to_string(),
            eos_token_id,
            spellings: Arc::default(),
            spelling_order: Arc::default(),
        })
    }

    /// Token ids of `text`, with no special tokens added. A text longer than [`PIECE_BYTES`] is
    /// encoded in pieces (see [`pieces`]), so memory stays bounded whatever the length of a document.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let inner = match &self.engine {
            Engine::Hf(inner) => inner,
            Engine::Utf8Bytes => return Ok(text.bytes().map(u32::from).collect()),
        };
        let mut ids = Vec::new();
        for piece in pieces(text, PIECE_BYTES) {
            let encoding = inner
                .encode_fast(piece, false)
                .map_err(|e| TokenizerError::Run(e.to_string()))?;
            ids.extend_from_slice(encoding.get_ids());
        }
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.engine {
            Engine::Hf(inner) => inner
                .decode(ids, false)
                .map_err(|e| TokenizerError::Run(e.to_string())),
            Engine::Utf8Bytes => {
                let bytes: Vec<u8> = ids
                    .iter()
                    .filter(|&&id| id < BYTE_EOS)
                    .map(|&id| id as u8)
                    .collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
        }
    }

    pub fn vocab_size(&self) -> u64 {
        self.vocab_size
    }

    /// The bytes of token `id` in the text it stands for (see [`Spelling`]); ids past the
    /// vocabulary have none.
    pub fn spelling(&self, id: u32) -> &Spelling {
        let all = self.spellings.get_or_init(|| match &self.engine {
            Engine::Hf(inner) => spelling::of_vocabulary(inner, self.eos_token_id),
            Engine::Utf8Bytes => spelling::of_bytes(),
        });
        all.get(id as usize).unwrap_or(&Spelling::Nothing)
    }

    /// The ids of the tokens that spell text, sorted by their bytes, so the tokens whose spelling
    /// starts with given bytes are a run of it. Where several tokens spell the same bytes (a
    /// byte-fallback token beside a regular one) only the one encoding those bytes gives is kept:
    /// the one the tokenizer cuts text into.
    pub fn spelling_order(&self) -> &[u32] {
        self.spelling_order.get_or_init(|| {
            let vocab = self.vocab_size() as u32;
            spelling::order(
                (0..vocab).map(|id| (id, self.spelling(id))),
                |bytes, alike| {
                    let encoded = std::str::from_utf8(bytes)
                        .ok()
                        .and_then(|text| self.encode(text).ok());
                    match encoded.as_deref() {
                        Some(&[id]) if alike.contains(&id) => id,
                        // SentencePiece vocabularies put byte-fallback tokens first.
                        _ => alike.iter().copied().max().unwrap_or_default(),
                    }
                },
            )
        })
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

    /// UTF-8 bytes of text that `ids` stand for: what bits per byte divide by.
    pub fn text_bytes(&self, ids: &[u32]) -> usize {
        ids.iter().map(|&id| self.spelling(id).byte_len()).sum()
    }

    /// The tokenizer as `tokenizer.json` text, so an index can carry it.
    pub fn to_json(&self) -> Result<String> {
        match &self.engine {
            Engine::Hf(inner) => inner
                .to_string(true)
                .map_err(|e| TokenizerError::Run(e.to_string())),
            Engine::Utf8Bytes => Ok(BYTES_JSON.to_owned()),
        }
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
