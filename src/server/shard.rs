//! The shard role: `sidecar.shard.v1` over this sidecar's index (a suffix array or a compressed
//! one), for routers to fan out to. Each answer is what this index alone knows
//! ([`crate::cluster::partial::PartialAnswers`]); the router merges them
//! (`cluster::merge`). A shard server is an ordinary sidecar besides: its `sidecar.v1` API serves
//! its own shard.

use super::drafting::MAX_DRAFT_TOKENS;
use super::engine::{check_answer_size, document};
use super::shard_pb as spb;
use super::{check_max_support, deadline_of, index_status, live_status, SidecarService, State};
use crate::cluster::identity::{self, Expected};
use crate::cluster::partial::LocalSample;
use crate::index::docs::SearchOptions;
use crate::index::query::Spread;
use crate::live::namespace::check_name;
use crate::live::{Appended, Durability, LiveStore, Piece};
use tonic::{Request, Response, Status};

/// Which shard this server is, as routers name it in their calls ([`identity`]).
fn own_identity(s: &State) -> Result<&Expected, Status> {
    s.shard
        .as_ref()
        .ok_or_else(|| Status::internal("this service holds no index"))
}

/// Refuses a call a router meant for another shard.
fn accept<T>(s: &State, request: &Request<T>) -> Result<(), Status> {
    identity::check(request.metadata(), || own_identity(s).cloned())
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

/// Most lengths a request may ask counts of (the gate asks 10).
const MAX_COUNT_LENGTHS: usize = 64;

/// Most samples one `ScoreTokens` call may read for the gate's support, per suffix array
/// (positions × `support_samples`): a document of 65,536 tokens at the gate's 256.
const MAX_SUPPORT_READS: u64 = 1 << 24;

/// The lengths of a request's `count_lengths`, checked.
fn count_lengths(lengths: &[u32]) -> Result<Vec<usize>, Status> {
    if lengths.len() > MAX_COUNT_LENGTHS {
        return Err(Status::invalid_argument(format!(
            "at most {MAX_COUNT_LENGTHS} count_lengths"
        )));
    }
    if lengths.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Status::invalid_argument("count_lengths must ascend"));
    }
    Ok(lengths.iter().map(|&k| k as usize).collect())
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

fn continuations(
    s: &State,
    r: spb::ContinuationsRequest,
) -> Result<spb::ContinuationsAnswer, Status> {
    s.check_len("the prompt", r.prompt.len())?;
    check_max_support(&s.limits, r.max_support)?;
    if r.depth > 0 {
        return drafts(s, r);
    }
    let lengths = count_lengths(&r.count_lengths)?;
    let index = s.corpus()?;
    let cap = (r.max_support > 0).then_some(r.max_support);
    let part = index
        .partial_continuations(&r.prompt, r.infinite, cap)
        .map_err(index_status)?;
    let suffix_counts = index
        .suffix_counts(&r.prompt, part.suffix_len, &lengths)
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
fn drafts(s: &State, r: spb::ContinuationsRequest) -> Result<spb::ContinuationsAnswer, Status> {
    if !r.infinite || r.max_support == 0 || r.depth as usize > MAX_DRAFT_TOKENS as usize {
        return Err(Status::invalid_argument(format!(
            "drafts (depth > 0) need infinite, max_support > 0 and depth at most {MAX_DRAFT_TOKENS}"
        )));
    }
    let part = s
        .corpus()?
        .partial_drafts(&r.prompt, r.max_support, r.depth as usize)
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

fn score_tokens(s: &State, r: spb::ScoreTokensRequest) -> Result<spb::ScoreTokensAnswer, Status> {
    s.check_len("the sequence", r.ids.len())?;
    check_max_support(&s.limits, r.support_samples)?;
    if r.ids.len() as u64 * r.support_samples > MAX_SUPPORT_READS {
        return Err(Status::invalid_argument(format!(
            "{} positions × {} support samples is more than {MAX_SUPPORT_READS} reads",
            r.ids.len(),
            r.support_samples
        )));
    }
    let lengths = count_lengths(&r.count_lengths)?;
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
                .suffix_counts(prefix, e.suffix_len, &lengths)
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

fn search(s: &State, r: spb::SearchRequest) -> Result<spb::SearchAnswer, Status> {
    let cnf: Vec<Vec<Vec<u32>>> = r
        .cnf
        .into_iter()
        .map(|c| c.ngrams.into_iter().map(|g| g.ids).collect())
        .collect();
    s.check_len("the CNF", cnf.iter().flatten().map(Vec::len).sum())?;
    if r.maxnum as usize > s.limits.max_top_k {
        return Err(Status::invalid_argument(format!(
            "maxnum must be at most {}",
            s.limits.max_top_k
        )));
    }
    check_answer_size(&s.limits, r.maxnum as usize, r.max_disp_len as usize)?;
    let opts = SearchOptions {
        maxnum: r.maxnum as usize,
        max_disp_len: r.max_disp_len as usize,
        max_clauses: s.limits.max_cnf_clauses,
        max_places: s.limits.max_search_places,
        ..SearchOptions::default()
    };
    let found = s
        .corpus()?
        .search_strided(&cnf, &r.strides, opts)
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

fn live_append(s: &State, r: spb::LiveAppendRequest) -> Result<spb::LiveAppendAnswer, Status> {
    let live = live(s)?;
    check_name(&r.namespace).map_err(live_status)?;
    s.check_len("the pieces", r.pieces.iter().map(|p| p.tokens.len()).sum())?;
    let pieces: Vec<Piece> = (r.pieces.iter())
        .map(|p| Piece {
            doc: p.doc,
            tokens: &p.tokens,
        })
        .collect();
    let durability = match r.sync {
        true => Durability::Synced,
        false => Durability::Written,
    };
    let appended = live
        .append_pieces(&r.namespace, &pieces, &r.request_id, durability)
        .map_err(live_status)?;
    Ok(spb::LiveAppendAnswer {
        repeated: appended == Appended::Repeated,
    })
}

fn live_continuations(
    s: &State,
    r: spb::LiveContinuationsRequest,
) -> Result<spb::LiveContinuationsAnswer, Status> {
    let live = live(s)?;
    check_name(&r.namespace).map_err(live_status)?;
    s.check_len("the pattern", r.pattern.len())?;
    s.evidence.check_ids(&r.pattern).map_err(index_status)?;
    check_max_support(&s.limits, r.samples as u64)?;
    if r.depth > MAX_DRAFT_TOKENS {
        return Err(Status::invalid_argument(format!(
            "depth must be at most {MAX_DRAFT_TOKENS}"
        )));
    }
    let (continuations, match_len) = live.continuations(
        &r.namespace,
        &r.pattern,
        r.samples as usize,
        r.depth as usize,
    );
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
        accept(&self.state, &request)?;
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| {
            s.check_len("the n-grams", r.ngrams.iter().map(|g| g.ids.len()).sum())?;
            let counts = r
                .ngrams
                .iter()
                .map(|g| s.corpus()?.count(&g.ids).map_err(index_status))
                .collect::<Result<_, Status>>()?;
            Ok(spb::CountAnswer { counts })
        })
        .await
    }

    async fn continuations(
        &self,
        request: Request<spb::ContinuationsRequest>,
    ) -> Result<Response<spb::ContinuationsAnswer>, Status> {
        accept(&self.state, &request)?;
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| continuations(s, r)).await
    }

    async fn score_tokens(
        &self,
        request: Request<spb::ScoreTokensRequest>,
    ) -> Result<Response<spb::ScoreTokensAnswer>, Status> {
        accept(&self.state, &request)?;
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| score_tokens(s, r)).await
    }

    async fn search_documents(
        &self,
        request: Request<spb::SearchRequest>,
    ) -> Result<Response<spb::SearchAnswer>, Status> {
        accept(&self.state, &request)?;
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| search(s, r)).await
    }

    async fn span_lengths(
        &self,
        request: Request<spb::SpanLengthsRequest>,
    ) -> Result<Response<spb::SpanLengthsAnswer>, Status> {
        accept(&self.state, &request)?;
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| {
            s.check_len("the traced sequence", r.ids.len())?;
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
        accept(&self.state, &request)?;
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| live_append(s, r)).await
    }

    async fn live_continuations(
        &self,
        request: Request<spb::LiveContinuationsRequest>,
    ) -> Result<Response<spb::LiveContinuationsAnswer>, Status> {
        accept(&self.state, &request)?;
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| live_continuations(s, r)).await
    }
}
