//! Where CPU work runs: tokio's blocking pool behind the in-flight semaphore, under a stop signal
//! raised by the deadline, the client leaving or a shutdown's drain deadline.

use std::sync::Arc;
use std::time::Instant;

use tonic::{Response, Status, Streaming};

use super::observe::record_work;
use super::status::{closing_status, stop_status, stopped};
use super::{SidecarService, State};
use crate::interrupt::StopSignal;

impl SidecarService {
    /// Runs CPU work on the blocking pool behind a permit (metrics are the `observe` layer's).
    pub(super) async fn run<T: Send + 'static>(
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
pub(super) async fn on_pool<T: Send + 'static>(
    state: &Arc<State>,
    deadline: Option<Instant>,
    work: impl FnOnce(&State) -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    let permit = state.permit()?;
    let signal = StopSignal::new(deadline);
    let stop_on_drop = StopOnDrop(signal.clone());
    let worker_state = Arc::clone(state);
    let sent = Instant::now();
    let worker = spawn_under(&signal, move || {
        let _permit = permit;
        work(&worker_state)
    });
    let outcome = tokio::select! {
        joined = worker => {
            let (outcome, started) = joined.map_err(worker_failed)?;
            record_work(started - sent, started.elapsed());
            outcome
        }
        _ = state.closed() => {
            signal.cancel();
            Err(closing_status())
        }
    };
    let answer = stop_status(*state.closing.borrow(), &signal, outcome);
    // The work is over: raising the signal now changes nothing.
    drop(stop_on_drop);
    answer
}

/// Runs a router's own CPU work (back-off generation, which waits on its shards) on the blocking
/// pool as [`on_pool`] runs a sidecar's, stopped by its deadline and by its caller leaving; the
/// router holds its in-flight permit itself.
pub(super) async fn on_pool_alone<T: Send + 'static>(
    deadline: Option<Instant>,
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    let signal = StopSignal::new(deadline);
    let stop_on_drop = StopOnDrop(signal.clone());
    let (outcome, _) = spawn_under(&signal, work).await.map_err(worker_failed)?;
    let answer = stop_status(false, &signal, outcome);
    drop(stop_on_drop);
    answer
}

/// `work` on the blocking pool under `signal` (not started if it is already raised), with when it
/// started.
fn spawn_under<T: Send + 'static>(
    signal: &StopSignal,
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> tokio::task::JoinHandle<(Result<T, Status>, Instant)> {
    let signal = signal.clone();
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let outcome = signal.run(|| match signal.is_stopped() {
            true => Err(stopped()),
            false => work(),
        });
        (outcome, started)
    })
}

fn worker_failed(e: tokio::task::JoinError) -> Status {
    Status::internal(format!("worker failed: {e}"))
}

/// Runs one step of a stream (`Session`, `Batch`) as [`on_pool`] runs a unary call's work, under
/// the stream's deadline, and stops it as soon as the client leaves: the stream's answers are no
/// longer received (`answers` closed), which drops the work's future and so raises its stop signal.
/// The spawned task that serves a stream is nobody's future, so without this a departed client's
/// step ran to its end, holding its permit and its sequences' KV tokens.
pub(super) async fn on_pool_for_stream<T: Send + 'static, R>(
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
pub(super) async fn next_message<T, R>(
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
