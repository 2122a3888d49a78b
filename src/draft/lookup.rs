//! Prompt lookup: the request's own tokens (prompt and output so far) as a draft source. The
//! earlier positions of one of the last tokens are candidates (`agreement::lookup`); the ones whose
//! preceding tokens agree longest with the sequence's end win, and what followed them is the draft.

use std::collections::HashMap;

use crate::agreement;

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

    /// Memory held: a position per token, and a table entry per distinct token.
    pub fn heap_bytes(&self) -> usize {
        let per_entry = std::mem::size_of::<(u32, Vec<u32>)>() + 8;
        self.positions
            .values()
            .map(|p| p.capacity() * 4 + per_entry)
            .sum()
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
        self.continuations_in(tokens, tokens, depth)
    }

    /// The same for the end of `pattern` searched in `tokens`, the text this lookup has recorded
    /// (a session's reference text).
    pub fn continuations_in(
        &self,
        tokens: &[u32],
        pattern: &[u32],
        depth: usize,
    ) -> (Vec<Vec<u32>>, usize) {
        let positions = |t: u32| self.positions.get(&t).map_or(&[][..], Vec::as_slice);
        let held = |t: u32| positions(t).len();
        let occurrences = |t: u32| positions(t).iter().rev().map(|&p| (tokens, p as usize));
        agreement::lookup(pattern, depth, held, occurrences)
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
