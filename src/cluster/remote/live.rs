//! The live index behind routers: each namespace lives on one shard, its **owner**, chosen by a
//! stable hash of its name over the set's shards. Every router sends the namespace's appends to
//! every replica of that shard and acknowledges one only when each replica has taken it (written
//! to its journal; documents also synced to its disk), so a replica killed, restarted or cut off
//! loses nothing acknowledged and any replica can answer drafts: they go to the first that
//! answers. While a replica of the owner is down, appends to its namespaces fail (UNAVAILABLE,
//! naming the shard and the replica) and may be sent again with the same request id; the
//! replicas that took the first try do not add it twice. So sequences behind different routers
//! learn from each other. A sequence's appends are best effort as on a single sidecar (one that
//! fails to learn stops learning); so are drafts (an owner that does not answer offers no live
//! draft this step).

use std::sync::Arc;

use tokio::runtime::Handle;
use xxhash_rust::xxh3::xxh3_64;

use super::{remote, wait_on_shards};
use crate::cluster::fan_out::{Members, ShardSet};
use crate::index::IndexError;
use crate::live::{Appended, Durability, LiveError, LiveStore, Piece, Result};
use crate::server::shard_pb as spb;

/// The shard servers' live indexes, each namespace on its owner.
pub(crate) struct RemoteLive {
    shards: Arc<ShardSet>,
    /// The runtime the calls run on (the service calls from its worker threads).
    runtime: Handle,
}

impl RemoteLive {
    /// Over `shards`; must be made on a thread of `runtime`'s.
    pub fn new(shards: Arc<ShardSet>) -> Self {
        Self {
            shards,
            runtime: Handle::current(),
        }
    }

    /// The set now, and the shard in it that owns `namespace` (a stable hash of its name).
    fn owner(&self, namespace: &str) -> std::result::Result<(Arc<Members>, usize), IndexError> {
        let members = self.shards.members().map_err(remote)?;
        let owner = (xxh3_64(namespace.as_bytes()) % members.shards() as u64) as usize;
        Ok((members, owner))
    }
}

/// A document id no shard server's own counter reaches: the high bit set, the rest random.
fn document_id() -> u64 {
    let random = getrandom::u64().unwrap_or_else(|_| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    random | 1 << 63
}

impl LiveStore for RemoteLive {
    fn new_document(&self) -> u64 {
        document_id()
    }

    /// One call to each replica of the owner, each of which adds the pieces all or none.
    fn append_pieces(
        &self,
        namespace: &str,
        pieces: &[Piece],
        request_id: &str,
        durability: Durability,
    ) -> Result<Appended> {
        let ask = spb::LiveAppendRequest {
            namespace: namespace.to_string(),
            pieces: (pieces.iter())
                .map(|p| spb::LivePiece {
                    doc: p.doc,
                    tokens: p.tokens.to_vec(),
                })
                .collect(),
            request_id: request_id.to_string(),
            sync: durability == Durability::Synced,
        };
        let (members, owner) = self.owner(namespace).map_err(LiveError::Index)?;
        let answers = wait_on_shards(
            &self.runtime,
            self.shards.call_every_replica(
                &members,
                owner,
                crate::interrupt::deadline(),
                &ask,
                |mut c, r| async move { c.live_append(r).await },
            ),
        )
        .map_err(LiveError::Index)?;
        Ok(match answers.iter().all(|a| a.repeated) {
            true => Appended::Repeated,
            false => Appended::Added,
        })
    }

    fn continuations(
        &self,
        namespace: &str,
        pattern: &[u32],
        samples: usize,
        depth: usize,
    ) -> (Vec<Vec<u32>>, usize) {
        let from = pattern
            .len()
            .saturating_sub(crate::live::namespace::MAX_MATCH);
        let ask = spb::LiveContinuationsRequest {
            namespace: namespace.to_string(),
            pattern: pattern[from..].to_vec(),
            samples: samples as u32,
            depth: depth as u32,
        };
        let answer = self.owner(namespace).and_then(|(members, owner)| {
            wait_on_shards(
                &self.runtime,
                self.shards.call_one(
                    &members,
                    owner,
                    crate::interrupt::deadline(),
                    &ask,
                    |mut c, r| async move { c.live_continuations(r).await },
                ),
            )
        });
        match answer {
            Ok(a) => (
                a.continuations.into_iter().map(|c| c.tokens).collect(),
                a.match_len as usize,
            ),
            Err(e) => {
                tracing::warn!(namespace, error = %e, "no live draft: the namespace's owner did not answer");
                (Vec::new(), 0)
            }
        }
    }
}
