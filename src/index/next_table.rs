//! The next-token table: exact next-token counts of a shard's most frequent short prompts, computed at
//! build time so that `ntd` after them costs one lookup and a copy instead of a walk over a range of
//! hundreds of thousands of ranks (eval/ENGINE.md has the cost model and the figures).
//!
//! An entry is found by the prompt's rank range, which [`Shard::find`] has already computed: ranges of
//! distinct prompts of one length never share a first rank, so `(prompt bytes, lo)` is a key.
//!
//! File `nexttok.N`, little-endian, every section 8-byte aligned:
//! - header, 32 bytes: magic `ISNEXT01`, u32 longest prompt (tokens), u32 the eos id that separators
//!   and the shard's end were counted as, u64 entries, u64 pairs;
//! - entries, 32 bytes each, sorted by (prompt bytes, lo): u64 lo, u64 hi, u32 prompt bytes,
//!   u32 pair count, u64 first pair;
//! - pairs, 8 bytes each, sorted by token within an entry: u32 token, u32 count. Separators and the
//!   shard's end are already counted as eos, as `ntd` answers them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::path::Path;

use memmap2::Mmap;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::index::next_tokens::{sum_by_token, token_of_key};
use crate::index::shard::{NextKey, RankRange, Shard, END};
use crate::index::{IndexError, Result};

const MAGIC: &[u8; 8] = b"ISNEXT01";
const HEADER_BYTES: usize = 32;
const ENTRY_BYTES: usize = 32;
const PAIR_BYTES: usize = 8;
/// Ranks whose suffixes are asked for together, one block ahead of the pass over them.
const PREFETCH_BLOCK: u64 = 64;

/// What a build was asked to put in the table, recorded in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextTableSpec {
    /// Longest prompt, in tokens, that gets an entry.
    pub max_prompt_tokens: u32,
    /// Fewest matches a prompt needs for an entry: below it, computing is as cheap as looking up.
    pub min_count: u64,
    /// Most bytes the table of one shard may take; the most frequent prompts are kept first.
    pub budget_bytes: u64,
}

impl Default for NextTableSpec {
    fn default() -> Self {
        NextTableSpec {
            max_prompt_tokens: 4,
            min_count: 2048,
            budget_bytes: 64 << 20,
        }
    }
}

/// One prompt's counts, before it is written.
struct Entry {
    prompt_bytes: u32,
    range: RankRange,
    pairs: Vec<(u32, u32)>,
}

/// Computes the table of `shard` and writes it to `path`; returns how many prompts got an entry.
pub fn build(shard: &Shard, eos_token_id: u32, spec: &NextTableSpec, path: &Path) -> Result<u64> {
    let mut firsts = first_token_ranges(shard, spec.min_count.max(1))?;
    // The largest ranges first, a few at a time in parallel; after each batch the smallest entries go
    // while the table is over its budget, so memory stays near the budget whatever the corpus.
    firsts.sort_unstable_by_key(|r| std::cmp::Reverse(r.len()));
    let mut kept = Kept::default();
    for batch in firsts.chunks(4 * rayon::current_num_threads()) {
        let found = batch
            .par_iter()
            .map(|&range| groups_under(shard, range, eos_token_id, spec))
            .collect::<Result<Vec<_>>>()?;
        for entry in found.into_iter().flatten() {
            kept.push(entry);
        }
        kept.shrink_to(spec.budget_bytes);
    }
    let mut entries = kept.into_entries();
    entries.sort_unstable_by_key(|e| (e.prompt_bytes, e.range.lo));
    write(path, spec.max_prompt_tokens, eos_token_id, &entries)?;
    Ok(entries.len() as u64)
}

/// Entries kept so far, smallest range on top, with the bytes they would take in the file.
#[derive(Default)]
struct Kept {
    heap: BinaryHeap<Reverse<BySize>>,
    bytes: u64,
}

/// An entry ordered by its range's length (ties by position, so the order is total).
struct BySize(Entry);

impl BySize {
    fn key(&self) -> (u64, u32, u64) {
        (self.0.range.len(), self.0.prompt_bytes, self.0.range.lo)
    }
}
impl PartialEq for BySize {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for BySize {}
impl PartialOrd for BySize {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for BySize {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

impl Kept {
    fn entry_bytes(e: &Entry) -> u64 {
        (ENTRY_BYTES + e.pairs.len() * PAIR_BYTES) as u64
    }
    fn push(&mut self, entry: Entry) {
        self.bytes += Self::entry_bytes(&entry);
        self.heap.push(Reverse(BySize(entry)));
    }
    /// Drops the smallest ranges until the header and the entries fit `budget` bytes.
    fn shrink_to(&mut self, budget: u64) {
        while HEADER_BYTES as u64 + self.bytes > budget {
            match self.heap.pop() {
                Some(Reverse(BySize(e))) => self.bytes -= Self::entry_bytes(&e),
                None => break,
            }
        }
    }
    fn into_entries(self) -> Vec<Entry> {
        self.heap.into_iter().map(|Reverse(BySize(e))| e).collect()
    }
}

/// The ranges of the one-token prompts with at least `min_count` matches, found by walking the suffix
/// array from range to range (one search per distinct first token, not one per vocabulary id).
fn first_token_ranges(shard: &Shard, min_count: u64) -> Result<Vec<RankRange>> {
    let width = shard.width();
    let mut ranges = Vec::new();
    let mut bytes = Vec::with_capacity(width.bytes());
    let mut rank = 0;
    while rank < shard.tok_cnt() {
        if crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted);
        }
        let token = shard.next_key(rank, 0);
        bytes.clear();
        width.encode_into(&[token as u32], &mut bytes);
        let range = shard.find(
            &bytes,
            RankRange {
                lo: rank,
                hi: shard.tok_cnt(),
            },
            0,
        );
        // Every rank holds a token, so the range starts here and is never empty.
        rank = range.hi.max(rank + 1);
        if token != width.separator() as NextKey && range.len() >= min_count {
            ranges.push(range);
        }
    }
    Ok(ranges)
}

/// The entries of every prompt of 1 to `max_prompt_tokens` tokens that starts with the token whose
/// range is `first`: one pass over the range, reading each rank's next tokens (one cache line).
fn groups_under(
    shard: &Shard,
    first: RankRange,
    eos_token_id: u32,
    spec: &NextTableSpec,
) -> Result<Vec<Entry>> {
    let levels = spec.max_prompt_tokens as usize;
    let w = shard.width().bytes();
    let sep = shard.width().separator() as NextKey;
    // Per prompt length l (index l - 1): where its current group began, and its runs of next keys.
    let mut starts = vec![first.lo; levels];
    let mut runs: Vec<Vec<(NextKey, u64)>> = vec![Vec::new(); levels];
    let mut prev: Vec<NextKey> = vec![0; levels];
    let mut keys: Vec<NextKey> = vec![0; levels];
    let mut out = Vec::new();
    let close = |level: usize,
                 start: u64,
                 end: u64,
                 runs: &mut Vec<(NextKey, u64)>,
                 prompt: &[NextKey],
                 out: &mut Vec<Entry>| {
        let valid = prompt.iter().all(|&k| k != END && k != sep);
        if valid && end - start >= spec.min_count && end - start <= u32::MAX as u64 {
            let pairs = runs
                .iter()
                .map(|&(k, n)| (token_of_key(k, sep as u32, eos_token_id), n as u32))
                .collect();
            let pairs = sum_by_token(pairs);
            out.push(Entry {
                prompt_bytes: ((level + 1) * w) as u32,
                range: RankRange { lo: start, hi: end },
                pairs,
            });
        }
        runs.clear();
    };
    for rank in first.lo..first.hi {
        if (rank - first.lo).is_multiple_of(1 << 16) && crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted);
        }
        // The reads below wait on memory; asking for the ranks a block ahead keeps many misses in
        // flight at once instead of one (measured: a quarter to a third less build time).
        if (rank - first.lo).is_multiple_of(PREFETCH_BLOCK) {
            let ahead =
                (rank + PREFETCH_BLOCK).min(first.hi)..(rank + 2 * PREFETCH_BLOCK).min(first.hi);
            for r in ahead {
                shard.prefetch_suffix(r);
            }
        }
        for (j, key) in keys.iter_mut().enumerate() {
            *key = shard.next_key(rank, (j + 1) * w);
        }
        // Prompts of length l share their first l - 1 next keys: the first key that changed closes the
        // groups of every longer prompt.
        let changed = if rank == first.lo {
            levels
        } else {
            keys.iter()
                .zip(&prev)
                .position(|(a, b)| a != b)
                .unwrap_or(levels)
        };
        for level in (changed + 1)..levels {
            close(
                level,
                starts[level],
                rank,
                &mut runs[level],
                &prev[..level],
                &mut out,
            );
            starts[level] = rank;
        }
        for level in 0..levels {
            let key = keys[level];
            match runs[level].last_mut() {
                Some((last, n)) if *last == key => *n += 1,
                _ => runs[level].push((key, 1)),
            }
        }
        std::mem::swap(&mut prev, &mut keys);
    }
    for level in 0..levels {
        close(
            level,
            starts[level],
            first.hi,
            &mut runs[level],
            &prev[..level],
            &mut out,
        );
    }
    Ok(out)
}

fn write(path: &Path, max_prompt_tokens: u32, eos_token_id: u32, entries: &[Entry]) -> Result<()> {
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

/// A shard's table, memory-mapped and checked at open.
pub struct NextTable {
    map: Mmap,
    entries: usize,
    max_prompt_bytes: usize,
    /// The smallest range with an entry: a shorter one is never looked up.
    min_count: u64,
}

impl NextTable {
    /// Maps `path` and checks it against `shard`: counted with the index's eos; every entry's range
    /// exactly the range of the prompt its first rank starts with (one search each), in order; pairs
    /// inside the file, of tokens below `vocab_size`, adding up to the range's length. One pass.
    pub fn open(path: &Path, shard: &Shard, vocab_size: u64, eos_token_id: u32) -> Result<Self> {
        let (width, tok_cnt) = (shard.width(), shard.tok_cnt());
        let map = crate::index::shard::map_file(path)?;
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
            let prompt = shard.suffix_prefix(range.lo, prompt_bytes as usize);
            if prompt.len() != prompt_bytes as usize
                || shard.find(prompt, shard.full_range(), 0) != range
            {
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
