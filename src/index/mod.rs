//! The infini-gram engine: suffix-array indexes over tokenized text, built in shards, served from
//! memory maps, answering n-gram and ∞-gram queries (paper §2, §3, App. A).

pub mod backoff;
pub mod build;
pub mod bytes;
pub mod corpus;
pub mod decontam;
pub mod dense;
pub mod docs;
pub mod error;
pub mod fm;
pub mod format;
pub mod hints;
pub mod info;
pub mod next_table;
pub mod next_table_build;
pub mod next_tokens;
pub mod partial;
pub mod query;
pub mod rank_samples;
pub mod ranks;
pub mod reader;
pub mod sa;
pub mod sampling;
pub mod shard;
pub(crate) mod short_counts;
pub mod split;
pub mod suffix;
pub mod token_file;
pub mod trace;

pub use error::{IndexError, Result};
pub use format::TokenWidth;
pub use info::IndexInfo;
pub use reader::{Index, OpenOptions};
