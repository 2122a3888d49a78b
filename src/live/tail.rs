//! A namespace's newest documents, in memory and searchable the moment a token is appended: each
//! token's occurrences are chained newest to oldest, so a lookup looks back from the most recent
//! occurrences of one of the sequence's last tokens (`agreement`), the one with the fewest.
//! Appending costs O(new tokens). The tail grows to the freeze size; then compaction turns it into a
//! suffix-array run and a fresh tail takes the appends.
//!
//! The chain is one vector for every token, not a vector per distinct token: a small vector costs
//! its allocation's header and rounding, which made a tail of varied text cost 60 bytes a token
//! against 36 with the chain (`TAIL_WEIGHT`; measured before each distinct token kept its count,
//! 4 bytes more a distinct token).

use std::collections::HashMap;

use crate::agreement;

/// No earlier occurrence, or (as a place in `docs`) one taken back.
const NONE: u32 = u32::MAX;

/// One appended token: where it is and where the same token occurred before it.
#[derive(Debug, Clone, Copy)]
struct Occurrence {
    /// Its document's place in `docs`; `NONE` once taken back.
    slot: u32,
    /// Its position in that document.
    at: u32,
    /// The occurrence of the same token appended before it, or `NONE`.
    previous: u32,
}

/// A token's occurrences: the newest (the head of their chain) and how many are held.
#[derive(Debug, Clone, Copy)]
struct TokenChain {
    newest: u32,
    count: u32,
}

#[derive(Debug, Default)]
pub struct Tail {
    /// The documents in the order they were opened, each with its live document id.
    docs: Vec<(u64, Vec<u32>)>,
    /// Live document id → its place in `docs`, for the documents still being appended to.
    slots: HashMap<u64, usize>,
    /// Every token appended, in append order.
    occurrences: Vec<Occurrence>,
    /// Token → its occurrences still held.
    chains: HashMap<u32, TokenChain>,
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
            let here = self.occurrences.len() as u32;
            let chain = self.chains.entry(t).or_insert(TokenChain {
                newest: NONE,
                count: 0,
            });
            let previous = std::mem::replace(&mut chain.newest, here);
            chain.count += 1;
            self.occurrences.push(Occurrence {
                slot: slot as u32,
                at: body.len() as u32,
                previous,
            });
            body.push(t);
        }
        self.tokens += tokens.len();
    }

    /// Tokens of document `doc` this tail holds.
    pub fn held(&self, doc: u64) -> usize {
        self.slots
            .get(&doc)
            .map_or(0, |&slot| self.docs[slot].1.len())
    }

    /// Takes the last `n` tokens of document `doc` back, if this tail holds that many of it (a
    /// sequence that learns took them back: what it teaches stays what it kept). Their
    /// occurrences are found from the newest end, where they are, and marked taken back; lookups
    /// step over them.
    pub fn retract(&mut self, doc: u64, n: usize) -> bool {
        let Some(&slot) = self.slots.get(&doc) else {
            return false;
        };
        let held = self.docs[slot].1.len();
        if held < n {
            return false;
        }
        let keep = held - n;
        let mut left = n;
        for i in (0..self.occurrences.len()).rev() {
            if left == 0 {
                break;
            }
            let o = self.occurrences[i];
            if o.slot != slot as u32 || (o.at as usize) < keep {
                continue;
            }
            self.occurrences[i].slot = NONE;
            left -= 1;
            let token = self.docs[slot].1[o.at as usize];
            let head = (self.chains.get(&token)).is_some_and(|c| c.newest == i as u32);
            let older = head.then(|| self.live_from(o.previous)).flatten();
            if let Some(chain) = self.chains.get_mut(&token) {
                chain.count -= 1;
                if chain.count == 0 {
                    self.chains.remove(&token);
                } else if head {
                    chain.newest = older.unwrap_or(NONE);
                }
            }
        }
        self.docs[slot].1.truncate(keep);
        self.tokens -= n;
        true
    }

    /// The first occurrence still held, walking back from `from`.
    fn live_from(&self, mut from: u32) -> Option<u32> {
        while from != NONE {
            let o = self.occurrences[from as usize];
            if o.slot != NONE {
                return Some(from);
            }
            from = o.previous;
        }
        None
    }

    /// The documents, in order.
    pub fn documents(&self) -> impl Iterator<Item = &[u32]> {
        self.docs.iter().map(|(_, d)| d.as_slice())
    }

    /// What followed the occurrences that agree longest with the end of `pattern` (at most `depth`
    /// tokens each, never past a document's end), and the agreement's length.
    pub fn continuations(&self, pattern: &[u32], depth: usize) -> (Vec<Vec<u32>>, usize) {
        let held = |t: u32| self.chains.get(&t).map_or(0, |c| c.count as usize);
        let occurrences = |t: u32| {
            let mut next = self.chains.get(&t).and_then(|c| self.live_from(c.newest));
            std::iter::from_fn(move || {
                let o = self.occurrences[next? as usize];
                next = self.live_from(o.previous);
                Some((self.docs[o.slot as usize].1.as_slice(), o.at as usize))
            })
        };
        agreement::lookup(pattern, depth, held, occurrences)
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

    /// Random appends over interleaved documents and retractions, checked after each step against
    /// a brute force that keeps every occurrence held, in append order, in one list.
    #[test]
    fn random_appends_and_retractions_agree_with_a_list_of_every_occurrence() {
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut below = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut tail = Tail::default();
        // The oracle: each document's tokens, and every (document, position) held in append order.
        let mut docs: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut order: Vec<(u64, usize)> = Vec::new();
        for _ in 0..3_000 {
            let doc = below(6);
            if below(5) == 0 {
                let n = below(4) as usize;
                let held = docs.get(&doc).map_or(0, Vec::len);
                let first = !docs.contains_key(&doc);
                assert_eq!(tail.retract(doc, n), !first && n <= held);
                if !first && n <= held {
                    docs.get_mut(&doc).unwrap().truncate(held - n);
                    order.retain(|&(d, at)| d != doc || at < held - n);
                }
            } else {
                let tokens: Vec<u32> = (0..1 + below(5)).map(|_| below(7) as u32).collect();
                let body = docs.entry(doc).or_default();
                for &t in &tokens {
                    order.push((doc, body.len()));
                    body.push(t);
                }
                tail.append(doc, &tokens);
            }
            let pattern: Vec<u32> = (0..1 + below(4)).map(|_| below(7) as u32).collect();
            let held = |t: u32| order.iter().filter(|&&(d, at)| docs[&d][at] == t).count();
            let occurrences = |t: u32| {
                (order.iter().rev())
                    .map(|&(d, at)| (docs[&d].as_slice(), at))
                    .filter(move |&(body, at)| body[at] == t)
            };
            let want = agreement::lookup(&pattern, 3, held, occurrences);
            assert_eq!(tail.continuations(&pattern, 3), want, "{pattern:?}");
            assert_eq!(tail.tokens(), order.len());
        }
    }
}
