//! The router role: the whole `sidecar.v1` API over shard servers, holding no index. Each call
//! fans out to every shard ([`crate::cluster::fan_out`]), in one round trip where the protocol allows
//! (`crate::cluster` says why the merged answers are exact), and answers as a single sidecar over
//! all the shards would. A shard that does not answer, or none of whose replicas answers sanely
//! (`cluster::validate`), fails the call with UNAVAILABLE naming it, or, with `allow_partial`, gives
//! the other shards' answer flagged `partial`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tonic::{Request, Response, Status, Streaming};

use super::config::{Limits, ServeConfig};
use super::engine::{generate_response, neural_info, search_response, token_probs, trace_span};
use super::metrics::Metrics;
use super::pb::sidecar_server::Sidecar;
use super::pool::on_pool_alone;
use super::valid::{accept, deadline_of, ValidSearch, Validate};
use super::{
    pb, shard_pb as spb, tokenizer_status, Evidence, Neural, ResponseStream, ServeError,
    SidecarService,
};
use crate::cluster::fan_out::{unmergeable, Answered, Members, ShardSet};
use crate::cluster::merge;
use crate::cluster::partial::PartialContinuations;
use crate::cluster::remote::{RemoteEvidence, RemoteLevels, RemoteLive};
use crate::cluster::wire::{continuations_of, search_of};
use crate::cpu::CpuInfo;
use crate::index::backoff::generate_from;
use crate::index::docs::{self, PartialSearch};
use crate::index::query::check_vocabulary;
use crate::index::trace::{self, TraceOptions};

/// The public API of a router.
#[derive(Clone)]
pub struct RouterService {
    shards: Arc<ShardSet>,
    limits: Limits,
    in_flight: Arc<Semaphore>,
    cpu: Arc<CpuInfo>,
    /// `Info`'s model and mixing fields.
    neural_info: Arc<pb::InfoResponse>,
    mixer: Arc<Mixer>,
}

/// Where the router serves `Mix`, `Score`, sessions and drafts: the sidecar's own service over the
/// shards' evidence ([`RemoteEvidence`]) and their live indexes ([`RemoteLive`]),
/// made once the set's tokenizer is known.
struct Mixer {
    service: tokio::sync::OnceCell<SidecarService>,
    /// The model and mixing file, until the service takes them.
    neural: std::sync::Mutex<Option<Neural>>,
    config: ServeConfig,
    metrics: Arc<Metrics>,
}

fn partial_of(missing: Vec<u32>) -> Option<pb::Partial> {
    (!missing.is_empty()).then_some(pb::Partial {
        missing_shards: missing,
    })
}

impl RouterService {
    /// The router of `config` (role `router`); its shard set forms once [`RouterService::refresh`]
    /// has described the shard servers.
    pub fn new(
        config: &ServeConfig,
        token: Option<String>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ServeError> {
        let neural = Neural::load(config)?;
        Ok(Self {
            shards: Arc::new(
                ShardSet::new(config.cluster.clone(), token, Arc::clone(&metrics))
                    .map_err(ServeError::Setup)?,
            ),
            limits: config.limits,
            in_flight: Arc::new(Semaphore::new(config.limits.max_in_flight)),
            cpu: Arc::new(CpuInfo::detect()),
            neural_info: Arc::new(neural_info(neural.mixing.as_ref(), neural.model.as_ref())),
            mixer: Arc::new(Mixer {
                service: tokio::sync::OnceCell::new(),
                neural: std::sync::Mutex::new(Some(neural)),
                config: config.clone(),
                metrics,
            }),
        })
    }

    /// The service that runs `Mix`, `Score`, sessions, drafts and `AddDocuments` here (over the
    /// shards' evidence and their live indexes), made on first use: its model and mixing file
    /// must fit the shards' tokenizer.
    async fn mixer(&self) -> Result<&SidecarService, Status> {
        let members = self.shards.members()?;
        self.mixer
            .service
            .get_or_try_init(|| async {
                let mut held = self.mixer.neural.lock().unwrap_or_else(|e| e.into_inner());
                let neural = held
                    .take()
                    .ok_or_else(|| Status::internal("the router's model was lost"))?;
                if let Err(e) = neural.check_tokenizer(&members.tokenizer, "the shard servers") {
                    *held = Some(neural);
                    return Err(Status::failed_precondition(e.to_string()));
                }
                let evidence = Evidence {
                    corpus: None,
                    evidence: Arc::new(RemoteEvidence::new(Arc::clone(&self.shards), &members)),
                    tokenizer: members.tokenizer.clone(),
                    live: Some(Arc::new(RemoteLive::new(Arc::clone(&self.shards)))),
                };
                Ok(SidecarService::assemble(
                    &self.mixer.config,
                    Arc::clone(&self.mixer.metrics),
                    evidence,
                    neural,
                ))
            })
            .await
    }

    /// Describes the shard servers and checks the set again; true when every shard has a replica
    /// that answers (the router is ready).
    pub async fn refresh(&self) -> bool {
        self.shards.refresh().await;
        self.shards.members().is_ok_and(|m| m.all_healthy())
    }

    /// Ends the open streams of the router's sessions, `Score` and `Batch` with UNAVAILABLE: the
    /// drain deadline of a shutdown.
    pub(crate) fn close_streams(&self) {
        if let Some(service) = self.mixer.service.get() {
            service.close_streams();
        }
    }

    /// The set and an in-flight permit, or the status that refuses the call.
    fn begin(&self) -> Result<(Arc<Members>, tokio::sync::OwnedSemaphorePermit), Status> {
        let permit = Arc::clone(&self.in_flight)
            .try_acquire_owned()
            .map_err(|_| Status::resource_exhausted("the router is at its in-flight limit"))?;
        Ok((self.shards.members()?, permit))
    }

    async fn continuations(
        &self,
        members: &Members,
        deadline: Option<Instant>,
        ask: spb::ContinuationsRequest,
        allow_partial: bool,
    ) -> Result<(Vec<PartialContinuations>, Vec<u32>), Status> {
        let fanned = self
            .shards
            .fan_out(members, deadline, &ask, |mut c, r| async move {
                c.continuations(r).await
            })
            .await?;
        let Answered { answers, missing } = fanned.complete(allow_partial)?;
        let partials = answers
            .into_iter()
            .map(|(_, a)| continuations_of(a))
            .collect();
        Ok((partials, missing))
    }

    /// Every n-gram's count in every shard that answered.
    async fn counts(
        &self,
        members: &Members,
        deadline: Option<Instant>,
        ngrams: Vec<Vec<u32>>,
        allow_partial: bool,
    ) -> Result<Answered<Vec<u64>>, Status> {
        let ask = spb::CountRequest {
            ngrams: ngrams
                .iter()
                .map(|ids| spb::NGram { ids: ids.clone() })
                .collect(),
        };
        let fanned = self
            .shards
            .fan_out(members, deadline, &ask, |mut c, r| async move {
                c.count(r).await
            })
            .await?;
        let Answered { answers, missing } = fanned.complete(allow_partial)?;
        let answers = answers.into_iter().map(|(k, a)| (k, a.counts)).collect();
        Ok(Answered { answers, missing })
    }

    async fn search(
        &self,
        members: &Members,
        deadline: Option<Instant>,
        r: ValidSearch,
    ) -> Result<pb::SearchDocumentsResponse, Status> {
        let ValidSearch {
            cnf,
            opts,
            allow_partial,
        } = r;
        // First the counts of every n-gram: they decide the strides, as in a single index.
        let ngrams: Vec<Vec<u32>> = cnf.iter().flatten().cloned().collect();
        let n_grams = ngrams.len();
        let counted = self
            .counts(members, deadline, ngrams, allow_partial)
            .await?;
        let mut missing = counted.missing.clone();
        // Per clause, its n-grams' matches in the shards that count.
        let clause_totals = |keep: &dyn Fn(usize) -> bool| -> Result<Vec<u64>, Status> {
            let counts = sum_counts(&counted.answers, n_grams, keep).map_err(unmergeable)?;
            let mut at = 0;
            cnf.iter()
                .map(|clause| {
                    let sum = merge::sum(counts[at..at + clause.len()].iter().copied());
                    at += clause.len();
                    sum.map_err(unmergeable)
                })
                .collect()
        };
        let totals = clause_totals(&|_| true)?;
        // The strides a suffix array takes: a compressed shard refuses a search it would
        // subsample, or whose places it cannot locate in time, as one compressed index does.
        let place_cost = <crate::index::Index as docs::DocumentIndex>::PLACE_COST;
        let strides =
            docs::search_strides(&totals, place_cost, opts).map_err(super::index_status)?;
        let ask = spb::SearchRequest {
            cnf: cnf
                .iter()
                .map(|clause| spb::Clause {
                    ngrams: clause
                        .iter()
                        .map(|g| spb::NGram { ids: g.clone() })
                        .collect(),
                })
                .collect(),
            strides: strides.clone(),
            maxnum: opts.maxnum as u32,
            max_disp_len: opts.max_disp_len as u32,
        };
        let fanned = self
            .shards
            .fan_out(members, deadline, &ask, |mut c, r| async move {
                c.search_documents(r).await
            })
            .await?;
        let answered = fanned.complete(allow_partial)?;
        missing.extend(answered.missing);
        missing.sort_unstable();
        missing.dedup();
        let (bases, parts): (Vec<u64>, Vec<PartialSearch>) = answered
            .answers
            .into_iter()
            .filter(|(k, _)| !missing.contains(&(*k as u32)))
            .map(|(k, a)| (members.doc_bases[k], search_of(a)))
            .unzip();
        // A shard missing from the second trip leaves the counts too: the answer is the others'.
        let totals = clause_totals(&|k| !missing.contains(&(k as u32)))?;
        let mut found =
            merge::search(parts, &bases, &totals, &strides, opts.maxnum).map_err(unmergeable)?;
        for d in &mut found.documents {
            d.text = members.tokenizer.decode(&d.token_ids).ok();
        }
        Ok(search_response(found, partial_of(missing)))
    }

    /// Maximal matching spans over every shard: each start's longest span is the longest of the
    /// shards' (a span occurs in them together exactly when it occurs in one), its count the
    /// shards' sum, its documents the merged search's. Every shard must answer: a span's
    /// maximality depends on all of them.
    async fn trace(
        &self,
        members: &Members,
        deadline: Option<Instant>,
        ids: Vec<u32>,
        opts: TraceOptions,
    ) -> Result<pb::TraceResponse, Status> {
        let ask = spb::SpanLengthsRequest { ids: ids.clone() };
        let fanned = self
            .shards
            .fan_out(members, deadline, &ask, |mut c, r| async move {
                c.span_lengths(r).await
            })
            .await?;
        let mut longest = vec![0usize; ids.len()];
        for (_, answer) in fanned.complete(false)?.answers {
            for (l, &n) in longest.iter_mut().zip(&answer.lengths) {
                *l = (*l).max(n as usize);
            }
        }
        let spans = trace::maximal_spans(longest.into_iter(), opts.min_len);
        let grams: Vec<Vec<u32>> = spans.iter().map(|&(a, b)| ids[a..b].to_vec()).collect();
        let counted = self.counts(members, deadline, grams.clone(), false).await?;
        let counts = sum_counts(&counted.answers, grams.len(), |_| true).map_err(unmergeable)?;
        trace::check_shown(counts.iter().copied(), opts).map_err(super::index_status)?;
        // The edge made a `max_documents` of 0 the default: every span gets its documents.
        let searches = grams.into_iter().map(|gram| async move {
            let search = pb::SearchDocumentsRequest {
                cnf: vec![pb::Clause {
                    ngrams: vec![pb::NGram { ids: gram }],
                }],
                maxnum: opts.max_documents as u32,
                max_disp_len: opts.max_disp_len as u32,
                ..Default::default()
            }
            .validate(&self.limits)?;
            Ok::<_, Status>(self.search(members, deadline, search).await?.documents)
        });
        let documents = futures_util::future::try_join_all(searches).await?;
        let spans = (spans.into_iter().zip(counts).zip(documents))
            .map(|(((start, end), count), documents)| {
                trace_span(&members.tokenizer, &ids, (start, end, count), documents)
            })
            .collect();
        Ok(pb::TraceResponse { spans, ids })
    }
}

/// Each of `n` n-grams' count summed over the shards `keep` keeps (each answer: shard, counts).
fn sum_counts(
    answers: &[(usize, Vec<u64>)],
    n: usize,
    keep: impl Fn(usize) -> bool,
) -> Result<Vec<u64>, merge::Overflow> {
    let mut totals = vec![0u64; n];
    for (_, counts) in answers.iter().filter(|(k, _)| keep(*k)) {
        for (t, &c) in totals.iter_mut().zip(counts) {
            *t = t.checked_add(c).ok_or(merge::Overflow)?;
        }
    }
    Ok(totals)
}

/// What a router answers for the RPCs that need one index's suffix arrays whole (their merge over
/// shards is not written yet).
fn single_index_only(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "{rpc} runs on a sidecar or shard server with a whole index, not yet across a router's shards"
    ))
}

#[tonic::async_trait]
impl Sidecar for RouterService {
    async fn info(
        &self,
        _request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let (m, _permit) = self.begin()?;
        let first = m.layout.first();
        let ids = || m.layout.shards.iter().map(|(id, _)| id);
        Ok(Response::new(pb::InfoResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            index_dir: format!(
                "router over {} shard servers (set {})",
                m.shards(),
                first.set_id
            ),
            replicas_down: m.down(),
            index_shards: ids().map(|id| id.local_parts).sum(),
            index_tokens: ids().map(|id| id.tokens).sum(),
            index_documents: ids().map(|id| id.documents).sum(),
            vocab_size: first.vocab_size,
            eos_token_id: first.eos_token_id,
            tokenizer_fingerprint: first.tokenizer_fingerprint.clone(),
            cpu_model: self.cpu.model.clone(),
            cpu_features: self.cpu.features.iter().map(|f| f.to_string()).collect(),
            ..(*self.neural_info).clone()
        }))
    }

    async fn tokenize(
        &self,
        request: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        let deadline = deadline_of(&request);
        let text = request.into_inner().text;
        let (m, _permit) = self.begin()?;
        // Megabytes of text take the tokenizer a while: not on the runtime's threads.
        let ids = on_pool_alone(deadline, move || {
            (m.tokenizer.encode(&text)).map_err(tokenizer_status)
        })
        .await?;
        Ok(Response::new(pb::TokenizeResponse { ids }))
    }

    async fn detokenize(
        &self,
        request: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        let deadline = deadline_of(&request);
        let ids = request.into_inner().ids;
        let (m, _permit) = self.begin()?;
        let vocab = m.layout.first().vocab_size;
        crate::index::query::check_vocabulary(&ids, vocab).map_err(super::index_status)?;
        let text = on_pool_alone(deadline, move || {
            (m.tokenizer.decode(&ids)).map_err(tokenizer_status)
        })
        .await?;
        Ok(Response::new(pb::DetokenizeResponse { text }))
    }

    async fn count(
        &self,
        request: Request<pb::CountRequest>,
    ) -> Result<Response<pb::CountResponse>, Status> {
        let (deadline, r) = accept(request, &self.limits)?;
        let (m, _permit) = self.begin()?;
        let counted = self
            .counts(&m, deadline, vec![r.ids], r.allow_partial)
            .await?;
        let count = sum_counts(&counted.answers, 1, |_| true).map_err(unmergeable)?[0];
        Ok(Response::new(pb::CountResponse {
            count,
            partial: partial_of(counted.missing),
        }))
    }

    async fn next_token_distribution(
        &self,
        request: Request<pb::NextTokenDistributionRequest>,
    ) -> Result<Response<pb::NextTokenDistributionResponse>, Status> {
        let (deadline, r) = accept(request, &self.limits)?;
        let (m, _permit) = self.begin()?;
        let ask = spb::ContinuationsRequest {
            prompt: r.prompt,
            infinite: r.infinite,
            max_support: r.max_support.unwrap_or(0),
            ..Default::default()
        };
        let (parts, missing) = self
            .continuations(&m, deadline, ask, r.allow_partial)
            .await?;
        let merged = merge::continuations(&parts, r.max_support).map_err(unmergeable)?;
        // As a single sidecar: the n-gram's sparse flag is read off its distribution.
        let sparse = match r.infinite {
            true => merged.sparse,
            false => merged.ntd.dist.len() == 1,
        };
        Ok(Response::new(pb::NextTokenDistributionResponse {
            prompt_cnt: merged.ntd.prompt_cnt,
            dist: token_probs(&merged.ntd.dist),
            approx: merged.ntd.approx,
            suffix_len: merged.suffix_len as u32,
            sparse,
            partial: partial_of(missing),
        }))
    }

    async fn search_documents(
        &self,
        request: Request<pb::SearchDocumentsRequest>,
    ) -> Result<Response<pb::SearchDocumentsResponse>, Status> {
        let (deadline, r) = accept(request, &self.limits)?;
        let (m, _permit) = self.begin()?;
        self.search(&m, deadline, r).await.map(Response::new)
    }

    async fn mix(
        &self,
        request: Request<pb::MixRequest>,
    ) -> Result<Response<pb::MixResponse>, Status> {
        self.mixer().await?.mix(request).await
    }

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<pb::GenerateResponse>, Status> {
        let (deadline, r) = accept(request, &self.limits)?;
        let (prompt, spec, draw) = (r.prompt, r.spec, r.draw);
        let (m, _permit) = self.begin()?;
        let first = m.layout.first();
        check_vocabulary(&prompt, first.vocab_size).map_err(super::index_status)?;
        let shards = RemoteEvidence::new(Arc::clone(&self.shards), &m);
        let eos = first.eos_token_id;
        let made = on_pool_alone(deadline, move || {
            RemoteLevels::new(shards, eos)
                .and_then(|mut levels| generate_from(&mut levels, &prompt, &spec, draw))
                .map_err(super::index_status)
        })
        .await?;
        Ok(Response::new(generate_response(&m.tokenizer, made)))
    }

    async fn trace(
        &self,
        request: Request<pb::TraceRequest>,
    ) -> Result<Response<pb::TraceResponse>, Status> {
        let (deadline, r) = accept(request, &self.limits)?;
        let (m, _permit) = self.begin()?;
        let opts = r.opts;
        // A text to trace takes the tokenizer a while: not on the runtime's threads.
        let members = Arc::clone(&m);
        let ids = on_pool_alone(deadline, move || Ok(r.ids(&members.tokenizer)?)).await?;
        self.trace(&m, deadline, ids, opts).await.map(Response::new)
    }

    async fn hints(
        &self,
        _request: Request<pb::HintsRequest>,
    ) -> Result<Response<pb::HintsResponse>, Status> {
        Err(single_index_only("Hints"))
    }

    async fn draft(
        &self,
        request: Request<pb::DraftRequest>,
    ) -> Result<Response<pb::DraftResponse>, Status> {
        self.mixer().await?.draft(request).await
    }

    async fn add_documents(
        &self,
        request: Request<pb::AddDocumentsRequest>,
    ) -> Result<Response<pb::AddDocumentsResponse>, Status> {
        self.mixer().await?.add_documents(request).await
    }

    type ScoreStream = ResponseStream<pb::ScoreResponse>;

    async fn score(
        &self,
        request: Request<pb::ScoreRequest>,
    ) -> Result<Response<Self::ScoreStream>, Status> {
        self.mixer().await?.score(request).await
    }

    type SessionStream = ResponseStream<pb::SessionResponse>;

    async fn session(
        &self,
        request: Request<Streaming<pb::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        self.mixer().await?.session(request).await
    }

    type BatchStream = ResponseStream<pb::BatchStepResult>;

    async fn batch(
        &self,
        request: Request<Streaming<pb::BatchStep>>,
    ) -> Result<Response<Self::BatchStream>, Status> {
        self.mixer().await?.batch(request).await
    }
}

/// How often a router describes its shards while it has no complete set.
pub(super) const FORMING_REFRESH: Duration = Duration::from_millis(500);
