//! The per-token evidence ([`crate::evidence`]) of an evaluation, gathered one domain at a time and
//! saved when a domain is complete, so an interrupted run resumes after the last finished domain.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use super::documents::EvalDocument;
use super::{EvalError, Result};
use crate::evidence::{document_records, EvidenceIndex, TokenRecord, RECORD_FORMAT};
use crate::model::{Model, WindowOptions};
use crate::progress::token_bar;

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
    pub index: &'a dyn EvidenceIndex,
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
        std::fs::create_dir_all(dir)
            .map_err(EvalError::io(format!("creating {}", dir.display())))?;
    }
    let tmp = path.with_extension("partial");
    let bytes = bincode::serialize(records).map_err(EvalError::Encode)?;
    std::fs::write(&tmp, bytes).map_err(EvalError::io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(EvalError::io(format!("writing {}", path.display())))?;
    Ok(())
}
