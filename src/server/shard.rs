//! The shard role: `sidecar.shard.v1` over this sidecar's index (a suffix array or a compressed
//! one), for routers to fan out to. Each answer is what this index alone knows
//! ([`crate::cluster::partial::PartialAnswers`]); the router merges them
//! (`cluster::merge`). A shard server is an ordinary sidecar besides: its `sidecar.v1` API serves
//! its own shard.

use std::time::Instant;

use tonic::{Request, Response, Status};

use super::engine::document;
use super::shard_pb as spb;
use super::valid::{
    accept, ValidContinuations, ValidLiveAppend, ValidLiveContinuations, ValidScoreTokens,
    ValidShardSearch, Validate,
};
use super::{index_status, live_status, SidecarService, State};
use crate::cluster::identity::{self, Expected};
use crate::cluster::partial::LocalSample;
use crate::index::query::Spread;
use crate::live::{Appended, LiveStore, Piece};

/// Which shard this server is, as routers name it in their calls ([`identity`]).
fn own_identity(s: &State) -> Result<&Expected, Status> {
    s.shard
        .as_ref()
        .ok_or_else(|| Status::internal("this service holds no index"))
}

impl SidecarService {
    /// A router's call, refused when it was meant for another shard, else its deadline and its
    /// message checked at the edge.
    fn accept_call<R: Validate>(
        &self,
        request: Request<R>,
    ) -> Result<(Option<Instant>, R::Valid), Status> {
        identity::check(request.metadata(), || own_identity(&self.state).cloned())?;
        Ok(accept(request, &self.state.limits)?)
    }
}

fn describe(s: &State, r: spb::DescribeRequest) -> Result<spb::ShardDescription, Status> {
    let index = s.corpus()?;
    let own = own_identity(s)?;
    let fingerprint = s.tokenizer.fingerprint();
    let tokenizer_json = match r.have_tokenizer_fingerprint == fingerprint {
        true => String::new(),
        false => (s.tokenizer.to_json()).map_err(|e| Status::internal(e.to_string()))?,
    };
    Ok(spb::ShardDescription {
        set_id: own.set_id.clone(),
        shard: own.shard,
        shards: index.shard_set().map_or(1, |r| r.shards),
        documents: index.total_documents(),
        tokens: index.total_tokens(),
        local_shards: index.num_parts() as u32,
        token_width: index.width().bytes() as u32,
        eos_token_id: index.eos_token_id(),
        vocab_size: index.vocab_size(),
        tokenizer_fingerprint: fingerprint.to_string(),
        tokenizer_json,
        content_id: own.content_id.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

/// A spread as the wire says it: the kind, and the token of a single one.
pub(crate) fn spread_to_wire(spread: Spread) -> (i32, u32) {
    match spread {
        Spread::None => (spb::Spread::None as i32, 0),
        Spread::Single(t) => (spb::Spread::Single as i32, t),
        Spread::Several => (spb::Spread::Several as i32, 0),
    }
}

fn runs(pairs: impl IntoIterator<Item = (u32, u64)>) -> Vec<spb::TokenRun> {
    pairs
        .into_iter()
        .map(|(token, count)| spb::TokenRun { token, count })
        .collect()
}

fn samples(samples: Vec<LocalSample>) -> Vec<spb::LocalSample> {
    samples
        .into_iter()
        .map(|l| spb::LocalSample {
            matches: l.matches,
            runs: runs(l.runs),
        })
        .collect()
}

fn continuations(s: &State, r: ValidContinuations) -> Result<spb::ContinuationsAnswer, Status> {
    let (prompt, infinite, cap, lengths) = match r {
        ValidContinuations::Drafts {
            prompt,
            max_support,
            depth,
        } => return drafts(s, &prompt, max_support, depth),
        ValidContinuations::Distribution {
            prompt,
            infinite,
            max_support,
            count_lengths,
        } => (prompt, infinite, max_support, count_lengths),
    };
    let index = s.corpus()?;
    let part = index
        .partial_continuations(&prompt, infinite, cap)
        .map_err(index_status)?;
    let suffix_counts = index
        .suffix_counts(&prompt, part.suffix_len, &lengths)
        .map_err(index_status)?;
    let (spread, single) = spread_to_wire(part.spread);
    Ok(spb::ContinuationsAnswer {
        suffix_len: part.suffix_len as u32,
        prompt_cnt: part.prompt_cnt,
        dist_tokens: part.dist.keys().copied().collect(),
        dist_counts: part.dist.values().copied().collect(),
        samples: samples(part.samples),
        spread,
        single,
        suffix_counts,
        drafts: Vec::new(),
    })
}

/// A `Continuations` call for drafts: the longest suffix's samples with their following tokens.
fn drafts(
    s: &State,
    prompt: &[u32],
    max_support: u64,
    depth: usize,
) -> Result<spb::ContinuationsAnswer, Status> {
    let part = s
        .corpus()?
        .partial_drafts(prompt, max_support, depth)
        .map_err(index_status)?;
    Ok(spb::ContinuationsAnswer {
        suffix_len: part.suffix_len as u32,
        drafts: part
            .suffix_arrays
            .into_iter()
            .map(|l| spb::LocalContinuations {
                matches: l.matches,
                fine: l
                    .fine
                    .into_iter()
                    .map(|tokens| spb::Continuation { tokens })
                    .collect(),
            })
            .collect(),
        ..Default::default()
    })
}

fn score_tokens(s: &State, r: ValidScoreTokens) -> Result<spb::ScoreTokensAnswer, Status> {
    let index = s.corpus()?;
    let evidence = index.evidence(&r.ids).map_err(index_status)?;
    let tokens = evidence
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            if crate::interrupt::interrupted() {
                return Err(super::stopped());
            }
            let prefix = &r.ids[..i];
            let support = match r.support_samples {
                0 => Vec::new(),
                cap => index
                    .support(prefix, e.suffix_len, cap)
                    .map_err(index_status)?,
            };
            let suffix_counts = index
                .suffix_counts(prefix, e.suffix_len, &r.count_lengths)
                .map_err(index_status)?;
            let (spread, single) = spread_to_wire(e.spread);
            Ok(spb::TokenEvidence {
                suffix_len: e.suffix_len as u32,
                prompt_cnt: e.prompt_cnt,
                cont_cnt: e.cont_cnt,
                spread,
                single,
                support: samples(support),
                suffix_counts,
            })
        })
        .collect::<Result<_, Status>>()?;
    Ok(spb::ScoreTokensAnswer { tokens })
}

fn search(s: &State, r: ValidShardSearch) -> Result<spb::SearchAnswer, Status> {
    let found = s
        .corpus()?
        .search_strided(&r.cnf, &r.strides, r.opts)
        .map_err(index_status)?;
    Ok(spb::SearchAnswer {
        doc_cnt: found.doc_cnt,
        clause_places: found.clause_places,
        documents: found.documents.into_iter().map(document).collect(),
    })
}

/// The live index of a shard server, which owns the namespaces routers send it.
fn live(s: &State) -> Result<&dyn LiveStore, Status> {
    s.live.as_deref().ok_or_else(|| {
        Status::failed_precondition("the live index is off in this shard server's config ([live])")
    })
}

fn live_append(s: &State, r: ValidLiveAppend) -> Result<spb::LiveAppendAnswer, Status> {
    let live = live(s)?;
    let pieces: Vec<Piece> = (r.pieces.iter())
        .map(|p| Piece {
            doc: p.doc,
            tokens: &p.tokens,
        })
        .collect();
    let appended = live
        .append_pieces(&r.namespace, &pieces, &r.request_id, r.durability)
        .map_err(live_status)?;
    Ok(spb::LiveAppendAnswer {
        repeated: appended == Appended::Repeated,
    })
}

fn live_continuations(
    s: &State,
    r: ValidLiveContinuations,
) -> Result<spb::LiveContinuationsAnswer, Status> {
    let live = live(s)?;
    s.evidence.check_ids(&r.pattern).map_err(index_status)?;
    let (continuations, match_len) =
        live.continuations(&r.namespace, &r.pattern, r.samples, r.depth);
    Ok(spb::LiveContinuationsAnswer {
        match_len: match_len as u32,
        continuations: continuations
            .into_iter()
            .map(|tokens| spb::Continuation { tokens })
            .collect(),
    })
}

#[tonic::async_trait]
impl spb::shard_server::Shard for SidecarService {
    async fn describe(
        &self,
        request: Request<spb::DescribeRequest>,
    ) -> Result<Response<spb::ShardDescription>, Status> {
        // No work permit: a busy shard is still there, and must not look down to its routers.
        describe(&self.state, request.into_inner()).map(Response::new)
    }

    async fn count(
        &self,
        request: Request<spb::CountRequest>,
    ) -> Result<Response<spb::CountAnswer>, Status> {
        let (deadline, r) = self.accept_call(request)?;
        self.run(deadline, move |s| {
            let counts = r
                .ngrams
                .iter()
                .map(|ids| s.corpus()?.count(ids).map_err(index_status))
                .collect::<Result<_, Status>>()?;
            Ok(spb::CountAnswer { counts })
        })
        .await
    }

    async fn continuations(
        &self,
        request: Request<spb::ContinuationsRequest>,
    ) -> Result<Response<spb::ContinuationsAnswer>, Status> {
        let (deadline, r) = self.accept_call(request)?;
        self.run(deadline, move |s| continuations(s, r)).await
    }

    async fn score_tokens(
        &self,
        request: Request<spb::ScoreTokensRequest>,
    ) -> Result<Response<spb::ScoreTokensAnswer>, Status> {
        let (deadline, r) = self.accept_call(request)?;
        self.run(deadline, move |s| score_tokens(s, r)).await
    }

    async fn search_documents(
        &self,
        request: Request<spb::SearchRequest>,
    ) -> Result<Response<spb::SearchAnswer>, Status> {
        let (deadline, r) = self.accept_call(request)?;
        self.run(deadline, move |s| search(s, r)).await
    }

    async fn span_lengths(
        &self,
        request: Request<spb::SpanLengthsRequest>,
    ) -> Result<Response<spb::SpanLengthsAnswer>, Status> {
        let (deadline, r) = self.accept_call(request)?;
        self.run(deadline, move |s| {
            let lengths = s.corpus()?.span_lengths(&r.ids).map_err(index_status)?;
            Ok(spb::SpanLengthsAnswer {
                lengths: lengths.into_iter().map(|(len, _)| len as u32).collect(),
            })
        })
        .await
    }

    async fn live_append(
        &self,
        request: Request<spb::LiveAppendRequest>,
    ) -> Result<Response<spb::LiveAppendAnswer>, Status> {
        let (deadline, r) = self.accept_call(request)?;
        self.run(deadline, move |s| live_append(s, r)).await
    }

    async fn live_continuations(
        &self,
        request: Request<spb::LiveContinuationsRequest>,
    ) -> Result<Response<spb::LiveContinuationsAnswer>, Status> {
        let (deadline, r) = self.accept_call(request)?;
        self.run(deadline, move |s| live_continuations(s, r)).await
    }
}
