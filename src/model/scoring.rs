//! Scoring with the model: next-token distributions, per-token log-probs of a sequence (one or a
//! batch), and sliding-window scoring of long documents with the paper's protocol.

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use super::{ModelError, Transformer};
use crate::softmax::{log_softmax, row_max};

/// Logits are turned into log-probs this many positions at a time, so a 1024-token window of a
/// 262k-vocabulary model never materialises a gigabyte of logits.
const LOGIT_ROWS_PER_CHUNK: usize = 128;

/// What the model says about one scored token.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PositionScore {
    /// ln P(token | context).
    pub logprob: f32,
    /// Entropy (nats) of the predicted distribution.
    pub entropy: f32,
    /// Probability of the most likely token.
    pub top_prob: f32,
}

/// One position's row of logits with its log-normaliser, as [`Transformer::score_document_with`]
/// hands it to a caller that reads more of the distribution than the scored token's.
pub struct LogitRow<'a> {
    logits: &'a [f32],
    log_norm: f64,
}

impl LogitRow<'_> {
    /// P(token); 0 past the row.
    pub fn prob(&self, token: u32) -> f64 {
        self.logits
            .get(token as usize)
            .map_or(0.0, |&l| (l as f64 - self.log_norm).exp())
    }

    /// The `k` most likely tokens with their probabilities, most likely first.
    pub fn top(&self, k: usize) -> Vec<(u32, f64)> {
        top_k_of(self.logits, k)
            .into_iter()
            .map(|(id, l)| (id, (l as f64 - self.log_norm).exp()))
            .collect()
    }
}

/// The model's distribution after a context: the `top_k` most likely tokens and, on request, every
/// token's log-prob.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NextTokenDistribution {
    pub top: Vec<(u32, f32)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<f32>>,
}

/// The sliding-window protocol: windows of at most `window` tokens advancing by `stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowOptions {
    pub window: usize,
    pub stride: usize,
}

impl Default for WindowOptions {
    /// The paper's Pile protocol (and HF's perplexity guide): 1024-token windows, stride 512.
    fn default() -> Self {
        Self {
            window: 1024,
            stride: 512,
        }
    }
}

/// One forward pass of the protocol: tokens `start..end` are fed, and the predictions of tokens
/// `score_from..end` are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: usize,
    pub end: usize,
    pub score_from: usize,
}

/// Plans the windows over `n` tokens. Token 0 is context only (a BOS, or the first text token when
/// the model has none); every later token is scored exactly once: the first window scores all its
/// tokens, each later one only the tokens it adds, with at least `window - stride` tokens of context.
pub fn plan_windows(n: usize, opts: WindowOptions) -> Result<Vec<Window>, ModelError> {
    if opts.window < 2 || opts.stride == 0 || opts.stride > opts.window - 1 {
        return Err(ModelError::Invalid(format!(
            "window {} and stride {} must satisfy 1 <= stride < window",
            opts.window, opts.stride
        )));
    }
    let mut windows = Vec::new();
    let mut scored_until = 1;
    let mut start = 0;
    while scored_until < n {
        let end = (start + opts.window).min(n);
        windows.push(Window {
            start,
            end,
            score_from: scored_until,
        });
        scored_until = end;
        start += opts.stride;
    }
    Ok(windows)
}

/// Scores of a document's tokens `1..n` (token 0 is context).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DocumentScore {
    pub positions: Vec<PositionScore>,
}

impl DocumentScore {
    /// Sum of −ln P over the scored tokens.
    pub fn nll(&self) -> f64 {
        self.positions.iter().map(|p| -(p.logprob as f64)).sum()
    }

    pub fn perplexity(&self) -> f64 {
        (self.nll() / self.positions.len().max(1) as f64).exp()
    }
}

impl Transformer {
    /// The model's next-token distribution after `context`.
    pub fn next_token_distribution(
        &self,
        context: &[u32],
        top_k: usize,
        full: bool,
    ) -> Result<NextTokenDistribution, ModelError> {
        if context.is_empty() {
            return Err(ModelError::Invalid("empty context".into()));
        }
        let last = self.forward_last(context, &mut self.new_cache())?;
        let logprobs = log_softmax(&last.to_device(&Device::Cpu)?.to_vec1::<f32>()?);
        Ok(NextTokenDistribution {
            top: top_k_of(&logprobs, top_k),
            logprobs: full.then_some(logprobs),
        })
    }

    /// Scores tokens `1..n` of `tokens` in one pass (the context must fit the model).
    pub fn score_tokens(&self, tokens: &[u32]) -> Result<Vec<PositionScore>, ModelError> {
        let mut out = self.score_batch(&[tokens])?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Scores tokens `1..n` of several sequences in one batched pass. Shorter sequences are padded
    /// at the end, which the causal mask keeps from affecting any real position.
    pub fn score_batch(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<PositionScore>>, ModelError> {
        let longest = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        if longest < 2 {
            return Ok(vec![Vec::new(); seqs.len()]);
        }
        let mut ids = Vec::with_capacity(seqs.len() * longest);
        for s in seqs {
            self.check_tokens(s)?;
            ids.extend_from_slice(s);
            ids.extend(std::iter::repeat_n(0, longest - s.len()));
        }
        let ids = Tensor::from_vec(ids, (seqs.len(), longest), self.device())?;
        let mut cache = self.new_cache();
        let hidden = self.forward_hidden(&ids, &mut cache)?;
        seqs.iter()
            .enumerate()
            .map(|(b, s)| {
                let rows = hidden.get(b)?.narrow(0, 0, s.len().saturating_sub(1))?;
                let scored = self.position_scores(&rows, &s[1..], 1, &|_, _| ())?;
                Ok(scored.into_iter().map(|(score, ())| score).collect())
            })
            .collect()
    }

    /// Scores tokens `1..n` of a document of any length with the sliding-window protocol.
    /// `on_window` is told the number of tokens scored after each window (progress bars).
    pub fn score_document(
        &self,
        tokens: &[u32],
        opts: WindowOptions,
        on_window: impl FnMut(usize),
    ) -> Result<DocumentScore, ModelError> {
        Ok(self
            .score_document_with(tokens, opts, on_window, |_, _| ())?
            .0)
    }

    /// [`Self::score_document`], handing each position's whole distribution to `per_row(position,
    /// row)` (rows of a chunk in parallel) and keeping what it gives, in position order.
    pub fn score_document_with<R: Send>(
        &self,
        tokens: &[u32],
        opts: WindowOptions,
        mut on_window: impl FnMut(usize),
        per_row: impl Fn(usize, &LogitRow) -> R + Sync,
    ) -> Result<(DocumentScore, Vec<R>), ModelError> {
        self.check_tokens(tokens)?;
        if opts.window > self.max_context() {
            return Err(ModelError::Invalid(format!(
                "window {} exceeds the model's context of {}",
                opts.window,
                self.max_context()
            )));
        }
        let mut positions = Vec::with_capacity(tokens.len().saturating_sub(1));
        let mut kept = Vec::with_capacity(tokens.len().saturating_sub(1));
        // Windows are independent passes; one cache, emptied each time, keeps its allocation.
        let mut cache = self.new_cache();
        for w in plan_windows(tokens.len(), opts)? {
            if crate::interrupt::interrupted() {
                return Err(ModelError::Interrupted);
            }
            cache.truncate(0);
            let ids = Tensor::new(&tokens[w.start..w.end], self.device())?.unsqueeze(0)?;
            let hidden = self.forward_hidden(&ids, &mut cache)?.squeeze(0)?;
            // Row r predicts token start + r + 1.
            let first_row = w.score_from - 1 - w.start;
            let rows = hidden.narrow(0, first_row, w.end - w.score_from)?;
            let scored =
                self.position_scores(&rows, &tokens[w.score_from..w.end], w.score_from, &per_row)?;
            on_window(scored.len());
            for (score, row) in scored {
                positions.push(score);
                kept.push(row);
            }
        }
        Ok((DocumentScore { positions }, kept))
    }

    /// Turns hidden states `(rows, hidden)` into the scores of `targets` (one per row, the first at
    /// position `first`), a chunk of rows at a time, each with what `per_row` makes of its row.
    fn position_scores<R: Send>(
        &self,
        hidden: &Tensor,
        targets: &[u32],
        first: usize,
        per_row: &(impl Fn(usize, &LogitRow) -> R + Sync),
    ) -> Result<Vec<(PositionScore, R)>, ModelError> {
        let mut out = Vec::with_capacity(targets.len());
        for (c, chunk_targets) in targets.chunks(LOGIT_ROWS_PER_CHUNK).enumerate() {
            let rows = hidden.narrow(0, c * LOGIT_ROWS_PER_CHUNK, chunk_targets.len())?;
            let logits = self
                .logits(&rows)?
                .to_device(&Device::Cpu)?
                .to_vec2::<f32>()?;
            let chunk_first = first + c * LOGIT_ROWS_PER_CHUNK;
            let scored: Vec<(PositionScore, R)> = logits
                .par_iter()
                .zip(chunk_targets.par_iter())
                .enumerate()
                .map(|(r, (logits, &target))| {
                    let (score, log_norm) = score_row(logits, target);
                    (
                        score,
                        per_row(chunk_first + r, &LogitRow { logits, log_norm }),
                    )
                })
                .collect();
            out.extend(scored);
        }
        Ok(out)
    }
}

/// The score of `target` under the softmax of `logits`, with the distribution's entropy and top
/// probability, in one pass of f64 sums; and the row's log-normaliser (a logit less it is a
/// log-prob).
fn score_row(logits: &[f32], target: u32) -> (PositionScore, f64) {
    let max = row_max(logits);
    let (mut z, mut weighted) = (0f64, 0f64);
    for &l in logits {
        let d = l as f64 - max;
        let e = d.exp();
        z += e;
        weighted += e * d;
    }
    let log_z = z.ln();
    let target_logit = logits
        .get(target as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY) as f64;
    let score = PositionScore {
        logprob: (target_logit - max - log_z) as f32,
        entropy: (log_z - weighted / z) as f32,
        top_prob: (1.0 / z) as f32,
    };
    (score, max + log_z)
}

/// The `k` highest-scoring (id, value) pairs, best first.
pub(crate) fn top_k_of(values: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut ids: Vec<u32> = (0..values.len() as u32).collect();
    let k = k.min(ids.len());
    if k == 0 {
        return Vec::new();
    }
    let by_value = |a: &u32, b: &u32| values[*b as usize].total_cmp(&values[*a as usize]);
    ids.select_nth_unstable_by(k - 1, by_value);
    ids.truncate(k);
    ids.sort_by(by_value);
    ids.into_iter().map(|i| (i, values[i as usize])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_score_every_token_once_with_enough_context() {
        for n in [0, 1, 2, 5, 1023, 1024, 1025, 1536, 1537, 4000] {
            for opts in [
                WindowOptions::default(),
                WindowOptions {
                    window: 7,
                    stride: 3,
                },
                WindowOptions {
                    window: 2,
                    stride: 1,
                },
            ] {
                let windows = plan_windows(n, opts).unwrap();
                let mut seen = vec![0u32; n];
                for w in &windows {
                    assert!(w.end - w.start <= opts.window && w.start < w.score_from);
                    for (i, s) in seen.iter_mut().enumerate().take(w.end).skip(w.score_from) {
                        *s += 1;
                        let context = i - w.start;
                        assert!(context >= (opts.window - opts.stride).min(i));
                    }
                }
                assert!(seen.iter().skip(1).all(|&c| c == 1), "n={n} {opts:?}");
                assert!(n < 2 || windows[0].start == 0 && windows[0].score_from == 1);
            }
        }
        let w = plan_windows(2048, WindowOptions::default()).unwrap();
        let spans: Vec<_> = w.iter().map(|w| (w.start, w.end, w.score_from)).collect();
        assert_eq!(spans, [(0, 1024, 1), (512, 1536, 1024), (1024, 2048, 1536)]);
        assert!(plan_windows(
            10,
            WindowOptions {
                window: 4,
                stride: 4
            }
        )
        .is_err());
    }

    #[test]
    fn score_row_matches_a_direct_softmax() {
        let logits = [1.0f32, 3.0, -2.0, 0.5];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let p: Vec<f64> = logits.iter().map(|&l| (l as f64).exp() / z).collect();
        let (s, log_norm) = score_row(&logits, 2);
        assert!((s.logprob as f64 - p[2].ln()).abs() < 1e-6);
        let row = LogitRow {
            logits: &logits,
            log_norm,
        };
        assert!((row.prob(1) - p[1]).abs() < 1e-12);
        assert_eq!(row.top(2)[0].0, 1);
        assert!((row.top(2)[1].1 - p[0]).abs() < 1e-12);
        assert_eq!(row.prob(9), 0.0);
        let entropy: f64 = -p.iter().map(|p| p * p.ln()).sum::<f64>();
        assert!((s.entropy as f64 - entropy).abs() < 1e-6);
        assert!((s.top_prob as f64 - p[1]).abs() < 1e-6);
        let lp = log_softmax(&logits);
        assert!((lp[0] as f64 - p[0].ln()).abs() < 1e-6);
        assert_eq!(top_k_of(&logits, 2), vec![(1, 3.0), (0, 1.0)]);
    }
}
