//! One memory-mapped part and the primitive operations on it: locating the suffix-array range of a
//! byte string, reading the token that follows a match, and mapping positions to documents.
//! Nothing here allocates per lookup or loads a file into RAM; the OS pages in what is touched.

use std::cmp::Ordering;
use std::path::Path;

use memmap2::Mmap;

use crate::index::format::{map_file, ptr_size_for, PartPaths, TokenWidth};
use crate::index::ranks::RankRange;
use crate::index::read::next_table::{NextTable, PromptRanks};
use crate::index::read::rank_samples::{RankSamples, KEY_BYTES, STRIDE};
use crate::index::IndexError;

/// The token after a match, as a sortable key: `END` for a match at the very end of the part (which
/// sorts first in its range, being a prefix of every other suffix there), else the token value.
pub type NextKey = u64;
pub const END: NextKey = u64::MAX;

pub struct Part {
    tokens: Mmap,
    table: Mmap,
    offsets: Mmap,
    metadata: Option<(Mmap, Mmap)>,
    width: TokenWidth,
    ptr_size: usize,
    tok_cnt: u64,
    doc_cnt: u64,
    /// Build-time counts of frequent short prompts, when the index has them.
    next_table: Option<NextTable>,
    /// Every few ranks' first bytes in RAM, when the opener asked for them.
    rank_samples: Option<RankSamples>,
}

/// Checks every u64 of an offsets file in order with `valid(previous, current)`: one pass over the
/// file, so that no later read can take a length or a position from a corrupt entry.
fn check_offsets(
    path: &Path,
    bytes: &[u8],
    rule: &str,
    valid: impl Fn(Option<u64>, u64) -> bool,
) -> Result<(), IndexError> {
    let mut prev = None;
    for (i, entry) in bytes.chunks_exact(8).enumerate() {
        let mut buf = [0u8; 8];
        buf.copy_from_slice(entry);
        let at = u64::from_le_bytes(buf);
        if !valid(prev, at) {
            return Err(IndexError::Corrupt(format!(
                "{}: entry {i} is {at}: {rule}",
                path.display()
            )));
        }
        prev = Some(at);
    }
    Ok(())
}

impl Part {
    /// Maps the files of part `paths` and checks that their sizes agree with each other and that every
    /// document and metadata offset lies inside its file, in order (one pass over the offsets).
    pub fn open(paths: &PartPaths, width: TokenWidth) -> Result<Self, IndexError> {
        let tokens = map_file(&paths.tokenized)?;
        let table = map_file(&paths.table)?;
        let offsets = map_file(&paths.offset)?;
        let w = width.bytes() as u64;
        let ds_size = tokens.len() as u64;
        let name = paths.tokenized.display();
        if ds_size == 0 || !ds_size.is_multiple_of(w) {
            return Err(IndexError::Corrupt(format!(
                "{name}: {ds_size} bytes is not a whole number of {w}-byte tokens"
            )));
        }
        let tok_cnt = ds_size / w;
        let ptr_size = ptr_size_for(ds_size);
        if table.len() as u64 != tok_cnt * ptr_size as u64 {
            return Err(IndexError::Corrupt(format!(
                "{}: {} bytes, expected {tok_cnt} pointers of {ptr_size} bytes = {} (wrong token width, or a truncated build?)",
                paths.table.display(),
                table.len(),
                tok_cnt * ptr_size as u64
            )));
        }
        if offsets.is_empty() || offsets.len() % 8 != 0 {
            return Err(IndexError::Corrupt(format!(
                "{}: {} bytes is not a list of u64 offsets",
                paths.offset.display(),
                offsets.len()
            )));
        }
        let doc_cnt = offsets.len() as u64 / 8;
        let rule = format!(
            "document offsets must start at 0 and increase, each a multiple of {w} below the \
             {ds_size} bytes of {name}"
        );
        check_offsets(&paths.offset, &offsets, &rule, |prev, at| {
            prev.map_or(at == 0, |p| at > p) && at < ds_size && at.is_multiple_of(w)
        })?;
        let metadata = if paths.metadata.exists() || paths.metaoff.exists() {
            let (mt, om) = (map_file(&paths.metadata)?, map_file(&paths.metaoff)?);
            if om.len() as u64 != doc_cnt * 8 {
                return Err(IndexError::Corrupt(format!(
                    "{}: {} entries for {doc_cnt} documents",
                    paths.metaoff.display(),
                    om.len() / 8
                )));
            }
            let mt_size = mt.len() as u64;
            let rule = format!(
                "metadata offsets must not decrease nor pass the {mt_size} bytes of {}",
                paths.metadata.display()
            );
            check_offsets(&paths.metaoff, &om, &rule, |prev, at| {
                prev.is_none_or(|p| at >= p) && at <= mt_size
            })?;
            Some((mt, om))
        } else {
            None
        };
        let part = Part {
            tokens,
            table,
            offsets,
            metadata,
            width,
            ptr_size,
            tok_cnt,
            doc_cnt,
            next_table: None,
            rank_samples: None,
        };
        if width.read(&part.tokens, 0) != width.separator() {
            return Err(IndexError::Corrupt(format!(
                "{name}: does not start with a document separator"
            )));
        }
        Ok(part)
    }

    pub fn width(&self) -> TokenWidth {
        self.width
    }
    pub fn next_table(&self) -> Option<&NextTable> {
        self.next_table.as_ref()
    }
    /// Attaches the part's next-token table (opened and checked against this part by the caller).
    pub fn set_next_table(&mut self, table: NextTable) {
        self.next_table = Some(table);
    }
    /// Samples the part's ranks, so that searches start in RAM ([`RankSamples`]).
    pub fn sample_ranks(&mut self) {
        let keys = (0..self.tok_cnt)
            .step_by(STRIDE as usize)
            .map(|rank| self.suffix_prefix(rank, KEY_BYTES));
        self.rank_samples = Some(RankSamples::of_prefixes(keys));
    }
    /// Tokens in the part, separators included.
    pub fn tok_cnt(&self) -> u64 {
        self.tok_cnt
    }
    pub fn doc_cnt(&self) -> u64 {
        self.doc_cnt
    }
    pub fn ds_size(&self) -> u64 {
        self.tokens.len() as u64
    }
    pub fn has_metadata(&self) -> bool {
        self.metadata.is_some()
    }
    pub fn token_bytes(&self) -> &[u8] {
        &self.tokens
    }

    /// Byte offset into `tokenized` of the suffix at `rank`.
    #[inline]
    pub fn ptr(&self, rank: u64) -> u64 {
        let at = rank as usize * self.ptr_size;
        // One 8-byte load, masked to the pointer's bytes, wherever the table has 8 bytes from
        // `at`: a copy of `ptr_size` bytes is a call to `memcpy`, on every step of every search.
        if let Some(Ok(word)) = self.table.get(at..at + 8).map(<[u8; 8]>::try_from) {
            let unused_bits = 8 * (8 - self.ptr_size.min(8)) as u32;
            return u64::from_le_bytes(word) & (u64::MAX >> unused_bits);
        }
        let mut buf = [0u8; 8];
        buf[..self.ptr_size].copy_from_slice(&self.table[at..at + self.ptr_size]);
        u64::from_le_bytes(buf)
    }

    /// Compares the suffix at `rank`, cut to the query's length, with the query bytes, from byte
    /// `shared` on (the bytes before it are known to agree).
    #[inline]
    fn cmp_at(&self, rank: u64, query: &[u8], shared: usize) -> Ordering {
        // Clamped so a corrupt pointer compares as the empty suffix instead of reading out of bounds.
        let p = (self.ptr(rank) as usize).min(self.tokens.len());
        let end = (p + query.len()).min(self.tokens.len());
        let suffix = &self.tokens[(p + shared).min(end)..end];
        // A suffix shorter than the query that matches all of its bytes is a proper prefix: smaller.
        suffix.cmp(&query[shared..])
    }

    /// The ranks whose suffixes start with `query` (little-endian token bytes), searched inside
    /// `within`: any range with `shared` 0, or the range of the query's first `shared` bytes (a
    /// match grown to the right), whose suffixes all agree with them, so only the bytes after
    /// them are compared: growing a long match costs what growing a short one does. Only that
    /// range may be given with `shared` > 0: its bytes are not compared again.
    pub fn find(&self, query: &[u8], within: RankRange, shared: usize) -> RankRange {
        if query.len() <= shared || within.is_empty() {
            return within;
        }
        let cmp = |rank| self.cmp_at(rank, query, shared);
        let within = match &self.rank_samples {
            Some(samples) if shared == 0 => {
                let bounded = samples.bound(query, within);
                if let Some((first, last)) = bounded.equal {
                    return Self::ends_near(bounded.range, first, last, cmp);
                }
                bounded.range
            }
            _ => within,
        };
        // Narrow both ends together until a rank matches, then find each end in its own half: the two
        // searches share their first steps instead of repeating them.
        let (mut lo, mut hi) = (within.lo, within.hi);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match cmp(mid) {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => {
                    let start = first_rank(lo, mid, |r| cmp(r) != Ordering::Less);
                    let end = first_rank(mid + 1, hi, |r| cmp(r) == Ordering::Greater);
                    return RankRange { lo: start, hi: end };
                }
            }
        }
        RankRange { lo, hi: lo }
    }

    /// The query's ranks in `within`, given sampled ranks `first` and `last` there whose keys equal
    /// the query's first bytes: one comparison with each tells which side of it that end lies on
    /// (for a query of at most 16 bytes, the near side: at most a stride to search).
    fn ends_near(
        within: RankRange,
        first: u64,
        last: u64,
        cmp: impl Fn(u64) -> Ordering,
    ) -> RankRange {
        let at_first = cmp(first);
        let at_last = if last == first { at_first } else { cmp(last) };
        let start = if at_first == Ordering::Less {
            first_rank(first + 1, within.hi, |r| cmp(r) != Ordering::Less)
        } else {
            first_rank(within.lo, first, |r| cmp(r) != Ordering::Less)
        };
        let end = if at_last == Ordering::Greater {
            first_rank(start, last, |r| cmp(r) == Ordering::Greater)
        } else {
            first_rank((last + 1).max(start), within.hi, |r| {
                cmp(r) == Ordering::Greater
            })
        };
        RankRange { lo: start, hi: end }
    }

    pub fn full_range(&self) -> RankRange {
        RankRange {
            lo: 0,
            hi: self.tok_cnt,
        }
    }

    /// The token that follows a match of `query_bytes` bytes at `rank`, or `END`.
    #[inline]
    pub fn next_key(&self, rank: u64, query_bytes: usize) -> NextKey {
        self.key_at(self.ptr(rank) as usize + query_bytes)
    }

    /// The token at byte offset `at` of the text, or `END` past it.
    #[inline]
    pub fn key_at(&self, at: usize) -> NextKey {
        if at + self.width.bytes() > self.tokens.len() {
            END
        } else {
            self.width.read(&self.tokens, at) as NextKey
        }
    }

    /// The token before the suffix at `rank` (`None` at the part's start, or for a corrupt
    /// pointer).
    pub fn prev_key(&self, rank: u64) -> Option<NextKey> {
        let at = self.ptr(rank) as usize;
        let width = self.width.bytes();
        (at >= width && at <= self.tokens.len())
            .then(|| self.width.read(&self.tokens, at - width) as NextKey)
    }

    /// The first `len` bytes of the suffix at `rank` (fewer where the part ends; none for a corrupt
    /// pointer).
    pub fn suffix_prefix(&self, rank: u64, len: usize) -> &[u8] {
        let p = (self.ptr(rank) as usize).min(self.tokens.len());
        &self.tokens[p..(p + len).min(self.tokens.len())]
    }

    /// Reads the first byte of the suffix at `rank` and throws it away: the cache line is on its way
    /// when a scan in rank order gets there (a portable prefetch; a corrupt pointer reads nothing).
    #[inline]
    pub fn prefetch_suffix(&self, rank: u64) {
        if let Some(byte) = self.tokens.get(self.ptr(rank) as usize) {
            std::hint::black_box(*byte);
        }
    }

    /// Whether the part's last `query.len()` bytes are `query`: a match with nothing after it.
    pub fn ends_with(&self, query: &[u8]) -> bool {
        self.tokens.ends_with(query)
    }

    /// Byte offset of document `doc`'s separator.
    #[inline]
    pub fn doc_start(&self, doc: u64) -> u64 {
        let at = doc as usize * 8;
        let mut buf = [0u8; 8];
        buf.copy_from_slice(&self.offsets[at..at + 8]);
        u64::from_le_bytes(buf)
    }

    /// Byte offset one past the end of document `doc` (open checked that offsets increase inside
    /// the part; the clamp keeps a length derived from it within the file all the same).
    pub fn doc_end(&self, doc: u64) -> u64 {
        if doc + 1 < self.doc_cnt {
            self.doc_start(doc + 1).min(self.ds_size())
        } else {
            self.ds_size()
        }
    }

    /// The document holding byte offset `ptr`.
    pub fn doc_of(&self, ptr: u64) -> u64 {
        // Last document whose start is <= ptr.
        let (mut lo, mut hi) = (0u64, self.doc_cnt);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.doc_start(mid) <= ptr {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Token ids in byte range `[from, to)` of the part, clamped to the part.
    pub fn tokens_between(&self, from: u64, to: u64) -> Vec<u32> {
        let w = self.width.bytes();
        let to = (to as usize).min(self.tokens.len() / w * w);
        let from = (from as usize).min(to);
        (from..to)
            .step_by(w)
            .map(|at| self.width.read(&self.tokens, at))
            .collect()
    }

    /// The metadata line stored for document `doc`, if the part has metadata.
    pub fn metadata(&self, doc: u64) -> Option<String> {
        let (mt, om) = self.metadata.as_ref()?;
        let read = |i: u64| {
            let mut buf = [0u8; 8];
            buf.copy_from_slice(&om[i as usize * 8..i as usize * 8 + 8]);
            u64::from_le_bytes(buf) as usize
        };
        let start = read(doc).min(mt.len());
        let end = if doc + 1 < self.doc_cnt {
            read(doc + 1)
        } else {
            mt.len()
        }
        .clamp(start, mt.len());
        Some(
            String::from_utf8_lossy(&mt[start..end])
                .trim_end_matches('\n')
                .to_string(),
        )
    }

    /// Bytes of the part's tokens, suffix array, document offsets and metadata.
    pub fn bytes(&self) -> u64 {
        let metadata = self
            .metadata
            .as_ref()
            .map_or(0, |(mt, om)| mt.len() + om.len());
        (self.tokens.len() + self.table.len() + self.offsets.len() + metadata) as u64
    }

    /// Reads every page of the token array and the suffix array once, so that first queries do not pay
    /// for page faults (what the reference calls loading to RAM, without copying anything).
    pub fn warm_up(&self) -> u64 {
        let step = 4096;
        let mut acc = 0u64;
        for bytes in [&self.tokens[..], &self.table[..]] {
            for at in (0..bytes.len()).step_by(step) {
                acc = acc.wrapping_add(bytes[at] as u64);
            }
        }
        acc
    }
}

/// First rank in `[lo, hi)` that is `past` (monotone: false, then true), else `hi`.
fn first_rank(mut lo: u64, mut hi: u64, past: impl Fn(u64) -> bool) -> u64 {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if past(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

impl PromptRanks for Part {
    fn width(&self) -> TokenWidth {
        self.width
    }
    fn tok_cnt(&self) -> u64 {
        self.tok_cnt
    }
    fn prompt_range(&self, lo: u64, bytes: usize) -> Option<RankRange> {
        let prompt = self.suffix_prefix(lo, bytes);
        (prompt.len() == bytes).then(|| self.find(prompt, self.full_range(), 0))
    }
}
