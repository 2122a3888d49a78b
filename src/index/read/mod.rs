//! The suffix-array read side: an index opened (its parts found, every size checked against the
//! others and the manifest, anything inconsistent refused before the first query can read
//! garbage), its parts' memory-mapped lookups (`part`, `rank_samples`, `next_table`), and its
//! queries (`query`, `next_tokens`, `short_counts`).

pub mod next_table;
pub mod next_tokens;
pub mod part;
pub mod query;
pub mod rank_samples;
pub(crate) mod short_counts;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::index::format::{Manifest, PartPaths, TokenWidth, MANIFEST_FILE, TOKENIZER_FILE};
use crate::index::read::next_table::NextTable;
use crate::index::read::part::Part;
use crate::index::read::short_counts::ShortCounts;
use crate::index::{IndexError, Result};
use crate::tokenizer::Tokenizer;

/// What the caller knows or expects of an index. With a manifest each given value must agree with it;
/// without one (an index written by the reference indexer) they say what the files cannot.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    pub token_width: Option<TokenWidth>,
    pub eos_token_id: Option<u32>,
    pub vocab_size: Option<u64>,
    /// The tokenizer fingerprint the caller pairs the index with (e.g. its model's).
    pub tokenizer_fingerprint: Option<String>,
    /// Recompute every file's checksum (reads the whole index).
    pub verify_checksums: bool,
    /// Keep every 32nd suffix's first 16 bytes in RAM (`index::read::rank_samples`): faster searches
    /// for 0.5 bytes a token and a read of every 32nd suffix at open.
    pub sample_ranks: bool,
}

pub struct Index {
    dir: PathBuf,
    pub(crate) parts: Vec<Part>,
    width: TokenWidth,
    eos_token_id: u32,
    vocab_size: u64,
    manifest: Option<Manifest>,
    tokenizer: Option<Tokenizer>,
    /// What follows the empty prompt (every token's count), once asked: the last back-off level
    /// of every context, too long a walk to repeat (`index::backoff`).
    pub(crate) unigram: OnceLock<BTreeMap<u32, u64>>,
    /// Counts of the shortest patterns, as they are found.
    pub(crate) short_counts: ShortCounts,
}

fn part_count(dir: &Path) -> usize {
    (0..)
        .take_while(|&n| PartPaths::new(dir, n).tokenized.exists())
        .count()
}

fn mismatch<T: PartialEq + std::fmt::Debug>(
    what: &str,
    given: Option<T>,
    recorded: T,
) -> Result<()> {
    match given {
        Some(g) if g != recorded => Err(IndexError::Mismatch(format!(
            "{what} is {recorded:?} in the index, but {g:?} was asked for"
        ))),
        _ => Ok(()),
    }
}

impl Index {
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Self> {
        if !dir.is_dir() {
            return Err(IndexError::Invalid(format!(
                "{}: no such index folder",
                dir.display()
            )));
        }
        let manifest = Manifest::read(dir)?;
        let n_parts = part_count(dir);
        if n_parts == 0 && crate::index::fm::is_compressed(dir) {
            return Err(IndexError::Invalid(format!(
                "{}: a compressed index (`index compress`): this needs a suffix-array index; use \
                 the index it was compressed from (the README's table of entry points says which \
                 take either)",
                dir.display()
            )));
        }
        if n_parts == 0 {
            return Err(IndexError::Invalid(format!(
                "{}: no tokenized.0 in this folder: not an index",
                dir.display()
            )));
        }
        let (width, eos_token_id, vocab_size) = match &manifest {
            Some(m) => {
                mismatch("token width", opts.token_width, m.token_width)?;
                mismatch("eos token id", opts.eos_token_id, m.eos_token_id)?;
                mismatch("vocabulary size", opts.vocab_size, m.vocab_size)?;
                if m.parts.len() != n_parts {
                    return Err(IndexError::Corrupt(format!(
                        "manifest lists {} parts, the folder holds {n_parts}",
                        m.parts.len()
                    )));
                }
                (m.token_width, m.eos_token_id, m.vocab_size)
            }
            None => {
                let width = opts.token_width.unwrap_or(TokenWidth::U16);
                let eos = opts.eos_token_id.ok_or_else(|| {
                    IndexError::Invalid(format!(
                        "{}: no {MANIFEST_FILE} (an index of the reference indexer?): give its eos token id (and token width if not u16)",
                        dir.display()
                    ))
                })?;
                (width, eos, opts.vocab_size.unwrap_or(width.capacity() - 1))
            }
        };
        width.check_vocab(vocab_size, eos_token_id)?;

        let mut parts = Vec::with_capacity(n_parts);
        for n in 0..n_parts {
            let paths = PartPaths::new(dir, n);
            if let Some(m) = &manifest {
                check_recorded_files(&paths, &m.parts[n].files, opts.verify_checksums)?;
            }
            let mut part = Part::open(&paths, width)?;
            if opts.sample_ranks {
                part.sample_ranks();
            }
            if paths.next_tokens.exists() {
                let table = NextTable::open(&paths.next_tokens, &part, vocab_size, eos_token_id)?;
                part.set_next_table(table);
            }
            if let Some(m) = &manifest {
                let rec = &m.parts[n];
                if rec.tokens != part.tok_cnt() || rec.documents != part.doc_cnt() {
                    return Err(IndexError::Corrupt(format!(
                        "part {n}: token or document count differs from the manifest"
                    )));
                }
            }
            parts.push(part);
        }

        let tokenizer = open_tokenizer(dir, manifest.as_ref())?;
        let recorded_fp = manifest
            .as_ref()
            .and_then(|m| m.tokenizer.as_ref())
            .map(|t| t.fingerprint.clone());
        if let Some(wanted) = &opts.tokenizer_fingerprint {
            match &recorded_fp {
                Some(fp) if fp == wanted => {}
                Some(fp) => {
                    return Err(IndexError::Mismatch(format!(
                        "the index was built with tokenizer {fp}, but the caller's tokenizer is {wanted}: ids would not mean the same tokens"
                    )))
                }
                None => return Err(IndexError::Mismatch("the index records no tokenizer, so it cannot be paired with one".into())),
            }
        }
        Ok(Index {
            dir: dir.to_path_buf(),
            parts,
            width,
            eos_token_id,
            vocab_size,
            manifest,
            tokenizer,
            unigram: OnceLock::new(),
            short_counts: ShortCounts::default(),
        })
    }

    /// One index over the parts of several, in order (the shards of a set): what a single
    /// sidecar over all of them would answer. They must agree on what a token id means.
    pub fn join(parts: Vec<Index>) -> Result<Self> {
        let mut parts = parts.into_iter();
        let mut joined = parts
            .next()
            .ok_or_else(|| IndexError::Invalid("no index to join".into()))?;
        let fingerprint = |i: &Index| i.tokenizer.as_ref().map(|t| t.fingerprint().to_string());
        for part in parts {
            let same = part.width == joined.width
                && part.eos_token_id == joined.eos_token_id
                && part.vocab_size == joined.vocab_size
                && fingerprint(&part) == fingerprint(&joined);
            if !same {
                return Err(IndexError::Mismatch(format!(
                    "{} and {} differ in token width, eos, vocabulary or tokenizer",
                    joined.dir.display(),
                    part.dir.display()
                )));
            }
            joined.parts.extend(part.parts);
        }
        joined.manifest = None;
        joined.unigram = OnceLock::new();
        joined.short_counts = ShortCounts::default();
        Ok(joined)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn width(&self) -> TokenWidth {
        self.width
    }
    pub fn eos_token_id(&self) -> u32 {
        self.eos_token_id
    }
    pub fn vocab_size(&self) -> u64 {
        self.vocab_size
    }
    pub fn manifest(&self) -> Option<&Manifest> {
        self.manifest.as_ref()
    }
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }
    pub fn num_parts(&self) -> usize {
        self.parts.len()
    }
    /// Tokens of all parts, separators included (the count of the empty n-gram).
    pub fn total_tokens(&self) -> u64 {
        self.parts.iter().map(|s| s.tok_cnt()).sum()
    }
    pub fn total_documents(&self) -> u64 {
        self.parts.iter().map(|s| s.doc_cnt()).sum()
    }

    /// Touches every page once (see `Part::warm_up`).
    pub fn warm_up(&self) -> u64 {
        self.parts
            .iter()
            .map(|s| s.warm_up())
            .fold(0, u64::wrapping_add)
    }
}

/// Checks the files of one part against the manifest's records: every file the part has (the
/// metadata pair when either is there) must have a record, so `verify` checks every byte it serves.
fn check_recorded_files(
    paths: &PartPaths,
    records: &[crate::index::format::FileRecord],
    checksums: bool,
) -> Result<()> {
    let [tokenized, table, offset, metadata, metaoff, next_tokens] = paths.all();
    let has_metadata = metadata.exists() || metaoff.exists();
    let expected = [tokenized, table, offset]
        .into_iter()
        .chain(
            has_metadata
                .then_some([metadata, metaoff])
                .into_iter()
                .flatten(),
        )
        .chain(next_tokens.exists().then_some(next_tokens));
    for path in expected {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !records.iter().any(|r| r.name == name) {
            return Err(IndexError::Corrupt(format!(
                "the manifest has no record of {}: its size and checksum cannot be checked",
                path.display()
            )));
        }
    }
    for record in records {
        let path = paths.tokenized.with_file_name(&record.name);
        if !paths.all().iter().any(|p| **p == path) {
            return Err(IndexError::Corrupt(format!(
                "manifest names an unexpected file {}",
                record.name
            )));
        }
        let len = std::fs::metadata(&path)
            .map_err(|e| IndexError::io(&path, e))?
            .len();
        if len != record.bytes {
            return Err(IndexError::Corrupt(format!(
                "{}: {len} bytes, the manifest says {}",
                path.display(),
                record.bytes
            )));
        }
        if checksums {
            let actual = crate::index::format::FileRecord::of(&path)?;
            if actual.xxh3 != record.xxh3 {
                return Err(IndexError::Corrupt(format!(
                    "{}: checksum {} differs from the manifest's {}",
                    path.display(),
                    actual.xxh3,
                    record.xxh3
                )));
            }
        }
    }
    Ok(())
}

fn open_tokenizer(dir: &Path, manifest: Option<&Manifest>) -> Result<Option<Tokenizer>> {
    let path = dir.join(TOKENIZER_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let tokenizer = Tokenizer::from_file(&path)
        .map_err(|e| IndexError::Corrupt(format!("{}: {e}", path.display())))?;
    if let Some(record) = manifest.and_then(|m| m.tokenizer.as_ref()) {
        if record.fingerprint != tokenizer.fingerprint() {
            return Err(IndexError::Corrupt(format!(
                "{}: fingerprint {} differs from the manifest's {}: the tokenizer file was replaced",
                path.display(),
                tokenizer.fingerprint(),
                record.fingerprint
            )));
        }
    }
    Ok(Some(tokenizer))
}

impl Index {
    /// Checks that every document offset points at a separator, in increasing order (reads all offsets).
    pub fn verify_documents(&self) -> Result<()> {
        let (w, sep) = (self.width.bytes(), self.width.separator());
        for (n, part) in self.parts.iter().enumerate() {
            let mut prev = None;
            for doc in 0..part.doc_cnt() {
                let start = part.doc_start(doc);
                // Aligned and inside the part before the token there is read.
                let ok = start < part.ds_size()
                    && start.is_multiple_of(w as u64)
                    && prev.is_none_or(|p| p < start)
                    && self.width.read(part.token_bytes(), start as usize) == sep;
                if !ok {
                    return Err(IndexError::Corrupt(format!(
                        "part {n}: document {doc} does not start at a separator"
                    )));
                }
                prev = Some(start);
            }
        }
        Ok(())
    }
}
