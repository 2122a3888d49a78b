//! The request ids of recent appends, so that a client that lost an answer can send the same
//! request again without adding its documents twice. Bounded: the oldest ids are forgotten first,
//! and a restart forgets all but those of appends still in a journal (read back at open).

use std::collections::{HashSet, VecDeque};

/// Ids remembered over all namespaces.
pub const REMEMBERED: usize = 16_384;

#[derive(Default)]
pub struct RecentRequests {
    order: VecDeque<(String, String)>,
    seen: HashSet<(String, String)>,
}

impl RecentRequests {
    /// Whether `id` was recorded for `namespace` (never for an empty id).
    pub fn seen(&self, namespace: &str, id: &str) -> bool {
        !id.is_empty() && self.seen.contains(&(namespace.to_string(), id.to_string()))
    }

    /// The ids remembered for `namespace`, oldest first.
    pub fn of(&self, namespace: &str) -> Vec<String> {
        (self.order.iter())
            .filter(|(ns, _)| ns == namespace)
            .map(|(_, id)| id.clone())
            .collect()
    }

    pub fn record(&mut self, namespace: &str, id: &str) {
        if id.is_empty() {
            return;
        }
        let key = (namespace.to_string(), id.to_string());
        if !self.seen.insert(key.clone()) {
            return;
        }
        self.order.push_back(key);
        if self.order.len() > REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_per_namespace_and_the_oldest_are_forgotten_first() {
        let mut recent = RecentRequests::default();
        recent.record("a", "r1");
        assert!(recent.seen("a", "r1"));
        assert!(!recent.seen("b", "r1"));
        recent.record("a", "");
        assert!(!recent.seen("a", ""));
        for i in 0..REMEMBERED {
            recent.record("b", &i.to_string());
        }
        assert!(!recent.seen("a", "r1"));
        assert!(recent.seen("b", "0") && recent.seen("b", &(REMEMBERED - 1).to_string()));
        recent.record("b", "new");
        assert!(!recent.seen("b", "0") && recent.seen("b", "1"));
        assert!(recent.of("a").is_empty());
        assert_eq!(recent.of("b")[..2], ["1".to_string(), "2".to_string()]);
        assert_eq!(recent.of("b").last().map(String::as_str), Some("new"));
    }
}
