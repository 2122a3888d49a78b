//! Where a sequence's end occurred before, found by looking back from earlier occurrences of one of
//! its last tokens: the occurrences whose preceding tokens agree longest with the sequence win, and
//! what followed them is a draft. Prompt lookup searches the sequence itself this way, the live
//! index its newest documents and a session's reference text; the suffix arrays answer the same
//! question for everything older.
//!
//! Only the most recent occurrences of the token looked back from are examined, so that token is
//! the rarest of the sequence's last few (`lookup`): a common last token (a newline, a comma) has
//! so many recent occurrences that an older, longer match lies beyond them, and drafts then come
//! from whatever agreed on two tokens nearby.

/// Earlier occurrences examined per search, most recent first: bounds the cost on common tokens
/// (a lookup searches once or twice).
pub const MAX_CANDIDATES: usize = 64;
/// Longest agreement measured backwards from a candidate.
pub const MAX_AGREEMENT: usize = 64;
/// How far back from the sequence's end the token looked back from may lie.
pub const ANCHOR_SPAN: usize = 8;

/// The continuations (at most `depth` tokens each) after the earlier matches of `pattern`'s end
/// that agree longest with it, and that agreement's length, looking back from the occurrences of
/// the rarest of its last [`ANCHOR_SPAN`] tokens. `held(t)` is how many occurrences of `t` there
/// are and `occurrences(t)` lists them, most recent first, as (text, position). When no
/// occurrence of that token continues into the whole rest of the pattern, the occurrences of the
/// last token are searched instead. Exact (what checking every position finds) while the tokens
/// searched from have at most [`MAX_CANDIDATES`] occurrences; past that, the most recent win.
pub fn lookup<'a, I>(
    pattern: &[u32],
    depth: usize,
    held: impl Fn(u32) -> usize,
    occurrences: impl Fn(u32) -> I,
) -> (Vec<Vec<u32>>, usize)
where
    I: Iterator<Item = (&'a [u32], usize)>,
{
    let n = pattern.len();
    if n == 0 || depth == 0 {
        return (Vec::new(), 0);
    }
    let back = (0..ANCHOR_SPAN.min(n))
        .min_by_key(|&j| (held(pattern[n - 1 - j]), j))
        .unwrap_or(0);
    if back > 0 {
        let found = longest_agreements(occurrences(pattern[n - 1 - back]), pattern, back, depth);
        if found.1 > back {
            return found;
        }
    }
    longest_agreements(occurrences(pattern[n - 1]), pattern, 0, depth)
}

/// The continuations (at most `depth` tokens each) after the `candidates` whose preceding tokens
/// agree longest with the end of `pattern`, and that agreement's length (0 and nothing when there
/// is no candidate). A candidate is a text and a position in it holding the token `back` places
/// before `pattern`'s end, followed there by the pattern's last `back` tokens; the caller lists
/// them most recent first, and only the first [`MAX_CANDIDATES`] with at least one token after
/// that end are examined.
fn longest_agreements<'a>(
    candidates: impl Iterator<Item = (&'a [u32], usize)>,
    pattern: &[u32],
    back: usize,
    depth: usize,
) -> (Vec<Vec<u32>>, usize) {
    let n = pattern.len();
    if n <= back || depth == 0 {
        return (Vec::new(), 0);
    }
    // The candidates that agree longest so far, by where their match ends; their continuations
    // are copied once, at the end.
    let (mut longest, mut winners) = (0usize, Vec::new());
    for (doc, end) in candidates
        .map(|(doc, p)| (doc, p + back))
        .filter(|&(doc, end)| end + 1 < doc.len())
        .take(MAX_CANDIDATES)
    {
        let agree = (0..MAX_AGREEMENT.min(end + 1).min(n))
            .take_while(|&k| doc[end - k] == pattern[n - 1 - k])
            .count();
        // Agreeing on no more than the `back` tokens after the candidate: not followed there by
        // the pattern's end.
        if agree <= back || agree < longest {
            continue;
        }
        if agree > longest {
            longest = agree;
            winners.clear();
        }
        winners.push((doc, end));
    }
    let continuations = winners
        .into_iter()
        .map(|(doc, end)| doc[end + 1..doc.len().min(end + 1 + depth)].to_vec())
        .collect();
    (continuations, longest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn the_longest_agreement_wins_across_documents_and_ties_pool() {
        let a: &[u32] = &[1, 2, 3, 9, 5];
        let b: &[u32] = &[7, 2, 3, 8, 2, 3, 6];
        let pattern = [4, 1, 2, 3];
        // Every position of 3, most recent first.
        let candidates = [(b, 5), (b, 2), (a, 2)];
        let (conts, len) = longest_agreements(candidates.into_iter(), &pattern, 0, 2);
        assert_eq!((conts, len), (vec![vec![9, 5]], 3));
        // Without the document that agrees on three tokens, two agree on two: both are kept.
        let (conts, len) = longest_agreements(candidates[..2].iter().copied(), &pattern, 0, 2);
        assert_eq!((conts, len), (vec![vec![6], vec![8, 2]], 2));
    }

    #[test]
    fn a_candidate_with_nothing_after_it_is_skipped() {
        let a: &[u32] = &[5, 3];
        let (conts, len) = longest_agreements([(a, 1)].into_iter(), &[5, 3], 0, 4);
        assert_eq!((conts, len), (Vec::<Vec<u32>>::new(), 0));
    }

    /// Every position of `text` checked: the longest agreement with `pattern`'s end (at most
    /// [`MAX_AGREEMENT`]) among positions followed by a token, and what followed each, most recent
    /// first.
    fn brute_force(text: &[u32], pattern: &[u32], depth: usize) -> (Vec<Vec<u32>>, usize) {
        let n = pattern.len();
        let agree = |end: usize| {
            (0..MAX_AGREEMENT.min(end + 1).min(n))
                .take_while(|&k| text[end - k] == pattern[n - 1 - k])
                .count()
        };
        let ends = (0..text.len().saturating_sub(1)).rev();
        let longest = ends.clone().map(agree).max().unwrap_or(0);
        let continuations = match longest {
            0 => Vec::new(),
            _ => (ends.filter(|&e| agree(e) == longest))
                .map(|e| text[e + 1..text.len().min(e + 1 + depth)].to_vec())
                .collect(),
        };
        (continuations, longest)
    }

    /// `lookup` over one text, its occurrences listed most recent first.
    fn look_up(text: &[u32], pattern: &[u32], depth: usize) -> (Vec<Vec<u32>>, usize) {
        let held = |t: u32| text.iter().filter(|&&x| x == t).count();
        let occurrences = |t: u32| {
            (0..text.len())
                .rev()
                .filter(move |&p| text[p] == t)
                .map(move |p| (text, p))
        };
        lookup(pattern, depth, held, occurrences)
    }

    /// An older match that agrees on twelve tokens is found behind seventy recent occurrences of
    /// the sequence's common last token, which the search from that token alone never reaches.
    #[test]
    fn a_long_match_behind_many_occurrences_of_a_common_token_is_found() {
        let line: Vec<u32> = (100..111).collect();
        let filler: Vec<u32> = [7, 5].repeat(70);
        let text = [line.clone(), vec![5, 200, 201, 202], filler, line, vec![5]].concat();
        let (conts, len) = look_up(&text, &text, 3);
        assert_eq!((conts.clone(), len), (vec![vec![200, 201, 202]], 12));
        assert_eq!((conts, len), brute_force(&text, &text, 3));
        let from_last = text.len() - 1;
        let (_, len) = longest_agreements(
            (0..text.len())
                .rev()
                .filter(|&p| text[p] == text[from_last])
                .map(|p| (&text[..], p)),
            &text,
            0,
            3,
        );
        assert_eq!(
            len, 1,
            "the last token's recent occurrences agree on it alone"
        );
    }

    /// With fewer occurrences of every token than are examined, the lookup is exact: it finds
    /// what checking every position finds, in random texts and patterns over a small vocabulary.
    #[test]
    fn with_few_occurrences_the_lookup_is_exact() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..2_000 {
            let vocab = rng.random_range(6..26);
            let text: Vec<u32> = (0..rng.random_range(1..=200))
                .map(|_| rng.random_range(0..vocab))
                .collect();
            let pattern: Vec<u32> = match rng.random_bool(0.5) {
                true => text.clone(),
                false => (0..rng.random_range(1..=12))
                    .map(|_| rng.random_range(0..8))
                    .collect(),
            };
            let depth = rng.random_range(1..=4);
            assert_eq!(
                look_up(&text, &pattern, depth),
                brute_force(&text, &pattern, depth),
                "{text:?} {pattern:?}"
            );
        }
    }
}
