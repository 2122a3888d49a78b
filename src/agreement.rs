//! Where a sequence's end occurred before, found by looking back from earlier occurrences of its last
//! token: the occurrences whose preceding tokens agree longest with the sequence win, and what
//! followed them is a draft. Prompt lookup searches the sequence itself this way, the live index its
//! newest documents and a session's reference text; the suffix arrays answer the same question for
//! everything older.

/// Earlier occurrences examined per lookup, most recent first: bounds the cost on common tokens.
pub const MAX_CANDIDATES: usize = 64;
/// Longest agreement measured backwards from a candidate.
pub const MAX_AGREEMENT: usize = 64;

/// The continuations (at most `depth` tokens each) after the `candidates` whose preceding tokens
/// agree longest with the end of `pattern`, and that agreement's length (0 and nothing when there
/// is no candidate). A candidate is a document and a position in it holding `pattern`'s last token;
/// the caller lists them most recent first, and only the first [`MAX_CANDIDATES`] with at least one
/// following token are examined.
pub fn longest_agreements<'a>(
    candidates: impl Iterator<Item = (&'a [u32], usize)>,
    pattern: &[u32],
    depth: usize,
) -> (Vec<Vec<u32>>, usize) {
    let n = pattern.len();
    if n == 0 || depth == 0 {
        return (Vec::new(), 0);
    }
    // The candidates that agree longest so far; their continuations are copied once, at the end.
    let (mut longest, mut winners) = (0usize, Vec::new());
    for (doc, p) in candidates
        .filter(|&(doc, p)| p + 1 < doc.len())
        .take(MAX_CANDIDATES)
    {
        let agree = (0..MAX_AGREEMENT.min(p + 1).min(n))
            .take_while(|&k| doc[p - k] == pattern[n - 1 - k])
            .count();
        if agree == 0 || agree < longest {
            continue;
        }
        if agree > longest {
            longest = agree;
            winners.clear();
        }
        winners.push((doc, p));
    }
    let continuations = winners
        .into_iter()
        .map(|(doc, p)| doc[p + 1..doc.len().min(p + 1 + depth)].to_vec())
        .collect();
    (continuations, longest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_agreement_wins_across_documents_and_ties_pool() {
        let a: &[u32] = &[1, 2, 3, 9, 5];
        let b: &[u32] = &[7, 2, 3, 8, 2, 3, 6];
        let pattern = [4, 1, 2, 3];
        // Every position of 3, most recent first.
        let candidates = [(b, 5), (b, 2), (a, 2)];
        let (conts, len) = longest_agreements(candidates.into_iter(), &pattern, 2);
        assert_eq!((conts, len), (vec![vec![9, 5]], 3));
        // Without the document that agrees on three tokens, two agree on two: both are kept.
        let (conts, len) = longest_agreements(candidates[..2].iter().copied(), &pattern, 2);
        assert_eq!((conts, len), (vec![vec![6], vec![8, 2]], 2));
    }

    #[test]
    fn a_candidate_with_nothing_after_it_is_skipped() {
        let a: &[u32] = &[5, 3];
        let (conts, len) = longest_agreements([(a, 1)].into_iter(), &[5, 3], 4);
        assert_eq!((conts, len), (Vec::<Vec<u32>>::new(), 0));
    }
}
