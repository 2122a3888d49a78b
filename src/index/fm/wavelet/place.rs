//! Placing a sequence's symbols in the bit vectors of its Huffman-shaped wavelet tree.
//!
//! One symbol at a time down its path (a loop of its code's length, a read-modify-write of every
//! node's fill count and word it passes) spent 16 ns a byte on a part of source code. Here a block of the sequence at a time goes down
//! one level at a time, stably partitioned by node, as a wavelet tree is defined: at each level a
//! node's symbols lie together, so its bits are packed in a register, and each symbol is copied
//! into both children's runs, only the one it belongs to moving on (no branch, no select). Four
//! blocks of scratch, no copy of the sequence; a direct build takes a tenth less CPU
//! (eval/RESULTS.md, "One thread each, side by side").

use std::collections::HashMap;

use super::{Code, Link, DENSE_SYMBOLS};

/// Symbols a block holds: four blocks of one-byte indexes stay in a core's L2 cache.
const BLOCK: usize = 1 << 16;
/// Slots of a scratch buffer: a power of two above `BLOCK`, so that an index masked by
/// `SLOTS - 1` needs no bounds check, and a copy that does not move on may land one past a run.
const SLOTS: usize = 2 * BLOCK;

/// A symbol's place among the sequence's distinct symbols, in the narrowest integer that holds
/// them all: the blocks are copied at every level, so a byte index keeps them small.
trait SymbolIndex: Copy + Default {
    fn of(i: u32) -> Self;
    fn at(self) -> usize;
}

impl SymbolIndex for u8 {
    fn of(i: u32) -> Self {
        i as u8
    }
    fn at(self) -> usize {
        self as usize
    }
}

impl SymbolIndex for u16 {
    fn of(i: u32) -> Self {
        i as u16
    }
    fn at(self) -> usize {
        self as usize
    }
}

impl SymbolIndex for u32 {
    fn of(i: u32) -> Self {
        i
    }
    fn at(self) -> usize {
        self as usize
    }
}

/// What placing needs to know of a tree: each distinct symbol's code, and the links.
pub(super) struct Shape<'a> {
    /// Every symbol the tree has (including one that never occurs), with its code.
    pub codes: Vec<(u32, Code)>,
    /// Each inner node's two links, the root first.
    pub links: &'a [[Link; 2]],
    /// Bits each inner node holds over the whole sequence.
    pub sizes: &'a [u64],
}

/// The bits of every inner node of `shape` for `symbols` (each one the tree has), as words.
pub(super) fn place(symbols: impl Iterator<Item = u32>, shape: &Shape) -> Vec<Vec<u64>> {
    match shape.codes.len() {
        0..=0x100 => Placer::<u8>::new(shape).run(symbols),
        0x101..=0x1_0000 => Placer::<u16>::new(shape).run(symbols),
        _ => Placer::<u32>::new(shape).run(symbols),
    }
}

/// A symbol's move at one level (`levels`): its bit there, and which child's run it joins, if
/// either (none when its path ends in the child).
const BIT: u8 = 1;
const TO_ZEROS: u8 = 2;
const TO_ONES: u8 = 4;

/// A node's run of a block at one level: `(node, scratch buffer, start, length)`.
type Run = (usize, usize, usize, usize);

struct Placer<'a, I> {
    links: &'a [[Link; 2]],
    indexes: Indexes,
    /// `levels[depth · distinct + index]`: the symbol's move at that depth (meaningful while
    /// its path is that deep).
    levels: Vec<u8>,
    distinct: usize,
    words: Vec<Vec<u64>>,
    /// Bits written into each node so far.
    filled: Vec<u64>,
    /// Four blocks of indexes: a level's runs are read from two (the zeros' and the ones' side
    /// of the level above) and its children's written into the other two.
    scratch: [Box<[I; SLOTS]>; 4],
}

/// A symbol's index: a table below `DENSE_SYMBOLS`, a map above (the end marker).
#[derive(Default)]
struct Indexes {
    dense: Vec<u32>,
    rare: HashMap<u32, u32>,
}

impl Indexes {
    fn insert(&mut self, symbol: u32, index: u32) {
        if symbol < DENSE_SYMBOLS {
            if self.dense.len() <= symbol as usize {
                self.dense.resize(symbol as usize + 1, 0);
            }
            self.dense[symbol as usize] = index;
        } else {
            self.rare.insert(symbol, index);
        }
    }

    fn get<I: SymbolIndex>(&self, symbol: u32) -> I {
        I::of(match symbol < DENSE_SYMBOLS {
            true => self.dense[symbol as usize],
            false => self.rare[&symbol],
        })
    }
}

impl<'a, I: SymbolIndex> Placer<'a, I> {
    fn new(shape: &Shape<'a>) -> Self {
        let distinct = shape.codes.len();
        let depth = shape.codes.iter().map(|(_, c)| c.len as usize).max();
        let mut placer = Placer {
            links: shape.links,
            indexes: Indexes::default(),
            levels: vec![0; depth.unwrap_or(0) * distinct],
            distinct,
            words: (shape.sizes.iter())
                .map(|&n| vec![0; n.div_ceil(64) as usize])
                .collect(),
            filled: vec![0; shape.links.len()],
            scratch: [(); 4].map(|()| scratch_block()),
        };
        for (index, &(symbol, code)) in (0u32..).zip(&shape.codes) {
            placer.indexes.insert(symbol, index);
            for level in 0..code.len as usize {
                let bit = (code.bits >> level & 1) as u8;
                let goes_on = level + 1 < code.len as usize;
                let joins = if bit == 1 { TO_ONES } else { TO_ZEROS };
                placer.levels[level * distinct + index as usize] = bit | (joins * goes_on as u8);
            }
        }
        placer
    }

    fn run(mut self, mut symbols: impl Iterator<Item = u32>) -> Vec<Vec<u64>> {
        loop {
            let mut len = 0;
            let slots = self.scratch[0][..BLOCK].iter_mut();
            for (slot, symbol) in slots.zip(symbols.by_ref()) {
                *slot = self.indexes.get(symbol);
                len += 1;
            }
            if len == 0 {
                return self.words;
            }
            self.place_block(len);
        }
    }

    /// Places the block of `len` symbols in the first scratch buffer, level by level.
    fn place_block(&mut self, len: usize) {
        let mut runs: Vec<Run> = vec![(0, 0, 0, len)];
        let mut next_runs = Vec::new();
        for level in 0.. {
            if runs.is_empty() {
                break;
            }
            let table = &self.levels[level * self.distinct..(level + 1) * self.distinct];
            // Even levels read buffers 0 and 1 and write 2 and 3; odd levels the other way.
            let (low, high) = self.scratch.split_at_mut(2);
            let (from, to) = match level % 2 {
                0 => (low, high),
                _ => (high, low),
            };
            let (zeros, ones) = to.split_at_mut(1);
            let mut ends = [0usize; 2];
            next_runs.clear();
            for &(node, buffer, start, len) in &runs {
                let began = ends;
                let filled = self.filled[node];
                self.filled[node] += len as u64;
                split_run(
                    &from[buffer][start..start + len],
                    table,
                    (&mut zeros[0], &mut ones[0], &mut ends),
                    (&mut self.words[node], filled),
                );
                for side in 0..2 {
                    if let Link::Node(child) = self.links[node][side] {
                        if ends[side] > began[side] {
                            let len = ends[side] - began[side];
                            next_runs.push((child as usize, side, began[side], len));
                        }
                    }
                }
            }
            std::mem::swap(&mut runs, &mut next_runs);
        }
    }
}

/// A zeroed scratch buffer.
fn scratch_block<I: SymbolIndex>() -> Box<[I; SLOTS]> {
    let block: Box<[I]> = vec![I::default(); SLOTS].into_boxed_slice();
    block
        .try_into()
        .unwrap_or_else(|_| unreachable!("a vector of SLOTS items"))
}

/// One node's run at one level: each symbol's bit appended to the node's words from bit
/// `filled`, and the symbol copied to the ends of both children's runs (`ends`), the one it
/// joins moving on. A copy that does not move on is overwritten by the next one that does, or
/// lies one past the level's last run.
fn split_run<I: SymbolIndex>(
    run: &[I],
    table: &[u8],
    (zeros, ones, ends): (&mut [I; SLOTS], &mut [I; SLOTS], &mut [usize; 2]),
    (words, filled): (&mut [u64], u64),
) {
    let [mut zero_end, mut one_end] = *ends;
    let (mut word, mut shift) = ((filled / 64) as usize, filled % 64);
    let mut acc = words.get(word).copied().unwrap_or(0);
    for &symbol in run {
        let moves = table[symbol.at()];
        acc |= ((moves & BIT) as u64) << shift;
        shift += 1;
        if shift == 64 {
            words[word] = acc;
            word += 1;
            acc = 0;
            shift = 0;
        }
        zeros[zero_end & (SLOTS - 1)] = symbol;
        ones[one_end & (SLOTS - 1)] = symbol;
        zero_end += ((moves / TO_ZEROS) & 1) as usize;
        one_end += (moves / TO_ONES) as usize;
    }
    if shift > 0 {
        words[word] = acc;
    }
    *ends = [zero_end, one_end];
}
