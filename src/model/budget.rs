//! The memory the own model's KV caches may take, over every session and request at once. A cache
//! costs tens of kB per token (≈ 46 kB for SmolLM2-135M), so sessions with `use_model` would
//! otherwise grow without bound: a step that would go past the budget is refused
//! ([`ModelError::Exhausted`]) and changes nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;

use super::ModelError;

/// Tokens the caches may hold together, and how many are taken.
pub struct KvBudget {
    max: usize,
    used: AtomicUsize,
    gauge: Gauge,
}

impl KvBudget {
    pub fn new(max: usize, gauge: Gauge) -> Arc<Self> {
        Arc::new(Self {
            max,
            used: AtomicUsize::new(0),
            gauge,
        })
    }

    fn take(&self, tokens: usize) -> Result<(), ModelError> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(tokens).filter(|&total| total <= self.max)
            })
            .map_err(|used| {
                ModelError::Exhausted(format!(
                    "the model's KV caches hold {used} tokens; {tokens} more would pass the limit of {} (limits.max_kv_tokens)",
                    self.max
                ))
            })?;
        self.gauge.inc_by(tokens as i64);
        Ok(())
    }

    fn give_back(&self, tokens: usize) {
        self.used.fetch_sub(tokens, Ordering::AcqRel);
        self.gauge.dec_by(tokens as i64);
    }
}

/// Tokens of the budget held by one cache, given back when dropped.
pub struct KvReservation {
    budget: Arc<KvBudget>,
    tokens: usize,
}

impl KvReservation {
    /// A reservation of `tokens`, or [`ModelError::Exhausted`].
    pub fn new(budget: &Arc<KvBudget>, tokens: usize) -> Result<Self, ModelError> {
        budget.take(tokens)?;
        Ok(Self {
            budget: Arc::clone(budget),
            tokens,
        })
    }

    /// Grows the reservation to `tokens` (or shrinks it); refused, it stays as it was.
    pub fn resize(&mut self, tokens: usize) -> Result<(), ModelError> {
        if tokens > self.tokens {
            self.budget.take(tokens - self.tokens)?;
            self.tokens = tokens;
        } else {
            self.shrink(tokens);
        }
        Ok(())
    }

    /// Gives back what is held past `tokens` (nothing when it holds no more).
    pub fn shrink(&mut self, tokens: usize) {
        if tokens < self.tokens {
            self.budget.give_back(self.tokens - tokens);
            self.tokens = tokens;
        }
    }
}

impl Drop for KvReservation {
    fn drop(&mut self) {
        self.budget.give_back(self.tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_within_the_budget_and_come_back() {
        let gauge = Gauge::default();
        let budget = KvBudget::new(100, gauge.clone());
        let mut a = KvReservation::new(&budget, 60).unwrap();
        let err = KvReservation::new(&budget, 41).err().unwrap();
        assert!(matches!(err, ModelError::Exhausted(_)), "{err}");
        let b = KvReservation::new(&budget, 40).unwrap();
        assert_eq!(gauge.get(), 100);
        // A failed growth keeps what was held.
        assert!(a.resize(61).is_err());
        a.shrink(10);
        assert_eq!(gauge.get(), 50);
        drop(b);
        a.resize(100).unwrap();
        drop(a);
        assert_eq!(gauge.get(), 0);
        assert!(KvReservation::new(&budget, 100).is_ok());
    }
}
