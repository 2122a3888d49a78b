//! The next-token table: exact next-token counts of a part's most frequent short prompts, computed at
//! build time so that `ntd` after them costs one lookup and a copy instead of a walk over a range of
//! hundreds of thousands of ranks (eval/ENGINE.md has the cost model and the figures). This file
//! is its layout and its reading; `index::build::next_table` computes it.
//!
//! An entry is found by the prompt's rank range, which the part's search has already computed: ranges of
//! distinct prompts of one length never share a first rank, so `(prompt bytes, lo)` is a key.
//!
//! File `nexttok.N`, little-endian, every section 8-byte aligned:
//! - header, 32 bytes: magic `ISNEXT01`, u32 longest prompt (tokens), u32 the eos id that separators
//!   and the part's end were counted as, u64 entries, u64 pairs;
//! - entries, 32 bytes each, sorted by (prompt bytes, lo): u64 lo, u64 hi, u32 prompt bytes,
//!   u32 pair count, u64 first pair;
//! - pairs, 8 bytes each, sorted by token within an entry: u32 token, u32 count. Separators and the
//!   part's end are already counted as eos, as `ntd` answers them.

use std::io::Write;
use std::path::Path;

use memmap2::Mmap;

use crate::index::format::{map_file, TokenWidth};
use crate::index::ranks::RankRange;
use crate::index::{IndexError, Result};

const MAGIC: &[u8; 8] = b"ISNEXT01";
pub(crate) const HEADER_BYTES: usize = 32;
pub(crate) const ENTRY_BYTES: usize = 32;
pub(crate) const PAIR_BYTES: usize = 8;
/// One prompt's counts, before it is written.
pub(crate) struct Entry {
    pub(crate) prompt_bytes: u32,
    pub(crate) range: RankRange,
    pub(crate) pairs: Vec<(u32, u32)>,
}

/// Writes `entries`, sorted by (prompt bytes, lo), to `path` in the layout above.
pub(crate) fn write(
    path: &Path,
    max_prompt_tokens: u32,
    eos_token_id: u32,
    entries: &[Entry],
) -> Result<()> {
    let io = |e| IndexError::io(path, e);
    let file = std::fs::File::create(path).map_err(io)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let pairs: u64 = entries.iter().map(|e| e.pairs.len() as u64).sum();
    let mut header = Vec::with_capacity(HEADER_BYTES);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&max_prompt_tokens.to_le_bytes());
    header.extend_from_slice(&eos_token_id.to_le_bytes());
    header.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    header.extend_from_slice(&pairs.to_le_bytes());
    out.write_all(&header).map_err(io)?;
    let mut first_pair = 0u64;
    for e in entries {
        out.write_all(&e.range.lo.to_le_bytes()).map_err(io)?;
        out.write_all(&e.range.hi.to_le_bytes()).map_err(io)?;
        out.write_all(&e.prompt_bytes.to_le_bytes()).map_err(io)?;
        out.write_all(&(e.pairs.len() as u32).to_le_bytes())
            .map_err(io)?;
        out.write_all(&first_pair.to_le_bytes()).map_err(io)?;
        first_pair += e.pairs.len() as u64;
    }
    for e in entries {
        for &(token, count) in &e.pairs {
            out.write_all(&token.to_le_bytes()).map_err(io)?;
            out.write_all(&count.to_le_bytes()).map_err(io)?;
        }
    }
    out.flush().map_err(io)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// What opening a table checks it against: the part it was built for.
pub trait PromptRanks {
    fn width(&self) -> TokenWidth;
    fn tok_cnt(&self) -> u64;
    /// The ranks of the prompt that the suffix at rank `lo` starts with, `bytes` long; `None` when
    /// that suffix is shorter.
    fn prompt_range(&self, lo: u64, bytes: usize) -> Option<RankRange>;
}

/// A part's table, memory-mapped and checked at open.
pub struct NextTable {
    map: Mmap,
    entries: usize,
    max_prompt_bytes: usize,
    /// The smallest range with an entry: a shorter one is never looked up.
    min_count: u64,
}

impl NextTable {
    /// Maps `path` and checks it against `part`: counted with the index's eos; every entry's range
    /// exactly the range of the prompt its first rank starts with (one search each), in order; pairs
    /// inside the file, of tokens below `vocab_size`, adding up to the range's length. One pass.
    pub fn open(
        path: &Path,
        part: &impl PromptRanks,
        vocab_size: u64,
        eos_token_id: u32,
    ) -> Result<Self> {
        let (width, tok_cnt) = (part.width(), part.tok_cnt());
        let map = map_file(path)?;
        let corrupt = |why: String| IndexError::Corrupt(format!("{}: {why}", path.display()));
        if map.len() < HEADER_BYTES || &map[..8] != MAGIC {
            return Err(corrupt("not a next-token table (bad header)".into()));
        }
        let max_prompt_tokens = u32_at(&map, 8) as usize;
        let counted_eos = u32_at(&map, 12);
        if counted_eos != eos_token_id {
            return Err(corrupt(format!(
                "counted document ends as token {counted_eos}, but the index's eos is {eos_token_id}"
            )));
        }
        let (entries, pairs) = (u64_at(&map, 16), u64_at(&map, 24));
        let expected = (HEADER_BYTES as u128)
            + entries as u128 * ENTRY_BYTES as u128
            + pairs as u128 * PAIR_BYTES as u128;
        if map.len() as u128 != expected {
            return Err(corrupt(format!(
                "{} bytes, the header promises {expected}",
                map.len()
            )));
        }
        let mut table = NextTable {
            map,
            entries: entries as usize,
            max_prompt_bytes: max_prompt_tokens * width.bytes(),
            min_count: u64::MAX,
        };
        let mut prev: Option<(u32, u64)> = None;
        let mut next_pair = 0u64;
        for i in 0..table.entries {
            let (range, prompt_bytes, count, first) = table.entry(i);
            let ordered = prev.is_none_or(|p| p < (prompt_bytes, range.lo));
            let sized = prompt_bytes > 0
                && prompt_bytes as usize <= table.max_prompt_bytes
                && (prompt_bytes as usize).is_multiple_of(width.bytes());
            if !ordered || !sized || range.is_empty() || range.hi > tok_cnt || first != next_pair {
                return Err(corrupt(format!("entry {i} is out of place")));
            }
            if part.prompt_range(range.lo, prompt_bytes as usize) != Some(range) {
                return Err(corrupt(format!(
                    "entry {i} is not the range of a prompt (a table of another index?)"
                )));
            }
            next_pair += count as u64;
            if next_pair > pairs {
                return Err(corrupt(format!("entry {i} runs past the pairs")));
            }
            let mut total = 0u64;
            let mut last_token = None;
            for (token, n) in table.pairs(first, count) {
                if token as u64 >= vocab_size || last_token.is_some_and(|t| t >= token) || n == 0 {
                    return Err(corrupt(format!("entry {i} holds a bad pair")));
                }
                last_token = Some(token);
                total += n as u64;
            }
            if total != range.len() {
                return Err(corrupt(format!(
                    "entry {i}: counts add up to {total}, its range holds {}",
                    range.len()
                )));
            }
            table.min_count = table.min_count.min(range.len());
            prev = Some((prompt_bytes, range.lo));
        }
        if next_pair != pairs {
            return Err(corrupt("pairs that no entry owns".into()));
        }
        Ok(table)
    }

    /// Entry `i`: its range, prompt bytes, pair count and first pair.
    fn entry(&self, i: usize) -> (RankRange, u32, u32, u64) {
        let at = HEADER_BYTES + i * ENTRY_BYTES;
        let range = RankRange {
            lo: u64_at(&self.map, at),
            hi: u64_at(&self.map, at + 8),
        };
        (
            range,
            u32_at(&self.map, at + 16),
            u32_at(&self.map, at + 20),
            u64_at(&self.map, at + 24),
        )
    }

    fn pairs(&self, first: u64, count: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        let base = HEADER_BYTES + self.entries * ENTRY_BYTES + first as usize * PAIR_BYTES;
        (0..count as usize).map(move |k| {
            let at = base + k * PAIR_BYTES;
            (u32_at(&self.map, at), u32_at(&self.map, at + 4))
        })
    }

    /// The counts of the prompt of `prompt_bytes` bytes whose matches are `range`, token by token in
    /// increasing order, if the table holds it.
    pub fn lookup(
        &self,
        prompt_bytes: usize,
        range: RankRange,
    ) -> Option<impl Iterator<Item = (u32, u32)> + '_> {
        if range.len() < self.min_count || prompt_bytes > self.max_prompt_bytes || prompt_bytes == 0
        {
            return None;
        }
        let key = (prompt_bytes as u32, range.lo);
        let (mut lo, mut hi) = (0usize, self.entries);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let (r, bytes, _, _) = self.entry(mid);
            if (bytes, r.lo) < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == self.entries {
            return None;
        }
        let (r, bytes, count, first) = self.entry(lo);
        (bytes as usize == prompt_bytes && r == range).then(|| self.pairs(first, count))
    }

    pub fn entries(&self) -> usize {
        self.entries
    }
}
