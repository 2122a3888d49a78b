//! `sidecar.shard.v1`'s requests, as a shard server checks a router's calls.

use super::{
    answer_size, max_support_within, maxnum_within, within_token_limit, Invalid, Validate,
};
use crate::index::docs::{Cnf, SearchOptions};
use crate::live::namespace::check_name;
use crate::live::Durability;
use crate::server::config::Limits;
use crate::server::shard_pb as spb;

use super::decoding::MAX_DRAFT_TOKENS;

/// Most lengths a request may ask counts of (the gate asks 10).
const MAX_COUNT_LENGTHS: usize = 64;

/// Most samples one `ScoreTokens` call may read for the gate's support, per suffix array
/// (positions × `support_samples`): a document of 65,536 tokens at the gate's 256.
const MAX_SUPPORT_READS: u64 = 1 << 24;

/// The lengths of a request's `count_lengths`: few, ascending.
fn count_lengths(lengths: &[u32]) -> Result<Vec<usize>, Invalid> {
    if lengths.len() > MAX_COUNT_LENGTHS {
        return Err(Invalid::Argument(format!(
            "at most {MAX_COUNT_LENGTHS} count_lengths"
        )));
    }
    if lengths.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Invalid::Argument("count_lengths must ascend".into()));
    }
    Ok(lengths.iter().map(|&k| k as usize).collect())
}

pub(in crate::server) struct ValidShardCount {
    pub ngrams: Vec<Vec<u32>>,
}

impl Validate for spb::CountRequest {
    type Valid = ValidShardCount;
    fn validate(self, limits: &Limits) -> Result<ValidShardCount, Invalid> {
        let ngrams: Vec<Vec<u32>> = self.ngrams.into_iter().map(|g| g.ids).collect();
        within_token_limit(limits, "the n-grams", ngrams.iter().map(Vec::len).sum())?;
        Ok(ValidShardCount { ngrams })
    }
}

/// A `Continuations` call: a distribution's partial answer, or drafts (`depth` > 0).
pub(in crate::server) enum ValidContinuations {
    Distribution {
        prompt: Vec<u32>,
        infinite: bool,
        max_support: Option<u64>,
        count_lengths: Vec<usize>,
    },
    /// The longest suffix's samples with their following tokens.
    Drafts {
        prompt: Vec<u32>,
        max_support: u64,
        depth: usize,
    },
}

impl Validate for spb::ContinuationsRequest {
    type Valid = ValidContinuations;
    fn validate(self, limits: &Limits) -> Result<ValidContinuations, Invalid> {
        within_token_limit(limits, "the prompt", self.prompt.len())?;
        let cap = max_support_within(limits, self.max_support)?;
        if self.depth == 0 {
            return Ok(ValidContinuations::Distribution {
                count_lengths: count_lengths(&self.count_lengths)?,
                prompt: self.prompt,
                infinite: self.infinite,
                max_support: cap,
            });
        }
        match (self.infinite, cap) {
            (true, Some(max_support)) if self.depth <= MAX_DRAFT_TOKENS => {
                Ok(ValidContinuations::Drafts {
                    prompt: self.prompt,
                    max_support,
                    depth: self.depth as usize,
                })
            }
            _ => Err(Invalid::Argument(format!(
                "drafts (depth > 0) need infinite, max_support > 0 and depth at most {MAX_DRAFT_TOKENS}"
            ))),
        }
    }
}

pub(in crate::server) struct ValidScoreTokens {
    pub ids: Vec<u32>,
    /// 0: no support samples.
    pub support_samples: u64,
    pub count_lengths: Vec<usize>,
}

impl Validate for spb::ScoreTokensRequest {
    type Valid = ValidScoreTokens;
    fn validate(self, limits: &Limits) -> Result<ValidScoreTokens, Invalid> {
        within_token_limit(limits, "the sequence", self.ids.len())?;
        max_support_within(limits, self.support_samples)?;
        if (self.ids.len() as u64).saturating_mul(self.support_samples) > MAX_SUPPORT_READS {
            return Err(Invalid::Argument(format!(
                "{} positions × {} support samples is more than {MAX_SUPPORT_READS} reads",
                self.ids.len(),
                self.support_samples
            )));
        }
        Ok(ValidScoreTokens {
            count_lengths: count_lengths(&self.count_lengths)?,
            ids: self.ids,
            support_samples: self.support_samples,
        })
    }
}

/// A router's search of one shard, at the strides the router chose.
pub(in crate::server) struct ValidShardSearch {
    pub cnf: Cnf,
    pub strides: Vec<u64>,
    pub opts: SearchOptions,
}

impl Validate for spb::SearchRequest {
    type Valid = ValidShardSearch;
    fn validate(self, limits: &Limits) -> Result<ValidShardSearch, Invalid> {
        let cnf: Cnf = (self.cnf.into_iter())
            .map(|c| c.ngrams.into_iter().map(|g| g.ids).collect())
            .collect();
        within_token_limit(limits, "the CNF", cnf.iter().flatten().map(Vec::len).sum())?;
        let maxnum = maxnum_within(limits, self.maxnum as usize)?;
        answer_size(limits, maxnum, self.max_disp_len as usize)?;
        Ok(ValidShardSearch {
            cnf,
            strides: self.strides,
            opts: SearchOptions {
                maxnum,
                max_disp_len: self.max_disp_len as usize,
                max_clauses: limits.max_cnf_clauses,
                max_places: limits.max_search_places,
                ..SearchOptions::default()
            },
        })
    }
}

pub(in crate::server) struct ValidSpanLengths {
    pub ids: Vec<u32>,
}

impl Validate for spb::SpanLengthsRequest {
    type Valid = ValidSpanLengths;
    fn validate(self, limits: &Limits) -> Result<ValidSpanLengths, Invalid> {
        within_token_limit(limits, "the traced sequence", self.ids.len())?;
        Ok(ValidSpanLengths { ids: self.ids })
    }
}

pub(in crate::server) struct ValidLiveAppend {
    pub namespace: String,
    pub pieces: Vec<spb::LivePiece>,
    pub request_id: String,
    pub durability: Durability,
}

impl Validate for spb::LiveAppendRequest {
    type Valid = ValidLiveAppend;
    fn validate(self, limits: &Limits) -> Result<ValidLiveAppend, Invalid> {
        check_name(&self.namespace)?;
        let together = self.pieces.iter().map(|p| p.tokens.len()).sum();
        within_token_limit(limits, "the pieces", together)?;
        Ok(ValidLiveAppend {
            namespace: self.namespace,
            pieces: self.pieces,
            request_id: self.request_id,
            durability: match self.sync {
                true => Durability::Synced,
                false => Durability::Written,
            },
        })
    }
}

pub(in crate::server) struct ValidLiveContinuations {
    pub namespace: String,
    pub pattern: Vec<u32>,
    pub samples: usize,
    pub depth: usize,
}

impl Validate for spb::LiveContinuationsRequest {
    type Valid = ValidLiveContinuations;
    fn validate(self, limits: &Limits) -> Result<ValidLiveContinuations, Invalid> {
        check_name(&self.namespace)?;
        within_token_limit(limits, "the pattern", self.pattern.len())?;
        max_support_within(limits, self.samples as u64)?;
        if self.depth > MAX_DRAFT_TOKENS {
            return Err(Invalid::Argument(format!(
                "depth must be at most {MAX_DRAFT_TOKENS}"
            )));
        }
        Ok(ValidLiveContinuations {
            namespace: self.namespace,
            pattern: self.pattern,
            samples: self.samples as usize,
            depth: self.depth as usize,
        })
    }
}
