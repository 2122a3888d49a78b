//! A compressed bit vector with rank: each 64-bit block is stored as its number of ones (its
//! class) and its index among the blocks of that class (enumerative coding, RRR), so a block of
//! mostly equal bits takes a few bits instead of 64. The blocks of a wavelet tree built over a
//! Burrows-Wheeler transform are such blocks: the transform groups equal symbols, and this is
//! what brings the index below the text's size (Raman, Raman and Rao 2002; decoding on the fly as
//! Navarro and Providel 2012 do, with no tables per block).

use crate::index::fm::file::{WordReader, Words};
use crate::index::Result;

const BLOCK: u64 = 64;
/// Blocks per sampled rank and stream offset: one pair per 4,096 bits keeps them near 3% of the
/// raw bits, for at most 63 class reads a rank.
const BLOCKS_PER_SAMPLE: usize = 64;

/// `binomial(n, k)` for n, k ≤ 64; every value fits a u64 (the largest, C(64, 32), is below 2^61).
const fn binomials() -> [[u64; 65]; 65] {
    let mut c = [[0u64; 65]; 65];
    let mut n = 0;
    while n <= 64 {
        c[n][0] = 1;
        let mut k = 1;
        while k <= n {
            c[n][k] = c[n - 1][k - 1] + if k < n { c[n - 1][k] } else { 0 };
            k += 1;
        }
        n += 1;
    }
    c
}
static BINOMIAL: [[u64; 65]; 65] = binomials();

/// Bits of the offset of a block with `k` ones: enough for `C(64, k)` values.
const fn offset_widths() -> [u8; 65] {
    let binomial = binomials();
    let mut w = [0u8; 65];
    let mut k = 0;
    while k <= 64 {
        let count = binomial[64][k];
        w[k] = if count <= 1 {
            0
        } else {
            (64 - (count - 1).leading_zeros()) as u8
        };
        k += 1;
    }
    w
}
const OFFSET_WIDTH: [u8; 65] = offset_widths();

/// The index of `block` among the 64-bit values with as many ones (combinatorial number system:
/// the sum of C(p, j) over its j-th lowest one at position p).
fn encode(block: u64) -> u64 {
    let (mut rest, mut offset, mut j) = (block, 0u64, 1usize);
    while rest != 0 {
        let p = rest.trailing_zeros() as usize;
        offset += BINOMIAL[p][j];
        rest &= rest - 1;
        j += 1;
    }
    offset
}

/// The block of `k` ones whose index is `offset` (the inverse of [`encode`]).
fn decode(mut offset: u64, k: usize) -> u64 {
    let (mut block, mut j, mut p) = (0u64, k, 64usize);
    while j > 0 {
        // The highest remaining one is the largest p with C(p, j) ≤ offset.
        p -= 1;
        while BINOMIAL[p][j] > offset {
            p -= 1;
        }
        block |= 1 << p;
        offset -= BINOMIAL[p][j];
        j -= 1;
    }
    block
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

/// Immutable bits with `rank1` and `get`, in about `n·H0` bits per block plus 1/8 for classes.
#[derive(Debug, Clone, PartialEq)]
pub struct CompressedBits {
    len: u64,
    ones: u64,
    classes: Vec<u8>,
    offsets: Vec<u64>,
    /// Ones before each sample's first block.
    sample_ranks: Vec<u64>,
    /// Bit position in `offsets` of each sample's first block.
    sample_at: Vec<u64>,
}

/// Appends bits one at a time, then compresses them.
#[derive(Default)]
pub struct BitsBuilder {
    words: Vec<u64>,
    len: u64,
}

impl BitsBuilder {
    pub fn push(&mut self, bit: bool) {
        if self.len.is_multiple_of(BLOCK) {
            self.words.push(0);
        }
        if bit {
            if let Some(last) = self.words.last_mut() {
                *last |= 1 << (self.len % BLOCK);
            }
        }
        self.len += 1;
    }

    pub fn finish(self) -> CompressedBits {
        CompressedBits::new(&self.words, self.len)
    }
}

impl CompressedBits {
    /// Compresses the first `len` bits of `words` (bit i is bit i % 64 of word i / 64).
    pub fn new(words: &[u64], len: u64) -> Self {
        let blocks = len.div_ceil(BLOCK) as usize;
        let mut classes = Vec::with_capacity(blocks);
        let mut offsets = Vec::new();
        let (mut sample_ranks, mut sample_at) = (Vec::new(), Vec::new());
        let (mut ones, mut at) = (0u64, 0u64);
        for (b, &word) in words.iter().take(blocks).enumerate() {
            if b % BLOCKS_PER_SAMPLE == 0 {
                sample_ranks.push(ones);
                sample_at.push(at);
            }
            let k = word.count_ones();
            classes.push(k as u8);
            let width = OFFSET_WIDTH[k as usize];
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
            ones += k as u64;
            at += width as u64;
        }
        offsets.resize(at.div_ceil(64) as usize + 1, 0);
        CompressedBits {
            len,
            ones,
            classes,
            offsets,
            sample_ranks,
            sample_at,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 64 bits of block `b`, with the ones before it.
    fn block(&self, b: usize) -> (u64, u64) {
        let sample = b / BLOCKS_PER_SAMPLE;
        let (mut ones, mut at) = (self.sample_ranks[sample], self.sample_at[sample]);
        for &k in &self.classes[sample * BLOCKS_PER_SAMPLE..b] {
            ones += k as u64;
            at += OFFSET_WIDTH[k as usize] as u64;
        }
        let k = self.classes[b] as usize;
        let bits = match k {
            0 => 0,
            64 => u64::MAX,
            _ => decode(read_bits(&self.offsets, at, OFFSET_WIDTH[k]), k),
        };
        (bits, ones)
    }

    /// Ones in `[0, i)` and the bit at `i` (false past the end), from one block decode.
    pub fn rank1_and_get(&self, i: u64) -> (u64, bool) {
        let b = (i / BLOCK) as usize;
        if b >= self.classes.len() {
            return (self.ones, false);
        }
        let (bits, ones) = self.block(b);
        let r = i % BLOCK;
        let below = bits & ((1u64 << r) - 1);
        (ones + below.count_ones() as u64, bits >> r & 1 == 1)
    }

    /// Ones in `[0, i)`, `i ≤ len` (no block is decoded at a block's start).
    pub fn rank1(&self, i: u64) -> u64 {
        let b = (i / BLOCK) as usize;
        if !i.is_multiple_of(BLOCK) || b >= self.classes.len() {
            return self.rank1_and_get(i).0;
        }
        let sample = b / BLOCKS_PER_SAMPLE;
        self.sample_ranks[sample]
            + self.classes[sample * BLOCKS_PER_SAMPLE..b]
                .iter()
                .map(|&k| k as u64)
                .sum::<u64>()
    }

    /// Bytes these bits occupy in memory (their file leaves the rank samples out).
    pub fn size_bytes(&self) -> u64 {
        (self.classes.len() + 8 * (2 + self.offsets.len() + 2 * self.sample_ranks.len())) as u64
    }

    pub fn write(&self, out: &mut Words) {
        out.u64(self.len);
        out.u64(self.ones);
        out.bytes(&self.classes);
        out.u64s(&self.offsets);
    }

    /// Reads bits written by [`CompressedBits::write`], checking that every part agrees with the
    /// others, so that no later rank reads past an array.
    pub fn read(input: &mut WordReader) -> Result<Self> {
        let len = input.u64()?;
        let ones = input.u64()?;
        let classes = input.bytes()?;
        let offsets = input.u64s()?;
        // The samples are computed from the classes, not stored: a block's rank can then never
        // read past the offsets, whatever the file held.
        let (mut ranks, mut at) = (Vec::new(), Vec::new());
        let (mut ones_seen, mut bits) = (0u64, 0u64);
        for (b, &k) in classes.iter().enumerate() {
            if b % BLOCKS_PER_SAMPLE == 0 {
                ranks.push(ones_seen);
                at.push(bits);
            }
            ones_seen += k as u64;
            bits += OFFSET_WIDTH[(k as usize).min(64)] as u64;
        }
        let consistent = classes.len() as u64 == len.div_ceil(BLOCK)
            && classes.iter().all(|&k| k <= 64)
            && ones_seen == ones
            && offsets.len() as u64 == bits.div_ceil(64) + 1;
        if !consistent {
            return input.corrupt("a compressed bit vector's parts disagree");
        }
        Ok(CompressedBits {
            len,
            ones,
            classes,
            offsets,
            sample_ranks: ranks,
            sample_at: at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_block_of_a_class_round_trips() {
        for block in [
            0u64,
            1,
            u64::MAX,
            1 << 63,
            0xF0F0_0000_1234_8001,
            u64::MAX - 1,
        ] {
            let k = block.count_ones() as usize;
            let offset = encode(block);
            assert!(offset < BINOMIAL[64][k], "{block:x}");
            assert_eq!(decode(offset, k), block, "{block:x}");
        }
    }

    proptest! {
        #[test]
        fn rank_and_get_agree_with_counting(
            bits in proptest::collection::vec(proptest::bool::weighted(0.15), 0..9000),
        ) {
            let mut builder = BitsBuilder::default();
            bits.iter().for_each(|&b| builder.push(b));
            let packed = builder.finish();
            let mut ones = 0u64;
            for (i, &bit) in bits.iter().enumerate() {
                prop_assert_eq!(packed.rank1_and_get(i as u64), (ones, bit));
                ones += bit as u64;
            }
            prop_assert_eq!(packed.rank1(bits.len() as u64), ones);
            let mut words = Words::default();
            packed.write(&mut words);
            let bytes = words.into_bytes();
            let read = CompressedBits::read(&mut WordReader::new(&bytes, "test")).unwrap();
            prop_assert_eq!(read, packed);
        }
    }
}
