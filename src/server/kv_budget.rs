//! The memory the own model's KV caches may take, over every session and request at once. A cache
//! costs tens of kB per token (≈ 46 kB for SmolLM2-135M), so sessions with `use_model` would
//! otherwise grow without bound: a step that would go past the budget gets RESOURCE_EXHAUSTED and
//! changes nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use tonic::Status;

/// Tokens the caches may hold together, and how many are taken.
pub(super) struct KvBudget {
    max: usize,
    used: AtomicUsize,
    gauge: Gauge,
}

impl KvBudget {
    pub(super) fn new(max: usize, gauge: Gauge) -> Arc<Self> {
        Arc::new(Self {
            max,
            used: AtomicUsize::new(0),
            gauge,
        })
    }

    fn take(&self, tokens: usize) -> Result<(), Status> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(tokens).filter(|&total| total <= self.max)
            })
            .map_err(|used| {
                Status::resource_exhausted(format!(
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
pub(super) struct KvReservation {
    budget: Arc<KvBudget>,
    tokens: usize,
}

impl KvReservation {
    /// A reservation of `tokens`, or RESOURCE_EXHAUSTED.
    pub(super) fn new(budget: &Arc<KvBudget>, tokens: usize) -> Result<Self, Status> {
        budget.take(tokens)?;
        Ok(Self {
            budget: Arc::clone(budget),
            tokens,
        })
    }

    /// Grows or shrinks the reservation to `tokens`; on RESOURCE_EXHAUSTED it stays as it was.
    pub(super) fn resize(&mut self, tokens: usize) -> Result<(), Status> {
        if tokens > self.tokens {
            self.budget.take(tokens - self.tokens)?;
        } else {
            self.budget.give_back(self.tokens - tokens);
        }
        self.tokens = tokens;
        Ok(())
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
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        let b = KvReservation::new(&budget, 40).unwrap();
        assert_eq!(gauge.get(), 100);
        // A failed growth keeps what was held.
        assert!(a.resize(61).is_err());
        a.resize(10).unwrap();
        assert_eq!(gauge.get(), 50);
        drop(b);
        a.resize(100).unwrap();
        drop(a);
        assert_eq!(gauge.get(), 0);
        assert!(KvReservation::new(&budget, 100).is_ok());
    }
}
