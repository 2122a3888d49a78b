//! A namespace's newest documents, in memory and searchable the moment a token is appended: each
//! token's occurrences are listed, so a lookup looks back from the most recent occurrences of the
//! sequence's last token (`agreement`). Appending costs O(new tokens). The tail grows to the freeze
//! size; then compaction turns it into a suffix-array run and a fresh tail takes the appends.

use std::collections::HashMap;

use crate::agreement::longest_agreements;

#[derive(Debug, Default)]
pub struct Tail {
    /// The documents in the order they were opened, each with its live document id.
    docs: Vec<(u64, Vec<u32>)>,
    /// Live document id → its place in `docs`, for the documents still being appended to.
    slots: HashMap<u64, usize>,
    /// Token → (place in `docs`, position) of each occurrence, in append order.
    positions: HashMap<u32, Vec<(u32, u32)>>,
    tokens: usize,
}

impl Tail {
    /// Tokens held.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    /// Appends `tokens` to document `doc`, which starts here if the tail has none of it yet (a
    /// document still growing when the previous tail was frozen goes on as a new piece).
    pub fn append(&mut self, doc: u64, tokens: &[u32]) {
        if tokens.is_empty() {
            return;
        }
        let slot = *self.slots.entry(doc).or_insert_with(|| {
            self.docs.push((doc, Vec::new()));
            self.docs.len() - 1
        });
        let body = &mut self.docs[slot].1;
        for &t in tokens {
            self.positions
                .entry(t)
                .or_default()
                .push((slot as u32, body.len() as u32));
            body.push(t);
        }
        self.tokens += tokens.len();
    }

    /// Takes the last `n` tokens of document `doc` back, if this tail holds that many of it (a
    /// sequence that learns took them back: what it teaches stays what it kept). Costs O(n) but
    /// for the occurrence lists it searches from their ends, where the newest tokens are.
    pub fn retract(&mut self, doc: u64, n: usize) -> bool {
        let Some(&slot) = self.slots.get(&doc) else {
            return false;
        };
        let body = &mut self.docs[slot].1;
        if body.len() < n {
            return false;
        }
        for at in (body.len() - n..body.len()).rev() {
            let token = body[at];
            let place = (slot as u32, at as u32);
            if let Some(list) = self.positions.get_mut(&token) {
                if let Some(i) = list.iter().rposition(|&p| p == place) {
                    list.remove(i);
                }
                if list.is_empty() {
                    self.positions.remove(&token);
                }
            }
        }
        body.truncate(body.len() - n);
        self.tokens -= n;
        true
    }

    /// The documents, in order.
    pub fn documents(&self) -> impl Iterator<Item = &[u32]> {
        self.docs.iter().map(|(_, d)| d.as_slice())
    }

    /// What followed the occurrences that agree longest with the end of `pattern` (at most `depth`
    /// tokens each, never past a document's end), and the agreement's length.
    pub fn continuations(&self, pattern: &[u32], depth: usize) -> (Vec<Vec<u32>>, usize) {
        let Some(occurrences) = pattern.last().and_then(|t| self.positions.get(t)) else {
            return (Vec::new(), 0);
        };
        let candidates = occurrences
            .iter()
            .rev()
            .map(|&(slot, p)| (self.docs[slot as usize].1.as_slice(), p as usize));
        longest_agreements(candidates, pattern, depth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_documents_stay_apart_and_are_searchable_at_once() {
        let mut tail = Tail::default();
        tail.append(1, &[1, 2, 3]);
        tail.append(2, &[9, 2, 3]);
        tail.append(1, &[4, 5]);
        tail.append(2, &[6]);
        assert_eq!(tail.tokens(), 9);
        let docs: Vec<&[u32]> = tail.documents().collect();
        assert_eq!(docs, vec![&[1, 2, 3, 4, 5][..], &[9, 2, 3, 6][..]]);
        // "1 2 3" agrees on three tokens and is followed by 4 5 in document 1 (never by document
        // 2's tokens, though they were appended in between).
        assert_eq!(tail.continuations(&[1, 2, 3], 4), (vec![vec![4, 5]], 3));
        // "2 3" alone: both documents, most recent occurrence first.
        assert_eq!(
            tail.continuations(&[7, 2, 3], 4),
            (vec![vec![6], vec![4, 5]], 2)
        );
        assert_eq!(tail.continuations(&[8], 4), (Vec::<Vec<u32>>::new(), 0));
    }

    #[test]
    fn a_retracted_end_is_gone_as_if_never_appended() {
        let mut tail = Tail::default();
        tail.append(1, &[1, 2, 3]);
        tail.append(2, &[2, 3, 7]);
        tail.append(1, &[4, 5]);
        assert!(tail.retract(1, 2));
        assert!(!tail.retract(1, 4), "document 1 holds 3 tokens");
        assert!(!tail.retract(9, 1), "no document 9");
        assert_eq!(tail.tokens(), 6);
        // As a tail that never held 4 5: "2 3" is followed by 7 only.
        let mut never = Tail::default();
        never.append(1, &[1, 2, 3]);
        never.append(2, &[2, 3, 7]);
        for pattern in [&[2, 3][..], &[4], &[5], &[1, 2, 3]] {
            assert_eq!(
                tail.continuations(pattern, 4),
                never.continuations(pattern, 4)
            );
        }
        // Appending again after a retraction is searched as usual.
        tail.append(1, &[6]);
        assert_eq!(tail.continuations(&[1, 2, 3], 4), (vec![vec![6]], 3));
    }
}
