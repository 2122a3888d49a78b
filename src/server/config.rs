//! `infini-sidecar serve --config FILE.toml`: what to serve, where, and the limits on every request.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::cpu::FlavourRequest;
use crate::live::LiveConfig;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// Loopback by default: anything else should set `auth_token_env`.
    #[serde(default = "default_bind")]
    pub bind: SocketAddr,
    /// The reference index (built by `index build`); none for a router.
    #[serde(default)]
    pub index: PathBuf,
    /// Keep every 32nd suffix's first bytes of the reference index in RAM (`index::read::rank_samples`):
    /// faster lookups for 0.5 bytes a token, paid for at start-up by reading every 32nd suffix. Off
    /// by default: an index whose pages are cold on disk would take long to start. The live
    /// index's runs are always sampled.
    #[serde(default)]
    pub sample_ranks: bool,
    /// The mixing file of `eval fit` (λ1/λ2 for `Mix` with `split`).
    pub mixing: Option<PathBuf>,
    /// The sidecar's own model (a `.gguf` file or HF folder), for `Score`, `own_model` mixing and
    /// sessions with `use_model`. Its tokenizer must be the index's.
    pub model: Option<PathBuf>,
    /// CPU threads of the model's kernels (default: all cores).
    pub model_threads: Option<usize>,
    /// The flavour of the model's quantized kernels: `native` (default: the best this CPU runs),
    /// `avx512vnni`, `avxvnni`, `avx2`, `neondot`, `neon` or `portable`. `INFINI_SIDECAR_CPU`
    /// overrides it.
    pub cpu: Option<String>,
    /// Where Prometheus scrapes `GET /metrics`; no endpoint when unset.
    pub metrics_bind: Option<SocketAddr>,
    /// Name of an environment variable holding a bearer token every RPC must present.
    pub auth_token_env: Option<String>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub live: LiveSection,
    #[serde(default)]
    pub cluster: ClusterSection,
}

/// What this process is in a deployment of several.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A sidecar over its own index (the default).
    #[default]
    Single,
    /// A sidecar over one shard of a set that also serves `sidecar.shard.v1` to routers.
    Shard,
    /// No index: serves `sidecar.v1` by fanning out to shard servers and merging their answers.
    Router,
}

/// `[cluster]`: the role, and for a router where its shard servers are.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    pub role: Role,
    /// Router: shard servers' `host:port`s. Replicas of a shard are found by describing each.
    pub shards: Vec<String>,
    /// Router: a `host:port` whose name resolves to every shard server (a Kubernetes headless
    /// Service), resolved again at every refresh.
    pub shard_service: Option<String>,
    /// Router: most milliseconds a call to one shard may take (less when the caller's deadline is
    /// nearer); then the shard's next replica is tried.
    pub shard_timeout_ms: u64,
    /// Router: seconds between two checks of every shard server (readiness, replicas come and go).
    pub refresh_secs: u64,
    /// Router: the replicas every shard has in this deployment. A live append is acknowledged only
    /// once every replica of its owner shard has taken it, and refused while the router knows
    /// fewer than this many of them (a replica gone from DNS while it restarts must not be left
    /// out). 0: every replica the router knows of.
    pub replicas_per_shard: usize,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            role: Role::Single,
            shards: Vec::new(),
            shard_service: None,
            shard_timeout_ms: 2_000,
            refresh_secs: 5,
            replicas_per_shard: 0,
        }
    }
}

impl ClusterSection {
    fn check(&self) -> Result<(), ConfigError> {
        let router = self.role == Role::Router;
        let has_shards = !self.shards.is_empty() || self.shard_service.is_some();
        if router && !has_shards {
            return Err(ConfigError::Invalid(
                "a router needs cluster.shards or cluster.shard_service".into(),
            ));
        }
        if !router && has_shards {
            return Err(ConfigError::Invalid(
                "cluster.shards and cluster.shard_service are for role = \"router\"".into(),
            ));
        }
        if self.shard_timeout_ms == 0 || self.refresh_secs == 0 {
            return Err(ConfigError::Invalid(
                "cluster.shard_timeout_ms and cluster.refresh_secs must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// `[live]`: the live index that sessions with a namespace draft from and learn into.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LiveSection {
    pub enabled: bool,
    /// Where the live runs are kept across restarts; unset: a temporary folder, gone at exit.
    pub data_dir: Option<PathBuf>,
    /// Tokens held over all namespaces, tails counted five times and each run at least 4,096
    /// (about 8 bytes of memory a token); past it the oldest runs of the namespace that holds the
    /// most are evicted.
    pub budget_tokens: u64,
    /// Tokens of a namespace's in-memory tail before it is built into a suffix-array run.
    pub freeze_tokens: u64,
    pub max_namespaces: usize,
}

impl Default for LiveSection {
    fn default() -> Self {
        let d = LiveConfig::default();
        Self {
            enabled: true,
            data_dir: d.data_dir,
            budget_tokens: d.budget_tokens,
            freeze_tokens: d.freeze_tokens,
            max_namespaces: d.max_namespaces,
        }
    }
}

impl LiveSection {
    /// The live index's settings; `None` when it is off.
    pub fn config(&self) -> Option<LiveConfig> {
        self.enabled.then(|| LiveConfig {
            data_dir: self.data_dir.clone(),
            budget_tokens: self.budget_tokens,
            freeze_tokens: self.freeze_tokens,
            max_namespaces: self.max_namespaces,
            ..LiveConfig::default()
        })
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Longest context or n-gram a request may carry, in tokens.
    pub max_context_tokens: usize,
    pub max_top_k: usize,
    /// Requests doing CPU work at once; more are refused with RESOURCE_EXHAUSTED.
    pub max_in_flight: usize,
    pub max_message_bytes: usize,
    /// Decoding sessions open at once.
    pub max_sessions: usize,
    /// Tokens held in the own model's KV caches at once, over every session and request (≈ 46 kB
    /// each for SmolLM2-135M); a step that would go past it gets RESOURCE_EXHAUSTED.
    pub max_kv_tokens: usize,
    /// Clauses of a `SearchDocuments` CNF.
    pub max_cnf_clauses: usize,
    /// Largest `max_clause_freq` a `SearchDocuments` request may ask for.
    pub max_clause_freq: u64,
    /// Places a `SearchDocuments` request may visit (its clauses' matches, each capped by
    /// `max_clause_freq`): the work of a search, computed from counts before any is done.
    pub max_search_places: u64,
    /// Largest `max_support` a distribution may ask for: the samples a subsampled answer reads
    /// (and a shard sends per suffix array).
    pub max_support: u64,
    /// TCP connections open at once; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// Seconds a new connection has to send its first bytes (the HTTP/2 preface) before it is closed.
    pub handshake_timeout_secs: u64,
    /// Seconds between HTTP/2 keepalive pings; a peer that does not answer one within this time is
    /// dropped.
    pub keepalive_secs: u64,
    /// Seconds open streams (sessions, `Score`) may run on after a shutdown signal before they are
    /// closed with UNAVAILABLE.
    pub drain_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_context_tokens: 32_768,
            max_top_k: 1_000,
            max_in_flight: 64,
            max_message_bytes: 4 << 20,
            max_sessions: 256,
            max_kv_tokens: 65_536,
            max_cnf_clauses: 64,
            max_clause_freq: 1_000_000,
            max_search_places: 4_000_000,
            max_support: 1 << 16,
            max_connections: 1_024,
            handshake_timeout_secs: 10,
            keepalive_secs: 30,
            drain_secs: 30,
        }
    }
}

/// Smallest `max_message_bytes` that holds an ordinary request (a 49152-float logits vector needs
/// ≈ 200 kB; this only refuses settings under which nothing would work).
const MIN_MESSAGE_BYTES: usize = 4 << 10;

impl Limits {
    /// Refuses settings that would give a server that refuses everything.
    fn check(&self) -> Result<(), ConfigError> {
        let at_least_one = [
            ("max_context_tokens", self.max_context_tokens as u64),
            ("max_top_k", self.max_top_k as u64),
            ("max_in_flight", self.max_in_flight as u64),
            ("max_sessions", self.max_sessions as u64),
            ("max_cnf_clauses", self.max_cnf_clauses as u64),
            ("max_clause_freq", self.max_clause_freq),
            ("max_search_places", self.max_search_places),
            ("max_support", self.max_support),
            ("max_connections", self.max_connections as u64),
            ("handshake_timeout_secs", self.handshake_timeout_secs),
            ("keepalive_secs", self.keepalive_secs),
        ];
        if let Some((name, _)) = at_least_one.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigError::Invalid(format!(
                "limits.{name} is 0: nothing could be served"
            )));
        }
        if self.max_message_bytes < MIN_MESSAGE_BYTES {
            return Err(ConfigError::Invalid(format!(
                "limits.max_message_bytes is {}, below the {MIN_MESSAGE_BYTES} bytes any request needs",
                self.max_message_bytes
            )));
        }
        // tokio's semaphores hold at most this many permits.
        let most = tokio::sync::Semaphore::MAX_PERMITS;
        if self.max_in_flight > most || self.max_connections > most {
            return Err(ConfigError::Invalid(format!(
                "limits.max_in_flight and limits.max_connections must be at most {most}"
            )));
        }
        Ok(())
    }
}

/// A config that cannot be read or would not serve.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {message}")]
    Read { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

fn default_bind() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 50051))
}

impl ServeConfig {
    /// Reads a config; relative paths are taken from the config file's folder. Limits under which
    /// nothing could be served are refused here, not discovered by the first client.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let read_error = |message: String| ConfigError::Read {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| read_error(e.to_string()))?;
        let mut config: Self = toml::from_str(&text).map_err(|e| read_error(e.to_string()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        if !config.index.as_os_str().is_empty() {
            config.index = resolve(base, &config.index);
        }
        config.mixing = config.mixing.map(|m| resolve(base, &m));
        config.model = config.model.map(|m| resolve(base, &m));
        config.live.data_dir = config.live.data_dir.map(|d| resolve(base, &d));
        config.check()?;
        Ok(config)
    }

    /// The checks of [`ServeConfig::load`], for a config built in code.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.limits.check()?;
        self.cluster.check()?;
        let router = self.cluster.role == Role::Router;
        if router != self.index.as_os_str().is_empty() {
            return Err(ConfigError::Invalid(match router {
                true => "a router holds no index: leave `index` out".into(),
                false => "`index` is missing: the folder of an `index build`".into(),
            }));
        }
        if router && self.live.enabled {
            return Err(ConfigError::Invalid(
                "a router keeps no live index: namespaces live on the shard servers (their [live]); \
                 set `enabled = false` under [live]"
                    .into(),
            ));
        }
        if let Some(cpu) = &self.cpu {
            cpu.parse::<FlavourRequest>()
                .map_err(|e| ConfigError::Invalid(format!("cpu: {e}")))?;
        }
        match self.live.config() {
            Some(live) => live
                .check()
                .map_err(|e| ConfigError::Invalid(e.to_string())),
            None => Ok(()),
        }
    }
}

/// `~/x` under the home folder, a relative path under the config's folder.
fn resolve(base: &Path, path: &Path) -> PathBuf {
    match (path.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => base.join(path),
    }
}
