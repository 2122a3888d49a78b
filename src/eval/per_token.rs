//! The per-token output of `eval ppl`: one JSON line per scored token, with what the model and the
//! ∞-gram said and λ and the mixed log-prob under each rule of the mixing file.

use std::io::Write;

use serde::Serialize;

use super::records::DomainRecords;
use super::report::RuleMixtures;
use super::{EvalError, Result};
use crate::mix::MixingParams;

/// One scored token.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerTokenLine<'a> {
    pub domain: &'a str,
    pub doc: usize,
    pub position: usize,
    pub token: u32,
    /// The model's f32 log-prob, widened.
    pub neural_logprob: f64,
    pub infgram_prob: f64,
    pub suffix_len: usize,
    pub prompt_cnt: u64,
    pub sparse: bool,
    pub lambda_split: f64,
    pub mixed_logprob_split: f64,
    pub lambda_domain_split: f64,
    pub mixed_logprob_domain_split: f64,
    /// None without a gate.
    pub lambda_gate: Option<f64>,
    pub mixed_logprob_gate: Option<f64>,
    pub lambda_adaptive: f64,
    pub mixed_logprob_adaptive: f64,
}

/// The lines of one domain's tokens, in record order.
pub fn per_token_lines<'a>(
    domain: &'a DomainRecords,
    params: &MixingParams,
) -> Result<Vec<PerTokenLine<'a>>> {
    let mixed = RuleMixtures::of(domain, params)?;
    Ok(domain
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let gate = mixed.gate.as_ref().map(|g| g[i]);
            PerTokenLine {
                domain: &domain.domain,
                doc: t.doc,
                position: t.position,
                token: t.token,
                neural_logprob: t.neural_logprob as f64,
                infgram_prob: t.infgram_prob,
                suffix_len: t.suffix_len,
                prompt_cnt: t.prompt_cnt,
                sparse: t.sparse,
                lambda_split: mixed.split[i].lambda,
                mixed_logprob_split: mixed.split[i].logprob,
                lambda_domain_split: mixed.domain_split[i].lambda,
                mixed_logprob_domain_split: mixed.domain_split[i].logprob,
                lambda_gate: gate.map(|g| g.lambda),
                mixed_logprob_gate: gate.map(|g| g.logprob),
                lambda_adaptive: mixed.adaptive[i].lambda,
                mixed_logprob_adaptive: mixed.adaptive[i].logprob,
            }
        })
        .collect())
}

/// Writes the lines of every domain as JSON lines, a domain at a time.
pub fn write_per_token(
    out: &mut impl Write,
    domains: &[DomainRecords],
    params: &MixingParams,
) -> Result<()> {
    let failed = || EvalError::io("writing the per-token output".into());
    for d in domains {
        let lines = per_token_lines(d, params)?;
        write_lines(out, &lines).map_err(failed())?;
    }
    out.flush().map_err(failed())
}

fn write_lines(out: &mut impl Write, lines: &[PerTokenLine]) -> std::io::Result<()> {
    for line in lines {
        serde_json::to_writer(&mut *out, line)?;
        writeln!(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::TokenRecord;
    use crate::mix::params::FitRecord;
    use crate::mix::{DomainLambdas, NUM_FEATURES};

    fn token(position: usize, infgram_prob: f64, sparse: bool) -> TokenRecord {
        TokenRecord {
            doc: 4,
            position,
            token: 10 + position as u32,
            neural_logprob: -1.5,
            infgram_prob,
            suffix_len: 3,
            prompt_cnt: 9,
            sparse,
            features: [0.0; NUM_FEATURES],
        }
    }

    /// λ by rule and ln(λ·P∞ + (1 − λ)·P_neural) by hand, under the keys the output has always had.
    #[test]
    fn lines_by_hand() {
        let mut params = MixingParams::new(
            String::new(),
            String::new(),
            String::new(),
            (0.4, 0.05),
            None,
            FitRecord::default(),
        );
        params.by_domain.insert(
            "code".into(),
            DomainLambdas {
                lambda_sparse: 0.7,
                lambda_dense: 0.2,
                tokens: 600,
            },
        );
        let domain = DomainRecords {
            domain: "code".into(),
            key: String::new(),
            documents: 1,
            tokens: vec![token(1, 0.5, true), token(2, 0.0, false)],
            neural_seconds: 0.0,
            infgram_seconds: 0.0,
        };
        let lines = per_token_lines(&domain, &params).unwrap();
        let p_nn = (-1.5f32 as f64).exp();
        let mixed = |l: f64, p_inf: f64| (l * p_inf + (1.0 - l) * p_nn).ln();
        let want = [(0.4, 0.7, 0.5), (0.05, 0.2, 0.0)];
        for (line, (split, domain_split, p_inf)) in lines.iter().zip(want) {
            assert_eq!(
                (line.lambda_split, line.lambda_domain_split),
                (split, domain_split)
            );
            assert!((line.mixed_logprob_split - mixed(split, p_inf)).abs() < 1e-15);
            assert!((line.mixed_logprob_domain_split - mixed(domain_split, p_inf)).abs() < 1e-15);
            assert_eq!((line.lambda_gate, line.mixed_logprob_gate), (None, None));
        }

        let mut out = Vec::new();
        write_per_token(&mut out, std::slice::from_ref(&domain), &params).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 2);
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        let mut keys: Vec<&str> = first
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "doc",
                "domain",
                "infgram_prob",
                "lambda_adaptive",
                "lambda_domain_split",
                "lambda_gate",
                "lambda_split",
                "mixed_logprob_adaptive",
                "mixed_logprob_domain_split",
                "mixed_logprob_gate",
                "mixed_logprob_split",
                "neural_logprob",
                "position",
                "prompt_cnt",
                "sparse",
                "suffix_len",
                "token",
            ]
        );
        assert_eq!(first["lambda_gate"], serde_json::Value::Null);
        assert_eq!(first["neural_logprob"], -1.5);
    }
}
