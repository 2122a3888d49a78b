//! A namespace's journal: every change to its tail (an append, a retraction) is written to a file
//! before it is acknowledged, so a killed process loses nothing it acknowledged: at the next open
//! the journal is read back into the tail. Writing costs a microsecond or two (the kernel keeps the
//! bytes through a kill of the process); an append that asks for it (`AddDocuments`) is also
//! synced to the disk (about 0.2 ms here), so it survives the machine too.
//!
//! The journal is a series of files, one **generation** for each tail: freezing a tail starts the
//! next one, and once the tail's run is listed (`runs.json` records the first generation not yet
//! in a run) the older files are removed. A new generation opens with the request ids the
//! namespace remembers, so a retry after a restart is still known for what it is. Each record is
//! its length, a checksum and its bytes; a write that fails is cut back off at once (an append
//! refused never comes back at the next start), and a kill in the middle of a write leaves a torn
//! last record, which is cut off at open (it was never acknowledged). A record that fails its
//! check before the end of its file is corruption: the file is copied aside (`.bad-`, never
//! deleted) before being cut there, and the error logged.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

use super::folder::SET_ASIDE_PREFIX;
use super::{LiveError, Piece, Result, Vocabulary};

const PREFIX: &str = "journal-";
const SUFFIX: &str = ".log";
/// A record's length (u32) and checksum (u64).
const HEADER: usize = 12;
const APPEND: u8 = 1;
const RETRACT: u8 = 2;
const IDS: u8 = 3;

/// Whether `name` is one of a namespace's journal files.
pub fn is_journal_file(name: &str) -> bool {
    parse_generation(name).is_some()
}

fn parse_generation(name: &str) -> Option<u64> {
    name.strip_prefix(PREFIX)?
        .strip_suffix(SUFFIX)?
        .parse()
        .ok()
}

fn path_of(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("{PREFIX}{generation:020}{SUFFIX}"))
}

/// One change to a tail, as written and as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Append {
        request_id: String,
        pieces: Vec<(u64, Vec<u32>)>,
    },
    Retract {
        doc: u64,
        n: u64,
    },
    /// Request ids of appends in earlier generations, still remembered.
    Ids(Vec<String>),
}

/// Encodes an append without copying its tokens into a [`Record`] first.
fn encode_append(request_id: &str, pieces: &[Piece]) -> Vec<u8> {
    let tokens: usize = pieces.iter().map(|p| p.tokens.len()).sum();
    let mut bytes = Vec::with_capacity(7 + request_id.len() + 12 * pieces.len() + 4 * tokens);
    bytes.push(APPEND);
    bytes.extend((request_id.len() as u16).to_le_bytes());
    bytes.extend(request_id.as_bytes());
    bytes.extend((pieces.len() as u32).to_le_bytes());
    for piece in pieces {
        bytes.extend(piece.doc.to_le_bytes());
        bytes.extend((piece.tokens.len() as u32).to_le_bytes());
        for t in piece.tokens {
            bytes.extend(t.to_le_bytes());
        }
    }
    bytes
}

fn encode_ids(ids: &[String]) -> Vec<u8> {
    let mut bytes = vec![IDS];
    bytes.extend((ids.len() as u32).to_le_bytes());
    for id in ids {
        bytes.extend((id.len() as u16).to_le_bytes());
        bytes.extend(id.as_bytes());
    }
    bytes
}

fn encode_retract(doc: u64, n: u64) -> Vec<u8> {
    let mut bytes = vec![RETRACT];
    bytes.extend(doc.to_le_bytes());
    bytes.extend(n.to_le_bytes());
    bytes
}

/// Reads a record's bytes; `None` when they are not one (or hold a token outside `vocab`).
fn decode(bytes: &[u8], vocab: &Vocabulary) -> Option<Record> {
    let mut r = Reader(bytes);
    let record = match r.u8()? {
        APPEND => {
            let id_len = u16::from_le_bytes(r.take()?) as usize;
            let request_id = String::from_utf8(r.bytes(id_len)?.to_vec()).ok()?;
            let n = u32::from_le_bytes(r.take()?) as usize;
            let mut pieces = Vec::with_capacity(n.min(bytes.len() / 12));
            for _ in 0..n {
                let doc = u64::from_le_bytes(r.take()?);
                let len = u32::from_le_bytes(r.take()?) as usize;
                let body = r.bytes(len.checked_mul(4)?)?;
                let tokens: Vec<u32> = body
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                if tokens.iter().any(|&t| t as u64 >= vocab.vocab_size) {
                    return None;
                }
                pieces.push((doc, tokens));
            }
            Record::Append { request_id, pieces }
        }
        RETRACT => Record::Retract {
            doc: u64::from_le_bytes(r.take()?),
            n: u64::from_le_bytes(r.take()?),
        },
        IDS => {
            let n = u32::from_le_bytes(r.take()?) as usize;
            let mut ids = Vec::with_capacity(n.min(bytes.len() / 2));
            for _ in 0..n {
                let len = u16::from_le_bytes(r.take()?) as usize;
                ids.push(String::from_utf8(r.bytes(len)?.to_vec()).ok()?);
            }
            Record::Ids(ids)
        }
        _ => return None,
    };
    r.0.is_empty().then_some(record)
}

/// Bytes read from the front of a slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take::<1>()?[0])
    }
}

/// The file the tail's changes go to: its generation's, opened at the first write.
pub struct Journal {
    dir: PathBuf,
    generation: u64,
    file: Option<File>,
    /// The open file's length: where a failed write is cut back to.
    len: u64,
}

impl Journal {
    /// The journal of the namespace in `dir`, writing generation `generation` next.
    pub fn new(dir: &Path, generation: u64) -> Self {
        Self {
            dir: dir.to_path_buf(),
            generation,
            file: None,
            len: 0,
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Writes an append (synced to the disk with `sync`) before the tail takes it.
    pub fn append(&mut self, request_id: &str, pieces: &[Piece], sync: bool) -> Result<()> {
        self.write(&encode_append(request_id, pieces), sync)
    }

    pub fn retract(&mut self, doc: u64, n: u64) -> Result<()> {
        self.write(&encode_retract(doc, n), false)
    }

    /// Closes this generation's file and opens the next one's with `ids` (the request ids still
    /// remembered, whose appends the closed generations hold); returns the next generation.
    pub fn rotate(&mut self, ids: &[String]) -> u64 {
        self.file = None;
        self.generation += 1;
        if !ids.is_empty() {
            if let Err(e) = self.write(&encode_ids(ids), false) {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not carry request ids into a new journal; a retry after a restart may add its documents again");
            }
        }
        self.generation
    }

    fn write(&mut self, payload: &[u8], sync: bool) -> Result<()> {
        let path = path_of(&self.dir, self.generation);
        let io = |e| LiveError::io(&path, e);
        let mut record = Vec::with_capacity(HEADER + payload.len());
        record.extend((payload.len() as u32).to_le_bytes());
        record.extend(xxh3_64(payload).to_le_bytes());
        record.extend(payload);
        if self.file.is_none() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(io)?;
            self.len = file.metadata().map_err(io)?.len();
            // The new file's name is durable once its folder is synced.
            super::folder::sync_entries(&self.dir)?;
            self.file = Some(file);
        }
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        let written =
            file.write_all(&record)
                .and_then(|()| if sync { file.sync_data() } else { Ok(()) });
        if let Err(e) = written {
            // Cut back to before this record, so an append refused is never read back. Where even
            // that fails, later writes go to a new generation: reading this one stops at the torn
            // record, so nothing acknowledged after it is lost.
            if file.set_len(self.len).is_err() {
                self.file = None;
                self.generation += 1;
            }
            return Err(io(e));
        }
        self.len += record.len() as u64;
        Ok(())
    }
}

/// What the journal files of a namespace from `from` on hold, oldest first, and the generation
/// to write next. Torn ends are cut off; a file corrupt before its end is copied aside first.
pub fn replay(dir: &Path, from: u64, vocab: &Vocabulary) -> Result<(Vec<Record>, u64)> {
    let mut generations = generations(dir)?;
    generations.retain(|&g| g >= from);
    generations.sort_unstable();
    let mut records = Vec::new();
    for &generation in &generations {
        let path = path_of(dir, generation);
        let bytes = std::fs::read(&path).map_err(|e| LiveError::io(&path, e))?;
        let good = read_records(&bytes, vocab, &mut records);
        if good < bytes.len() {
            cut(&path, &bytes, good)?;
        }
    }
    let next = generations.last().map_or(from, |g| g + 1);
    Ok((records, next))
}

/// Reads the whole records at the front of `bytes` into `records`; returns the bytes they take.
fn read_records(bytes: &[u8], vocab: &Vocabulary, records: &mut Vec<Record>) -> usize {
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let mut check = [0; 8];
        check.copy_from_slice(&header[4..]);
        let Some(payload) = bytes.get(at + HEADER..at + HEADER + len) else {
            break;
        };
        if xxh3_64(payload) != u64::from_le_bytes(check) {
            break;
        }
        let Some(record) = decode(payload, vocab) else {
            break;
        };
        records.push(record);
        at += HEADER + len;
    }
    at
}

/// Cuts a journal file at `good` bytes. What follows a torn record is nothing (a kill mid-write);
/// a bad record with whole records' worth of bytes after it may be corruption, so the file is
/// first copied aside for a person to look at.
fn cut(path: &Path, bytes: &[u8], good: usize) -> Result<()> {
    let rest = &bytes[good..];
    let torn = rest.len() < HEADER || {
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        rest.len() < HEADER + len
    };
    if torn {
        tracing::warn!(path = %path.display(), bytes = rest.len(), "a journal's last record was torn by a kill (never acknowledged); cut off");
    } else {
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let aside = path.with_file_name(format!(
            "{SET_ASIDE_PREFIX}{name}-{}",
            super::unix_seconds()
        ));
        std::fs::copy(path, &aside).map_err(|e| LiveError::io(&aside, e))?;
        tracing::error!(path = %path.display(), at = good, copied_to = %aside.display(), "a journal record failed its check before the file's end; what follows it is lost, the file was copied aside and cut there");
    }
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| LiveError::io(path, e))?;
    file.set_len(good as u64)
        .and_then(|()| file.sync_all())
        .map_err(|e| LiveError::io(path, e))
}

fn generations(dir: &Path) -> Result<Vec<u64>> {
    let entries = std::fs::read_dir(dir).map_err(|e| LiveError::io(dir, e))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| LiveError::io(dir, e))?;
        if let Some(g) = parse_generation(&entry.file_name().to_string_lossy()) {
            found.push(g);
        }
    }
    Ok(found)
}

/// Removes the journal files of generations before `generation` (their tails are in runs).
pub fn remove_before(dir: &Path, generation: u64) -> Result<()> {
    for g in generations(dir)?.into_iter().filter(|&g| g < generation) {
        let path = path_of(dir, g);
        std::fs::remove_file(&path).map_err(|e| LiveError::io(&path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::TokenWidth;

    const VOCAB: Vocabulary = Vocabulary {
        width: TokenWidth::U16,
        eos_token_id: 0,
        vocab_size: 1_000,
    };

    fn append(journal: &mut Journal, id: &str, doc: u64, tokens: &[u32]) -> Record {
        journal.append(id, &[Piece { doc, tokens }], false).unwrap();
        Record::Append {
            request_id: id.into(),
            pieces: vec![(doc, tokens.to_vec())],
        }
    }

    #[test]
    fn what_was_written_reads_back_in_order_across_generations() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::new(dir.path(), 3);
        let mut want = vec![append(&mut journal, "r1", 7, &[1, 2, 3])];
        journal.retract(7, 1).unwrap();
        want.push(Record::Retract { doc: 7, n: 1 });
        assert_eq!(journal.rotate(&["r1".to_string()]), 4);
        want.push(Record::Ids(vec!["r1".into()]));
        want.push(append(&mut journal, "", 8, &[999]));
        assert_eq!(replay(dir.path(), 0, &VOCAB).unwrap(), (want.clone(), 5));
        // Generations before `from` are in runs already.
        assert_eq!(
            replay(dir.path(), 4, &VOCAB).unwrap(),
            (want[2..].to_vec(), 5)
        );
        remove_before(dir.path(), 4).unwrap();
        assert_eq!(
            replay(dir.path(), 0, &VOCAB).unwrap(),
            (want[2..].to_vec(), 5)
        );
        // A rotation with no ids to carry makes no file until its first write.
        assert_eq!(journal.rotate(&[]), 5);
        assert_eq!(replay(dir.path(), 0, &VOCAB).unwrap().1, 5);
        // No journal: nothing, and the generation asked for is the next.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(replay(empty.path(), 9, &VOCAB).unwrap(), (Vec::new(), 9));
    }

    #[test]
    fn a_torn_end_is_cut_off_and_a_corrupt_record_is_copied_aside_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::new(dir.path(), 0);
        let first = append(&mut journal, "a", 1, &[5, 6]);
        let path = path_of(dir.path(), 0);
        let first_len = std::fs::metadata(&path).unwrap().len() as usize;
        append(&mut journal, "b", 2, &[7]);
        let whole = std::fs::read(&path).unwrap();
        // Every torn length: the whole records before it read back, nothing copied aside.
        for keep in 0..whole.len() {
            std::fs::write(&path, &whole[..keep]).unwrap();
            let (got, _) = replay(dir.path(), 0, &VOCAB).unwrap();
            let want = match keep >= first_len {
                true => vec![first.clone()],
                false => vec![],
            };
            assert_eq!(got, want, "{keep} bytes");
            assert_eq!(
                std::fs::metadata(&path).unwrap().len() as usize,
                got.len() * first_len
            );
        }
        // A flipped byte in the first record: the second is lost with it, the file kept aside.
        let mut bad = whole.clone();
        bad[HEADER + 3] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        assert_eq!(replay(dir.path(), 0, &VOCAB).unwrap().0, vec![]);
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(SET_ASIDE_PREFIX))
            .collect();
        assert_eq!(aside.len(), 1);
        assert_eq!(std::fs::read(dir.path().join(&aside[0])).unwrap(), bad);
    }

    #[test]
    fn tokens_outside_the_vocabulary_are_not_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::new(dir.path(), 0);
        append(&mut journal, "", 1, &[1_000]);
        assert!(replay(dir.path(), 0, &VOCAB).unwrap().0.is_empty());
    }
}
