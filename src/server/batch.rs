//! `Batch`: an inference engine's decoding loop over many sequences, one message per engine step
//! each way. Every sequence is a [`Session`] (the same steps, the same answers); what this file adds
//! is the batch's bookkeeping (the caller's ids, joining and leaving) and running a step's parts in
//! parallel, so a step costs one round trip whatever the batch size.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rayon::prelude::*;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::session::{lock, step_error, OpenSession, Session, Shared};
use super::valid::{ValidBatchPart, ValidSequenceStart, Validate};
use super::{on_pool_for_stream, pb, State};
use crate::interrupt::{current, run_under};

/// The sequence a part of a step works on.
enum Target {
    Open(Shared),
    New(ValidSequenceStart),
}

/// A part of a step as it runs: checked, with its sequence, or why it cannot run.
type Part = Result<(Target, ValidBatchPart), Status>;

/// What running one part gave: the session it made (a `start`), the answers or the refusal, and
/// the sequence's state afterwards (without the sidecar's id, which the caller's side knows).
struct PartOutcome {
    created: Option<Shared>,
    answer: Result<(Option<pb::MixResponse>, Option<pb::DraftResponse>), Status>,
    state: Option<pb::SessionState>,
}

/// Serves one `Batch` stream: steps run one at a time, in order, each on the blocking pool with its
/// parts in parallel. The stream's sequences end with it; at a shutdown's drain deadline it ends
/// with UNAVAILABLE. A step stops when the client leaves or the stream's `deadline` passes.
pub(super) fn start(
    state: Arc<State>,
    mut inbound: Streaming<pb::BatchStep>,
    deadline: Option<Instant>,
) -> ReceiverStream<Result<pb::BatchStepResult, Status>> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut open: HashMap<u64, OpenSession> = HashMap::new();
        while let Some(request) = super::next_message(&state, &mut inbound, &tx, deadline).await {
            let started = Instant::now();
            let reply = step(&state, &mut open, request, deadline, &tx).await;
            state.metrics.observe("Batch.step", started.elapsed(), None);
            if tx.is_closed() || tx.send(Ok(reply)).await.is_err() {
                break;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Runs one engine step: finds each part's sequence, runs the parts in parallel, then lists the new
/// sequences and drops the finished ones.
async fn step<R>(
    state: &Arc<State>,
    open: &mut HashMap<u64, OpenSession>,
    request: pb::BatchStep,
    deadline: Option<Instant>,
    answers: &mpsc::Sender<R>,
) -> pb::BatchStepResult {
    let mut seen = HashSet::with_capacity(request.sequences.len());
    let ids: Vec<(u64, bool)> = (request.sequences.iter())
        .map(|p| (p.id, p.finish))
        .collect();
    let parts: Vec<Part> = request
        .sequences
        .into_iter()
        .map(|part| {
            let id = part.id;
            if !seen.insert(id) {
                return Err(Status::invalid_argument(format!(
                    "sequence {id} appears twice in the step"
                )));
            }
            let mut part = part.validate(&state.limits)?;
            Ok((target(open, id, part.start.take())?, part))
        })
        .collect();
    let outcomes =
        on_pool_for_stream(state, deadline, answers, move |st| Ok(run_parts(st, parts))).await;
    let sequences = match outcomes {
        Ok(outcomes) => ids
            .into_iter()
            .zip(outcomes)
            .map(|((id, finish), outcome)| settle(state, open, id, finish, outcome))
            .collect(),
        // The step as a whole was refused (the in-flight limit, a shutdown): nothing changed.
        Err(status) => ids
            .into_iter()
            .map(|(id, _)| pb::SequenceResult {
                id,
                state: open.get(&id).and_then(OpenSession::state_if_idle),
                error: Some(step_error(&status)),
                ..Default::default()
            })
            .collect(),
    };
    pb::BatchStepResult { sequences }
}

/// Most threads of one step's parts that wait on shard servers at once.
const WAITING_THREADS: usize = 16;

/// Runs every part of a step, in order: on rayon's pool when the evidence is in this process; on
/// threads of their own when it comes from shard servers (a router), so the parts' network waits
/// overlap and hold none of the workers the model's kernels run on.
/// Every part runs under the step's stop signal, whichever thread takes it.
fn run_parts(st: &State, parts: Vec<Part>) -> Vec<PartOutcome> {
    let signal = current();
    let signal = signal.as_ref();
    if !st.evidence.waits_on_network() {
        return parts
            .into_par_iter()
            .map(|part| run_under(signal, || run_part(st, part)))
            .collect();
    }
    let per_thread = parts.len().div_ceil(WAITING_THREADS).max(1);
    let mut groups: Vec<Vec<Part>> = Vec::new();
    for (i, part) in parts.into_iter().enumerate() {
        if i % per_thread == 0 {
            groups.push(Vec::with_capacity(per_thread));
        }
        if let Some(group) = groups.last_mut() {
            group.push(part);
        }
    }
    std::thread::scope(|scope| {
        let threads: Vec<_> = groups
            .into_iter()
            .map(|group| {
                let parts = group.len();
                let thread = scope.spawn(move || {
                    group
                        .into_iter()
                        .map(|part| run_under(signal, || run_part(st, part)))
                        .collect::<Vec<_>>()
                });
                (parts, thread)
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|(parts, thread)| {
                thread.join().unwrap_or_else(|_| {
                    let failed =
                        || PartOutcome::refused(Status::internal("the part's worker failed"));
                    (0..parts).map(|_| failed()).collect()
                })
            })
            .collect()
    })
}

/// The sequence part `id` names: open, or to be started; refused when started twice or never.
fn target(
    open: &HashMap<u64, OpenSession>,
    id: u64,
    start: Option<ValidSequenceStart>,
) -> Result<Target, Status> {
    match (start, open.get(&id)) {
        (Some(_), Some(_)) => Err(Status::failed_precondition(format!(
            "sequence {id} has started already"
        ))),
        (Some(start), None) => Ok(Target::New(start)),
        (None, Some(o)) => Ok(Target::Open(Arc::clone(&o.shared))),
        (None, None) => Err(Status::not_found(format!(
            "no open sequence {id}: the first step of a sequence must `start` it"
        ))),
    }
}

/// Runs one sequence's part of a step, in the documented order, stopping at the first refusal.
fn run_part(st: &State, part: Part) -> PartOutcome {
    let (shared, new, part) = match part {
        Ok((Target::Open(shared), part)) => (shared, false, part),
        Ok((Target::New(start), part)) => match Session::new(st, start) {
            Ok(session) => (Arc::new(Mutex::new(session)), true, part),
            Err(status) => return PartOutcome::refused(status),
        },
        Err(status) => return PartOutcome::refused(status),
    };
    let (answer, state) = {
        let mut session = lock(&shared);
        let answer = apply(st, &mut session, part);
        (answer, Some(session.state(0)))
    };
    PartOutcome {
        created: new.then_some(shared),
        answer,
        state,
    }
}

impl PartOutcome {
    fn refused(status: Status) -> Self {
        Self {
            created: None,
            answer: Err(status),
            state: None,
        }
    }
}

fn apply(
    st: &State,
    session: &mut Session,
    part: ValidBatchPart,
) -> Result<(Option<pb::MixResponse>, Option<pb::DraftResponse>), Status> {
    if let Some(keep) = part.keep {
        session.truncate(keep)?;
    }
    if !part.append.is_empty() {
        session.append(st, &part.append)?;
    }
    let mix = part.mix.map(|m| session.mix(st, m)).transpose()?;
    let draft = part.draft.map(|d| session.draft(&d)).transpose();
    if draft.is_err() {
        // The part answers with the error alone: its mix answer is not delivered.
        session.undelivered(mix.as_ref());
    }
    Ok((mix, draft?))
}

/// Lists a sequence the part started, drops a finished one, and writes the part's answer.
fn settle(
    state: &Arc<State>,
    open: &mut HashMap<u64, OpenSession>,
    id: u64,
    finish: bool,
    outcome: PartOutcome,
) -> pb::SequenceResult {
    let PartOutcome {
        created,
        mut answer,
        state: mut described,
    } = outcome;
    let session_id = match (open.get(&id), created) {
        (Some(o), _) => {
            // A part refused before it ran (at the edge) still says where its sequence is.
            described = described.or_else(|| o.state_if_idle());
            Some(o.id)
        }
        (None, Some(shared)) => match OpenSession::register(state, shared) {
            Ok(registered) => {
                let session_id = registered.id;
                open.insert(id, registered);
                Some(session_id)
            }
            Err(status) => {
                answer = Err(status);
                described = None;
                None
            }
        },
        (None, None) => None,
    };
    if let (Some(d), Some(session_id)) = (&mut described, session_id) {
        d.session_id = session_id;
    }
    if finish {
        open.remove(&id);
    }
    let (mix, draft, error) = match answer {
        Ok((mix, draft)) => (mix, draft, None),
        Err(status) => (None, None, Some(step_error(&status))),
    };
    pb::SequenceResult {
        id,
        state: described,
        mix,
        draft,
        error,
    }
}
