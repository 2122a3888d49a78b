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

use libsais::bwt::AuxIndicesSamplingRate;
use libsais::{BwtConstruction, SmallAlphabet, ThreadCount};

use crate::index::build::sa::{TokenBuf, MAX_PART_TOKENS};
use crate::index::fm::bits::CompressedBits;
use crate::index::fm::file::{WordReader, Words};
use crate::index::fm::wavelet::{rank_pairs, HuffmanWavelet, RankPair, WALKS};
use crate::index::format::TokenWidth;
use crate::index::pages;
use crate::index::ranks::RankRange;
use crate::index::read::part::{NextKey, END};
use crate::index::{IndexError, Result};

/// Every `sample_every`-th text position keeps its row's position, so locating a match walks at
/// most that many LF steps. 64, the default, keeps the samples near 0.5 bits per token; 16
/// locates seven times faster for 1.9 bits a token (mini-Pile bytes). A power of two (what the
/// suffix sorter samples).
pub const DEFAULT_SAMPLE_EVERY: u64 = 64;
/// The sampling rates a part accepts.
pub const SAMPLE_EVERY_RANGE: std::ops::RangeInclusive<u64> = 2..=1 << 16;
/// Every `WINDOW_EVERY`-th match end keeps its row (or every `sample_every`-th, when that is
/// sparser), so a document's window is read within that many LF steps of where it starts, not
/// from the document's first token: 0.06 bits a token.
const WINDOW_EVERY: u64 = 512;

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
    sample_every: u64,
    /// Rows whose text position is a multiple of `sample_every`, and those positions / it, by row.
    sampled: CompressedBits,
    samples: PackedInts,
    /// The row of the match ending at `n - i·window_every()` for each i: where a window starts.
    windows: PackedInts,
    /// Token offset of each document's separator.
    doc_starts: Vec<u64>,
    /// Each document's metadata line, when the index has them.
    metadata: Option<(Vec<u8>, Vec<u64>)>,
}

/// Match ends apart of the rows kept for reading windows: a multiple of the sampling rate.
fn window_every(sample_every: u64) -> u64 {
    WINDOW_EVERY.max(sample_every)
}

/// The order the suffix array sorts tokens in: their little-endian bytes.
fn byte_order(width: TokenWidth, token: u32) -> u32 {
    match width {
        TokenWidth::U8 => token,
        TokenWidth::U16 => (token as u16).swap_bytes() as u32,
        TokenWidth::U32 => token.swap_bytes(),
    }
}

/// Refuses a sampling rate a part cannot keep: a power of two in [`SAMPLE_EVERY_RANGE`] (what the
/// suffix sorter samples).
pub fn check_sample_every(sample_every: u64) -> Result<()> {
    if !sample_every.is_power_of_two() || !SAMPLE_EVERY_RANGE.contains(&sample_every) {
        return Err(IndexError::Invalid(format!(
            "a sampling rate of {sample_every}: a power of two from {} to {} is needed",
            SAMPLE_EVERY_RANGE.start(),
            SAMPLE_EVERY_RANGE.end()
        )));
    }
    Ok(())
}

/// What the transform's symbol counts give, derived from the tree when a part is built or read.
struct SymbolCounts {
    /// `(symbol, the rows of the one-token query of it)`, sorted by symbol.
    token_rows: Vec<(u32, RankRange)>,
    /// Every token's count, in the suffix array's order: the full range's next tokens, which
    /// the empty prompt and the gate's first position ask for (σ descents otherwise).
    unigram: Vec<(NextKey, u64)>,
    /// Over bytes, the rows of every two-byte query (`pairs[a << 8 | b]` for "a b"; empty
    /// where it does not occur), 1 MiB: a query's first two LF steps, each a chain of missed
    /// ranks over a large index, are read from it (a 16-byte count takes 14 steps, not 16).
    /// Empty over wider tokens.
    pairs: Vec<RankRange>,
}

impl SymbolCounts {
    fn token_rows(&self, symbol: u32) -> Option<RankRange> {
        let rows = &self.token_rows;
        rows.binary_search_by_key(&symbol, |&(s, _)| s)
            .ok()
            .map(|i| rows[i].1)
    }
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
    // A symbol no token of the width can be comes from a damaged file (the tables index by it).
    if counts.iter().any(|&(s, _)| s as u64 >= width.capacity()) {
        return None;
    }
    counts.sort_unstable_by_key(|&(s, _)| byte_order(width, s));
    let mut token_rows = Vec::with_capacity(counts.len());
    let mut row = 1u64;
    for &(symbol, count) in &counts {
        token_rows.push((
            symbol,
            RankRange {
                lo: row,
                hi: row + count,
            },
        ));
        row += count;
    }
    if row != n + 1 {
        return None;
    }
    token_rows.sort_unstable_by_key(|&(s, _)| s);
    let unigram = counts.into_iter().map(|(s, c)| (s as NextKey, c)).collect();
    let mut symbols = SymbolCounts {
        token_rows,
        unigram,
        pairs: Vec::new(),
    };
    if width == TokenWidth::U8 {
        symbols.pairs = pair_rows(&symbols, bwt, end_row, separator);
    }
    Some(symbols)
}

/// The rows of every two-byte query (see [`SymbolCounts::pairs`]): each byte's rows stepped by
/// every byte that follows it in one descent (256 descents).
fn pair_rows(
    symbols: &SymbolCounts,
    bwt: &HuffmanWavelet,
    end_row: u64,
    separator: u32,
) -> Vec<RankRange> {
    let mut pairs = vec![RankRange::default(); 1 << 16];
    let mut ranks = Vec::new();
    for &(a, rows) in &symbols.token_rows {
        ranks.clear();
        bwt.ranks_in(rows.lo, rows.hi, &mut ranks);
        for &(b, lo, hi) in &ranks {
            if let Some(first) = symbols.token_rows(b) {
                pairs[(a as usize) << 8 | b as usize] =
                    lf_step(rows, b, first.lo, (lo, hi), end_row, separator);
            }
        }
    }
    pairs
}

/// One LF step: the rows of the matches in `range` followed by `token`, from the token's first
/// row and its occurrences in the transform before `range`'s two ends. The separator standing in
/// at `end_row` is not an occurrence, so a rank that counts it gives it back.
fn lf_step(
    range: RankRange,
    token: u32,
    first: u64,
    (before_lo, before_hi): (u64, u64),
    end_row: u64,
    separator: u32,
) -> RankRange {
    let stand_in = |row: u64| u64::from(token == separator && end_row < row);
    RankRange {
        lo: first + before_lo - stand_in(range.lo),
        hi: first + before_hi - stand_in(range.hi),
    }
}

/// What a part is built from: its tokens (starting with a separator), the token offset of each
/// document's separator, and the documents' metadata lines when there are any.
pub struct PartText {
    pub tokens: TokenBuf,
    pub doc_starts: Vec<u64>,
    pub metadata: Option<Vec<String>>,
}

/// The Burrows-Wheeler transform of a part's reversed tokens as the suffix sorter gives it: the
/// symbol of every row but the whole text's (`end_row`), and the row of every `rate`-th suffix.
struct Transform {
    symbols: TokenBuf,
    end_row: u64,
    /// `rows[i]`: the row of the reversed text's suffix at `i·rate`.
    rows: Vec<u64>,
}

impl Transform {
    /// The transform of `reversed` (tokens of 1 or 2 bytes straight from the suffix sorter, in
    /// the text's buffer; 4-byte tokens from their suffix array).
    fn of(reversed: TokenBuf, rate: u64, threads: u16) -> Result<Self> {
        let with_rows = |symbols: TokenBuf, rows: Vec<u64>| Transform {
            end_row: rows[0],
            symbols,
            rows,
        };
        match reversed {
            TokenBuf::U8(mut text) => {
                let rows = sorted_in_place(&mut text, rate, threads)?;
                Ok(with_rows(TokenBuf::U8(text), rows))
            }
            TokenBuf::U16(mut text) => {
                // Sorted by little-endian bytes, as the suffix array sorts them.
                text.iter_mut().for_each(|t| *t = t.swap_bytes());
                let rows = sorted_in_place(&mut text, rate, threads)?;
                text.iter_mut().for_each(|t| *t = t.swap_bytes());
                Ok(with_rows(TokenBuf::U16(text), rows))
            }
            TokenBuf::U32(text) => {
                let n = text.len() as u64;
                let sa = TokenBuf::U32(text.clone()).into_suffix_array(threads)?;
                // Row 0 is the empty suffix (position n), row k the suffix array's (k - 1)-th.
                let mut symbols = Vec::with_capacity(text.len());
                symbols.extend(text.last());
                let mut rows = vec![0u64; ((n.max(1) - 1) / rate + 1) as usize];
                let mut end_row = 0;
                for (k, &q) in (1u64..).zip(&sa) {
                    let q = q as u64;
                    if q.is_multiple_of(rate) {
                        rows[(q / rate) as usize] = k;
                    }
                    match q {
                        0 => end_row = k,
                        _ => symbols.push(text[q as usize - 1]),
                    }
                }
                Ok(Transform {
                    symbols: TokenBuf::U32(symbols),
                    end_row,
                    rows,
                })
            }
        }
    }

    /// The transform's wavelet tree: every row's symbol, the separator standing in at `end_row`.
    fn wavelet(&self, separator: u32) -> HuffmanWavelet {
        fn rows<T: Copy + Into<u32>>(
            symbols: &[T],
            end_row: usize,
            separator: u32,
        ) -> impl Iterator<Item = u32> + Clone + '_ {
            let (before, after) = symbols.split_at(end_row);
            let each = |&t: &T| t.into();
            before
                .iter()
                .map(each)
                .chain([separator])
                .chain(after.iter().map(each))
        }
        let end_row = self.end_row as usize;
        match &self.symbols {
            TokenBuf::U8(s) => HuffmanWavelet::new(rows(s, end_row, separator)),
            TokenBuf::U16(s) => HuffmanWavelet::new(rows(s, end_row, separator)),
            TokenBuf::U32(s) => HuffmanWavelet::new(rows(s, end_row, separator)),
        }
    }
}

/// Replaces `text` by its transform (the suffix sorter's), returning the row of every
/// `rate`-th suffix, the first being the whole text's.
fn sorted_in_place<T: SmallAlphabet>(text: &mut [T], rate: u64, threads: u16) -> Result<Vec<u64>> {
    let mut work = pages::zeroed_for_random_writes(text.len());
    let built = BwtConstruction::replace_text(text)
        .with_borrowed_temporary_array_buffer(&mut work[..])
        .multi_threaded(ThreadCount::fixed(threads.max(1)))
        .with_aux_indices(AuxIndicesSamplingRate::from(rate as i32))
        .run()
        .map_err(|e| IndexError::Invalid(format!("Burrows-Wheeler transform failed: {e:?}")))?;
    // The work array goes before the rows are widened: held beside them, it put the build
    // 0.25 bytes a token over its budget.
    drop(work);
    Ok(built.aux_indices().iter().map(|&r| r as u64).collect())
}

impl FmPart {
    /// Builds the part's index: the transform of its reversed tokens (`threads` for the suffix
    /// sort) with every `sample_every`-th position sampled.
    pub fn build(
        width: TokenWidth,
        text: PartText,
        sample_every: u64,
        threads: u16,
    ) -> Result<Self> {
        let PartText {
            tokens,
            doc_starts,
            metadata,
        } = text;
        let n = tokens.len() as u64;
        let separator = width.separator();
        if n == 0 || tokens.get(0) != separator {
            return Err(IndexError::Invalid(
                "a part's tokens must start with a document separator".into(),
            ));
        }
        if n > MAX_PART_TOKENS {
            return Err(IndexError::Invalid(format!(
                "a part of {n} tokens exceeds {MAX_PART_TOKENS}"
            )));
        }
        check_sample_every(sample_every)?;
        let transform = Transform::of(tokens.for_random_reads(true), sample_every, threads)?;
        let end_row = transform.end_row;

        // Rows of sampled positions in row order, with position / rate: the reversed text's
        // suffixes at multiples of the rate, and the empty one (row 0) when n is one.
        let mut sampled: Vec<(u64, u64)> = (0u64..)
            .zip(&transform.rows)
            .map(|(i, &row)| (row, i))
            .collect();
        if n.is_multiple_of(sample_every) {
            sampled.push((0, n / sample_every));
        }
        sampled.sort_unstable();
        let mut marks = vec![0u64; (n + 1).div_ceil(64) as usize];
        sampled
            .iter()
            .for_each(|&(row, _)| marks[(row / 64) as usize] |= 1 << (row % 64));
        let samples: Vec<u64> = sampled.into_iter().map(|(_, q)| q).collect();
        let step = window_every(sample_every) / sample_every;
        let windows: Vec<u64> = transform
            .rows
            .iter()
            .step_by(step as usize)
            .copied()
            .collect();

        let bwt = transform.wavelet(separator);
        drop(transform);
        let symbols = symbol_counts(width, n, &bwt, end_row)
            .ok_or_else(|| IndexError::Invalid("the transform built is inconsistent".into()))?;
        let metadata = metadata.map(|lines| {
            let mut bytes = Vec::new();
            let mut offsets = Vec::with_capacity(lines.len() + 1);
            for line in lines {
                offsets.push(bytes.len() as u64);
                bytes.extend_from_slice(line.as_bytes());
            }
            offsets.push(bytes.len() as u64);
            (bytes, offsets)
        });
        Ok(FmPart {
            width,
            n,
            bwt,
            end_row,
            symbols,
            sample_every,
            sampled: CompressedBits::new(&marks, n + 1),
            samples: PackedInts::new(&samples),
            windows: PackedInts::new(&windows),
            doc_starts,
            metadata,
        })
    }

    pub fn width(&self) -> TokenWidth {
        self.width
    }

    pub fn tok_cnt(&self) -> u64 {
        self.n
    }

    pub fn sample_every(&self) -> u64 {
        self.sample_every
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
        self.symbols.token_rows(symbol).map(|rows| rows.lo)
    }

    /// The rows of the matches in `range` followed by `token`: one LF step.
    pub fn extend(&self, range: RankRange, token: u32) -> RankRange {
        let mut ranges = [range];
        FmPart::extend_all(std::slice::from_ref(self), &mut ranges, token);
        ranges[0]
    }

    /// The rows of the matches in each part's `ranges` followed by `token`, in place: one LF
    /// step a part, the parts' ranks taken together so that their misses overlap.
    pub fn extend_all(parts: &[FmPart], ranges: &mut [RankRange], token: u32) {
        let (mut firsts, mut asks) = (Vec::new(), Vec::new());
        for (p, (part, range)) in parts.iter().zip(ranges.iter_mut()).enumerate() {
            match part.first_row(token) {
                Some(first) if !range.is_empty() => {
                    firsts.push((p, first));
                    asks.push(RankPair {
                        tree: &part.bwt,
                        symbol: token,
                        lo: range.lo,
                        hi: range.hi,
                    });
                }
                _ => *range = RankRange::default(),
            }
        }
        rank_pairs(&mut asks);
        for (&(p, first), ask) in firsts.iter().zip(&asks) {
            let (part, range) = (&parts[p], &mut ranges[p]);
            let separator = part.width.separator();
            *range = lf_step(
                *range,
                token,
                first,
                (ask.lo, ask.hi),
                part.end_row,
                separator,
            );
        }
    }

    /// The rows of `ids`'s matches in each part, read left to right, the parts stepping
    /// together: the first token's rows (over bytes, the first two's) from the part's counts,
    /// then an LF step a token.
    pub fn find_all(parts: &[FmPart], ids: &[u32]) -> Vec<RankRange> {
        let starts: Vec<(RankRange, usize)> = parts.iter().map(|part| part.start(ids)).collect();
        let taken = starts.first().map_or(0, |&(_, tokens)| tokens);
        debug_assert!(
            starts.iter().all(|&(_, t)| t == taken),
            "parts of one width"
        );
        let mut ranges: Vec<RankRange> = starts.into_iter().map(|(rows, _)| rows).collect();
        for &token in &ids[taken..] {
            if ranges.iter().all(RankRange::is_empty) {
                break;
            }
            FmPart::extend_all(parts, &mut ranges, token);
        }
        for range in &mut ranges {
            if range.is_empty() {
                *range = RankRange::default();
            }
        }
        ranges
    }

    /// The rows of the first tokens of `ids` read without a rank, and how many tokens that
    /// took (the same for every part of an index: it depends on the token width only).
    fn start(&self, ids: &[u32]) -> (RankRange, usize) {
        match *ids {
            [a, b, ..] if self.width == TokenWidth::U8 && a < 256 && b < 256 => {
                (self.symbols.pairs[(a as usize) << 8 | b as usize], 2)
            }
            [a, ..] => (self.symbols.token_rows(a).unwrap_or_default(), 1),
            [] => (self.full_range(), 0),
        }
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
        self.step_from(row, self.bwt.symbol_and_rank(row))
    }

    /// [`FmPart::step`] from a row that is not the end row, given its symbol and rank.
    fn step_from(&self, row: u64, (symbol, before): (u32, u64)) -> Option<(u32, u64)> {
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

    /// The token offset where the match at each of `rows` ends (into `ends`, as many): LF steps
    /// back to a sampled row. A place costs 32 steps on average, each a chain of dependent ranks
    /// that miss the cache over a large index, so [`WALKS`] rows at a time step together and
    /// their misses overlap.
    pub fn ends_of(&self, rows: &[u64], ends: &mut [u64]) {
        assert_eq!(rows.len(), ends.len(), "an end for each row");
        for (rows, ends) in rows.chunks(WALKS).zip(ends.chunks_mut(WALKS)) {
            self.walk_together::<WALKS>(rows, ends);
        }
    }

    /// [`FmPart::ends_of`] of at most `N` rows.
    fn walk_together<const N: usize>(&self, rows: &[u64], ends: &mut [u64]) {
        // Each walk's row and steps taken, and the walks still stepping.
        let mut walks = [(0u64, 0u64); N];
        let mut active = [0usize; N];
        for (c, &row) in rows.iter().enumerate() {
            walks[c] = (row, 0);
            active[c] = c;
        }
        let mut stepping = rows.len();
        let (mut at, mut found) = ([0u64; N], [(0u32, 0u64); N]);
        while stepping > 0 {
            for &c in &active[..stepping] {
                // The step's first rank is asked for with the sampled bit.
                self.bwt.prefetch(walks[c].0);
                self.sampled.prefetch(walks[c].0);
            }
            let mut pending = [None; N];
            for &c in &active[..stepping] {
                pending[c] = self.sampled.begin(walks[c].0);
            }
            let mut still = 0;
            for a in 0..stepping {
                let c = active[a];
                let (row, steps) = walks[c];
                let (ones, sampled) = self.sampled.finish(pending[c]);
                if sampled {
                    let q = self.samples.get(ones) * self.sample_every + steps;
                    ends[c] = self.n.saturating_sub(q);
                } else if row == self.end_row || steps >= self.sample_every {
                    // No step leads back to a sampled row: the part's end stands in.
                    ends[c] = self.n;
                } else {
                    at[still] = row;
                    active[still] = c;
                    still += 1;
                }
            }
            stepping = still;
            self.bwt
                .symbols_and_ranks::<N>(&at[..stepping], &mut found[..stepping]);
            let mut still = 0;
            for a in 0..stepping {
                let c = active[a];
                let (row, steps) = walks[c];
                match self.step_from(row, found[a]) {
                    Some((_, next)) => {
                        walks[c] = (next, steps + 1);
                        active[still] = c;
                        still += 1;
                    }
                    None => ends[c] = self.n,
                }
            }
            stepping = still;
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

    /// Tokens `from..to` of document `doc` (its separator left out), read by LF steps from the
    /// nearest kept row at or before the first (within `window_every` steps), so the walk stops
    /// when interrupted.
    pub fn doc_tokens(&self, doc: u64, from: u64, to: u64) -> Result<Vec<u32>> {
        let start = self.doc_start(doc) + 1;
        let end = self.doc_end(doc).min(start.saturating_add(to));
        let first = start.saturating_add(from).min(end);
        // The match ending at n - i·every is kept; the one ending at 0 is row 0.
        let every = window_every(self.sample_every);
        let i = (self.n - first).div_ceil(every);
        let (mut at, mut row) = match i < self.windows.len {
            true => (self.n - i * every, self.windows.get(i)),
            false => (0, 0),
        };
        let mut tokens = Vec::with_capacity((end - first) as usize);
        while at < end {
            if at % 4096 == 4095 && crate::interrupt::interrupted() {
                return Err(IndexError::Interrupted);
            }
            let Some((token, next)) = self.step(row) else {
                break;
            };
            if at >= first {
                tokens.push(token);
            }
            row = next;
            at += 1;
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
        let docs = 8 * self.doc_starts.len() as u64
            + self
                .metadata
                .as_ref()
                .map_or(0, |(b, o)| b.len() as u64 + 8 * o.len() as u64);
        [
            (
                "transform",
                self.bwt.size_bytes() + 16 * self.symbols.pairs.len() as u64,
            ),
            (
                "samples",
                self.sampled.size_bytes() + self.samples.size_bytes() + self.windows.size_bytes(),
            ),
            ("documents", docs),
        ]
    }

    pub fn write(&self, out: &mut Words) {
        out.u64(self.width.bytes() as u64);
        out.u64(self.n);
        out.u64(self.end_row);
        out.u64(self.sample_every);
        self.bwt.write(out);
        self.sampled.write(out);
        self.samples.write(out);
        self.windows.write(out);
        out.u64s(&self.doc_starts);
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
        let sample_every = input.u64()?;
        let Ok(width) = TokenWidth::try_from(bytes.min(255) as u8) else {
            return input.corrupt("its token width is not 1, 2 or 4 bytes");
        };
        if n == 0 || n > MAX_PART_TOKENS {
            return input.corrupt("its token count is outside what a part holds");
        }
        let bwt = HuffmanWavelet::read(input)?;
        let sampled = CompressedBits::read(input)?;
        let samples = PackedInts::read(input)?;
        let windows = PackedInts::read(input)?;
        let doc_starts = input.u64s()?;
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
        let docs_ok = doc_starts.first() == Some(&0)
            && doc_starts.windows(2).all(|w| w[0] < w[1])
            && doc_starts.last().is_some_and(|&s| s < n);
        let metadata_ok = metadata.as_ref().is_none_or(|(b, o)| {
            o.len() == doc_starts.len() + 1
                && o.first() == Some(&0)
                && o.windows(2).all(|w| w[0] <= w[1])
                && o.last() == Some(&(b.len() as u64))
        });
        let rate_ok = sample_every.is_power_of_two() && SAMPLE_EVERY_RANGE.contains(&sample_every);
        let samples_ok = rate_ok
            && samples.len == sampled.rank1(n + 1)
            && (0..samples.len).all(|i| samples.get(i) <= n / sample_every)
            && windows.len == (n - 1) / window_every(sample_every) + 1
            && (0..windows.len).all(|i| windows.get(i) <= n);
        if !(docs_ok && metadata_ok && samples_ok) {
            return input.corrupt("its pieces disagree on the part's size or documents");
        }
        Ok(FmPart {
            width,
            n,
            bwt,
            end_row,
            symbols,
            sample_every,
            sampled,
            samples,
            windows,
            doc_starts,
            metadata,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A byte part whose tree names a symbol no byte can be, its file otherwise whole, is
    /// refused when read (its tables are indexed by the symbols).
    #[test]
    fn a_symbol_beyond_the_token_width_is_corrupt() {
        let width = TokenWidth::U8;
        let tokens = [255u32, 1, 2, 3, 1, 2, 255, 3, 3, 1];
        let mut buf = TokenBuf::new(width);
        buf.extend(&tokens);
        let doc_starts = vec![0, 6];
        let text = PartText {
            tokens: buf,
            doc_starts,
            metadata: None,
        };
        let mut words = Words::default();
        FmPart::build(width, text, 2, 1).unwrap().write(&mut words);
        let mut bytes = words.into_bytes();
        assert!(FmPart::read(&mut WordReader::new(&bytes, "part")).is_ok());
        let leaf = |symbol: u64| (crate::index::fm::wavelet::LEAF_TAG | symbol).to_le_bytes();
        let at = bytes
            .chunks(8)
            .position(|w| w == leaf(3))
            .expect("a leaf of 3")
            * 8;
        bytes[at..at + 8].copy_from_slice(&leaf(259));
        let err = FmPart::read(&mut WordReader::new(&bytes, "part"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("corrupt"), "{err}");
    }

    proptest! {
        /// Every width (1 and 2 bytes from the sorter's transform, 4 from a suffix array) and
        /// sampling rate against counting: where matches end, and any window of any document.
        #[test]
        fn matches_and_windows_agree_with_the_text(
            body in proptest::collection::vec(prop_oneof![8 => 0u32..4, 1 => Just(u32::MAX)], 0..700),
            pattern in proptest::collection::vec(prop_oneof![16 => 0u32..4, 2 => Just(u32::MAX), 1 => Just(300u32)], 1..4),
            width in prop_oneof![Just(TokenWidth::U8), Just(TokenWidth::U16), Just(TokenWidth::U32)],
            rate_log in 1u32..7,
            window in (0u64..800, 0u64..800),
        ) {
            let separator = width.separator();
            let pattern: Vec<u32> = pattern.iter().map(|&t| if t == u32::MAX { separator } else { t }).collect();
            let mut tokens = vec![separator];
            tokens.extend(body.iter().map(|&t| if t == u32::MAX { separator } else { t }));
            let doc_starts: Vec<u64> = (0..tokens.len() as u64).filter(|&i| tokens[i as usize] == separator).collect();
            let build = |tokens: &[u32]| {
                let mut buf = TokenBuf::new(width);
                buf.extend(tokens);
                let doc_starts = (0..tokens.len() as u64).filter(|&i| tokens[i as usize] == separator).collect();
                let text = PartText { tokens: buf, doc_starts, metadata: None };
                FmPart::build(width, text, 1 << rate_log, 1).unwrap()
            };
            // A second part over the same tokens reversed: the parts of one index searched
            // together find in each what it finds alone, as many matches as its text holds.
            let mut second = vec![separator];
            second.extend(tokens[1..].iter().rev());
            let parts = [build(&tokens), build(&second)];
            let together = FmPart::find_all(&parts, &pattern);
            for (p, text) in [&tokens, &second].into_iter().enumerate() {
                let alone = FmPart::find_all(&parts[p..=p], &pattern)[0];
                prop_assert_eq!(together[p], alone);
                let count = (0..text.len()).filter(|&i| text[i..].starts_with(&pattern)).count();
                prop_assert_eq!(alone.len(), count as u64);
            }
            let (part, range) = (&parts[0], together[0]);
            let rows: Vec<u64> = (range.lo..range.hi).collect();
            let one_by_one: Vec<u64> = rows.iter().map(|&r| {
                let mut end = [0];
                part.ends_of(&[r], &mut end);
                end[0]
            }).collect();
            let mut ends = one_by_one.clone();
            ends.sort_unstable();
            let expected: Vec<u64> = (0..tokens.len())
                .filter(|&p| tokens[p..].starts_with(&pattern))
                .map(|p| (p + pattern.len()) as u64)
                .collect();
            prop_assert_eq!(&ends, &expected);
            // Walked together, in batches of every size, each row's end in its own slot.
            let batch = 1 + rows.len() % (2 * WALKS);
            let mut together = vec![0; rows.len()];
            for (rows, ends) in rows.chunks(batch).zip(together.chunks_mut(batch)) {
                part.ends_of(rows, ends);
            }
            prop_assert_eq!(together, one_by_one);
            for (doc, &start) in doc_starts.iter().enumerate() {
                let end = part.doc_end(doc as u64) as usize;
                let body = &tokens[start as usize + 1..end];
                let (from, to) = (window.0.min(window.1), window.0.max(window.1));
                let want = &body[(from as usize).min(body.len())..(to as usize).min(body.len())];
                prop_assert_eq!(part.doc_tokens(doc as u64, from, to).unwrap(), want.to_vec());
            }
        }
    }
}
