//! The infini-gram engine: suffix-array indexes over tokenized text, built in parts, served from
//! memory maps, answering n-gram and ∞-gram queries (paper §2, §3, App. A). By side: the files
//! (`format`), the suffix-array read side (`read`), the compressed side (`fm`), the build side
//! (`build`), and here the one face of every kind (`corpus`, its answers in `query`, what following
//! a match asks of a kind in `suffix`) and what is written once over it (`dense`, `docs`, `trace`,
//! `backoff`, `bytes`, `hints`, `info`). A shard's part of a router's answer is the cluster's
//! ([`crate::cluster::partial`]).

pub mod backoff;
pub mod build;
pub mod bytes;
pub mod corpus;
pub mod dense;
pub mod docs;
pub mod error;
pub mod fm;
pub mod format;
pub mod hints;
pub mod info;
mod pages;
pub mod query;
pub mod ranks;
pub mod read;
pub mod sampling;
pub mod suffix;
pub mod trace;

pub use error::{IndexError, Result};
pub use format::TokenWidth;
pub use info::{IndexInfo, IndexShape};
pub use read::{Index, OpenOptions};
