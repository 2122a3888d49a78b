//! Building an index: documents are read as a stream, tokenized in parallel batches, and packed into
//! shards small enough for the memory budget; each shard's suffix array is built in RAM with libsais and
//! written next to its tokens. Everything goes to a `.partial` folder renamed into place at the end, so an
//! interrupted or failed build leaves nothing that looks like an index.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::corpus::{Content, InputDoc};
use crate::index::decontam::Decontaminator;
use crate::index::format::{
    ptr_size_for, DecontaminationRecord, FileRecord, Manifest, ShardPaths, ShardRecord, TokenWidth,
    TokenizerRecord, FORMAT_NAME, FORMAT_VERSION, TOKENIZER_FILE,
};
use crate::index::sa::{write_table, TokenBuf, MAX_SHARD_TOKENS};
use crate::index::{IndexError, Result};
use crate::progress;
use crate::tokenizer::Tokenizer;

pub struct BuildOptions<'a> {
    pub out: PathBuf,
    pub width: TokenWidth,
    pub eos_token_id: u32,
    pub vocab_size: u64,
    /// Needed for text input; recorded (fingerprint and a copy) in the index.
    pub tokenizer: Option<&'a Tokenizer>,
    /// Peak memory the build may use, in bytes; decides the shard size.
    pub memory_budget: u64,
    /// Hard cap on tokens per shard (mostly for tests), on top of the budget.
    pub max_shard_tokens: Option<u64>,
    pub threads: usize,
    /// Replace an existing index at `out`.
    pub force: bool,
    /// Total input bytes, when known, for the progress bar.
    pub input_bytes: u64,
    /// Drop documents that overlap the evaluation data.
    pub decontaminate: Option<&'a Decontaminator>,
}

impl<'a> BuildOptions<'a> {
    /// Options for an index at `out` with an 8 GiB budget, all cores, no tokenizer; set the rest as needed.
    pub fn new(out: PathBuf, width: TokenWidth, eos_token_id: u32, vocab_size: u64) -> Self {
        BuildOptions {
            out,
            width,
            eos_token_id,
            vocab_size,
            tokenizer: None,
            memory_budget: 8 << 30,
            max_shard_tokens: None,
            threads: rayon::current_num_threads(),
            force: false,
            input_bytes: 0,
            decontaminate: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BuildReport {
    pub out: String,
    pub shards: usize,
    pub documents: u64,
    /// Tokens, separators excluded.
    pub tokens: u64,
    pub bytes_on_disk: u64,
    pub bytes_per_token: f64,
    pub peak_rss_bytes: u64,
    pub peak_bytes_per_token: f64,
    pub seconds_tokenize: f64,
    pub seconds_suffix_array: f64,
    pub seconds_total: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decontamination: Option<DecontaminationRecord>,
}

/// Bytes per token while a shard's suffix array is built: its tokens plus the 32-bit array.
fn build_bytes_per_token(width: TokenWidth) -> u64 {
    width.bytes() as u64 + 4
}

/// Memory kept aside from the budget for batches, buffers and the program itself.
const RESERVED_BYTES: u64 = 192 << 20;
/// Text bytes tokenized per parallel batch.
const BATCH_BYTES: u64 = 8 << 20;

pub fn shard_token_limit(opts: &BuildOptions) -> Result<u64> {
    let usable = opts.memory_budget.saturating_sub(RESERVED_BYTES);
    let limit = (usable / build_bytes_per_token(opts.width)).min(MAX_SHARD_TOKENS);
    let limit = opts.max_shard_tokens.map_or(limit, |cap| limit.min(cap));
    if limit < 2 {
        return Err(IndexError::Invalid(format!(
            "a memory budget of {} MiB leaves no room for a shard (at least {} MiB needed)",
            opts.memory_budget >> 20,
            (RESERVED_BYTES >> 20) + 1
        )));
    }
    Ok(limit)
}

/// One shard being filled.
struct ShardBuilder {
    tokens: TokenBuf,
    offsets: Vec<u64>,
    metadata: Vec<u8>,
    metaoffs: Vec<u64>,
    has_metadata: bool,
}

impl ShardBuilder {
    fn new(width: TokenWidth) -> Self {
        ShardBuilder {
            tokens: TokenBuf::new(width),
            offsets: Vec::new(),
            metadata: Vec::new(),
            metaoffs: Vec::new(),
            has_metadata: false,
        }
    }

    fn push(&mut self, width: TokenWidth, tokens: &[u32], metadata: Option<&str>) {
        self.offsets
            .push(self.tokens.len() as u64 * width.bytes() as u64);
        self.tokens.extend(&[width.separator()]);
        self.tokens.extend(tokens);
        self.metaoffs.push(self.metadata.len() as u64);
        self.has_metadata |= metadata.is_some();
        self.metadata
            .extend_from_slice(metadata.unwrap_or("{}").as_bytes());
        self.metadata.push(b'\n');
    }

    /// Writes the shard's files and returns their record.
    fn finish(
        self,
        dir: &Path,
        n: usize,
        width: TokenWidth,
        threads: usize,
    ) -> Result<ShardRecord> {
        let paths = ShardPaths::new(dir, n);
        let tok_cnt = self.tokens.len() as u64;
        let documents = self.offsets.len() as u64;
        write_with(&paths.tokenized, |f| self.tokens.write_le(f))?;
        write_with(&paths.offset, |f| {
            self.offsets
                .iter()
                .try_for_each(|o| f.write_all(&o.to_le_bytes()))
        })?;
        let mut names = vec![&paths.tokenized, &paths.offset];
        if self.has_metadata {
            write_with(&paths.metadata, |f| f.write_all(&self.metadata))?;
            write_with(&paths.metaoff, |f| {
                self.metaoffs
                    .iter()
                    .try_for_each(|o| f.write_all(&o.to_le_bytes()))
            })?;
            names.extend([&paths.metadata, &paths.metaoff]);
        }
        drop((self.offsets, self.metadata, self.metaoffs));

        let bar = progress::spinner(format!("shard {n}: suffix array of {tok_cnt} tokens"));
        let sa = self
            .tokens
            .into_suffix_array(threads.min(u16::MAX as usize) as u16)?;
        bar.finish_and_clear();
        let ptr_size = ptr_size_for(tok_cnt * width.bytes() as u64);
        write_with(&paths.table, |f| write_table(&sa, width, ptr_size, f))?;
        drop(sa);
        names.push(&paths.table);
        let files = names
            .into_iter()
            .map(|p| FileRecord::of(p))
            .collect::<Result<Vec<_>>>()?;
        tracing::info!(shard = n, documents, tokens = tok_cnt, "shard written");
        Ok(ShardRecord {
            documents,
            tokens: tok_cnt,
            files,
        })
    }
}

fn write_with(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<()> {
    let file = File::create(path).map_err(|e| IndexError::io(path, e))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    body(&mut out)
        .and_then(|_| out.flush())
        .map_err(|e| IndexError::io(path, e))
}

/// Tokens of a batch of documents, in parallel; pre-tokenized documents pass through.
fn tokenize_batch(
    batch: Vec<InputDoc>,
    tokenizer: Option<&Tokenizer>,
) -> Result<Vec<(Vec<u32>, Option<String>)>> {
    batch
        .into_par_iter()
        .map(|doc| {
            let tokens = match doc.content {
                Content::Tokens(t) => t,
                Content::Text(text) => tokenizer
                    .ok_or_else(|| {
                        IndexError::Invalid("text input needs a tokenizer (--tokenizer)".into())
                    })?
                    .encode(&text)
                    .map_err(|e| IndexError::Invalid(e.to_string()))?,
            };
            Ok((tokens, doc.metadata))
        })
        .collect()
}

fn partial_dir(out: &Path) -> PathBuf {
    let mut name = out
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".partial-{}", std::process::id()));
    out.with_file_name(name)
}

/// Builds an index at `opts.out` from `docs`.
pub fn build(
    docs: impl Iterator<Item = Result<InputDoc>>,
    opts: &BuildOptions,
) -> Result<BuildReport> {
    if opts.out.exists() && !opts.force {
        return Err(IndexError::Invalid(format!(
            "{} exists: remove it or pass --force",
            opts.out.display()
        )));
    }
    if opts.vocab_size > opts.width.capacity() || opts.eos_token_id as u64 >= opts.vocab_size {
        return Err(IndexError::Invalid(format!(
            "vocabulary size {} with eos id {} does not fit {}-byte tokens",
            opts.vocab_size,
            opts.eos_token_id,
            opts.width.bytes()
        )));
    }
    let work = partial_dir(&opts.out);
    std::fs::create_dir_all(&work).map_err(|e| IndexError::io(&work, e))?;
    let result = build_into(docs, opts, &work);
    match result {
        Ok(mut report) => {
            if opts.out.exists() {
                std::fs::remove_dir_all(&opts.out).map_err(|e| IndexError::io(&opts.out, e))?;
            }
            std::fs::rename(&work, &opts.out).map_err(|e| IndexError::io(&opts.out, e))?;
            report.out = opts.out.display().to_string();
            Ok(report)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&work);
            Err(e)
        }
    }
}

fn build_into(
    docs: impl Iterator<Item = Result<InputDoc>>,
    opts: &BuildOptions,
    dir: &Path,
) -> Result<BuildReport> {
    let started = Instant::now();
    let limit = shard_token_limit(opts)?;
    let width = opts.width;
    let bar = progress::bytes_bar(opts.input_bytes, "tokenize");
    let mut shards: Vec<ShardRecord> = Vec::new();
    let mut current = ShardBuilder::new(width);
    let mut seconds_sa = 0.0;
    let mut docs = docs.peekable();
    let mut decontamination = opts.decontaminate.map(Decontaminator::record);

    while docs.peek().is_some() {
        if crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted);
        }
        let mut batch = Vec::new();
        let mut batch_bytes = 0;
        while batch_bytes < BATCH_BYTES {
            match docs.next() {
                Some(doc) => {
                    let doc = doc?;
                    batch_bytes += doc.input_bytes;
                    batch.push(doc);
                }
                None => break,
            }
        }
        for (tokens, metadata) in tokenize_batch(batch, opts.tokenizer)? {
            if let Some(bad) = tokens.iter().find(|&&t| t as u64 >= opts.vocab_size) {
                return Err(IndexError::Invalid(format!(
                    "token {bad} is outside the vocabulary (size {})",
                    opts.vocab_size
                )));
            }
            if let (Some(d), Some(record)) = (opts.decontaminate, decontamination.as_mut()) {
                if d.is_contaminated(&tokens) {
                    record.documents_dropped += 1;
                    record.tokens_dropped += tokens.len() as u64;
                    continue;
                }
            }
            let needed = tokens.len() as u64 + 1;
            if needed > limit {
                return Err(IndexError::Invalid(format!("a document of {needed} tokens does not fit a shard of {limit} tokens: raise the memory budget")));
            }
            if current.tokens.len() as u64 + needed > limit {
                let t = Instant::now();
                let full = std::mem::replace(&mut current, ShardBuilder::new(width));
                shards.push(bar.suspend(|| full.finish(dir, shards.len(), width, opts.threads))?);
                seconds_sa += t.elapsed().as_secs_f64();
            }
            current.push(width, &tokens, metadata.as_deref());
        }
        bar.inc(batch_bytes);
    }
    bar.finish_and_clear();
    if current.tokens.is_empty() && shards.is_empty() {
        return Err(IndexError::Invalid("the input holds no documents".into()));
    }
    let seconds_tokenize = started.elapsed().as_secs_f64() - seconds_sa;
    if !current.tokens.is_empty() {
        let t = Instant::now();
        shards.push(current.finish(dir, shards.len(), width, opts.threads)?);
        seconds_sa += t.elapsed().as_secs_f64();
    }

    let tokenizer = match opts.tokenizer {
        Some(t) => {
            let path = dir.join(TOKENIZER_FILE);
            let json = t
                .to_json()
                .map_err(|e| IndexError::Invalid(e.to_string()))?;
            std::fs::write(&path, json).map_err(|e| IndexError::io(&path, e))?;
            Some(TokenizerRecord {
                fingerprint: t.fingerprint().to_string(),
                source: t.source().to_string(),
            })
        }
        None => None,
    };
    let documents: u64 = shards.iter().map(|s| s.documents).sum();
    let tokens: u64 = shards.iter().map(|s| s.tokens).sum::<u64>() - documents;
    let bytes_on_disk: u64 = shards.iter().flat_map(|s| &s.files).map(|f| f.bytes).sum();
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        format_version: FORMAT_VERSION,
        token_width: width,
        eos_token_id: opts.eos_token_id,
        vocab_size: opts.vocab_size,
        tokenizer,
        documents,
        tokens,
        shards,
        built_by: concat!("infini-sidecar ", env!("CARGO_PKG_VERSION")).into(),
        decontamination: decontamination.clone(),
    };
    manifest.write(dir)?;
    let peak = progress::peak_rss_bytes();
    let per_token = |b: u64| {
        if tokens == 0 {
            0.0
        } else {
            b as f64 / tokens as f64
        }
    };
    Ok(BuildReport {
        out: dir.display().to_string(),
        shards: manifest.shards.len(),
        documents,
        tokens,
        bytes_on_disk,
        bytes_per_token: per_token(bytes_on_disk),
        peak_rss_bytes: peak,
        peak_bytes_per_token: per_token(peak),
        seconds_tokenize,
        seconds_suffix_array: seconds_sa,
        seconds_total: started.elapsed().as_secs_f64(),
        decontamination,
    })
}

/// The vocabulary values a build was given; [`GivenVocabulary::resolve`] fills in the rest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GivenVocabulary {
    pub vocab_size: Option<u64>,
    pub token_width_bits: Option<u32>,
    pub eos_token_id: Option<u32>,
}

/// An index's vocabulary: how many ids, how wide a token is on disk, which id ends a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vocabulary {
    pub vocab_size: u64,
    pub width: TokenWidth,
    pub eos_token_id: u32,
}

impl GivenVocabulary {
    /// What was given, else the tokenizer's vocabulary size and eos id; without a tokenizer (a
    /// pre-tokenized input, `from_tokens`) every id of the token width but the separator. The width
    /// defaults to the narrowest that holds the vocabulary.
    pub fn resolve(self, tokenizer: Option<&Tokenizer>, from_tokens: bool) -> Result<Vocabulary> {
        let vocab_size = match (self.vocab_size, tokenizer) {
            (Some(v), _) => v,
            (None, Some(t)) => t.vocab_size(),
            (None, None) => {
                let bits = self.token_width_bits.ok_or_else(|| {
                    IndexError::Invalid("--from-tokens needs --token-width".into())
                })?;
                TokenWidth::from_bits(bits)?.capacity() - 1
            }
        };
        let width = match self.token_width_bits {
            Some(bits) => TokenWidth::from_bits(bits)?,
            None => TokenWidth::for_vocab(vocab_size),
        };
        let eos_token_id = match (
            self.eos_token_id,
            tokenizer.and_then(Tokenizer::eos_token_id),
        ) {
            (Some(e), _) | (None, Some(e)) => e,
            (None, None) if from_tokens => {
                return Err(IndexError::Invalid(
                    "--from-tokens needs --eos-id (the reference engine needs it too)".into(),
                ))
            }
            (None, None) => {
                return Err(IndexError::Invalid(
                    "the tokenizer names no eos token: pass --eos-id".into(),
                ))
            }
        };
        Ok(Vocabulary {
            vocab_size,
            width,
            eos_token_id,
        })
    }
}

#[cfg(test)]
mod vocabulary_tests {
    use super::*;

    /// A word-level tokenizer over `vocab` (`</s>`, when there, ends documents).
    fn tokenizer(dir: &Path, vocab: serde_json::Value) -> Tokenizer {
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "a"},
        });
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, json.to_string()).unwrap();
        Tokenizer::from_file(&path).unwrap()
    }

    fn given(vocab: Option<u64>, bits: Option<u32>, eos: Option<u32>) -> GivenVocabulary {
        GivenVocabulary {
            vocab_size: vocab,
            token_width_bits: bits,
            eos_token_id: eos,
        }
    }

    fn vocabulary(vocab_size: u64, width: TokenWidth, eos_token_id: u32) -> Vocabulary {
        Vocabulary {
            vocab_size,
            width,
            eos_token_id,
        }
    }

    #[test]
    fn the_tokenizer_fills_what_was_not_given() {
        let dir = tempfile::tempdir().unwrap();
        let t = tokenizer(dir.path(), serde_json::json!({"a": 0, "b": 1, "</s>": 2}));
        let t = Some(&t);
        let all = |g: GivenVocabulary| g.resolve(t, false).unwrap();
        assert_eq!(
            all(given(None, None, None)),
            vocabulary(3, TokenWidth::U8, 2)
        );
        assert_eq!(
            all(given(None, Some(16), None)),
            vocabulary(3, TokenWidth::U16, 2)
        );
        assert_eq!(
            all(given(Some(300), None, Some(7))),
            vocabulary(300, TokenWidth::U16, 7)
        );
        assert_eq!(
            all(given(Some(70_000), None, None)),
            vocabulary(70_000, TokenWidth::U32, 2)
        );
    }

    #[test]
    fn a_token_file_needs_a_width_and_an_eos_id() {
        let tokens = |g: GivenVocabulary| g.resolve(None, true);
        assert_eq!(
            tokens(given(None, Some(16), Some(0))).unwrap(),
            vocabulary(65_535, TokenWidth::U16, 0)
        );
        assert_eq!(
            tokens(given(Some(100), None, Some(0))).unwrap(),
            vocabulary(100, TokenWidth::U8, 0)
        );
        let err = tokens(given(None, None, Some(0))).unwrap_err().to_string();
        assert!(err.contains("--token-width"), "{err}");
        let err = tokens(given(None, Some(16), None)).unwrap_err().to_string();
        assert!(err.contains("--eos-id"), "{err}");
        assert!(tokens(given(None, Some(12), Some(0))).is_err());
    }

    #[test]
    fn a_tokenizer_without_eos_needs_an_eos_id() {
        let dir = tempfile::tempdir().unwrap();
        let t = tokenizer(dir.path(), serde_json::json!({"a": 0, "b": 1}));
        let err = given(None, None, None)
            .resolve(Some(&t), false)
            .unwrap_err();
        assert!(err.to_string().contains("names no eos token"), "{err}");
        let v = given(None, None, Some(1)).resolve(Some(&t), false).unwrap();
        assert_eq!(v, vocabulary(2, TokenWidth::U8, 1));
    }
}
