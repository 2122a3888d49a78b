//! The mixing file that `eval fit` writes and the evaluator and the service load: λ1/λ2, the gate,
//! and what they were fitted on (model, index, tokenizer), so a mismatched pairing is refused.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::adaptive::AdaptiveOptions;
use super::features::feature_names;
use super::gate::Gate;
use super::MixError;

const FORMAT: &str = "infini-sidecar-mixing";
const VERSION: u32 = 1;

/// How λ is chosen for a token (applied by `evidence::lambdas`, above this layer).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LambdaRule {
    /// One λ for every token, kept inside [`super::LAMBDA_MIN`], [`super::LAMBDA_MAX`].
    Fixed(f64),
    /// λ1 for sparse ∞-gram estimates, λ2 otherwise.
    Split,
    /// λ1/λ2 of the token's domain when they were fitted, else the global pair.
    DomainSplit,
    Gate,
    /// The gate's λ (λ1/λ2 without a gate), moved per sequence by what the sequence's own tokens
    /// say of the ∞-gram ([`super::adaptive`]): it needs the tokens in order.
    Adaptive,
}

impl LambdaRule {
    /// The name reports and the per-token output use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fixed(_) => "fixed",
            Self::Split => "split",
            Self::DomainSplit => "domain_split",
            Self::Gate => "gate",
            Self::Adaptive => "adaptive",
        }
    }

    /// The per-token rule behind this one: under the adaptive λ the mixing file's
    /// [`MixingParams::adaptive_base`] (which the adaptive λ moves), else the rule itself.
    pub fn per_token(self, params: Option<&MixingParams>) -> Self {
        match (self, params) {
            (Self::Adaptive, Some(p)) => p.adaptive_base(),
            (rule, _) => rule,
        }
    }

    /// The rule a caller gets: the one it asked for (a fixed λ must lie in [0, 1]), else the
    /// mixing file's default for a caller that follows a sequence (a session, a scored document, a
    /// `Mix` with a sequence id), else λ1/λ2. Every rule but a fixed λ needs the mixing file.
    /// Decided here only, for every entry point.
    pub fn resolve(
        asked: Option<Self>,
        params: Option<&MixingParams>,
        follows_sequence: bool,
    ) -> Result<Self, MixError> {
        match (asked, params) {
            (Some(Self::Fixed(l)), _) if !(0.0..=1.0).contains(&l) => {
                Err(MixError::Invalid(format!("λ {l} is outside [0, 1]")))
            }
            (Some(rule @ Self::Fixed(_)), _) => Ok(rule),
            (_, None) => Err(MixError::Unconfigured(
                "no mixing file is configured: pass fixed_lambda".into(),
            )),
            (Some(rule), Some(_)) => Ok(rule),
            (None, Some(p)) if follows_sequence => Ok(p.default_rule),
            (None, Some(_)) => Ok(Self::DomainSplit),
        }
    }
}

fn domain_split_rule() -> LambdaRule {
    LambdaRule::DomainSplit
}

/// λ1/λ2 fitted on one domain's validation tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DomainLambdas {
    pub lambda_sparse: f64,
    pub lambda_dense: f64,
    pub tokens: usize,
}

/// Validation figures recorded at fitting time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FitRecord {
    pub input: Vec<String>,
    pub tokens: usize,
    pub neural_perplexity: f64,
    pub split_perplexity: f64,
    pub gate_perplexity: Option<f64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct MixingParams {
    pub format: String,
    pub version: u32,
    pub model: String,
    pub index: String,
    pub tokenizer_fingerprint: String,
    /// Fitted against a byte-level index (`evidence::bytes`): its λ and gate read byte evidence, so
    /// they fit no token index, nor a token index's file a byte index.
    #[serde(default)]
    pub byte_level: bool,
    /// λ1: for sparse ∞-gram estimates.
    pub lambda_sparse: f64,
    /// λ2: for the rest.
    pub lambda_dense: f64,
    /// λ1/λ2 per domain (`meta.pile_set_name`), for domains with enough validation tokens: the
    /// ∞-gram's reliability differs by domain far more than one global pair can express.
    #[serde(default)]
    pub by_domain: BTreeMap<String, DomainLambdas>,
    pub gate: Option<Gate>,
    pub fitted_on: FitRecord,
    /// The hypotheses of [`LambdaRule::Adaptive`].
    #[serde(default)]
    pub adaptive: AdaptiveOptions,
    /// The rule used where a caller names none (files from before it: the domain's λ1/λ2).
    #[serde(default = "domain_split_rule")]
    pub default_rule: LambdaRule,
    /// Decoding only (sessions, `Mix`, `eval generate`): the ∞-gram gets no weight once the context's
    /// longest match in the reference data reaches this many tokens, so it never extends a verbatim
    /// copy (the founding blog post's "regurgitating"). Scoring is never guarded. None: off.
    #[serde(default)]
    pub decode_max_match: Option<usize>,
}

/// The guard of decoding that [`eval fit`](crate::eval::experiment::fit) writes: spans of 16 tokens
/// copied from the reference data are what `eval generate` counts, and the ∞-gram stops pushing
/// half-way there.
pub const DEFAULT_DECODE_MAX_MATCH: usize = 8;

impl MixingParams {
    pub fn new(
        model: String,
        index: String,
        tokenizer_fingerprint: String,
        split: (f64, f64),
        gate: Option<Gate>,
        fitted_on: FitRecord,
    ) -> Self {
        Self {
            format: FORMAT.into(),
            version: VERSION,
            model,
            index,
            tokenizer_fingerprint,
            byte_level: false,
            lambda_sparse: split.0,
            lambda_dense: split.1,
            by_domain: BTreeMap::new(),
            gate,
            fitted_on,
            adaptive: AdaptiveOptions::default(),
            default_rule: LambdaRule::DomainSplit,
            decode_max_match: None,
        }
    }

    /// The per-token rule the adaptive λ moves: the gate when there is one, else the domain's λ1/λ2.
    pub fn adaptive_base(&self) -> LambdaRule {
        match self.gate {
            Some(_) => LambdaRule::Gate,
            None => LambdaRule::DomainSplit,
        }
    }

    pub fn save(&self, path: &Path) -> Result<(), MixError> {
        let json = serde_json::to_string(self).map_err(|e| MixError::Format(e.to_string()))?;
        std::fs::write(path, json).map_err(|e| MixError::Io(format!("{}: {e}", path.display())))
    }

    /// Reads a mixing file, checking its format and that its λ are usable.
    pub fn load(path: &Path) -> Result<Self, MixError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| MixError::Io(format!("{}: {e}", path.display())))?;
        let params: Self = serde_json::from_str(&text)
            .map_err(|e| MixError::Format(format!("{}: {e}", path.display())))?;
        if params.format != FORMAT || params.version != VERSION {
            return Err(MixError::Format(format!(
                "{}: format {:?} version {}, expected {FORMAT:?} version {VERSION}",
                path.display(),
                params.format,
                params.version
            )));
        }
        let domain_lambdas = params
            .by_domain
            .values()
            .flat_map(|d| [d.lambda_sparse, d.lambda_dense]);
        for l in [params.lambda_sparse, params.lambda_dense]
            .into_iter()
            .chain(domain_lambdas)
        {
            if !(0.0..=1.0).contains(&l) {
                return Err(MixError::Format(format!(
                    "{}: λ {l} is outside [0, 1]",
                    path.display()
                )));
            }
        }
        params
            .adaptive
            .validate()
            .map_err(|e| MixError::Format(format!("{}: {e}", path.display())))?;
        match params.default_rule {
            LambdaRule::Gate if params.gate.is_none() => {
                return Err(MixError::Format(format!(
                    "{}: the default rule is the gate, and the file has none",
                    path.display()
                )))
            }
            LambdaRule::Fixed(_) => {
                return Err(MixError::Format(format!(
                    "{}: the default rule must be one of the file's (split, domain_split, gate, \
                     adaptive); a fixed λ is for callers to ask",
                    path.display()
                )))
            }
            _ => {}
        }
        // A gate over other features would index past its input (smartcore panics there).
        if let Some(g) = &params.gate {
            if g.feature_names != feature_names() {
                return Err(MixError::Format(format!(
                    "{}: the gate was trained on features {:?}, this build computes {:?}",
                    path.display(),
                    g.feature_names,
                    feature_names()
                )));
            }
        }
        Ok(params)
    }

    /// Refuses an index or model whose tokenizer differs from the one the λ were fitted with.
    /// Refuses a pairing other than the one fitted: the model's tokenizer (`fingerprint`), and a
    /// byte-level index or a token one.
    pub fn check_pairing(&self, fingerprint: &str, byte_level: bool) -> Result<(), MixError> {
        if fingerprint != self.tokenizer_fingerprint {
            return Err(MixError::Invalid(format!(
                "the mixing file was fitted with tokenizer {}, this pairing uses {fingerprint}",
                self.tokenizer_fingerprint
            )));
        }
        let level = |bytes| if bytes { "a byte-level" } else { "a token" };
        if byte_level != self.byte_level {
            return Err(MixError::Invalid(format!(
                "the mixing file was fitted against {} index, this pairing uses {} one",
                level(self.byte_level),
                level(byte_level)
            )));
        }
        Ok(())
    }

    /// (λ1, λ2) for a domain: its own pair when fitted, else the global one.
    pub fn split_for(&self, domain: Option<&str>) -> (f64, f64) {
        match domain.and_then(|d| self.by_domain.get(d)) {
            Some(d) => (d.lambda_sparse, d.lambda_dense),
            None => (self.lambda_sparse, self.lambda_dense),
        }
    }
}

/// A file with λ1/λ2 = `split` and nothing else, for unit tests.
#[cfg(test)]
pub(crate) fn split_only(split: (f64, f64)) -> MixingParams {
    MixingParams::new(
        "m".into(),
        "i".into(),
        "t".into(),
        split,
        None,
        FitRecord::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(edit: impl FnOnce(&mut serde_json::Value)) -> Result<MixingParams, MixError> {
        let params = split_only((0.4, 0.05));
        let mut json = serde_json::to_value(&params).unwrap();
        edit(&mut json);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mixing.json");
        std::fs::write(&path, json.to_string()).unwrap();
        MixingParams::load(&path)
    }

    /// The f64s of a mixing file read back bit for bit: λ and the recorded perplexities here, the
    /// gate's in `gate.rs` (serde_json's default parser may land one ulp off: 42.186143907990164, a
    /// real fit's neural perplexity, came back as 42.18614390799016 without `float_roundtrip`).
    #[test]
    fn floats_round_trip_bit_for_bit() {
        let mut params = split_only((0.4, 0.05));
        params.fitted_on.neural_perplexity = 42.186143907990164;
        params.fitted_on.split_perplexity = 17.993652753315917;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // λ in [2⁻¹⁰, 1), mantissas at random.
            let value = |bits: u64| f64::from_bits((bits >> 12) | ((1013 + bits % 10) << 52));
            let lambdas = DomainLambdas {
                lambda_sparse: value(x),
                lambda_dense: value(x.rotate_left(29)),
                tokens: i,
            };
            params.by_domain.insert(format!("d{i}"), lambdas);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mixing.json");
        params.save(&path).unwrap();
        let loaded = MixingParams::load(&path).unwrap();
        let bits = |p: &MixingParams| {
            let lambdas = p.by_domain.values();
            (lambdas.flat_map(|l| [l.lambda_sparse, l.lambda_dense]))
                .chain([p.lambda_sparse, p.lambda_dense])
                .chain([p.fitted_on.neural_perplexity, p.fitted_on.split_perplexity])
                .map(f64::to_bits)
                .collect::<Vec<_>>()
        };
        let (got, want) = (bits(&loaded), bits(&params));
        let off = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        assert_eq!(off, 0, "{off} of {} floats read back otherwise", want.len());
    }

    /// A file from before the adaptive λ keeps its old default (the domain's λ1/λ2) and has no
    /// guard; a default the file cannot serve, or broken hypotheses, are refused at load.
    #[test]
    fn defaults_and_refusals() {
        let old = saved(|j| {
            let o = j.as_object_mut().unwrap();
            o.remove("default_rule");
            o.remove("adaptive");
            o.remove("decode_max_match");
        })
        .unwrap();
        assert_eq!(old.default_rule, LambdaRule::DomainSplit);
        assert_eq!(old.adaptive, AdaptiveOptions::default());
        assert_eq!(old.decode_max_match, None);
        let refused = |edit: fn(&mut serde_json::Value)| saved(edit).unwrap_err().to_string();
        assert!(refused(|j| j["default_rule"] = "gate".into()).contains("has none"));
        assert!(
            refused(|j| j["default_rule"] = serde_json::json!({"fixed": 0.5}))
                .contains("default rule")
        );
        assert!(refused(|j| j["adaptive"]["prior_neural"] = 1.5.into()).contains("prior"));
        assert!(refused(|j| j["adaptive"]["offsets"] = serde_json::json!([])).contains("offsets"));
    }
}
