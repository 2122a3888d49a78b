//! The gate's trees laid out for prediction: one flat array of 16-byte nodes per forest, each tree
//! in depth-first order (a split's "≤" child is the next node).
//!
//! A tree's walk is a chain of dependent reads and unpredictable branches; the trees are walked
//! [`TREES_TOGETHER`] at a time in lockstep, one level of each per round, without a branch: a leaf
//! sends every row to itself, so a tree that reached one waits there for the deepest.
//!
//! smartcore keeps 80-byte nodes and reads each feature through its matrix trait: a forest of 48
//! trees then spans more than the L2 cache, and predicting one decoding step's λ cost as much as the
//! rest of the gate's work. The flat copy answers exactly what smartcore's `predict` does (the same
//! comparisons, the leaves summed in tree order, then divided by the number of trees).

use serde::Deserialize;

use super::features::{GateFeatures, NUM_FEATURES};
use super::MixError;

/// One node: a split (`feature` < [`NUM_FEATURES`]) sends a row whose feature is ≤ `value` to the
/// next node and any other row to `false_child`; a leaf (`feature` = [`LEAF`]) outputs `value`, and
/// its `false_child` is itself: the row's slot [`LEAF`] holds NaN, which is ≤ nothing.
#[derive(Debug, Clone, Copy)]
struct Node {
    value: f64,
    false_child: u32,
    feature: u32,
}

const LEAF: u32 = NUM_FEATURES as u32;
/// Trees walked side by side: enough independent reads to hide each one's wait.
const TREES_TOGETHER: usize = 16;

#[derive(Debug, Default)]
pub struct FlatForest {
    nodes: Vec<Node>,
    /// Where each tree's root is in `nodes`.
    roots: Vec<u32>,
    /// Splits on the longest path from a root to a leaf: the rounds a walk takes.
    depth: u32,
}

/// smartcore 0.7's random-forest regressor as bincode lays it out, read up to its trees (smartcore
/// keeps its nodes private). bincode, unlike a JSON value, keeps every f64 as it is: a split at
/// ±∞ stays one, and stays apart from a split without a value. A layout that changed with a
/// smartcore version fails the exactness test in `gate`.
#[derive(Deserialize)]
struct StoredForest {
    forest_regressor: Option<StoredTrees>,
}

#[derive(Deserialize)]
struct StoredTrees {
    trees: Option<Vec<StoredTree>>,
}

#[derive(Deserialize)]
struct StoredTree {
    nodes: Vec<StoredNode>,
    _parameters: Option<StoredParameters>,
    _depth: u16,
    _root_mass: f64,
}

#[derive(Deserialize)]
struct StoredParameters {
    _max_depth: Option<u16>,
    _min_samples_leaf: usize,
    _min_samples_split: usize,
    _seed: Option<u64>,
    _splitter: StoredSplitter,
}

#[derive(Deserialize)]
enum StoredSplitter {
    Random,
    Best,
}

#[derive(Deserialize)]
struct StoredNode {
    output: f64,
    split_feature: usize,
    split_value: Option<f64>,
    _split_score: Option<f64>,
    true_child: Option<usize>,
    false_child: Option<usize>,
}

fn layout(what: String) -> MixError {
    MixError::Gate(format!("unexpected forest layout: {what}"))
}

impl FlatForest {
    /// The flat copy of a smartcore forest.
    pub fn from_smartcore(forest: &impl serde::Serialize) -> Result<Self, MixError> {
        let bytes = bincode::serialize(forest).map_err(|e| MixError::Gate(e.to_string()))?;
        let stored: StoredForest =
            bincode::deserialize(&bytes).map_err(|e| layout(e.to_string()))?;
        let trees = stored
            .forest_regressor
            .and_then(|f| f.trees)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| layout("no trees".into()))?;
        let mut flat = Self::default();
        for tree in &trees {
            flat.roots.push(flat.len()?);
            flat.push_tree(&tree.nodes)?;
        }
        Ok(flat)
    }

    fn len(&self) -> Result<u32, MixError> {
        u32::try_from(self.nodes.len()).map_err(|_| layout("a forest too large".into()))
    }

    /// Appends a tree in depth-first order, "≤" child first. Walked with a stack of its own (a
    /// mixing file's tree may be deep), and refused when it reaches more nodes than the tree has
    /// (a child shared, or a cycle).
    fn push_tree(&mut self, nodes: &[StoredNode]) -> Result<(), MixError> {
        if nodes.is_empty() {
            return Err(layout("a tree without nodes".into()));
        }
        // (the stored node, the flat split whose "else" it is, splits above it)
        let mut pending: Vec<(usize, Option<u32>, u32)> = vec![(0, None, 0)];
        let mut placed = 0;
        while let Some((at, else_of, depth)) = pending.pop() {
            placed += 1;
            if placed > nodes.len() {
                return Err(layout("a node reached twice".into()));
            }
            let here = self.len()?;
            if let Some(split) = else_of {
                self.nodes[split as usize].false_child = here;
            }
            let node = nodes
                .get(at)
                .ok_or_else(|| layout(format!("node {at} missing")))?;
            match (node.true_child, node.false_child) {
                // smartcore takes a node without a "≤" child for a leaf.
                (None, _) => {
                    self.depth = self.depth.max(depth);
                    self.nodes.push(Node {
                        value: node.output,
                        false_child: here,
                        feature: LEAF,
                    })
                }
                (Some(true_child), Some(false_child)) => {
                    if node.split_feature >= NUM_FEATURES {
                        return Err(layout(format!(
                            "node {at} splits on feature {} of {NUM_FEATURES}",
                            node.split_feature
                        )));
                    }
                    self.nodes.push(Node {
                        // smartcore compares with NaN (always false) when a split has no value.
                        value: node.split_value.unwrap_or(f64::NAN),
                        false_child: 0,
                        feature: node.split_feature as u32,
                    });
                    pending.push((false_child, Some(here), depth + 1));
                    pending.push((true_child, None, depth + 1));
                }
                (Some(_), None) => return Err(layout(format!("node {at} has one child"))),
            }
        }
        Ok(())
    }

    /// The forest's prediction for one row: the mean of its trees' leaves, added in tree order.
    pub fn predict(&self, row: &GateFeatures) -> f64 {
        let mut padded = [f64::NAN; NUM_FEATURES + 1];
        padded[..NUM_FEATURES].copy_from_slice(row);
        let mut sum = 0.0;
        for roots in self.roots.chunks(TREES_TOGETHER) {
            let mut walks = [0u32; TREES_TOGETHER];
            let walks = &mut walks[..roots.len()];
            walks.copy_from_slice(roots);
            for _ in 0..self.depth {
                for at in walks.iter_mut() {
                    let node = self.nodes[*at as usize];
                    *at = if padded[node.feature as usize] <= node.value {
                        *at + 1
                    } else {
                        node.false_child
                    };
                }
            }
            // One sum over every leaf in tree order, as smartcore adds them.
            for &at in walks.iter() {
                sum += self.nodes[at as usize].value;
            }
        }
        sum / self.roots.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(feature: usize, value: f64, children: (usize, usize)) -> StoredNode {
        StoredNode {
            output: 0.0,
            split_feature: feature,
            split_value: Some(value),
            _split_score: None,
            true_child: Some(children.0),
            false_child: Some(children.1),
        }
    }

    fn leaf(output: f64) -> StoredNode {
        StoredNode {
            output,
            split_feature: 0,
            split_value: None,
            _split_score: None,
            true_child: None,
            false_child: None,
        }
    }

    /// A tree stored children first (as smartcore may) is laid out "≤" child next, and predicts
    /// by hand; trees that could loop, read out of bounds or index past the features are refused.
    #[test]
    fn lays_out_what_it_can_walk_and_refuses_the_rest() {
        let mut flat = FlatForest::default();
        flat.roots.push(0);
        // Root: feature 2 ≤ 1.5 → node 2 (a split on feature 0 at +∞), else → leaf 0.25.
        let tree = [
            split(2, 1.5, (2, 1)),
            leaf(0.25),
            split(0, f64::INFINITY, (3, 4)),
            leaf(0.5),
            leaf(0.75),
        ];
        flat.push_tree(&tree).unwrap();
        let row = |f0: f64, f2: f64| {
            let mut r = [0.0; NUM_FEATURES];
            (r[0], r[2]) = (f0, f2);
            r
        };
        assert_eq!(flat.predict(&row(1e300, 1.5)), 0.5);
        assert_eq!(flat.predict(&row(f64::NAN, 1.0)), 0.75);
        assert_eq!(flat.predict(&row(0.0, 1.6)), 0.25);

        let refused = |tree: &[StoredNode]| FlatForest::default().push_tree(tree).is_err();
        assert!(refused(&[]));
        assert!(refused(&[split(0, 0.0, (0, 0))]), "a cycle");
        assert!(
            refused(&[split(0, 0.0, (1, 1)), leaf(0.0)]),
            "a shared child"
        );
        assert!(
            refused(&[split(0, 0.0, (1, 5)), leaf(0.0)]),
            "a missing node"
        );
        assert!(refused(&[
            split(NUM_FEATURES, 0.0, (1, 2)),
            leaf(0.0),
            leaf(1.0)
        ]));
        let mut one_child = split(0, 0.0, (1, 1));
        one_child.false_child = None;
        assert!(refused(&[one_child, leaf(0.0)]));
    }
}
