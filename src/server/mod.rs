//! The gRPC service (`proto/sidecar/v1/sidecar.proto`) over the library: the engine's queries, the
//! tokenizer, mixing with the caller's or the sidecar's own neural distribution, document scoring and
//! decoding sessions. CPU work runs on tokio's blocking pool behind a semaphore, so a full sidecar
//! answers RESOURCE_EXHAUSTED instead of queueing without bound.

pub mod config;
mod drafting;
mod engine;
pub mod metrics;
mod mixing;
mod score;
mod serve;
mod session;

pub use serve::serve;

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::index::{Index, IndexError, OpenOptions};
use crate::mix::{MixError, MixingParams};
use crate::model::{LoadOptions, Model, ModelError};
use crate::tokenizer::Tokenizer;
use config::{Limits, ServeConfig};
use metrics::Metrics;
use session::Sessions;

/// The generated code of the API.
pub mod pb {
    tonic::include_proto!("sidecar.v1");
    /// For gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("sidecar_v1_descriptor");
}

use pb::sidecar_server::Sidecar;

/// What every request reads.
struct State {
    index: Index,
    tokenizer: Tokenizer,
    mixing: Option<MixingParams>,
    model: Option<Model>,
    limits: Limits,
    in_flight: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    sessions: Sessions,
}

#[derive(Clone)]
pub struct SidecarService {
    state: Arc<State>,
}

fn index_status(e: IndexError) -> Status {
    match e {
        IndexError::Invalid(m) => Status::invalid_argument(m),
        other => Status::internal(other.to_string()),
    }
}

fn mix_status(e: MixError) -> Status {
    match e {
        MixError::Invalid(m) => Status::invalid_argument(m),
        MixError::Index(e) => index_status(e),
        other => Status::internal(other.to_string()),
    }
}

fn model_status(e: ModelError) -> Status {
    match e {
        ModelError::Invalid(m) => Status::invalid_argument(m),
        other => Status::internal(other.to_string()),
    }
}

/// A permit to do CPU work; the in-flight gauge follows it.
struct WorkPermit {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for WorkPermit {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

/// When the caller's `grpc-timeout` runs out, if it sent one.
fn deadline_of<T>(request: &Request<T>) -> Option<Instant> {
    let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    let timeout = match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Some(Instant::now() + timeout)
}

fn check_deadline(deadline: Option<Instant>) -> Result<(), Status> {
    match deadline {
        Some(d) if Instant::now() >= d => Err(Status::deadline_exceeded(
            "the deadline passed before the work was done",
        )),
        _ => Ok(()),
    }
}

impl State {
    /// A permit to do CPU work, or RESOURCE_EXHAUSTED when `max_in_flight` requests already run.
    fn permit(&self) -> Result<WorkPermit, Status> {
        let permit = Arc::clone(&self.in_flight)
            .try_acquire_owned()
            .map_err(|_| Status::resource_exhausted("the sidecar is at its in-flight limit"))?;
        self.metrics.in_flight.inc();
        Ok(WorkPermit {
            _permit: permit,
            metrics: Arc::clone(&self.metrics),
        })
    }

    fn check_len(&self, what: &str, len: usize) -> Result<(), Status> {
        if len > self.limits.max_context_tokens {
            return Err(Status::invalid_argument(format!(
                "{what} has {len} tokens, more than the limit of {}",
                self.limits.max_context_tokens
            )));
        }
        Ok(())
    }

    fn check_top_k(&self, top_k: u32) -> Result<usize, Status> {
        if top_k == 0 || top_k as usize > self.limits.max_top_k {
            return Err(Status::invalid_argument(format!(
                "top_k must be in 1..={}",
                self.limits.max_top_k
            )));
        }
        Ok(top_k as usize)
    }

    fn model(&self) -> Result<&Model, Status> {
        self.model.as_ref().ok_or_else(|| {
            Status::failed_precondition("the sidecar runs no model: set `model` in its config")
        })
    }
}

impl SidecarService {
    /// Opens the index (with its tokenizer), the mixing file and the model of a config.
    pub fn open(config: &ServeConfig) -> anyhow::Result<Self> {
        Self::open_with_metrics(config, Arc::new(Metrics::default()))
    }

    pub fn open_with_metrics(config: &ServeConfig, metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        let index = Index::open(&config.index, &OpenOptions::default())?;
        let tokenizer = index.tokenizer().cloned().ok_or_else(|| {
            anyhow::anyhow!("{}: the index has no tokenizer", config.index.display())
        })?;
        let mixing = config
            .mixing
            .as_deref()
            .map(MixingParams::load)
            .transpose()?;
        if let Some(m) = &mixing {
            m.check_tokenizer(tokenizer.fingerprint())?;
        }
        if let Some(threads) = config.model_threads {
            crate::model::set_cpu_threads(threads);
        }
        let model = config
            .model
            .as_deref()
            .map(|path| Model::load(path, &LoadOptions::default()))
            .transpose()?;
        if let Some(m) = &model {
            m.check_tokenizer(tokenizer.fingerprint(), "the index")?;
        }
        Ok(Self {
            state: Arc::new(State {
                index,
                tokenizer,
                mixing,
                model,
                limits: config.limits,
                in_flight: Arc::new(Semaphore::new(config.limits.max_in_flight)),
                sessions: Sessions::new(config.limits.max_sessions, Arc::clone(&metrics)),
                metrics,
            }),
        })
    }

    /// Runs CPU work on the blocking pool behind a permit, and records it as `method`.
    async fn run<T: Send + 'static>(
        &self,
        method: &'static str,
        deadline: Option<Instant>,
        work: impl FnOnce(&State) -> Result<T, Status> + Send + 'static,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let result = on_pool(&self.state, deadline, work).await;
        self.state.metrics.observe(
            method,
            started.elapsed(),
            result.as_ref().err().map(Status::code),
        );
        result.map(Response::new)
    }
}

/// Runs CPU work on the blocking pool behind an in-flight permit, unless the deadline has passed by
/// the time it would start.
async fn on_pool<T: Send + 'static>(
    state: &Arc<State>,
    deadline: Option<Instant>,
    work: impl FnOnce(&State) -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    let permit = state.permit()?;
    let state = Arc::clone(state);
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        check_deadline(deadline)?;
        work(&state)
    })
    .await
    .map_err(|e| Status::internal(format!("worker failed: {e}")))?
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Sidecar for SidecarService {
    async fn info(
        &self,
        request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        self.run("Info", deadline_of(&request), |s| Ok(engine::info(s)))
            .await
    }

    async fn tokenize(
        &self,
        request: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run("Tokenize", deadline, move |s| engine::tokenize(s, r))
            .await
    }

    async fn detokenize(
        &self,
        request: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run("Detokenize", deadline, move |s| engine::detokenize(s, r))
            .await
    }

    async fn count(
        &self,
        request: Request<pb::CountRequest>,
    ) -> Result<Response<pb::CountResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run("Count", deadline, move |s| engine::count(s, r))
            .await
    }

    async fn next_token_distribution(
        &self,
        request: Request<pb::NextTokenDistributionRequest>,
    ) -> Result<Response<pb::NextTokenDistributionResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run("NextTokenDistribution", deadline, move |s| {
            engine::next_token_distribution(s, r)
        })
        .await
    }

    async fn search_documents(
        &self,
        request: Request<pb::SearchDocumentsRequest>,
    ) -> Result<Response<pb::SearchDocumentsResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run("SearchDocuments", deadline, move |s| {
            engine::search_documents(s, r)
        })
        .await
    }

    async fn mix(
        &self,
        request: Request<pb::MixRequest>,
    ) -> Result<Response<pb::MixResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run("Mix", deadline, move |s| mixing::mix(s, r)).await
    }

    async fn draft(
        &self,
        request: Request<pb::DraftRequest>,
    ) -> Result<Response<pb::DraftResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run("Draft", deadline, move |s| drafting::draft(s, r))
            .await
    }

    type ScoreStream = ResponseStream<pb::ScoreResponse>;

    async fn score(
        &self,
        request: Request<pb::ScoreRequest>,
    ) -> Result<Response<Self::ScoreStream>, Status> {
        let deadline = deadline_of(&request);
        let stream = score::start(Arc::clone(&self.state), request.into_inner(), deadline)?;
        Ok(Response::new(Box::pin(stream)))
    }

    type SessionStream = ResponseStream<pb::SessionResponse>;

    async fn session(
        &self,
        request: Request<Streaming<pb::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let stream = session::start(Arc::clone(&self.state), request.into_inner())?;
        Ok(Response::new(Box::pin(stream)))
    }
}
