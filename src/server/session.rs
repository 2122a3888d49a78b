//! Decoding sessions: the sidecar keeps a [`Sequence`] (its ∞-gram match and, with `use_model`, its
//! own model's KV cache), so appending a token, taking tokens back and asking for the mixed
//! distribution cost O(new tokens) whatever the context's length. Each `Session` stream owns one
//! session, listed by id while the stream lives so other RPCs (drafting) can reach it. What this
//! file adds to the library's sequence is the streams' side: their steps, as the edge checked them
//! (`valid`), and their answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::metrics::Metrics;
use super::mixing::{mix_rule, neural_distribution, response, top};
use super::valid::{
    within_token_limit, ValidMixAsk, ValidSequenceStart, ValidSessionRequest, ValidSessionStep,
    Validate,
};
use super::{decode_status, drafting, index_status, model_status, on_pool_for_stream, pb, State};
use crate::decoding::Sequence;
use crate::draft::{DraftOptions, DraftTree};
use crate::model::budget::KvReservation;

/// One sequence of a decoding loop, as the requests' steps reach it.
pub(super) struct Session {
    seq: Sequence,
    /// Whether an answer of this session has named the gate's features already.
    features_named: bool,
}

impl Session {
    pub(super) fn new(s: &State, start: ValidSequenceStart) -> Result<Self, Status> {
        let model = match start.use_model {
            true => {
                let model = s.model()?.transformer();
                let kv =
                    KvReservation::new(&s.kv_budget, start.context.len()).map_err(model_status)?;
                Some((model, kv))
            }
            false => None,
        };
        let seq = drafting::sequence(s, start.context, start.extras)?;
        let seq = match model {
            Some((model, kv)) => seq.with_model(model, Some(kv)),
            None => seq,
        };
        Ok(Self {
            seq,
            features_named: false,
        })
    }

    pub(super) fn append(&mut self, s: &State, tokens: &[u32]) -> Result<(), Status> {
        within_token_limit(
            &s.limits,
            "the session",
            self.seq.tokens().len() + tokens.len(),
        )?;
        self.seq.append(tokens).map_err(decode_status)
    }

    pub(super) fn truncate(&mut self, length: u64) -> Result<(), Status> {
        let len = usize::try_from(length)
            .ok()
            .filter(|&l| l <= self.seq.tokens().len())
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "cannot keep {length} tokens of a session of {}",
                    self.seq.tokens().len()
                ))
            })?;
        self.seq.truncate(len).map_err(decode_status)
    }

    pub(super) fn mix(&mut self, s: &State, m: ValidMixAsk) -> Result<pb::MixResponse, Status> {
        let how = mix_rule(s, m.lambda, true, m.max_match)?;
        let neural = neural_distribution(s, m.neural, || {
            let model = s.model()?.transformer();
            if !self.seq.has_model() {
                return Err(Status::failed_precondition(
                    "own_model needs a session started with use_model",
                ));
            }
            if self.seq.tokens().is_empty() {
                return Err(Status::invalid_argument("the session has no tokens yet"));
            }
            self.seq.logits(model).map_err(decode_status)
        })?;
        let step = self
            .seq
            .mix(how, neural, top(m.top_k))
            .map_err(decode_status)?;
        let answer = response(step, !self.features_named);
        self.features_named |= !answer.gate_features.is_empty();
        Ok(answer)
    }

    /// A mix answer of this session that was not delivered: the features it named are named again
    /// in the next one.
    pub(super) fn undelivered(&mut self, mix: Option<&pb::MixResponse>) {
        if mix.is_some_and(|m| !m.gate_feature_names.is_empty()) {
            self.features_named = false;
        }
    }

    pub(super) fn draft(&mut self, opts: &DraftOptions) -> Result<pb::DraftResponse, Status> {
        let tree = self.seq.draft(opts).map_err(index_status)?;
        Ok(drafting::response(tree))
    }

    pub(super) fn state(&self, session_id: u64) -> pb::SessionState {
        pb::SessionState {
            session_id,
            length: self.seq.tokens().len() as u64,
            suffix_len: self.seq.suffix_len() as u32,
            prompt_cnt: self.seq.prompt_cnt(),
            warning: self.seq.warning().unwrap_or_default().to_string(),
        }
    }
}

pub(super) type Shared = Arc<Mutex<Session>>;

/// The open sessions, by id. An id is a capability: 64 random bits, so a client reaches only the
/// sessions whose ids it was given (its own), never another's by counting.
pub(super) struct Sessions {
    max: usize,
    open: Mutex<HashMap<u64, Shared>>,
    metrics: Arc<Metrics>,
}

/// A session of a live stream, listed in [`Sessions`] until the stream's task drops it.
pub(super) struct OpenSession {
    pub(super) id: u64,
    pub(super) shared: Shared,
    state: Arc<State>,
}

impl OpenSession {
    /// Lists a new session, or RESOURCE_EXHAUSTED when `max_sessions` are open.
    pub(super) fn register(state: &Arc<State>, shared: Shared) -> Result<Self, Status> {
        let id = state.sessions.register(Arc::clone(&shared))?;
        Ok(Self {
            id,
            shared,
            state: Arc::clone(state),
        })
    }

    /// The session's state when no step holds it, without waiting. The stream's task runs on the
    /// runtime, and a step it gave up on (its client gone, the server draining) may still hold the
    /// session on the blocking pool while it waits on the runtime (a router's fan-out): waiting
    /// for that step there stalled the runtime for good (issue 52's chaos run).
    pub(super) fn state_if_idle(&self) -> Option<pb::SessionState> {
        match self.shared.try_lock() {
            Ok(session) => Some(session.state(self.id)),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner().state(self.id)),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.state.sessions.unregister(self.id);
    }
}

pub(super) fn lock(session: &Shared) -> MutexGuard<'_, Session> {
    // A step that panicked left the session as it was before it (steps validate first).
    session.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sessions {
    pub(super) fn new(max: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            max,
            open: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<u64, Shared>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self, session: Shared) -> Result<u64, Status> {
        let mut table = self.table();
        if table.len() >= self.max {
            return Err(Status::resource_exhausted(format!(
                "{} sessions are open, the limit",
                self.max
            )));
        }
        let id = loop {
            let id = getrandom::u64()
                .map_err(|e| Status::internal(format!("no randomness for a session id: {e}")))?;
            if id != 0 && !table.contains_key(&id) {
                break id;
            }
        };
        table.insert(id, session);
        self.metrics.sessions.inc();
        Ok(id)
    }

    fn unregister(&self, id: u64) {
        if self.table().remove(&id).is_some() {
            self.metrics.sessions.dec();
        }
    }

    /// The open session `id`, or NOT_FOUND.
    fn get(&self, id: u64) -> Result<Shared, Status> {
        self.table()
            .get(&id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no open session {id}")))
    }
}

/// The unary `Draft` for an open session: a draft continuing its sequence.
pub(super) fn draft(s: &State, id: u64, opts: &DraftOptions) -> Result<DraftTree, Status> {
    let session = s.sessions.get(id)?;
    let mut session = lock(&session);
    session.seq.draft(opts).map_err(index_status)
}

/// Serves one `Session` stream: steps run one at a time, in order, on the blocking pool. At a
/// shutdown's drain deadline the stream ends with UNAVAILABLE. A step stops when the client leaves
/// or the stream's `deadline` passes.
pub(super) fn start(
    state: Arc<State>,
    mut inbound: Streaming<pb::SessionRequest>,
    deadline: Option<Instant>,
) -> Result<ReceiverStream<Result<pb::SessionResponse, Status>>, Status> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut session: Option<OpenSession> = None;
        while let Some(request) = super::next_message(&state, &mut inbound, &tx, deadline).await {
            let started = Instant::now();
            let (method, reply) = step(&state, &mut session, request, deadline, &tx).await;
            let code = match &reply.result {
                Some(pb::session_response::Result::Error(e)) => Some(tonic::Code::from(e.code)),
                _ => None,
            };
            state.metrics.observe(method, started.elapsed(), code);
            if tx.is_closed() || tx.send(Ok(reply)).await.is_err() {
                break;
            }
        }
    });
    Ok(ReceiverStream::new(rx))
}

/// What a step answers beyond the session's state.
enum Answer {
    Mix(pb::MixResponse),
    Draft(pb::DraftResponse),
}

/// Runs one step and describes the session after it.
async fn step<R>(
    state: &Arc<State>,
    session: &mut Option<OpenSession>,
    request: pb::SessionRequest,
    deadline: Option<Instant>,
    answers: &mpsc::Sender<R>,
) -> (&'static str, pb::SessionResponse) {
    use pb::session_request::Step;
    let method = match &request.step {
        Some(Step::Start(_)) => "Session.start",
        Some(Step::Append(_)) => "Session.append",
        Some(Step::Truncate(_)) => "Session.truncate",
        Some(Step::Mix(_)) => "Session.mix",
        Some(Step::Draft(_)) => "Session.draft",
        None => "Session.none",
    };
    // The state after a step that ran is described by the step, under its lock.
    let mut described = None;
    let step = request.step.map(|step| step.validate(&state.limits));
    let outcome = match (step, session.as_ref()) {
        (Some(Err(invalid)), _) => Err(invalid.into()),
        (Some(Ok(ValidSessionRequest::Start(start))), None) => {
            open(state, start, deadline, answers).await.map(|opened| {
                *session = Some(opened);
                None
            })
        }
        (Some(Ok(ValidSessionRequest::Start(_))), Some(_)) => Err(Status::failed_precondition(
            "the session has started already",
        )),
        (_, None) => Err(Status::failed_precondition(
            "the first message of a session must be `start`",
        )),
        (None, Some(_)) => Err(Status::invalid_argument("an empty step")),
        (Some(Ok(ValidSessionRequest::Step(step))), Some(open)) => {
            let ran = run_step(state, open, step, deadline, answers).await;
            ran.and_then(|(answer, after)| {
                described = Some(after);
                answer
            })
        }
    };
    let described = described.or_else(|| session.as_ref().and_then(OpenSession::state_if_idle));
    let result = match outcome {
        Ok(Some(Answer::Mix(mix))) => Some(pb::session_response::Result::Mix(mix)),
        Ok(Some(Answer::Draft(draft))) => Some(pb::session_response::Result::Draft(draft)),
        Ok(None) => None,
        Err(status) => Some(pb::session_response::Result::Error(step_error(&status))),
    };
    (
        method,
        pb::SessionResponse {
            state: described,
            result,
        },
    )
}

/// A new session, open and listed.
async fn open<R>(
    state: &Arc<State>,
    start: ValidSequenceStart,
    deadline: Option<Instant>,
    answers: &mpsc::Sender<R>,
) -> Result<OpenSession, Status> {
    let new =
        on_pool_for_stream(state, deadline, answers, move |st| Session::new(st, start)).await?;
    OpenSession::register(state, Arc::new(Mutex::new(new)))
}

/// Runs a step of an open session: its answer (or refusal), and the session's state after it.
async fn run_step<R>(
    state: &Arc<State>,
    open: &OpenSession,
    step: ValidSessionStep,
    deadline: Option<Instant>,
    answers: &mpsc::Sender<R>,
) -> Result<(Result<Option<Answer>, Status>, pb::SessionState), Status> {
    let (shared, id) = (Arc::clone(&open.shared), open.id);
    on_pool_for_stream(state, deadline, answers, move |st| {
        let mut s = lock(&shared);
        let answer = match step {
            ValidSessionStep::Append(tokens) => s.append(st, &tokens).map(|_| None),
            ValidSessionStep::Truncate(length) => s.truncate(length).map(|_| None),
            ValidSessionStep::Mix(m) => s.mix(st, m).map(|m| Some(Answer::Mix(m))),
            ValidSessionStep::Draft(o) => s.draft(&o).map(|d| Some(Answer::Draft(d))),
        };
        Ok((answer, s.state(id)))
    })
    .await
}

/// A refused step's status, as a stream's answer carries it.
pub(super) fn step_error(status: &Status) -> pb::StepError {
    pb::StepError {
        code: status.code() as i32,
        message: status.message().to_string(),
    }
}
