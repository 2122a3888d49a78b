//! The infini-gram engine: suffix-array indexes over tokenized text, built in shards, served from
//! memory maps, answering n-gram and ∞-gram queries (paper §2, §3, App. A). By side: the files
//! (`format`, `ranks`), the suffix-array read side (`reader`, `shard`, `query`, `suffix`, ...), the
//! compressed side (`fm`), the build side (`build`, `sa`, `split`, `next_table_build`, `decontam`)
//! and what is built on any index (`corpus`, `trace`, `docs`, `dense`, `hints`, `backoff`).

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
pub use info::{IndexInfo, IndexShape};
pub use reader::{Index, OpenOptions};
