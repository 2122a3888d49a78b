//! The on-disk layout of an index: infini-gram v4 parts, byte-compatible with the reference engine,
//! plus a manifest of our own that records what the v4 files cannot say about themselves.
//!
//! Per part `N`: `tokenized.N` (little-endian tokens, an all-ones separator before every document),
//! `table.N` (suffix array of byte offsets, `ptr_size` bytes each, suffixes ordered by the bytes of the
//! tokens), `offset.N` (u64 byte offset of each document's separator), and optionally `metadata.N`
//! (one JSON line per document) with `metaoff.N` (u64 offset of each line).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::index::IndexError;

/// Name of our manifest. The reference engine finds its files by substring match on the path, so the
/// name must not contain `tokenized`, `table`, `offset`, `metadata`, `metaoff` or `unigram`.
pub const MANIFEST_FILE: &str = "sidecar-index.json";
/// Copy of the tokenizer the index was built with, so document text can be returned.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The shard-set record of a compressed index of one shard of a set (as the suffix array's
/// manifest holds it), so a shard server can serve it to its routers.
pub const SHARD_SET_FILE: &str = "shard-set.json";
/// Bumped whenever the meaning of any file or manifest field changes. Version 2 added the next-token
/// tables (`nexttok.N`); a build without them still writes version 1, which older binaries open.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest version this build still opens.
pub const FIRST_FORMAT_VERSION: u32 = 1;
pub const FORMAT_NAME: &str = "infini-sidecar-index";

/// Bytes per token on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub enum TokenWidth {
    U8,
    U16,
    U32,
}

impl TokenWidth {
    pub fn bytes(self) -> usize {
        match self {
            TokenWidth::U8 => 1,
            TokenWidth::U16 => 2,
            TokenWidth::U32 => 4,
        }
    }

    /// The all-ones value that separates documents.
    pub fn separator(self) -> u32 {
        match self {
            TokenWidth::U8 => u8::MAX as u32,
            TokenWidth::U16 => u16::MAX as u32,
            TokenWidth::U32 => u32::MAX,
        }
    }

    /// Number of distinct values a token of this width can hold.
    pub fn capacity(self) -> u64 {
        1u64 << (8 * self.bytes())
    }

    /// Refuses a vocabulary whose ids could reach the separator (the largest value), where a token
    /// would be counted as a document boundary; the eos id must be one of the vocabulary's ids.
    pub fn check_vocab(self, vocab_size: u64, eos_token_id: u32) -> Result<(), IndexError> {
        if vocab_size == 0 || vocab_size >= self.capacity() || eos_token_id as u64 >= vocab_size {
            return Err(IndexError::Invalid(format!(
                "vocabulary size {vocab_size} with eos id {eos_token_id} does not fit {}-byte tokens: \
                 ids must stay below the separator {} and the eos id below the vocabulary size",
                self.bytes(),
                self.separator()
            )));
        }
        Ok(())
    }

    pub fn from_bits(bits: u32) -> Result<Self, IndexError> {
        match bits {
            8 => Ok(TokenWidth::U8),
            16 => Ok(TokenWidth::U16),
            32 => Ok(TokenWidth::U32),
            other => Err(IndexError::Invalid(format!(
                "token width must be 8, 16 or 32 bits, not {other}"
            ))),
        }
    }

    /// The narrowest width whose ids (all but the separator) cover a vocabulary.
    pub fn for_vocab(vocab_size: u64) -> Self {
        if vocab_size < 256 {
            TokenWidth::U8
        } else if vocab_size < 65536 {
            TokenWidth::U16
        } else {
            TokenWidth::U32
        }
    }

    /// Reads the token at byte offset `at` (little-endian).
    #[inline]
    pub fn read(self, bytes: &[u8], at: usize) -> u32 {
        match self {
            TokenWidth::U8 => bytes[at] as u32,
            TokenWidth::U16 => u16::from_le_bytes([bytes[at], bytes[at + 1]]) as u32,
            TokenWidth::U32 => {
                u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
            }
        }
    }

    /// Appends the little-endian bytes of `ids` to `out`: the byte string a query must match.
    pub fn encode_into(self, ids: &[u32], out: &mut Vec<u8>) {
        for &id in ids {
            out.extend_from_slice(&id.to_le_bytes()[..self.bytes()]);
        }
    }
}

impl TryFrom<u8> for TokenWidth {
    type Error = String;
    fn try_from(bytes: u8) -> Result<Self, String> {
        match bytes {
            1 => Ok(TokenWidth::U8),
            2 => Ok(TokenWidth::U16),
            4 => Ok(TokenWidth::U32),
            other => Err(format!("token width must be 1, 2 or 4 bytes, not {other}")),
        }
    }
}

impl From<TokenWidth> for u8 {
    fn from(w: TokenWidth) -> u8 {
        w.bytes() as u8
    }
}

/// Suffix-array pointer size of the reference: `ceil(log2(ds_size) / 8)` bytes (at least 1).
pub fn ptr_size_for(ds_size: u64) -> usize {
    if ds_size <= 1 {
        return 1;
    }
    let bits = (ds_size as f64).log2();
    ((bits / 8.0).ceil() as usize).max(1)
}

/// The files of part `n`.
#[derive(Debug, Clone)]
pub struct PartPaths {
    pub tokenized: PathBuf,
    pub table: PathBuf,
    pub offset: PathBuf,
    pub metadata: PathBuf,
    pub metaoff: PathBuf,
    /// Our own next-token table (`next_table`), when the build made one.
    pub next_tokens: PathBuf,
}

impl PartPaths {
    pub fn new(dir: &Path, n: usize) -> Self {
        PartPaths {
            tokenized: dir.join(format!("tokenized.{n}")),
            table: dir.join(format!("table.{n}")),
            offset: dir.join(format!("offset.{n}")),
            metadata: dir.join(format!("metadata.{n}")),
            metaoff: dir.join(format!("metaoff.{n}")),
            next_tokens: dir.join(format!("nexttok.{n}")),
        }
    }

    /// The files every part has, then the optional metadata pair and next-token table.
    pub fn all(&self) -> [&PathBuf; 6] {
        [
            &self.tokenized,
            &self.table,
            &self.offset,
            &self.metadata,
            &self.metaoff,
            &self.next_tokens,
        ]
    }
}

/// Whether `name` is one of the files an index build writes: the manifest, the tokenizer copy, or a
/// part file (`tokenized.N`, `table.N`, `offset.N`, `metadata.N`, `metaoff.N`, `nexttok.N`). `--force` replaces
/// only folders that hold nothing else.
pub fn is_index_file(name: &str) -> bool {
    if name == MANIFEST_FILE || name == TOKENIZER_FILE || name == SHARD_SET_FILE {
        return true;
    }
    name.split_once('.').is_some_and(|(stem, n)| {
        [
            "tokenized",
            "table",
            "offset",
            "metadata",
            "metaoff",
            "nexttok",
            "fm",
        ]
        .contains(&stem)
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Size and checksum of one file, as recorded in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    pub name: String,
    pub bytes: u64,
    /// xxh3-64 of the whole file, hex. Checked by `index verify`, not at every open (it reads every byte).
    pub xxh3: String,
}

impl FileRecord {
    pub fn of(path: &Path) -> Result<Self, IndexError> {
        let mut file = File::open(path).map_err(|e| IndexError::io(path, e))?;
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut bytes = 0u64;
        loop {
            let n = file.read(&mut buf).map_err(|e| IndexError::io(path, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            bytes += n as u64;
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(FileRecord {
            name,
            bytes,
            xxh3: format!("{:016x}", hasher.digest()),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRecord {
    pub documents: u64,
    /// Tokens in `tokenized.N`, separators included (the suffix array's length).
    pub tokens: u64,
    pub files: Vec<FileRecord>,
}

/// Identity of the tokenizer an index was built with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerRecord {
    pub fingerprint: String,
    /// Where it came from (a tokenizer.json or a GGUF file), for people.
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    pub token_width: TokenWidth,
    pub eos_token_id: u32,
    pub vocab_size: u64,
    pub tokenizer: Option<TokenizerRecord>,
    pub documents: u64,
    /// Tokens of all parts, separators excluded.
    pub tokens: u64,
    /// Named as the reference engine names its parts.
    #[serde(rename = "shards")]
    pub parts: Vec<PartRecord>,
    pub built_by: String,
    /// Reference documents dropped for overlapping the evaluation data, when the build was asked to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decontamination: Option<DecontaminationRecord>,
    /// What the parts' next-token tables hold, when the build made them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_token_table: Option<NextTableSpec>,
    /// Which shard of which set this index is, when it was built as one (`--shard K/N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_set: Option<ShardSetRecord>,
}

/// What a build's decontamination ([`crate::index::build::decontam`]) dropped, recorded in the manifest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DecontaminationRecord {
    pub ngram: usize,
    pub threshold: f64,
    /// Evaluation documents whose n-grams were collected.
    pub evaluation_documents: u64,
    pub documents_dropped: u64,
    pub tokens_dropped: u64,
}

impl Manifest {
    pub fn read(dir: &Path) -> Result<Option<Self>, IndexError> {
        let path = dir.join(MANIFEST_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| IndexError::io(&path, e))?;
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| {
            IndexError::Corrupt(format!("{}: not a valid manifest: {e}", path.display()))
        })?;
        if manifest.format != FORMAT_NAME {
            return Err(IndexError::Corrupt(format!(
                "{}: format is {:?}, not {FORMAT_NAME:?}",
                path.display(),
                manifest.format
            )));
        }
        if !(FIRST_FORMAT_VERSION..=FORMAT_VERSION).contains(&manifest.format_version) {
            return Err(IndexError::Corrupt(format!(
                "{}: format version {} is not one this build opens ({FIRST_FORMAT_VERSION} to {FORMAT_VERSION})",
                path.display(),
                manifest.format_version
            )));
        }
        Ok(Some(manifest))
    }

    pub fn write(&self, dir: &Path) -> Result<(), IndexError> {
        let path = dir.join(MANIFEST_FILE);
        let text =
            serde_json::to_string_pretty(self).map_err(|e| IndexError::Invalid(e.to_string()))?;
        std::fs::write(&path, text + "\n").map_err(|e| IndexError::io(&path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptr_size_matches_reference_formula() {
        // ceil(log2(bytes) / 8), as the reference indexer computes it.
        assert_eq!(ptr_size_for(2), 1);
        assert_eq!(ptr_size_for(255), 1);
        assert_eq!(ptr_size_for(256), 1);
        assert_eq!(ptr_size_for(257), 2);
        assert_eq!(ptr_size_for(65536), 2);
        assert_eq!(ptr_size_for(65537), 3);
        assert_eq!(ptr_size_for(1 << 32), 4);
        assert_eq!(ptr_size_for((1 << 32) + 1), 5);
    }

    #[test]
    fn a_vocabulary_never_reaches_the_separator() {
        assert!(TokenWidth::U16.check_vocab(65535, 0).is_ok());
        let err = TokenWidth::U16
            .check_vocab(65536, 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("separator 65535"), "{err}");
        assert!(TokenWidth::U8.check_vocab(256, 0).is_err());
        assert!(TokenWidth::U8.check_vocab(10, 10).is_err());
        for vocab in [1, 255, 256, 65535, 65536, 1 << 20] {
            let width = TokenWidth::for_vocab(vocab);
            assert!(width.check_vocab(vocab, 0).is_ok(), "{vocab}");
            assert!(width.check_vocab(width.capacity() - 1, 0).is_ok());
        }
    }

    #[test]
    fn index_files_are_recognised_by_name() {
        for name in [
            "tokenized.0",
            "table.12",
            "metaoff.3",
            "nexttok.0",
            "fm.0",
            "fm.10",
            MANIFEST_FILE,
            TOKENIZER_FILE,
            SHARD_SET_FILE,
        ] {
            assert!(is_index_file(name), "{name}");
        }
        for name in [
            "thesis.txt",
            "table.",
            "table.x",
            "tokenized.0.bak",
            "offsets.0",
            "fm.x",
            ".partial",
        ] {
            assert!(!is_index_file(name), "{name}");
        }
    }

    #[test]
    fn encode_is_little_endian() {
        let mut out = Vec::new();
        TokenWidth::U16.encode_into(&[0x0102, 0xFFFF], &mut out);
        assert_eq!(out, vec![0x02, 0x01, 0xFF, 0xFF]);
        assert_eq!(TokenWidth::U16.read(&out, 0), 0x0102);
        assert_eq!(TokenWidth::U32.separator(), u32::MAX);
    }
}

/// What a build was asked to put in the table, recorded in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextTableSpec {
    /// Longest prompt, in tokens, that gets an entry.
    pub max_prompt_tokens: u32,
    /// Fewest matches a prompt needs for an entry: below it, computing is as cheap as looking up.
    pub min_count: u64,
    /// Most bytes the table of one part may take; the most frequent prompts are kept first.
    pub budget_bytes: u64,
}

impl Default for NextTableSpec {
    fn default() -> Self {
        NextTableSpec {
            max_prompt_tokens: 4,
            min_count: 2048,
            budget_bytes: 64 << 20,
        }
    }
}

/// Maps an index file read-only.
pub(crate) fn map_file(path: &Path) -> Result<Mmap, IndexError> {
    let file = File::open(path).map_err(|e| IndexError::io(path, e))?;
    // SAFETY: index files are immutable once built; a concurrent writer would be a usage error that
    // the size checks at open time and `index verify` are there to catch.
    unsafe { Mmap::map(&file) }.map_err(|e| IndexError::io(path, e))
}

/// The manifest's record of a shard built as one of a set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSetRecord {
    /// Equal for every shard of one set: the input's content, N, and everything that decides what
    /// a token id means or which documents are kept (see `cluster::split`).
    pub set_id: String,
    pub shard: u32,
    pub shards: u32,
    /// Documents of the whole input, before decontamination (this shard's are
    /// `ShardSplit::documents` of them).
    pub corpus_documents: u64,
}
