//! Computing a part's next-token table at build time (`index::read::next_table` has its layout and
//! reads it): the most frequent short prompts' exact next-token counts, kept within a budget.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;

use rayon::prelude::*;

use crate::index::format::NextTableSpec;
use crate::index::ranks::RankRange;
use crate::index::read::next_table::{write, Entry, ENTRY_BYTES, HEADER_BYTES, PAIR_BYTES};
use crate::index::read::next_tokens::{sum_by_token, token_of_key};
use crate::index::read::part::{NextKey, Part, END};
use crate::index::{IndexError, Result};

/// Ranks whose suffixes are asked for together, one block ahead of the pass over them.
const PREFETCH_BLOCK: u64 = 64;
/// Computes the table of `part` and writes it to `path`; returns how many prompts got an entry.
pub fn build(part: &Part, eos_token_id: u32, spec: &NextTableSpec, path: &Path) -> Result<u64> {
    let mut firsts = first_token_ranges(part, spec.min_count.max(1))?;
    // The largest ranges first, a few at a time in parallel; after each batch the smallest entries go
    // while the table is over its budget, so memory stays near the budget whatever the corpus.
    firsts.sort_unstable_by_key(|r| std::cmp::Reverse(r.len()));
    let mut kept = Kept::default();
    for batch in firsts.chunks(4 * rayon::current_num_threads()) {
        let found = batch
            .par_iter()
            .map(|&range| groups_under(part, range, eos_token_id, spec))
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
fn first_token_ranges(part: &Part, min_count: u64) -> Result<Vec<RankRange>> {
    let width = part.width();
    let mut ranges = Vec::new();
    let mut bytes = Vec::with_capacity(width.bytes());
    let mut rank = 0;
    while rank < part.tok_cnt() {
        if crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted);
        }
        let token = part.next_key(rank, 0);
        bytes.clear();
        width.encode_into(&[token as u32], &mut bytes);
        let range = part.find(
            &bytes,
            RankRange {
                lo: rank,
                hi: part.tok_cnt(),
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
    part: &Part,
    first: RankRange,
    eos_token_id: u32,
    spec: &NextTableSpec,
) -> Result<Vec<Entry>> {
    let levels = spec.max_prompt_tokens as usize;
    let w = part.width().bytes();
    let sep = part.width().separator() as NextKey;
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
                part.prefetch_suffix(r);
            }
        }
        for (j, key) in keys.iter_mut().enumerate() {
            *key = part.next_key(rank, (j + 1) * w);
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
