//! A speculative decoding loop with the model as the target: each step runs the pending token and a
//! draft in one pass, keeps the longest verified path plus one token of the target's own, and rolls
//! the KV cache back over the rest. Greedy verification takes draft trees (on the CPU, where a pass
//! attends along each row's path) and reproduces plain greedy decoding; sampling verification takes
//! the draft's most likely chain, accepts a drafted token with the target's probability of it and
//! otherwise samples from the target with that token removed, which leaves the target distribution
//! exact (the draft is a point mass).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::{DecodeError, Extras, Sequence};
use crate::draft::{DraftOptions, DraftTree};
use crate::evidence::EvidenceSource;
use crate::model::{KvCache, ModelError, Transformer, MAX_EXACT_ROWS, SHORT_PASS_ROWS};
use crate::softmax::softmax;

/// Rows verified per pass on the CPU, pending token included: an exact pass, computed row for row
/// as one-token decoding computes it, so greedy output stays bit-identical. Other devices verify in
/// short passes (fewer than [`SHORT_PASS_ROWS`] rows).
pub const MAX_VERIFY_ROWS: usize = MAX_EXACT_ROWS;

#[derive(Debug, Clone, Copy)]
pub struct SpecOptions {
    pub max_new_tokens: usize,
    /// None decodes without drafts (the baseline).
    pub draft: Option<DraftOptions>,
    /// None or 0: greedy; else sampling at this temperature.
    pub temperature: Option<f64>,
    pub seed: u64,
    pub stop_token: Option<u32>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SpecRun {
    pub tokens: Vec<u32>,
    /// Target passes.
    pub steps: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// Drafting and keeping the drafter's state up to date.
    pub draft_seconds: f64,
    /// Running the prompt, before the first new token.
    pub prefill_seconds: f64,
    /// Decoding, after the prefill.
    pub seconds: f64,
    /// Drafts, drafted and accepted tokens by the source of the draft ("union" for trees of several).
    pub by_source: BTreeMap<&'static str, SourceTally>,
    /// Most draft tokens verified in one pass.
    pub longest_draft: usize,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SourceTally {
    pub drafts: usize,
    pub drafted: usize,
    pub accepted: usize,
}

/// splitmix64: a small, seedable source of uniforms for sampling verification.
struct Uniform(u64);

impl Uniform {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn sample(p: &[f64], u: f64) -> u32 {
    let total: f64 = p.iter().sum();
    let mut acc = 0.0;
    for (i, &x) in p.iter().enumerate() {
        acc += x / total;
        if u < acc {
            return i as u32;
        }
    }
    p.iter().rposition(|&x| x > 0.0).unwrap_or(0) as u32
}

/// A pass's rows: the pending token (row 0), then draft tokens, row `r ≥ 1` holding `tokens[r − 1]`
/// after row `parents[r − 1] < r`. Trees are laid out depth first, likeliest child first, so the
/// likeliest path is rows `0, 1, 2, ..` and keeping it moves nothing in the cache.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Rows {
    tokens: Vec<u32>,
    parents: Vec<usize>,
}

impl Rows {
    /// A draft's rows as a pass verifies them: a tree when `tree`, else its likeliest chain; at
    /// most `room` tokens.
    pub(crate) fn of(draft: &DraftTree, room: usize, tree: bool) -> Self {
        match tree {
            true => Self::tree(draft, room),
            false => Self::chain(draft, room),
        }
    }

    /// Draft tokens in the pass.
    pub(crate) fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The accepted rows, in path order, and the target's own next token, where `target(row,
    /// depth)` is the target's choice after `row` (the root's at depth 0): each step follows the
    /// child that drafted it, until none did.
    pub(crate) fn accepted(
        &self,
        mut target: impl FnMut(usize, usize) -> u32,
    ) -> (Vec<usize>, u32) {
        let mut path = Vec::new();
        let mut at = 0;
        loop {
            let t = target(at, path.len());
            match (0..self.tokens.len()).find(|&r| self.parents[r] == at && self.tokens[r] == t) {
                Some(r) => {
                    path.push(r + 1);
                    at = r + 1;
                }
                None => return (path, t),
            }
        }
    }

    /// The draft's likeliest chain, at most `room` tokens.
    fn chain(draft: &DraftTree, room: usize) -> Self {
        let mut tokens = draft.chain();
        tokens.truncate(room);
        Self {
            parents: (0..tokens.len()).collect(),
            tokens,
        }
    }

    /// The draft tree's first `room` nodes depth first (a prefix of that order is still a tree).
    fn tree(draft: &DraftTree, room: usize) -> Self {
        let mut rows = Self::default();
        // (node, its row's parent row), popped likeliest child first.
        let mut stack: Vec<(usize, usize)> = Vec::new();
        let push_children = |stack: &mut Vec<(usize, usize)>, parent: i32, row: usize| {
            let mut children: Vec<usize> = (0..draft.len())
                .filter(|&i| draft.parents[i] == parent)
                .collect();
            children.sort_by(|&a, &b| draft.probs[a].total_cmp(&draft.probs[b]));
            stack.extend(children.into_iter().map(|c| (c, row)));
        };
        push_children(&mut stack, -1, 0);
        while let Some((node, parent_row)) = stack.pop() {
            if rows.tokens.len() == room {
                break;
            }
            rows.tokens.push(draft.token_ids[node]);
            rows.parents.push(parent_row);
            push_children(&mut stack, node as i32, rows.tokens.len());
        }
        rows
    }

    fn is_chain(&self) -> bool {
        self.parents.iter().enumerate().all(|(i, &p)| p == i)
    }
}

/// How a pass's logits decide between the draft and the target.
enum Verifier {
    Greedy,
    Sampling { temperature: f64, rng: Uniform },
}

impl Verifier {
    /// The accepted draft rows, in path order, and the target's own next token, from the logits
    /// of every row (`logits.len() == rows.tokens.len() + 1`). Sampling takes chains only.
    fn verify(&mut self, logits: &[Vec<f32>], rows: &Rows) -> (Vec<usize>, u32) {
        match self {
            Verifier::Greedy => rows.accepted(|at, _| argmax(&logits[at])),
            Verifier::Sampling { temperature, rng } => {
                let (accepted, next) = verify_sampled(logits, &rows.tokens, *temperature, rng);
                ((1..=accepted).collect(), next)
            }
        }
    }
}

/// Accepted draft tokens of a chain and the target's own next token, under sampling at
/// `temperature`.
fn verify_sampled(
    logits: &[Vec<f32>],
    draft: &[u32],
    temperature: f64,
    rng: &mut Uniform,
) -> (usize, u32) {
    for (i, row) in logits.iter().enumerate() {
        let mut p = softmax(row, temperature);
        // A drafted id beyond the model's vocabulary has probability 0: rejected.
        match draft
            .get(i)
            .map(|&d| (d as usize, p.get(d as usize).copied().unwrap_or(0.0)))
        {
            Some((_, q)) if rng.next() < q => {}
            Some((d, _)) => {
                if let Some(x) = p.get_mut(d) {
                    *x = 0.0;
                }
                return (i, sample(&p, rng.next()));
            }
            None => return (i, sample(&p, rng.next())),
        }
    }
    // Unreachable: the last row has no draft token and always returns.
    (draft.len(), draft.last().copied().unwrap_or(0))
}

/// Continues `prompt` with `model`, drafting when asked from the evidence `source`, the sequence itself and
/// `extras` (a live namespace, which learns the output when `extras.learn`; a reference text).
/// Without drafts (the baseline) the model decodes alone: the reference data is not read.
pub fn decode(
    model: &Transformer,
    source: &Arc<dyn EvidenceSource>,
    prompt: &[u32],
    opts: &SpecOptions,
    extras: Extras,
) -> Result<SpecRun, DecodeError> {
    let Some((&last, head)) = prompt.split_last() else {
        return Err(ModelError::Invalid("empty prompt".into()).into());
    };
    crate::model::on_rayon_worker(|| {
        let prefill = Instant::now();
        let mut run = SpecRun::default();
        let mut verifier = match opts.temperature.filter(|&t| t > 0.0) {
            None => Verifier::Greedy,
            Some(temperature) => Verifier::Sampling {
                temperature,
                rng: Uniform(opts.seed),
            },
        };
        // Trees when asked for, under greedy verification, where passes can follow them (the CPU).
        let cpu = model.device().is_cpu();
        let trees =
            opts.draft.is_some_and(|d| d.tree) && matches!(verifier, Verifier::Greedy) && cpu;
        let max_rows = match cpu {
            true => MAX_VERIFY_ROWS,
            false => SHORT_PASS_ROWS - 1,
        };
        // The drafter's time: taking in the prompt and keeping its state up to date, when drafting.
        let drafter_time = |since: Instant, run: &mut SpecRun| {
            if opts.draft.is_some() {
                run.draft_seconds += since.elapsed().as_secs_f64();
            }
        };
        let t = Instant::now();
        let seq = match opts.draft {
            Some(_) => Sequence::new(Arc::clone(source), prompt.to_vec())?.with_extras(extras)?,
            None => Sequence::model_only(prompt.to_vec()),
        };
        let mut seq = seq.with_model(model, None);
        drafter_time(t, &mut run);
        // The cache holds every token of the sequence but the last, the pending one.
        if !head.is_empty() {
            model.forward_last(head, cache(&mut seq)?)?;
        }
        run.prefill_seconds = prefill.elapsed().as_secs_f64();
        let started = Instant::now();
        let mut pending = last;
        while run.tokens.len() < opts.max_new_tokens {
            if crate::interrupt::interrupted() {
                return Err(ModelError::Interrupted.into());
            }
            let t = Instant::now();
            let room = (opts.max_new_tokens - run.tokens.len() - 1).min(max_rows - 1);
            let rows = match &opts.draft {
                Some(d) => Rows::of(&seq.draft(d)?, room, trees),
                None => Rows::default(),
            };
            drafter_time(t, &mut run);

            let mut input = Vec::with_capacity(rows.tokens.len() + 1);
            input.push(pending);
            input.extend(&rows.tokens);
            let cache = cache(&mut seq)?;
            let before = cache.len();
            let logits = match rows.is_chain() {
                true if cpu => model.forward_exact(&input, cache)?,
                true => model.forward(&input, cache)?,
                false => {
                    let parents: Vec<usize> = std::iter::once(0)
                        .chain(rows.parents.iter().copied())
                        .collect();
                    model.forward_tree(&input, &parents, cache)?
                }
            };
            let logits: Vec<Vec<f32>> = logits.to_vec2()?;
            let (path, next) = verifier.verify(&logits, &rows);
            let kept: Vec<usize> = std::iter::once(0).chain(path.iter().copied()).collect();
            cache.keep(before, &kept)?;
            run.steps += 1;
            run.drafted += rows.tokens.len();
            run.longest_draft = run.longest_draft.max(rows.tokens.len());
            run.accepted += path.len();
            if !rows.tokens.is_empty() {
                let source = seq.last_origin().map_or("union", |o| o.name());
                let tally = run.by_source.entry(source).or_default();
                tally.drafts += 1;
                tally.drafted += rows.tokens.len();
                tally.accepted += path.len();
            }

            let mut new: Vec<u32> = path.iter().map(|&r| rows.tokens[r - 1]).collect();
            new.push(next);
            let stop_at = new.iter().position(|&t| Some(t) == opts.stop_token);
            if let Some(i) = stop_at {
                new.truncate(i + 1);
            }
            let t = Instant::now();
            seq.append(&new)?;
            drafter_time(t, &mut run);
            run.tokens.extend(&new);
            pending = next;
            if stop_at.is_some() {
                break;
            }
        }
        run.seconds = started.elapsed().as_secs_f64();
        Ok(run)
    })
}

/// The KV cache of a sequence made [`Sequence::with_model`].
fn cache(seq: &mut Sequence) -> Result<&mut KvCache, DecodeError> {
    match &mut seq.model {
        Some(state) => Ok(&mut state.cache),
        None => Err(ModelError::Invalid("the sequence keeps no model state".into()).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(tokens: &[u32], parents: &[usize]) -> Rows {
        Rows {
            tokens: tokens.to_vec(),
            parents: parents.to_vec(),
        }
    }

    #[test]
    fn greedy_verification_keeps_the_agreeing_prefix() {
        let logits = vec![
            vec![0.0, 5.0, 1.0],
            vec![0.0, 1.0, 5.0],
            vec![9.0, 1.0, 0.0],
        ];
        // Draft [1, 0]: the target says 1 (accept), then 2 (reject 0, emit 2).
        let mut greedy = Verifier::Greedy;
        assert_eq!(
            greedy.verify(&logits, &rows(&[1, 0], &[0, 1])),
            (vec![1], 2)
        );
        assert_eq!(
            greedy.verify(&logits, &rows(&[1, 2], &[0, 1])),
            (vec![1, 2], 0)
        );
        assert_eq!(greedy.verify(&logits[..1], &Rows::default()), (vec![], 1));
    }

    /// A tree is followed down the branch the target agrees with, whatever its row order.
    #[test]
    fn greedy_verification_follows_the_agreeing_branch() {
        // Rows: 0 pending; 1 = token 2 under 0; 2 = token 1 under 0; 3 = token 0 under 2;
        // 4 = token 2 under 1. The target says 1 after row 0, then 0 after row 2, then 2.
        let logits = vec![
            vec![0.0, 5.0, 1.0],
            vec![0.0, 0.0, 5.0],
            vec![5.0, 0.0, 1.0],
            vec![0.0, 1.0, 5.0],
            vec![5.0, 0.0, 0.0],
        ];
        let tree = rows(&[2, 1, 0, 2], &[0, 0, 2, 1]);
        assert!(!tree.is_chain());
        assert_eq!(Verifier::Greedy.verify(&logits, &tree), (vec![2, 3], 2));
    }

    /// Trees are laid out depth first, likeliest child first, and cut to the room left.
    #[test]
    fn trees_are_laid_out_likeliest_path_first() {
        let draft = DraftTree {
            token_ids: vec![10, 11, 12, 13],
            parents: vec![-1, -1, 0, 1],
            probs: vec![0.3, 0.6, 0.2, 0.5],
            score: 1.6,
            match_len: 2,
        };
        assert_eq!(
            Rows::tree(&draft, 8),
            rows(&[11, 13, 10, 12], &[0, 1, 0, 3])
        );
        assert_eq!(Rows::tree(&draft, 3), rows(&[11, 13, 10], &[0, 1, 0]));
        assert_eq!(Rows::chain(&draft, 8), rows(&[11, 13], &[0, 1]));
        assert!(Rows::chain(&draft, 8).is_chain());
    }

    /// Sampling verification with a fixed draft token leaves the target's distribution exact: the
    /// emitted first token's frequencies match softmax(row) within sampling error.
    #[test]
    fn sampling_verification_keeps_the_target_distribution() {
        let rows = vec![vec![1.0, 2.0, 0.5, 1.5], vec![0.0; 4]];
        let p = softmax(&rows[0], 1.0);
        let mut v = Verifier::Sampling {
            temperature: 1.0,
            rng: Uniform(7),
        };
        let one_token = DraftTree {
            token_ids: vec![3],
            parents: vec![-1],
            probs: vec![0.5],
            score: 0.5,
            match_len: 1,
        };
        let n = 200_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            let (path, next) = v.verify(&rows, &Rows::chain(&one_token, 1));
            let first = if path.len() == 1 { 3 } else { next };
            counts[first as usize] += 1;
        }
        // χ² with 3 degrees of freedom; 16.27 is the 0.1% critical value.
        let chi2: f64 = counts
            .iter()
            .zip(&p)
            .map(|(&c, &q)| (c as f64 - n as f64 * q).powi(2) / (n as f64 * q))
            .sum();
        assert!(chi2 < 16.27, "χ² = {chi2}, counts {counts:?}, p {p:?}");
    }
}
