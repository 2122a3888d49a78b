//! Reading documents to index: plain text files (one document each), Pile-style JSON lines
//! (`{"text": ..., "meta": ...}` one document a line, optionally gzipped), or a pre-tokenized file in the
//! infini-gram layout (an all-ones separator before every document).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::index::format::TokenWidth;
use crate::index::{IndexError, Result};

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
            return Err(IndexError::Invalid(format!(
                "{}: no such file or folder",
                root.display()
            )));
        }
    }
    if out.is_empty() {
        return Err(IndexError::Invalid("no input files".into()));
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| IndexError::io(dir, e))? {
        let path = entry.map_err(|e| IndexError::io(dir, e))?.path();
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
    let file = File::open(path).map_err(|e| IndexError::io(path, e))?;
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
        .map_err(|e| IndexError::io(path, e))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| IndexError::Invalid(format!("{}: not UTF-8 text", path.display())))?;
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
                Err(e) => return Some(Err(IndexError::io(&path, e))),
            };
            if line.trim().is_empty() {
                return None;
            }
            let input_bytes = line.len() as u64 + 1;
            let bad = |msg: &str| {
                IndexError::Invalid(format!("{}:{}: {msg}", path.display(), linenum + 1))
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

/// Documents of a pre-tokenized file: little-endian tokens of `width`, each document preceded by the
/// all-ones separator (the reference's `tokenized.N` layout).
pub fn token_file_documents(
    path: &Path,
    width: TokenWidth,
) -> Result<impl Iterator<Item = Result<InputDoc>>> {
    let file = File::open(path).map_err(|e| IndexError::io(path, e))?;
    let len = file.metadata().map_err(|e| IndexError::io(path, e))?.len();
    let w = width.bytes() as u64;
    if len == 0 || len % w != 0 {
        return Err(IndexError::Invalid(format!(
            "{}: {len} bytes is not a whole number of {w}-byte tokens",
            path.display()
        )));
    }
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let sep = width.separator();
    let mut next_token = move || -> std::io::Result<Option<u32>> {
        let mut buf = [0u8; 4];
        match reader.read_exact(&mut buf[..w as usize]) {
            Ok(()) => Ok(Some(u32::from_le_bytes(buf))),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e),
        }
    };
    let first = next_token().map_err(|e| IndexError::io(path, e))?;
    if first != Some(sep) {
        return Err(IndexError::Invalid(format!(
            "{}: does not start with a document separator (wrong --token-width?)",
            path.display()
        )));
    }
    let path = path.to_path_buf();
    let mut done = false;
    Ok(std::iter::from_fn(move || {
        if done {
            return None;
        }
        let mut tokens = Vec::new();
        loop {
            match next_token() {
                Ok(Some(t)) if t == sep => break,
                Ok(Some(t)) => tokens.push(t),
                Ok(None) => {
                    done = true;
                    break;
                }
                Err(e) => {
                    done = true;
                    return Some(Err(IndexError::io(&path, e)));
                }
            }
        }
        let input_bytes = (tokens.len() as u64 + 1) * w;
        Some(Ok(InputDoc {
            content: Content::Tokens(tokens),
            metadata: None,
            input_bytes,
        }))
    }))
}
