//! The shard servers behind a router: found from the config's addresses and a DNS name that
//! resolves to many (a Kubernetes headless Service), described, checked to form one set
//! ([`super::set`]), re-checked every `refresh_secs`; and the fan-out of one call to every shard,
//! with a deadline per shard taken from the caller's and retries on the shard's other replicas.
//! Every answer is validated where it arrives ([`super::validate`]): a replica that answers
//! nonsense is down as one that does not answer, and stays down until it answers sanely.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use super::identity::{is_wrong_shard, Expected};
use super::merge;
use super::set::{assemble, Member, SetLayout, ShardIdentity, Stray};
use super::validate::ShardAnswer;
use crate::server::config::ClusterSection;
use crate::server::metrics::Metrics;
use crate::server::shard_pb as spb;
use crate::tokenizer::Tokenizer;

/// Adds the deployment's bearer token to every call to a shard server.
#[derive(Clone)]
pub(crate) struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

pub(crate) type ShardClient = spb::shard_client::ShardClient<InterceptedService<Channel, Bearer>>;

/// Time kept back from the caller's deadline for merging and answering.
const MERGE_MARGIN: Duration = Duration::from_millis(2);
/// Most time a Describe of the refresh may take.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(2);

/// One shard server.
pub(crate) struct Replica {
    pub address: String,
    client: ShardClient,
    /// Answered its last Describe and its last call.
    healthy: AtomicBool,
    /// Why its last answer was refused, until one is not: a Describe alone does not make a replica
    /// that answers nonsense healthy again.
    malformed: Mutex<Option<String>>,
}

impl Replica {
    fn malformed(&self) -> Option<String> {
        self.malformed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_malformed(&self, why: Option<String>) {
        *self.malformed.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }
}

/// The set as last checked: every shard's replicas, its documents' numbering, the tokenizer.
pub(crate) struct Members {
    pub layout: SetLayout,
    pub replicas: Vec<Vec<Arc<Replica>>>,
    pub doc_bases: Vec<u64>,
    pub tokenizer: Tokenizer,
    /// The shard servers found that the set leaves out.
    pub strays: Vec<Stray>,
    /// Where each call starts among a shard's replicas (round robin).
    next: AtomicUsize,
}

impl Members {
    pub fn shards(&self) -> u32 {
        self.replicas.len() as u32
    }

    /// Every shard has a replica that answered lately.
    pub fn all_healthy(&self) -> bool {
        self.replicas
            .iter()
            .all(|r| r.iter().any(|x| x.healthy.load(Ordering::Relaxed)))
    }

    /// The replicas down now, each as its address and, when it answered nonsense, why; then the
    /// servers left out of the set, and why.
    pub fn down(&self) -> Vec<String> {
        let down = (self.replicas.iter().flatten())
            .filter(|r| !r.healthy.load(Ordering::Relaxed))
            .map(|r| match r.malformed() {
                Some(why) => format!("{} (malformed answer: {why})", r.address),
                None => r.address.clone(),
            });
        let left_out =
            (self.strays.iter()).map(|s| format!("{} (left out of the set: {})", s.address, s.why));
        down.chain(left_out).collect()
    }
}

/// A call's answers, one per shard: `None` for a shard none of whose replicas answered.
pub(crate) struct Fanned<T> {
    pub answers: Vec<Option<T>>,
    /// The shards missing, with why.
    pub missing: Vec<(u32, String)>,
}

impl<T> Fanned<T> {
    /// The answers of every shard, or UNAVAILABLE naming the shards missing; with
    /// `allow_partial`, those that answered and the numbers of the missing.
    pub fn complete(self, allow_partial: bool) -> Result<Answered<T>, Status> {
        if !self.missing.is_empty() && !allow_partial {
            let why: Vec<String> = self.missing.iter().map(|(_, why)| why.clone()).collect();
            return Err(Status::unavailable(why.join("; ")));
        }
        let missing = self.missing.iter().map(|(k, _)| *k).collect();
        let answered = self
            .answers
            .into_iter()
            .enumerate()
            .filter_map(|(k, a)| a.map(|a| (k, a)))
            .collect();
        Ok(Answered {
            answers: answered,
            missing,
        })
    }
}

/// What the shards that answered said, each with its shard's number, and which shards are missing.
pub(crate) struct Answered<T> {
    pub answers: Vec<(usize, T)>,
    pub missing: Vec<u32>,
}

/// The router's view of its shard servers.
pub(crate) struct ShardSet {
    config: ClusterSection,
    bearer: Bearer,
    /// Where malformed answers are counted, per replica.
    metrics: Arc<Metrics>,
    /// The checked set, or why there is none yet.
    members: RwLock<Result<Arc<Members>, String>>,
    /// Every shard server ever described, by address, with its identity and tokenizer.
    known: Mutex<HashMap<String, Known>>,
}

struct Known {
    replica: Arc<Replica>,
    identity: Option<(ShardIdentity, String)>,
}

/// Whether another replica of the shard may answer where this one did not.
fn retriable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Cancelled
            | Code::Unknown
            | Code::Internal
            | Code::Aborted
    )
}

impl ShardSet {
    pub fn new(
        config: ClusterSection,
        token: Option<String>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        let bearer = match token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| "the bearer token is not a valid header value".to_string())?,
            ),
            None => None,
        };
        Ok(Self {
            config,
            bearer: Bearer(bearer),
            metrics,
            members: RwLock::new(Err("the router has not described its shards yet".into())),
            known: Mutex::new(HashMap::new()),
        })
    }

    /// The set, or FAILED_PRECONDITION / UNAVAILABLE saying why there is none.
    pub fn members(&self) -> Result<Arc<Members>, Status> {
        match &*self.members.read().unwrap_or_else(|e| e.into_inner()) {
            Ok(m) => Ok(Arc::clone(m)),
            Err(why) => Err(Status::unavailable(format!(
                "the router has no complete shard set: {why}"
            ))),
        }
    }

    fn client(&self, address: &str) -> Result<ShardClient, String> {
        let uri = match address.contains("://") {
            true => address.to_string(),
            false => format!("http://{address}"),
        };
        let channel = Endpoint::from_shared(uri)
            .map_err(|e| format!("{address}: {e}"))?
            .connect_timeout(Duration::from_millis(self.config.shard_timeout_ms))
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(
            spb::shard_client::ShardClient::with_interceptor(channel, self.bearer.clone())
                .max_decoding_message_size(usize::MAX),
        )
    }

    /// The addresses to describe: the config's, and what its DNS name resolves to now.
    async fn addresses(&self) -> Vec<String> {
        let mut out = self.config.shards.clone();
        if let Some(name) = &self.config.shard_service {
            match tokio::net::lookup_host(name.as_str()).await {
                Ok(found) => {
                    let mut found: Vec<String> = found.map(|a| a.to_string()).collect();
                    found.sort();
                    out.extend(found);
                }
                Err(e) => {
                    tracing::warn!(name = %name, error = %e, "shard_service does not resolve")
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|a| seen.insert(a.clone()));
        out
    }

    /// Describes every shard server, and checks the set again: what the refresh loop runs.
    pub async fn refresh(&self) {
        let addresses = self.addresses().await;
        let replicas: Vec<Arc<Replica>> = {
            let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            known.retain(|a, _| addresses.contains(a));
            addresses
                .iter()
                .filter_map(|a| {
                    if let Some(k) = known.get(a) {
                        return Some(Arc::clone(&k.replica));
                    }
                    match self.client(a) {
                        Ok(client) => {
                            let replica = Arc::new(Replica {
                                address: a.clone(),
                                client,
                                healthy: AtomicBool::new(false),
                                malformed: Mutex::new(None),
                            });
                            known.insert(
                                a.clone(),
                                Known {
                                    replica: Arc::clone(&replica),
                                    identity: None,
                                },
                            );
                            Some(replica)
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "a shard address is not usable");
                            None
                        }
                    }
                })
                .collect()
        };
        // The tokenizer of the set accepted: a replica whose tokenizer it is leaves its JSON out.
        let have = (self.members.read().unwrap_or_else(|e| e.into_inner()))
            .as_ref()
            .map_or_else(|_| String::new(), |m| m.tokenizer.fingerprint().to_string());
        let described = futures_util::future::join_all(replicas.iter().map(|r| async {
            let mut client = r.client.clone();
            let mut request = Request::new(spb::DescribeRequest {
                have_tokenizer_fingerprint: have.clone(),
            });
            request.set_timeout(DESCRIBE_TIMEOUT);
            let answer = tokio::time::timeout(DESCRIBE_TIMEOUT, client.describe(request)).await;
            match answer {
                Ok(Ok(d)) => Some(d.into_inner()),
                _ => None,
            }
        }))
        .await;
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let mut answering = std::collections::HashSet::new();
        for (replica, description) in replicas.iter().zip(described) {
            let sane = replica.malformed().is_none();
            replica
                .healthy
                .store(description.is_some() && sane, Ordering::Relaxed);
            if let (Some(d), Some(k)) = (description, known.get_mut(&replica.address)) {
                k.identity = Some((ShardIdentity::from(&d), d.tokenizer_json));
                // (Left out when it is the accepted set's tokenizer, which `members_of` keeps.)
                answering.insert(replica.address.clone());
            }
        }
        let members: Vec<Member> = addresses
            .iter()
            .filter_map(|a| {
                let (id, _) = known.get(a)?.identity.as_ref()?;
                Some(Member {
                    address: a.clone(),
                    identity: id.clone(),
                    answering: answering.contains(a),
                })
            })
            .collect();
        let previous = (self.members.read().unwrap_or_else(|e| e.into_inner()))
            .as_ref()
            .ok()
            .map(Arc::clone);
        let outcome = match assemble(&members, previous.as_ref().map(|m| &m.layout)) {
            Ok(assembled) => {
                self.note_strays(&assembled.strays, previous.as_deref());
                self.members_of(assembled.layout, assembled.strays, &known)
            }
            Err(e) => Err(e.to_string()),
        };
        drop(known);
        if let Err(why) = &outcome {
            tracing::warn!(why = %why, "no complete shard set");
        }
        *self.members.write().unwrap_or_else(|e| e.into_inner()) = outcome;
    }

    /// Logs the servers newly left out of the set, and counts those left out now.
    fn note_strays(&self, strays: &[Stray], previous: Option<&Members>) {
        for stray in strays {
            if !previous.is_some_and(|p| p.strays.contains(stray)) {
                tracing::warn!(server = %stray.address, why = %stray.why, "a shard server is left out of the set");
            }
        }
        self.metrics.stray_replicas.set(strays.len() as i64);
    }

    fn members_of(
        &self,
        layout: SetLayout,
        strays: Vec<Stray>,
        known: &HashMap<String, Known>,
    ) -> Result<Arc<Members>, String> {
        let replicas: Vec<Vec<Arc<Replica>>> = layout
            .shards
            .iter()
            .map(|(_, addrs)| {
                // In address order, so every router's first replica of a shard is the same one.
                let mut addrs = addrs.clone();
                addrs.sort();
                addrs
                    .iter()
                    .filter_map(|a| known.get(a).map(|k| Arc::clone(&k.replica)))
                    .collect()
            })
            .collect();
        // Keep the tokenizer of the set already checked when it is the same one.
        let fingerprint = &layout.first().tokenizer_fingerprint;
        let current = self
            .members
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .ok()
            .filter(|m| m.tokenizer.fingerprint() == fingerprint)
            .map(|m| m.tokenizer.clone());
        let tokenizer = match current {
            Some(t) => t,
            None => {
                let (_, json) = known
                    .get(&layout.shards[0].1[0])
                    .and_then(|k| k.identity.as_ref())
                    .ok_or("the first shard has no description")?;
                let t = Tokenizer::from_json(json, "the shard servers' tokenizer")
                    .map_err(|e| e.to_string())?;
                if t.fingerprint() != fingerprint {
                    return Err(format!(
                        "the shards' tokenizer rebuilds with fingerprint {}, not their {fingerprint}",
                        t.fingerprint()
                    ));
                }
                t
            }
        };
        Ok(Arc::new(Members {
            doc_bases: layout.doc_bases(),
            layout,
            replicas,
            tokenizer,
            strays,
            next: AtomicUsize::new(0),
        }))
    }

    /// Runs `call` with `ask` once on every shard (on one of its replicas), all at once. A replica
    /// that fails with a status another may not have (unavailable, busy, its deadline), or answers
    /// what `ask` cannot get from its shard ([`ShardAnswer::validate`]), is marked unhealthy and
    /// the next replica is tried while the shard's deadline allows; the caller's own errors (a bad
    /// argument) come back as they are.
    pub async fn fan_out<Q, T, F, Fut>(
        &self,
        members: &Members,
        deadline: Option<Instant>,
        ask: &Q,
        call: F,
    ) -> Result<Fanned<T>, Status>
    where
        Q: Clone,
        T: ShardAnswer<Q>,
        F: Fn(ShardClient, Request<Q>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let start = members.next.fetch_add(1, Ordering::Relaxed);
        let calls = (0..members.replicas.len())
            .map(|k| self.call_shard(members, k, start, deadline, ask, &call));
        let outcomes = futures_util::future::join_all(calls).await;
        let mut fanned = Fanned {
            answers: Vec::with_capacity(outcomes.len()),
            missing: Vec::new(),
        };
        for (k, outcome) in outcomes.into_iter().enumerate() {
            match outcome? {
                Ok(answer) => fanned.answers.push(Some(answer)),
                Err(why) => {
                    fanned.answers.push(None);
                    fanned.missing.push((k as u32, why));
                }
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Status::deadline_exceeded(
                "the deadline passed while the shards answered",
            ));
        }
        Ok(fanned)
    }

    /// Runs `call` with `ask` on shard `k` alone, on its first replica that answers sanely (the
    /// same one each time while it does): what the owner of a live namespace gets. UNAVAILABLE
    /// names the shard when no replica does.
    pub async fn call_one<Q, T, F, Fut>(
        &self,
        members: &Members,
        k: usize,
        deadline: Option<Instant>,
        ask: &Q,
        call: F,
    ) -> Result<T, Status>
    where
        Q: Clone,
        T: ShardAnswer<Q>,
        F: Fn(ShardClient, Request<Q>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_shard(members, k, 0, deadline, ask, &call)
            .await?
            .map_err(Status::unavailable)
    }

    /// Runs `call` with `ask` on every replica of shard `k` at once: the answers when each took
    /// it (a write kept by every replica, so that whichever answers later has it). UNAVAILABLE
    /// names the shard and the replicas that did not; those that did keep what they took, and a
    /// retry with the same request id adds it to the others alone.
    pub async fn call_every_replica<Q, T, F, Fut>(
        &self,
        members: &Members,
        k: usize,
        deadline: Option<Instant>,
        ask: &Q,
        call: F,
    ) -> Result<Vec<T>, Status>
    where
        Q: Clone,
        T: ShardAnswer<Q>,
        F: Fn(ShardClient, Request<Q>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let replicas = &members.replicas[k];
        let expected = self.config.replicas_per_shard;
        if replicas.len() < expected {
            return Err(Status::unavailable(format!(
                "shard {k} of {}: the router knows {} of its {expected} replicas (cluster.replicas_per_shard), and a write must reach every one",
                members.shards(),
                replicas.len()
            )));
        }
        let outcomes = futures_util::future::join_all(
            (replicas.iter()).map(|r| self.call_replica(members, k, r, deadline, ask, &call, true)),
        )
        .await;
        let mut answers = Vec::with_capacity(replicas.len());
        let mut failed = Vec::new();
        for outcome in outcomes {
            match outcome? {
                Ok(answer) => answers.push(answer),
                Err(why) => failed.push(why),
            }
        }
        match failed.is_empty() {
            true => Ok(answers),
            false => Err(Status::unavailable(format!(
                "shard {k} of {}: {} of its {} replicas did not take the write ({})",
                members.shards(),
                failed.len(),
                replicas.len(),
                failed.join("; ")
            ))),
        }
    }

    /// `call` with `ask` on shard `k`, its replicas tried in turn (healthy ones first, from the
    /// `start`-th): the answer that passed validation, why no replica gave one, or the caller's
    /// own error.
    async fn call_shard<Q, T, F, Fut>(
        &self,
        members: &Members,
        k: usize,
        start: usize,
        deadline: Option<Instant>,
        ask: &Q,
        call: &F,
    ) -> Result<Result<T, String>, Status>
    where
        Q: Clone,
        T: ShardAnswer<Q>,
        F: Fn(ShardClient, Request<Q>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let replicas = &members.replicas[k];
        let mut order: Vec<&Arc<Replica>> = (0..replicas.len())
            .map(|i| &replicas[(start + i) % replicas.len()])
            .collect();
        order.sort_by_key(|r| !r.healthy.load(Ordering::Relaxed));
        let mut last = String::from("no replica");
        for replica in order {
            match self
                .call_replica(members, k, replica, deadline, ask, call, false)
                .await?
            {
                Ok(answer) => return Ok(Ok(answer)),
                Err(why) => last = why,
            }
            if deadline.is_some_and(|d| Instant::now() + MERGE_MARGIN >= d) {
                break;
            }
        }
        Ok(Err(format!(
            "shard {k} of {} is unavailable ({last})",
            members.shards()
        )))
    }

    /// `call` with `ask` on one replica of shard `k`, within the shard's timeout and the caller's
    /// deadline: its answer if it passed validation, why not (the replica is marked down), or
    /// the caller's own error. A replica too busy for a `write` (RESOURCE_EXHAUSTED: a live index
    /// holding back appends) is not down: its answer is the caller's, to send again later.
    #[allow(clippy::too_many_arguments)]
    async fn call_replica<Q, T, F, Fut>(
        &self,
        members: &Members,
        k: usize,
        replica: &Replica,
        deadline: Option<Instant>,
        ask: &Q,
        call: &F,
        write: bool,
    ) -> Result<Result<T, String>, Status>
    where
        Q: Clone,
        T: ShardAnswer<Q>,
        F: Fn(ShardClient, Request<Q>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let shard = &members.layout.shards[k].0;
        let shard_timeout = Duration::from_millis(self.config.shard_timeout_ms);
        let left = match deadline {
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .saturating_sub(MERGE_MARGIN),
            None => shard_timeout,
        }
        .min(shard_timeout);
        if left.is_zero() {
            return Ok(Err(format!(
                "{}: no time left before the deadline",
                replica.address
            )));
        }
        let mut request = request(ask.clone(), left);
        Expected::from(shard).stamp(&mut request);
        let answer = tokio::time::timeout(left, call(replica.client.clone(), request)).await;
        let status = match answer {
            Ok(Ok(response)) => {
                let answer = response.into_inner();
                return Ok(match answer.validate(ask, shard) {
                    Ok(()) => {
                        replica.set_malformed(None);
                        replica.healthy.store(true, Ordering::Relaxed);
                        Ok(answer)
                    }
                    Err(why) => {
                        self.refuse(replica, &why.to_string());
                        Err(format!("{}: malformed answer: {why}", replica.address))
                    }
                });
            }
            Ok(Err(status)) if is_wrong_shard(&status) => {
                self.wrong_shard(replica, status.message());
                return Ok(Err(format!(
                    "{}: not shard {k}: {}",
                    replica.address,
                    status.message()
                )));
            }
            Ok(Err(status)) if !retriable(&status) => return Err(status),
            Ok(Err(status)) if write && status.code() == Code::ResourceExhausted => {
                return Err(status)
            }
            Ok(Err(status)) => status,
            Err(_) => Status::deadline_exceeded("no answer within the shard's deadline"),
        };
        replica.healthy.store(false, Ordering::Relaxed);
        Ok(Err(format!(
            "{}: {:?}: {}",
            replica.address,
            status.code(),
            status.message()
        )))
    }

    /// Marks `replica` down until the next refresh describes it again (which finds the shard it is
    /// now), and counts it.
    fn wrong_shard(&self, replica: &Replica, why: &str) {
        tracing::warn!(replica = %replica.address, why, "a shard replica is no longer the shard it was");
        self.metrics.wrong_shard_call(&replica.address);
        replica.healthy.store(false, Ordering::Relaxed);
    }

    /// Marks `replica` down for answering nonsense, and counts it.
    fn refuse(&self, replica: &Replica, why: &str) {
        tracing::warn!(replica = %replica.address, why, "a shard replica answered malformed data");
        self.metrics.malformed_answer(&replica.address);
        replica.set_malformed(Some(why.to_string()));
        replica.healthy.store(false, Ordering::Relaxed);
    }
}

/// Sane answers that still cannot be merged: shards that claim more than 2^64 occurrences in all.
pub(crate) fn unmergeable(e: merge::Overflow) -> Status {
    Status::unavailable(format!("{e}: the shard set's answers cannot be merged"))
}

/// A request to a shard with the time it has (sent as its gRPC deadline).
fn request<T>(message: T, timeout: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(timeout);
    request
}
