//! Accepting connections without letting them pin the server: at most `max_connections` open at
//! once (further clients wait in the kernel's listen backlog), a deadline for a new connection's
//! first bytes (a client that never sends the HTTP/2 preface is closed), and accept errors (such as
//! running out of file descriptors) logged and retried with a growing pause instead of a busy loop.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Pauses between failed accepts: from 5 ms, doubling up to 1 s, back to the start after a success.
pub(super) struct AcceptBackoff {
    pause: Duration,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(5);
    const LONGEST: Duration = Duration::from_secs(1);

    pub(super) fn new() -> Self {
        Self { pause: Self::FIRST }
    }

    pub(super) fn succeeded(&mut self) {
        self.pause = Self::FIRST;
    }

    /// Logs the error (once per streak, then at the longest pause) and waits before the next try.
    pub(super) async fn failed(&mut self, what: &str, error: &io::Error) {
        if self.pause == Self::FIRST || self.pause == Self::LONGEST {
            tracing::warn!("{what}: accepting a connection failed ({error}); retrying");
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Self::LONGEST);
    }
}

/// How connections are accepted.
#[derive(Debug, Clone, Copy)]
pub(super) struct AcceptLimits {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
}

/// The connections of `listener`, as tonic's server takes them. The accept loop stops when the
/// server stops taking connections (the stream is dropped), which closes the listening socket.
pub(super) fn incoming(
    listener: TcpListener,
    limits: AcceptLimits,
    open: Gauge,
) -> ReceiverStream<io::Result<Connection>> {
    let (tx, rx) = mpsc::channel(1);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::spawn(async move {
        let mut backoff = AcceptBackoff::new();
        loop {
            let slot = match Arc::clone(&slots).try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    tracing::warn!(
                        "{} connections are open (limits.max_connections): new clients wait",
                        limits.max_connections
                    );
                    tokio::select! {
                        slot = Arc::clone(&slots).acquire_owned() => match slot {
                            Ok(slot) => slot,
                            Err(_) => return,
                        },
                        _ = tx.closed() => return,
                    }
                }
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = tx.closed() => return,
            };
            match accepted {
                Ok((stream, _)) => {
                    backoff.succeeded();
                    // No Nagle: a session's small step messages would otherwise wait for delayed
                    // ACKs (≈ 40 ms).
                    let _ = stream.set_nodelay(true);
                    let connection = Connection::new(stream, slot, limits.handshake_timeout, &open);
                    if tx.send(Ok(connection)).await.is_err() {
                        return;
                    }
                }
                Err(e) => backoff.failed("gRPC", &e).await,
            }
        }
    });
    ReceiverStream::new(rx)
}

/// An accepted connection: holds its slot among `max_connections`, and fails its reads if no byte
/// arrives before the handshake deadline.
pub(super) struct Connection {
    stream: TcpStream,
    first_bytes_due: Option<Pin<Box<Sleep>>>,
    _slot: OwnedSemaphorePermit,
    open: Gauge,
}

impl Connection {
    fn new(
        stream: TcpStream,
        slot: OwnedSemaphorePermit,
        handshake: Duration,
        open: &Gauge,
    ) -> Self {
        open.inc();
        Self {
            stream,
            first_bytes_due: Some(Box::pin(tokio::time::sleep(handshake))),
            _slot: slot,
            open: open.clone(),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.first_bytes_due = None;
        }
        if polled.is_pending() {
            if let Some(due) = self.first_bytes_due.as_mut() {
                if due.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no bytes before the handshake deadline",
                    )));
                }
            }
        }
        polled
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}
