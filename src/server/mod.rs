//! The gRPC service (`proto/sidecar/v1/sidecar.proto`) over the library: the engine's queries, the
//! tokenizer, mixing with the caller's or the sidecar's own neural distribution, document scoring and
//! decoding sessions. CPU work runs on tokio's blocking pool behind a semaphore, so a full sidecar
//! answers RESOURCE_EXHAUSTED instead of queueing without bound.

mod batch;
pub mod config;
mod drafting;
mod engine;
mod kv_budget;
mod listen;
pub mod metrics;
mod mix_sequences;
mod mixing;
mod observe;
mod router;
mod score;
mod serve;
mod session;
mod shard;

pub use serve::serve;

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::cpu::{CpuInfo, KernelFlavour};
use crate::evidence::{byte_reference, EvidenceError, ReferenceData};
use crate::index::fm::CompressedIndex;
use crate::index::{Index, IndexError, OpenOptions, TokenWidth};
use crate::interrupt::{StopReason, StopSignal};
use crate::live::{LiveError, LiveIndex, LiveStore, Vocabulary};
use crate::mix::{MixError, MixingParams};
use crate::model::{LoadOptions, Model, ModelError};
use crate::tokenizer::Tokenizer;
use config::{ConfigError, Limits, Role, ServeConfig};
use engine::EitherIndex;
use kv_budget::KvBudget;
use metrics::Metrics;
use mix_sequences::MixSequences;
use session::Sessions;

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

/// The generated code of the API.
pub mod pb {
    tonic::include_proto!("sidecar.v1");
    /// For gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("sidecar_v1_descriptor");
}

/// The generated code of the protocol between routers and shard servers.
pub mod shard_pb {
    tonic::include_proto!("sidecar.shard.v1");
}

use pb::sidecar_server::Sidecar;

/// What every request reads.
struct State {
    /// The index of a single sidecar or a shard server; `None` in a router and over a
    /// compressed index.
    index: Option<Arc<Index>>,
    /// The compressed index a sidecar serves instead (`index compress`).
    compressed: Option<Arc<CompressedIndex>>,
    /// Where scoring, mixing and drafting get the ∞-gram's evidence: the index, or a router's
    /// shard servers.
    reference: Arc<dyn ReferenceData>,
    tokenizer: Tokenizer,
    mixing: Option<MixingParams>,
    model: Option<Model>,
    /// The CPU under the model's kernels, as `Info` reports it.
    cpu: CpuInfo,
    limits: Limits,
    in_flight: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    sessions: Sessions,
    /// `Mix` calls' sequences, by the id they name.
    mix_sequences: MixSequences,
    kv_budget: Arc<KvBudget>,
    /// Where sessions with a namespace learn and draft from; `None` when `[live]` is off.
    live: Option<Arc<dyn LiveStore>>,
    /// Set once the drain deadline of a shutdown has passed: open streams and running work end
    /// with UNAVAILABLE.
    closing: watch::Sender<bool>,
}

#[derive(Clone)]
pub struct SidecarService {
    state: Arc<State>,
}

/// Where a service's evidence comes from, and what reads ids and text for it.
struct Evidence {
    index: Option<Arc<Index>>,
    compressed: Option<Arc<CompressedIndex>>,
    reference: Arc<dyn ReferenceData>,
    tokenizer: Tokenizer,
    live: Option<Arc<dyn LiveStore>>,
}

/// A config's mixing file and model, loaded (the model's kernels as the config asks).
struct Neural {
    mixing: Option<MixingParams>,
    model: Option<Model>,
}

impl Neural {
    fn load(config: &ServeConfig) -> Result<Self, ServeError> {
        let mixing = config
            .mixing
            .as_deref()
            .map(MixingParams::load)
            .transpose()?;
        if let Some(threads) = config.model_threads {
            crate::model::set_cpu_threads(threads);
        }
        let model = config
            .model
            .as_deref()
            .map(|path| {
                let kernels = KernelFlavour::requested(config.cpu.as_deref())?;
                let opts = LoadOptions {
                    kernels: Some(kernels),
                    ..LoadOptions::default()
                };
                let model = Model::load(path, &opts)?;
                // Bits per byte need every token's spelling: worked out now, not on a request.
                model.tokenizer().spelling(0);
                Ok::<_, crate::model::ModelError>(model)
            })
            .transpose()?;
        Ok(Self { mixing, model })
    }

    /// Beside a byte-level index: any model, and a mixing file fitted against one with this model.
    fn check_byte_level(&self) -> Result<(), ServeError> {
        match (&self.mixing, &self.model) {
            (Some(m), Some(model)) => Ok(m.check_pairing(model.tokenizer().fingerprint(), true)?),
            (Some(_), None) => Err(ServeError::Setup(
                "a mixing file beside a byte-level index needs the model it was fitted with".into(),
            )),
            (None, _) => Ok(()),
        }
    }

    /// Refuses a mixing file or a model fitted to another tokenizer than `whose`'s.
    fn check_tokenizer(&self, tokenizer: &Tokenizer, whose: &str) -> Result<(), ServeError> {
        if let Some(m) = &self.mixing {
            m.check_pairing(tokenizer.fingerprint(), false)?;
        }
        if let Some(m) = &self.model {
            m.check_tokenizer(tokenizer.fingerprint(), whose)?;
        }
        Ok(())
    }
}

/// What a request gets when its work was stopped by its [`StopSignal`]; [`on_pool`] turns it into
/// the status that says why.
fn stopped() -> Status {
    Status::cancelled("the work was stopped")
}

fn index_status(e: IndexError) -> Status {
    match e {
        IndexError::Invalid(m) => Status::invalid_argument(m),
        IndexError::Unsupported(m) => Status::failed_precondition(m),
        IndexError::Interrupted => stopped(),
        IndexError::Remote { code, message } => Status::new(code, message),
        other => Status::internal(other.to_string()),
    }
}

fn evidence_status(e: EvidenceError) -> Status {
    match e {
        EvidenceError::Index(e) => index_status(e),
        EvidenceError::Mix(e) => mix_status(e),
        EvidenceError::Model(e) => model_status(e),
    }
}

fn live_status(e: LiveError) -> Status {
    match e {
        LiveError::Invalid(m) => Status::invalid_argument(m),
        LiveError::Full(m) => Status::resource_exhausted(m),
        LiveError::Index(e) => index_status(e),
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
        ModelError::Interrupted => stopped(),
        other => Status::internal(other.to_string()),
    }
}

/// The status of work that `signal` stopped (a deadline, the client leaving, or the drain deadline
/// of a shutdown); other outcomes pass unchanged.
fn stop_status<T>(
    state: &State,
    signal: &StopSignal,
    outcome: Result<T, Status>,
) -> Result<T, Status> {
    match (outcome, signal.reason()) {
        (Err(status), Some(reason)) if status.code() == tonic::Code::Cancelled => {
            Err(match reason {
                _ if *state.closing.borrow() => closing_status(),
                StopReason::Deadline => {
                    Status::deadline_exceeded("the deadline passed before the work was done")
                }
                StopReason::Cancelled => Status::cancelled("the client went away"),
            })
        }
        (outcome, _) => outcome,
    }
}

fn closing_status() -> Status {
    Status::unavailable("the sidecar is shutting down")
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

/// Refuses a `max_support` above the limit (0, exact, is always allowed).
fn check_max_support(limits: &Limits, max_support: u64) -> Result<(), Status> {
    if max_support > limits.max_support {
        return Err(Status::invalid_argument(format!(
            "max_support must be at most {}",
            limits.max_support
        )));
    }
    Ok(())
}

/// Refuses a request part longer than `max_context_tokens`.
fn check_len(limits: &Limits, what: &str, len: usize) -> Result<(), Status> {
    if len > limits.max_context_tokens {
        return Err(Status::invalid_argument(format!(
            "{what} has {len} tokens, more than the limit of {}",
            limits.max_context_tokens
        )));
    }
    Ok(())
}

/// Bytes of text a token stands for at most on average, however the text is written: text longer
/// than the token limit times this is refused before it is tokenized (tokenizing megabytes to then
/// refuse the ids on their count would be the work the limit is there to stop).
const MAX_TEXT_BYTES_PER_TOKEN: usize = 16;

fn check_text(limits: &Limits, what: &str, text: &str) -> Result<(), Status> {
    let most = limits
        .max_context_tokens
        .saturating_mul(MAX_TEXT_BYTES_PER_TOKEN);
    if text.len() > most {
        return Err(Status::invalid_argument(format!(
            "{what} has {} bytes of text, more than the {most} that the limit of {} tokens allows",
            text.len(),
            limits.max_context_tokens
        )));
    }
    Ok(())
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
        check_len(&self.limits, what, len)
    }

    fn check_text(&self, what: &str, text: &str) -> Result<(), Status> {
        check_text(&self.limits, what, text)
    }

    /// Refuses ids outside the vocabulary of mixing requests: the reference data's, or the
    /// model's where the index is byte-level (any model's text goes into it).
    fn check_model_ids(&self, ids: &[u32]) -> Result<(), Status> {
        match self.reference.byte_index() {
            Some(_) => self
                .model()?
                .transformer()
                .check_tokens(ids)
                .map_err(model_status),
            None => self.reference.check_ids(ids).map_err(index_status),
        }
    }

    /// The tokenizer of sequences (sessions, drafts, live documents): the model's beside a
    /// byte-level index, which follows the model's tokens then, else the index's.
    fn sequence_tokenizer(&self) -> &Tokenizer {
        match (self.reference.byte_index(), &self.model) {
            (Some(_), Some(model)) => model.tokenizer(),
            _ => &self.tokenizer,
        }
    }

    /// The vocabulary of mixing requests (see [`Self::check_model_ids`]).
    fn mix_vocab_size(&self) -> Result<u64, Status> {
        match self.reference.byte_index() {
            Some(_) => Ok(self.model()?.tokenizer().vocab_size()),
            None => Ok(self.reference.vocab_size()),
        }
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

    /// Resolves once the drain deadline of a shutdown has passed (never before).
    async fn closed(&self) {
        let mut closing = self.closing.subscribe();
        if closing.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The index, for the calls that read it directly (a router answers those itself). Over a
    /// compressed index, the calls it does not answer are refused with the index that does.
    fn index(&self) -> Result<&Index, Status> {
        if let Some(compressed) = &self.compressed {
            return Err(Status::failed_precondition(format!(
                "this call needs a suffix-array index, and {} is a compressed one (count, \
                 distributions, mixing, scoring, sessions, drafts and document search only): \
                 serve the index it was compressed from",
                compressed.dir().display()
            )));
        }
        self.index
            .as_deref()
            .ok_or_else(|| Status::internal("this service holds no index"))
    }

    /// Either kind of index, for the calls both answer.
    fn either_index(&self) -> Result<EitherIndex<'_>, Status> {
        match &self.compressed {
            Some(c) => Ok(EitherIndex::Compressed(c)),
            None => self.index().map(EitherIndex::SuffixArray),
        }
    }

    fn model(&self) -> Result<&Model, Status> {
        self.model.as_ref().ok_or_else(|| {
            Status::failed_precondition("the sidecar runs no model: set `model` in its config")
        })
    }
}

/// The live index of a config that turns it on, over `vocab`'s ids.
fn open_live(
    config: &ServeConfig,
    vocab: impl FnOnce() -> Result<Vocabulary, ServeError>,
) -> Result<Option<Arc<dyn LiveStore>>, ServeError> {
    config
        .live
        .config()
        .map(|live| Ok(Arc::new(LiveIndex::open(live, vocab()?)?) as Arc<dyn LiveStore>))
        .transpose()
}

/// The live index's vocabulary where it holds a model's tokens.
fn model_vocabulary(tokenizer: &Tokenizer) -> Result<Vocabulary, ServeError> {
    let eos_token_id = tokenizer.eos_token_id().ok_or_else(|| {
        ServeError::Setup("the live index needs the model's tokenizer to name an eos token".into())
    })?;
    Ok(Vocabulary {
        width: TokenWidth::for_vocab(tokenizer.vocab_size()),
        eos_token_id,
        vocab_size: tokenizer.vocab_size(),
    })
}

impl SidecarService {
    /// Opens the index (with its tokenizer), the mixing file and the model of a config.
    pub fn open(config: &ServeConfig) -> Result<Self, ServeError> {
        Self::open_with_metrics(config, Arc::new(Metrics::default()))
    }

    pub fn open_with_metrics(
        config: &ServeConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ServeError> {
        config.check()?;
        if crate::index::fm::is_compressed(&config.index) {
            return Self::open_compressed(config, metrics);
        }
        let opts = OpenOptions {
            sample_ranks: config.sample_ranks,
            ..OpenOptions::default()
        };
        let index = Arc::new(Index::open(&config.index, &opts)?);
        let tokenizer = index.tokenizer().cloned().ok_or_else(|| {
            ServeError::Setup(format!(
                "{}: the index has no tokenizer",
                config.index.display()
            ))
        })?;
        let neural = Neural::load(config)?;
        if index.is_byte_level() {
            if neural.model.is_some() && config.cluster.role == Role::Shard {
                return Err(ServeError::Setup(
                    "a shard server over a byte-level index follows its routers' byte ids: it \
                     takes no model"
                        .into(),
                ));
            }
            neural.check_byte_level()?;
            if let Some(model) = &neural.model {
                // What a byte index reads of the model's vocabulary: worked out now, not on a
                // request.
                model.tokenizer().spelling_order();
            }
        } else {
            neural.check_tokenizer(&tokenizer, "the index")?;
        }
        // Beside a model, a byte index follows the model's tokens: sequences (sessions, drafts,
        // live documents) hold those.
        let model_over_bytes = neural.model.as_ref().filter(|_| index.is_byte_level());
        let live = open_live(config, || match model_over_bytes {
            Some(model) => model_vocabulary(model.tokenizer()),
            None => Ok(Vocabulary {
                width: index.width(),
                eos_token_id: index.eos_token_id(),
                vocab_size: index.vocab_size(),
            }),
        })?;
        let reference: Arc<dyn ReferenceData> = match &neural.model {
            Some(model) => byte_reference::for_model(index.clone(), model.tokenizer()),
            None => index.clone(),
        };
        Ok(Self::assemble(
            config,
            metrics,
            Evidence {
                index: Some(index),
                compressed: None,
                reference,
                tokenizer,
                live,
            },
            neural,
        ))
    }

    /// A sidecar over a compressed index of tokens (a byte-level index is followed in a model's
    /// tokens by reading suffix arrays), and no shard server (routers merge suffix-array answers).
    fn open_compressed(config: &ServeConfig, metrics: Arc<Metrics>) -> Result<Self, ServeError> {
        if config.sample_ranks {
            tracing::warn!(
                "sample_ranks is for suffix-array indexes: a compressed index ignores it"
            );
        }
        let index = Arc::new(CompressedIndex::open(&config.index)?);
        let tokenizer = index.tokenizer().cloned().ok_or_else(|| {
            ServeError::Setup(format!(
                "{}: the index has no tokenizer",
                config.index.display()
            ))
        })?;
        if config.cluster.role == Role::Shard {
            return Err(ServeError::Setup(
                "a shard server answers its routers from a suffix-array index, not a compressed one"
                    .into(),
            ));
        }
        if tokenizer.is_utf8_bytes() {
            return Err(ServeError::Setup(
                "a compressed byte-level index is not served: over bytes, mixing, sessions and \
                 drafts follow a model's tokens, which only a suffix-array index does; serve the \
                 index it was compressed from"
                    .into(),
            ));
        }
        let neural = Neural::load(config)?;
        neural.check_tokenizer(&tokenizer, "the index")?;
        let live = open_live(config, || {
            Ok(Vocabulary {
                width: index.width(),
                eos_token_id: index.eos_token_id(),
                vocab_size: index.vocab_size(),
            })
        })?;
        Ok(Self::assemble(
            config,
            metrics,
            Evidence {
                index: None,
                compressed: Some(index.clone()),
                reference: index,
                tokenizer,
                live,
            },
            neural,
        ))
    }

    /// A service over `evidence` with `neural` (a router's, over its shard servers, has no index).
    fn assemble(
        config: &ServeConfig,
        metrics: Arc<Metrics>,
        evidence: Evidence,
        neural: Neural,
    ) -> Self {
        if let Some(live) = &evidence.live {
            metrics.watch_live(Arc::clone(live));
        }
        Self {
            state: Arc::new(State {
                index: evidence.index,
                compressed: evidence.compressed,
                reference: evidence.reference,
                tokenizer: evidence.tokenizer,
                mixing: neural.mixing,
                model: neural.model,
                cpu: CpuInfo::detect(),
                limits: config.limits,
                in_flight: Arc::new(Semaphore::new(config.limits.max_in_flight)),
                sessions: Sessions::new(config.limits.max_sessions, Arc::clone(&metrics)),
                mix_sequences: MixSequences::default(),
                kv_budget: KvBudget::new(config.limits.max_kv_tokens, metrics.kv_tokens.clone()),
                live: evidence.live,
                metrics,
                closing: watch::channel(false).0,
            }),
        }
    }

    /// Ends open streams and running work with UNAVAILABLE: the drain deadline of a shutdown.
    pub(crate) fn close_streams(&self) {
        self.state.closing.send_replace(true);
    }

    /// Stops the live index's compactor and keeps what it learnt (`LiveIndex::close`).
    pub(crate) fn close_live(&self) {
        if let Some(live) = &self.state.live {
            live.close();
        }
    }

    /// Runs CPU work on the blocking pool behind a permit (metrics are the `observe` layer's).
    async fn run<T: Send + 'static>(
        &self,
        deadline: Option<Instant>,
        work: impl FnOnce(&State) -> Result<T, Status> + Send + 'static,
    ) -> Result<Response<T>, Status> {
        on_pool(&self.state, deadline, work)
            .await
            .map(Response::new)
    }
}

/// Raises a stop signal when dropped: the future awaiting the work was dropped, because its
/// client went away.
struct StopOnDrop(StopSignal);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Runs CPU work on the blocking pool behind an in-flight permit, under a stop signal raised when
/// the deadline passes, when the caller goes away (this future is dropped) or when a shutdown's
/// drain deadline passes. The work's loops check it (`interrupt::interrupted`) and stop, so the
/// permit comes back within moments either way.
async fn on_pool<T: Send + 'static>(
    state: &Arc<State>,
    deadline: Option<Instant>,
    work: impl FnOnce(&State) -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    let permit = state.permit()?;
    let signal = StopSignal::new(deadline);
    let stop_on_drop = StopOnDrop(signal.clone());
    let worker_state = Arc::clone(state);
    let worker_signal = signal.clone();
    let worker = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        worker_signal.run(|| {
            if worker_signal.is_stopped() {
                return Err(stopped());
            }
            work(&worker_state)
        })
    });
    let outcome = tokio::select! {
        joined = worker => joined.map_err(|e| Status::internal(format!("worker failed: {e}")))?,
        _ = state.closed() => {
            signal.cancel();
            Err(closing_status())
        }
    };
    let answer = stop_status(state, &signal, outcome);
    // The work is over: raising the signal now changes nothing.
    drop(stop_on_drop);
    answer
}

/// Runs one step of a stream (`Session`, `Batch`) as [`on_pool`] runs a unary call's work, under
/// the stream's deadline, and stops it as soon as the client leaves: the stream's answers are no
/// longer received (`answers` closed), which drops the work's future and so raises its stop signal.
/// The spawned task that serves a stream is nobody's future, so without this a departed client's
/// step ran to its end, holding its permit and its sequences' KV tokens.
async fn on_pool_for_stream<T: Send + 'static, R>(
    state: &Arc<State>,
    deadline: Option<Instant>,
    answers: &tokio::sync::mpsc::Sender<R>,
    work: impl FnOnce(&State) -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::select! {
        outcome = on_pool(state, deadline, work) => outcome,
        _ = answers.closed() => Err(Status::cancelled("the client went away")),
    }
}

/// The next message of a client's stream; `None` once the client ended it (or broke it), once a
/// shutdown's drain deadline passed (the client is told with UNAVAILABLE), or once the stream's
/// `deadline` passed (DEADLINE_EXCEEDED: the call is over, as a unary call's would be).
async fn next_message<T, R>(
    state: &State,
    inbound: &mut Streaming<T>,
    tx: &tokio::sync::mpsc::Sender<Result<R, Status>>,
    deadline: Option<Instant>,
) -> Option<T> {
    let expired = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        message = inbound.message() => message.ok().flatten(),
        _ = state.closed() => {
            let _ = tx.send(Err(closing_status())).await;
            None
        }
        _ = expired => {
            let _ = tx.send(Err(Status::deadline_exceeded("the stream's deadline passed"))).await;
            None
        }
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Sidecar for SidecarService {
    async fn info(
        &self,
        request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        self.run(deadline_of(&request), engine::info).await
    }

    async fn tokenize(
        &self,
        request: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| engine::tokenize(s, r)).await
    }

    async fn detokenize(
        &self,
        request: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| engine::detokenize(s, r)).await
    }

    async fn count(
        &self,
        request: Request<pb::CountRequest>,
    ) -> Result<Response<pb::CountResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| engine::count(s, r)).await
    }

    async fn next_token_distribution(
        &self,
        request: Request<pb::NextTokenDistributionRequest>,
    ) -> Result<Response<pb::NextTokenDistributionResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| engine::next_token_distribution(s, r))
            .await
    }

    async fn search_documents(
        &self,
        request: Request<pb::SearchDocumentsRequest>,
    ) -> Result<Response<pb::SearchDocumentsResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| engine::search_documents(s, r))
            .await
    }

    async fn mix(
        &self,
        request: Request<pb::MixRequest>,
    ) -> Result<Response<pb::MixResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| mixing::mix(s, r)).await
    }

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<pb::GenerateResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| engine::generate(s, r)).await
    }

    async fn trace(
        &self,
        request: Request<pb::TraceRequest>,
    ) -> Result<Response<pb::TraceResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| engine::trace(s, r)).await
    }

    async fn hints(
        &self,
        request: Request<pb::HintsRequest>,
    ) -> Result<Response<pb::HintsResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| engine::hints(s, r)).await
    }

    async fn draft(
        &self,
        request: Request<pb::DraftRequest>,
    ) -> Result<Response<pb::DraftResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| {
            let opts = drafting::options(r.options)?;
            let tree = match r.target {
                Some(pb::draft_request::Target::SessionId(_))
                    if !r.namespace.is_empty() || !r.reference.is_empty() =>
                {
                    return Err(Status::invalid_argument(
                        "a session drafts from the namespace and reference it was started with",
                    ))
                }
                Some(pb::draft_request::Target::SessionId(id)) => session::draft(s, id, &opts)?,
                Some(pb::draft_request::Target::Context(c)) => {
                    let extras = crate::draft::Extras {
                        namespace: r.namespace,
                        reference: r.reference,
                        ..Default::default()
                    };
                    drafting::draft_context(s, c.ids, extras, &opts)?
                }
                None => return Err(Status::invalid_argument("name a session_id or a context")),
            };
            Ok(drafting::response(tree))
        })
        .await
    }

    async fn add_documents(
        &self,
        request: Request<pb::AddDocumentsRequest>,
    ) -> Result<Response<pb::AddDocumentsResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| drafting::add_documents(s, r))
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
        let deadline = deadline_of(&request);
        let stream = session::start(Arc::clone(&self.state), request.into_inner(), deadline)?;
        Ok(Response::new(Box::pin(stream)))
    }

    type BatchStream = ResponseStream<pb::BatchStepResult>;

    async fn batch(
        &self,
        request: Request<Streaming<pb::BatchStep>>,
    ) -> Result<Response<Self::BatchStream>, Status> {
        let deadline = deadline_of(&request);
        let stream = batch::start(Arc::clone(&self.state), request.into_inner(), deadline);
        Ok(Response::new(Box::pin(stream)))
    }
}
