//! Evaluations over documents: the neural model's perplexity with the paper's window protocol, the
//! ∞-gram and mixed perplexities (`eval fit`, `eval ppl`, the per-token output), and speculative
//! decoding (`eval spec`, and `eval workload` over a replayed workload with live indexes).

pub mod backoff;
pub mod contamination;
pub mod documents;
pub mod error;
pub mod experiment;
pub mod generation;
pub mod neural;
pub mod per_token;
pub mod records;
pub mod report;
pub mod spec;
pub mod workload;

pub use error::EvalError;

pub type Result<T, E = EvalError> = std::result::Result<T, E>;
