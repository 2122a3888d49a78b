//! Exact next-token counts of one suffix-array range, the work behind `ntd`, `infgram_ntd` and every
//! full distribution a mix asks for.
//!
//! A prompt's range is sorted by the token that follows it, so each distinct next token is one run of
//! ranks. Two ways give the runs, chosen per range (the measurements are in eval/ENGINE.md):
//! - **the next-token table** ([`crate::index::read::next_table`]), when the build stored the prompt: a
//!   lookup and a copy of its `d` counts. It holds the prompts with the largest ranges, where walking
//!   costs most (after a one-token prompt, the median ntd fell from 0.55 ms to 0.08 ms).
//! - **divide and conquer** (paper App. A) for every other range: a sub-range whose first and last next
//!   tokens agree is one run, else it is halved; about `2·d·log2(n/d)` reads for `d` runs over `n`
//!   ranks. Reading every rank in order instead (all `n` reads independent, so many are in flight at
//!   once) was measured too, for sub-ranges below 4 to 32 ranks: never faster, up to 1.6× slower,
//!   because ranges that are not in the table are short or have long runs.

use crate::index::ranks::RankRange;
use crate::index::read::part::{NextKey, Part, END};
use crate::index::{IndexError, Result};

/// How many reads pass between two checks for an interrupt.
const INTERRUPT_EVERY: u64 = 1024;

/// Appends one `(next key, count)` pair per run of `range` (a match of `query_bytes` bytes) to `runs`.
/// A table hit appends token ids, which are keys that [`token_of_key`] leaves as they are (ids stay
/// below the separator); a token may appear more than once (split runs, or the table's eos that stands
/// for separators and the part's end), and counts add up. Stops when the process is interrupted.
/// Returns whether the runs came in rank order (walked, not read from the table).
pub fn collect_runs(
    part: &Part,
    range: RankRange,
    query_bytes: usize,
    runs: &mut Vec<(NextKey, u64)>,
) -> Result<bool> {
    // The table holds no empty range, and the divide and conquer returns at once on one.
    match part.next_table().and_then(|t| t.lookup(query_bytes, range)) {
        Some(counts) => {
            runs.extend(counts.map(|(token, n)| (token as NextKey, n as u64)));
            Ok(false)
        }
        None => ordered_runs(part, range, query_bytes, runs).map(|()| true),
    }
}

/// Open ranges halved at once. A range's halving waits on its two reads; the reads of several
/// ranges do not wait on each other, so their cache misses overlap.
const HALVED_AT_ONCE: usize = 8;

/// The runs of `range` in rank order (divide and conquer, never the table, whose counts are in
/// token order).
pub fn ordered_runs(
    part: &Part,
    range: RankRange,
    query_bytes: usize,
    runs: &mut Vec<(NextKey, u64)>,
) -> Result<()> {
    if range.is_empty() {
        return Ok(());
    }
    let key = |rank| part.next_key(rank, query_bytes);
    // Ranges with the keys at their ends; the top is the leftmost, so runs leave from the top in
    // rank order. Depth first, it holds at most a few ranges a level, and ranges halve: 64
    // places (2 KiB) last most walks, and it grows past that.
    let mut stack = Vec::with_capacity(64);
    stack.push((range.lo, range.hi, key(range.lo), key(range.hi - 1)));
    let (mut reads, mut checked) = (2u64, 0u64);
    loop {
        if reads - checked >= INTERRUPT_EVERY {
            checked = reads;
            if crate::interrupt::interrupted() {
                return Err(IndexError::Interrupted);
            }
        }
        while let Some(&(lo, hi, first, last)) = stack.last() {
            if first != last {
                break;
            }
            runs.push((first, hi - lo));
            stack.pop();
        }
        // The open ranges on top, up to the first run below them, are halved together.
        let open = (stack.iter().rev().take(HALVED_AT_ONCE))
            .take_while(|&&(_, _, first, last)| first != last)
            .count();
        if open == 0 {
            return Ok(());
        }
        let from = stack.len() - open;
        // Each open range with its middle and the keys either side of it.
        let mut halved = [(0, 0, 0, 0, (0, 0), 0); HALVED_AT_ONCE];
        for (half, &(lo, hi, first, last)) in halved.iter_mut().zip(&stack[from..]) {
            let mid = lo + (hi - lo) / 2;
            *half = (lo, mid, hi, first, (key(mid - 1), key(mid)), last);
        }
        reads += 2 * open as u64;
        stack.truncate(from);
        // From the rightmost, so that the leftmost half ends on top.
        for &(lo, mid, hi, first, (left_last, right_first), last) in &halved[..open] {
            stack.push((mid, hi, right_first, last));
            stack.push((lo, mid, first, left_last));
        }
    }
}

/// The token a next key stands for: the end of the part and a document separator both mean eos.
pub fn token_of_key(key: NextKey, separator: u32, eos_token_id: u32) -> u32 {
    if key == END || key == separator as NextKey {
        eos_token_id
    } else {
        key as u32
    }
}

/// One `(token, count)` per token, in token order: counts of the same token added up.
pub fn sum_by_token<N: Copy + std::ops::AddAssign>(mut counts: Vec<(u32, N)>) -> Vec<(u32, N)> {
    counts.sort_unstable_by_key(|&(token, _)| token);
    counts.dedup_by(|next, kept| {
        let same = next.0 == kept.0;
        if same {
            kept.1 += next.1;
        }
        same
    });
    counts
}
