//! Binding the service: health and reflection beside it, the bearer token on the sidecar's RPCs,
//! message size limits, bounded connections, and a shutdown that lets in-flight requests finish,
//! then closes what is still open once the drain deadline passes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::Router;
use tonic::transport::Server;
use tonic::{Request, Status};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use super::config::{ConfigError, Limits, Role, ServeConfig};
use super::listen::{incoming, AcceptLimits, Connection};
use super::metrics::{serve_metrics, Metrics};
use super::observe::Observed;
use super::pb::sidecar_server::SidecarServer;
use super::router::{RouterService, FORMING_REFRESH};
use super::shard_pb::shard_server::ShardServer;
use super::{pb, ServeError, SidecarService};

/// Compares two byte strings in time that depends on their lengths only, not on where they differ.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && std::hint::black_box(
            given
                .iter()
                .zip(expected)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b)),
        ) == 0
}

/// Checks `authorization: Bearer TOKEN` when a token is configured.
fn bearer_check(
    token: Option<String>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |request: Request<()>| {
        let Some(expected) = &token else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(t) if same_secret(t.as_bytes(), expected.as_bytes()) => Ok(request),
            _ => Err(Status::unauthenticated("a valid bearer token is required")),
        }
    }
}

/// The bearer token of `auth_token_env`: set and not blank, or the server does not start (an empty
/// token would let `Bearer ` with nothing after it in).
fn bearer_token(config: &ServeConfig) -> Result<Option<String>, ServeError> {
    let Some(var) = &config.auth_token_env else {
        return Ok(None);
    };
    match std::env::var(var) {
        Ok(token) if !token.trim().is_empty() => Ok(Some(token)),
        Ok(_) => Err(ServeError::Config(ConfigError::Invalid(format!(
            "auth_token_env names {var}, which is empty: set a token or drop auth_token_env"
        )))),
        Err(_) => Err(ServeError::Config(ConfigError::Invalid(format!(
            "auth_token_env names {var}, which is not set"
        )))),
    }
}

/// Stops a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Caps glibc's malloc arenas. By default every thread of the blocking pool that runs the model may
/// get an arena of its own (up to 8 per core), and the model's large, short-lived buffers then
/// fragment them all: the load test saw the resident set climb by 400 MB in 30 s, flat with 2 arenas.
/// (mimalloc, tried in its place, let the live soak grow 104–154 MB against 62–79 with this:
/// eval/SERVICE.md.)
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Once open streams have been told to close, how long the server waits for the last connections.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Serves `config` until `shutdown` resolves, then drains: new connections are refused, in-flight
/// requests finish, and after `limits.drain_secs` the streams still open (sessions, `Score`) and
/// the work still running are ended with UNAVAILABLE. A router serves the same API over its shard
/// servers; a shard server also serves `sidecar.shard.v1` to routers.
pub async fn serve(
    config: ServeConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    config.check()?;
    let token = bearer_token(&config)?;
    let local = listener.local_addr().map_err(ServeError::io("listener"))?;
    if token.is_none() && !local.ip().is_loopback() {
        tracing::warn!("serving beyond loopback without a bearer token");
    }
    limit_malloc_arenas();
    let metrics = Arc::new(Metrics::default());
    // Dropped (and the endpoint closed) when serving ends.
    let _metrics_endpoint = match config.metrics_bind {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(ServeError::io(&format!("metrics_bind {addr}")))?;
            tracing::info!(
                "metrics on http://{}/metrics",
                listener.local_addr().map_err(ServeError::io("metrics"))?
            );
            Some(AbortOnDrop(tokio::spawn(serve_metrics(
                listener,
                Arc::clone(&metrics),
            ))))
        }
        None => None,
    };
    let limits = config.limits;
    let (health, health_service) = tonic_health::server::health_reporter();
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServeError::Setup(format!("reflection: {e}")))?;
    let keepalive = Duration::from_secs(limits.keepalive_secs);
    let routes = Server::builder()
        .http2_keepalive_interval(Some(keepalive))
        .http2_keepalive_timeout(Some(keepalive))
        .add_service(health_service)
        .add_service(reflection);
    let auth = bearer_check(token.clone());
    let connections = incoming(
        listener,
        AcceptLimits {
            max_connections: limits.max_connections,
            handshake_timeout: Duration::from_secs(limits.handshake_timeout_secs),
        },
        metrics.connections.clone(),
    );
    tracing::info!(role = ?config.cluster.role, "role");
    if config.cluster.role == Role::Router {
        let router = RouterService::new(&config, token, Arc::clone(&metrics))?;
        let closing = router.clone();
        let sidecar = SidecarServer::new(router.clone())
            .max_decoding_message_size(limits.max_message_bytes)
            .max_encoding_message_size(limits.max_message_bytes);
        // Ready (the sidecar service SERVING) only while every shard has a replica that answers;
        // the server itself ("") is SERVING while it runs, for liveness.
        let readiness = AbortOnDrop(tokio::spawn(track_readiness(
            router,
            health.clone(),
            Duration::from_secs(config.cluster.refresh_secs),
        )));
        // Readiness stops following the shards once the drain begins (and has stopped before the
        // drain reports NOT_SERVING, so it cannot report SERVING after it).
        let shutdown = async move {
            shutdown.await;
            let mut readiness = readiness;
            readiness.0.abort();
            let _ = (&mut readiness.0).await;
        };
        let routes = routes.add_service(observed(InterceptedService::new(sidecar, auth), &metrics));
        tracing::info!("serving on {local}");
        let close = move || closing.close_streams();
        return drain(routes, connections, limits, shutdown, health, close).await;
    }
    let service = SidecarService::open_with_metrics(&config, Arc::clone(&metrics))?;
    // Said once the index is open: clients and tests wait for this line.
    tracing::info!("serving on {local}");
    let sidecar = SidecarServer::new(service.clone())
        .max_decoding_message_size(limits.max_message_bytes)
        .max_encoding_message_size(limits.max_message_bytes);
    health.set_serving::<SidecarServer<SidecarService>>().await;
    let shard = (config.cluster.role == Role::Shard).then(|| {
        let shard = ShardServer::new(service.clone())
            .max_decoding_message_size(limits.max_message_bytes)
            .max_encoding_message_size(usize::MAX);
        observed(InterceptedService::new(shard, auth.clone()), &metrics)
    });
    let routes = routes
        .add_optional_service(shard)
        .add_service(observed(InterceptedService::new(sidecar, auth), &metrics));
    let closing = service.clone();
    let close = move || closing.close_streams();
    let served = drain(routes, connections, limits, shutdown, health, close).await;
    // The live index stops here, not when the last holder of the state lets go (the process may
    // exit first): its compactor finishes the build under way and the tails become runs.
    let _ = tokio::task::spawn_blocking(move || service.close_live()).await;
    served
}

/// `service` with its calls recorded in the metrics.
fn observed<S>(service: S, metrics: &Arc<Metrics>) -> Observed<S> {
    Observed::new(service, Arc::clone(metrics))
}

/// Describes the shard servers every `every` (twice a second while the set is incomplete) and
/// keeps the router's readiness to what it found.
async fn track_readiness(router: RouterService, health: HealthReporter, every: Duration) {
    loop {
        let ready = router.refresh().await;
        match ready {
            true => health.set_serving::<SidecarServer<RouterService>>().await,
            false => {
                health
                    .set_not_serving::<SidecarServer<RouterService>>()
                    .await
            }
        }
        let wait = match ready {
            true => every,
            false => every.min(FORMING_REFRESH),
        };
        tokio::time::sleep(wait).await;
    }
}

/// Serves `routes` until `shutdown`, then drains: readiness goes NOT_SERVING (what a client already
/// connected reads; a probe that connects anew is refused, which reads the same to Kubernetes),
/// new connections are refused and in-flight requests finish; once `limits.drain_secs` have
/// passed, `close_streams` ends what is still open.
async fn drain(
    routes: Router,
    connections: ReceiverStream<std::io::Result<Connection>>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    health: HealthReporter,
    close_streams: impl FnOnce(),
) -> Result<(), ServeError> {
    let (draining_tx, mut draining) = tokio::sync::watch::channel(false);
    let server = routes.serve_with_incoming_shutdown(connections, async move {
        shutdown.await;
        health
            .set_service_status(pb::sidecar_server::SERVICE_NAME, ServingStatus::NotServing)
            .await;
        tracing::info!(
            "shutting down: finishing in-flight requests, closing open streams in {} s",
            limits.drain_secs
        );
        let _ = draining_tx.send(true);
    });
    tokio::pin!(server);
    let drain_deadline = async {
        if draining.wait_for(|d| *d).await.is_ok() {
            tokio::time::sleep(Duration::from_secs(limits.drain_secs)).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let served = tokio::select! {
        served = &mut server => Some(served.map_err(ServeError::Transport)),
        _ = drain_deadline => None,
    };
    match served {
        Some(served) => served,
        None => {
            tracing::info!("drain deadline passed: closing open streams with UNAVAILABLE");
            close_streams();
            tokio::select! {
                served = &mut server => served.map_err(ServeError::Transport),
                _ = tokio::time::sleep(CLOSE_GRACE) => {
                    tracing::warn!("connections still open after the drain deadline: leaving them");
                    Ok(())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_match_only_when_equal() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cres", b"s3cret"));
        assert!(!same_secret(b"", b"s3cret"));
        assert!(!same_secret(b"s3cret!", b"s3cret"));
    }
}
