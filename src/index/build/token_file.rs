//! Reading a pre-tokenized file in the infini-gram layout (the reference's `tokenized.N`): the
//! index's own token encoding, so it lives beside the format rather than with the text readers.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::corpus::{Content, InputDoc};
use crate::index::format::TokenWidth;
use crate::index::{IndexError, Result};

/// Documents of a pre-tokenized file: little-endian tokens of `width`, each document preceded by the
/// all-ones separator (the reference's `tokenized.N` layout).
pub fn documents(path: &Path, width: TokenWidth) -> Result<impl Iterator<Item = Result<InputDoc>>> {
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
