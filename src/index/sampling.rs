//! Even subsamples of a query's matches when they are too many to read (`ntd` with `max_support`,
//! the gate's support estimate, draft continuations). A query samples each suffix array in
//! proportion to its share of the matches, and each suffix array's samples are **nested**: they are
//! picked among its `fine` samples (`min(cap, matches)` evenly spread ranks), which do not depend on
//! the other suffix arrays. So a shard server can send its fine samples before anyone knows the
//! total, and the router picks the same ranks a single index over all the suffix arrays reads.
//! With one suffix array the picks are its fine samples: ranks `⌊k·len/cap⌋`.

/// How many of a query's `cap` samples a suffix array with `len` of its `total` matches takes.
pub fn share(cap: u64, len: u64, total: u64) -> u64 {
    if len == 0 || total == 0 {
        return 0;
    }
    ((cap as u128 * len as u128).div_ceil(total as u128) as u64).clamp(1, len)
}

/// Offset in a range of `len` ranks of its `k`-th of `fine` evenly spread samples.
pub fn fine_offset(k: u64, len: u64, fine: u64) -> u64 {
    (k as u128 * len as u128 / fine as u128) as u64
}

/// Which of `fine` samples make up a share of `share` (at most `fine`): evenly spread among them.
pub fn picks(fine: u64, share: u64) -> impl Iterator<Item = u64> {
    (0..share).map(move |j| (j as u128 * fine as u128 / share as u128) as u64)
}

/// Offsets in a range of `len` ranks of its `share` samples under a cap of `cap`.
pub fn offsets(len: u64, cap: u64, share: u64) -> impl Iterator<Item = u64> {
    let fine = len.min(cap);
    picks(fine, share.min(fine)).map(move |k| fine_offset(k, len, fine))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_range_takes_its_fine_samples_and_shares_add_up_to_about_the_cap() {
        let (len, cap) = (1000, 64);
        let got: Vec<u64> = offsets(len, cap, share(cap, len, len)).collect();
        let fine: Vec<u64> = (0..cap).map(|k| k * len / cap).collect();
        assert_eq!(got, fine);
        let lens = [500u64, 300, 7, 193];
        let total: u64 = lens.iter().sum();
        let shares: Vec<u64> = lens.iter().map(|&l| share(cap, l, total)).collect();
        let sum: u64 = shares.iter().sum();
        assert!(sum >= cap && sum <= cap + lens.len() as u64, "{shares:?}");
        for (&l, &s) in lens.iter().zip(&shares) {
            let o: Vec<u64> = offsets(l, cap, s).collect();
            assert_eq!(o.len() as u64, s);
            assert!(o.windows(2).all(|w| w[0] < w[1]) && o.iter().all(|&x| x < l));
        }
    }
}
