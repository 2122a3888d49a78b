//! The gRPC service (`proto/sidecar/v1/sidecar.proto`) over the library: the engine's queries, the
//! tokenizer, mixing with the caller's or the sidecar's own neural distribution, document scoring and
//! decoding sessions. CPU work runs on tokio's blocking pool behind a semaphore, so a full sidecar
//! answers RESOURCE_EXHAUSTED instead of queueing without bound.

mod batch;
pub mod config;
mod drafting;
mod engine;
mod listen;
pub mod metrics;
mod mix_pb;
mod mix_sequences;
mod mixing;
mod neural_pb;
mod observe;
mod open;
mod packed;
mod pool;
mod router;
mod score;
mod serve;
mod service;
mod session;
mod shard;
mod state;
mod status;
mod valid;

pub use serve::serve;

use std::sync::Arc;

use crate::index::IndexError;
use crate::live::LiveError;
use crate::mix::MixError;
use crate::model::ModelError;
use config::ConfigError;
use open::{Evidence, Neural};
use pool::{next_message, on_pool_for_stream};
use service::ResponseStream;
use state::{State, WorkPermit};
use status::{
    decode_status, evidence_status, index_status, live_status, mix_status, model_status,
    stop_status, stopped, tokenizer_status,
};

/// Why the service could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("mixing file: {0}")]
    Mix(#[from] MixError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("live index: {0}")]
    Live(#[from] LiveError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("serving: {0}")]
    Transport(#[from] tonic::transport::Error),
}

impl ServeError {
    fn io(what: &str) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| ServeError::Io {
            what: what.to_string(),
            source,
        }
    }
}

/// The generated code, nested as the packages are (the shard protocol's documents are the
/// API's).
mod proto {
    pub mod sidecar {
        pub mod v1 {
            tonic::include_proto!("sidecar.v1");
            pub use crate::server::mix_pb::{MixResponse, TokenProb};
            pub use crate::server::neural_pb::{NeuralLogits, NeuralTopK};
            /// For gRPC reflection.
            pub const FILE_DESCRIPTOR_SET: &[u8] =
                tonic::include_file_descriptor_set!("sidecar_v1_descriptor");
        }
        pub mod shard {
            pub mod v1 {
                tonic::include_proto!("sidecar.shard.v1");
            }
        }
    }
}

/// The generated code of the protocol between routers and shard servers.
pub use proto::sidecar::shard::v1 as shard_pb;
/// The generated code of the API.
pub use proto::sidecar::v1 as pb;

#[derive(Clone)]
pub struct SidecarService {
    state: Arc<State>,
}
