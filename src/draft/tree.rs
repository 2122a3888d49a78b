//! Draft trees in SuffixDecoding's shape: nodes in an order where parents come first, `parents[i]`
//! is −1 for a child of the context, `probs[i]` is the estimated probability that the target accepts
//! the path to node i, and `score` (their sum) is the expected number of accepted tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DraftTree {
    pub token_ids: Vec<u32>,
    pub parents: Vec<i32>,
    pub probs: Vec<f64>,
    pub score: f64,
    /// Length of the context suffix the draft was matched on.
    pub match_len: usize,
}

impl DraftTree {
    /// An empty draft with room for `nodes` nodes: drafts are built at every step.
    fn with_capacity(nodes: usize, match_len: usize) -> Self {
        Self {
            token_ids: Vec::with_capacity(nodes),
            parents: Vec::with_capacity(nodes),
            probs: Vec::with_capacity(nodes),
            score: 0.0,
            match_len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    /// The most likely path: at each level the child with the highest probability.
    pub fn chain(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut parent = -1i32;
        loop {
            let best = (0..self.len())
                .filter(|&i| self.parents[i] == parent)
                .max_by(|&a, &b| self.probs[a].total_cmp(&self.probs[b]));
            match best {
                Some(i) => {
                    out.push(self.token_ids[i]);
                    parent = i as i32;
                }
                None => return out,
            }
        }
    }

    /// Both drafts in one tree: nodes on the same path of tokens merge, keeping the likelier
    /// estimate (still never above the parent's, which is the likelier of two larger ones).
    pub fn union(&self, other: &DraftTree) -> DraftTree {
        let mut out = self.clone();
        let mut merged = Vec::with_capacity(other.len());
        for i in 0..other.len() {
            let parent = match other.parents[i] {
                -1 => -1,
                p => merged[p as usize],
            };
            let token = other.token_ids[i];
            let same =
                (0..out.len()).find(|&j| out.parents[j] == parent && out.token_ids[j] == token);
            let at = match same {
                Some(j) => {
                    out.probs[j] = out.probs[j].max(other.probs[i]);
                    j
                }
                None => {
                    out.token_ids.push(token);
                    out.parents.push(parent);
                    out.probs.push(other.probs[i]);
                    out.len() - 1
                }
            };
            merged.push(at as i32);
        }
        out.score = out.probs.iter().sum();
        out.match_len = self.match_len.max(other.match_len);
        out
    }

    /// The `budget` likeliest nodes, still a tree: a parent is never less likely than its child,
    /// and ties go to the earlier node, so every kept node's parent is kept.
    pub fn best(&self, budget: usize) -> DraftTree {
        if self.len() <= budget {
            return self.clone();
        }
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.sort_by(|&a, &b| self.probs[b].total_cmp(&self.probs[a]).then(a.cmp(&b)));
        let mut keep = vec![false; self.len()];
        for &i in &order[..budget] {
            keep[i] = true;
        }
        self.rebuilt(|i, _| keep[i].then_some(self.probs[i])).0
    }

    /// Node `i`'s probability given its parent's.
    pub fn conditional(&self, i: usize) -> f64 {
        match self.parents[i] {
            -1 => self.probs[i],
            p => self.probs[i] / self.probs[p as usize],
        }
    }

    /// The nodes `prob` keeps, with the probability it gives each from its index and its kept
    /// parent's new probability (1 for a root); a node under a dropped one is dropped. Also the
    /// kept nodes' indices in `self`.
    pub fn rebuilt(
        &self,
        mut prob: impl FnMut(usize, f64) -> Option<f64>,
    ) -> (DraftTree, Vec<usize>) {
        let mut out = DraftTree::with_capacity(self.len(), self.match_len);
        let mut kept = Vec::with_capacity(self.len());
        let mut new_index = vec![-1i32; self.len()];
        for i in 0..self.len() {
            let parent = match self.parents[i] {
                -1 => -1,
                p => new_index[p as usize],
            };
            if self.parents[i] >= 0 && parent < 0 {
                continue;
            }
            let parent_prob = match parent {
                -1 => 1.0,
                p => out.probs[p as usize],
            };
            let Some(p) = prob(i, parent_prob) else {
                continue;
            };
            new_index[i] = out.len() as i32;
            out.token_ids.push(self.token_ids[i]);
            out.parents.push(parent);
            out.probs.push(p);
            kept.push(i);
        }
        out.score = out.probs.iter().sum();
        (out, kept)
    }

    /// Checks the shape: parents before children, probabilities in (0, 1] and never above the
    /// parent's, ids inside the vocabulary, the score their sum.
    pub fn validate(&self, vocab_size: u64) -> Result<(), String> {
        let n = self.len();
        if self.parents.len() != n || self.probs.len() != n {
            return Err("token_ids, parents and probs differ in length".into());
        }
        for i in 0..n {
            let p = self.parents[i];
            if p < -1 || p >= i as i32 {
                return Err(format!("node {i} has parent {p}, not an earlier node"));
            }
            if !(self.probs[i] > 0.0 && self.probs[i] <= 1.0) {
                return Err(format!("node {i} has probability {}", self.probs[i]));
            }
            if p >= 0 && self.probs[i] > self.probs[p as usize] + 1e-12 {
                return Err(format!("node {i} is more likely than its parent"));
            }
            if self.token_ids[i] as u64 >= vocab_size {
                return Err(format!(
                    "node {i} has token {} outside the vocabulary",
                    self.token_ids[i]
                ));
            }
        }
        let sum: f64 = self.probs.iter().sum();
        if (sum - self.score).abs() > 1e-9 * sum.max(1.0) {
            return Err(format!("score {} is not the sum {sum}", self.score));
        }
        Ok(())
    }
}

/// Candidate continuations merged into a prefix tree with counts. A node's children are a list
/// threaded through the nodes (first child, next sibling), so building a trie allocates one vector
/// however many nodes it has: a draft builds one per source at every step.
#[derive(Debug)]
pub struct Trie {
    /// Node 0 is the root (the context).
    nodes: Vec<TrieNode>,
}

#[derive(Debug)]
struct TrieNode {
    token: u32,
    weight: f64,
    first_child: u32,
    next_sibling: u32,
}

/// No child, or no next sibling.
const NONE: u32 = u32::MAX;

/// A node waiting to be taken into the draft, by path probability.
struct Frontier {
    prob: f64,
    node: usize,
    /// Position of the parent in the draft, −1 for the root.
    draft_parent: i32,
    depth: usize,
}

impl PartialEq for Frontier {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Frontier {}
impl PartialOrd for Frontier {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Frontier {
    /// Likelier first; ties to the earlier-inserted node, so drafts are deterministic.
    fn cmp(&self, other: &Self) -> Ordering {
        self.prob
            .total_cmp(&other.prob)
            .then_with(|| other.node.cmp(&self.node))
    }
}

impl Default for Trie {
    fn default() -> Self {
        Self::new()
    }
}

impl Trie {
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty trie with room for `nodes` nodes besides its root.
    pub fn with_capacity(nodes: usize) -> Self {
        let mut trie = Self {
            nodes: Vec::with_capacity(nodes + 1),
        };
        trie.nodes.push(TrieNode {
            token: 0,
            weight: 0.0,
            first_child: NONE,
            next_sibling: NONE,
        });
        trie
    }

    /// Adds one continuation with its weight (an occurrence count, or a match's strength).
    pub fn insert(&mut self, tokens: &[u32], weight: f64) {
        let mut at = 0;
        self.nodes[0].weight += weight;
        for &t in tokens {
            let found = self.children(at).find(|&c| self.nodes[c].token == t);
            at = found.unwrap_or_else(|| {
                let c = self.nodes.len();
                debug_assert!(c < NONE as usize, "a trie of 2^32 nodes");
                let next_sibling = std::mem::replace(&mut self.nodes[at].first_child, c as u32);
                self.nodes.push(TrieNode {
                    token: t,
                    weight: 0.0,
                    first_child: NONE,
                    next_sibling,
                });
                c
            });
            self.nodes[at].weight += weight;
        }
    }

    /// `node`'s children, newest first.
    fn children(&self, node: usize) -> impl Iterator<Item = usize> + '_ {
        let first = self.nodes[node].first_child;
        std::iter::successors((first != NONE).then_some(first as usize), |&c| {
            let next = self.nodes[c].next_sibling;
            (next != NONE).then_some(next as usize)
        })
    }

    /// The best draft of at most `budget` nodes and `max_depth` levels: nodes are taken by path
    /// probability (child weight over parent weight, multiplied down the path), skipping any whose
    /// own conditional probability is below `min_prob`. A budget of `max_depth` with `chain` keeps
    /// only the likeliest child at each level.
    pub fn best_draft(
        &self,
        budget: usize,
        max_depth: usize,
        min_prob: f64,
        chain: bool,
        match_len: usize,
    ) -> DraftTree {
        let mut tree = DraftTree::with_capacity(budget.min(self.nodes.len()), match_len);
        let mut heap = BinaryHeap::new();
        self.push_children(&mut heap, 0, 1.0, -1, 0, min_prob, chain);
        while let Some(f) = heap.pop() {
            if tree.len() >= budget {
                break;
            }
            if f.depth >= max_depth {
                continue;
            }
            tree.token_ids.push(self.nodes[f.node].token);
            tree.parents.push(f.draft_parent);
            tree.probs.push(f.prob);
            tree.score += f.prob;
            let me = tree.len() as i32 - 1;
            self.push_children(&mut heap, f.node, f.prob, me, f.depth + 1, min_prob, chain);
        }
        tree
    }

    #[allow(clippy::too_many_arguments)]
    fn push_children(
        &self,
        heap: &mut BinaryHeap<Frontier>,
        node: usize,
        prob: f64,
        draft_parent: i32,
        depth: usize,
        min_prob: f64,
        chain: bool,
    ) {
        let total = self.nodes[node].weight;
        if total <= 0.0 {
            return;
        }
        let kids = self
            .children(node)
            .map(|c| (self.nodes[c].weight / total, c))
            .filter(|&(p, _)| p >= min_prob);
        let mut push = |(p, c): (f64, usize)| {
            heap.push(Frontier {
                prob: prob * p,
                node: c,
                draft_parent,
                depth,
            })
        };
        // The heap orders the rest (likelier first, ties to the earlier-inserted node); a chain
        // keeps the child it would take first.
        if chain {
            let first =
                |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
            if let Some(kid) = kids.min_by(first) {
                push(kid);
            }
        } else {
            kids.for_each(push);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_union_merges_shared_paths_keeping_the_likelier_estimate() {
        let chain = DraftTree {
            token_ids: vec![5, 6],
            parents: vec![-1, 0],
            probs: vec![0.8, 0.5],
            score: 1.3,
            match_len: 4,
        };
        let fork = DraftTree {
            token_ids: vec![7, 5, 8],
            parents: vec![-1, -1, 1],
            probs: vec![0.3, 0.9, 0.2],
            score: 1.4,
            match_len: 2,
        };
        let union = chain.union(&fork);
        assert_eq!(union.token_ids, vec![5, 6, 7, 8]);
        assert_eq!(union.parents, vec![-1, 0, -1, 0]);
        assert_eq!(union.probs, vec![0.9, 0.5, 0.3, 0.2]);
        assert_eq!(union.match_len, 4);
        union.validate(10).unwrap();
        assert_eq!(fork.union(&DraftTree::default()), fork);
        // Cut to three nodes: 5 (0.9), 6 under it (0.5), 7 (0.3); 8 (0.2) goes.
        let best = union.best(3);
        assert_eq!(best.token_ids, vec![5, 6, 7]);
        assert_eq!(best.parents, vec![-1, 0, -1]);
        best.validate(10).unwrap();
        assert_eq!(union.best(1).token_ids, vec![5]);
        assert_eq!(union.best(9), union);
    }

    #[test]
    fn best_first_takes_the_likeliest_paths_within_the_budget() {
        let mut trie = Trie::new();
        trie.insert(&[1, 2, 3], 3.0);
        trie.insert(&[1, 4], 1.0);
        trie.insert(&[5], 2.0);
        // P(1) = 4/6, P(2|1) = 3/4 → 1/2, P(3|1,2) = 1 → 1/2, P(5) = 2/6, P(4|1) = 1/4 → 1/6.
        let tree = trie.best_draft(4, 8, 0.0, false, 2);
        assert_eq!(tree.token_ids, vec![1, 2, 3, 5]);
        assert_eq!(tree.parents, vec![-1, 0, 1, -1]);
        let want = [4.0 / 6.0, 0.5, 0.5, 2.0 / 6.0];
        for (g, w) in tree.probs.iter().zip(want) {
            assert!((g - w).abs() < 1e-12);
        }
        tree.validate(10).unwrap();
        assert_eq!(tree.chain(), vec![1, 2, 3]);
        // With room for everything, min_prob 0.3 still drops 4 (P(4|1) = 0.25).
        let pruned = trie.best_draft(10, 8, 0.3, false, 2);
        assert_eq!(pruned.token_ids, vec![1, 2, 3, 5]);
        assert_eq!(trie.best_draft(10, 8, 0.0, false, 2).len(), 5);
        let chain = trie.best_draft(10, 2, 0.0, true, 2);
        assert_eq!(chain.token_ids, vec![1, 2]);
    }

    #[test]
    fn validation_catches_bad_shapes() {
        let good = DraftTree {
            token_ids: vec![1, 2],
            parents: vec![-1, 0],
            probs: vec![0.5, 0.25],
            score: 0.75,
            match_len: 1,
        };
        good.validate(3).unwrap();
        let mut bad = good.clone();
        bad.parents[1] = 1;
        assert!(bad.validate(3).is_err());
        let mut bad = good.clone();
        bad.probs[1] = 0.9;
        assert!(bad.validate(3).is_err());
        assert!(good.validate(2).is_err());
    }
}
