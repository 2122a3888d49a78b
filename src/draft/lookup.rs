//! Prompt lookup: the request's own tokens (prompt and output so far) as a draft source. Every
//! earlier position of the last token is a candidate; the ones whose preceding tokens agree longest
//! with the sequence's end win, and what followed them is the draft.

use std::collections::HashMap;

/// Earlier occurrences examined per draft, most recent first: bounds the cost on common tokens.
const MAX_CANDIDATES: usize = 64;
/// Longest agreement measured backwards from a candidate.
const MAX_MATCH: usize = 64;

#[derive(Debug, Default)]
pub struct PromptLookup {
    /// Token → the positions where it occurs, ascending.
    positions: HashMap<u32, Vec<u32>>,
}

impl PromptLookup {
    /// Records `tokens[from..]`, the tokens just appended.
    pub fn extend(&mut self, tokens: &[u32], from: usize) {
        for (i, &t) in tokens.iter().enumerate().skip(from) {
            self.positions.entry(t).or_default().push(i as u32);
        }
    }

    /// Forgets `removed`, the tokens that were at positions `len..` before a truncation.
    pub fn truncate(&mut self, removed: &[u32], len: usize) {
        for &t in removed {
            if let Some(p) = self.positions.get_mut(&t) {
                while p.last().is_some_and(|&i| i as usize >= len) {
                    p.pop();
                }
            }
        }
    }

    /// The continuations after the best earlier matches of the end of `tokens` (at most `depth`
    /// tokens each), and the length of that match.
    pub fn continuations(&self, tokens: &[u32], depth: usize) -> (Vec<Vec<u32>>, usize) {
        let n = tokens.len();
        let Some(last) = tokens.last() else {
            return (Vec::new(), 0);
        };
        let Some(candidates) = self.positions.get(last) else {
            return (Vec::new(), 0);
        };
        let mut best = (0usize, Vec::new());
        for &p in candidates
            .iter()
            .rev()
            .filter(|&&p| (p as usize) + 1 < n)
            .take(MAX_CANDIDATES)
        {
            let p = p as usize;
            let agree = (0..MAX_MATCH.min(p + 1))
                .take_while(|&k| tokens[p - k] == tokens[n - 1 - k])
                .count();
            let following = tokens[p + 1..n.min(p + 1 + depth)].to_vec();
            match agree.cmp(&best.0) {
                std::cmp::Ordering::Greater => best = (agree, vec![following]),
                std::cmp::Ordering::Equal => best.1.push(following),
                std::cmp::Ordering::Less => {}
            }
        }
        (best.1, best.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_earlier_match_wins() {
        let tokens = [1, 2, 3, 9, 5, 2, 3, 7, 8, 1, 2, 3];
        let mut lookup = PromptLookup::default();
        lookup.extend(&tokens, 0);
        // "1 2 3" occurs at 0..3 (followed by 9 5) and "2 3" at 5..7 (followed by 7 8).
        let (conts, len) = lookup.continuations(&tokens, 2);
        assert_eq!(len, 3);
        assert_eq!(conts, vec![vec![9, 5]]);
        // After taking "2 3" back, the last token is 1: it follows at 0 (then 2 3).
        lookup.truncate(&tokens[10..], 10);
        let (conts, len) = lookup.continuations(&tokens[..10], 2);
        assert_eq!((conts, len), (vec![vec![2, 3]], 1));
    }
}
