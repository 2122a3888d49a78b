//! Errors of the index: every one carries a message a person can act on.

use std::path::Path;

use crate::corpus::CorpusError;

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// Files that are inconsistent with each other or with the manifest.
    #[error("corrupt index: {0}")]
    Corrupt(String),
    /// An index that is fine in itself but not what the caller asked for (token width, tokenizer, ...).
    #[error("index mismatch: {0}")]
    Mismatch(String),
    /// A bad query or bad build input.
    #[error("{0}")]
    Invalid(String),
    /// A query this kind of index does not answer (another kind does: the message names it).
    #[error("{0}")]
    Unsupported(String),
    #[error("interrupted")]
    Interrupted,
    /// The shard servers behind a router failed to answer (a shard down, its deadline passed):
    /// their error, passed on as it is (the server that made it reads its status back).
    #[error("{message}")]
    Remote {
        message: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl IndexError {
    /// A remote source's failure, told by `message`.
    pub fn remote(
        source: impl std::error::Error + Send + Sync + 'static,
        message: impl Into<String>,
    ) -> Self {
        IndexError::Remote {
            message: message.into(),
            source: Box::new(source),
        }
    }

    pub fn io(path: &Path, source: std::io::Error) -> Self {
        IndexError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// The text readers' errors, as the index reports them (the same messages).
impl From<CorpusError> for IndexError {
    fn from(e: CorpusError) -> Self {
        match e {
            CorpusError::Io { path, source } => IndexError::Io { path, source },
            CorpusError::Invalid(m) => IndexError::Invalid(m),
        }
    }
}

pub type Result<T, E = IndexError> = std::result::Result<T, E>;
