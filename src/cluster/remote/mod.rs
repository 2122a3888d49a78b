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
