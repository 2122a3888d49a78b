//! What an index holds, as `index info` shows it.

use serde::Serialize;

use crate::index::format::{DecontaminationRecord, TokenizerRecord};
use crate::index::Index;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexInfo {
    pub dir: String,
    pub shards: usize,
    pub documents: u64,
    /// Tokens of all shards, one separator per document included.
    pub tokens_with_separators: u64,
    /// Bytes per token.
    pub token_width: usize,
    pub eos_token_id: u32,
    pub vocab_size: u64,
    /// The tokenizer it was built with, when recorded.
    pub tokenizer: Option<TokenizerRecord>,
    /// Bytes of the tokens, suffix arrays, document offsets and metadata of all shards (the
    /// optional next-token tables left out), and per token.
    pub bytes: u64,
    pub bytes_per_token: f64,
    /// Whether it has our manifest (an index of the reference indexer has not).
    pub manifest: bool,
    /// Prompts with build-time next-token counts, over all shards (0 without next-token tables).
    pub next_token_table_prompts: u64,
    /// Reference documents the build dropped for overlapping evaluation data, when it was asked to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decontamination: Option<DecontaminationRecord>,
    /// The same figures shard by shard: shards are built and searched one by one, so an uneven
    /// split shows here.
    pub by_shard: Vec<ShardInfo>,
}

/// One shard of [`IndexInfo::by_shard`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardInfo {
    pub documents: u64,
    pub tokens_with_separators: u64,
    pub next_token_table_prompts: u64,
}

impl Index {
    pub fn info(&self) -> IndexInfo {
        let by_shard: Vec<ShardInfo> = self
            .shards
            .iter()
            .map(|s| ShardInfo {
                documents: s.doc_cnt(),
                tokens_with_separators: s.tok_cnt(),
                next_token_table_prompts: s.next_table().map_or(0, |t| t.entries() as u64),
            })
            .collect();
        let bytes: u64 = self.shards.iter().map(|s| s.bytes()).sum();
        IndexInfo {
            bytes,
            bytes_per_token: bytes as f64 / self.total_tokens().max(1) as f64,
            dir: self.dir().display().to_string(),
            shards: self.num_shards(),
            documents: self.total_documents(),
            tokens_with_separators: self.total_tokens(),
            token_width: self.width().bytes(),
            eos_token_id: self.eos_token_id(),
            vocab_size: self.vocab_size(),
            tokenizer: self.manifest().and_then(|m| m.tokenizer.clone()),
            manifest: self.manifest().is_some(),
            next_token_table_prompts: by_shard.iter().map(|s| s.next_token_table_prompts).sum(),
            decontamination: self.manifest().and_then(|m| m.decontamination.clone()),
            by_shard,
        }
    }
}
