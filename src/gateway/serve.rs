//! Serving HTTP with limits, for the people's TCP listener and each session's socket.
//!
//! `axum::serve` keeps every connection for as long as the peer likes: a stranger (or
//! a hijacked agent on its own socket) could hold thousands of idle or slow-header
//! connections and exhaust the process's file descriptors. Here every connection
//! counts against a cap (connections over it are closed at once), must deliver a
//! request's headers within `header_timeout` of the connection going idle (so an idle
//! keep-alive connection is closed after that long too), and must deliver a request
//! body within `body_timeout`. A handler that waits (a long poll) is not cut off: the
//! timeouts bound only what the peer sends.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::body::Bytes;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;

/// How long a stopping server lets open connections finish.
const DRAIN: Duration = Duration::from_secs(5);
/// Pause after a failed accept (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The limits one listener enforces.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Open connections at most; further ones are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Time allowed to send a request's headers, counted from the connection's opening
    /// or the end of its previous response: this is also the keep-alive idle timeout.
    pub header_timeout: Duration,
    /// Time allowed to send a request's whole body, counted from its headers.
    pub body_timeout: Duration,
}

/// A listener whose connections can be served: TCP and unix sockets.
pub trait Accept: Send + 'static {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// Waits for the next connection.
    /// Waits for the next connection, with the peer's address where it has one.
    fn accept_io(
        &self,
    ) -> impl Future<Output = std::io::Result<(Self::Io, Option<SocketAddr>)>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept_io(&self) -> std::io::Result<(Self::Io, Option<SocketAddr>)> {
        let (io, peer) = self.accept().await?;
        // Responses are small; do not wait to coalesce them.
        let _ = io.set_nodelay(true);
        Ok((io, Some(peer)))
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept_io(&self) -> std::io::Result<(Self::Io, Option<SocketAddr>)> {
        Ok((self.accept().await?.0, None))
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves, then lets
/// open connections finish for a few seconds.
pub async fn serve<L: Accept>(
    listener: L,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let router = router.layer(middleware::from_fn_with_state(
        limits.body_timeout,
        time_body,
    ));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept_io() => accepted,
        };
        let (io, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!("connection cap reached; closing a new connection");
            drop(io);
            continue;
        };
        // The peer's address feeds the sign-in and credential throttles
        // (`ConnectInfo`, as axum's own server provides it).
        let with_peer = tower::util::MapRequest::new(
            router.clone(),
            move |mut req: hyper::Request<hyper::body::Incoming>| {
                if let Some(addr) = peer {
                    req.extensions_mut()
                        .insert(axum::extract::ConnectInfo(addr));
                }
                req
            },
        );
        let service = hyper_util::service::TowerToHyperService::new(with_peer);
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .serve_connection(TokioIo::new(io), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
}

/// Wraps the request body so that reading it fails once `limit` has passed.
async fn time_body(
    axum::extract::State(limit): axum::extract::State<Duration>,
    request: Request,
    next: Next,
) -> Result<Response, Infallible> {
    let (parts, body) = request.into_parts();
    let timed = TimedBody {
        inner: body,
        deadline: Box::pin(tokio::time::sleep(limit)),
    };
    Ok(next.run(Request::from_parts(parts, Body::new(timed))).await)
}

/// A body that errors when not fully received before its deadline.
struct TimedBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

/// The error a body too slow to arrive ends with.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not received within the time allowed")]
pub struct BodyTimeout;

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimeout.into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Raises this process's open-file soft limit to its hard limit, so a flood meets the
/// connection caps before it meets the file limit. Returns the new soft limit.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        setrlimit(Resource::Nofile, limit).map_err(std::io::Error::from)?;
    }
    Ok(limit.current.unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use rustix::process::{Resource, getrlimit, setrlimit};

    #[test]
    fn the_open_file_soft_limit_is_raised_to_the_hard_limit() {
        let mut limit = getrlimit(Resource::Nofile);
        let hard = limit.maximum;
        limit.current = Some(256.min(hard.unwrap_or(256)));
        setrlimit(Resource::Nofile, limit).expect("lower the soft limit");
        let raised = super::raise_open_file_limit().expect("raise");
        assert_eq!(getrlimit(Resource::Nofile).current, hard);
        assert_eq!(Some(raised), hard.or(Some(u64::MAX)));
    }
}
