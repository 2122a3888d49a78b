//! A router's view of its shard servers as the library's own faces, so the sidecar's scoring,
//! mixing, drafting, back-off and live index run in the router unchanged: their merged evidence
//! ([`evidence`], an `EvidenceSource`), back-off's levels ([`levels`], a `LevelSource`) and the
//! live namespaces their owners hold ([`live`], a `LiveStore`). Each waits on the fan-out
//! ([`super::fan_out`]) from a worker thread, under the deadline of the request it works for.

mod evidence;
mod levels;
mod live;

pub(crate) use evidence::{remote, RemoteEvidence};
pub(crate) use levels::RemoteLevels;
pub(crate) use live::RemoteLive;

use std::future::Future;

use tokio::runtime::Handle;
use tonic::Status;

use crate::index::IndexError;

/// Runs a call to shard servers to its end from a worker thread, on `runtime` (whose threads drive
/// it), unless the request this thread works for is stopped first (its client gone, the server
/// draining): then a step given up on lets go of its sequence at once, not when its shards answer.
fn wait_on_shards<T>(
    runtime: &Handle,
    call: impl Future<Output = Result<T, Status>>,
) -> Result<T, IndexError> {
    if crate::interrupt::interrupted() {
        return Err(IndexError::Interrupted);
    }
    let signal = crate::interrupt::current();
    let answered = runtime.block_on(async {
        match signal {
            Some(signal) => tokio::select! {
                answered = call => Some(answered),
                _ = signal.cancelled() => None,
            },
            None => Some(call.await),
        }
    });
    match answered {
        Some(answered) => answered.map_err(remote),
        None => Err(IndexError::Interrupted),
    }
}
