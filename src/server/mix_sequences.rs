//! The sequences of `Mix` calls that name a `sequence_id`: each call sends the whole context, so the
//! sidecar keeps the last one to see which token followed the previous step (the adaptive λ learns
//! from it) and where drafts were taken back. Bounded in number and in bytes kept; the least
//! recently used sequence goes first, and a forgotten one starts again from the prior.
//!
//! Ids are shared by every caller of the sidecar (as one bearer token is): callers pick unique
//! ones (a UUID per sequence). Calls with one id are meant to come in order; two at once each see
//! the sequence as it was, and the last to finish is kept.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tonic::Status;

use super::State;
use crate::mix::AdaptiveSequence;

/// Sequences kept at once: each holds its last neural distribution (a vocabulary of floats).
const MAX_SEQUENCES: usize = 256;
/// Bytes kept over all sequences: contexts, pending distributions, posterior history.
const MAX_BYTES: usize = 256 << 20;
const MAX_ID_BYTES: usize = 256;

impl MixSequence {
    /// What keeping it costs, in bytes.
    fn cost(&self) -> usize {
        self.context.len() * 4 + self.adaptive.heap_bytes()
    }
}

/// Refuses an id too long to keep, before any work is done for the call.
pub(super) fn check_sequence_id(id: &str) -> Result<(), Status> {
    if id.len() > MAX_ID_BYTES {
        return Err(Status::invalid_argument(format!(
            "sequence_id has {} bytes, over {MAX_ID_BYTES}",
            id.len()
        )));
    }
    Ok(())
}

pub(super) struct MixSequence {
    context: Vec<u32>,
    pub(super) adaptive: AdaptiveSequence,
    last_used: u64,
}

#[derive(Default)]
pub(super) struct MixSequences {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    sequences: HashMap<String, MixSequence>,
    bytes: usize,
    clock: u64,
}

impl MixSequences {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sequence `id` brought up to `context`: the posterior forgets what followed the common
    /// prefix with its last context and learns the token after it, if a mixed step awaited that.
    /// Taken out of the table while the call mixes (a concurrent call with the same id starts
    /// afresh; a sequence's calls are meant to come in order).
    pub(super) fn take(&self, id: &str, context: &[u32], s: &State) -> Result<MixSequence, Status> {
        let params = s
            .mixing
            .as_ref()
            .ok_or_else(|| Status::failed_precondition("no mixing file is configured"))?;
        let taken = {
            let mut table = self.table();
            let taken = table.sequences.remove(id);
            if let Some(t) = &taken {
                table.bytes -= t.cost();
            }
            taken
        };
        let mut seq = taken.unwrap_or_else(|| MixSequence {
            context: Vec::new(),
            adaptive: AdaptiveSequence::new(&params.adaptive),
            last_used: 0,
        });
        let common = seq
            .context
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count();
        seq.adaptive.truncate(common);
        if let Some(&token) = context.get(common) {
            seq.adaptive.observe(common, token);
        }
        seq.context = context.to_vec();
        Ok(seq)
    }

    /// Keeps `seq` under `id`, making room by forgetting the least recently used.
    pub(super) fn put(&self, id: String, mut seq: MixSequence) {
        let mut table = self.table();
        table.clock += 1;
        seq.last_used = table.clock;
        table.bytes += seq.cost();
        if let Some(replaced) = table.sequences.insert(id, seq) {
            // A concurrent call with the same id put its own first.
            table.bytes -= replaced.cost();
        }
        while table.sequences.len() > MAX_SEQUENCES
            || (table.bytes > MAX_BYTES && table.sequences.len() > 1)
        {
            let Some(oldest) = table
                .sequences
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            if let Some(gone) = table.sequences.remove(&oldest) {
                table.bytes -= gone.cost();
            }
        }
    }
}
