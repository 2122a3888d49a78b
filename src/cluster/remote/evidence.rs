//! The evidence of a router's `Mix`, `Score`, sessions and drafts: the shard servers' answers,
//! merged (`crate::cluster::merge`) into what one index over all of them gives, so the library's
//! scoring, mixing and drafting run in the router unchanged. The service calls it from its worker
//! threads (never from the runtime's), which wait here on the fan-out; each call takes the
//! deadline of the request the thread works for.
//!
//! Round trips per shard: one for the ∞-gram of a context or a session's step (a session asks
//! only for the tokens that can still be part of its match), one for a document's dense evidence
//! with every position's gate features, one for a draft; the gate's view of a decoding step is a
//! second one after the ∞-gram.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tokio::runtime::Handle;
use tonic::{Request, Response, Status};

use crate::cluster::fan_out::{unmergeable, Answered, Members, ShardClient, ShardSet};
use crate::cluster::merge;
use crate::cluster::partial::{PartialContinuations, PartialDrafts};
use crate::cluster::validate::ShardAnswer;
use crate::cluster::wire::{continuations_of, drafts_of, evidence_of, support_of};
use crate::evidence::{EvidenceError, EvidenceSource, Followed, StepInfgram};
use crate::index::dense::{TokenEvidence, TokenScore};
use crate::index::query::{check_vocabulary, InfgramNtdResult, NtdResult};
use crate::index::suffix;
use crate::index::IndexError;
use crate::mix::features::{step_score, InfgramContext, SUFFIX_LENGTHS, SUPPORT_SAMPLES};
use crate::mix::{MixError, NeuralDistribution};
use crate::server::shard_pb as spb;

/// The shard set as scoring, mixing and drafting see it.
pub(crate) struct RemoteEvidence {
    shards: Arc<ShardSet>,
    /// The runtime the fan-outs run on.
    runtime: Handle,
    /// The set this source was made for: sequences it follows hold its answers, so another
    /// set (a new build) is refused rather than mixed with them.
    set_id: String,
    vocab_size: u64,
}

/// A shard server's refusal, as the index layer carries it (the status kept for the server).
pub(crate) fn remote(status: Status) -> IndexError {
    let message = status.message().to_string();
    IndexError::remote(status, message)
}

fn merge_error(e: merge::Overflow) -> IndexError {
    remote(unmergeable(e))
}

fn lengths() -> Vec<u32> {
    SUFFIX_LENGTHS.iter().map(|&k| k as u32).collect()
}

impl RemoteEvidence {
    /// Over `shards`, now `members`; must be made on a thread of the runtime's.
    pub fn new(shards: Arc<ShardSet>, members: &Members) -> Self {
        Self {
            shards,
            runtime: Handle::current(),
            set_id: members.layout.first().set_id.clone(),
            vocab_size: members.layout.first().vocab_size,
        }
    }

    fn members(&self) -> Result<Arc<Members>, IndexError> {
        let members = self.shards.members().map_err(remote)?;
        let now = &members.layout.first().set_id;
        if *now != self.set_id {
            return Err(remote(Status::unavailable(format!(
                "the shard set changed (set {now}, not {}): restart the router to mix over it",
                self.set_id
            ))));
        }
        Ok(members)
    }

    /// Every shard's answer to `ask` through `call`, in shard order (each validated against it),
    /// under the deadline of the request this thread works for.
    fn every_shard<Q, T, F, Fut>(&self, ask: Q, call: F) -> Result<Vec<T>, IndexError>
    where
        Q: Clone,
        T: ShardAnswer<Q>,
        F: Fn(ShardClient, Request<Q>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let members = self.members()?;
        let deadline: Option<Instant> = crate::interrupt::deadline();
        super::wait_on_shards(&self.runtime, async {
            let fanned = self.shards.fan_out(&members, deadline, &ask, call).await?;
            let Answered { answers, .. } = fanned.complete(false)?;
            Ok(answers.into_iter().map(|(_, a)| a).collect())
        })
    }

    fn continuations(
        &self,
        ask: spb::ContinuationsRequest,
    ) -> Result<Vec<spb::ContinuationsAnswer>, IndexError> {
        self.every_shard(ask, |mut c, r| async move { c.continuations(r).await })
    }

    /// The exact ∞-gram after `seq`, whose match is among its last `tail` tokens.
    fn infgram_of_tail(&self, seq: &[u32], tail: usize) -> Result<InfgramNtdResult, IndexError> {
        self.next_tokens(suffix::tail(seq, tail), true)
    }

    /// What followed `prompt` over every shard, exactly (counts summed): after all of it, or
    /// (`infinite`) after its longest suffix found in any shard.
    pub(super) fn next_tokens(
        &self,
        prompt: &[u32],
        infinite: bool,
    ) -> Result<InfgramNtdResult, IndexError> {
        let partials: Vec<PartialContinuations> = self
            .continuations(spb::ContinuationsRequest {
                prompt: prompt.to_vec(),
                infinite,
                ..Default::default()
            })?
            .into_iter()
            .map(continuations_of)
            .collect();
        merge::continuations(&partials, None).map_err(merge_error)
    }

    /// The length of `prompt`'s longest suffix found in any shard (each shard's answer carries a
    /// sample, not a distribution).
    pub(super) fn longest_suffix_len(&self, prompt: &[u32]) -> Result<usize, IndexError> {
        let partials = self.continuations(spb::ContinuationsRequest {
            prompt: prompt.to_vec(),
            infinite: true,
            max_support: 1,
            ..Default::default()
        })?;
        Ok(partials
            .iter()
            .map(|a| a.suffix_len as usize)
            .max()
            .unwrap_or(0))
    }

    /// The count of `ids` over every shard.
    pub(super) fn count(&self, ids: &[u32]) -> Result<u64, IndexError> {
        let ask = spb::CountRequest {
            ngrams: vec![spb::NGram { ids: ids.to_vec() }],
        };
        let partials = self.every_shard(ask, |mut c, r| async move { c.count(r).await })?;
        merge::sum(partials.into_iter().flat_map(|a| a.counts)).map_err(merge_error)
    }
}

/// The gate's view of a position from the shards' partial answers about it: the merged match, the merged
/// support sample, the counts summed.
fn gate_context(
    score: &TokenScore,
    support: &[PartialContinuations],
    counts: &[(usize, &[u64])],
) -> Result<InfgramContext, MixError> {
    let support = merge::continuations(support, Some(SUPPORT_SAMPLES))
        .map_err(merge_error)?
        .ntd;
    let counts = merge::suffix_counts(counts, &SUFFIX_LENGTHS).map_err(merge_error)?;
    InfgramContext::from_evidence(score, &support, |k| {
        let at = SUFFIX_LENGTHS.iter().position(|&l| l == k);
        Ok(at.map_or(0, |i| counts[i]))
    })
}

fn changed_set() -> MixError {
    MixError::Index(remote(Status::unavailable(
        "the shard set changed between two calls of one request",
    )))
}

impl EvidenceSource for RemoteEvidence {
    fn vocab_size(&self) -> u64 {
        self.vocab_size
    }

    fn waits_on_network(&self) -> bool {
        true
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), IndexError> {
        check_vocabulary(ids, self.vocab_size)
    }

    fn infgram(&self, context: &[u32]) -> Result<InfgramNtdResult, IndexError> {
        self.check_ids(context)?;
        self.infgram_of_tail(context, context.len())
    }

    fn context_after(
        &self,
        context: &[u32],
        infgram: &InfgramNtdResult,
        _gate_sample: Option<&NtdResult>,
    ) -> Result<InfgramContext, MixError> {
        // Only the matched suffix matters, and its counts: no shard matches more of it.
        let tail = &context[context.len() - infgram.suffix_len.min(context.len())..];
        let answers = self.continuations(spb::ContinuationsRequest {
            prompt: tail.to_vec(),
            infinite: true,
            max_support: SUPPORT_SAMPLES,
            count_lengths: lengths(),
            ..Default::default()
        })?;
        let (counts, support): (Vec<(usize, Vec<u64>)>, Vec<PartialContinuations>) = answers
            .into_iter()
            .map(|mut a| {
                let counts = std::mem::take(&mut a.suffix_counts);
                ((a.suffix_len as usize, counts), continuations_of(a))
            })
            .unzip();
        let counts: Vec<(usize, &[u64])> = counts.iter().map(|(l, c)| (*l, c.as_slice())).collect();
        let score = step_score(infgram);
        if counts.iter().map(|(len, _)| *len).max() != Some(infgram.suffix_len) {
            return Err(changed_set());
        }
        gate_context(&score, &support, &counts)
    }

    fn document(&self, tokens: &[u32]) -> Result<(Vec<TokenScore>, Vec<InfgramContext>), MixError> {
        self.check_ids(tokens)?;
        let ask = spb::ScoreTokensRequest {
            ids: tokens.to_vec(),
            support_samples: SUPPORT_SAMPLES,
            count_lengths: lengths(),
        };
        let mut partials: Vec<Vec<spb::TokenEvidence>> = self
            .every_shard(ask, |mut c, r| async move { c.score_tokens(r).await })?
            .into_iter()
            .map(|a| a.tokens)
            .collect();
        let evidence: Vec<Vec<TokenEvidence>> = partials
            .iter()
            .map(|p| p.iter().map(evidence_of).collect())
            .collect();
        let scores = merge::token_scores(&evidence).map_err(merge_error)?;
        let contexts = scores
            .iter()
            .enumerate()
            .map(|(i, score)| {
                let support: Vec<PartialContinuations> =
                    partials.iter_mut().map(|p| support_of(&mut p[i])).collect();
                let counts: Vec<(usize, &[u64])> = partials
                    .iter()
                    .map(|p| (p[i].suffix_len as usize, p[i].suffix_counts.as_slice()))
                    .collect();
                gate_context(score, &support, &counts)
            })
            .collect::<Result<_, _>>()?;
        Ok((scores, contexts))
    }

    fn follow(self: Arc<Self>, seq: &[u32]) -> Result<Box<dyn Followed>, IndexError> {
        let answer = self.infgram(seq)?;
        Ok(Box::new(FollowedRemote {
            source: self,
            answer,
        }))
    }
}

/// A sequence a router follows: the shards' merged ∞-gram answer after it, asked once per change.
struct FollowedRemote {
    source: Arc<RemoteEvidence>,
    answer: InfgramNtdResult,
}

impl Followed for FollowedRemote {
    fn source(&self) -> &dyn EvidenceSource {
        &*self.source
    }

    fn suffix_len(&self) -> usize {
        self.answer.suffix_len
    }

    fn prompt_cnt(&self) -> u64 {
        self.answer.ntd.prompt_cnt
    }

    /// The answer's distribution: a tree node a token, about three times its entry.
    fn heap_bytes(&self) -> usize {
        self.answer.ntd.dist.len() * 3 * std::mem::size_of::<(u32, u64)>()
    }

    fn advance(&mut self, seq: &[u32], from: usize) -> Result<(), IndexError> {
        // The match grows by at most a token per token appended (App. A of the paper).
        let tail = self.answer.suffix_len + (seq.len() - from);
        self.answer = self.source.infgram_of_tail(seq, tail)?;
        Ok(())
    }

    fn truncate(&mut self, seq: &[u32]) -> Result<(), IndexError> {
        self.answer = self.source.infgram_of_tail(seq, seq.len())?;
        Ok(())
    }

    fn step(
        &self,
        _seq: &[u32],
        _neural: &NeuralDistribution,
        _for_gate: bool,
    ) -> Result<StepInfgram, EvidenceError> {
        Ok(StepInfgram::tokens(self.answer.clone()))
    }

    fn continuations(
        &self,
        seq: &[u32],
        samples: usize,
        depth: usize,
    ) -> Result<Vec<Vec<u32>>, IndexError> {
        let len = self.answer.suffix_len;
        if len == 0 || samples == 0 || depth == 0 {
            return Ok(Vec::new());
        }
        let partials: Vec<PartialDrafts> = self
            .source
            .continuations(spb::ContinuationsRequest {
                prompt: seq[seq.len() - len.min(seq.len())..].to_vec(),
                infinite: true,
                max_support: samples as u64,
                depth: depth as u32,
                ..Default::default()
            })?
            .into_iter()
            .map(drafts_of)
            .collect();
        merge::drafts(&partials, samples as u64).map_err(merge_error)
    }
}
