//! Per-token evidence of an evaluation: the neural model's and the ∞-gram's view of every scored
//! token, gathered one domain at a time and saved when a domain is complete, so an interrupted run
//! resumes after the last finished domain.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use super::documents::EvalDocument;
use crate::index::Index;
use crate::mix::features::{gate_features, GateFeatures, InfgramContext, NeuralContext};
use crate::mix::fit::TokenEvidence;
use crate::model::{Model, WindowOptions};
use crate::progress::token_bar;

/// Version of [`TokenRecord`] and of the gate features in it: bump when either changes, so saved
/// records from older code are recomputed instead of reused.
const RECORD_FORMAT: u32 = 1;

/// Everything measured at one scored token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Index of the document in the input.
    pub doc: usize,
    pub position: usize,
    pub token: u32,
    pub neural_logprob: f32,
    pub infgram_prob: f64,
    pub suffix_len: usize,
    pub prompt_cnt: u64,
    pub sparse: bool,
    pub features: GateFeatures,
}

impl TokenRecord {
    pub fn evidence(&self) -> TokenEvidence {
        TokenEvidence {
            p_infgram: self.infgram_prob,
            p_neural: (self.neural_logprob as f64).exp(),
            sparse: self.sparse,
            features: self.features,
        }
    }

    pub fn effective_n(&self) -> usize {
        self.suffix_len + 1
    }
}

/// One domain's records and what they cost.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DomainRecords {
    pub domain: String,
    /// Identifies model, index, window and documents: saved records are reused only on a match.
    pub key: String,
    pub documents: usize,
    pub tokens: Vec<TokenRecord>,
    pub neural_seconds: f64,
    /// Dense ∞-gram scoring plus gate features.
    pub infgram_seconds: f64,
}

/// Scores documents with the model (window protocol) and the index (dense ∞-gram scoring).
pub struct Collector<'a> {
    pub model: &'a Model,
    pub index: &'a Index,
    pub window: WindowOptions,
    /// Where finished domains are saved and looked up; none keeps everything in memory.
    pub work_dir: Option<PathBuf>,
}

impl Collector<'_> {
    /// Records of every domain of `docs`, in domain order.
    pub fn collect(&self, docs: &[EvalDocument]) -> Result<Vec<DomainRecords>> {
        let mut by_domain: BTreeMap<&str, Vec<&EvalDocument>> = BTreeMap::new();
        for d in docs {
            by_domain.entry(&d.domain).or_default().push(d);
        }
        by_domain
            .into_iter()
            .map(|(domain, docs)| self.domain(domain, &docs))
            .collect()
    }

    fn key(&self, docs: &[&EvalDocument]) -> String {
        let mut h = Xxh3::new();
        h.update(&RECORD_FORMAT.to_le_bytes());
        h.update(self.model.source().display().to_string().as_bytes());
        h.update(self.index.dir().display().to_string().as_bytes());
        h.update(&(self.window.window as u64).to_le_bytes());
        h.update(&(self.window.stride as u64).to_le_bytes());
        for d in docs {
            h.update(&(d.index as u64).to_le_bytes());
            for t in &d.tokens {
                h.update(&t.to_le_bytes());
            }
        }
        format!("{:016x}", h.digest())
    }

    fn saved_path(&self, domain: &str) -> Option<PathBuf> {
        let safe: String = domain
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.work_dir
            .as_ref()
            .map(|d| d.join(format!("{safe}.records.bin")))
    }

    fn domain(&self, domain: &str, docs: &[&EvalDocument]) -> Result<DomainRecords> {
        let key = self.key(docs);
        let saved = self.saved_path(domain);
        if let Some(records) = saved.as_deref().and_then(|p| load_saved(p, &key)) {
            tracing::info!(
                "{domain}: reusing {} saved token records",
                records.tokens.len()
            );
            return Ok(records);
        }
        let total: usize = docs.iter().map(|d| d.tokens.len() - 1).sum();
        let bar = token_bar(total as u64, domain);
        let mut records = DomainRecords {
            domain: domain.to_string(),
            key,
            documents: docs.len(),
            tokens: Vec::with_capacity(total),
            neural_seconds: 0.0,
            infgram_seconds: 0.0,
        };
        for doc in docs {
            let scored = document_records(
                self.model,
                self.index,
                self.window,
                doc.index,
                &doc.tokens,
                |n| bar.inc(n as u64),
            )?;
            records.tokens.extend(scored.tokens);
            records.neural_seconds += scored.neural_seconds;
            records.infgram_seconds += scored.infgram_seconds;
        }
        bar.finish_and_clear();
        if let Some(path) = saved {
            save(&path, &records)?;
        }
        Ok(records)
    }
}

/// The records of one document's tokens `1..n` and what they cost.
pub struct DocumentRecords {
    pub tokens: Vec<TokenRecord>,
    pub neural_seconds: f64,
    pub infgram_seconds: f64,
}

/// Scores one document (`doc` is its index in the input): the model with the window protocol, the
/// index densely, and the gate features of every position. `progress` hears of scored tokens.
pub fn document_records(
    model: &Model,
    index: &Index,
    window: WindowOptions,
    doc: usize,
    tokens: &[u32],
    progress: impl FnMut(usize),
) -> Result<DocumentRecords> {
    let t = Instant::now();
    let neural = model
        .transformer()
        .score_document(tokens, window, progress)?;
    let neural_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let scores = index.score(tokens)?;
    let contexts = InfgramContext::for_document(index, tokens, &scores)?;
    // Neural position scores start at token 1 (token 0 is only context).
    let infgram = scores.iter().zip(&contexts).skip(1);
    let records = neural
        .positions
        .iter()
        .zip(infgram)
        .enumerate()
        .map(|(offset, (nn, (inf, context)))| {
            let position = offset + 1;
            let neural_context = NeuralContext {
                entropy: nn.entropy as f64,
                top_prob: nn.top_prob as f64,
            };
            TokenRecord {
                doc,
                position,
                token: tokens[position],
                neural_logprob: nn.logprob,
                infgram_prob: inf.prob,
                suffix_len: inf.suffix_len,
                prompt_cnt: inf.prompt_cnt,
                sparse: inf.sparse,
                features: gate_features(context, &neural_context),
            }
        })
        .collect();
    Ok(DocumentRecords {
        tokens: records,
        neural_seconds,
        infgram_seconds: t.elapsed().as_secs_f64(),
    })
}

/// Saved records are bincode, not JSON: a rerun from them must see bit-identical floats, and JSON
/// number parsing may be one ulp off.
fn load_saved(path: &Path, key: &str) -> Option<DomainRecords> {
    let bytes = std::fs::read(path).ok()?;
    let records: DomainRecords = bincode::deserialize(&bytes).ok()?;
    (records.key == key).then_some(records)
}

/// Writes beside the target and renames, so an interrupt never leaves half a file to resume from.
fn save(path: &Path, records: &DomainRecords) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, bincode::serialize(records)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
