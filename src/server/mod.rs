//! The gRPC service (`proto/sidecar/v1/sidecar.proto`) over the library: the engine's queries, the
//! tokenizer, and mixing with the caller's own neural distribution. CPU work runs on tokio's blocking
//! pool behind a semaphore, so a full sidecar answers RESOURCE_EXHAUSTED instead of queueing without
//! bound.

pub mod config;
mod serve;

pub use serve::serve;

use std::sync::Arc;

use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use crate::index::dense::TokenScore;
use crate::index::docs::SearchOptions;
use crate::index::query::InfgramNtdResult;
use crate::index::{Index, IndexError, OpenOptions};
use crate::mix::features::{
    feature_names, gate_features, GateFeatures, InfgramContext, NeuralContext, NUM_FEATURES,
};
use crate::mix::{
    self, LambdaRule, MixError, MixingParams, NeuralDistribution, SparseDistribution,
};
use crate::tokenizer::Tokenizer;
use config::{Limits, ServeConfig};

/// The generated code of the API.
pub mod pb {
    tonic::include_proto!("sidecar.v1");
    /// For gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("sidecar_v1_descriptor");
}

use pb::sidecar_server::Sidecar;

/// What every request reads.
struct State {
    index: Index,
    tokenizer: Tokenizer,
    mixing: Option<MixingParams>,
    limits: Limits,
    in_flight: Arc<Semaphore>,
}

#[derive(Clone)]
pub struct SidecarService {
    state: Arc<State>,
}

fn index_status(e: IndexError) -> Status {
    match e {
        IndexError::Invalid(m) => Status::invalid_argument(m),
        other => Status::internal(other.to_string()),
    }
}

fn mix_status(e: MixError) -> Status {
    match e {
        MixError::Invalid(m) => Status::invalid_argument(m),
        MixError::Index(e) => index_status(e),
        other => Status::internal(other.to_string()),
    }
}

impl SidecarService {
    /// Opens the index (with its tokenizer) and the mixing file of a config.
    pub fn open(config: &ServeConfig) -> anyhow::Result<Self> {
        let index = Index::open(&config.index, &OpenOptions::default())?;
        let tokenizer = index.tokenizer().cloned().ok_or_else(|| {
            anyhow::anyhow!("{}: the index has no tokenizer", config.index.display())
        })?;
        let mixing = config
            .mixing
            .as_deref()
            .map(MixingParams::load)
            .transpose()?;
        if let Some(m) = &mixing {
            m.check_tokenizer(tokenizer.fingerprint())?;
        }
        Ok(Self {
            state: Arc::new(State {
                index,
                tokenizer,
                mixing,
                limits: config.limits,
                in_flight: Arc::new(Semaphore::new(config.limits.max_in_flight)),
            }),
        })
    }

    /// Runs CPU work on the blocking pool, or refuses it when `max_in_flight` requests already run.
    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&State) -> Result<T, Status> + Send + 'static,
    ) -> Result<Response<T>, Status> {
        let permit = Arc::clone(&self.state.in_flight)
            .try_acquire_owned()
            .map_err(|_| Status::resource_exhausted("the sidecar is at its in-flight limit"))?;
        let state = Arc::clone(&self.state);
        let result = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work(&state)
        })
        .await
        .map_err(|e| Status::internal(format!("worker failed: {e}")))?;
        result.map(Response::new)
    }

    fn check_len(limits: &Limits, what: &str, len: usize) -> Result<(), Status> {
        if len > limits.max_context_tokens {
            return Err(Status::invalid_argument(format!(
                "{what} has {len} tokens, more than the limit of {}",
                limits.max_context_tokens
            )));
        }
        Ok(())
    }
}

fn token_probs(dist: &std::collections::BTreeMap<u32, u64>) -> Vec<pb::TokenProb> {
    let total: u64 = dist.values().sum();
    dist.iter()
        .map(|(&token, &c)| pb::TokenProb {
            token,
            prob: if total == 0 {
                0.0
            } else {
                c as f64 / total as f64
            },
            cont_cnt: c,
        })
        .collect()
}

#[tonic::async_trait]
impl Sidecar for SidecarService {
    async fn info(
        &self,
        _: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let s = &self.state;
        let (lambda_sparse, lambda_dense, gate) = match &s.mixing {
            Some(m) => (m.lambda_sparse, m.lambda_dense, m.gate.is_some()),
            None => (0.0, 0.0, false),
        };
        Ok(Response::new(pb::InfoResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            index_dir: s.index.dir().display().to_string(),
            index_shards: s.index.num_shards() as u32,
            index_tokens: s.index.total_tokens(),
            index_documents: s.index.total_documents(),
            vocab_size: s.index.vocab_size(),
            eos_token_id: s.index.eos_token_id(),
            tokenizer_fingerprint: s.tokenizer.fingerprint().to_string(),
            model: String::new(),
            lambda_sparse,
            lambda_dense,
            gate,
        }))
    }

    async fn tokenize(
        &self,
        request: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        let text = request.into_inner().text;
        self.run(move |s| {
            let ids = s
                .tokenizer
                .encode(&text)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            Ok(pb::TokenizeResponse { ids })
        })
        .await
    }

    async fn detokenize(
        &self,
        request: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        let ids = request.into_inner().ids;
        self.run(move |s| {
            s.index.check_ids(&ids).map_err(index_status)?;
            let text = s
                .tokenizer
                .decode(&ids)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            Ok(pb::DetokenizeResponse { text })
        })
        .await
    }

    async fn count(
        &self,
        request: Request<pb::CountRequest>,
    ) -> Result<Response<pb::CountResponse>, Status> {
        let ids = request.into_inner().ids;
        self.run(move |s| {
            Self::check_len(&s.limits, "the n-gram", ids.len())?;
            let count = s.index.count(&ids).map_err(index_status)?;
            Ok(pb::CountResponse { count })
        })
        .await
    }

    async fn next_token_distribution(
        &self,
        request: Request<pb::NextTokenDistributionRequest>,
    ) -> Result<Response<pb::NextTokenDistributionResponse>, Status> {
        let r = request.into_inner();
        self.run(move |s| {
            Self::check_len(&s.limits, "the prompt", r.prompt.len())?;
            let max_support = (r.max_support > 0).then_some(r.max_support);
            let (ntd, suffix_len, sparse) = match r.infinite {
                true => {
                    let a = s
                        .index
                        .infgram_ntd(&r.prompt, max_support)
                        .map_err(index_status)?;
                    (a.ntd, a.suffix_len, a.sparse)
                }
                false => {
                    let a = s.index.ntd(&r.prompt, max_support).map_err(index_status)?;
                    let sparse = a.dist.len() == 1;
                    (a, r.prompt.len(), sparse)
                }
            };
            Ok(pb::NextTokenDistributionResponse {
                prompt_cnt: ntd.prompt_cnt,
                dist: token_probs(&ntd.dist),
                approx: ntd.approx,
                suffix_len: suffix_len as u32,
                sparse,
            })
        })
        .await
    }

    async fn search_documents(
        &self,
        request: Request<pb::SearchDocumentsRequest>,
    ) -> Result<Response<pb::SearchDocumentsResponse>, Status> {
        let r = request.into_inner();
        self.run(move |s| {
            let cnf: Vec<Vec<Vec<u32>>> = r
                .cnf
                .into_iter()
                .map(|c| c.ngrams.into_iter().map(|g| g.ids).collect())
                .collect();
            let tokens: usize = cnf.iter().flatten().map(Vec::len).sum();
            Self::check_len(&s.limits, "the CNF", tokens)?;
            let defaults = SearchOptions::default();
            let or_default = |v: u64, d: u64| if v == 0 { d } else { v };
            let maxnum = or_default(r.maxnum.into(), defaults.maxnum as u64) as usize;
            if maxnum > s.limits.max_top_k {
                return Err(Status::invalid_argument(format!(
                    "maxnum must be at most {}",
                    s.limits.max_top_k
                )));
            }
            let opts = SearchOptions {
                maxnum,
                max_disp_len: or_default(r.max_disp_len.into(), defaults.max_disp_len as u64)
                    as usize,
                max_clause_freq: or_default(r.max_clause_freq, defaults.max_clause_freq),
            };
            let found = s.index.search_docs_cnf(&cnf, opts).map_err(index_status)?;
            Ok(pb::SearchDocumentsResponse {
                cnt: found.cnt,
                approx: found.approx,
                documents: found
                    .documents
                    .into_iter()
                    .map(|d| pb::Document {
                        doc_ix: d.doc_ix,
                        doc_len: d.doc_len,
                        disp_len: d.disp_len,
                        needle_offset: d.needle_offset,
                        metadata: d.metadata.unwrap_or_default(),
                        token_ids: d.token_ids,
                        text: d.text.unwrap_or_default(),
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn mix(
        &self,
        request: Request<pb::MixRequest>,
    ) -> Result<Response<pb::MixResponse>, Status> {
        let r = request.into_inner();
        self.run(move |s| {
            Self::check_len(&s.limits, "the context", r.context.len())?;
            if r.top_k == 0 || r.top_k as usize > s.limits.max_top_k {
                return Err(Status::invalid_argument(format!(
                    "top_k must be in 1..={}",
                    s.limits.max_top_k
                )));
            }
            let vocab = s.index.vocab_size() as usize;
            let neural = match r.neural {
                Some(pb::mix_request::Neural::Logits(l)) => {
                    if l.logits.len() != vocab {
                        return Err(Status::invalid_argument(format!(
                            "{} logits for a vocabulary of {vocab}",
                            l.logits.len()
                        )));
                    }
                    NeuralDistribution::from_logits(&l.logits).map_err(mix_status)?
                }
                Some(pb::mix_request::Neural::TopKLogprobs(t)) => {
                    if t.tokens.len() != t.logprobs.len() {
                        return Err(Status::invalid_argument(
                            "top-k tokens and log-probs differ in length",
                        ));
                    }
                    let entries = t.tokens.into_iter().zip(t.logprobs).collect();
                    NeuralDistribution::from_top_k(entries, t.rest_mass, vocab)
                        .map_err(mix_status)?
                }
                None => {
                    return Err(Status::invalid_argument(
                        "the request needs logits or top-k log-probs",
                    ))
                }
            };
            let infgram = s
                .index
                .infgram_ntd(&r.context, None)
                .map_err(index_status)?;
            let mut features = Vec::new();
            let lambda = match r.lambda {
                Some(pb::mix_request::Lambda::FixedLambda(l)) if (0.0..=1.0).contains(&l) => l,
                Some(pb::mix_request::Lambda::FixedLambda(l)) => {
                    return Err(Status::invalid_argument(format!("λ {l} is outside [0, 1]")))
                }
                Some(pb::mix_request::Lambda::Gate(_)) => {
                    let f = gate_input(s, &r.context, &infgram, &neural)?;
                    features = f.to_vec();
                    fitted_lambda(s, LambdaRule::Gate, infgram.sparse, f)?
                }
                Some(pb::mix_request::Lambda::Split(_)) | None => {
                    fitted_lambda(s, LambdaRule::Split, infgram.sparse, [0.0; NUM_FEATURES])?
                }
            };
            let sparse = SparseDistribution::from_ntd(&infgram.ntd);
            let mixed = mix::mix(&sparse, &neural, lambda, r.top_k as usize);
            Ok(pb::MixResponse {
                top: mixed
                    .top
                    .iter()
                    .map(|&(token, prob)| pb::TokenProb {
                        token,
                        prob,
                        cont_cnt: 0,
                    })
                    .collect(),
                rest_mass: mixed.rest_mass,
                lambda,
                suffix_len: infgram.suffix_len as u32,
                prompt_cnt: infgram.ntd.prompt_cnt,
                sparse: infgram.sparse,
                gate_feature_names: if features.is_empty() {
                    Vec::new()
                } else {
                    feature_names()
                },
                gate_features: features,
            })
        })
        .await
    }
}

/// λ for one token from the mixing file's rule.
fn fitted_lambda(
    s: &State,
    rule: LambdaRule,
    sparse: bool,
    features: GateFeatures,
) -> Result<f64, Status> {
    let mixing = s.mixing.as_ref().ok_or_else(|| {
        Status::failed_precondition("no mixing file is configured: pass fixed_lambda")
    })?;
    let lambdas = mixing
        .lambdas(rule, None, &[sparse], &[features])
        .map_err(mix_status)?;
    lambdas
        .first()
        .copied()
        .ok_or_else(|| Status::internal("no λ for the token"))
}

/// The gate's features for a context, from the ∞-gram's match and the caller's distribution.
fn gate_input(
    s: &State,
    context: &[u32],
    infgram: &InfgramNtdResult,
    neural: &NeuralDistribution,
) -> Result<GateFeatures, Status> {
    let score = TokenScore {
        prob: 0.0,
        suffix_len: infgram.suffix_len,
        prompt_cnt: infgram.ntd.prompt_cnt,
        cont_cnt: 0,
        sparse: infgram.sparse,
    };
    let ctx = InfgramContext::new(&s.index, context, &score).map_err(mix_status)?;
    let (entropy, top_prob) = neural.entropy_and_top();
    Ok(gate_features(&ctx, &NeuralContext { entropy, top_prob }))
}
