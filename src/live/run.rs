//! A run: documents frozen out of a namespace's tail, or merged from older runs, as a suffix-array
//! index of their own, written by the index builder into the namespace's folder and memory-mapped.
//! A run is immutable: compaction replaces runs and never changes one, so a reader holding one is
//! never disturbed.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{LiveError, Result, Vocabulary};
use crate::corpus::{Content, InputDoc};
use crate::index::build::{build, BuildOptions};
use crate::index::{Index, OpenOptions};

/// What the namespace's list of runs records of each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    /// Its folder, inside the namespace's folder.
    pub name: String,
    /// 0 for a frozen tail; a merge of runs of level L is of level L + 1.
    pub level: u32,
    pub documents: u64,
    /// Tokens, separators excluded.
    pub tokens: u64,
    /// Order of its oldest document among everything frozen so far: eviction drops the oldest.
    pub oldest: u64,
}

pub struct Run {
    pub meta: RunMeta,
    index: Index,
}

/// A run's folder name: its place in the namespace's sequence of runs.
pub fn folder_name(seq: u64) -> String {
    format!("run-{seq:08}")
}

/// Whether a folder of a namespace is one of ours: a run or a builder's work folder for one.
pub fn is_run_folder(name: &str) -> bool {
    name.starts_with("run-")
}

impl Run {
    /// Builds a run from `docs` in `ns_dir/meta.name` (the builder works in a side folder and renames
    /// it into place, so a kill leaves no half-written run under that name).
    pub fn build(
        ns_dir: &Path,
        mut meta: RunMeta,
        vocab: &Vocabulary,
        docs: impl Iterator<Item = Vec<u32>>,
    ) -> Result<Self> {
        let mut opts = BuildOptions::new(
            ns_dir.join(&meta.name),
            vocab.width,
            vocab.eos_token_id,
            vocab.vocab_size,
        );
        // A background job beside a server: one thread, and the memory of a run, not of a corpus.
        opts.threads = 1;
        opts.memory_budget = 1 << 30;
        // Runs are small and rebuilt as they merge: their ranges are short enough to walk.
        opts.next_table = None;
        // Thousands of small builds in a server's background: no bars, and no ticker threads.
        opts.progress = false;
        let docs = docs.filter(|d| !d.is_empty()).map(|tokens| {
            Ok(InputDoc {
                content: Content::Tokens(tokens),
                metadata: None,
                input_bytes: 0,
            })
        });
        let report = build(docs, &opts).map_err(LiveError::Index)?;
        meta.documents = report.documents;
        meta.tokens = report.tokens;
        // On disk before any list names it, so a power cut cannot leave a named run half-written.
        sync_folder(&ns_dir.join(&meta.name))?;
        sync_folder(ns_dir)?;
        Self::open(ns_dir, meta, vocab, false)
    }

    /// Opens a run the namespace's list names; its files are checked as any index's are, and with
    /// `verify` (a run found on disk at start, not one just built) every checksum of its manifest
    /// and every document offset too, as `index verify` does: a run whose bytes changed on disk
    /// would otherwise be served (drafts of ids outside the vocabulary, silently empty lookups).
    /// Runs are at most a quarter of the budget, so this reads at most that at start.
    pub fn open(ns_dir: &Path, meta: RunMeta, vocab: &Vocabulary, verify: bool) -> Result<Self> {
        let opts = OpenOptions {
            verify_checksums: verify,
            token_width: Some(vocab.width),
            eos_token_id: Some(vocab.eos_token_id),
            vocab_size: Some(vocab.vocab_size),
            // A lookup searches every run in turn: each search starts in RAM.
            sample_ranks: true,
            ..OpenOptions::default()
        };
        let index = Index::open(&ns_dir.join(&meta.name), &opts).map_err(LiveError::Index)?;
        if verify {
            index.verify_documents().map_err(LiveError::Index)?;
        }
        if index.total_tokens() != meta.tokens + index.total_documents()
            || index.total_documents() != meta.documents
        {
            return Err(LiveError::Corrupt(format!(
                "{}: {} documents of {} tokens in its files, {} of {} in the namespace's list",
                meta.name,
                index.total_documents(),
                index.total_tokens() - index.total_documents(),
                meta.documents,
                meta.tokens
            )));
        }
        Ok(Self { meta, index })
    }

    pub fn index(&self) -> &Index {
        &self.index
    }
}

/// Syncs every file of `dir` and then the folder itself (its entries, such as a rename into it).
fn sync_folder(dir: &Path) -> Result<()> {
    let io = |e| LiveError::io(dir, e);
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.is_file() {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| LiveError::io(&path, e))?;
        }
    }
    super::folder::sync_entries(dir)
}
