//! Back-off generation over a router's shards: each level's count and next tokens summed over
//! them (`cluster::merge`), so the levels, and the tokens drawn, are one index's over all of
//! them. Runs on a worker thread, which waits on each fan-out: each token, the longest suffix's
//! length (a sample a shard, not a distribution), one count per step of each level's search and
//! one distribution per level (the empty suffix's is fetched once).

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::RemoteEvidence;
use crate::index::backoff::{CountedLevel, LevelSearch, LevelSource};
use crate::index::suffix::tail;
use crate::index::{IndexError, Result};

/// The levels of a sequence over the shards.
pub(crate) struct RemoteLevels {
    shards: RemoteEvidence,
    eos_token_id: u32,
    /// Every place: the count of the empty suffix.
    total: u64,
    /// What followed every place (the empty suffix), once a level needed it.
    everything: Option<BTreeMap<u32, u64>>,
    /// The longest suffix matched at the last step: the next is at most one token longer.
    last: Option<usize>,
}

impl RemoteLevels {
    pub(crate) fn new(shards: RemoteEvidence, eos_token_id: u32) -> Result<Self> {
        Ok(Self {
            total: shards.count(&[])?,
            shards,
            eos_token_id,
            everything: None,
            last: None,
        })
    }

    /// The count and next tokens of `seq`'s last `len` tokens (`None`: the empty suffix's, kept).
    fn level_of(&mut self, seq: &[u32], len: usize) -> Result<(u64, Option<BTreeMap<u32, u64>>)> {
        if len == 0 {
            if self.everything.is_none() {
                self.everything = Some(self.shards.next_tokens(&[], false)?.ntd.dist);
            }
            return Ok((self.total, None));
        }
        let found = self.shards.next_tokens(tail(seq, len), false)?;
        Ok((found.ntd.prompt_cnt, Some(found.ntd.dist)))
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
        let longest = self.shards.longest_suffix_len(asked)?;
        self.last = Some(longest);
        let (count, next) = self.level_of(seq, longest)?;
        let mut found = vec![(longest, count, next)];
        while max.is_none_or(|k| found.len() < k) {
            let &(above, seen, _) = &found[found.len() - 1];
            let Some(mut search) = LevelSearch::below(above, seen, self.total) else {
                break;
            };
            while let Some(len) = search.next_probe() {
                search.counted(len, self.shards.count(tail(seq, len))?);
            }
            let (count, next) = self.level_of(seq, search.found())?;
            found.push((search.found(), count, next));
        }
        let everything = self.everything.as_ref();
        Ok(found
            .into_iter()
            .map(|(suffix_len, count, next)| CountedLevel {
                suffix_len,
                count,
                next: match next {
                    Some(next) => Cow::Owned(next),
                    None => Cow::Borrowed(everything.unwrap_or(&EMPTY)),
                },
            })
            .collect())
    }
}

/// What follows nothing (never read: the empty suffix's distribution is fetched before it is lent).
static EMPTY: BTreeMap<u32, u64> = BTreeMap::new();
