//! What every request reads ([`State`]).

use std::sync::Arc;

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use super::config::Limits;
use super::metrics::Metrics;
use super::mix_sequences::MixSequences;
use super::session::Sessions;
use super::status::{index_status, model_status};
use crate::cluster::identity::Expected;
use crate::cluster::partial::PartialAnswers;
use crate::cpu::CpuInfo;
use crate::evidence::EvidenceSource;
use crate::live::LiveStore;
use crate::mix::MixingParams;
use crate::model::budget::KvBudget;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// What every request reads.
pub(super) struct State {
    /// The index every engine call and a shard server's partial answers read, of whichever kind;
    /// `None` in a router.
    pub(super) corpus: Option<Arc<dyn PartialAnswers>>,
    /// Which shard the corpus is, as routers' calls name it; `None` in a router.
    pub(super) shard: Option<Expected>,
    /// Where scoring, mixing and drafting get the ∞-gram's evidence: the index, or a router's
    /// shard servers.
    pub(super) evidence: Arc<dyn EvidenceSource>,
    pub(super) tokenizer: Tokenizer,
    pub(super) mixing: Option<MixingParams>,
    pub(super) model: Option<Model>,
    /// The CPU under the model's kernels, as `Info` reports it.
    pub(super) cpu: CpuInfo,
    pub(super) limits: Limits,
    pub(super) in_flight: Arc<Semaphore>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) sessions: Sessions,
    /// `Mix` calls' sequences, by the id they name.
    pub(super) mix_sequences: MixSequences,
    pub(super) kv_budget: Arc<KvBudget>,
    /// Where sessions with a namespace learn and draft from; `None` when `[live]` is off.
    pub(super) live: Option<Arc<dyn LiveStore>>,
    /// Set once the drain deadline of a shutdown has passed: open streams and running work end
    /// with UNAVAILABLE.
    pub(super) closing: watch::Sender<bool>,
}

/// A permit to do CPU work; the in-flight gauge follows it.
pub(super) struct WorkPermit {
    pub(super) _permit: OwnedSemaphorePermit,
    pub(super) metrics: Arc<Metrics>,
}

impl Drop for WorkPermit {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

impl State {
    /// A permit to do CPU work, or RESOURCE_EXHAUSTED when `max_in_flight` requests already run.
    pub(super) fn permit(&self) -> Result<WorkPermit, Status> {
        let permit = Arc::clone(&self.in_flight)
            .try_acquire_owned()
            .map_err(|_| Status::resource_exhausted("the sidecar is at its in-flight limit"))?;
        self.metrics.in_flight.inc();
        Ok(WorkPermit {
            _permit: permit,
            metrics: Arc::clone(&self.metrics),
        })
    }

    /// Refuses ids outside the vocabulary of mixing requests: the reference data's, or the
    /// model's where the index is byte-level (any model's text goes into it).
    pub(super) fn check_model_ids(&self, ids: &[u32]) -> Result<(), Status> {
        match self.evidence.over_bytes() {
            true => self
                .model()?
                .transformer()
                .check_tokens(ids)
                .map_err(model_status),
            false => self.evidence.check_ids(ids).map_err(index_status),
        }
    }

    /// The tokenizer of sequences (sessions, drafts, live documents): the model's beside a
    /// byte-level index, which follows the model's tokens then, else the index's.
    pub(super) fn sequence_tokenizer(&self) -> &Tokenizer {
        match (self.evidence.over_bytes(), &self.model) {
            (true, Some(model)) => model.tokenizer(),
            _ => &self.tokenizer,
        }
    }

    /// The vocabulary of mixing requests (see [`Self::check_model_ids`]).
    pub(super) fn mix_vocab_size(&self) -> Result<u64, Status> {
        match self.evidence.over_bytes() {
            true => Ok(self.model()?.tokenizer().vocab_size()),
            false => Ok(self.evidence.vocab_size()),
        }
    }

    /// Resolves once the drain deadline of a shutdown has passed (never before).
    pub(super) async fn closed(&self) {
        let mut closing = self.closing.subscribe();
        if closing.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The index, for the engine calls and a shard server's answers (a router answers those
    /// itself).
    pub(super) fn corpus(&self) -> Result<&dyn PartialAnswers, Status> {
        self.corpus
            .as_deref()
            .ok_or_else(|| Status::internal("this service holds no index"))
    }

    pub(super) fn model(&self) -> Result<&Model, Status> {
        self.model.as_ref().ok_or_else(|| {
            Status::failed_precondition("the sidecar runs no model: set `model` in its config")
        })
    }
}
