//! Reading text documents: plain text files (one document each) and Pile-style JSON lines
//! (`{"text": ..., "meta": ...}` one document a line, optionally gzipped). The bottom of the data
//! path: the index builds on it (and reads its own pre-tokenized files, `index::build::token_file`); it
//! imports nothing of the crate.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// Input that is not what it should be: a missing path, text that is not UTF-8, a bad JSON line.
    #[error("{0}")]
    Invalid(String),
}

impl CorpusError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        CorpusError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

pub type Result<T, E = CorpusError> = std::result::Result<T, E>;

/// A document's content: text to tokenize, or tokens already.
pub enum Content {
    Text(String),
    Tokens(Vec<u32>),
}

pub struct InputDoc {
    pub content: Content,
    /// The metadata line stored for the document, in the reference's shape
    /// `{"path": ..., "linenum": ..., "metadata": {...}}`.
    pub metadata: Option<String>,
    /// Input bytes this document accounts for (for progress).
    pub input_bytes: u64,
}

/// Every file under the given paths (folders recursively, in sorted order), with the path to record.
pub fn expand_inputs(paths: &[PathBuf]) -> Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    for root in paths {
        if root.is_dir() {
            let mut files = Vec::new();
            walk(root, &mut files)?;
            files.sort();
            for f in files {
                let rel = f
                    .strip_prefix(root)
                    .unwrap_or(&f)
                    .to_string_lossy()
                    .into_owned();
                out.push((f, rel));
            }
        } else if root.is_file() {
            let name = root
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.push((root.clone(), name));
        } else {
            return Err(CorpusError::Invalid(format!(
                "{}: no such file or folder",
                root.display()
            )));
        }
    }
    if out.is_empty() {
        return Err(CorpusError::Invalid("no input files".into()));
    }
    Ok(out)
}

/// Bytes of the given files together (for a progress bar; unreadable ones count 0).
pub fn total_bytes(files: &[(PathBuf, String)]) -> u64 {
    files
        .iter()
        .filter_map(|(p, _)| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| CorpusError::io(dir, e))? {
        let path = entry.map_err(|e| CorpusError::io(dir, e))?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

fn is_json_lines(path: &Path) -> bool {
    let name = path.to_string_lossy();
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    name.ends_with(".jsonl") || name.ends_with(".json")
}

fn open_maybe_gz(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    let file = File::open(path).map_err(|e| CorpusError::io(path, e))?;
    Ok(if path.extension().is_some_and(|e| e == "gz") {
        Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::read::MultiGzDecoder::new(file),
        ))
    } else {
        Box::new(BufReader::with_capacity(1 << 20, file))
    })
}

/// Text documents of the given files, streamed: one JSON object per line of `.jsonl`/`.json(.gz)` files,
/// one document per other file.
pub fn text_documents(files: Vec<(PathBuf, String)>) -> impl Iterator<Item = Result<InputDoc>> {
    files.into_iter().flat_map(
        |(path, rel)| -> Box<dyn Iterator<Item = Result<InputDoc>>> {
            let reader = match open_maybe_gz(&path) {
                Ok(r) => r,
                Err(e) => return Box::new(std::iter::once(Err(e))),
            };
            if is_json_lines(&path) {
                Box::new(json_lines(reader, path, rel))
            } else {
                Box::new(std::iter::once(whole_file(reader, &path, &rel)))
            }
        },
    )
}

fn whole_file(mut reader: Box<dyn BufRead + Send>, path: &Path, rel: &str) -> Result<InputDoc> {
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| CorpusError::io(path, e))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| CorpusError::Invalid(format!("{}: not UTF-8 text", path.display())))?;
    let metadata = serde_json::json!({"path": rel, "linenum": 0, "metadata": {}}).to_string();
    Ok(InputDoc {
        input_bytes: text.len() as u64,
        content: Content::Text(text),
        metadata: Some(metadata),
    })
}

fn json_lines(
    reader: Box<dyn BufRead + Send>,
    path: PathBuf,
    rel: String,
) -> impl Iterator<Item = Result<InputDoc>> {
    reader
        .lines()
        .enumerate()
        .filter_map(move |(linenum, line)| {
            let line = match line {
                Ok(l) => l,
                Err(e) => return Some(Err(CorpusError::io(&path, e))),
            };
            if line.trim().is_empty() {
                return None;
            }
            let input_bytes = line.len() as u64 + 1;
            let bad = |msg: &str| {
                CorpusError::Invalid(format!("{}:{}: {msg}", path.display(), linenum + 1))
            };
            let mut value: serde_json::Value = match serde_json::from_str(&line) {
                Ok(v) => v,
                Err(e) => return Some(Err(bad(&format!("not JSON: {e}")))),
            };
            let Some(obj) = value.as_object_mut() else {
                return Some(Err(bad("not a JSON object")));
            };
            let text = match obj.remove("text") {
                Some(serde_json::Value::String(t)) => t,
                _ => return Some(Err(bad("no \"text\" string"))),
            };
            let metadata =
                serde_json::json!({"path": rel, "linenum": linenum, "metadata": obj}).to_string();
            Some(Ok(InputDoc {
                content: Content::Text(text),
                metadata: Some(metadata),
                input_bytes,
            }))
        })
}
