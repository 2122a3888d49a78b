//! What an index of either kind holds, as `index info` shows it.

use serde::Serialize;

use crate::index::corpus::Corpus;
use crate::index::fm::part::FmPart;
use crate::index::fm::{part_file, CompressedIndex};
use crate::index::format::{ptr_size_for, DecontaminationRecord, TokenizerRecord};
use crate::index::{Index, IndexError, Result};

/// What every kind of index holds and how its tokens are written.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexShape {
    #[serde(rename = "shards")]
    pub parts: usize,
    pub documents: u64,
    /// Tokens of all parts, one separator per document included.
    pub tokens_with_separators: u64,
    /// Bytes per token.
    pub token_width: usize,
    pub eos_token_id: u32,
    pub vocab_size: u64,
}

/// The shape of `corpus`.
fn shape(corpus: &impl Corpus) -> IndexShape {
    IndexShape {
        parts: corpus.num_parts(),
        documents: corpus.total_documents(),
        tokens_with_separators: corpus.total_tokens(),
        token_width: corpus.width().bytes(),
        eos_token_id: corpus.eos_token_id(),
        vocab_size: corpus.vocab_size(),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexInfo {
    pub dir: String,
    #[serde(flatten)]
    pub shape: IndexShape,
    /// The tokenizer it was built with, when recorded.
    pub tokenizer: Option<TokenizerRecord>,
    /// Bytes of the tokens, suffix arrays, document offsets and metadata of all parts (the
    /// optional next-token tables left out), and per token.
    pub bytes: u64,
    pub bytes_per_token: f64,
    /// Whether it has our manifest (an index of the reference indexer has not).
    pub manifest: bool,
    /// Prompts with build-time next-token counts, over all parts (0 without next-token tables).
    pub next_token_table_prompts: u64,
    /// Reference documents the build dropped for overlapping evaluation data, when it was asked to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decontamination: Option<DecontaminationRecord>,
    /// The same figures part by part: parts are built and searched one by one, so an uneven
    /// split shows here.
    #[serde(rename = "by_shard")]
    pub by_part: Vec<PartInfo>,
}

/// One part of [`IndexInfo::by_part`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartInfo {
    pub documents: u64,
    pub tokens_with_separators: u64,
    pub next_token_table_prompts: u64,
}

impl Index {
    pub fn info(&self) -> IndexInfo {
        let by_part: Vec<PartInfo> = self
            .parts
            .iter()
            .map(|s| PartInfo {
                documents: s.doc_cnt(),
                tokens_with_separators: s.tok_cnt(),
                next_token_table_prompts: s.next_table().map_or(0, |t| t.entries() as u64),
            })
            .collect();
        let bytes: u64 = self.parts.iter().map(|s| s.bytes()).sum();
        IndexInfo {
            bytes,
            bytes_per_token: bytes as f64 / self.total_tokens().max(1) as f64,
            dir: self.dir().display().to_string(),
            shape: shape(self),
            tokenizer: self.manifest().and_then(|m| m.tokenizer.clone()),
            manifest: self.manifest().is_some(),
            next_token_table_prompts: by_part.iter().map(|s| s.next_token_table_prompts).sum(),
            decontamination: self.manifest().and_then(|m| m.decontamination.clone()),
            by_part,
        }
    }
}

/// What `index info` shows of a compressed index.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompressedInfo {
    pub dir: String,
    #[serde(flatten)]
    pub shape: IndexShape,
    /// Bytes of its files.
    pub bytes: u64,
    pub bytes_per_token: f64,
    /// What the suffix-array index of the same text takes (tokens, pointers, document offsets).
    pub suffix_array_bytes_per_token: f64,
    /// The files' bytes by what they serve: the transform (count, ∞-gram, distributions), the
    /// position samples and window rows (locating matches, reading windows), the documents (offsets,
    /// metadata).
    #[serde(rename = "bytes_by_part")]
    pub bytes_by_component: Vec<(String, u64)>,
    /// Every this-many-th position keeps its place (`--sample-every`): a locate's most steps.
    pub sample_every: u64,
}

impl CompressedIndex {
    /// What the index holds and what it takes, beside what the suffix-array index of the same
    /// text takes.
    pub fn info(&self) -> Result<CompressedInfo> {
        let mut bytes = 0;
        for n in 0..self.parts.len() {
            let path = part_file(self.dir(), n);
            bytes += std::fs::metadata(&path)
                .map_err(|e| IndexError::io(&path, e))?
                .len();
        }
        let tokens = self.total_tokens();
        // A suffix-array part holds each token and its pointer, a document offset each and the
        // same metadata (what its `index info` counts).
        let suffix_array_bytes: u64 = self
            .parts
            .iter()
            .map(|s| {
                let ds_size = s.tok_cnt() * self.width.bytes() as u64;
                s.tok_cnt() * (self.width.bytes() + ptr_size_for(ds_size)) as u64
                    + 8 * s.doc_cnt()
                    + s.metadata_bytes()
            })
            .sum();
        Ok(CompressedInfo {
            dir: self.dir().display().to_string(),
            shape: shape(self),
            bytes,
            bytes_per_token: bytes as f64 / tokens as f64,
            suffix_array_bytes_per_token: suffix_array_bytes as f64 / tokens as f64,
            bytes_by_component: self
                .size_by_component()
                .into_iter()
                .map(|(name, b)| (name.to_string(), b))
                .collect(),
            sample_every: self.parts.first().map_or(0, FmPart::sample_every),
        })
    }
}
