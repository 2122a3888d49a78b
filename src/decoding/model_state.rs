//! The own model's state of a sequence: the KV cache of its first `cache.len()` tokens and the
//! logits after the whole sequence once computed. Tokens are run lazily, when logits are asked
//! for, so appending and taking back cost nothing on the model's side until then.

use crate::model::budget::KvReservation;
use crate::model::{KvCache, ModelError, Transformer};

pub(super) struct ModelState {
    pub(super) cache: KvCache,
    logits: Option<Vec<f32>>,
    /// The KV budget held for the sequence's whole length, when a budget is kept.
    reservation: Option<KvReservation>,
}

impl ModelState {
    pub(super) fn new(model: &Transformer, reservation: Option<KvReservation>) -> Self {
        Self {
            cache: model.new_cache(),
            logits: None,
            reservation,
        }
    }

    /// Holds the budget for a sequence of `len` tokens; refused, nothing changed.
    pub(super) fn reserve(&mut self, len: usize) -> Result<(), ModelError> {
        match &mut self.reservation {
            Some(r) => r.resize(len),
            None => Ok(()),
        }
    }

    /// Gives back the budget held past `len` tokens (an append that was refused after reserving).
    pub(super) fn unreserve(&mut self, len: usize) {
        if let Some(r) = &mut self.reservation {
            r.shrink(len);
        }
    }

    /// Tokens were appended: the logits are stale.
    pub(super) fn appended(&mut self) {
        self.logits = None;
    }

    /// The sequence was cut to `len` tokens.
    pub(super) fn truncate(&mut self, len: usize) {
        self.cache.truncate(len);
        self.logits = None;
        self.unreserve(len);
    }

    /// The logits after `tokens` (the whole sequence), running only the tokens the cache lacks.
    /// The last token is always run, so its logits come out even when it was cached. A failed
    /// pass leaves the cache at a prefix of the sequence (the model writes a pass's positions only
    /// once every layer has them).
    pub(super) fn logits(
        &mut self,
        model: &Transformer,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        let Some(last) = tokens.len().checked_sub(1) else {
            return Err(ModelError::Invalid("the sequence has no tokens yet".into()));
        };
        if let Some(logits) = &self.logits {
            return Ok(logits.clone());
        }
        let keep = self.cache.len().min(last);
        self.cache.truncate(keep);
        let logits = model
            .forward_last(&tokens[keep..], &mut self.cache)?
            .to_vec1::<f32>()?;
        self.logits = Some(logits.clone());
        Ok(logits)
    }
}
