//! Back-off generation over a router's shards: each level's count and next tokens summed over
//! them (`cluster::merge`), so the levels, and the tokens drawn, are one index's over all of
//! them. Runs on a worker thread, which waits on each fan-out: a longest suffix and one count
//! per step of each level's search, one distribution per level.

use std::borrow::Cow;

use super::reference::RemoteReference;
use crate::index::backoff::{CountedLevel, LevelSearch, LevelSource};
use crate::index::query::InfgramNtdResult;
use crate::index::{IndexError, Result};

/// The levels of a sequence over the shards.
pub(super) struct RemoteLevels {
    shards: RemoteReference,
    eos_token_id: u32,
    /// Every place: the count of the empty suffix.
    total: u64,
    /// The longest suffix matched at the last step: the next is at most one token longer.
    last: Option<usize>,
}

impl RemoteLevels {
    pub(super) fn new(shards: RemoteReference, eos_token_id: u32) -> Result<Self> {
        Ok(Self {
            total: shards.count(&[])?,
            shards,
            eos_token_id,
            last: None,
        })
    }
}

/// The last `len` tokens of `seq`.
fn tail(seq: &[u32], len: usize) -> &[u32] {
    &seq[seq.len() - len.min(seq.len())..]
}

fn level(found: InfgramNtdResult) -> CountedLevel<'static> {
    CountedLevel {
        suffix_len: found.suffix_len,
        count: found.ntd.prompt_cnt,
        next: Cow::Owned(found.ntd.dist),
    }
}

impl LevelSource for RemoteLevels {
    fn eos_token_id(&self) -> u32 {
        self.eos_token_id
    }

    fn levels(&mut self, seq: &[u32], max: Option<usize>) -> Result<Vec<CountedLevel<'_>>> {
        if crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted);
        }
        let asked = self.last.map_or(seq, |len| tail(seq, len + 1));
        let longest = self.shards.next_tokens(asked, true)?;
        self.last = Some(longest.suffix_len);
        let mut levels = vec![level(longest)];
        while max.is_none_or(|k| levels.len() < k) {
            let last = &levels[levels.len() - 1];
            let Some(mut search) = LevelSearch::below(last.suffix_len, last.count, self.total)
            else {
                break;
            };
            while let Some(len) = search.next_probe() {
                search.counted(len, self.shards.count(tail(seq, len))?);
            }
            levels.push(level(
                self.shards.next_tokens(tail(seq, search.found()), false)?,
            ));
        }
        Ok(levels)
    }
}
