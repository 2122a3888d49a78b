//! Evaluations over documents: the neural model's perplexity with the paper's window protocol (and,
//! with the mixing issue, the ∞-gram and mixed perplexities).

pub mod documents;
pub mod experiment;
pub mod neural;
pub mod records;
pub mod report;
pub mod spec;
