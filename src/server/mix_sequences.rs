//! The sequences of `Mix` calls that name a `sequence_id`: each call sends the whole context, so the
//! sidecar keeps the sequence as the last call left it ([`Sequence::align`] brings it to the next
//! call's context: what followed the previous step teaches the adaptive λ, taken-back drafts are
//! forgotten, and the ∞-gram match follows the new tokens only). Bounded in number and in bytes
//! kept; the least recently used sequence goes first, and a forgotten one starts again from the
//! prior.
//!
//! Ids are shared by every caller of the sidecar (as one bearer token is): callers pick unique
//! ones (a UUID per sequence). Calls with one id are meant to come in order; two at once each see
//! the sequence as it was, and the last to finish is kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tonic::Status;

use super::{decode_status, index_status, State};
use crate::decoding::Sequence;

/// Sequences kept at once: each holds its last neural distribution (a vocabulary of floats).
const MAX_SEQUENCES: usize = 256;
/// Bytes kept over all sequences ([`Sequence::heap_bytes`]: contexts, their matches and position
/// lookups, pending distributions, posterior history).
const MAX_BYTES: usize = 256 << 20;
struct MixSequence {
    seq: Sequence,
    /// What keeping it costs, in bytes: measured once when it is put (a kept sequence does not
    /// change), not again under the table's lock.
    cost: usize,
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

    /// The sequence `id` brought up to `context` (a new one when `id` is not kept). Taken out of
    /// the table while the call mixes (a concurrent call with the same id starts afresh; a
    /// sequence's calls are meant to come in order). Refused, a kept sequence stays kept.
    pub(super) fn take(&self, id: &str, context: &[u32], s: &State) -> Result<Sequence, Status> {
        let taken = {
            let mut table = self.table();
            let taken = table.sequences.remove(id);
            if let Some(t) = &taken {
                table.bytes -= t.cost;
            }
            taken
        };
        let Some(MixSequence { mut seq, .. }) = taken else {
            return Sequence::new(Arc::clone(&s.evidence), context.to_vec()).map_err(index_status);
        };
        match seq.align(context) {
            Ok(()) => Ok(seq),
            Err(e) => {
                self.put(id.to_string(), seq);
                Err(decode_status(e))
            }
        }
    }

    /// Keeps `seq` under `id`, making room by forgetting the least recently used.
    pub(super) fn put(&self, id: String, seq: Sequence) {
        let cost = seq.heap_bytes();
        let mut table = self.table();
        table.clock += 1;
        let seq = MixSequence {
            seq,
            cost,
            last_used: table.clock,
        };
        table.bytes += seq.cost;
        if let Some(replaced) = table.sequences.insert(id, seq) {
            // A concurrent call with the same id put its own first.
            table.bytes -= replaced.cost;
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
                table.bytes -= gone.cost;
            }
        }
    }
}
