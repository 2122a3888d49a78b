//! Prometheus metrics of the service (requests and errors by method and status code, latency
//! histograms, requests doing work, open sessions) and the small HTTP endpoint that serves them.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::listen::AcceptBackoff;
use crate::live::{LiveStats, LiveStore};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodCode {
    method: &'static str,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Method {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Replica {
    replica: String,
}

/// 10 µs to ≈ 84 s in factors of 2: `Mix` is tens of µs, `Score` of a long document seconds.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 2.0, 24))
}

pub struct Metrics {
    registry: Registry,
    requests: Family<MethodCode, Counter>,
    latency: Family<Method, Histogram, fn() -> Histogram>,
    /// Requests holding an in-flight permit: the depth of the bounded work queue.
    pub in_flight: Gauge,
    pub sessions: Gauge,
    /// Tokens held in the own model's KV caches (bounded by limits.max_kv_tokens).
    pub kv_tokens: Gauge,
    /// Open gRPC connections (bounded by limits.max_connections).
    pub connections: Gauge,
    /// The live index whose figures each scrape reads, once the service has one.
    live: OnceLock<Arc<dyn LiveStore>>,
    live_gauges: LiveGauges,
    /// A router's shard answers refused as malformed, by replica address.
    malformed_answers: Family<Replica, Counter>,
    /// A router's calls refused by a replica that is no longer the shard it was, by address.
    wrong_shard_calls: Family<Replica, Counter>,
    /// Shard servers a router left out of its set (another set or build, other files).
    pub stray_replicas: Gauge,
}

/// The live index's figures ([`LiveStats`]), set at each scrape.
#[derive(Default)]
struct LiveGauges {
    namespaces: Gauge,
    runs: Gauge,
    tokens: Gauge,
    tail_tokens: Gauge,
    evicted_runs: Gauge,
    failed_writes: Gauge,
    runs_set_aside: Gauge,
    namespaces_reclaimed: Gauge,
    write_failing: Gauge,
}

impl LiveGauges {
    fn register(&self, registry: &mut Registry) {
        let gauges: [(&str, &str, &Gauge); 9] = [
            ("live_namespaces", "Namespaces of the live index", &self.namespaces),
            ("live_runs", "Runs of the live index", &self.runs),
            ("live_tokens", "Tokens held by the live index, tails included", &self.tokens),
            ("live_tail_tokens", "Tokens of the live index in memory, waiting to be built into runs", &self.tail_tokens),
            ("live_evicted_runs", "Runs evicted since start to keep the live index within its budget", &self.evicted_runs),
            ("live_failed_writes", "Builds and list writes of the live index that failed since start (each is tried again; nothing is dropped)", &self.failed_writes),
            ("live_runs_set_aside", "Live runs that failed their checks at open and were set aside", &self.runs_set_aside),
            ("live_namespaces_reclaimed", "Empty live namespaces reclaimed since start", &self.namespaces_reclaimed),
            ("live_write_failing", "1 while the live index cannot write to its disk (appends are refused), else 0", &self.write_failing),
        ];
        for (name, help, gauge) in gauges {
            registry.register(name, help, gauge.clone());
        }
    }

    fn set(&self, s: &LiveStats) {
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.namespaces.set(as_i64(s.namespaces as u64));
        self.runs.set(as_i64(s.runs as u64));
        self.tokens.set(as_i64(s.tokens));
        self.tail_tokens.set(as_i64(s.tail_tokens));
        self.evicted_runs.set(as_i64(s.evicted_runs));
        self.failed_writes.set(as_i64(s.failed_writes));
        self.runs_set_aside.set(as_i64(s.runs_set_aside));
        self.namespaces_reclaimed
            .set(as_i64(s.namespaces_reclaimed));
        self.write_failing.set(i64::from(s.write_failure.is_some()));
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sidecar");
        let requests = Family::<MethodCode, Counter>::default();
        let latency =
            Family::<Method, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        let in_flight = Gauge::default();
        let sessions = Gauge::default();
        let kv_tokens = Gauge::default();
        let connections = Gauge::default();
        let malformed_answers = Family::<Replica, Counter>::default();
        let wrong_shard_calls = Family::<Replica, Counter>::default();
        let stray_replicas = Gauge::default();
        registry.register(
            "requests",
            "Finished requests (and session steps) by method and final gRPC status code, whatever ended them: the handler, the codec, a deadline or the client leaving",
            requests.clone(),
        );
        registry.register(
            "request_seconds",
            "Time to answer, by method",
            latency.clone(),
        );
        registry.register(
            "in_flight",
            "Requests doing CPU work now (bounded by limits.max_in_flight)",
            in_flight.clone(),
        );
        registry.register("sessions", "Open decoding sessions", sessions.clone());
        registry.register(
            "kv_tokens",
            "Tokens held in the own model's KV caches (bounded by limits.max_kv_tokens)",
            kv_tokens.clone(),
        );
        registry.register(
            "connections",
            "Open gRPC connections (bounded by limits.max_connections)",
            connections.clone(),
        );
        let live_gauges = LiveGauges::default();
        live_gauges.register(&mut registry);
        registry.register(
            "shard_malformed_answers",
            "Shard answers a router refused as malformed (it failed over as from a replica that is down), by replica address",
            malformed_answers.clone(),
        );
        registry.register(
            "shard_wrong_identity_calls",
            "Shard calls a replica refused because it is not the shard the router took it for (a reused address before the next refresh); the router failed over, by replica address",
            wrong_shard_calls.clone(),
        );
        registry.register(
            "shard_stray_replicas",
            "Shard servers a router's last refresh left out of its set: another set, tokenizer or build, or other files than their shard's other replicas",
            stray_replicas.clone(),
        );
        Self {
            registry,
            requests,
            latency,
            in_flight,
            sessions,
            kv_tokens,
            connections,
            live: OnceLock::new(),
            live_gauges,
            malformed_answers,
            wrong_shard_calls,
            stray_replicas,
        }
    }
}

impl Metrics {
    /// Records one finished request; `code` is `None` for success.
    pub fn observe(&self, method: &'static str, elapsed: Duration, code: Option<tonic::Code>) {
        let code = format!("{:?}", code.unwrap_or(tonic::Code::Ok));
        self.requests
            .get_or_create(&MethodCode { method, code })
            .inc();
        self.latency
            .get_or_create(&Method { method })
            .observe(elapsed.as_secs_f64());
    }

    /// Reports `live`'s figures from now on.
    pub fn watch_live(&self, live: Arc<dyn LiveStore>) {
        let _ = self.live.set(live);
    }

    /// Counts a shard answer from `replica` that a router refused.
    pub fn malformed_answer(&self, replica: &str) {
        self.malformed_answers
            .get_or_create(&Replica {
                replica: replica.to_string(),
            })
            .inc();
    }

    /// Counts a call `replica` refused as not its shard's.
    pub fn wrong_shard_call(&self, replica: &str) {
        self.wrong_shard_calls
            .get_or_create(&Replica {
                replica: replica.to_string(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        if let Some(stats) = self.live.get().and_then(|l| l.stats()) {
            self.live_gauges.set(&stats);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Largest HTTP request head read from a scraper; anything longer is cut off.
const MAX_REQUEST_HEAD: usize = 8 << 10;
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>) {
    let mut backoff = AcceptBackoff::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                backoff.succeeded();
                stream
            }
            Err(e) => {
                backoff.failed("metrics", &e).await;
                continue;
            }
        };
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            if let Err(e) = tokio::time::timeout(SCRAPE_TIMEOUT, answer(stream, &metrics)).await {
                tracing::debug!("metrics scrape timed out: {e}");
            }
        });
    }
}

async fn answer(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_HEAD {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let request_line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let (status, content_type, body) = if request_line.starts_with(b"GET /metrics ") {
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        )
    } else {
        ("404 Not Found", "text/plain", "try GET /metrics\n".into())
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
