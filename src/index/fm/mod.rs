//! The compressed index: an FM-index per part (a Burrows-Wheeler transform in a Huffman-shaped
//! wavelet tree of compressed bit vectors, with sampled positions), built from a suffix-array
//! index's tokens and answering its count, n-gram, ∞-gram and document queries in a fraction of
//! its size (infini-gram mini's trade, `../shared/docs/founding/`). Why each part indexes its
//! text reversed is in [`part`].
//!
//! Its answers are the suffix-array index's, field for field, subsampled distributions included
//! (`query` says how), but for two documented ones: `find`'s rank ranges are this index's own
//! rows (their lengths agree for a non-empty query), and a draft's tokens after the first come
//! from other occurrences (`suffix`). A document search the suffix array would subsample is
//! refused (`docs`).

pub mod bits;
pub mod file;
pub mod part;
pub mod query;
pub mod suffix;
pub mod wavelet;

use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use crate::index::build::sa::TokenBuf;
use crate::index::docs::{DocumentIndex, DocumentPart};
use crate::index::fm::wavelet::WALKS;
use crate::index::format::{ShardSetRecord, TokenWidth, SHARD_SET_FILE, TOKENIZER_FILE};
use crate::index::query::check_vocabulary;
use crate::index::ranks::RankRange;
use crate::index::{Index, IndexError, Result};
use crate::tokenizer::Tokenizer;
use file::{recorded_checksum, WordReader, Words, MAGIC};
use part::FmPart;
pub use part::{check_sample_every, PartText, DEFAULT_SAMPLE_EVERY, SAMPLE_EVERY_RANGE};

/// The file of compressed part `n`.
pub fn part_file(dir: &Path, n: usize) -> PathBuf {
    dir.join(format!("fm.{n}"))
}

/// Whether `dir` holds a compressed index.
pub fn is_compressed(dir: &Path) -> bool {
    part_file(dir, 0).exists()
}

/// 2: lines of classes in the bit vectors, blocks past 32 ones coded by their zeros, the
/// sampling rate and window rows in each part, the part's number and whether it is the last.
const FORMAT_VERSION: u64 = 2;

pub struct CompressedIndex {
    dir: PathBuf,
    pub(crate) parts: Vec<FmPart>,
    pub(crate) width: TokenWidth,
    pub(crate) eos_token_id: u32,
    vocab_size: u64,
    tokenizer: Option<Tokenizer>,
    pub(crate) shard_set: Option<ShardSetRecord>,
    /// Its files' checksums hashed (see [`crate::cluster::partial::LocalParts::content_id`]).
    pub(crate) content_id: String,
}

/// Writes a compressed index's parts into a folder as they are built, one at a time, so a build
/// holds one part in memory. Each file records its number and whether it is the last, so a folder
/// missing a part does not open as a smaller index.
pub struct PartWriter<'a> {
    dir: &'a Path,
    width: TokenWidth,
    eos_token_id: u32,
    vocab_size: u64,
    sample_every: u64,
    threads: u16,
    written: usize,
}

impl<'a> PartWriter<'a> {
    pub fn new(
        dir: &'a Path,
        (width, eos_token_id, vocab_size): (TokenWidth, u32, u64),
        sample_every: u64,
        threads: u16,
    ) -> Self {
        PartWriter {
            dir,
            width,
            eos_token_id,
            vocab_size,
            sample_every,
            threads,
            written: 0,
        }
    }

    pub fn width(&self) -> TokenWidth {
        self.width
    }

    pub fn dir(&self) -> &Path {
        self.dir
    }

    /// Parts written so far: the number of the next.
    pub fn written(&self) -> usize {
        self.written
    }

    /// Builds the next part from `text` and writes it (`last` when no part follows); returns the
    /// file's bytes.
    pub fn write(&mut self, text: PartText, last: bool) -> Result<u64> {
        let built = FmPart::build(self.width, text, self.sample_every, self.threads)?;
        let mut words = Words::default();
        words.u64(MAGIC);
        words.u64(FORMAT_VERSION);
        words.u64(self.written as u64);
        words.u64(u64::from(last));
        words.u64(self.eos_token_id as u64);
        words.u64(self.vocab_size);
        built.write(&mut words);
        let path = part_file(self.dir, self.written);
        let bytes = words.into_bytes();
        std::fs::write(&path, &bytes).map_err(|e| IndexError::io(&path, e))?;
        self.written += 1;
        Ok(bytes.len() as u64)
    }
}

/// Writes the shard-set record beside a compressed index's parts (see [`SHARD_SET_FILE`]).
pub fn write_shard_set(dir: &Path, record: &ShardSetRecord) -> Result<()> {
    let path = dir.join(SHARD_SET_FILE);
    let json = serde_json::to_vec_pretty(record)
        .map_err(|e| IndexError::Invalid(format!("{}: {e}", path.display())))?;
    std::fs::write(&path, json).map_err(|e| IndexError::io(&path, e))
}

impl CompressedIndex {
    /// Builds the compressed form of `index` into `out` (a new folder), part by part with every
    /// `sample_every`-th position sampled, calling `progress` with each part's tokens once it is
    /// done. (`index::build` builds one from text directly.)
    pub fn build(
        index: &Index,
        out: &Path,
        (sample_every, threads): (u64, u16),
        mut progress: impl FnMut(u64),
    ) -> Result<Self> {
        if out.exists() {
            return Err(IndexError::Invalid(format!(
                "{}: already exists; a compressed index is written to a new folder",
                out.display()
            )));
        }
        // Written into a folder of its own, renamed once whole: an interrupted build leaves no
        // folder that opens as a smaller index.
        let mut partial = out.as_os_str().to_owned();
        partial.push(format!(".partial-{}", std::process::id()));
        let partial = PathBuf::from(partial);
        std::fs::create_dir_all(&partial).map_err(|e| IndexError::io(&partial, e))?;
        let built = Self::build_into(index, &partial, (sample_every, threads), &mut progress)
            .and_then(|()| std::fs::rename(&partial, out).map_err(|e| IndexError::io(out, e)));
        if built.is_err() {
            // Only the folder this build made.
            let _ = std::fs::remove_dir_all(&partial);
        }
        built?;
        Self::open(out)
    }

    fn build_into(
        index: &Index,
        out: &Path,
        (sample_every, threads): (u64, u16),
        progress: &mut impl FnMut(u64),
    ) -> Result<()> {
        let width = index.width();
        let w = width.bytes() as u64;
        let vocabulary = (width, index.eos_token_id(), index.vocab_size());
        let mut writer = PartWriter::new(out, vocabulary, sample_every, threads);
        for (n, part) in index.parts.iter().enumerate() {
            if crate::interrupt::interrupted() {
                return Err(IndexError::Interrupted);
            }
            let tokens = TokenBuf::from_le_bytes(width, part.token_bytes());
            let docs = 0..part.doc_cnt();
            let text = PartText {
                tokens,
                doc_starts: docs.clone().map(|d| part.doc_start(d) / w).collect(),
                metadata: part
                    .has_metadata()
                    .then(|| docs.map(|d| part.metadata(d).unwrap_or_default()).collect()),
            };
            let count = text.tokens.len() as u64;
            writer.write(text, n + 1 == index.num_parts())?;
            progress(count);
        }
        let tokenizer = index.dir().join(TOKENIZER_FILE);
        if tokenizer.exists() {
            let to = out.join(TOKENIZER_FILE);
            std::fs::copy(&tokenizer, &to).map_err(|e| IndexError::io(&to, e))?;
        }
        if let Some(record) = index.manifest().and_then(|m| m.shard_set.as_ref()) {
            write_shard_set(out, record)?;
        }
        Ok(())
    }

    /// Opens a compressed index, checking every part file's checksum and the agreement of its
    /// parts before any query can read them.
    pub fn open(dir: &Path) -> Result<Self> {
        let count = (0..).take_while(|&n| part_file(dir, n).exists()).count();
        if count == 0 {
            return Err(IndexError::Invalid(format!(
                "{}: no fm.0 in this folder: not a compressed index",
                dir.display()
            )));
        }
        let mut parts = Vec::with_capacity(count);
        let mut vocabulary = None;
        let mut content = Xxh3::new();
        for n in 0..count {
            let path = part_file(dir, n);
            let bytes = std::fs::read(&path).map_err(|e| IndexError::io(&path, e))?;
            let mut input = WordReader::checked(&bytes, &path)?;
            content.update(recorded_checksum(&bytes));
            if input.u64()? != MAGIC || input.u64()? != FORMAT_VERSION {
                return input.corrupt("not a compressed index part of this version");
            }
            let (number, last) = (input.u64()?, input.u64()? == 1);
            if number != n as u64 || last != (n + 1 == count) {
                return input.corrupt(&format!(
                    "it says it is part {number}{} of its index, but the folder holds {count} \
                     parts: one is missing",
                    if last { ", the last" } else { "" }
                ));
            }
            let found = (input.u64()? as u32, input.u64()?);
            if vocabulary.is_some_and(|v| v != found) {
                return input.corrupt("its eos id or vocabulary differs from part 0's");
            }
            vocabulary = Some(found);
            let part = FmPart::read(&mut input)?;
            input.finish()?;
            if parts
                .first()
                .is_some_and(|s: &FmPart| s.width() != part.width())
            {
                return input.corrupt("its token width differs from part 0's");
            }
            parts.push(part);
        }
        let (eos_token_id, vocab_size) = vocabulary.unwrap_or_default();
        let width = parts.first().map_or(TokenWidth::U16, |s| s.width());
        width.check_vocab(vocab_size, eos_token_id)?;
        let tokenizer_path = dir.join(TOKENIZER_FILE);
        let tokenizer =
            if tokenizer_path.exists() {
                Some(Tokenizer::from_file(&tokenizer_path).map_err(|e| {
                    IndexError::Corrupt(format!("{}: {e}", tokenizer_path.display()))
                })?)
            } else {
                None
            };
        let shard_set_path = dir.join(SHARD_SET_FILE);
        let shard_set = match shard_set_path.exists() {
            true => {
                let json = std::fs::read(&shard_set_path)
                    .map_err(|e| IndexError::io(&shard_set_path, e))?;
                content.update(&json);
                Some(serde_json::from_slice(&json).map_err(|e| {
                    IndexError::Corrupt(format!("{}: {e}", shard_set_path.display()))
                })?)
            }
            false => None,
        };
        Ok(CompressedIndex {
            dir: dir.to_path_buf(),
            parts,
            width,
            eos_token_id,
            vocab_size,
            tokenizer,
            shard_set,
            content_id: format!("{:016x}", content.digest()),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn eos_token_id(&self) -> u32 {
        self.eos_token_id
    }
    pub fn num_parts(&self) -> usize {
        self.parts.len()
    }
    pub fn total_tokens(&self) -> u64 {
        self.parts.iter().map(FmPart::tok_cnt).sum()
    }
    pub fn total_documents(&self) -> u64 {
        self.parts.iter().map(FmPart::doc_cnt).sum()
    }

    /// Bytes of each component (transform, samples, documents), summed over the parts.
    pub fn size_by_component(&self) -> Vec<(&'static str, u64)> {
        let mut components: Vec<(&'static str, u64)> = Vec::new();
        for part in &self.parts {
            for (name, bytes) in part.size_by_component() {
                match components.iter_mut().find(|(n, _)| *n == name) {
                    Some(component) => component.1 += bytes,
                    None => components.push((name, bytes)),
                }
            }
        }
        components
    }

    pub fn vocab_size(&self) -> u64 {
        self.vocab_size
    }
    pub fn width(&self) -> TokenWidth {
        self.width
    }
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// Refuses ids outside the vocabulary and queries beyond the engine's length limit.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        check_vocabulary(ids, self.vocab_size)
    }

    /// Where each match of `ids` starts: `(part, token offset)`, at most `limit` of them.
    pub fn positions(&self, ids: &[u32], limit: usize) -> Result<Vec<(usize, u64)>> {
        self.check_ids(ids)?;
        let m = self.locate(ids);
        let (mut out, mut rows, mut places) = (Vec::new(), Vec::new(), Vec::new());
        for (s, (part, range)) in self.parts.iter().zip(&m.ranges).enumerate() {
            let mut range = range.lo..range.hi;
            while out.len() < limit {
                if crate::interrupt::interrupted() {
                    return Err(IndexError::Interrupted);
                }
                rows.clear();
                rows.extend(range.by_ref().take((limit - out.len()).min(WALKS)));
                if rows.is_empty() {
                    break;
                }
                places.clear();
                part.places_of(&rows, ids.len(), &mut places);
                // The empty n-gram matches at the part's end too, which is no place.
                let real = places
                    .iter()
                    .filter(|&&at| !ids.is_empty() || at != part.tok_cnt());
                out.extend(real.map(|&at| (s, at)));
            }
        }
        Ok(out)
    }

    /// The document holding `(part, token offset)` (over all parts), and the offset inside it.
    pub fn place(&self, (s, at): (usize, u64)) -> (u64, u64) {
        let base: u64 = self.parts[..s].iter().map(|x| x.doc_cnt()).sum();
        let part = &self.parts[s];
        let doc = part.doc_of(at);
        (base + doc, part.doc_len_and_offset(doc, at).1)
    }
}

impl DocumentIndex for CompressedIndex {
    type Part = FmPart;
    /// A place is found by LF steps back to a sampled row (32 on average), each a rank at every
    /// wavelet level: 900–1,200 times a pointer read over mini-Pile bytes and SmolLM2 tokens.
    const PLACE_COST: u64 = 1024;
    const SUFFIX_ORDER: bool = false;
    fn doc_parts(&self) -> &[FmPart] {
        &self.parts
    }
    fn check_ngram(&self, ids: &[u32]) -> Result<()> {
        self.check_ids(ids)
    }
    fn ngram_ranges(&self, ids: &[u32]) -> Vec<RankRange> {
        self.locate(ids).ranges
    }
    fn doc_tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }
}

impl DocumentPart for FmPart {
    fn doc_cnt(&self) -> u64 {
        FmPart::doc_cnt(self)
    }
    fn places_of(&self, rows: &[u64], len: usize, places: &mut Vec<u64>) {
        let start = places.len();
        places.resize(start + rows.len(), 0);
        self.ends_of(rows, &mut places[start..]);
        for place in &mut places[start..] {
            *place = place.saturating_sub(len as u64);
        }
    }
    fn doc_of(&self, place: u64) -> u64 {
        FmPart::doc_of(self, place)
    }
    fn doc_end(&self, doc: u64) -> u64 {
        FmPart::doc_end(self, doc)
    }
    fn doc_len_and_offset(&self, doc: u64, place: u64) -> (u64, u64) {
        // The document's first token follows its separator.
        let start = self.doc_start(doc) + 1;
        (
            self.doc_end(doc).saturating_sub(start),
            place.saturating_sub(start),
        )
    }
    fn doc_tokens(&self, doc: u64, from: u64, to: u64) -> Result<Vec<u32>> {
        FmPart::doc_tokens(self, doc, from, to)
    }
    fn metadata(&self, doc: u64) -> Option<String> {
        FmPart::metadata(self, doc)
    }
}
