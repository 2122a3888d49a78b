//! The ones and offset bits before a block of a line: its classes' steps summed over the blocks
//! before it. A loop of up to 55 table reads, ended by a mispredicted branch, was 45% of a rank
//! over cached bits; with AVX2 the sum is a few vector instructions and no branch.

use super::{Line, CLASS_STEPS};

/// Ones and offset bits of the first `within < LINE_BLOCKS` blocks of `line`.
pub(super) fn before(line: &Line, within: usize) -> (u64, u64) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { x86::before(line, within) };
    }
    by_table(line, within)
}

fn by_table(line: &Line, within: usize) -> (u64, u64) {
    let steps: u32 = line.classes[..within]
        .iter()
        .map(|&k| CLASS_STEPS[k as usize])
        .sum();
    (u64::from(steps & 0xFFFF), u64::from(steps >> 16))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::index::fm::bits::{offset_width, Line, LINE_BLOCKS};

    /// Offset widths of the blocks with `m` marked bits, `m < 16` and `16 ≤ m < 32`, as byte
    /// lookup tables (a block of class `k` has `min(k, 64 - k)` marked bits, so a class below 33
    /// is its own marked count).
    const fn widths(from: u8) -> [u8; 16] {
        let mut t = [0u8; 16];
        let mut m = 0;
        while m < 16 {
            t[m] = offset_width(from + m as u8);
            m += 1;
        }
        t
    }

    static LOW: [u8; 16] = widths(0);
    static HIGH: [u8; 16] = widths(16);
    /// The width of 32 marked bits over that of 16, which the `HIGH` lookup gives for 32.
    const HALF_EXTRA: u8 = offset_width(32) - offset_width(16);

    /// Bytes 0 to 63 of a line, for masking the classes before a block.
    static POSITIONS: [u8; 64] = {
        let mut p = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            p[i] = i as u8;
            i += 1;
        }
        p
    };

    /// [`super::before`] in AVX2: the line's 64 bytes in two registers, the bytes of classes
    /// before the block kept, their ones summed by `psadbw`, their widths looked up by `pshufb`
    /// and summed the same way.
    ///
    /// # Safety
    /// The CPU supports AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn before(line: &Line, within: usize) -> (u64, u64) {
        debug_assert!(within < LINE_BLOCKS);
        let first_class = std::mem::offset_of!(Line, classes) as i8;
        let bytes = (line as *const Line).cast::<__m256i>();
        let positions = POSITIONS.as_ptr().cast::<__m256i>();
        // SAFETY: a Line is 64 bytes aligned to 64, and so is read as two aligned 32-byte halves;
        // POSITIONS holds 64 bytes, read unaligned.
        let (halves, at) = unsafe {
            (
                [_mm256_load_si256(bytes), _mm256_load_si256(bytes.add(1))],
                [
                    _mm256_loadu_si256(positions),
                    _mm256_loadu_si256(positions.add(1)),
                ],
            )
        };
        let end = _mm256_set1_epi8(first_class + within as i8);
        let start = _mm256_set1_epi8(first_class - 1);
        let table = |t: &[u8; 16]| {
            // SAFETY: 16 bytes read unaligned from a 16-byte array.
            _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(t.as_ptr().cast()) })
        };
        let (low, high) = (table(&LOW), table(&HIGH));
        let (mut ones, mut bits) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for (half, at) in halves.into_iter().zip(at) {
            let kept = _mm256_and_si256(_mm256_cmpgt_epi8(end, at), _mm256_cmpgt_epi8(at, start));
            let classes = _mm256_and_si256(half, kept);
            // Marked bits: a block of more than 32 ones is coded by its zeros.
            let marked = _mm256_min_epu8(classes, _mm256_sub_epi8(_mm256_set1_epi8(64), classes));
            // `pshufb` gives 0 where an index has its top bit set: below 16 marked bits LOW
            // answers (adding 0x70 to 16 or more sets the top bit), from 16 to 31 HIGH (below
            // 16, subtracting 16 wraps to a set top bit), and 32 reads HIGH's first entry, made
            // up for by HALF_EXTRA.
            let widths = _mm256_add_epi8(
                _mm256_add_epi8(
                    _mm256_shuffle_epi8(low, _mm256_adds_epu8(marked, _mm256_set1_epi8(0x70))),
                    _mm256_shuffle_epi8(high, _mm256_sub_epi8(marked, _mm256_set1_epi8(16))),
                ),
                _mm256_and_si256(
                    _mm256_cmpeq_epi8(marked, _mm256_set1_epi8(32)),
                    _mm256_set1_epi8(HALF_EXTRA as i8),
                ),
            );
            let zero = _mm256_setzero_si256();
            ones = _mm256_add_epi64(ones, _mm256_sad_epu8(classes, zero));
            bits = _mm256_add_epi64(bits, _mm256_sad_epu8(widths, zero));
        }
        (lanes_sum(ones), lanes_sum(bits))
    }

    /// The sum of four u64 lanes.
    #[target_feature(enable = "avx2")]
    fn lanes_sum(v: __m256i) -> u64 {
        let two = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        (_mm_cvtsi128_si64(two) + _mm_extract_epi64::<1>(two)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::super::LINE_BLOCKS;
    use super::*;
    use proptest::prelude::*;

    /// Every class at every place of a line among classes of every kind, before every block.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_class_at_every_place_sums_as_the_table() {
        if !is_x86_feature_detected!("avx2") {
            println!("skipped: this CPU has no AVX2");
            return;
        }
        for k in 0..=64u8 {
            for place in 0..LINE_BLOCKS {
                let mut classes: [u8; LINE_BLOCKS] = std::array::from_fn(|i| (i * 29 % 65) as u8);
                classes[place] = k;
                let line = Line {
                    rank: 7,
                    at: 9,
                    classes,
                };
                for within in 0..LINE_BLOCKS {
                    // SAFETY: the CPU has AVX2, checked above.
                    let vector = unsafe { x86::before(&line, within) };
                    assert_eq!(
                        vector,
                        by_table(&line, within),
                        "class {k} at {place}, {within}"
                    );
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    proptest! {
        /// Random lines of classes from 0 to 64, summed by the vector code and by the table,
        /// before every block.
        #[test]
        fn the_vector_sum_is_the_tables(
            classes in proptest::collection::vec(0u8..=64, LINE_BLOCKS),
            rank in any::<u32>(),
            at in any::<u32>(),
        ) {
            let mut line = Line { rank, at, classes: [0; LINE_BLOCKS] };
            line.classes.copy_from_slice(&classes);
            if !is_x86_feature_detected!("avx2") {
                println!("skipped: this CPU has no AVX2");
                return Ok(());
            }
            for within in 0..LINE_BLOCKS {
                // SAFETY: the CPU has AVX2, checked above.
                let vector = unsafe { x86::before(&line, within) };
                prop_assert_eq!(vector, by_table(&line, within), "{}", within);
            }
        }
    }
}
