//! One part of a compressed index: the FM-index of the part's tokens **reversed**.
//!
//! Why reversed. A row of this index is a position where a match *ends*, and what the ∞-gram
//! asks next is what follows that end: the symbol the Burrows-Wheeler transform holds at the row.
//! So a prompt's next-token counts are the symbols of its range (one wavelet descent per distinct
//! token, however many matches), a match grows to the right by one LF step (what a decoding
//! session does with every token), and the text after a match is read by LF steps too (drafts,
//! documents). A query is read left to right. The price: a forward FM-index's rows would be the
//! suffix array's own ranks, and these are not, so `find`'s rank ranges differ from a
//! suffix-array index's (their lengths agree); and the longest matching suffix of a prompt is a
//! binary search over its lengths, not one backward search. Both ways cost one transform; a
//! bidirectional index would cost two and break the size budget.
//!
//! Rows: `0..=n` for a part of `n` tokens. Row `r` stands for the reversed text's suffix at `q`
//! (row 0 for the empty suffix, `q = n`), that is the text's prefix `T[..n - q]`: a match that
//! ends at `e = n - q`. Rows sort as the suffix array sorts (little-endian token bytes), so the
//! rows of one first token are contiguous.

use crate::index::build::sa::{TokenBuf, MAX_PART_TOKENS};
use crate::index::fm::bits::{BitsBuilder, CompressedBits};
use crate::index::fm::file::{WordReader, Words};
use crate::index::fm::wavelet::HuffmanWavelet;
use crate::index::format::TokenWidth;
use crate::index::ranks::RankRange;
use crate::index::read::part::{NextKey, END};
use crate::index::{IndexError, Result};

/// Every `SAMPLE_EVERY`-th text position keeps its row's position, so locating a match walks at
/// most this many LF steps: 64 keeps the samples near 0.5 bits per token at 50 M tokens.
pub const SAMPLE_EVERY: u64 = 64;

/// Unsigned values of one bit width, packed.
#[derive(Debug, Clone, PartialEq)]
struct PackedInts {
    width: u8,
    len: u64,
    words: Vec<u64>,
}

impl PackedInts {
    fn new(values: &[u64]) -> Self {
        let max = values.iter().copied().max().unwrap_or(0);
        let width = (64 - max.leading_zeros()).max(1) as u8;
        let mut words = vec![0u64; (values.len() as u64 * width as u64).div_ceil(64) as usize + 1];
        for (i, &v) in values.iter().enumerate() {
            let at = i as u64 * width as u64;
            let (w, shift) = ((at / 64) as usize, at % 64);
            words[w] |= v << shift;
            if shift + width as u64 > 64 {
                words[w + 1] |= v >> (64 - shift);
            }
        }
        PackedInts {
            width,
            len: values.len() as u64,
            words,
        }
    }

    fn get(&self, i: u64) -> u64 {
        let at = i * self.width as u64;
        let (w, shift) = ((at / 64) as usize, at % 64);
        let mut v = self.words[w] >> shift;
        if shift + self.width as u64 > 64 {
            v |= self.words[w + 1] << (64 - shift);
        }
        if self.width == 64 {
            v
        } else {
            v & ((1u64 << self.width) - 1)
        }
    }

    fn size_bytes(&self) -> u64 {
        8 * self.words.len() as u64 + 16
    }

    fn write(&self, out: &mut Words) {
        out.u64(self.width as u64);
        out.u64(self.len);
        out.u64s(&self.words);
    }

    fn read(input: &mut WordReader) -> Result<Self> {
        let (width, len) = (input.u64()?, input.u64()?);
        let words = input.u64s()?;
        let bits = len.checked_mul(width);
        if !(1..=64).contains(&width)
            || bits.is_none_or(|bits| words.len() as u64 != bits.div_ceil(64) + 1)
        {
            return input.corrupt("a packed array's width or length disagrees with its words");
        }
        Ok(PackedInts {
            width: width as u8,
            len,
            words,
        })
    }
}

pub struct FmPart {
    width: TokenWidth,
    /// Tokens, separators included.
    n: u64,
    /// The transform, with the separator standing in at `end_row` (the row of the whole text,
    /// which no symbol precedes).
    bwt: HuffmanWavelet,
    end_row: u64,
    symbols: SymbolCounts,
    /// Rows whose text position is a multiple of `SAMPLE_EVERY`, and those positions / it, by row.
    sampled: CompressedBits,
    samples: PackedInts,
    /// Token offset of each document's separator.
    doc_starts: Vec<u64>,
    /// The row whose transform symbol is each document's first token.
    doc_rows: Vec<u64>,
    /// Each document's metadata line, when the index has them.
    metadata: Option<(Vec<u8>, Vec<u64>)>,
}

/// The order the suffix array sorts tokens in: their little-endian bytes.
fn byte_order(width: TokenWidth, token: u32) -> u32 {
    match width {
        TokenWidth::U8 => token,
        TokenWidth::U16 => (token as u16).swap_bytes() as u32,
        TokenWidth::U32 => token.swap_bytes(),
    }
}

/// What the transform's symbol counts give, derived from the tree when a part is built or read.
struct SymbolCounts {
    /// `(symbol, first row of the rows it starts)`, sorted by symbol.
    first_rows: Vec<(u32, u64)>,
    /// Every token's count, in the suffix array's order: the full range's next tokens, which
    /// the empty prompt and the gate's first position ask for (σ descents otherwise).
    unigram: Vec<(NextKey, u64)>,
}

/// The symbol counts of a transform, from the tree's counts less the stand-in at `end_row`:
/// `None` unless that row holds the separator and the counts fill the `n` rows after the empty
/// suffix's.
fn symbol_counts(
    width: TokenWidth,
    n: u64,
    bwt: &HuffmanWavelet,
    end_row: u64,
) -> Option<SymbolCounts> {
    let separator = width.separator();
    if bwt.symbol_and_rank(end_row).0 != separator {
        return None;
    }
    let mut counts = Vec::new();
    bwt.counts_in(0, n + 1, usize::MAX, &mut counts);
    for (symbol, count) in &mut counts {
        *count -= u64::from(*symbol == separator);
    }
    counts.retain(|&(_, c)| c > 0);
    counts.sort_unstable_by_key(|&(s, _)| byte_order(width, s));
    let mut first = Vec::with_capacity(counts.len());
    let mut row = 1u64;
    for &(symbol, count) in &counts {
        first.push((symbol, row));
        row += count;
    }
    first.sort_unstable();
    let unigram = counts.into_iter().map(|(s, c)| (s as NextKey, c)).collect();
    (row == n + 1).then_some(SymbolCounts {
        first_rows: first,
        unigram,
    })
}

/// What a part is built from: its tokens (starting with a separator), the token offset of each
/// document's separator, and the documents' metadata lines when there are any.
pub struct PartText<'a> {
    pub tokens: &'a [u32],
    pub doc_starts: Vec<u64>,
    pub metadata: Option<Vec<String>>,
}

impl FmPart {
    /// Builds the part's index (`threads` for the suffix sort).
    pub fn build(width: TokenWidth, text: PartText, threads: u16) -> Result<Self> {
        let tokens = text.tokens;
        let n = tokens.len() as u64;
        let separator = width.separator();
        if tokens.first() != Some(&separator) {
            return Err(IndexError::Invalid(
                "a part's tokens must start with a document separator".into(),
            ));
        }
        let mut reversed = TokenBuf::new(width);
        let mut rev: Vec<u32> = tokens.to_vec();
        rev.reverse();
        reversed.extend(&rev);
        let sa = reversed.into_suffix_array(threads)?;

        // Row 0 is the empty suffix (position n), row i + 1 the suffix array's i-th.
        let position = |row: usize| if row == 0 { n } else { sa[row - 1] as u64 };
        let mut symbols = Vec::with_capacity(n as usize + 1);
        let mut end_row = 0;
        let mut marks = BitsBuilder::default();
        let mut samples = Vec::with_capacity((n / SAMPLE_EVERY + 2) as usize);
        for row in 0..=n as usize {
            let q = position(row);
            symbols.push(if q == 0 {
                end_row = row as u64;
                separator
            } else {
                rev[q as usize - 1]
            });
            let sampled = q % SAMPLE_EVERY == 0;
            marks.push(sampled);
            if sampled {
                samples.push(q / SAMPLE_EVERY);
            }
        }

        // The row of the reversed suffix starting at each separator: R position n - 1 - start.
        let mut doc_rows = vec![0u64; text.doc_starts.len()];
        let doc_at_position: std::collections::HashMap<u64, usize> = text
            .doc_starts
            .iter()
            .enumerate()
            .map(|(d, &start)| (n - 1 - start, d))
            .collect();
        for row in 1..=n as usize {
            let q = position(row);
            if q < n && rev[q as usize] == separator {
                if let Some(&d) = doc_at_position.get(&q) {
                    doc_rows[d] = row as u64;
                }
            }
        }
        drop(sa);

        let metadata = text.metadata.map(|lines| {
            let mut bytes = Vec::new();
            let mut offsets = Vec::with_capacity(lines.len() + 1);
            for line in lines {
                offsets.push(bytes.len() as u64);
                bytes.extend_from_slice(line.as_bytes());
            }
            offsets.push(bytes.len() as u64);
            (bytes, offsets)
        });
        let bwt = HuffmanWavelet::new(&symbols);
        drop(symbols);
        let symbols = symbol_counts(width, n, &bwt, end_row)
            .ok_or_else(|| IndexError::Invalid("the transform built is inconsistent".into()))?;
        Ok(FmPart {
            width,
            n,
            bwt,
            end_row,
            symbols,
            sampled: marks.finish(),
            samples: PackedInts::new(&samples),
            doc_starts: text.doc_starts,
            doc_rows,
            metadata,
        })
    }

    pub fn width(&self) -> TokenWidth {
        self.width
    }

    pub fn tok_cnt(&self) -> u64 {
        self.n
    }

    pub fn doc_cnt(&self) -> u64 {
        self.doc_starts.len() as u64
    }

    /// Every row: the matches of the empty query, the end of the part included.
    pub fn full_range(&self) -> RankRange {
        RankRange {
            lo: 0,
            hi: self.n + 1,
        }
    }

    fn first_row(&self, symbol: u32) -> Option<u64> {
        let rows = &self.symbols.first_rows;
        rows.binary_search_by_key(&symbol, |&(s, _)| s)
            .ok()
            .map(|i| rows[i].1)
    }

    /// Occurrences of `symbol` in the transform's rows `[0, row)`.
    fn rank(&self, symbol: u32, row: u64) -> u64 {
        let stand_in = symbol == self.width.separator() && self.end_row < row;
        self.bwt.rank(symbol, row) - u64::from(stand_in)
    }

    /// The rows of the matches in `range` followed by `token`: one LF step.
    pub fn extend(&self, range: RankRange, token: u32) -> RankRange {
        match self.first_row(token) {
            Some(first) if !range.is_empty() => RankRange {
                lo: first + self.rank(token, range.lo),
                hi: first + self.rank(token, range.hi),
            },
            _ => RankRange::default(),
        }
    }

    /// The rows of `ids`'s matches, read left to right.
    pub fn find(&self, ids: &[u32]) -> RankRange {
        ids.iter()
            .try_fold(self.full_range(), |range, &t| {
                let next = self.extend(range, t);
                (!next.is_empty()).then_some(next)
            })
            .unwrap_or_default()
    }

    /// What follows the matches in `range`: `(token or END, count)` pairs, END once when the
    /// range holds the part's end; all of them, or at least `limit` when there are more.
    pub fn next_counts(&self, range: RankRange, limit: usize, out: &mut Vec<(NextKey, u64)>) {
        if range == self.full_range() {
            out.extend_from_slice(&self.symbols.unigram);
            out.push((END, 1));
            return;
        }
        let mut counts = Vec::new();
        self.bwt
            .counts_in(range.lo, range.hi, limit.saturating_add(1), &mut counts);
        let holds_end = self.holds_end(range);
        let separator = self.width.separator();
        for (symbol, count) in counts {
            let count = count - u64::from(holds_end && symbol == separator);
            if count > 0 {
                out.push((symbol as NextKey, count));
            }
        }
        if holds_end {
            out.push((END, 1));
        }
    }

    /// Whether `range` holds the row of the part's end (a match at the very end of the text).
    pub fn holds_end(&self, range: RankRange) -> bool {
        range.lo <= self.end_row && self.end_row < range.hi
    }

    /// Next-token counts in the order the suffix array sorts the same matches: the part's end
    /// first (a prefix of every other suffix), then tokens by their little-endian bytes.
    pub fn suffix_order(&self, counts: &mut [(NextKey, u64)]) {
        let width = self.width;
        counts.sort_unstable_by_key(|&(key, _)| match key {
            END => (0, 0),
            token => (1, byte_order(width, token as u32)),
        });
    }

    /// The token after the match at `row` (END at the part's end) and the row of the match
    /// one token longer.
    pub fn step(&self, row: u64) -> Option<(u32, u64)> {
        if row == self.end_row {
            return None;
        }
        let (symbol, before) = self.bwt.symbol_and_rank(row);
        let before = before - u64::from(symbol == self.width.separator() && self.end_row < row);
        Some((symbol, self.first_row(symbol)? + before))
    }

    /// Up to `depth` tokens after the match at `row`, stopping before the first token `stop`
    /// accepts (or at the part's end).
    pub fn following(&self, mut row: u64, depth: usize, stop: impl Fn(u32) -> bool) -> Vec<u32> {
        let mut out = Vec::new();
        while out.len() < depth {
            match self.step(row) {
                Some((token, next)) if !stop(token) => {
                    out.push(token);
                    row = next;
                }
                _ => break,
            }
        }
        out
    }

    /// The token offset where the match at `row` ends: LF steps back to a sampled row.
    pub fn end_of(&self, mut row: u64) -> u64 {
        let mut steps = 0;
        loop {
            let (ones, sampled) = self.sampled.rank1_and_get(row);
            if sampled {
                let q = self.samples.get(ones) * SAMPLE_EVERY + steps;
                return self.n.saturating_sub(q);
            }
            // A row that is not sampled is not the end row (position 0 is sampled), so it steps.
            match self.step(row) {
                Some((_, next)) if steps < SAMPLE_EVERY => {
                    row = next;
                    steps += 1;
                }
                _ => return self.n,
            }
        }
    }

    /// Token offset of document `doc`'s separator.
    pub fn doc_start(&self, doc: u64) -> u64 {
        self.doc_starts[doc as usize]
    }

    /// Token offset one past document `doc`'s last token.
    pub fn doc_end(&self, doc: u64) -> u64 {
        self.doc_starts
            .get(doc as usize + 1)
            .copied()
            .unwrap_or(self.n)
    }

    /// The document holding token offset `at`.
    pub fn doc_of(&self, at: u64) -> u64 {
        (self.doc_starts.partition_point(|&s| s <= at) as u64).saturating_sub(1)
    }

    /// Tokens `from..to` of document `doc` (its separator left out), read by LF steps from its
    /// first: a window deep in a long document costs a step per token before it, so the walk
    /// stops when interrupted.
    pub fn doc_tokens(&self, doc: u64, from: u64, to: u64) -> Result<Vec<u32>> {
        let len = (self.doc_end(doc) - self.doc_start(doc) - 1).min(to);
        let mut row = self.doc_rows[doc as usize];
        let mut tokens = Vec::with_capacity(len.saturating_sub(from) as usize);
        for at in 0..len {
            if at % 4096 == 4095 && crate::interrupt::interrupted() {
                return Err(IndexError::Interrupted);
            }
            let Some((token, next)) = self.step(row) else {
                break;
            };
            if at >= from {
                tokens.push(token);
            }
            row = next;
        }
        Ok(tokens)
    }

    pub fn metadata(&self, doc: u64) -> Option<String> {
        let (bytes, offsets) = self.metadata.as_ref()?;
        let (from, to) = (offsets[doc as usize], offsets[doc as usize + 1]);
        Some(String::from_utf8_lossy(&bytes[from as usize..to as usize]).into_owned())
    }

    /// Bytes a suffix-array part spends on the same metadata (its lines and their offsets).
    pub fn metadata_bytes(&self) -> u64 {
        self.metadata
            .as_ref()
            .map_or(0, |(bytes, _)| bytes.len() as u64 + 8 * self.doc_cnt())
    }

    /// Bytes of everything the part holds, by component: transform, samples, documents.
    pub fn size_by_component(&self) -> [(&'static str, u64); 3] {
        let docs = 16 * self.doc_starts.len() as u64
            + self
                .metadata
                .as_ref()
                .map_or(0, |(b, o)| b.len() as u64 + 8 * o.len() as u64);
        [
            ("transform", self.bwt.size_bytes()),
            (
                "samples",
                self.sampled.size_bytes() + self.samples.size_bytes(),
            ),
            ("documents", docs),
        ]
    }

    pub fn write(&self, out: &mut Words) {
        out.u64(self.width.bytes() as u64);
        out.u64(self.n);
        out.u64(self.end_row);
        self.bwt.write(out);
        self.sampled.write(out);
        self.samples.write(out);
        out.u64s(&self.doc_starts);
        out.u64s(&self.doc_rows);
        match &self.metadata {
            Some((bytes, offsets)) => {
                out.u64(1);
                out.bytes(bytes);
                out.u64s(offsets);
            }
            None => out.u64(0),
        }
    }

    /// Reads a part written by [`FmPart::write`], checking every count against the others so
    /// that no query can index past an array.
    pub fn read(input: &mut WordReader) -> Result<Self> {
        let (bytes, n, end_row) = (input.u64()?, input.u64()?, input.u64()?);
        let Ok(width) = TokenWidth::try_from(bytes.min(255) as u8) else {
            return input.corrupt("its token width is not 1, 2 or 4 bytes");
        };
        if n == 0 || n > MAX_PART_TOKENS {
            return input.corrupt("its token count is outside what a part holds");
        }
        let bwt = HuffmanWavelet::read(input)?;
        let sampled = CompressedBits::read(input)?;
        let samples = PackedInts::read(input)?;
        let (doc_starts, doc_rows) = (input.u64s()?, input.u64s()?);
        let metadata = match input.u64()? {
            0 => None,
            _ => Some((input.bytes()?, input.u64s()?)),
        };
        let sizes_ok = bwt.len() == n + 1 && end_row <= n && sampled.len() == n + 1;
        let Some(symbols) = sizes_ok
            .then(|| symbol_counts(width, n, &bwt, end_row))
            .flatten()
        else {
            return input.corrupt("its transform disagrees with the part's size");
        };
        let docs_ok = doc_starts.len() == doc_rows.len()
            && doc_starts.first() == Some(&0)
            && doc_starts.windows(2).all(|w| w[0] < w[1])
            && doc_starts.last().is_some_and(|&s| s < n)
            && doc_rows.iter().all(|&r| r <= n);
        let metadata_ok = metadata.as_ref().is_none_or(|(b, o)| {
            o.len() == doc_starts.len() + 1
                && o.first() == Some(&0)
                && o.windows(2).all(|w| w[0] <= w[1])
                && o.last() == Some(&(b.len() as u64))
        });
        let samples_ok = samples.len == sampled.rank1(n + 1)
            && (0..samples.len).all(|i| samples.get(i) <= n / SAMPLE_EVERY);
        if !(docs_ok && metadata_ok && samples_ok) {
            return input.corrupt("its pieces disagree on the part's size or documents");
        }
        Ok(FmPart {
            width,
            n,
            bwt,
            end_row,
            symbols,
            sampled,
            samples,
            doc_starts,
            doc_rows,
            metadata,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn matches_end_where_counting_finds_them(
            body in proptest::collection::vec(prop_oneof![8 => 0u32..4, 1 => Just(65535u32)], 0..300),
            pattern in proptest::collection::vec(0u32..4, 1..4),
        ) {
            let mut tokens = vec![65535u32];
            tokens.extend(&body);
            let doc_starts: Vec<u64> = (0..tokens.len() as u64).filter(|&i| tokens[i as usize] == 65535).collect();
            let text = PartText { tokens: &tokens, doc_starts, metadata: None };
            let part = FmPart::build(TokenWidth::U16, text, 1).unwrap();
            let range = part.find(&pattern);
            let mut ends: Vec<u64> = (range.lo..range.hi).map(|r| part.end_of(r)).collect();
            ends.sort_unstable();
            let expected: Vec<u64> = (0..tokens.len())
                .filter(|&p| tokens[p..].starts_with(&pattern))
                .map(|p| (p + pattern.len()) as u64)
                .collect();
            prop_assert_eq!(ends, expected);
        }
    }
}
