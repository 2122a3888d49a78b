//! A Huffman-shaped wavelet tree: a sequence of symbols as one compressed bit vector per inner
//! node of the symbols' Huffman tree. A frequent symbol sits near the root, so it costs few bits
//! and few ranks; the sequence takes about `n·H0` bits before the bit vectors compress it
//! further. It answers the three questions an FM-index asks of its Burrows-Wheeler transform:
//! how often a symbol occurs before a position (rank), which symbol sits at a position and how
//! often it occurred before (one descent), and which symbols occur in a range with their counts
//! (one descent per symbol found, whatever the range's length).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

mod place;

use crate::index::fm::bits::{CompressedBits, PAIRS_TOGETHER};
use crate::index::fm::file::{WordReader, Words};
use crate::index::Result;

/// Where an inner node's 0 or 1 branch leads.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Link {
    Node(u32),
    Leaf(u32),
}

/// Marks a link word as a leaf (its symbol in the low bits) rather than an inner node.
pub(super) const LEAF_TAG: u64 = 1 << 63;

impl Link {
    fn word(self) -> u64 {
        match self {
            Link::Node(n) => n as u64,
            Link::Leaf(s) => LEAF_TAG | s as u64,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Node {
    bits: CompressedBits,
    links: [Link; 2],
}

/// A symbol's path from the root: bit `l` is the branch taken at depth `l`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Code {
    bits: u64,
    len: u8,
}

/// Deepest path accepted: a code is one u64 (Huffman needs about 1.44·log2 n levels at worst).
const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, PartialEq)]
pub struct HuffmanWavelet {
    nodes: Vec<Node>,
    /// Code of each symbol below `codes.len()`; `len == 0` for a symbol that never occurs.
    codes: Vec<Code>,
    /// Codes of symbols too large for `codes` (the transform's end marker), sorted.
    rare_codes: Vec<(u32, Code)>,
    len: u64,
}

/// Walks taken together over an index: with two reads each asked for ahead, enough to keep a
/// core's queue of pending misses full (mini-Pile bytes: 16 walks 23.4 µs a place, 32 18.8, 64
/// 20.9).
pub const WALKS: usize = 32;

/// Symbols below this many get a slot in the dense code table; others (the end marker) are
/// looked up in a short sorted list.
const DENSE_SYMBOLS: u32 = 1 << 24;

impl HuffmanWavelet {
    /// The tree of `symbols` (at least one), read twice: once to count them, once to place them.
    pub fn new(symbols: impl Iterator<Item = u32> + Clone) -> Self {
        let mut counts = symbol_counts(symbols.clone());
        // One distinct symbol gets a companion that never occurs, so the tree has a root.
        if let [(only, _)] = counts[..] {
            counts.push((only ^ 1, 0));
        }
        counts.sort_unstable();
        let (forest, root) = huffman(&counts);
        let mut tree = HuffmanWavelet {
            nodes: Vec::new(),
            codes: Vec::new(),
            rare_codes: Vec::new(),
            len: counts.iter().map(|&(_, c)| c).sum(),
        };
        // Inner nodes numbered depth first from the root, as `read` renumbers them.
        let mut links = Vec::new();
        tree.number(&forest, root, Code::default(), &mut links);
        // The bits each node receives: the counts of the symbols below it.
        let mut sizes = vec![0u64; links.len()];
        let mut codes = Vec::with_capacity(counts.len());
        for &(symbol, count) in &counts {
            let code = tree.code(symbol).unwrap_or_default();
            let mut node = 0usize;
            for level in 0..code.len {
                sizes[node] += count;
                if let Link::Node(next) = links[node][(code.bits >> level & 1) as usize] {
                    node = next as usize;
                }
            }
            codes.push((symbol, code));
        }
        let shape = place::Shape {
            codes,
            links: &links,
            sizes: &sizes,
        };
        let words = place::place(symbols, &shape);
        tree.nodes = words
            .into_iter()
            .zip(sizes)
            .zip(links)
            .map(|((words, len), links)| Node {
                bits: CompressedBits::new(&words, len),
                links,
            })
            .collect();
        tree
    }

    /// Numbers the inner nodes under `at`, recording their links and the leaves' codes.
    fn number(
        &mut self,
        forest: &[Tree],
        at: usize,
        code: Code,
        links: &mut Vec<[Link; 2]>,
    ) -> Link {
        match forest[at] {
            Tree::Leaf(symbol) => {
                self.set_code(symbol, code);
                Link::Leaf(symbol)
            }
            Tree::Pair(zero, one) => {
                let id = links.len();
                links.push([Link::Node(0); 2]);
                let left = Code {
                    bits: code.bits,
                    len: code.len + 1,
                };
                let right = Code {
                    bits: code.bits | 1 << code.len,
                    len: code.len + 1,
                };
                links[id] = [
                    self.number(forest, zero, left, links),
                    self.number(forest, one, right, links),
                ];
                Link::Node(id as u32)
            }
        }
    }

    fn set_code(&mut self, symbol: u32, code: Code) {
        if symbol < DENSE_SYMBOLS {
            let at = symbol as usize;
            if self.codes.len() <= at {
                self.codes.resize(at + 1, Code::default());
            }
            self.codes[at] = code;
        } else {
            let at = self.rare_codes.partition_point(|&(s, _)| s < symbol);
            self.rare_codes.insert(at, (symbol, code));
        }
    }

    fn code(&self, symbol: u32) -> Option<Code> {
        let code = if symbol < DENSE_SYMBOLS {
            self.codes.get(symbol as usize).copied()
        } else {
            let at = self.rare_codes.partition_point(|&(s, _)| s < symbol);
            self.rare_codes
                .get(at)
                .filter(|&&(s, _)| s == symbol)
                .map(|&(_, c)| c)
        };
        code.filter(|c| c.len > 0)
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Asks for the first line [`HuffmanWavelet::symbols_and_ranks`] at `i` will read.
    pub fn prefetch(&self, i: u64) {
        self.nodes[0].bits.prefetch(i);
    }

    /// The symbol at `i` and its occurrences in `[0, i)`.
    pub fn symbol_and_rank(&self, i: u64) -> (u32, u64) {
        let mut out = [(0, 0)];
        self.symbols_and_ranks::<1>(&[i], &mut out);
        out[0]
    }

    /// The symbol at each of `at` (at most `N`) and its occurrences before it, into `out` (as
    /// many). The descents go down level by level together: every walk's line asked for, then
    /// every offset, then each decoded, so that the misses of all the walks overlap.
    pub fn symbols_and_ranks<const N: usize>(&self, at: &[u64], out: &mut [(u32, u64)]) {
        assert!(
            at.len() <= N && out.len() == at.len(),
            "at most {N} walks, an answer each"
        );
        // Each walk's node and position, and the walks still descending.
        let mut walks = [(0usize, 0u64); N];
        let mut active = [0usize; N];
        for (c, &i) in at.iter().enumerate() {
            walks[c] = (0, i);
            active[c] = c;
        }
        let mut descending = at.len();
        while descending > 0 {
            let active_now = &active[..descending];
            for &c in active_now {
                let (node, i) = walks[c];
                self.nodes[node].bits.prefetch(i);
            }
            let mut pending = [None; N];
            for &c in active_now {
                let (node, i) = walks[c];
                pending[c] = self.nodes[node].bits.begin(i);
            }
            let mut still = 0;
            for a in 0..descending {
                let c = active[a];
                let (n, i) = walks[c];
                let node = &self.nodes[n];
                let (ones, bit) = node.bits.finish(pending[c]);
                let i = if bit { ones } else { i - ones };
                match node.links[bit as usize] {
                    Link::Node(next) => {
                        walks[c] = (next as usize, i);
                        active[still] = c;
                        still += 1;
                    }
                    Link::Leaf(symbol) => out[c] = (symbol, i),
                }
            }
            descending = still;
        }
    }

    /// Every symbol occurring in `[lo, hi)` with its count, in no particular order; or at
    /// least the first `limit` found, when only whether there are that many matters.
    pub fn counts_in(&self, lo: u64, hi: u64, limit: usize, out: &mut Vec<(u32, u64)>) {
        self.descend(lo, hi, limit, |symbol, lo, hi| out.push((symbol, hi - lo)));
    }

    /// Every symbol occurring in `[lo, hi)` with its occurrences before `lo` and before `hi`
    /// (`(symbol, rank at lo, rank at hi)`), in no particular order: one LF step of the range
    /// by every symbol that extends it, in one descent.
    pub fn ranks_in(&self, lo: u64, hi: u64, out: &mut Vec<(u32, u64, u64)>) {
        self.descend(lo, hi, usize::MAX, |symbol, lo, hi| {
            out.push((symbol, lo, hi))
        });
    }

    /// Calls `leaf(symbol, rank at lo, rank at hi)` for the symbols of `[lo, hi)`, at least
    /// `limit` of them or all when fewer. The tree is walked depth first, the ranks of up to
    /// [`PAIRS_TOGETHER`] nodes from the top of the stack taken together, so that a range of
    /// many symbols waits for memory once a batch, not once a node, and a small `limit` still
    /// stops after about one descent's batches.
    fn descend(&self, lo: u64, hi: u64, limit: usize, mut leaf: impl FnMut(u32, u64, u64)) {
        if lo >= hi {
            return;
        }
        let mut found = 0;
        let mut stack = vec![(0usize, lo, hi)];
        let (mut asks, mut ones) = (Vec::new(), Vec::new());
        while !stack.is_empty() && found < limit {
            let batch = stack.split_off(stack.len().saturating_sub(PAIRS_TOGETHER));
            asks.clear();
            asks.extend(
                batch
                    .iter()
                    .map(|&(n, lo, hi)| (&self.nodes[n].bits, lo, hi)),
            );
            ones.clear();
            CompressedBits::rank1_pairs(&asks, &mut ones);
            for (&(n, lo, hi), &(ones_lo, ones_hi)) in batch.iter().zip(&ones) {
                let branches = branches((lo, hi), (ones_lo, ones_hi));
                for (link, (lo, hi)) in self.nodes[n].links.iter().zip(branches) {
                    if lo < hi {
                        match *link {
                            Link::Node(child) => stack.push((child as usize, lo, hi)),
                            Link::Leaf(symbol) => {
                                leaf(symbol, lo, hi);
                                found += 1;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Bytes the tree occupies.
    pub fn size_bytes(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| n.bits.size_bytes() + 16)
            .sum::<u64>()
    }

    pub fn write(&self, out: &mut Words) {
        out.u64(self.len);
        out.u64(self.nodes.len() as u64);
        for node in &self.nodes {
            out.u64(node.links[0].word());
            out.u64(node.links[1].word());
            node.bits.write(out);
        }
    }

    /// Reads a tree written by [`HuffmanWavelet::write`], checking that it is one tree whose
    /// every node holds as many bits as its parent sends it.
    pub fn read(input: &mut WordReader) -> Result<Self> {
        let len = input.u64()?;
        let count = input.u64()?;
        if count == 0 || count > (1 << 32) {
            return input.corrupt("a wavelet tree needs between 1 and 2^32 nodes");
        }
        let mut nodes = Vec::new();
        for _ in 0..count {
            let mut links = [Link::Node(0); 2];
            for link in &mut links {
                let word = input.u64()?;
                *link = if word & LEAF_TAG != 0 {
                    Link::Leaf((word & !LEAF_TAG) as u32)
                } else if word < count && word > 0 {
                    Link::Node(word as u32)
                } else {
                    return input.corrupt("a wavelet tree links to a node it does not have");
                };
            }
            let bits = CompressedBits::read(input)?;
            nodes.push(Node { bits, links });
        }
        let mut tree = HuffmanWavelet {
            nodes: Vec::new(),
            codes: Vec::new(),
            rare_codes: Vec::new(),
            len,
        };
        // Walk from the root: each node reached once, at the bit count its parent gives it.
        let mut reached = vec![false; nodes.len()];
        let mut stack = vec![(0usize, len, Code::default())];
        while let Some((n, expected, code)) = stack.pop() {
            let node = &nodes[n];
            if reached[n] || node.bits.len() != expected || code.len as usize >= MAX_DEPTH {
                return input.corrupt("a wavelet tree's nodes do not form one tree");
            }
            reached[n] = true;
            let ones = node.bits.rank1(expected);
            for (bit, count) in [(0u64, expected - ones), (1, ones)] {
                let child = Code {
                    bits: code.bits | bit << code.len,
                    len: code.len + 1,
                };
                match node.links[bit as usize] {
                    Link::Node(c) => stack.push((c as usize, count, child)),
                    Link::Leaf(symbol) => {
                        if tree.code(symbol).is_some() {
                            return input.corrupt("a wavelet tree has a symbol twice");
                        }
                        tree.set_code(symbol, child);
                    }
                }
            }
        }
        if reached.iter().any(|&r| !r) {
            return input.corrupt("a wavelet tree has nodes no path reaches");
        }
        tree.nodes = nodes;
        Ok(tree)
    }
}

/// Where the rows before `lo` and before `hi` of a node fall in its two children, given the ones
/// before each: the zeros' side, then the ones'.
fn branches((lo, hi): (u64, u64), (ones_lo, ones_hi): (u64, u64)) -> [(u64, u64); 2] {
    [(lo - ones_lo, hi - ones_hi), (ones_lo, ones_hi)]
}

/// Occurrences of `symbol` in `tree` before `lo` and before `hi`, asked of [`rank_pairs`].
#[derive(Debug, Clone, Copy)]
pub struct RankPair<'a> {
    pub tree: &'a HuffmanWavelet,
    pub symbol: u32,
    pub lo: u64,
    pub hi: u64,
}

/// Answers each ask in place: its `lo` and `hi` become its symbol's occurrences before them (0
/// where its tree lacks the symbol). One descent an ask, all going down level by level together,
/// so that the misses of every tree asked (the parts of one index) overlap.
pub fn rank_pairs(asks: &mut [RankPair<'_>]) {
    // The descents still going: the ask, its symbol's code, its node and its depth.
    let mut descents = Vec::with_capacity(asks.len());
    for (a, ask) in asks.iter_mut().enumerate() {
        match ask.tree.code(ask.symbol) {
            Some(code) => descents.push((a, code, 0usize, 0u8)),
            None => (ask.lo, ask.hi) = (0, 0),
        }
    }
    let (mut level, mut ones) = (Vec::new(), Vec::new());
    while !descents.is_empty() {
        level.clear();
        level.extend(descents.iter().map(|&(a, _, node, _)| {
            let RankPair { tree, lo, hi, .. } = asks[a];
            (&tree.nodes[node].bits, lo, hi)
        }));
        ones.clear();
        CompressedBits::rank1_pairs(&level, &mut ones);
        let mut still = 0;
        for d in 0..descents.len() {
            let (a, code, node, depth) = descents[d];
            let ask = &mut asks[a];
            let bit = code.bits >> depth & 1;
            (ask.lo, ask.hi) = branches((ask.lo, ask.hi), ones[d])[bit as usize];
            if let Link::Node(next) = ask.tree.nodes[node].links[bit as usize] {
                descents[still] = (a, code, next as usize, depth + 1);
                still += 1;
            }
        }
        descents.truncate(still);
    }
}

/// Every symbol with its count: counted in a table below `DENSE_SYMBOLS`, in a map above.
fn symbol_counts(symbols: impl Iterator<Item = u32>) -> Vec<(u32, u64)> {
    let mut dense = Vec::<u64>::new();
    let mut rare = std::collections::HashMap::<u32, u64>::new();
    symbols.for_each(|s| {
        if s < DENSE_SYMBOLS {
            if dense.len() <= s as usize {
                dense.resize(s as usize + 1, 0);
            }
            dense[s as usize] += 1;
        } else {
            *rare.entry(s).or_default() += 1;
        }
    });
    (0u32..)
        .zip(dense)
        .filter(|&(_, c)| c > 0)
        .chain(rare)
        .collect()
}

/// The Huffman forest: leaves, then the pairs merged from them.
enum Tree {
    Leaf(u32),
    Pair(usize, usize),
}

/// Huffman's tree over `(symbol, count)` pairs (two at least): the forest and its root.
fn huffman(counts: &[(u32, u64)]) -> (Vec<Tree>, usize) {
    let mut forest: Vec<Tree> = counts.iter().map(|&(s, _)| Tree::Leaf(s)).collect();
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = counts
        .iter()
        .enumerate()
        .map(|(i, &(_, n))| Reverse((n, i)))
        .collect();
    while let (Some(Reverse((a, i))), Some(Reverse((b, j)))) = (heap.pop(), heap.pop()) {
        forest.push(Tree::Pair(i, j));
        heap.push(Reverse((a + b, forest.len() - 1)));
    }
    let root = forest.len() - 1;
    (forest, root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    /// Checks every position's symbol and rank against a running count.
    fn assert_answers_as_counting_does(symbols: &[u32]) {
        let tree = HuffmanWavelet::new(symbols.iter().copied());
        let mut seen = std::collections::HashMap::<u32, u64>::new();
        for (i, &s) in symbols.iter().enumerate() {
            let before = seen.entry(s).or_default();
            assert_eq!(tree.symbol_and_rank(i as u64), (s, *before), "at {i}");
            *before += 1;
        }
    }

    /// Sequences longer than the placing's block, so that nodes are filled across blocks from
    /// unaligned bits: a skewed byte alphabet (one-byte indexes), 1,000 symbols (two-byte) and
    /// more than 65,536 with the end marker (four-byte indexes).
    #[test]
    fn sequences_of_several_blocks_answer_as_counting_does() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let n = (1 << 18) * 2 + 12_345;
        let bytes: Vec<u32> = (0..n)
            .map(|_| (rng.random::<f64>().powi(3) * 256.0) as u32)
            .collect();
        assert_answers_as_counting_does(&bytes);
        let words: Vec<u32> = (0..n).map(|_| rng.random_range(0..1_000)).collect();
        assert_answers_as_counting_does(&words);
        let mut wide: Vec<u32> = (0..n).map(|_| rng.random_range(0..70_000)).collect();
        wide[n / 3] = u32::MAX;
        assert_answers_as_counting_does(&wide);
    }

    proptest! {
        #[test]
        fn answers_as_counting_does(
            symbols in proptest::collection::vec(
                prop_oneof![4 => 0u32..6, 1 => 0u32..70_000, 1 => Just(u32::MAX)], 2..600),
            lo in 0usize..600,
            span in 0usize..600,
        ) {
            prop_assume!(symbols.iter().any(|&s| s != symbols[0]));
            let tree = HuffmanWavelet::new(symbols.iter().copied());
            for (i, &s) in symbols.iter().enumerate() {
                let before = symbols[..i].iter().filter(|&&x| x == s).count() as u64;
                prop_assert_eq!(tree.symbol_and_rank(i as u64), (s, before));
            }
            // Rank pairs of every symbol at every place, and of one the tree lacks, asked of
            // this tree and of a second one together.
            let n = symbols.len() as u64;
            let reversed: Vec<u32> = symbols.iter().rev().copied().collect();
            let second = HuffmanWavelet::new(reversed.iter().copied());
            let mut asks = Vec::new();
            for (i, &s) in symbols.iter().enumerate() {
                let i = i as u64;
                asks.push(RankPair { tree: &tree, symbol: s, lo: i, hi: n });
                asks.push(RankPair { tree: &second, symbol: s, lo: n - i, hi: i });
            }
            asks.push(RankPair { tree: &tree, symbol: 7_000_000, lo: 0, hi: n });
            let expected: Vec<_> = asks
                .iter()
                .map(|ask| {
                    let seq = if std::ptr::eq(ask.tree, &tree) { &symbols } else { &reversed };
                    let before = |i: u64| seq[..i as usize].iter().filter(|&&x| x == ask.symbol).count() as u64;
                    (before(ask.lo), before(ask.hi))
                })
                .collect();
            rank_pairs(&mut asks);
            prop_assert_eq!(asks.iter().map(|a| (a.lo, a.hi)).collect::<Vec<_>>(), expected);
            let (lo, hi) = (lo.min(symbols.len()), (lo + span).min(symbols.len()));
            let mut got = Vec::new();
            tree.counts_in(lo as u64, hi as u64, usize::MAX, &mut got);
            got.sort_unstable();
            let mut expected = std::collections::BTreeMap::<u32, u64>::new();
            symbols[lo..hi].iter().for_each(|&s| *expected.entry(s).or_default() += 1);
            let expected: Vec<_> = expected.into_iter().collect();
            prop_assert_eq!(&got, &expected);
            // A limit stops the walk early with at least that many symbols, each counted whole.
            for limit in 0..8 {
                let mut some = Vec::new();
                tree.counts_in(lo as u64, hi as u64, limit, &mut some);
                prop_assert!(some.len() >= limit.min(expected.len()), "{} for {}", some.len(), limit);
                prop_assert!(some.iter().all(|s| expected.contains(s)));
                some.sort_unstable();
                some.dedup();
                prop_assert!(some.len() >= limit.min(expected.len()));
            }
            let mut words = Words::default();
            tree.write(&mut words);
            let bytes = words.into_bytes();
            let read = HuffmanWavelet::read(&mut WordReader::new(&bytes, "test")).unwrap();
            prop_assert_eq!(read, tree);
        }
    }
}
