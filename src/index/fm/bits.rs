//! A compressed bit vector with rank: each 64-bit block is stored as its number of ones (its
//! class) and its index among the blocks of that class (enumerative coding, RRR), so a block of
//! mostly equal bits takes a few bits instead of 64. The blocks of a wavelet tree built over a
//! Burrows-Wheeler transform are such blocks: the transform groups equal symbols, and this is
//! what brings the index below the text's size (Raman, Raman and Rao 2002; decoding on the fly as
//! Navarro and Providel 2012 do, with no tables per block).
//!
//! What a rank reads: one 64-byte line holding the classes of 56 blocks with the ones and the
//! stream offset before them, then the block's offset bits. A block of more than 32 ones is
//! coded by its zeros, and a block is decoded from its highest marked bit down only until the
//! bit asked about, so a decode takes at most 32 steps and usually far fewer.

mod line_sum;

use crate::index::fm::file::{WordReader, Words};
use crate::index::pages;
use crate::index::Result;

const BLOCK: u64 = 64;
/// Blocks a line describes: their 56 class bytes and two u32 (the ones and the stream offset
/// before them) fill one cache line.
const LINE_BLOCKS: usize = 56;
/// Rank pairs [`CompressedBits::rank1_pairs`] takes at once: their lines asked for together,
/// then their offsets, 32 reads each time, about as many misses as a core keeps pending.
pub(super) const PAIRS_TOGETHER: usize = 16;
/// Longest bit vector: its ranks and stream offsets must fit the lines' u32 (an FM part holds
/// fewer than 2^31 symbols).
const MAX_LEN: u64 = u32::MAX as u64;

/// Blocks of `n` bits with `k ≤ 32` marked: `CHOOSE[k][n] = C(n, k)`, read along `n` as a decode
/// does (every value fits a u64; the table fits the first-level cache).
const fn choose() -> [[u64; 65]; 33] {
    let mut c = [[0u64; 65]; 33];
    let mut n = 0;
    while n <= 64 {
        c[0][n] = 1;
        let mut k = 1;
        while k <= 32 && k <= n {
            c[k][n] = c[k - 1][n - 1] + c[k][n - 1];
            k += 1;
        }
        n += 1;
    }
    c
}
static CHOOSE: [[u64; 65]; 33] = choose();

/// Per class `k`: the bits of a block's offset (enough for `C(64, k)` values) shifted left by 16,
/// plus `k`, so one sum over a line's classes gives both the ones and the offset bits before a
/// block.
const fn class_steps() -> [u32; 65] {
    let c = choose();
    let mut steps = [0u32; 65];
    let mut k = 0;
    while k <= 64 {
        let marked = if k <= 32 { k } else { 64 - k };
        let count = c[marked][64];
        let width = if count <= 1 {
            0
        } else {
            64 - (count - 1).leading_zeros()
        };
        steps[k] = (width << 16) | k as u32;
        k += 1;
    }
    steps
}
const CLASS_STEPS: [u32; 65] = class_steps();

const fn offset_width(class: u8) -> u8 {
    (CLASS_STEPS[class as usize] >> 16) as u8
}

/// The index of `block` among the 64-bit values with as many ones, coded by its ones or, past 32
/// ones, its zeros (combinatorial number system: the sum of C(p, j) over its j-th lowest marked
/// bit at position p).
fn encode(block: u64) -> u64 {
    let mut rest = if block.count_ones() > 32 {
        !block
    } else {
        block
    };
    let (mut offset, mut j) = (0u64, 1usize);
    while rest != 0 {
        let p = rest.trailing_zeros() as usize;
        offset += CHOOSE[j][p];
        rest &= rest - 1;
        j += 1;
    }
    offset
}

/// Of the `marked ≤ 32` bits coded by `offset`: how many lie below bit `r`, and whether bit `r`
/// is one of them. Marked bits are found from the highest down, so the decode stops at `r`.
fn marked_below(mut offset: u64, marked: usize, r: usize) -> (u64, bool) {
    let (mut j, mut p) = (marked, 64usize);
    while j > 0 {
        // The highest remaining marked bit is the largest p with C(p, j) ≤ offset (C(p, j) is
        // 0 for p < j, so p stops there at the latest).
        let row = &CHOOSE[j];
        p -= 1;
        while row[p] > offset {
            p -= 1;
        }
        if p <= r {
            return ((j - usize::from(p == r)) as u64, p == r);
        }
        offset -= row[p];
        j -= 1;
    }
    (0, false)
}

/// Reads `width` ≤ 64 bits at bit `at` of `words`.
fn read_bits(words: &[u64], at: u64, width: u8) -> u64 {
    if width == 0 {
        return 0;
    }
    let (word, shift) = ((at / 64) as usize, at % 64);
    let mut value = words[word] >> shift;
    if shift + width as u64 > 64 {
        value |= words[word + 1] << (64 - shift);
    }
    if width == 64 {
        value
    } else {
        value & ((1u64 << width) - 1)
    }
}

/// The classes of `LINE_BLOCKS` blocks and what comes before them, in one cache line.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq)]
struct Line {
    /// Ones before the line's first block.
    rank: u32,
    /// Bit position in the offsets of the line's first block.
    at: u32,
    classes: [u8; LINE_BLOCKS],
}

/// The lines over `classes`: `None` when the ones or offset bits outgrow a line's u32.
fn lines_of(classes: &[u8]) -> Option<(Vec<Line>, u64, u64)> {
    let mut lines = pages::for_random_reads(classes.len().div_ceil(LINE_BLOCKS));
    let (mut ones, mut bits) = (0u64, 0u64);
    for chunk in classes.chunks(LINE_BLOCKS) {
        let mut line = Line {
            rank: u32::try_from(ones).ok()?,
            at: u32::try_from(bits).ok()?,
            classes: [0; LINE_BLOCKS],
        };
        line.classes[..chunk.len()].copy_from_slice(chunk);
        for &k in chunk {
            ones += u64::from(k);
            bits += u64::from(offset_width(k.min(64)));
        }
        lines.push(line);
    }
    Some((lines, ones, bits))
}

/// A rank between [`CompressedBits::begin`] and [`CompressedBits::finish`]: its block's class,
/// the ones before the block, the bit position of its offset and the bit asked about in it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    k: u8,
    ones: u64,
    at: u64,
    r: usize,
}

/// Immutable bits with `rank1` and `get`, in about `n·H0` bits per block plus 1/7 for classes.
#[derive(Debug, Clone, PartialEq)]
pub struct CompressedBits {
    len: u64,
    ones: u64,
    lines: Vec<Line>,
    offsets: Vec<u64>,
}

impl CompressedBits {
    /// Compresses the first `len ≤ 2^32 - 1` bits of `words` (bit i is bit i % 64 of word
    /// i / 64).
    pub fn new(words: &[u64], len: u64) -> Self {
        debug_assert!(
            len <= MAX_LEN,
            "{len} bits: more than a line's u32 can count"
        );
        let blocks = len.div_ceil(BLOCK) as usize;
        let mut classes = Vec::with_capacity(blocks);
        let mut offsets = Vec::new();
        let mut at = 0u64;
        for &word in words.iter().take(blocks) {
            let k = word.count_ones() as u8;
            classes.push(k);
            let width = offset_width(k);
            if width > 0 {
                let offset = encode(word);
                let (w, shift) = ((at / 64) as usize, at % 64);
                while offsets.len() <= w + 1 {
                    offsets.push(0);
                }
                offsets[w] |= offset << shift;
                if shift + width as u64 > 64 {
                    offsets[w + 1] |= offset >> (64 - shift);
                }
            }
            at += width as u64;
        }
        offsets.resize(at.div_ceil(64) as usize + 1, 0);
        let (lines, ones, _) = lines_of(&classes).unwrap_or_default();
        CompressedBits {
            len,
            ones,
            lines,
            offsets,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Block `b`'s line, class, the ones before it and its offset's bit position.
    fn locate(&self, b: usize) -> (u8, u64, u64) {
        let line = &self.lines[b / LINE_BLOCKS];
        let within = b % LINE_BLOCKS;
        let (ones, bits) = line_sum::before(line, within);
        (
            line.classes[within],
            line.rank as u64 + ones,
            line.at as u64 + bits,
        )
    }

    /// Starts a rank at `i`: finds its block in the block's line and asks for the block's
    /// offset, which [`CompressedBits::finish`] decodes once it has arrived; `None` past the end.
    pub(super) fn begin(&self, i: u64) -> Option<Pending> {
        let b = i / BLOCK;
        if b >= self.len.div_ceil(BLOCK) {
            return None;
        }
        let (k, ones, at) = self.locate(b as usize);
        let r = (i % BLOCK) as usize;
        if r > 0 && offset_width(k) > 0 {
            if let Some(word) = self.offsets.get((at / 64) as usize) {
                pages::prefetch(word);
            }
        }
        Some(Pending { k, ones, at, r })
    }

    /// Ones before a begun rank's bit and the bit itself (false past the end), from a partial
    /// block decode.
    pub(super) fn finish(&self, pending: Option<Pending>) -> (u64, bool) {
        let Some(Pending { k, ones, at, r }) = pending else {
            return (self.ones, false);
        };
        let read = || read_bits(&self.offsets, at, offset_width(k));
        let (below, bit) = match k {
            0 => (0, false),
            64 => (r as u64, true),
            1..=32 => marked_below(read(), k as usize, r),
            _ => {
                let (zeros, zero) = marked_below(read(), 64 - k as usize, r);
                (r as u64 - zeros, !zero)
            }
        };
        (ones + below, bit)
    }

    /// Ones before a begun rank's bit (no block is decoded at a block's start).
    fn finish_rank(&self, pending: Option<Pending>) -> u64 {
        match pending {
            Some(Pending { r: 0, ones, .. }) => ones,
            _ => self.finish(pending).0,
        }
    }

    /// Ones in `[0, i)` and the bit at `i` (false past the end).
    #[cfg(test)]
    fn rank1_and_get(&self, i: u64) -> (u64, bool) {
        self.finish(self.begin(i))
    }

    /// Ones in `[0, i)`, `i ≤ len`.
    pub fn rank1(&self, i: u64) -> u64 {
        self.finish_rank(self.begin(i))
    }

    /// Ones in `[0, lo)` and in `[0, hi)` of each `(bits, lo, hi)` asked, appended to `out`:
    /// every line asked for before any is read, and every offset before any is decoded, so that
    /// all the ranks wait for memory once, not one after another.
    pub fn rank1_pairs(asks: &[(&CompressedBits, u64, u64)], out: &mut Vec<(u64, u64)>) {
        for asks in asks.chunks(PAIRS_TOGETHER) {
            for &(bits, lo, hi) in asks {
                bits.prefetch(lo);
                bits.prefetch(hi);
            }
            let pending: [_; PAIRS_TOGETHER] = std::array::from_fn(|a| {
                asks.get(a)
                    .map(|&(bits, lo, hi)| (bits.begin(lo), bits.begin(hi)))
            });
            let begun = asks.iter().zip(pending.into_iter().flatten());
            out.extend(
                begun.map(|(&(bits, ..), (lo, hi))| (bits.finish_rank(lo), bits.finish_rank(hi))),
            );
        }
    }

    /// Asks for the line a rank at `i` reads first.
    pub fn prefetch(&self, i: u64) {
        if let Some(line) = self.lines.get((i / BLOCK) as usize / LINE_BLOCKS) {
            pages::prefetch(line);
        }
    }

    /// Bytes these bits occupy in memory (their file keeps the classes, not the lines).
    pub fn size_bytes(&self) -> u64 {
        (std::mem::size_of::<Line>() * self.lines.len() + 8 * (2 + self.offsets.len())) as u64
    }

    pub fn write(&self, out: &mut Words) {
        out.u64(self.len);
        out.u64(self.ones);
        let blocks = self.len.div_ceil(BLOCK) as usize;
        let classes: Vec<u8> = self
            .lines
            .iter()
            .flat_map(|line| line.classes)
            .take(blocks)
            .collect();
        out.bytes(&classes);
        out.u64s(&self.offsets);
    }

    /// Reads bits written by [`CompressedBits::write`], checking that every part agrees with the
    /// others, so that no later rank reads past an array.
    pub fn read(input: &mut WordReader) -> Result<Self> {
        let len = input.u64()?;
        let ones = input.u64()?;
        let classes = input.bytes()?;
        let offsets = input.u64s()?;
        // The lines are computed from the classes, not stored: a block's rank can then never
        // read past the offsets, whatever the file held.
        let lines = lines_of(&classes);
        let consistent = len <= MAX_LEN
            && classes.len() as u64 == len.div_ceil(BLOCK)
            && classes.iter().all(|&k| k <= 64)
            && lines.as_ref().is_some_and(|&(_, counted, bits)| {
                counted == ones && offsets.len() as u64 == bits.div_ceil(64) + 1
            });
        let (Some((lines, _, _)), true) = (lines, consistent) else {
            return input.corrupt("a compressed bit vector's parts disagree");
        };
        Ok(CompressedBits {
            len,
            ones,
            lines,
            offsets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn blocks_of_every_class_answer_every_bit() {
        let mut blocks = vec![
            0u64,
            1,
            u64::MAX,
            1 << 63,
            0xF0F0_0000_1234_8001,
            u64::MAX - 1,
        ];
        // One block of each class, its ones spread.
        blocks.extend((1..64).map(|k| (0..k).fold(0u64, |b, j| b | 1 << (j * 61 % 64))));
        for block in blocks {
            let k = block.count_ones() as usize;
            let offset = encode(block);
            let marked = k.min(64 - k);
            assert!(offset < CHOOSE[marked][64].max(1), "{block:x}");
            for r in 0..64 {
                let (below, bit) = match k {
                    0 => (0, false),
                    64 => (r as u64, true),
                    1..=32 => marked_below(offset, k, r),
                    _ => {
                        let (zeros, zero) = marked_below(offset, 64 - k, r);
                        (r as u64 - zeros, !zero)
                    }
                };
                let low = block & ((1u64 << r) - 1);
                assert_eq!(
                    (below, bit),
                    (low.count_ones() as u64, block >> r & 1 == 1),
                    "{block:x} at {r}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn rank_and_get_agree_with_counting(
            density in 0.0f64..1.0,
            bits in proptest::collection::vec(0u32..1000, 0..9000),
        ) {
            let bits: Vec<bool> = bits.iter().map(|&x| (x as f64) < density * 1000.0).collect();
            let mut words = vec![0u64; bits.len().div_ceil(64)];
            (0..bits.len()).filter(|&i| bits[i]).for_each(|i| words[i / 64] |= 1 << (i % 64));
            let packed = CompressedBits::new(&words, bits.len() as u64);
            let mut ones = 0u64;
            for (i, &bit) in bits.iter().enumerate() {
                prop_assert_eq!(packed.rank1_and_get(i as u64), (ones, bit));
                prop_assert_eq!(packed.rank1(i as u64), ones);
                ones += bit as u64;
            }
            prop_assert_eq!(packed.rank1(bits.len() as u64), ones);
            // Pairs taken together answer as ranks taken one by one (more than a batch of
            // them, from two vectors).
            let flipped: Vec<u64> = words.iter().map(|w| !w).collect();
            let other = CompressedBits::new(&flipped, 64 * words.len() as u64);
            let count = |ws: &[u64], i: u64| (0..i).filter(|&j| ws[j as usize / 64] >> (j % 64) & 1 == 1).count() as u64;
            let n = bits.len() as u64;
            let asks: Vec<_> = (0..=n).step_by(97).flat_map(|i| [(i, n - i, false), (i / 2, i, true)]).collect();
            let vectors: Vec<_> = asks
                .iter()
                .map(|&(lo, hi, flip)| (if flip { &other } else { &packed }, lo, hi))
                .collect();
            let mut got = Vec::new();
            CompressedBits::rank1_pairs(&vectors, &mut got);
            let expected: Vec<_> = asks
                .iter()
                .map(|&(lo, hi, flip)| {
                    let ws = if flip { &flipped } else { &words };
                    (count(ws, lo), count(ws, hi))
                })
                .collect();
            prop_assert_eq!(got, expected);
            let mut words = Words::default();
            packed.write(&mut words);
            let bytes = words.into_bytes();
            let read = CompressedBits::read(&mut WordReader::new(&bytes, "test")).unwrap();
            prop_assert_eq!(read, packed);
        }
    }
}
