//! Sampled ranks: the first 16 bytes of every [`STRIDE`]-th suffix of a part, kept in RAM, so that
//! a search's first steps run in a small array instead of the memory-mapped suffix array (two cache
//! misses a step there: the pointer, then the text). For a query of at most 16 bytes only the last
//! steps, within a stride of each end of the query's ranks, touch the maps; a longer one may also
//! search the ranks that share its first 16 bytes.
//!
//! Worth it where a lookup searches many small indexes one after the other, as the live index's runs
//! are: each run's search would otherwise pay its full depth of misses. It costs 16 bytes per
//! `STRIDE` tokens and one read of every `STRIDE`-th suffix at open.

use crate::index::ranks::RankRange;

/// Ranks between two samples: the suffix-array search left at each end of a query of at most 16
/// bytes takes log2(STRIDE) steps.
pub(crate) const STRIDE: u64 = 32;

/// Bytes of a sample's key.
pub(crate) const KEY_BYTES: usize = 16;

pub struct RankSamples {
    /// Key of rank `i * STRIDE`, for every such rank of the part, in rank order.
    keys: Vec<u128>,
}

/// The first 16 bytes of `bytes`, zero-padded, read big-endian: integers compare as the bytes do.
fn key(bytes: &[u8]) -> u128 {
    let mut buf = [0u8; KEY_BYTES];
    let n = bytes.len().min(KEY_BYTES);
    buf[..n].copy_from_slice(&bytes[..n]);
    u128::from_be_bytes(buf)
}

impl RankSamples {
    /// The samples of a part from the first bytes of every `STRIDE`-th suffix, in rank order,
    /// read on the calling thread: runs are sampled on the compactor's thread, which must not take
    /// the cores requests run on.
    pub fn of_prefixes<'a>(prefixes: impl Iterator<Item = &'a [u8]>) -> Self {
        Self {
            keys: prefixes.map(key).collect(),
        }
    }

    /// Where the suffixes starting with `query` can be in `within`, as the samples tell it: their
    /// keys are compared on the query's first bytes, up to 16.
    ///
    /// Exact because a sample's cut key decides its suffix's side whenever it differs from the
    /// query's: a smaller key is a smaller suffix that does not start with the query (a suffix
    /// shorter than the key is padded with zeros, and such a suffix is smaller than any query it
    /// does not differ from earlier), and a larger key differs at a byte the suffix has. Keys cut
    /// to a prefix stay in order, so the samples on each side are found by bisection. The range
    /// stays inside `within`, so an empty answer's place is the plain search's.
    pub fn bound(&self, query: &[u8], within: RankRange) -> Bounded {
        let cut = query.len().min(KEY_BYTES);
        if cut == 0 {
            return Bounded {
                range: within,
                equal: None,
            };
        }
        let mask = u128::MAX << (8 * (KEY_BYTES - cut));
        let q = key(query) & mask;
        // Samples below the query: the suffixes up to the last of them are all below it.
        let below = self.keys.partition_point(|&k| k & mask < q) as u64;
        // The first sample above it: that suffix and every later one are above it.
        let not_above =
            below + self.keys[below as usize..].partition_point(|&k| k & mask <= q) as u64;
        let lo = if below == 0 {
            0
        } else {
            (below - 1) * STRIDE + 1
        };
        let lo = lo.clamp(within.lo, within.hi);
        let range = RankRange {
            lo,
            hi: within.hi.min(not_above * STRIDE).max(lo),
        };
        let inside = |rank| range.lo <= rank && rank < range.hi;
        let equal = (below < not_above)
            .then(|| (below * STRIDE, (not_above - 1) * STRIDE))
            .filter(|&(first, last)| inside(first) && inside(last));
        Bounded { range, equal }
    }
}

/// What the samples tell of a query's ranks.
pub struct Bounded {
    /// The ranks that can start with the query.
    pub range: RankRange,
    /// The first and last sampled ranks in `range` whose cut key equals the query's, if any: one
    /// comparison with each tells on which side of it that end of the query's ranks lies; for a
    /// query of at most 16 bytes, within a stride of it.
    pub equal: Option<(u64, u64)>,
}

#[cfg(test)]
mod tests {
    use crate::index::build::{build_token_docs, random_token_docs, BuildOptions};
    use crate::index::ranks::RankRange;
    use crate::index::{Index, OpenOptions, TokenWidth};
    use rand::{Rng, SeedableRng};

    /// Every range a sampled part finds is the one the plain search finds, its place when empty
    /// included, for queries of every length around the key's, from the text (so many samples
    /// share their keys) and random, in the whole suffix array and in random parts of it.
    #[test]
    fn sampled_searches_find_what_plain_ones_do() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for (width, eos, vocab) in [
            (TokenWidth::U8, 250, 251),
            (TokenWidth::U16, 60_000, 65_000),
            (TokenWidth::U32, 60_000, 65_000),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("idx");
            // Three symbols: long repeats, and keys that tie over many samples.
            let docs = random_token_docs(&mut rng, 40, 60, 1..4);
            let opts = BuildOptions {
                next_table: None,
                ..BuildOptions::new(out.clone(), width, eos, vocab)
            };
            build_token_docs(&docs, &opts);
            let plain = Index::open(&out, &OpenOptions::default()).unwrap();
            let sampled = Index::open(
                &out,
                &OpenOptions {
                    sample_ranks: true,
                    ..OpenOptions::default()
                },
            )
            .unwrap();
            let (plain, sampled) = (&plain.parts[0], &sampled.parts[0]);
            let text: Vec<u32> = docs.iter().flat_map(|d| d.iter().copied()).collect();
            let tokens = plain.tok_cnt();
            for _ in 0..4000 {
                let len = rng.random_range(1..24);
                let query: Vec<u32> = if rng.random_bool(0.8) && text.len() > len {
                    let at = rng.random_range(0..text.len() - len);
                    text[at..at + len].to_vec()
                } else {
                    (0..len).map(|_| rng.random_range(0..5)).collect()
                };
                let mut bytes = Vec::new();
                width.encode_into(&query, &mut bytes);
                let within = if rng.random_bool(0.5) {
                    plain.full_range()
                } else {
                    let lo = rng.random_range(0..tokens);
                    RankRange {
                        lo,
                        hi: rng.random_range(lo..=tokens),
                    }
                };
                assert_eq!(
                    sampled.find(&bytes, within, 0),
                    plain.find(&bytes, within, 0),
                    "{width:?} {query:?} in {within:?}"
                );
            }
        }
    }
}
