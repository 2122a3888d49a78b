//! Answers of several indexes merged into the answer of one index over all their shards. Pure
//! functions over [`crate::index::partial`] answers, in the order of the shards.

use std::collections::BTreeMap;

use crate::index::dense::{TokenEvidence, TokenScore};
use crate::index::docs::{PartialSearch, SearchResult};
use crate::index::partial::{PartialContinuations, PartialDrafts};
use crate::index::query::{InfgramNtdResult, NtdResult, Spread};
use crate::index::sampling;

/// The next-token distribution after a prompt (its longest suffix found anywhere, when the parts
/// were asked for the ∞-gram): the longest suffix matched by any part, counts summed over the parts
/// that matched that far. `max_support` must be what the parts were asked with.
pub fn continuations(parts: &[PartialContinuations], max_support: Option<u64>) -> InfgramNtdResult {
    let suffix_len = parts.iter().map(|p| p.suffix_len).max().unwrap_or(0);
    let longest: Vec<&PartialContinuations> = parts
        .iter()
        .filter(|p| p.suffix_len == suffix_len)
        .collect();
    let prompt_cnt = longest.iter().map(|p| p.prompt_cnt).sum();
    let spread = longest.iter().fold(Spread::None, |s, p| s.merge(p.spread));
    let approx = max_support.is_some_and(|cap| prompt_cnt > cap);
    let mut dist = BTreeMap::new();
    match max_support {
        None => {
            for (&token, &n) in longest.iter().flat_map(|p| &p.dist) {
                *dist.entry(token).or_insert(0) += n;
            }
        }
        // Below the cap every sample is every match: the runs are the exact counts.
        Some(_) if !approx => {
            for &(token, n) in longest
                .iter()
                .flat_map(|p| &p.samples)
                .flat_map(|s| &s.runs)
            {
                *dist.entry(token).or_insert(0) += n;
            }
        }
        Some(cap) => {
            for sample in longest.iter().flat_map(|p| &p.samples) {
                let fine: u64 = sample.runs.iter().map(|&(_, n)| n).sum();
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
    InfgramNtdResult {
        ntd: NtdResult {
            prompt_cnt,
            dist,
            approx,
        },
        suffix_len,
        sparse,
    }
}

/// The continuations drafts read after a sequence, from every part's: up to `samples` of the
/// longest suffix's matches, each suffix array's share picked among its fine samples, in the
/// order one index over all the parts' suffix arrays reads them
/// ([`crate::index::suffix::SuffixMatch::continuations`]). `samples` must be what the parts were
/// asked with.
pub fn drafts(parts: &[PartialDrafts], samples: u64) -> Vec<Vec<u32>> {
    let suffix_len = parts.iter().map(|p| p.suffix_len).max().unwrap_or(0);
    let arrays: Vec<_> = parts
        .iter()
        .filter(|p| p.suffix_len == suffix_len)
        .flat_map(|p| &p.suffix_arrays)
        .collect();
    let total: u64 = arrays.iter().map(|a| a.matches).sum();
    if suffix_len == 0 || total == 0 || samples == 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for array in arrays.into_iter().filter(|a| a.matches > 0) {
        let fine = array.fine.len() as u64;
        let share = sampling::share(samples, array.matches, total).min(fine);
        out.extend(sampling::picks(fine, share).map(|k| array.fine[k as usize].clone()));
    }
    out
}

/// The counts of a sequence's last k tokens for each k of `lengths` shorter than the longest
/// suffix any part matched, summed over the parts; each part gives its match's length and its
/// counts for the lengths up to it, in order (longer suffixes do not occur in it).
pub fn suffix_counts(parts: &[(usize, &[u64])], lengths: &[usize]) -> Vec<u64> {
    lengths
        .iter()
        .enumerate()
        .map(|(i, &k)| {
            parts
                .iter()
                .filter(|(len, _)| k <= *len)
                .map(|(_, counts)| counts.get(i).copied().unwrap_or(0))
                .sum()
        })
        .collect()
}

/// Dense scores of a sequence from every part's evidence of each token: at each position the
/// longest suffix matched by any part, counts summed over the parts that matched that far.
pub fn token_scores(parts: &[Vec<TokenEvidence>]) -> Vec<TokenScore> {
    let len = parts.iter().map(Vec::len).min().unwrap_or(0);
    (0..len)
        .map(|i| {
            let suffix_len = parts.iter().map(|p| p[i].suffix_len).max().unwrap_or(0);
            let merged = parts
                .iter()
                .map(|p| p[i])
                .filter(|e| e.suffix_len == suffix_len)
                .fold(
                    TokenEvidence {
                        suffix_len,
                        prompt_cnt: 0,
                        cont_cnt: 0,
                        spread: Spread::None,
                    },
                    |acc, e| TokenEvidence {
                        suffix_len,
                        prompt_cnt: acc.prompt_cnt + e.prompt_cnt,
                        cont_cnt: acc.cont_cnt + e.cont_cnt,
                        spread: acc.spread.merge(e.spread),
                    },
                );
            merged.score()
        })
        .collect()
}

/// A document search from every part's documents, each part's numbered from `doc_bases[i]` (the
/// documents of the parts before it); `totals` are the clauses' match counts over all parts.
pub fn search(
    parts: Vec<PartialSearch>,
    doc_bases: &[u64],
    totals: &[u64],
    strides: &[u64],
    maxnum: usize,
) -> SearchResult {
    let mut merged = PartialSearch {
        doc_cnt: 0,
        clause_places: vec![0; totals.len()],
        documents: Vec::new(),
    };
    for (part, &base) in parts.into_iter().zip(doc_bases) {
        merged.doc_cnt += part.doc_cnt;
        for (sum, n) in merged.clause_places.iter_mut().zip(&part.clause_places) {
            *sum += n;
        }
        let room = maxnum.saturating_sub(merged.documents.len());
        merged
            .documents
            .extend(part.documents.into_iter().take(room).map(|mut d| {
                d.doc_ix += base;
                d
            }));
    }
    merged.result(totals, strides)
}
