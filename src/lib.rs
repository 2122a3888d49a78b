//! infini-sidecar: an ∞-gram language model engine (infini-gram, Liu et al. 2024) and the sidecar
//! service built on it.

pub mod agreement;
pub mod cluster;
pub mod corpus;
pub mod cpu;
pub mod decoding;
pub mod draft;
pub mod eval;
pub mod evidence;
pub mod index;
pub mod interrupt;
pub mod live;
pub mod mix;
pub mod model;
pub mod progress;
pub mod protocol;
pub mod server;
pub mod softmax;
pub mod tokenizer;
