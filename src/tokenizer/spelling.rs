//! The UTF-8 bytes each token stands for: what a byte-level ∞-gram needs to give a token of any
//! tokenizer a probability (the chain rule over its bytes, `index::bytes`).

use std::collections::HashMap;

use super::{BYTE_EOS, BYTE_VOCAB_SIZE};

/// What a token puts in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spelling {
    /// These bytes (a byte-fallback token's single byte, which may be part of a character, included).
    Bytes(Box<[u8]>),
    /// The end of a document: the tokenizer's eos, a byte index's separator.
    EndOfText,
    /// No text at all (BOS, chat markers, padding): the reference data has nothing to say of it.
    Nothing,
}

impl Spelling {
    /// The bytes of text the token stands for (none for an end of text or a control token).
    pub fn bytes(&self) -> &[u8] {
        match self {
            Spelling::Bytes(b) => b,
            _ => &[],
        }
    }

    pub fn byte_len(&self) -> usize {
        self.bytes().len()
    }
}

/// Spellings of a Hugging Face tokenizer's ids, in id order. Byte-level BPE (GPT-2, SmolLM2) writes
/// bytes as printable characters, undone with [`byte_level_table`]; SentencePiece-style vocabularies
/// (Gemma) write a space as `▁` and a byte they cannot spell as `<0xNN>`. Added tokens marked
/// special stand for no text; other added tokens for their content, written as the vocabulary's.
pub(super) fn of_vocabulary(tok: &tokenizers::Tokenizer, eos: Option<u32>) -> Vec<Spelling> {
    // Byte-level when its decoder is, or holds, the byte-level one.
    let byte_level = serde_json::to_string(&tok.get_decoder())
        .is_ok_and(|decoder| decoder.contains("\"ByteLevel\""));
    let table = byte_level_table();
    let added = tok.get_added_tokens_decoder();
    (0..tok.get_vocab_size(true) as u32)
        .map(|id| {
            if Some(id) == eos {
                return Spelling::EndOfText;
            }
            if let Some(token) = added.get(&id) {
                return match (token.special, byte_level) {
                    (true, _) => Spelling::Nothing,
                    (false, true) => Spelling::Bytes(token.content.as_bytes().into()),
                    // Gemma's runs of spaces are added tokens written with `▁` too.
                    (false, false) => Spelling::Bytes(sentencepiece_bytes(&token.content).into()),
                };
            }
            let Some(piece) = tok.id_to_token(id) else {
                return Spelling::Nothing;
            };
            let bytes = if byte_level {
                piece.chars().map(|c| table.get(&c).copied()).collect()
            } else {
                Some(sentencepiece_bytes(&piece))
            };
            bytes.map_or(Spelling::Nothing, |b: Vec<u8>| Spelling::Bytes(b.into()))
        })
        .collect()
}

/// The ids of `tokens` that spell text (bytes UTF-8 may hold), sorted by spelling; of ids that
/// spell alike, the one `canonical(bytes, ids)` picks.
pub(super) fn order<'a>(
    tokens: impl Iterator<Item = (u32, &'a Spelling)>,
    canonical: impl Fn(&[u8], &[u32]) -> u32,
) -> Vec<u32> {
    let mut spelled: Vec<(&[u8], u32)> = tokens
        .filter_map(|(id, s)| match s {
            Spelling::Bytes(b) if !b.is_empty() && b.iter().all(|&x| x < 0xFE) => {
                Some((&b[..], id))
            }
            _ => None,
        })
        .collect();
    spelled.sort_unstable();
    spelled
        .chunk_by(|a, b| a.0 == b.0)
        .map(|alike| match alike {
            [(_, id)] => *id,
            _ => {
                let ids: Vec<u32> = alike.iter().map(|&(_, id)| id).collect();
                canonical(alike[0].0, &ids)
            }
        })
        .collect()
}

/// The byte tokenizer's spellings: each id its own byte, [`BYTE_EOS`] the end of text.
pub(super) fn of_bytes() -> Vec<Spelling> {
    (0..BYTE_VOCAB_SIZE as u32)
        .map(|id| match id {
            BYTE_EOS => Spelling::EndOfText,
            b => Spelling::Bytes(Box::new([b as u8])),
        })
        .collect()
}

/// `▁` is a space; `<0xNN>` is the byte NN (byte fallback).
fn sentencepiece_bytes(piece: &str) -> Vec<u8> {
    let byte = piece
        .strip_prefix("<0x")
        .and_then(|rest| rest.strip_suffix('>'))
        .filter(|hex| hex.len() == 2)
        .and_then(|hex| u8::from_str_radix(hex, 16).ok());
    match byte {
        Some(b) => vec![b],
        None => piece.replace('▁', " ").into_bytes(),
    }
}

/// Byte-level BPE's alphabet read backwards: printable Latin-1 bytes (`!`–`~`, `¡`–`¬`, `®`–`ÿ`) are
/// written as themselves, and the other 68 bytes, in order, as the characters from U+0100 on.
fn byte_level_table() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
            };
            (c, b)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet_is_a_bijection_with_gpt2_landmarks() {
        let table = byte_level_table();
        assert_eq!(table.len(), 256);
        // GPT-2 writes a space as Ġ (U+0120) and a newline as Ċ (U+010A).
        assert_eq!(table[&'Ġ'], b' ');
        assert_eq!(table[&'Ċ'], b'\n');
        assert_eq!(table[&'a'], b'a');
    }

    #[test]
    fn sentencepiece_pieces() {
        assert_eq!(sentencepiece_bytes("▁the"), b" the");
        assert_eq!(sentencepiece_bytes("<0x0A>"), b"\n");
        assert_eq!(sentencepiece_bytes("<0xZZ>"), b"<0xZZ>");
    }
}
