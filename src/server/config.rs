//! `infini-sidecar serve --config FILE.toml`: what to serve, where, and the limits on every request.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// Loopback by default: anything else should set `auth_token_env`.
    #[serde(default = "default_bind")]
    pub bind: SocketAddr,
    /// The reference index (built by `index build`).
    pub index: PathBuf,
    /// The mixing file of `eval fit` (λ1/λ2 for `Mix` with `split`).
    pub mixing: Option<PathBuf>,
    /// The sidecar's own model (a `.gguf` file or HF folder), for `Score`, `own_model` mixing and
    /// sessions with `use_model`. Its tokenizer must be the index's.
    pub model: Option<PathBuf>,
    /// CPU threads of the model's kernels (default: all cores).
    pub model_threads: Option<usize>,
    /// Where Prometheus scrapes `GET /metrics`; no endpoint when unset.
    pub metrics_bind: Option<SocketAddr>,
    /// Name of an environment variable holding a bearer token every RPC must present.
    pub auth_token_env: Option<String>,
    #[serde(default)]
    pub limits: Limits,
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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_context_tokens: 32_768,
            max_top_k: 1_000,
            max_in_flight: 64,
            max_message_bytes: 4 << 20,
            max_sessions: 256,
        }
    }
}

fn default_bind() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 50051))
}

impl ServeConfig {
    /// Reads a config; relative paths are taken from the config file's folder.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let mut config: Self =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.index = resolve(base, &config.index);
        config.mixing = config.mixing.map(|m| resolve(base, &m));
        config.model = config.model.map(|m| resolve(base, &m));
        Ok(config)
    }
}

/// `~/x` under the home folder, a relative path under the config's folder.
fn resolve(base: &Path, path: &Path) -> PathBuf {
    match (path.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => base.join(path),
    }
}
