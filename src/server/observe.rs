//! Every call of the sidecar's gRPC service as its client sees it: the final status, whatever set
//! it (our handler, tonic's codec, a deadline, the client leaving before the end), and the time to
//! it, recorded in the metrics. tonic's codec answers a message over the size limit with
//! OUT_OF_RANGE, where gRPC's convention (the code clients treat as "too big") is
//! RESOURCE_EXHAUSTED: that code is rewritten here. The service itself never answers OUT_OF_RANGE.
//!
//! Each call also runs in an `rpc` tracing span (its method, the bytes it read and wrote, the time
//! its work waited for a worker and ran, [`record_work`]): it is logged at DEBUG when it ends, and
//! at INFO when it took [`SLOW_CALL`] or more, so a slow request can be read from the logs.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body::{Body, Frame, SizeHint};
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::codegen::{Bytes, Service};
use tonic::server::NamedService;
use tonic::Code;
use tracing::field::Empty;
use tracing::Instrument;

use super::metrics::Metrics;

/// The RPCs of `sidecar.v1`, as metric labels.
const METHODS: &[&str] = &[
    "Info",
    "Tokenize",
    "Detokenize",
    "Count",
    "NextTokenDistribution",
    "SearchDocuments",
    "Mix",
    "Draft",
    "Score",
    "Session",
    "AddDocuments",
    "Batch",
    "Generate",
    "Trace",
    "Hints",
    // sidecar.shard.v1, on shard servers.
    "Describe",
    "Continuations",
    "ScoreTokens",
    "SpanLengths",
];

fn method_of(path: &str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or_default();
    METHODS
        .iter()
        .find(|m| **m == name)
        .copied()
        .unwrap_or("unknown")
}

/// A call that takes this long is logged at INFO (the others at DEBUG).
const SLOW_CALL: Duration = Duration::from_millis(500);

/// Records in the current call's span the time its work waited for a blocking-pool thread and
/// ran (a stream's last step).
pub(super) fn record_work(queued: Duration, ran: Duration) {
    let span = tracing::Span::current();
    span.record("queued_us", queued.as_micros() as u64);
    span.record("work_us", ran.as_micros() as u64);
}

/// A gRPC service whose calls are observed.
#[derive(Clone)]
pub(super) struct Observed<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> Observed<S> {
    pub(super) fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }
}

impl<S: NamedService> NamedService for Observed<S> {
    const NAME: &'static str = S::NAME;
}

/// One call until its status is known; dropped before that, the client left.
struct Call {
    metrics: Arc<Metrics>,
    method: &'static str,
    started: Instant,
    finished: bool,
    span: tracing::Span,
    /// Bytes of the request's body read so far, and of the response's sent.
    read: Arc<AtomicU64>,
    written: u64,
}

impl Call {
    fn finish(&mut self, code: Code) {
        if !self.finished {
            self.finished = true;
            let elapsed = self.started.elapsed();
            let ms = elapsed.as_secs_f64() * 1e3;
            let (read, written) = (self.read.load(Ordering::Relaxed), self.written);
            match elapsed >= SLOW_CALL {
                true => tracing::info!(parent: &self.span, ?code, ms, read, written, "slow call"),
                false => tracing::debug!(parent: &self.span, ?code, ms, read, written, "call"),
            }
            let code = (code != Code::Ok).then_some(code);
            self.metrics.observe(self.method, elapsed, code);
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(Code::Cancelled);
    }
}

/// The status of a response's headers or trailers, rewritten to RESOURCE_EXHAUSTED if it was the
/// codec's OUT_OF_RANGE.
fn final_code(headers: &mut HeaderMap) -> Option<Code> {
    let code = Code::from(
        headers
            .get("grpc-status")?
            .to_str()
            .ok()?
            .parse::<i32>()
            .ok()?,
    );
    if code == Code::OutOfRange {
        let exhausted = Code::ResourceExhausted as i32;
        headers.insert("grpc-status", HeaderValue::from(exhausted));
        return Some(Code::ResourceExhausted);
    }
    Some(code)
}

impl<S, B, R> Service<http::Request<B>> for Observed<S>
where
    S: Service<http::Request<CountedBody<B>>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: Body<Data = Bytes> + Send + 'static,
    R::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_of(request.uri().path());
        let span = tracing::info_span!("rpc", method, queued_us = Empty, work_us = Empty);
        let read = Arc::new(AtomicU64::new(0));
        let mut call = Call {
            metrics: Arc::clone(&self.metrics),
            method,
            started: Instant::now(),
            finished: false,
            span: span.clone(),
            read: Arc::clone(&read),
            written: 0,
        };
        let request = request.map(|inner| CountedBody {
            inner: Box::pin(inner),
            read,
        });
        let answer = self.inner.call(request).instrument(span);
        Box::pin(async move {
            let mut response = match answer.await {
                Ok(response) => response,
                Err(e) => {
                    call.finish(Code::Internal);
                    return Err(e);
                }
            };
            // A trailers-only response (an error before any message) carries its status here.
            if let Some(code) = final_code(response.headers_mut()) {
                call.finish(code);
                return Ok(response.map(tonic::body::Body::new));
            }
            Ok(response.map(|inner| {
                tonic::body::Body::new(ObservedBody {
                    inner: Box::pin(inner),
                    call: Some(call),
                })
            }))
        })
    }
}

/// A response body that records its call when the trailers (the status) go out.
struct ObservedBody<R> {
    inner: Pin<Box<R>>,
    call: Option<Call>,
}

impl<R: Body<Data = Bytes>> Body for ObservedBody<R> {
    type Data = Bytes;
    type Error = R::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, R::Error>>> {
        let this = &mut *self;
        let mut polled = this.inner.as_mut().poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(call)) = (&polled, this.call.as_mut()) {
            call.written += frame.data_ref().map_or(0, |d| d.len() as u64);
        }
        let code = match &mut polled {
            Poll::Ready(Some(Ok(frame))) => frame.trailers_mut().and_then(final_code),
            // The stream broke off before its status.
            Poll::Ready(Some(Err(_))) => Some(Code::Unknown),
            // gRPC always ends with trailers: a body without them was cut off.
            Poll::Ready(None) => Some(Code::Unknown),
            Poll::Pending => None,
        };
        if let (Some(code), Some(mut call)) = (code, code.and_then(|_| this.call.take())) {
            call.finish(code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that counts the bytes read from it.
pub(super) struct CountedBody<B> {
    inner: Pin<Box<B>>,
    read: Arc<AtomicU64>,
}

impl<B: Body<Data = Bytes>> Body for CountedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = self.inner.as_mut().poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            let n = frame.data_ref().map_or(0, |d| d.len() as u64);
            self.read.fetch_add(n, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codecs_out_of_range_becomes_resource_exhausted() {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from(Code::OutOfRange as i32));
        assert_eq!(final_code(&mut headers), Some(Code::ResourceExhausted));
        assert_eq!(headers["grpc-status"], "8");
        headers.insert(
            "grpc-status",
            HeaderValue::from(Code::InvalidArgument as i32),
        );
        assert_eq!(final_code(&mut headers), Some(Code::InvalidArgument));
        assert_eq!(final_code(&mut HeaderMap::new()), None);
    }

    #[test]
    fn methods_are_named_by_the_last_path_segment() {
        assert_eq!(method_of("/sidecar.v1.Sidecar/Count"), "Count");
        assert_eq!(method_of("/sidecar.v1.Sidecar/Session"), "Session");
        assert_eq!(method_of("/sidecar.v1.Sidecar/Nope"), "unknown");
    }
}
