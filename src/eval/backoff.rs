//! The ∞-gram alone as a language model (selective back-off, [`crate::index::backoff`]): perplexity
//! and bits per byte of documents for several k, and how fast it generates (`eval backoff`).

use std::collections::BTreeMap;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use super::documents::EvalDocument;
use super::{EvalError, Result};
use crate::index::backoff::{Backoff, Draw, Weighting};
use crate::index::corpus::Corpus;
use crate::tokenizer::Tokenizer;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BackoffEvalOptions {
    /// Each k to score with (`None`: every level).
    pub levels: Vec<Option<usize>>,
    /// Decay, weighting and floor (its `levels` is replaced by each of the above).
    pub backoff: Backoff,
    /// Tokens to generate for the speed figure (0: none), after `prompt`, with `generate_levels`.
    pub generate: usize,
    pub generate_levels: Option<usize>,
    pub prompt: Vec<u32>,
    pub temperature: f64,
    pub seed: u64,
}

/// One k over one domain ("all" for every document).
#[derive(Debug, Clone, Serialize)]
pub struct BackoffRow {
    pub levels: String,
    pub domain: String,
    pub tokens: usize,
    /// UTF-8 bytes of the scored tokens.
    pub bytes: usize,
    pub nll_bits: f64,
    /// Per token (per byte on a byte-level index).
    pub perplexity: f64,
    pub bits_per_byte: f64,
    pub seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct GenerationSpeed {
    pub levels: String,
    pub tokens: usize,
    pub bytes: usize,
    pub seconds: f64,
    pub bytes_per_second: f64,
    pub text: String,
    /// Median suffix length and match count of each level over the generated tokens (the post's
    /// n − 1 and m).
    pub median_suffix_len: Vec<usize>,
    pub median_matches: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BackoffReport {
    pub byte_level: bool,
    pub decay: f64,
    pub weighting: &'static str,
    pub floor: f64,
    pub rows: Vec<BackoffRow>,
    pub generation: Option<GenerationSpeed>,
}

/// "all" for every level, else k.
pub fn levels_name(levels: Option<usize>) -> String {
    levels.map_or_else(|| "all".to_owned(), |k| k.to_string())
}

/// Scores every document under each k (documents in parallel), then generates once.
pub fn evaluate(
    index: &dyn Corpus,
    tokenizer: &Tokenizer,
    docs: &[EvalDocument],
    opts: &BackoffEvalOptions,
) -> Result<BackoffReport> {
    if docs.is_empty() || opts.levels.is_empty() {
        return Err(EvalError::Invalid(
            "nothing to score: no documents or no k".into(),
        ));
    }
    let mut rows = Vec::new();
    for &levels in &opts.levels {
        let spec = Backoff {
            levels,
            ..opts.backoff
        };
        let start = Instant::now();
        let scored: Vec<(String, usize, usize, f64)> = docs
            .par_iter()
            .map(|doc| {
                let probs = index.backoff_score(&doc.tokens, &spec)?;
                let bits: f64 = probs.iter().map(|p| -p.log2()).sum();
                let bytes = tokenizer.text_bytes(&doc.tokens);
                Ok((doc.domain.clone(), doc.tokens.len(), bytes, bits))
            })
            .collect::<Result<_>>()?;
        let seconds = start.elapsed().as_secs_f64();
        let mut by_domain: BTreeMap<String, (usize, usize, f64)> = BTreeMap::new();
        for (domain, tokens, bytes, bits) in scored {
            for key in [domain, "all".to_owned()] {
                let e = by_domain.entry(key).or_default();
                (e.0, e.1, e.2) = (e.0 + tokens, e.1 + bytes, e.2 + bits);
            }
        }
        for (domain, (tokens, bytes, bits)) in by_domain {
            rows.push(BackoffRow {
                levels: levels_name(levels),
                perplexity: (bits / tokens as f64).exp2(),
                bits_per_byte: bits / bytes.max(1) as f64,
                domain,
                tokens,
                bytes,
                nll_bits: bits,
                seconds,
            });
        }
    }
    let generation = (opts.generate > 0)
        .then(|| generation_speed(index, tokenizer, opts))
        .transpose()?;
    Ok(BackoffReport {
        byte_level: index.is_byte_level(),
        decay: opts.backoff.decay,
        weighting: match opts.backoff.weighting {
            Weighting::Counts => "counts",
            Weighting::Distributions => "distributions",
        },
        floor: opts.backoff.floor,
        rows,
        generation,
    })
}

fn generation_speed(
    index: &dyn Corpus,
    tokenizer: &Tokenizer,
    opts: &BackoffEvalOptions,
) -> Result<GenerationSpeed> {
    let levels = opts.generate_levels;
    let spec = Backoff {
        levels,
        ..opts.backoff
    };
    let start = Instant::now();
    let draw = Draw {
        max_new: opts.generate,
        temperature: opts.temperature,
        seed: opts.seed,
    };
    let made = index.backoff_generate(&opts.prompt, &spec, draw)?;
    let seconds = start.elapsed().as_secs_f64();
    let bytes = tokenizer.text_bytes(&made.tokens);
    Ok(GenerationSpeed {
        levels: levels_name(levels),
        tokens: made.tokens.len(),
        bytes,
        seconds,
        bytes_per_second: bytes as f64 / seconds.max(1e-9),
        text: tokenizer
            .decode(&made.tokens)
            .map_err(|e| EvalError::Invalid(e.to_string()))?,
        median_suffix_len: median_per_level(&made.levels, |x| x.0),
        median_matches: median_per_level(&made.levels, |x| x.1),
    })
}

/// The median of `get` over the steps, for each level (steps with fewer levels left out).
fn median_per_level<T: Ord + Copy + Default>(
    steps: &[Vec<(usize, u64)>],
    get: impl Fn(&(usize, u64)) -> T,
) -> Vec<T> {
    let levels = steps.iter().map(Vec::len).max().unwrap_or(0);
    (0..levels)
        .map(|l| {
            let mut v: Vec<T> = steps.iter().filter_map(|x| x.get(l)).map(&get).collect();
            v.sort_unstable();
            v.get(v.len() / 2).copied().unwrap_or_default()
        })
        .collect()
}
