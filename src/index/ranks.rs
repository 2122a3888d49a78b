//! The unit every search answers in: a half-open range of suffix-array ranks (of a compressed
//! index's rows). A leaf that the readers, the tables and the samplers all share.

/// A half-open range of suffix-array ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RankRange {
    pub lo: u64,
    pub hi: u64,
}

impl RankRange {
    pub fn len(&self) -> u64 {
        self.hi - self.lo
    }
    pub fn is_empty(&self) -> bool {
        self.hi <= self.lo
    }
}
