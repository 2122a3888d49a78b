//! The gate's trees laid out for prediction: one flat array of 16-byte nodes per forest, each tree
//! in depth-first order (a split's "≤" child is the next node).
//!
//! smartcore keeps 80-byte nodes and reads each feature through its matrix trait: a forest of 48
//! trees then spans more than the L2 cache, and predicting one decoding step's λ cost as much as the
//! rest of the gate's work. The flat copy answers exactly what smartcore's `predict` does (the same
//! comparisons, the leaves summed in tree order, then divided by the number of trees).

use serde_json::Value;

use super::features::{GateFeatures, NUM_FEATURES};
use super::MixError;

/// One node: a split (`feature` < [`NUM_FEATURES`]) sends a row whose feature is ≤ `value` to the
/// next node and any other row to `false_child`; a leaf (`feature` = [`LEAF`]) outputs `value`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Node {
    value: f64,
    false_child: u32,
    feature: u32,
}

const LEAF: u32 = u32::MAX;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlatForest {
    nodes: Vec<Node>,
    /// Where each tree's root is in `nodes`.
    roots: Vec<u32>,
}

impl FlatForest {
    /// The flat copy of a smartcore forest, read from its serde form (smartcore keeps its nodes
    /// private): `forest_regressor.trees[t].nodes[i]` with `output`, `split_feature`,
    /// `split_value`, `true_child` and `false_child`.
    pub fn from_smartcore(forest: &impl serde::Serialize) -> Result<Self, MixError> {
        let bad = |what: &str| MixError::Gate(format!("unexpected forest layout: {what}"));
        let value = serde_json::to_value(forest).map_err(|e| MixError::Gate(e.to_string()))?;
        let trees = value
            .pointer("/forest_regressor/trees")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no trees"))?;
        let mut flat = Self::default();
        for tree in trees {
            let nodes = tree
                .get("nodes")
                .and_then(Value::as_array)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad("a tree without nodes"))?;
            flat.roots.push(flat.len()?);
            flat.push_tree(nodes)?;
        }
        if flat.roots.is_empty() {
            return Err(bad("no trees"));
        }
        Ok(flat)
    }

    fn len(&self) -> Result<u32, MixError> {
        u32::try_from(self.nodes.len()).map_err(|_| MixError::Gate("a forest too large".into()))
    }

    /// Appends the tree of smartcore's `nodes` in depth-first order, "≤" child first. Walked
    /// with a stack of its own (a mixing file's tree may be deep), and refused when it reaches
    /// more nodes than it has (a child shared or a cycle).
    fn push_tree(&mut self, nodes: &[Value]) -> Result<(), MixError> {
        let bad = |what: String| MixError::Gate(format!("unexpected forest layout: {what}"));
        // (smartcore's node, the flat split whose "else" it is)
        let mut pending: Vec<(usize, Option<usize>)> = vec![(0, None)];
        let mut placed = 0;
        while let Some((at, else_of)) = pending.pop() {
            placed += 1;
            if placed > nodes.len() {
                return Err(bad("a node reached twice".into()));
            }
            let here = self.len()?;
            if let Some(split) = else_of {
                self.nodes[split].false_child = here;
            }
            let node = nodes
                .get(at)
                .ok_or_else(|| bad(format!("node {at} missing")))?;
            let child = |name: &str| -> Result<Option<usize>, MixError> {
                match node.get(name) {
                    None | Some(Value::Null) => Ok(None),
                    Some(v) => v
                        .as_u64()
                        .map(|c| Some(c as usize))
                        .ok_or_else(|| bad(format!("{name} of node {at}"))),
                }
            };
            let float = |name: &str| node.get(name).and_then(Value::as_f64);
            match (child("true_child")?, child("false_child")?) {
                (None, _) => self.nodes.push(Node {
                    value: float("output").ok_or_else(|| bad(format!("output of node {at}")))?,
                    false_child: 0,
                    feature: LEAF,
                }),
                (Some(true_child), Some(false_child)) => {
                    let feature = node
                        .get("split_feature")
                        .and_then(Value::as_u64)
                        .filter(|&f| (f as usize) < NUM_FEATURES)
                        .ok_or_else(|| bad(format!("split_feature of node {at}")))?;
                    self.nodes.push(Node {
                        // smartcore compares with NaN (always false) when a split has no value.
                        value: float("split_value").unwrap_or(f64::NAN),
                        false_child: 0,
                        feature: feature as u32,
                    });
                    pending.push((false_child, Some(here as usize)));
                    pending.push((true_child, None));
                }
                (Some(_), None) => return Err(bad(format!("node {at} has one child"))),
            }
        }
        Ok(())
    }

    /// The forest's prediction for one row: the mean of its trees' leaves.
    pub fn predict(&self, row: &GateFeatures) -> f64 {
        let mut sum = 0.0;
        for &root in &self.roots {
            let mut at = root as usize;
            loop {
                let node = self.nodes[at];
                let Some(&x) = row.get(node.feature as usize) else {
                    break;
                };
                at = if x <= node.value {
                    at + 1
                } else {
                    node.false_child as usize
                };
            }
            sum += self.nodes[at].value;
        }
        sum / self.roots.len() as f64
    }
}
