//! Answers of several indexes merged into the answer of one index over all their shards. Pure
//! functions over [`crate::cluster::partial`] answers, in the order of the shards. Sums are checked:
//! partials from shards that claim more than 2^64 occurrences together give [`Overflow`], never a
//! wrapped count.

use std::collections::BTreeMap;

use crate::cluster::partial::{PartialContinuations, PartialDrafts};
use crate::index::dense::{TokenEvidence, TokenScore};
use crate::index::docs::{PartialSearch, SearchResult};
use crate::index::query::{InfgramNtdResult, NtdResult, Spread};
use crate::index::sampling;

/// The partials' counts add up past 2^64: they cannot all be true.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the shards' counts add up past 2^64")]
pub struct Overflow;

type Result<T> = std::result::Result<T, Overflow>;

/// The values' sum, checked.
pub fn sum(values: impl IntoIterator<Item = u64>) -> Result<u64> {
    values
        .into_iter()
        .try_fold(0u64, |acc, n| acc.checked_add(n))
        .ok_or(Overflow)
}

fn add(to: &mut u64, n: u64) -> Result<()> {
    *to = to.checked_add(n).ok_or(Overflow)?;
    Ok(())
}

/// The next-token distribution after a prompt (its longest suffix found anywhere, when the partials
/// were asked for the ∞-gram): the longest suffix matched by any partial, counts summed over the partials
/// that matched that far. `max_support` must be what the partials were asked with.
pub fn continuations(
    partials: &[PartialContinuations],
    max_support: Option<u64>,
) -> Result<InfgramNtdResult> {
    let suffix_len = partials.iter().map(|p| p.suffix_len).max().unwrap_or(0);
    let longest: Vec<&PartialContinuations> = partials
        .iter()
        .filter(|p| p.suffix_len == suffix_len)
        .collect();
    let prompt_cnt = sum(longest.iter().map(|p| p.prompt_cnt))?;
    let spread = longest.iter().fold(Spread::None, |s, p| s.merge(p.spread));
    let approx = max_support.is_some_and(|cap| prompt_cnt > cap);
    let mut dist = BTreeMap::new();
    match max_support {
        None => {
            for (&token, &n) in longest.iter().flat_map(|p| &p.dist) {
                add(dist.entry(token).or_insert(0), n)?;
            }
        }
        // Below the cap every sample is every match: the runs are the exact counts.
        Some(_) if !approx => {
            for &(token, n) in longest
                .iter()
                .flat_map(|p| &p.samples)
                .flat_map(|s| &s.runs)
            {
                add(dist.entry(token).or_insert(0), n)?;
            }
        }
        Some(cap) => {
            for sample in longest.iter().flat_map(|p| &p.samples) {
                // The runs' partial sums below stay under this total.
                let fine = sum(sample.runs.iter().map(|&(_, n)| n))?;
                let share = sampling::share(cap, sample.matches, prompt_cnt).min(fine);
                // The picks ascend: walk the runs alongside them.
                let mut runs = sample.runs.iter();
                let (mut run, mut end) = (None, 0u64);
                for k in sampling::picks(fine, share) {
                    while k >= end {
                        let Some(&(token, n)) = runs.next() else {
                            break;
                        };
                        (run, end) = (Some(token), end + n);
                    }
                    if let Some(token) = run {
                        *dist.entry(token).or_insert(0) += 1;
                    }
                }
            }
        }
    }
    // As a single index flags it: from the exact distribution, or from the matches' spread.
    let sparse = match approx {
        true => spread.is_sparse(),
        false => dist.len() == 1,
    };
    Ok(InfgramNtdResult {
        ntd: NtdResult {
            prompt_cnt,
            dist,
            approx,
        },
        suffix_len,
        sparse,
    })
}

/// The continuations drafts read after a sequence, from every partial's: up to `samples` of the
/// longest suffix's matches, each suffix array's share picked among its fine samples, in the
/// order one index over all the partials' suffix arrays reads them
/// ([`crate::index::suffix::SuffixMatch::continuations`]). `samples` must be what the partials were
/// asked with.
pub fn drafts(partials: &[PartialDrafts], samples: u64) -> Result<Vec<Vec<u32>>> {
    let suffix_len = partials.iter().map(|p| p.suffix_len).max().unwrap_or(0);
    let arrays: Vec<_> = partials
        .iter()
        .filter(|p| p.suffix_len == suffix_len)
        .flat_map(|p| &p.suffix_arrays)
        .collect();
    let total = sum(arrays.iter().map(|a| a.matches))?;
    if suffix_len == 0 || total == 0 || samples == 0 {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for array in arrays.into_iter().filter(|a| a.matches > 0) {
        let fine = array.fine.len() as u64;
        let share = sampling::share(samples, array.matches, total).min(fine);
        out.extend(sampling::picks(fine, share).map(|k| array.fine[k as usize].clone()));
    }
    Ok(out)
}

/// The counts of a sequence's last k tokens for each k of `lengths` shorter than the longest
/// suffix any partial matched, summed over the partials; each partial gives its match's length and its
/// counts for the lengths up to it, in order (longer suffixes do not occur in it).
pub fn suffix_counts(partials: &[(usize, &[u64])], lengths: &[usize]) -> Result<Vec<u64>> {
    lengths
        .iter()
        .enumerate()
        .map(|(i, &k)| {
            sum(partials
                .iter()
                .filter(|(len, _)| k <= *len)
                .map(|(_, counts)| counts.get(i).copied().unwrap_or(0)))
        })
        .collect()
}

/// Dense scores of a sequence from every partial's evidence of each token: at each position the
/// longest suffix matched by any partial, counts summed over the partials that matched that far.
pub fn token_scores(partials: &[Vec<TokenEvidence>]) -> Result<Vec<TokenScore>> {
    let len = partials.iter().map(Vec::len).min().unwrap_or(0);
    (0..len)
        .map(|i| {
            let suffix_len = partials.iter().map(|p| p[i].suffix_len).max().unwrap_or(0);
            let merged = partials
                .iter()
                .map(|p| p[i])
                .filter(|e| e.suffix_len == suffix_len)
                .try_fold(
                    TokenEvidence {
                        suffix_len,
                        prompt_cnt: 0,
                        cont_cnt: 0,
                        spread: Spread::None,
                    },
                    |acc, e| {
                        Ok(TokenEvidence {
                            suffix_len,
                            prompt_cnt: sum([acc.prompt_cnt, e.prompt_cnt])?,
                            cont_cnt: sum([acc.cont_cnt, e.cont_cnt])?,
                            spread: acc.spread.merge(e.spread),
                        })
                    },
                )?;
            Ok(merged.score())
        })
        .collect()
}

/// A document search from every partial's documents, each partial's numbered from `doc_bases[i]` (the
/// documents of the partials before it); `totals` are the clauses' match counts over all partials.
pub fn search(
    partials: Vec<PartialSearch>,
    doc_bases: &[u64],
    totals: &[u64],
    strides: &[u64],
    maxnum: usize,
) -> Result<SearchResult> {
    let mut merged = PartialSearch {
        doc_cnt: 0,
        clause_places: vec![0; totals.len()],
        documents: Vec::new(),
    };
    for (partial, &base) in partials.into_iter().zip(doc_bases) {
        add(&mut merged.doc_cnt, partial.doc_cnt)?;
        for (total, &n) in merged.clause_places.iter_mut().zip(&partial.clause_places) {
            add(total, n)?;
        }
        let room = maxnum.saturating_sub(merged.documents.len());
        for mut d in partial.documents.into_iter().take(room) {
            add(&mut d.doc_ix, base)?;
            merged.documents.push(d);
        }
    }
    // The estimate of several clauses is the places visited times their stride.
    for (places, stride) in merged.clause_places.iter().zip(strides) {
        places.checked_mul(*stride).ok_or(Overflow)?;
    }
    Ok(merged.result(totals, strides))
}

#[cfg(test)]
mod tests {
    //! Parts each of which one shard could send, whose counts together pass 2^64: the merge says
    //! so rather than wrap (a wrapped sum made `prob = 1.1e13` with `rest_mass = 0`).

    use super::*;
    use crate::cluster::partial::{LocalContinuations, LocalSample};
    use crate::index::docs::Document;

    const HALF: u64 = u64::MAX / 2 + 1;

    fn partial(prompt_cnt: u64, dist: &[(u32, u64)]) -> PartialContinuations {
        PartialContinuations {
            suffix_len: 2,
            prompt_cnt,
            dist: dist.iter().copied().collect(),
            samples: vec![LocalSample {
                matches: prompt_cnt,
                runs: vec![(3, 1)],
            }],
            spread: Spread::Single(3),
        }
    }

    #[test]
    fn counts_past_2_64_are_an_error_not_a_wrapped_sum() {
        let partials = [partial(HALF, &[(3, HALF)]), partial(HALF, &[(3, HALF)])];
        assert_eq!(continuations(&partials, None), Err(Overflow));
        assert_eq!(continuations(&partials, Some(4)), Err(Overflow));
        // Within 2^64 the same partials merge.
        let fits = [
            partial(HALF - 1, &[(3, HALF - 1)]),
            partial(HALF, &[(3, HALF)]),
        ];
        let merged = continuations(&fits, None).unwrap();
        assert_eq!(merged.ntd.prompt_cnt, u64::MAX);
        assert_eq!(merged.ntd.dist[&3], u64::MAX);

        let evidence = |n| TokenEvidence {
            suffix_len: 1,
            prompt_cnt: n,
            cont_cnt: n,
            spread: Spread::Several,
        };
        assert_eq!(
            token_scores(&[vec![evidence(HALF)], vec![evidence(HALF)]]),
            Err(Overflow)
        );
        assert_eq!(
            suffix_counts(&[(2, &[HALF][..]), (2, &[HALF][..])], &[1]),
            Err(Overflow)
        );
        let drafts_part = PartialDrafts {
            suffix_len: 1,
            suffix_arrays: vec![LocalContinuations {
                matches: HALF,
                fine: vec![vec![3]],
            }],
        };
        assert_eq!(
            drafts(&[drafts_part.clone(), drafts_part], 4),
            Err(Overflow)
        );

        let found = |doc_ix| PartialSearch {
            doc_cnt: 1,
            clause_places: vec![1],
            documents: vec![Document {
                doc_ix,
                doc_len: 1,
                disp_len: 1,
                needle_offset: 0,
                metadata: None,
                token_ids: vec![3],
                text: None,
            }],
        };
        // A document numbered past 2^64 by the shards before it.
        assert_eq!(
            search(vec![found(0), found(5)], &[0, u64::MAX - 2], &[2], &[1], 4),
            Err(Overflow)
        );
        assert_eq!(
            search(vec![found(0), found(1)], &[0, 10], &[2], &[1], 4)
                .unwrap()
                .documents
                .iter()
                .map(|d| d.doc_ix)
                .collect::<Vec<_>>(),
            vec![0, 11]
        );
    }
}
