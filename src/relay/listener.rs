//! The gateway's relay listener (`[relay] listen`): TLS, then a relay's greeting, then
//! the session's own HTTP service.
//!
//! Each connection counts against the listener's cap (`[relay] max_connections`) and
//! its address's (`[relay] max_connections_per_address`) from the moment it is
//! accepted and must finish TLS and present its greeting within
//! `[relay] handshake_timeout`. The credential alone picks the session: a verified
//! credential of an open session gets that session's [`SessionService`] (the router its
//! unix socket serves, so the same scope, grants, secrets and refusals), counted against
//! that session's relayed connections cap; anything else is answered `NO <reason>` and
//! closed before any session is reached. A greeting that carries no minted credential
//! is a claimed pod's service-account token when the runtime offers a verifier
//! (`sandbox::PodTokenVerifier`): it reaches the session its pod was adopted for. An
//! authentic credential of a session open on another instance is answered `GO
//! <address>` (`relay::redirect`) and closed. A connection ends when its peer closes it, when
//! its session closes (its open request drains first) or at shutdown.
//!
//! A `wait` greeting (a parked pod's relay, presenting its pod's token) is held
//! unanswered until the verifier says its pod is adopted (`OK`, then closed) or for
//! [`wire::ADOPTION_WAIT_HOLD`] (`NO not_adopted`), so the relay learns of its adoption
//! the moment it happens instead of asking again and again; the token is reviewed
//! before it may wait, one wait per pod is held (a second supersedes the first), and a
//! waiting connection counts against the listener's cap like any other.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument as _;

use super::control::{self, RelayParts};
use super::credential::{CredentialError, is_minted};
use super::settings::RelaySettings;
use super::wire::{self, Purpose, Refused};
use crate::gateway::SessionService;
use crate::ids::SessionId;
use crate::sandbox::{AdoptionWait, PodTokenError};
use crate::secrets::{ExposeSecret as _, SecretString};
use crate::server::PerAddress;
use crate::tasks::Tasks;

/// Pause after a failed accept (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Binds the relay listener when `[relay] listen` is set and serves it in `tasks` until
/// shutdown; answers the bound address. Missing or unusable certificate files are an
/// error naming their key.
pub async fn start(
    settings: &RelaySettings,
    parts: RelayParts,
    tasks: &Tasks,
) -> anyhow::Result<Option<SocketAddr>> {
    let Some(at) = settings.listen else {
        return Ok(None);
    };
    let cert = settings
        .cert_file
        .as_deref()
        .context("relay.cert_file is required when relay.listen is set")?;
    let key = settings
        .key_file
        .as_deref()
        .context("relay.key_file is required when relay.listen is set")?;
    let tls = super::tls::server_config(("relay.cert_file", cert), ("relay.key_file", key))?;
    anyhow::ensure!(
        settings.max_connections > 0,
        "relay.max_connections must be at least 1"
    );
    let listener = TcpListener::bind(at)
        .await
        .with_context(|| format!("relay.listen: cannot listen on {at}"))?;
    let addr = listener.local_addr()?;
    let served = Listener {
        acceptor: TlsAcceptor::from(tls),
        parts,
        handshake_timeout: settings.handshake_timeout,
        slots: Arc::new(Semaphore::new(settings.max_connections)),
        per_address: Arc::new(PerAddress::exact(settings.max_connections_per_address)),
    };
    let stopping = tasks.stopping();
    tasks.spawn(served.serve(listener, stopping));
    tracing::info!(%addr, "relay listener serving");
    Ok(Some(addr))
}

struct Listener {
    acceptor: TlsAcceptor,
    parts: RelayParts,
    handshake_timeout: Duration,
    slots: Arc<Semaphore>,
    /// Open connections by address (`[relay] max_connections_per_address`).
    per_address: Arc<PerAddress>,
}

impl Listener {
    /// Accepts until `stopping`; then every open connection drains (each watches the
    /// same signal) and the rest are cut when this returns.
    async fn serve(self, listener: TcpListener, stopping: impl Future<Output = ()> + Send) {
        let this = Arc::new(self);
        let mut connections = tokio::task::JoinSet::new();
        let (stop_all, stopped) = tokio::sync::watch::channel(false);
        let mut stopping = std::pin::pin!(stopping);
        loop {
            while connections.try_join_next().is_some() {}
            let accepted = tokio::select! {
                () = &mut stopping => break,
                accepted = listener.accept() => accepted,
            };
            let (io, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "relay listener cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Some(share) = this.per_address.admit(Some(peer)) else {
                tracing::debug!(%peer, "relay connections of one address at their cap; closing a new one");
                drop(io);
                continue;
            };
            let Ok(permit) = this.slots.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "relay connection cap reached; closing a new connection");
                drop(io);
                continue;
            };
            let _ = io.set_nodelay(true);
            let (this, mut stopped) = (this.clone(), stopped.clone());
            let stop = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            connections.spawn(
                async move {
                    this.connection(io, peer, stop).await;
                    drop((permit, share));
                }
                .in_current_span(),
            );
        }
        let _ = stop_all.send(true);
        let drain = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(crate::server::DRAIN, drain)
            .await
            .is_err()
        {
            tracing::info!(
                cut = connections.len(),
                "relayed connections still open after the drain are cut"
            );
        }
        connections.shutdown().await;
    }

    /// One relayed connection, from TLS to its end.
    async fn connection(
        &self,
        io: TcpStream,
        peer: SocketAddr,
        stop: impl Future<Output = ()> + Send,
    ) {
        let greeted = tokio::time::timeout(self.handshake_timeout, self.greet(io)).await;
        let (mut stream, purpose, service) = match greeted {
            Ok(Ok(Some((stream, Greeted::Session(purpose, service))))) => {
                (stream, purpose, *service)
            }
            Ok(Ok(Some((stream, Greeted::Wait(credential))))) => {
                self.wait_adopted(stream, &credential, &peer, stop).await;
                return;
            }
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "relay handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "relay handshake timed out");
                return;
            }
        };
        let Ok(_slot) = service.slots.clone().try_acquire_owned() else {
            refuse(&mut stream, Refused::Busy, &peer).await;
            return;
        };
        if write_answer(&mut stream, Ok(())).await.is_err() {
            return;
        }
        tracing::debug!(%peer, session = %service.scope.session_id, ?purpose, "relayed connection open");
        let closed = service.closed.clone();
        let end = async move {
            tokio::select! {
                () = closed.cancelled() => {},
                () = stop => {},
            }
        };
        let router = match purpose {
            Purpose::Stream => service.router.clone(),
            Purpose::Control => control::router(&service, &self.parts),
            // Answered by `wait_adopted`, never greeted into a session.
            Purpose::Wait => return,
        };
        crate::server::serve_connection(stream, router, end).await;
    }

    /// TLS, the greeting and its credential: the connection and the open session it
    /// reaches, or `None` once it has been refused.
    async fn greet(&self, io: TcpStream) -> std::io::Result<Option<(Relayed, Greeted)>> {
        let peer = io.peer_addr()?;
        let tls = self.acceptor.accept(io).await?;
        let mut stream = BufReader::new(tls);
        let Some((purpose, credential)) = wire::read_line(&mut stream)
            .await?
            .and_then(wire::parse_greeting)
        else {
            refuse(&mut stream, Refused::Malformed, &peer).await;
            return Ok(None);
        };
        if purpose == Purpose::Wait {
            return Ok(Some((stream, Greeted::Wait(credential))));
        }
        let session_id = match self.session_of(&credential).await {
            Ok(session_id) => session_id,
            Err(why) => {
                refuse(&mut stream, why, &peer).await;
                return Ok(None);
            }
        };
        let Some(service) = self.parts.sessions.service(&session_id) else {
            let owner = match &self.parts.redirects {
                Some(redirects) => redirects.owner_of(&session_id).await,
                None => None,
            };
            match owner {
                Some(addr) => {
                    tracing::info!(%peer, session = %session_id, owner = %addr, "relay sent to its session's owner");
                    let _ = stream.write_all(wire::redirect(addr).as_bytes()).await;
                    let _ = stream.flush().await;
                    let _ = stream.shutdown().await;
                }
                None => refuse(&mut stream, Refused::Stopped, &peer).await,
            }
            return Ok(None);
        };
        Ok(Some((stream, Greeted::Session(purpose, Box::new(service)))))
    }

    /// A `wait`: answers once `credential`'s pod is adopted (`OK`), or when the hold
    /// passed (`NO not_adopted`), another wait for the pod took its place (`NO
    /// superseded`), too many are held (`NO busy`) or the token is refused; then
    /// closes. A minted credential has nothing to wait for and is answered at once.
    async fn wait_adopted(
        &self,
        mut stream: Relayed,
        credential: &SecretString,
        peer: &SocketAddr,
        stop: impl Future<Output = ()> + Send,
    ) {
        let outcome = match &self.parts.pod_tokens {
            Some(verifier) if !is_minted(credential.expose_secret()) => {
                let waited = verifier.wait_adopted(credential, wire::ADOPTION_WAIT_HOLD);
                // The review within the handshake's time, the hold after it.
                let bound = self.handshake_timeout + wire::ADOPTION_WAIT_HOLD;
                tokio::select! {
                    waited = tokio::time::timeout(bound, waited) => match waited {
                        Ok(Ok(AdoptionWait::Adopted(_))) => Ok(()),
                        Ok(Ok(AdoptionWait::NotYet)) | Err(_) => Err(Refused::NotAdopted),
                        Ok(Ok(AdoptionWait::Superseded)) => Err(Refused::Superseded),
                        Ok(Ok(AdoptionWait::TooMany)) => Err(Refused::Busy),
                        Ok(Ok(AdoptionWait::Elsewhere(owner))) => {
                            return self.send_to_parker(stream, &owner, peer).await;
                        }
                        Ok(Err(PodTokenError::Invalid | PodTokenError::Unknown)) => {
                            Err(Refused::Invalid)
                        }
                        Ok(Err(PodTokenError::Unavailable)) => Err(Refused::Unavailable),
                    },
                    () = stop => Err(Refused::Unavailable),
                }
            }
            _ => tokio::time::timeout(self.handshake_timeout, self.session_of(credential))
                .await
                .unwrap_or(Err(Refused::Unavailable))
                .map(|_| ()),
        };
        match outcome {
            Ok(()) => {
                tracing::debug!(%peer, "a waiting relay's pod is adopted");
                let _ = write_answer(&mut stream, Ok(())).await;
                let _ = stream.shutdown().await;
            }
            Err(why) => refuse(&mut stream, why, peer).await,
        }
    }
}

impl Listener {
    /// A `wait` for a pod another instance parked (only it adopts the pod): answered
    /// `GO <its address>` from the instance registry, else `NO not_adopted`.
    async fn send_to_parker(&self, mut stream: Relayed, owner: &str, peer: &SocketAddr) {
        let addr = match &self.parts.redirects {
            Some(redirects) => redirects.instance_addr(owner).await,
            None => None,
        };
        match addr {
            Some(addr) => {
                tracing::debug!(%peer, %owner, "a waiting relay sent to the instance that parked its pod");
                let _ = stream.write_all(wire::redirect(addr).as_bytes()).await;
                let _ = stream.flush().await;
                let _ = stream.shutdown().await;
            }
            None => refuse(&mut stream, Refused::NotAdopted, peer).await,
        }
    }
}

/// What a greeted connection is for: a session's service, or a `wait`.
enum Greeted {
    Session(Purpose, Box<SessionService>),
    Wait(SecretString),
}

impl Listener {
    /// The session `credential` reaches: a minted credential names it; a claimed pod's
    /// service-account token reaches the session its pod was adopted for (when a
    /// verifier is configured).
    async fn session_of(&self, credential: &SecretString) -> Result<SessionId, Refused> {
        let pod_tokens = match &self.parts.pod_tokens {
            Some(verifier) if !is_minted(credential.expose_secret()) => verifier,
            _ => {
                return match self.parts.credentials.verify(credential) {
                    Ok(verified) => Ok(verified.session_id),
                    Err(CredentialError::Invalid) => Err(Refused::Invalid),
                    Err(CredentialError::Expired) => Err(Refused::Expired),
                };
            }
        };
        pod_tokens
            .session_of(credential)
            .await
            .map_err(|e| match e {
                PodTokenError::Invalid | PodTokenError::Unknown => Refused::Invalid,
                PodTokenError::Unavailable => Refused::Unavailable,
            })
    }
}

/// A relayed connection after TLS, buffered for its greeting line.
type Relayed = BufReader<tokio_rustls::server::TlsStream<TcpStream>>;

async fn write_answer(stream: &mut Relayed, outcome: Result<(), Refused>) -> std::io::Result<()> {
    stream.write_all(wire::answer(outcome).as_bytes()).await?;
    stream.flush().await
}

/// Answers `NO <why>` and closes. Logged without the credential: at `info` when the
/// credential was authentic (expired, stopped session, busy), at `debug` when anyone
/// could have sent it (a flood of junk does not fill the log).
async fn refuse(stream: &mut Relayed, why: Refused, peer: &SocketAddr) {
    match why {
        Refused::Malformed | Refused::Invalid | Refused::NotAdopted | Refused::Superseded => {
            tracing::debug!(%peer, reason = %why, "relay connection refused");
        }
        Refused::Expired | Refused::Stopped | Refused::Busy | Refused::Unavailable => {
            tracing::info!(%peer, reason = %why, "relay connection refused");
        }
    }
    let _ = write_answer(stream, Err(why)).await;
    let _ = stream.shutdown().await;
}
