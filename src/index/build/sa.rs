//! Suffix-array construction with libsais, in the reference engine's order: suffixes compared by the
//! bytes of their little-endian tokens. Comparing byte-swapped (big-endian) token values compares
//! exactly those bytes, so each width sorts its swapped tokens:
//! u8 as bytes, u16 with libsais16, u32 re-coded to dense i32 ranks for libsais's integer alphabet.

use std::collections::HashMap;
use std::io::Write;

use libsais::{SuffixArrayConstruction, ThreadCount};

use crate::index::format::TokenWidth;
use crate::index::pages;
use crate::index::{IndexError, Result};

/// A part's tokens in RAM while it is built, in their own width.
pub enum TokenBuf {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
}

/// Most tokens in one part: libsais's 32-bit suffix arrays (4 bytes a token while building).
pub const MAX_PART_TOKENS: u64 = i32::MAX as u64 - 1;

impl TokenBuf {
    pub fn new(width: TokenWidth) -> Self {
        match width {
            TokenWidth::U8 => TokenBuf::U8(Vec::new()),
            TokenWidth::U16 => TokenBuf::U16(Vec::new()),
            TokenWidth::U32 => TokenBuf::U32(Vec::new()),
        }
    }

    /// Tokens from their little-endian bytes (a `tokenized.N` file); a partial token at the end
    /// is left out.
    pub fn from_le_bytes(width: TokenWidth, bytes: &[u8]) -> Self {
        match width {
            TokenWidth::U8 => TokenBuf::U8(bytes.to_vec()),
            TokenWidth::U16 => TokenBuf::U16(
                (bytes.chunks_exact(2))
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            TokenWidth::U32 => TokenBuf::U32(
                (bytes.chunks_exact(4))
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            TokenBuf::U8(v) => v.len(),
            TokenBuf::U16(v) => v.len(),
            TokenBuf::U32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token `i`.
    pub fn get(&self, i: usize) -> u32 {
        match self {
            TokenBuf::U8(v) => v[i] as u32,
            TokenBuf::U16(v) => v[i] as u32,
            TokenBuf::U32(v) => v[i],
        }
    }

    /// The tokens in reverse order, in place.
    pub fn reverse(&mut self) {
        match self {
            TokenBuf::U8(v) => v.reverse(),
            TokenBuf::U16(v) => v.reverse(),
            TokenBuf::U32(v) => v.reverse(),
        }
    }

    /// Appends tokens; the caller has checked that they fit the width.
    pub fn extend(&mut self, tokens: &[u32]) {
        match self {
            TokenBuf::U8(v) => v.extend(tokens.iter().map(|&t| t as u8)),
            TokenBuf::U16(v) => v.extend(tokens.iter().map(|&t| t as u16)),
            TokenBuf::U32(v) => v.extend_from_slice(tokens),
        }
    }

    /// Writes the tokens little-endian: the `tokenized.N` file.
    pub fn write_le(&self, out: &mut impl Write) -> std::io::Result<()> {
        const CHUNK: usize = 1 << 16;
        let mut bytes = Vec::with_capacity(CHUNK * 4);
        macro_rules! write_all {
            ($v:expr) => {
                for chunk in $v.chunks(CHUNK) {
                    bytes.clear();
                    chunk
                        .iter()
                        .for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
                    out.write_all(&bytes)?;
                }
            };
        }
        match self {
            TokenBuf::U8(v) => out.write_all(v)?,
            TokenBuf::U16(v) => write_all!(v),
            TokenBuf::U32(v) => write_all!(v),
        }
        Ok(())
    }

    /// The tokens in memory advised for huge pages (a copy), reversed when `reversed`: a suffix
    /// sorter reads its text at random. Made before the sorter writes its own memory (a zeroed
    /// allocation this large takes none until written), so the copy stays within a build's budget.
    pub fn for_random_reads(self, reversed: bool) -> TokenBuf {
        fn copy<T: Copy>(tokens: Vec<T>, reversed: bool) -> Vec<T> {
            let mut out = pages::for_random_reads(tokens.len());
            match reversed {
                true => out.extend(tokens.iter().rev()),
                false => out.extend_from_slice(&tokens),
            }
            out
        }
        match self {
            TokenBuf::U8(v) => TokenBuf::U8(copy(v, reversed)),
            TokenBuf::U16(v) => TokenBuf::U16(copy(v, reversed)),
            TokenBuf::U32(v) => TokenBuf::U32(copy(v, reversed)),
        }
    }

    /// Consumes the tokens and returns their suffix array (token positions), built in memory
    /// advised for huge pages.
    pub fn into_suffix_array(self, threads: u16) -> Result<Vec<i32>> {
        if self.len() as u64 > MAX_PART_TOKENS {
            return Err(IndexError::Invalid(format!(
                "a part of {} tokens exceeds {MAX_PART_TOKENS}",
                self.len()
            )));
        }
        let n = self.len();
        let threads = ThreadCount::fixed(threads.max(1));
        let sais_error =
            |e| IndexError::Invalid(format!("suffix array construction failed: {e:?}"));
        let extra = match self {
            TokenBuf::U32(_) => integer_alphabet_room(n),
            _ => 0,
        };
        let mut sa = pages::zeroed_for_random_writes(n + extra);
        // 4-byte tokens are re-coded into a new, advised array anyway; others are copied into one.
        let text = match self {
            TokenBuf::U32(_) => self,
            narrower => narrower.for_random_reads(false),
        };
        match text {
            TokenBuf::U8(text) => SuffixArrayConstruction::for_text(&text[..])
                .in_borrowed_buffer(&mut sa[..])
                .multi_threaded(threads)
                .run()
                .map(drop)
                .map_err(sais_error)?,
            TokenBuf::U16(mut text) => {
                text.iter_mut().for_each(|t| *t = t.swap_bytes());
                SuffixArrayConstruction::for_text(&text[..])
                    .in_borrowed_buffer(&mut sa[..])
                    .multi_threaded(threads)
                    .run()
                    .map(drop)
                    .map_err(sais_error)?
            }
            TokenBuf::U32(text) => {
                let (mut ranks, alphabet) = dense_byte_order_ranks(&text);
                drop(text);
                let construction = SuffixArrayConstruction::for_text_mut(&mut ranks[..])
                    .in_borrowed_buffer(&mut sa[..])
                    .multi_threaded(threads);
                // SAFETY: `dense_byte_order_ranks` yields values in 0..alphabet only.
                let construction = unsafe {
                    construction
                        .with_alphabet_size(libsais::suffix_array::AlphabetSize::new(alphabet))
                };
                construction.run().map(drop).map_err(sais_error)?
            }
        }
        sa.truncate(n);
        Ok(sa)
    }
}

/// Room beyond `n` suffixes that libsais recommends for an integer alphabet's recursion, short
/// of what an i32 can count (a part may hold up to `MAX_PART_TOKENS`).
fn integer_alphabet_room(n: usize) -> usize {
    let room = <i32 as libsais::InputElement>::RECOMMENDED_EXTRA_SPACE;
    room.min((i32::MAX as usize).saturating_sub(n))
}

/// Re-codes u32 tokens as their rank among the distinct byte-swapped values (the same order, an
/// alphabet as small as the vocabulary actually used), in memory advised for huge pages.
fn dense_byte_order_ranks(text: &[u32]) -> (Vec<i32>, i32) {
    let mut distinct: Vec<u32> = {
        let mut seen = std::collections::HashSet::new();
        text.iter().for_each(|t| {
            seen.insert(t.swap_bytes());
        });
        seen.into_iter().collect()
    };
    distinct.sort_unstable();
    let rank: HashMap<u32, i32> = distinct
        .iter()
        .enumerate()
        .map(|(i, &v)| (v, i as i32))
        .collect();
    let mut ranks = pages::for_random_reads(text.len());
    ranks.extend(text.iter().map(|t| rank[&t.swap_bytes()]));
    (ranks, distinct.len() as i32)
}

/// Writes the suffix array as byte offsets of `ptr_size` bytes each: the `table.N` file.
pub fn write_table(
    sa: &[i32],
    width: TokenWidth,
    ptr_size: usize,
    out: &mut impl Write,
) -> std::io::Result<()> {
    const CHUNK: usize = 1 << 16;
    let w = width.bytes() as u64;
    let mut bytes = Vec::with_capacity(CHUNK * ptr_size);
    for chunk in sa.chunks(CHUNK) {
        bytes.clear();
        for &pos in chunk {
            bytes.extend_from_slice(&(pos as u64 * w).to_le_bytes()[..ptr_size]);
        }
        out.write_all(&bytes)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part of the most tokens an i32 can count still gets a suffix array buffer it can count.
    #[test]
    fn an_integer_alphabet_room_stays_within_i32() {
        let most = MAX_PART_TOKENS as usize;
        assert!(most + integer_alphabet_room(most) <= i32::MAX as usize);
        assert_eq!(
            integer_alphabet_room(1_000),
            <i32 as libsais::InputElement>::RECOMMENDED_EXTRA_SPACE
        );
    }

    /// Brute force: sort token positions by the bytes of the little-endian suffix.
    fn brute(tokens: &[u32], width: TokenWidth) -> Vec<i32> {
        let mut bytes = Vec::new();
        width.encode_into(tokens, &mut bytes);
        let w = width.bytes();
        let mut pos: Vec<i32> = (0..tokens.len() as i32).collect();
        pos.sort_by(|&a, &b| bytes[a as usize * w..].cmp(&bytes[b as usize * w..]));
        pos
    }

    #[test]
    fn byte_order_for_every_width() {
        // Values whose numeric and byte orders differ: 0x0100 < 0x00FF numerically reversed in bytes.
        let tokens = [
            0x0100u32, 0x00FF, 0x0001, 0x0100, 0xFFFF, 0x0203, 0x00FF, 0x0100, 0x0001,
        ];
        for width in [TokenWidth::U16, TokenWidth::U32] {
            let mut buf = TokenBuf::new(width);
            buf.extend(&tokens);
            assert_eq!(
                buf.into_suffix_array(1).unwrap(),
                brute(&tokens, width),
                "{width:?}"
            );
        }
        let small: Vec<u32> = tokens.iter().map(|t| t & 0xFF).collect();
        let mut buf = TokenBuf::new(TokenWidth::U8);
        buf.extend(&small);
        assert_eq!(
            buf.into_suffix_array(2).unwrap(),
            brute(&small, TokenWidth::U8)
        );
    }

    #[test]
    fn u32_tokens_above_i32_range() {
        let tokens = [
            u32::MAX,
            0x8000_0001,
            5,
            0x8000_0001,
            5,
            u32::MAX,
            0x0100_0000,
        ];
        let mut buf = TokenBuf::new(TokenWidth::U32);
        buf.extend(&tokens);
        assert_eq!(
            buf.into_suffix_array(1).unwrap(),
            brute(&tokens, TokenWidth::U32)
        );
    }
}
