//! Text generation with the cache: the prompt in one pass, then one token per step (greedy by
//! default, or sampled with a temperature, top-p and a seed).

use std::time::Instant;

use candle_transformers::generation::LogitsProcessor;

use super::{ModelError, Transformer};

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// `None` or 0: greedy.
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: u64,
    /// Stop after this token (it is included in the output).
    pub stop_token: Option<u32>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    pub prompt_ms: f64,
    /// Mean milliseconds per generated token after the first.
    pub decode_ms_per_token: f64,
}

impl Transformer {
    /// Continues `prompt` (token ids, BOS included when the model wants one).
    pub fn generate(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
    ) -> Result<Generation, ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::Invalid("empty prompt".into()));
        }
        if opts.max_new_tokens == 0 {
            return Ok(Generation {
                tokens: Vec::new(),
                prompt_tokens: prompt.len(),
                prompt_ms: 0.0,
                decode_ms_per_token: 0.0,
            });
        }
        let temperature = opts.temperature.filter(|&t| t > 0.0);
        let mut sampler = LogitsProcessor::new(opts.seed, temperature, opts.top_p);
        let mut cache = self.new_cache();
        let started = Instant::now();
        let mut next = sampler.sample(&self.forward_last(prompt, &mut cache)?)?;
        let prompt_ms = started.elapsed().as_secs_f64() * 1e3;
        let decode_started = Instant::now();
        let mut tokens = vec![next];
        while tokens.len() < opts.max_new_tokens && Some(next) != opts.stop_token {
            if crate::interrupt::interrupted() {
                return Err(ModelError::Interrupted);
            }
            next = sampler.sample(&self.forward_last(&[next], &mut cache)?)?;
            tokens.push(next);
        }
        let steps = tokens.len().saturating_sub(1).max(1);
        Ok(Generation {
            tokens,
            prompt_tokens: prompt.len(),
            prompt_ms,
            decode_ms_per_token: decode_started.elapsed().as_secs_f64() * 1e3 / steps as f64,
        })
    }
}
