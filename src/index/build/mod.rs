//! Building an index: documents are read as a stream, tokenized in parallel batches, and packed into
//! parts small enough for the memory budget; each part's suffix array is built in RAM with libsais and
//! written next to its tokens. Everything goes to a `.partial` folder renamed into place at the end, so an
//! interrupted or failed build leaves nothing that looks like an index.
//!
//! What is at the output path decides what a build may do there ([`check_out`]): nothing is built over
//! the working folder, one of its parents or the root; `force` replaces only an empty folder or an index
//! folder (every entry a file an index build writes, and a manifest or `tokenized.0` among them), never a
//! plain file, a link or a folder holding anything else. `.partial-PID` folders that a killed build left
//! beside the output are removed when their process is gone and they hold only index files.

pub mod decontam;
pub mod next_table;
pub mod sa;
pub mod token_file;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::corpus::{Content, InputDoc};
use crate::index::build::decontam::Decontaminator;
use crate::index::build::sa::{write_table, TokenBuf, MAX_PART_TOKENS};
use crate::index::fm::{self, PartText, PartWriter};
use crate::index::format::{
    is_index_file, ptr_size_for, DecontaminationRecord, FileRecord, Manifest, PartPaths,
    PartRecord, TokenWidth, TokenizerRecord, FIRST_FORMAT_VERSION, FORMAT_NAME, FORMAT_VERSION,
    MANIFEST_FILE, TOKENIZER_FILE,
};
use crate::index::format::{NextTableSpec, ShardSetRecord};
use crate::index::read::part::Part;
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
    /// Peak memory the build may use, in bytes; decides the part size. Tokenizing takes up to about
    /// 32 MB per thread on top (texts are encoded in pieces of `tokenizer::PIECE_BYTES`).
    pub memory_budget: u64,
    /// Hard cap on tokens per part (mostly for tests), on top of the budget.
    pub max_part_tokens: Option<u64>,
    pub threads: usize,
    /// Replace an existing index at `out`.
    pub force: bool,
    /// Total input bytes, when known, for the progress bar.
    pub input_bytes: u64,
    /// Drop documents that overlap the evaluation data.
    pub decontaminate: Option<&'a Decontaminator>,
    /// Write each part's next-token table of frequent short prompts (`next_table`), or not.
    pub next_table: Option<NextTableSpec>,
    /// Recorded in the manifest when this build is one shard of a set (`cluster::split`).
    pub shard_set: Option<ShardSetRecord>,
    /// Build a compressed index (an FM-index per part, `index::fm`) with every this-many-th
    /// position sampled, instead of a suffix-array index: no suffix array is kept or written.
    pub compressed: Option<u64>,
    /// Show progress (a terminal's bars, or lines in the log). Off for builds too small and too
    /// frequent to report, such as the live index's runs: each shown spinner ticks on a thread of
    /// its own, and a live soak started 6,700 of them in 40 s (eval/SERVICE.md, stop 78).
    pub progress: bool,
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
            max_part_tokens: None,
            threads: rayon::current_num_threads(),
            force: false,
            input_bytes: 0,
            decontaminate: None,
            next_table: Some(NextTableSpec::default()),
            shard_set: None,
            compressed: None,
            progress: true,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BuildReport {
    pub out: String,
    #[serde(rename = "shards")]
    pub parts: usize,
    pub documents: u64,
    /// Tokens, separators excluded.
    pub tokens: u64,
    pub bytes_on_disk: u64,
    pub bytes_per_token: f64,
    pub peak_rss_bytes: u64,
    pub peak_bytes_per_token: f64,
    pub seconds_tokenize: f64,
    pub seconds_suffix_array: f64,
    pub seconds_next_token_table: f64,
    pub seconds_total: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decontamination: Option<DecontaminationRecord>,
}

/// Bytes per token a part needs at its peak: while it is sorted, its tokens plus the 32-bit
/// suffix array. A compressed part's sorter (the transform of 1- or 2-byte tokens) also writes the
/// row of every `sample_every`-th suffix (4 bytes each) and, for the reduced problem of its
/// recursion, may allocate a bucket array of its own: 0.24 bytes a token over 1.68 G bytes of
/// reversed Debian sources, where the peak passed an 8 GiB budget by 0.38 GiB before this was
/// counted (measured, not a bound). 4-byte tokens take their suffix array and two more copies, for
/// want of a sorter that gives their transform. After the sort a compressed part holds its
/// transform, 24 bytes a sample (rows, then rows with positions, sorted) and its tree's words raw
/// and compressed (each at most the transform's size): more than the sort only at rates below 8.
fn build_bytes_per_token(width: TokenWidth, compressed: Option<u64>) -> f64 {
    /// The compressed sorter's own bucket array, a token.
    const SORTER_OWN: f64 = 0.25;
    let w = width.bytes() as f64;
    let Some(rate) = compressed else {
        return w + 4.0;
    };
    let rate = rate as f64;
    let sorting = match width {
        TokenWidth::U32 => 16.0 + 8.0 / rate,
        _ => w + 4.0 + SORTER_OWN + 4.0 / rate,
    };
    let after = 3.0 * w + 24.0 / rate;
    sorting.max(after)
}

/// Memory kept aside from the budget for batches, buffers and the program itself.
const RESERVED_BYTES: u64 = 192 << 20;
/// Text bytes tokenized per parallel batch.
const BATCH_BYTES: u64 = 8 << 20;

/// Most tokens in one part (separators included): what the memory budget allows, capped by
/// `max_part_tokens`. A part needs room for a separator and one token.
pub fn part_token_limit(opts: &BuildOptions) -> Result<u64> {
    if let Some(cap) = opts.max_part_tokens.filter(|&cap| cap < 2) {
        return Err(IndexError::Invalid(format!(
            "a part cap of {cap} tokens (--max-part-tokens) leaves no room for a document: \
             a part needs at least 2 (a separator and one token)"
        )));
    }
    if let Some(rate) = opts.compressed {
        fm::check_sample_every(rate)?;
    }
    let usable = opts.memory_budget.saturating_sub(RESERVED_BYTES);
    let limit = ((usable as f64 / build_bytes_per_token(opts.width, opts.compressed)) as u64)
        .min(MAX_PART_TOKENS);
    if limit < 2 {
        return Err(IndexError::Invalid(format!(
            "a memory budget of {} MiB leaves no room for a part (at least {} MiB needed)",
            opts.memory_budget >> 20,
            (RESERVED_BYTES >> 20) + 1
        )));
    }
    Ok(opts.max_part_tokens.map_or(limit, |cap| limit.min(cap)))
}

/// What to raise when a document does not fit a part of `limit` tokens.
fn part_limit_source(opts: &BuildOptions, limit: u64) -> &'static str {
    if opts.max_part_tokens == Some(limit) {
        "--max-part-tokens"
    } else {
        "the memory budget (--memory-gib)"
    }
}

/// One part being filled.
struct PartBuilder {
    tokens: TokenBuf,
    offsets: Vec<u64>,
    metadata: Vec<u8>,
    metaoffs: Vec<u64>,
    has_metadata: bool,
}

impl PartBuilder {
    fn new(width: TokenWidth) -> Self {
        PartBuilder {
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

    /// Writes the part's files and returns their record, with the seconds its next-token table took.
    fn finish(self, dir: &Path, n: usize, opts: &BuildOptions) -> Result<(PartRecord, f64)> {
        let (width, threads) = (opts.width, opts.threads);
        let paths = PartPaths::new(dir, n);
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

        let bar = progress::spinner(
            format!("part {n}: suffix array of {tok_cnt} tokens"),
            opts.progress,
        );
        let sa = self
            .tokens
            .into_suffix_array(threads.min(u16::MAX as usize) as u16)?;
        bar.finish_and_clear();
        let ptr_size = ptr_size_for(tok_cnt * width.bytes() as u64);
        write_with(&paths.table, |f| write_table(&sa, width, ptr_size, f))?;
        drop(sa);
        names.push(&paths.table);
        let started = Instant::now();
        if let Some(spec) = &opts.next_table {
            let bar = progress::spinner(format!("part {n}: next-token table"), opts.progress);
            let part = Part::open(&paths, width)?;
            let entries = next_table::build(&part, opts.eos_token_id, spec, &paths.next_tokens)?;
            bar.finish_and_clear();
            names.push(&paths.next_tokens);
            tracing::info!(part = n, entries, "next-token table written");
        }
        let seconds_next_table = started.elapsed().as_secs_f64();
        let files = names
            .into_iter()
            .map(|p| FileRecord::of(p))
            .collect::<Result<Vec<_>>>()?;
        tracing::info!(part = n, documents, tokens = tok_cnt, "part written");
        let record = PartRecord {
            documents,
            tokens: tok_cnt,
            files,
        };
        Ok((record, seconds_next_table))
    }
}

impl PartBuilder {
    /// Builds and writes the part as a compressed index's (`last` when no part follows).
    fn finish_compressed(
        self,
        writer: &mut PartWriter,
        last: bool,
        progress: bool,
    ) -> Result<PartRecord> {
        let w = writer.width().bytes() as u64;
        let documents = self.offsets.len() as u64;
        let tokens = self.tokens.len() as u64;
        let metadata = self.has_metadata.then(|| {
            let ends = self
                .metaoffs
                .iter()
                .skip(1)
                .copied()
                .chain([self.metadata.len() as u64]);
            // Each line without its newline.
            self.metaoffs
                .iter()
                .zip(ends)
                .map(|(&from, to)| {
                    String::from_utf8_lossy(&self.metadata[from as usize..to as usize - 1])
                        .into_owned()
                })
                .collect()
        });
        let text = PartText {
            tokens: self.tokens,
            doc_starts: self.offsets.iter().map(|o| o / w).collect(),
            metadata,
        };
        let n = writer.written();
        let bar = progress::spinner(format!("part {n}: transform of {tokens} tokens"), progress);
        writer.write(text, last)?;
        bar.finish_and_clear();
        tracing::info!(part = n, documents, tokens, "compressed part written");
        Ok(PartRecord {
            documents,
            tokens,
            files: vec![FileRecord::of(&fm::part_file(writer.dir(), n))?],
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

/// Work folders of builds into `out` are named this prefix followed by the build's process id.
fn partial_prefix(out: &Path) -> String {
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    format!("{name}.partial-")
}

/// Refuses an output path a build must not touch, before any work: the working folder, one of its
/// parents or the root (whatever `force` says), an existing path without `force`, and with `force`
/// anything but an empty folder or an index folder ([`Contents`]).
fn check_out(out: &Path, force: bool) -> Result<()> {
    let refuse_cwd = || {
        IndexError::Invalid(format!(
            "--out {}: refusing to build over the current folder, one of its parents or the root; \
             name a folder of its own",
            out.display()
        ))
    };
    // `.`, `..`, `/` and paths ending in `..` have no final name to build beside.
    if out.file_name().is_none() {
        return Err(refuse_cwd());
    }
    let meta = match std::fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(IndexError::io(out, e)),
        Ok(meta) => meta,
    };
    if let (Ok(target), Ok(cwd)) = (
        out.canonicalize(),
        std::env::current_dir().and_then(|d| d.canonicalize()),
    ) {
        if cwd.starts_with(&target) {
            return Err(refuse_cwd());
        }
    }
    if !force {
        return Err(IndexError::Invalid(format!(
            "{} exists: remove it or pass --force",
            out.display()
        )));
    }
    if !meta.is_dir() {
        return Err(IndexError::Invalid(format!(
            "{} is not a folder (a file or a link): --force replaces only an index folder, so \
             nothing was changed; remove it yourself if it should go",
            out.display()
        )));
    }
    let contents = Contents::of(out)?;
    if let Some(name) = contents.foreign {
        return Err(IndexError::Invalid(format!(
            "{} holds {name}, which no index build writes: --force replaces only an index folder, \
             so nothing was changed",
            out.display()
        )));
    }
    if !contents.empty && !contents.marked {
        return Err(IndexError::Invalid(format!(
            "{} holds index-like files but neither {MANIFEST_FILE}, tokenized.0 nor fm.0: not an \
             index, so --force leaves it alone",
            out.display()
        )));
    }
    Ok(())
}

/// What a folder holds, as far as replacing it is concerned.
struct Contents {
    /// The first entry an index build does not write: a folder, a link, a file of another name.
    foreign: Option<String>,
    /// A manifest or `tokenized.0` is there: what marks an index.
    marked: bool,
    empty: bool,
}

impl Contents {
    fn of(dir: &Path) -> Result<Self> {
        let mut contents = Contents {
            foreign: None,
            marked: false,
            empty: true,
        };
        for entry in std::fs::read_dir(dir).map_err(|e| IndexError::io(dir, e))? {
            let entry = entry.map_err(|e| IndexError::io(dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let kind = entry
                .file_type()
                .map_err(|e| IndexError::io(&entry.path(), e))?;
            contents.empty = false;
            if !kind.is_file() || !is_index_file(&name) {
                contents.foreign = Some(name);
                break;
            }
            contents.marked |= [MANIFEST_FILE, "tokenized.0", "fm.0"].contains(&name.as_str());
        }
        Ok(contents)
    }
}

/// Whether process `pid` exists on this machine (one we may not signal exists too).
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes the `<out>.partial-PID` folders that builds killed before their cleanup left beside `out`:
/// those of processes that are gone (or of this very process, which has not started its own yet),
/// holding nothing but index files. Anything else is left alone.
fn remove_stale_partials(out: &Path) -> Result<()> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Ok(());
    };
    let prefix = partial_prefix(out);
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(&prefix)
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || (pid != std::process::id() && process_alive(pid)) {
            continue;
        }
        if !Contents::of(&path).is_ok_and(|c| c.foreign.is_none()) {
            tracing::warn!(path = %path.display(), "leaving a stale build folder that holds other files");
            continue;
        }
        std::fs::remove_dir_all(&path).map_err(|e| IndexError::io(&path, e))?;
        tracing::warn!(path = %path.display(), pid, "removed the work folder of a build that is gone");
    }
    Ok(())
}

/// Puts the finished `work` folder at `out`, replacing what is there only if [`check_out`] still
/// allows it: the build may have run for hours.
fn install(work: &Path, out: &Path, force: bool) -> Result<()> {
    check_out(out, force)?;
    if std::fs::symlink_metadata(out).is_ok() {
        std::fs::remove_dir_all(out).map_err(|e| IndexError::io(out, e))?;
    }
    std::fs::rename(work, out).map_err(|e| IndexError::io(out, e))
}

/// Builds an index at `opts.out` from `docs`.
pub fn build(
    docs: impl Iterator<Item = Result<InputDoc>>,
    opts: &BuildOptions,
) -> Result<BuildReport> {
    check_out(&opts.out, opts.force)?;
    opts.width.check_vocab(opts.vocab_size, opts.eos_token_id)?;
    let limit = part_token_limit(opts)?;
    remove_stale_partials(&opts.out)?;
    let work = opts.out.with_file_name(format!(
        "{}{}",
        partial_prefix(&opts.out),
        std::process::id()
    ));
    if let Some(parent) = work.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| IndexError::io(parent, e))?;
    }
    std::fs::create_dir(&work).map_err(|e| IndexError::io(&work, e))?;
    let result = build_into(docs, opts, &work, limit)
        .and_then(|report| install(&work, &opts.out, opts.force).map(|()| report));
    match result {
        Ok(mut report) => {
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
    limit: u64,
) -> Result<BuildReport> {
    let started = Instant::now();
    let width = opts.width;
    let bar = progress::bytes_bar(opts.input_bytes, "tokenize", opts.progress);
    let mut parts: Vec<PartRecord> = Vec::new();
    let mut current = PartBuilder::new(width);
    let mut seconds_sa = 0.0;
    let mut seconds_next_table = 0.0;
    let mut docs = docs.peekable();
    let mut decontamination = opts.decontaminate.map(Decontaminator::record);
    let vocabulary = (width, opts.eos_token_id, opts.vocab_size);
    let threads = opts.threads.clamp(1, u16::MAX as usize) as u16;
    let mut compressed = opts
        .compressed
        .map(|rate| PartWriter::new(dir, vocabulary, rate, threads));
    // Writes a full part, with the seconds its next-token table took.
    let mut finish = |part: PartBuilder, n: usize, last: bool| match compressed.as_mut() {
        Some(writer) => Ok((part.finish_compressed(writer, last, opts.progress)?, 0.0)),
        None => part.finish(dir, n, opts),
    };

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
        let tokenized = tokenize_batch(batch, opts.tokenizer)?;
        let contaminated: Vec<bool> = match opts.decontaminate {
            Some(d) => tokenized
                .par_iter()
                .map(|(tokens, _)| d.is_contaminated(tokens))
                .collect(),
            None => vec![false; tokenized.len()],
        };
        for ((tokens, metadata), contaminated) in tokenized.into_iter().zip(contaminated) {
            if let Some(bad) = tokens.iter().find(|&&t| t as u64 >= opts.vocab_size) {
                return Err(IndexError::Invalid(format!(
                    "token {bad} is outside the vocabulary (size {})",
                    opts.vocab_size
                )));
            }
            if let (true, Some(record)) = (contaminated, decontamination.as_mut()) {
                record.documents_dropped += 1;
                record.tokens_dropped += tokens.len() as u64;
                continue;
            }
            let needed = tokens.len() as u64 + 1;
            if needed > limit {
                return Err(IndexError::Invalid(format!(
                    "a document of {needed} tokens does not fit a part of {limit} tokens: raise {}",
                    part_limit_source(opts, limit)
                )));
            }
            if current.tokens.len() as u64 + needed > limit {
                let t = Instant::now();
                let full = std::mem::replace(&mut current, PartBuilder::new(width));
                let (record, seconds) = bar.suspend(|| finish(full, parts.len(), false))?;
                parts.push(record);
                seconds_sa += t.elapsed().as_secs_f64() - seconds;
                seconds_next_table += seconds;
            }
            current.push(width, &tokens, metadata.as_deref());
        }
        bar.inc(batch_bytes);
    }
    bar.finish_and_clear();
    if current.tokens.is_empty() && parts.is_empty() {
        return Err(IndexError::Invalid("the input holds no documents".into()));
    }
    let seconds_tokenize = started.elapsed().as_secs_f64() - seconds_sa - seconds_next_table;
    if !current.tokens.is_empty() {
        let t = Instant::now();
        let (record, seconds) = finish(current, parts.len(), true)?;
        parts.push(record);
        seconds_sa += t.elapsed().as_secs_f64() - seconds;
        seconds_next_table += seconds;
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
    let documents: u64 = parts.iter().map(|s| s.documents).sum();
    let tokens: u64 = parts.iter().map(|s| s.tokens).sum::<u64>() - documents;
    let bytes_on_disk: u64 = parts.iter().flat_map(|s| &s.files).map(|f| f.bytes).sum();
    let part_count = parts.len();
    // A compressed index keeps no manifest: its parts record their own shape and checksums.
    match (opts.compressed, &opts.shard_set) {
        (Some(_), Some(record)) => fm::write_shard_set(dir, record)?,
        (Some(_), None) => {}
        (None, _) => Manifest {
            format: FORMAT_NAME.into(),
            format_version: if opts.next_table.is_some() {
                FORMAT_VERSION
            } else {
                FIRST_FORMAT_VERSION
            },
            token_width: width,
            eos_token_id: opts.eos_token_id,
            vocab_size: opts.vocab_size,
            tokenizer,
            documents,
            tokens,
            parts,
            built_by: concat!("infini-sidecar ", env!("CARGO_PKG_VERSION")).into(),
            decontamination: decontamination.clone(),
            next_token_table: opts.next_table,
            shard_set: opts.shard_set.clone(),
        }
        .write(dir)?,
    }
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
        parts: part_count,
        documents,
        tokens,
        bytes_on_disk,
        bytes_per_token: per_token(bytes_on_disk),
        peak_rss_bytes: peak,
        peak_bytes_per_token: per_token(peak),
        seconds_tokenize,
        seconds_suffix_array: seconds_sa,
        seconds_next_token_table: seconds_next_table,
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

/// `count` documents for a test, each of up to `max_len` tokens drawn from `symbols`.
#[cfg(test)]
pub(crate) fn random_token_docs(
    rng: &mut impl rand::Rng,
    count: usize,
    max_len: usize,
    symbols: std::ops::Range<u32>,
) -> Vec<Vec<u32>> {
    (0..count)
        .map(|_| {
            (0..rng.random_range(0..max_len))
                .map(|_| rng.random_range(symbols.clone()))
                .collect()
        })
        .collect()
}

/// Builds an index of token documents, as `opts` says, for a test.
#[cfg(test)]
pub(crate) fn build_token_docs(docs: &[Vec<u32>], opts: &BuildOptions) {
    let input = docs.iter().map(|d| {
        Ok(InputDoc {
            content: Content::Tokens(d.clone()),
            metadata: None,
            input_bytes: 0,
        })
    });
    build(input, opts).unwrap();
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
