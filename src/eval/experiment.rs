//! The two evaluation jobs: `eval fit` (λ1/λ2 and the gate on validation text) and `eval ppl`
//! (neural vs mixed perplexity on test text), over one model and one reference index.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::documents::{load_documents, TokenBudget};
use super::records::{Collector, DomainRecords};
use super::report::{build_report, PplReport};
use super::{EvalError, Result};
use crate::evidence::EvidenceIndex;
use crate::mix::fit::{fit_gate, fit_split, perplexity, split_lambdas, ScoredToken};
use crate::mix::params::{FitRecord, DEFAULT_DECODE_MAX_MATCH};
use crate::mix::{DomainLambdas, GateOptions, LambdaRule, MixingParams};
use crate::model::{Model, WindowOptions};

/// A domain needs this many validation tokens for λ1/λ2 of its own (else it uses the global pair).
pub const MIN_DOMAIN_TOKENS: usize = 500;

/// A model and a reference index that share a tokenizer, or a byte-level index (which serves any
/// model's tokenizer when scoring, see `evidence::bytes`).
pub struct Pairing<'a> {
    pub model: &'a Model,
    pub index: &'a dyn EvidenceIndex,
}

impl<'a> Pairing<'a> {
    /// A model and an index of either kind; over bytes, a suffix-array index: a model's tokens
    /// follow a byte-level index by reading its suffix arrays.
    pub fn new(model: &'a Model, index: &'a dyn EvidenceIndex) -> Result<Self> {
        match (index.is_byte_level(), index.byte_index()) {
            (true, Some(_)) => Ok(Self { model, index }),
            (true, None) => Err(EvalError::Invalid(format!(
                "{} is a compressed byte-level index: a model's tokens follow a byte-level index \
                 by reading its suffix arrays; use the index it was compressed from",
                index.dir().display()
            ))),
            (false, _) => Self::same_tokenizer(model, index),
        }
    }

    /// A pairing for the decoding jobs that read token answers of the index (generation, workload
    /// replays): refuses a byte-level index.
    pub fn same_tokenizer(model: &'a Model, index: &'a dyn EvidenceIndex) -> Result<Self> {
        if index.is_byte_level() {
            return Err(EvalError::Invalid(format!(
                "the index at {} is byte-level: generation and workload replays need one built with \
                 the model's tokenizer (scoring, eval fit, eval ppl and eval spec take either)",
                index.dir().display()
            )));
        }
        let Some(tokenizer) = index.tokenizer() else {
            return Err(EvalError::Invalid(format!(
                "the index at {} records no tokenizer, so it cannot be paired with a model",
                index.dir().display()
            )));
        };
        model.check_tokenizer(tokenizer.fingerprint(), "the index")?;
        Ok(Self { model, index })
    }

    pub fn fingerprint(&self) -> String {
        self.model.tokenizer().fingerprint().to_string()
    }

    fn records(&self, inputs: &EvalInputs) -> Result<Vec<DomainRecords>> {
        let budget = inputs
            .max_tokens_per_domain
            .map_or(TokenBudget::All, TokenBudget::PerDomain);
        let mut docs = load_documents(&inputs.inputs, self.model, budget, inputs.max_doc_tokens)?;
        // Dropped after loading, so the others keep their positions in the input (and their saved
        // records stay reusable).
        docs.retain(|d| !inputs.exclude_domains.contains(&d.domain));
        if docs.is_empty() {
            return Err(EvalError::Invalid(
                "no documents with at least two tokens in the input".into(),
            ));
        }
        Collector {
            model: self.model,
            index: self.index,
            window: inputs.window,
            work_dir: inputs.work_dir.clone(),
        }
        .collect(&docs)
    }
}

/// What an evaluation run reads.
pub struct EvalInputs {
    pub inputs: Vec<PathBuf>,
    pub max_tokens_per_domain: Option<usize>,
    pub max_doc_tokens: Option<usize>,
    /// Domains left out (a leave-one-domain-out fit).
    pub exclude_domains: Vec<String>,
    pub window: WindowOptions,
    /// Finished domains are saved here and reused by a rerun.
    pub work_dir: Option<PathBuf>,
}

/// Fits λ1/λ2 (EM) and, unless `gate` is none, the random-forest gate, on validation text.
pub fn fit(
    pairing: &Pairing,
    inputs: &EvalInputs,
    gate: Option<GateOptions>,
) -> Result<MixingParams> {
    let domains = pairing.records(inputs)?;
    let evidence: Vec<ScoredToken> = domains
        .iter()
        .flat_map(|d| d.tokens.iter().map(|t| t.evidence()))
        .collect();
    let split = fit_split(&evidence);
    let mut by_domain = BTreeMap::new();
    for d in domains
        .iter()
        .filter(|d| d.tokens.len() >= MIN_DOMAIN_TOKENS)
    {
        let ev: Vec<ScoredToken> = d.tokens.iter().map(|t| t.evidence()).collect();
        let (lambda_sparse, lambda_dense) = fit_split(&ev);
        by_domain.insert(
            d.domain.clone(),
            DomainLambdas {
                lambda_sparse,
                lambda_dense,
                tokens: ev.len(),
            },
        );
    }
    tracing::info!(
        "λ1 (sparse) = {:.4}, λ2 = {:.4} over {} tokens",
        split.0,
        split.1,
        evidence.len()
    );
    let gate = gate
        .map(|opts| fit_gate(&evidence, split, opts))
        .transpose()
        .map_err(EvalError::FitGate)?;
    let features: Vec<_> = evidence.iter().map(|e| e.features).collect();
    let gate_perplexity = gate
        .as_ref()
        .map(|g| perplexity(&evidence, &g.predict(&features)));
    let record = FitRecord {
        input: inputs
            .inputs
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        tokens: evidence.len(),
        neural_perplexity: perplexity(&evidence, &vec![0.0; evidence.len()]),
        split_perplexity: perplexity(&evidence, &split_lambdas(&evidence, split)),
        gate_perplexity,
    };
    let mut params = MixingParams::new(
        pairing.model.source().display().to_string(),
        pairing.index.dir().display().to_string(),
        pairing.fingerprint(),
        split,
        gate,
        record,
    );
    params.by_domain = by_domain;
    params.byte_level = pairing.index.is_byte_level();
    params.default_rule = LambdaRule::Adaptive;
    params.decode_max_match = Some(DEFAULT_DECODE_MAX_MATCH);
    Ok(params)
}

/// Neural vs mixed perplexity of test text, with the fitted mixing.
pub fn ppl(
    pairing: &Pairing,
    inputs: &EvalInputs,
    params: &MixingParams,
) -> Result<(PplReport, Vec<DomainRecords>)> {
    params.check_pairing(&pairing.fingerprint(), pairing.index.is_byte_level())?;
    let domains = pairing.records(inputs)?;
    let report = build_report(
        pairing.model.source().display().to_string(),
        pairing.index.dir().display().to_string(),
        (inputs.window.window, inputs.window.stride),
        &domains,
        params,
        pairing.model.tokenizer(),
    )?;
    Ok((report, domains))
}

/// What `eval fit` reports of the mixing file it wrote to `out`.
#[derive(Debug, Clone, Serialize)]
pub struct FitSummary {
    pub out: PathBuf,
    pub lambda_sparse: f64,
    pub lambda_dense: f64,
    pub by_domain: BTreeMap<String, DomainLambdas>,
    pub validation: FitRecord,
    /// (feature, normalised importance) of the gate; empty without one.
    pub gate_feature_importances: Vec<(String, f64)>,
}

impl FitSummary {
    pub fn new(out: &Path, params: &MixingParams) -> Result<Self> {
        let gate_feature_importances = match &params.gate {
            Some(g) => g
                .feature_names
                .iter()
                .cloned()
                .zip(g.importances()?)
                .collect(),
            None => Vec::new(),
        };
        Ok(Self {
            out: out.to_path_buf(),
            lambda_sparse: params.lambda_sparse,
            lambda_dense: params.lambda_dense,
            by_domain: params.by_domain.clone(),
            validation: params.fitted_on.clone(),
            gate_feature_importances,
        })
    }
}
