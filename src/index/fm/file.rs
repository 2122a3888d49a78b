//! The compressed index's file: little-endian u64 words, sections each prefixed by their length,
//! a header naming the format and an xxh3 checksum at the end, checked when the file is opened
//! (the whole index is read into memory: it is small, that is its point).

use std::path::Path;

use crate::index::pages;
use crate::index::{IndexError, Result};

/// The first word of every compressed part file.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SCFMIDX1");

/// Words being written, in order.
#[derive(Default)]
pub struct Words {
    words: Vec<u64>,
}

impl Words {
    pub fn u64(&mut self, value: u64) {
        self.words.push(value);
    }

    pub fn u64s(&mut self, values: &[u64]) {
        self.words.push(values.len() as u64);
        self.words.extend_from_slice(values);
    }

    /// Bytes, packed eight to a word after their count.
    pub fn bytes(&mut self, values: &[u8]) {
        self.words.push(values.len() as u64);
        self.words.extend(values.chunks(8).map(|chunk| {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            u64::from_le_bytes(word)
        }));
    }

    /// The file's bytes: the words, then their checksum.
    pub fn into_bytes(self) -> Vec<u8> {
        with_checksum(self.words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }
}

/// The checksum a file records (its last eight bytes; [`WordReader::checked`] checks it).
pub fn recorded_checksum(bytes: &[u8]) -> &[u8] {
    &bytes[bytes.len().saturating_sub(8)..]
}

/// A file's `body` followed by the checksum that [`WordReader::checked`] expects.
pub fn with_checksum(mut body: Vec<u8>) -> Vec<u8> {
    let checksum = xxhash_rust::xxh3::xxh3_64(&body);
    body.extend_from_slice(&checksum.to_le_bytes());
    body
}

/// Reads words back, refusing any count that runs past the file.
pub struct WordReader<'a> {
    words: &'a [u8],
    at: usize,
    name: String,
}

impl<'a> WordReader<'a> {
    /// A reader over `bytes` (as [`Words::into_bytes`] wrote them: the checksum is checked by
    /// [`WordReader::checked`], not here). `name` names the file in errors.
    pub fn new(bytes: &'a [u8], name: &str) -> Self {
        let words = &bytes[..bytes.len() / 8 * 8];
        let words = &words[..words.len().saturating_sub(8)];
        WordReader {
            words,
            at: 0,
            name: name.to_string(),
        }
    }

    /// A reader over a whole file's bytes once its length and checksum are right.
    pub fn checked(bytes: &'a [u8], path: &Path) -> Result<Self> {
        let name = path.display().to_string();
        if bytes.len() < 16 || !bytes.len().is_multiple_of(8) {
            return Err(IndexError::Corrupt(format!(
                "{name}: {} bytes is not a compressed index file",
                bytes.len()
            )));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 8);
        let mut recorded = [0u8; 8];
        recorded.copy_from_slice(tail);
        if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(recorded) {
            return Err(IndexError::Corrupt(format!(
                "{name}: checksum mismatch (a truncated or damaged file)"
            )));
        }
        Ok(Self::new(bytes, &name))
    }

    pub fn corrupt<T>(&self, what: &str) -> Result<T> {
        Err(IndexError::Corrupt(format!("{}: {what}", self.name)))
    }

    pub fn u64(&mut self) -> Result<u64> {
        let Some(word) = self.words.get(self.at..self.at + 8) else {
            return self.corrupt("ends early");
        };
        self.at += 8;
        let mut buf = [0u8; 8];
        buf.copy_from_slice(word);
        Ok(u64::from_le_bytes(buf))
    }

    /// A count, checked to fit in what is left of the file at `bytes_each`.
    fn count(&mut self, per_word: usize) -> Result<usize> {
        let n = self.u64()?;
        let left = ((self.words.len() - self.at) / 8) as u64;
        if n.div_ceil(per_word as u64) > left {
            return self.corrupt("a section is longer than the file");
        }
        Ok(n as usize)
    }

    /// A section of words, in memory fit for random reads (queries rank and locate in them).
    pub fn u64s(&mut self) -> Result<Vec<u64>> {
        let n = self.count(1)?;
        let mut out = pages::for_random_reads(n);
        for _ in 0..n {
            out.push(self.u64()?);
        }
        Ok(out)
    }

    pub fn bytes(&mut self) -> Result<Vec<u8>> {
        let n = self.count(8)?;
        let words = n.div_ceil(8);
        let mut out = Vec::with_capacity(words * 8);
        for _ in 0..words {
            out.extend_from_slice(&self.u64()?.to_le_bytes());
        }
        out.truncate(n);
        Ok(out)
    }

    /// Whether every word was read (a file with words left over is not the one written).
    pub fn finish(&self) -> Result<()> {
        if self.at != self.words.len() {
            return self.corrupt("has bytes past its last section");
        }
        Ok(())
    }
}
