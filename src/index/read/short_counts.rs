//! Counts of the shortest patterns, remembered. The gate's view of every decoding step counts the
//! context's last 1, 2, 3 and 4 tokens (`mix::features`); those patterns recur across steps and
//! sequences, and each count is two binary searches over the whole suffix array. An index never
//! changes, so a count once found stays true.
//!
//! A direct-mapped table: a pattern's hash picks its one slot, and a newer pattern overwrites an
//! older one there. The slots are allocated at the first count, so an index that is never counted
//! (a build, a test) pays nothing.

use std::sync::{Mutex, OnceLock};

/// The longest pattern kept.
const MAX_TOKENS: usize = 4;
/// Slots in the table (a power of two; 40 bytes each with the lock).
const SLOTS: usize = 1 << 16;

#[derive(Default)]
pub(crate) struct ShortCounts {
    slots: OnceLock<Box<[Mutex<Slot>]>>,
}

#[derive(Default, Clone, Copy)]
struct Slot {
    /// Tokens of the pattern held (0: the slot is empty).
    len: u8,
    tokens: [u32; MAX_TOKENS],
    count: u64,
}

impl ShortCounts {
    /// The count of `ids` if it is kept.
    pub(crate) fn get(&self, ids: &[u32]) -> Option<u64> {
        let slot = self.slot(ids)?.lock().ok()?;
        (slot.len as usize == ids.len() && slot.tokens[..ids.len()] == *ids).then_some(slot.count)
    }

    /// Keeps the count of `ids` (nothing for a pattern longer than the table keeps).
    pub(crate) fn put(&self, ids: &[u32], count: u64) {
        if let Some(mut slot) = self.slot(ids).and_then(|s| s.lock().ok()) {
            slot.len = ids.len() as u8;
            slot.tokens[..ids.len()].copy_from_slice(ids);
            slot.count = count;
        }
    }

    fn slot(&self, ids: &[u32]) -> Option<&Mutex<Slot>> {
        if ids.is_empty() || ids.len() > MAX_TOKENS {
            return None;
        }
        let slots = self
            .slots
            .get_or_init(|| (0..SLOTS).map(|_| Mutex::default()).collect());
        let hash = ids.iter().fold(ids.len() as u64, |h, &t| {
            (h.rotate_left(23) ^ t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        });
        // The hash's top bits pick the slot: the multiply mixes into them best.
        slots.get((hash >> (64 - SLOTS.trailing_zeros())) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pattern put is found with its count until another takes its slot; patterns the table
    /// does not keep are never found; a pattern is never found with another's count.
    #[test]
    fn kept_counts_are_the_ones_put() {
        let counts = ShortCounts::default();
        assert_eq!(counts.get(&[1, 2]), None);
        counts.put(&[1, 2], 7);
        counts.put(&[1, 2, 3, 4, 5], 9);
        counts.put(&[], 9);
        assert_eq!(counts.get(&[1, 2]), Some(7));
        assert_eq!(counts.get(&[1, 2, 3, 4, 5]), None);
        assert_eq!(counts.get(&[]), None);
        assert_eq!(counts.get(&[1]), None);
        assert_eq!(counts.get(&[1, 2, 0]), None);
        // Many more patterns than slots: whatever is found is right.
        let pattern = |i: u32| [i % 97, i / 97 % 89, i % 13];
        for i in 0..300_000u32 {
            counts.put(&pattern(i)[..1 + i as usize % 3], i as u64);
        }
        let mut found = 0;
        for i in 0..300_000u32 {
            if let Some(c) = counts.get(&pattern(i)[..1 + i as usize % 3]) {
                let (p, q) = (pattern(i), pattern(c as u32));
                assert_eq!(p[..1 + i as usize % 3], q[..1 + c as usize % 3]);
                found += 1;
            }
        }
        assert!(found > SLOTS / 4, "{found}");
    }
}
