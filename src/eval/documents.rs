//! Evaluation documents: Pile-style JSON lines or plain text files, tokenized for a model, with a
//! token budget (scoring on CPU is slow, so evaluations usually take the first N tokens).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{EvalError, Result};
use crate::corpus::{self, Content};
use crate::model::{Model, ModelError};

/// One document to score, as the model's token ids (BOS included when the model wants one).
#[derive(Debug, Clone)]
pub struct EvalDocument {
    /// Position in the input, counting every document read.
    pub index: usize,
    /// `meta.pile_set_name`, or "text" for documents without one.
    pub domain: String,
    pub path: String,
    pub tokens: Vec<u32>,
}

/// How many tokens to keep of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenBudget {
    All,
    /// The first N tokens of the whole input (later documents dropped, the last one cut).
    Total(usize),
    /// The first N tokens of each domain.
    PerDomain(usize),
}

impl TokenBudget {
    fn limit(self) -> Option<usize> {
        match self {
            TokenBudget::All => None,
            TokenBudget::Total(n) | TokenBudget::PerDomain(n) => Some(n),
        }
    }
}

/// Reads and tokenizes the documents of `inputs`, keeping `budget` tokens, and at most
/// `max_doc_tokens` of any one document (so a budget spreads over several documents instead of
/// the first long one). Documents left with fewer than two tokens (nothing to predict) are dropped.
pub fn load_documents(
    inputs: &[PathBuf],
    model: &Model,
    budget: TokenBudget,
    max_doc_tokens: Option<usize>,
) -> Result<Vec<EvalDocument>> {
    load_documents_with(
        inputs,
        |text| model.encode_document(text),
        budget,
        max_doc_tokens,
    )
}

/// [`load_documents`] with another encoder than a model's (an index's tokenizer, or UTF-8 bytes).
pub fn load_documents_with(
    inputs: &[PathBuf],
    encode: impl Fn(&str) -> std::result::Result<Vec<u32>, ModelError>,
    budget: TokenBudget,
    max_doc_tokens: Option<usize>,
) -> Result<Vec<EvalDocument>> {
    let files = corpus::expand_inputs(inputs)?;
    let mut used: BTreeMap<String, usize> = BTreeMap::new();
    let mut docs = Vec::new();
    for (index, doc) in corpus::text_documents(files).enumerate() {
        let doc = doc?;
        let Content::Text(text) = doc.content else {
            continue;
        };
        let (domain, path) = describe(doc.metadata.as_deref());
        let key = match budget {
            TokenBudget::PerDomain(_) => domain.clone(),
            _ => String::new(),
        };
        let spent = used.entry(key).or_default();
        let left = budget.limit().map(|n| n.saturating_sub(*spent));
        if left == Some(0) {
            continue;
        }
        let mut tokens = encode(&text).map_err(|source| EvalError::Tokenize {
            index,
            path: path.clone(),
            source,
        })?;
        let keep = [left, max_doc_tokens].into_iter().flatten().min();
        if let Some(keep) = keep {
            tokens.truncate(keep);
        }
        *spent += tokens.len();
        if tokens.len() >= 2 {
            docs.push(EvalDocument {
                index,
                domain,
                path,
                tokens,
            });
        }
    }
    Ok(docs)
}

/// Domain and path of a document from the metadata line the corpus reader records.
fn describe(metadata: Option<&str>) -> (String, String) {
    let value: serde_json::Value = metadata
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or_default();
    let meta = &value["metadata"]["meta"];
    let domain = meta["pile_set_name"].as_str().unwrap_or("text").to_string();
    let path = meta["path"]
        .as_str()
        .or_else(|| value["path"].as_str())
        .unwrap_or_default()
        .to_string();
    (domain, path)
}
