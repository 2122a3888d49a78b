//! A speculative decoding loop with the model as the target: each step runs the pending token and a
//! draft chain in one pass, keeps the longest verified prefix plus one token of the target's own, and
//! rolls the KV cache back over the rest. Greedy verification reproduces plain greedy decoding;
//! sampling verification accepts a drafted token with the target's probability of it and otherwise
//! samples from the target with that token removed, which leaves the target distribution exact
//! (the draft is a point mass).

use std::time::Instant;

use serde::Serialize;

use super::{DraftOptions, Sequence};
use crate::index::Index;
use crate::model::{ModelError, Transformer, SHORT_PASS_ROWS};

/// Rows verified per pass, pending token included: a short pass, computed row for row as one-token
/// decoding computes it, so greedy output stays bit-identical.
pub const MAX_VERIFY_ROWS: usize = SHORT_PASS_ROWS - 1;

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

fn softmax(row: &[f32], temperature: f64) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut p: Vec<f64> = row
        .iter()
        .map(|&l| ((l as f64 - max) / temperature).exp())
        .collect();
    let z: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= z);
    p
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

/// How a pass's logits decide between the draft and the target.
enum Verifier {
    Greedy,
    Sampling { temperature: f64, rng: Uniform },
}

impl Verifier {
    /// Accepted draft tokens and the target's own next token, from the logits of the pending token
    /// and each draft token (`rows.len() == draft.len() + 1`).
    fn verify(&mut self, rows: &[Vec<f32>], draft: &[u32]) -> (usize, u32) {
        for (i, row) in rows.iter().enumerate() {
            let drafted = draft.get(i).copied();
            match self {
                Verifier::Greedy => {
                    let t = argmax(row);
                    if drafted != Some(t) {
                        return (i, t);
                    }
                }
                Verifier::Sampling { temperature, rng } => {
                    let mut p = softmax(row, *temperature);
                    // A drafted id beyond the model's vocabulary has probability 0: rejected.
                    match drafted.map(|d| (d as usize, p.get(d as usize).copied().unwrap_or(0.0))) {
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
            }
        }
        // Unreachable: the last row has no draft token and always returns.
        (draft.len(), draft.last().copied().unwrap_or(0))
    }
}

/// Continues `prompt` with `model`, drafting from `index` and the sequence itself when asked.
pub fn decode(
    model: &Transformer,
    index: &Index,
    prompt: &[u32],
    opts: &SpecOptions,
) -> Result<SpecRun, anyhow::Error> {
    crate::model::on_rayon_worker(|| decode_here(model, index, prompt, opts))
}

fn decode_here(
    model: &Transformer,
    index: &Index,
    prompt: &[u32],
    opts: &SpecOptions,
) -> Result<SpecRun, anyhow::Error> {
    let Some((&last, head)) = prompt.split_last() else {
        return Err(ModelError::Invalid("empty prompt".into()).into());
    };
    let prefill = Instant::now();
    let mut run = SpecRun::default();
    let mut verifier = match opts.temperature.filter(|&t| t > 0.0) {
        None => Verifier::Greedy,
        Some(temperature) => Verifier::Sampling {
            temperature,
            rng: Uniform(opts.seed),
        },
    };
    // The drafter's state, kept only when drafting.
    let t = Instant::now();
    let mut drafter = opts
        .draft
        .map(|d| Sequence::new(index, prompt.to_vec()).map(|seq| (seq, d)))
        .transpose()?;
    run.draft_seconds += t.elapsed().as_secs_f64();
    let mut cache = model.new_cache();
    if !head.is_empty() {
        model.forward_last(head, &mut cache)?;
    }
    run.prefill_seconds = prefill.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut pending = last;
    while run.tokens.len() < opts.max_new_tokens {
        if crate::progress::interrupted() {
            return Err(ModelError::Interrupted.into());
        }
        let t = Instant::now();
        let room = (opts.max_new_tokens - run.tokens.len() - 1).min(MAX_VERIFY_ROWS - 1);
        let mut draft = match &mut drafter {
            Some((seq, d)) => seq.draft(index, d).chain(),
            None => Vec::new(),
        };
        draft.truncate(room);
        run.draft_seconds += t.elapsed().as_secs_f64();

        let mut input = Vec::with_capacity(draft.len() + 1);
        input.push(pending);
        input.extend(&draft);
        let before = cache.len();
        let rows: Vec<Vec<f32>> = model.forward(&input, &mut cache)?.to_vec2()?;
        let (accepted, next) = verifier.verify(&rows, &draft);
        cache.truncate(before + 1 + accepted);
        run.steps += 1;
        run.drafted += draft.len();
        run.accepted += accepted;

        let mut new: Vec<u32> = draft[..accepted].to_vec();
        new.push(next);
        let stop_at = new.iter().position(|&t| Some(t) == opts.stop_token);
        if let Some(i) = stop_at {
            new.truncate(i + 1);
        }
        if let Some((seq, _)) = &mut drafter {
            let t = Instant::now();
            seq.append(index, &new)?;
            run.draft_seconds += t.elapsed().as_secs_f64();
        }
        run.tokens.extend(&new);
        pending = next;
        if stop_at.is_some() {
            break;
        }
    }
    run.seconds = started.elapsed().as_secs_f64();
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_verification_keeps_the_agreeing_prefix() {
        let rows = vec![
            vec![0.0, 5.0, 1.0],
            vec![0.0, 1.0, 5.0],
            vec![9.0, 1.0, 0.0],
        ];
        // Draft [1, 0]: the target says 1 (accept), then 2 (reject 0, emit 2).
        assert_eq!(Verifier::Greedy.verify(&rows, &[1, 0]), (1, 2));
        assert_eq!(Verifier::Greedy.verify(&rows, &[1, 2]), (2, 0));
        assert_eq!(Verifier::Greedy.verify(&rows[..1], &[]), (0, 1));
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
        let n = 200_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            let (accepted, next) = v.verify(&rows, &[3]);
            let first = if accepted == 1 { 3 } else { next };
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
