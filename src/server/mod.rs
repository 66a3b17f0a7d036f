//! Serving HTTP with limits, for the people's TCP listener and each session's socket.
//!
//! `axum::serve` keeps every connection for as long as the peer likes: a stranger (or
//! a hijacked agent on its own socket) could hold thousands of idle or slow-header
//! connections and exhaust the process's file descriptors. Here every connection
//! counts against a cap and against its client address's share of it (IPv6 grouped by
//! /64), so one address cannot take the whole listener; connections over either are
//! closed at once. Each must deliver a
//! request's headers within `header_timeout` of the connection going idle (so an idle
//! keep-alive connection is closed after that long too), and must deliver a request
//! body within `body_timeout`. A handler that waits (a long poll) is not cut off: the
//! timeouts bound only what the peer sends.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
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
use tracing::Instrument as _;

/// How long a stopping server lets open connections finish.
pub const DRAIN: Duration = Duration::from_secs(5);
/// Pause after a failed accept (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The limits one listener enforces.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Open connections at most; further ones are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Open connections at most from one client address (an IPv6 /64 counts as one);
    /// 0 for no per-address cap (unix sockets have no address).
    pub max_per_address: usize,
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
/// open connections finish for a few seconds ([`DRAIN`]) and cuts the rest. Every
/// connection's task belongs to this call (a `JoinSet`: dropping the call cuts them)
/// and runs in its span.
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
    let per_address = Arc::new(PerAddress::new(limits.max_per_address));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // Finished connections are reaped as the loop goes: the set holds open ones.
        while connections.try_join_next().is_some() {}
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
        let Some(share) = per_address.admit(peer) else {
            tracing::debug!(
                ?peer,
                "per-address connection cap reached; closing a new connection"
            );
            drop(io);
            continue;
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
        connections.spawn(
            async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                drop((permit, share));
            }
            .in_current_span(),
        );
    }
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!(
            cut = connections.len(),
            "connections still open after the drain are cut"
        );
    }
    connections.shutdown().await;
}

/// A router with a listener's body deadline on every request: what
/// [`serve_connection`] serves. Made once per router (layering is not free), then cloned
/// per connection.
#[derive(Clone)]
pub struct LimitedRouter {
    router: Router,
    limits: ConnLimits,
}

impl LimitedRouter {
    /// `router` under `limits`' body deadline; `limits`' header deadline applies when a
    /// connection is served.
    pub fn new(router: Router, limits: ConnLimits) -> LimitedRouter {
        LimitedRouter {
            router: router.layer(middleware::from_fn_with_state(
                limits.body_timeout,
                time_body,
            )),
            limits,
        }
    }

    /// The limits it was made with.
    pub fn limits(&self) -> ConnLimits {
        self.limits
    }
}

/// Serves one connection accepted elsewhere (a relayed one, after its greeting) exactly
/// as [`serve`] serves each of its own: HTTP/1.1 with the header and body deadlines.
/// When `stop` resolves the connection finishes its open request for at most [`DRAIN`]
/// and is cut. The caller counts the connection against its caps.
pub async fn serve_connection<I>(io: I, router: LimitedRouter, stop: impl Future<Output = ()>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(router.router);
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(router.limits.header_timeout)
        .serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let ended = tokio::select! {
        ended = conn.as_mut() => ended,
        () = stop => {
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(DRAIN, conn.as_mut()).await {
                Ok(ended) => ended,
                Err(_) => return,
            }
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Open connections per client address, each under the same cap (the listener's and
/// the relay listener's).
pub(crate) struct PerAddress {
    cap: usize,
    /// Whether an IPv6 address counts alone, not by its /64 ([`address_key`]).
    exact: bool,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in its address's share; given back when dropped.
pub(crate) struct AddressShare {
    table: Arc<PerAddress>,
    key: Option<IpAddr>,
}

impl PerAddress {
    /// At most `cap` open connections per address; 0: no cap.
    pub(crate) fn new(cap: usize) -> PerAddress {
        PerAddress {
            cap,
            exact: false,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// At most `cap` open connections per exact address (an IPv6 address alone, not
    /// its /64): for peers that are pods, a node's pods sharing one /64.
    pub(crate) fn exact(cap: usize) -> PerAddress {
        PerAddress {
            exact: true,
            ..PerAddress::new(cap)
        }
    }

    /// A place for a connection from `peer`, or `None` when its address has `cap` open.
    pub(crate) fn admit(self: &Arc<Self>, peer: Option<SocketAddr>) -> Option<AddressShare> {
        let key = peer.filter(|_| self.cap > 0).map(|p| match p.ip() {
            IpAddr::V6(v6) if self.exact => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            ip => address_key(ip),
        });
        if let Some(key) = key {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            let count = open.entry(key).or_insert(0);
            if *count >= self.cap {
                return None;
            }
            *count += 1;
        }
        Some(AddressShare {
            table: self.clone(),
            key,
        })
    }
}

impl Drop for AddressShare {
    fn drop(&mut self) {
        let Some(key) = self.key else { return };
        let mut open = self.table.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&key);
            }
        }
    }
}

/// The address a connection counts against: IPv4 as is (and IPv4-mapped IPv6 as the
/// IPv4 it maps), IPv6 by its /64, which one client usually holds whole.
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(bits))
            }
        },
    }
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
    use std::net::SocketAddr;
    use std::sync::Arc;

    use rustix::process::{Resource, getrlimit, setrlimit};

    use super::{PerAddress, address_key};

    fn addr(text: &str) -> Option<SocketAddr> {
        Some(text.parse().expect("address"))
    }

    #[test]
    fn exact_addresses_do_not_share_their_slash_64() {
        let by_net = Arc::new(PerAddress::new(1));
        let _a = by_net.admit(addr("[fd00::1]:1000")).expect("first");
        assert!(by_net.admit(addr("[fd00::2]:1000")).is_none(), "one /64");
        let exact = Arc::new(PerAddress::exact(1));
        let _a = exact.admit(addr("[fd00::1]:1000")).expect("first");
        assert!(exact.admit(addr("[fd00::2]:1000")).is_some(), "another pod");
        assert!(
            exact.admit(addr("[fd00::1]:1001")).is_none(),
            "the same pod"
        );
        let _v4 = exact.admit(addr("10.0.0.1:1")).expect("v4");
        assert!(
            exact.admit(addr("[::ffff:10.0.0.1]:2")).is_none(),
            "mapped IPv4 is the IPv4"
        );
    }

    #[test]
    fn one_address_gets_at_most_its_share_and_gets_it_back() {
        let table = Arc::new(PerAddress::new(2));
        let a = table.admit(addr("10.0.0.1:1000")).expect("first");
        let _b = table.admit(addr("10.0.0.1:1001")).expect("second");
        assert!(table.admit(addr("10.0.0.1:1002")).is_none(), "third");
        assert!(
            table.admit(addr("10.0.0.2:1000")).is_some(),
            "another address"
        );
        drop(a);
        assert!(
            table.admit(addr("10.0.0.1:1003")).is_some(),
            "a place was freed"
        );
        // Unix sockets (no address) and a cap of 0 are not counted.
        assert!((0..5).all(|_| table.admit(None).is_some()));
        let off = Arc::new(PerAddress::new(0));
        let held: Vec<_> = (0..5).map(|_| off.admit(addr("10.0.0.1:1"))).collect();
        assert!(held.iter().all(Option::is_some));
    }

    #[test]
    fn an_ipv6_client_counts_by_its_64_and_a_mapped_ipv4_as_itself() {
        let k = |t: &str| address_key(t.parse().expect("ip"));
        assert_eq!(k("2001:db8:1:2::1"), k("2001:db8:1:2:ffff::9"));
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
        assert_eq!(k("::ffff:192.0.2.7"), k("192.0.2.7"));
    }

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
