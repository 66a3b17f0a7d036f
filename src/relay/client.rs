//! Relay mode (`threadgate relay`): the sidecar beside an agent in a pod. It listens on
//! the unix socket the agent knows (`/run/threadgate/api.sock`, on a volume the two
//! containers share) and carries each of the agent's connections, byte for byte, to
//! the gateway's relay listener over TLS, greeted with the session's credential. The
//! agent sees the same socket and API it has on Docker.
//!
//! - The gateway's certificate must chain to `--ca-file` and name the `--gateway` host.
//! - At most `max_connections` of the agent's connections are carried at once; more are
//!   closed as soon as they are accepted.
//! - The credential read from `--token-file` is renewed over a `control` connection
//!   when two thirds of its life have passed; when the gateway refuses it (expired,
//!   invalid) the file is read again, as the backend may have written a new one.
//! - One greeted connection is kept ready (at most [`WARM_MAX_AGE`] old, checked still
//!   open when taken), so an agent's connection usually skips TCP, TLS and the greeting;
//!   it counts against the session's relayed connections cap like any other.
//! - A gateway instance that does not run the session answers `GO <address>`: the relay
//!   dials that address instead (its session's owner, taken from the gateway's
//!   instance registry), still checking the certificate against the `--gateway` host,
//!   at most [`MAX_REDIRECTS`] times per connection. It keeps dialling the owner
//!   directly until that fails, then goes through `--gateway` again.
//! - With `--secrets-dir`, the session's granted secrets are fetched before the socket
//!   is opened and written there as read-only files (a memory-backed volume). Neither a
//!   credential nor a secret is ever logged.
//! - A relay presenting its pod's token (a parked or claimed pod, started before its
//!   thread was known) is refused until its pod is adopted; meanwhile it holds one
//!   `wait` connection (`wire`) that the gateway answers the moment the pod is adopted,
//!   or after [`wire::ADOPTION_WAIT_HOLD`] (then it asks again at once), so an adoption
//!   reaches it without polling and a lost wake-up only delays it by one hold. A
//!   gateway that knows no `wait` (an older one: `NO malformed`) is asked again every
//!   `UNASSIGNED_POLL`. Any other failure backs off.

use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::FutureExt as _;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::{Notify, Semaphore};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tracing::Instrument as _;

mod workspace;

use super::control::{RENEW_PATH, Renewed, SECRETS_PATH, SecretFiles};
use super::wire::{self, Purpose, Refused};
use crate::secrets::{ExposeSecret as _, SecretString};

/// The mode of the relay's socket: the agent's container may run as another user of
/// the pod's group (`fsGroup`), so the group may connect; nobody else.
pub const SOCKET_MODE: u32 = 0o660;
/// The agent's connections carried at once unless told otherwise: the session socket's
/// own default cap.
pub const DEFAULT_MAX_CONNECTIONS: usize = 32;
/// Time to reach the gateway and be greeted back.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest control answer read (the secrets of one agent).
const MAX_CONTROL_ANSWER: usize = 4 << 20;
/// What is read of an agent's request that could not be carried, and for how long,
/// before its connection closes.
const MAX_UNREAD: u64 = 64 << 10;
const DRAIN_UNREAD: Duration = Duration::from_secs(1);
/// The oldest a warm connection is used: well under the gateway's header deadline
/// (`server.header_timeout`, 10 s by default), after which it closes an idle connection.
const WARM_MAX_AGE: Duration = Duration::from_secs(4);
/// Redirects followed for one connection before giving up.
pub const MAX_REDIRECTS: usize = 3;
/// How often a relay presenting its pod's token asks again while its pod is not adopted
/// yet when the gateway cannot hold a `wait` (an older gateway), or its wait failed.
const UNASSIGNED_POLL: Duration = Duration::from_millis(250);
/// How long the relay waits for the answer to a `wait`: the gateway's hold, and the
/// time to review the token and reach it.
const WAIT_ANSWER_TIMEOUT: Duration =
    Duration::from_secs(wire::ADOPTION_WAIT_HOLD.as_secs() + 2 * DIAL_TIMEOUT.as_secs());
/// The shortest wait between renewals, and the first wait after a failed one.
const MIN_RENEW_WAIT: Duration = Duration::from_secs(1);

/// How the relay is started.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// The unix socket to serve the agent on.
    pub listen: PathBuf,
    /// The gateway's relay listener, `https://HOST:PORT`.
    pub gateway: String,
    /// The file holding the session's credential.
    pub token_file: PathBuf,
    /// The CA the gateway's certificate must chain to (PEM).
    pub ca_file: PathBuf,
    /// Where to write the session's granted secrets, if anywhere.
    pub secrets_dir: Option<PathBuf>,
    /// The agent's connections carried at once.
    pub max_connections: usize,
    /// The session's workspace to fetch before the socket opens and send back when the
    /// gateway asks (`client/workspace.rs`), if any.
    pub workspace: Option<crate::workspace::PodWorkspace>,
    /// The caps the fetched workspace's bundle must keep (`--workspace-max-*`, from the
    /// gateway's `[relay.workspace]`): past any of them it is refused and nothing is
    /// written.
    pub workspace_limits: crate::workspace::BundleLimits,
}

/// A relay, ready to run.
pub struct Relay {
    options: RelayOptions,
    dialer: Arc<Dialer>,
}

/// Reaches the gateway: TLS, greeting, answer.
struct Dialer {
    connector: TlsConnector,
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    token_file: PathBuf,
    credential: Mutex<SecretString>,
    /// One connection dialled and greeted ahead of the agent's next.
    warm: Mutex<Option<Warm>>,
    /// Tells the warmer its connection was taken.
    warm_taken: Notify,
    /// The session's owner, learnt from a redirect: dialled first while it answers.
    owner: Mutex<Option<std::net::SocketAddr>>,
}

/// Where one dial goes.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// `--gateway` (a Service in front of every instance).
    Gateway,
    /// The instance a redirect named.
    Owner(std::net::SocketAddr),
}

/// A greeted connection waiting for an agent's connection.
struct Warm {
    stream: Upstream,
    dialled: Instant,
}

/// Why the gateway could not be reached with the credential.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("the gateway refused the relay: {0}")]
    Refused(Refused),
    #[error("cannot reach the gateway: {0}")]
    Io(#[from] std::io::Error),
    #[error("the gateway did not answer the relay's greeting in time")]
    Timeout,
    #[error("the gateway answered the greeting with something else")]
    Garbled,
    #[error("the gateway sent the relay to {0}")]
    Redirected(std::net::SocketAddr),
    #[error("the gateway sent the relay on more than {MAX_REDIRECTS} times")]
    TooManyRedirects,
}

/// A connection to the gateway after its `OK`.
type Upstream = BufReader<tokio_rustls::client::TlsStream<TcpStream>>;

impl Relay {
    /// Reads the CA and the credential and checks the gateway's address; nothing is
    /// dialled or bound yet. Errors name the flag.
    pub fn new(options: RelayOptions) -> anyhow::Result<Relay> {
        let (host, port) = parse_gateway(&options.gateway)?;
        let server_name = ServerName::try_from(host.clone())
            .map_err(|_| anyhow::anyhow!("--gateway: {host:?} is not a host name or address"))?;
        let tls = super::tls::client_config(&options.ca_file)?;
        let credential = read_token(&options.token_file)?;
        anyhow::ensure!(
            options.max_connections > 0,
            "--max-connections must be at least 1"
        );
        let dialer = Dialer {
            connector: TlsConnector::from(tls),
            host,
            port,
            server_name,
            token_file: options.token_file.clone(),
            credential: Mutex::new(credential),
            warm: Mutex::new(None),
            warm_taken: Notify::new(),
            owner: Mutex::new(None),
        };
        Ok(Relay {
            options,
            dialer: Arc::new(dialer),
        })
    }

    /// Fetches the secrets (with `--secrets-dir`), opens the socket and carries the
    /// agent's connections until `shutdown`, renewing the credential meanwhile. Open
    /// connections are cut when this returns.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let mut shutdown = std::pin::pin!(shutdown);
        if let Some(dir) = &self.options.secrets_dir {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                written = self.fetch_secrets_until_done(dir) => written?,
            }
        }
        if let Some(workspace) = &self.options.workspace {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                written = self.fetch_workspace_until_done(workspace) => written?,
            }
        }
        let listener = bind_socket(&self.options.listen)?;
        tracing::info!(socket = %self.options.listen.display(), gateway = %self.options.gateway, "relay serving");
        let renewing = tokio::spawn(self.dialer.clone().keep_renewed().in_current_span());
        let warming = tokio::spawn(self.dialer.clone().keep_warm().in_current_span());
        let syncing = self.options.workspace.clone().map(|workspace| {
            tokio::spawn(self.dialer.clone().keep_synced(workspace).in_current_span())
        });
        let slots = Arc::new(Semaphore::new(self.options.max_connections));
        let mut connections = tokio::task::JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            let local = match accepted {
                Ok((local, _)) => local,
                Err(e) => {
                    tracing::warn!(error = %e, "relay cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                tracing::debug!("relay connection cap reached; closing a new connection");
                drop(local);
                continue;
            };
            let dialer = self.dialer.clone();
            connections.spawn(
                async move {
                    dialer.carry(local).await;
                    drop(permit);
                }
                .in_current_span(),
            );
        }
        renewing.abort();
        warming.abort();
        if let Some(syncing) = syncing {
            syncing.abort();
        }
        connections.shutdown().await;
        let _ = std::fs::remove_file(&self.options.listen);
        Ok(())
    }

    /// Fetches and writes the workspace, trying again (with backoff) until it is in
    /// place: the agent's socket opens only after it.
    async fn fetch_workspace_until_done(
        &self,
        workspace: &crate::workspace::PodWorkspace,
    ) -> anyhow::Result<()> {
        let mut failed = 0;
        loop {
            match self
                .dialer
                .fetch_workspace(workspace, self.options.workspace_limits)
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) if self.unadopted(&e) => self.dialer.wait_adopted().await,
                Err(e) => {
                    failed += 1;
                    let wait = crate::retry::SESSION_START.wait(failed);
                    tracing::warn!(error = %format!("{e:#}"), retry_in = ?wait, "cannot fetch the session's workspace");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Fetches and writes the secrets, trying again (with backoff) until the gateway
    /// answers: the agent's socket opens only after they are in place.
    async fn fetch_secrets_until_done(&self, dir: &Path) -> anyhow::Result<()> {
        let mut failed = 0;
        loop {
            match self.dialer.fetch_secrets().await {
                Ok(files) => return write_secrets(dir, &files),
                Err(e) if self.unadopted(&e) => self.dialer.wait_adopted().await,
                Err(e) => {
                    failed += 1;
                    let wait = crate::retry::SESSION_START.wait(failed);
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot fetch the session's secrets");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

impl Relay {
    /// Whether fetching what the socket waits on failed because the relay's pod is not
    /// adopted yet: a relay presenting its pod's token (a parked or claimed pod, started
    /// before its thread was known) is refused `invalid` until then. It then waits for
    /// the adoption ([`Dialer::wait_adopted`]) rather than backing off (up to five
    /// minutes) or polling.
    fn unadopted(&self, error: &anyhow::Error) -> bool {
        refused_unadopted(error, self.dialer.current().expose_secret())
    }
}

/// See [`Relay::unadopted`]: `credential` is what the relay presents.
fn refused_unadopted(error: &anyhow::Error, credential: &str) -> bool {
    let refused_invalid = matches!(
        error.downcast_ref::<DialError>(),
        Some(DialError::Refused(Refused::Invalid))
    );
    refused_invalid && !super::credential::is_minted(credential)
}

impl Dialer {
    /// Carries one of the agent's connections to the gateway and back. When the gateway
    /// cannot be reached, the agent gets a 502 in the sandbox API's error shape.
    async fn carry(&self, mut local: UnixStream) {
        let upstream = match self.take_warm() {
            Some(warm) => Ok(warm),
            None => self.dial_retrying(Purpose::Stream).await,
        };
        let mut upstream = match upstream {
            Ok(upstream) => upstream,
            Err(e) => {
                tracing::warn!(error = %e, "an agent connection could not be relayed");
                let _ = local.write_all(unavailable(&e).as_bytes()).await;
                let _ = local.shutdown().await;
                // What the agent sent is read (a little, briefly) before the socket
                // closes: closing over unread bytes would reset the connection before
                // the agent reads the answer.
                let mut sent = (&mut local).take(MAX_UNREAD);
                let _ = tokio::time::timeout(
                    DRAIN_UNREAD,
                    tokio::io::copy(&mut sent, &mut tokio::io::sink()),
                )
                .await;
                return;
            }
        };
        if let Err(e) = tokio::io::copy_bidirectional(&mut local, &mut upstream).await {
            tracing::debug!(error = %e, "relayed connection ended with an error");
        }
    }

    /// The warm connection, if one is there, young enough and still open; the warmer
    /// is told to dial the next.
    fn take_warm(&self) -> Option<Upstream> {
        let warm = self.warm.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.warm_taken.notify_one();
        let mut warm = warm.filter(|w| w.dialled.elapsed() < WARM_MAX_AGE)?.stream;
        // Open means nothing to read yet: end of stream or stray bytes mean the gateway
        // closed it (a restart, a drain) and it must not carry the agent's request.
        match tokio::io::AsyncBufReadExt::fill_buf(&mut warm).now_or_never() {
            None => Some(warm),
            Some(_) => None,
        }
    }

    /// Keeps one greeted connection ready, so an agent's connection does not wait for
    /// TCP, TLS and the greeting: dialled again when taken or after [`WARM_MAX_AGE`]
    /// (under the gateway's header deadline, which closes an idle connection). Runs
    /// until aborted.
    async fn keep_warm(self: Arc<Self>) {
        let mut failed = 0;
        loop {
            match self.dial_retrying(Purpose::Stream).await {
                Ok(stream) => {
                    failed = 0;
                    let warm = Warm {
                        stream,
                        dialled: Instant::now(),
                    };
                    *self.warm.lock().unwrap_or_else(|p| p.into_inner()) = Some(warm);
                    tokio::select! {
                        () = self.warm_taken.notified() => {},
                        () = tokio::time::sleep(WARM_MAX_AGE) => {},
                    }
                }
                Err(e) => {
                    failed += 1;
                    tracing::debug!(error = %e, "cannot dial a warm connection");
                    let wait = crate::retry::SESSION_START.wait(failed).max(MIN_RENEW_WAIT);
                    tokio::select! {
                        () = self.warm_taken.notified() => {},
                        () = tokio::time::sleep(wait) => {},
                    }
                }
            }
        }
    }

    /// Holds one `wait` until the gateway answers it: returns when the pod is adopted
    /// (`OK`), and otherwise after a short pause, so the caller asks for what it fetches
    /// again (a wake-up lost anywhere costs at most one hold). `NO not_adopted` (the hold
    /// passed) is asked again at once (after [`UNASSIGNED_POLL`] when it came without a
    /// hold); `GO` (another instance parked the pod) is followed; `NO malformed` (a gateway that knows no `wait`),
    /// `NO superseded` or any failure returns after [`UNASSIGNED_POLL`].
    async fn wait_adopted(&self) {
        loop {
            let asked = Instant::now();
            match self.dial_retrying(Purpose::Wait).await {
                Ok(_) => {
                    tracing::debug!("the gateway says the pod is adopted");
                    return;
                }
                Err(DialError::Refused(Refused::NotAdopted)) => {
                    tracing::debug!("the pod is not adopted yet; waiting again");
                    // An instance that could not hold the wait answers at once: no spin.
                    if asked.elapsed() < MIN_RENEW_WAIT {
                        tokio::time::sleep(UNASSIGNED_POLL).await;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot wait for the pod's adoption; asking again");
                    tokio::time::sleep(UNASSIGNED_POLL).await;
                    return;
                }
            }
        }
    }

    /// Dials; when the credential is refused as expired or invalid, reads the token file
    /// again and, if it holds another credential, dials once more with it.
    async fn dial_retrying(&self, purpose: Purpose) -> Result<Upstream, DialError> {
        match self.dial(purpose).await {
            Err(DialError::Refused(Refused::Expired | Refused::Invalid)) if self.reload() => {
                self.dial(purpose).await
            }
            other => other,
        }
    }

    /// A greeted connection to the session's owner: the owner learnt before, else the
    /// gateway, following its redirects (at most [`MAX_REDIRECTS`]). When the learnt
    /// owner fails, it is forgotten and the gateway is dialled.
    async fn dial(&self, purpose: Purpose) -> Result<Upstream, DialError> {
        let learnt = *self.owner.lock().unwrap_or_else(|p| p.into_inner());
        let mut target = learnt.map_or(Target::Gateway, Target::Owner);
        let mut redirects = 0;
        loop {
            match self.dial_at(purpose, target).await {
                Err(DialError::Redirected(addr)) => {
                    redirects += 1;
                    if redirects > MAX_REDIRECTS {
                        return Err(DialError::TooManyRedirects);
                    }
                    tracing::debug!(owner = %addr, "the gateway sent the relay to its session's owner");
                    *self.owner.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
                    target = Target::Owner(addr);
                }
                // A wait the owner answered is no failure of the owner.
                Err(e)
                    if matches!(target, Target::Owner(_))
                        && redirects == 0
                        && !matches!(
                            e,
                            DialError::Refused(Refused::NotAdopted | Refused::Superseded)
                        ) =>
                {
                    tracing::debug!(error = %e, "the session's owner did not take the relay; dialling the gateway");
                    *self.owner.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    target = Target::Gateway;
                }
                other => return other,
            }
        }
    }

    /// TLS to `target`, the greeting, and its answer.
    async fn dial_at(&self, purpose: Purpose, target: Target) -> Result<Upstream, DialError> {
        let greeting = wire::greeting(purpose, &self.current());
        let dialled = async {
            let tcp = match target {
                Target::Gateway => TcpStream::connect((self.host.as_str(), self.port)).await?,
                Target::Owner(addr) => TcpStream::connect(addr).await?,
            };
            let _ = tcp.set_nodelay(true);
            let tls = self
                .connector
                .connect(self.server_name.clone(), tcp)
                .await?;
            let mut stream = BufReader::new(tls);
            stream
                .write_all(greeting.expose_secret().as_bytes())
                .await?;
            stream.flush().await?;
            let line = wire::read_line(&mut stream).await?;
            if let Some(addr) = line.as_deref().and_then(wire::parse_redirect) {
                return Err(DialError::Redirected(addr));
            }
            match line.as_deref().and_then(wire::parse_answer) {
                Some(Ok(())) => Ok(stream),
                Some(Err(why)) => Err(DialError::Refused(why)),
                None => Err(DialError::Garbled),
            }
        };
        let deadline = match purpose {
            Purpose::Wait => WAIT_ANSWER_TIMEOUT,
            Purpose::Stream | Purpose::Control => DIAL_TIMEOUT,
        };
        tokio::time::timeout(deadline, dialled)
            .await
            .map_err(|_| DialError::Timeout)?
    }

    fn current(&self) -> SecretString {
        self.credential
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set(&self, credential: SecretString) {
        *self.credential.lock().unwrap_or_else(|p| p.into_inner()) = credential;
    }

    /// Reads the token file again; whether it held a credential other than the one in use.
    fn reload(&self) -> bool {
        match read_token(&self.token_file) {
            Ok(read) if read.expose_secret() != self.current().expose_secret() => {
                tracing::info!("the token file holds a new relay credential");
                self.set(read);
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the token file again");
                false
            }
        }
    }

    /// Renews the credential whenever two thirds of its life have passed, until aborted.
    async fn keep_renewed(self: Arc<Self>) {
        let mut failed = 0;
        loop {
            let wait = match failed {
                0 => renew_wait(&self.current(), now_ms()),
                n => crate::retry::SESSION_START.wait(n).max(MIN_RENEW_WAIT),
            };
            tokio::time::sleep(wait).await;
            match self.renew().await {
                Ok(()) => failed = 0,
                Err(e) => {
                    failed += 1;
                    tracing::warn!(error = %e, "cannot renew the relay credential");
                    self.reload();
                }
            }
        }
    }

    /// One renewal over a control connection.
    async fn renew(&self) -> anyhow::Result<()> {
        let body = self.control_request("POST", RENEW_PATH).await?;
        let renewed: Renewed<'_> =
            serde_json::from_slice(&body).context("the renewal answer is not one")?;
        self.set(SecretString::from(renewed.credential.to_owned()));
        tracing::info!(
            expires_at_ms = renewed.expires_at_ms,
            "relay credential renewed"
        );
        Ok(())
    }

    /// The session's granted secrets, by name.
    async fn fetch_secrets(&self) -> anyhow::Result<Vec<(String, SecretString)>> {
        let body = zeroize::Zeroizing::new(self.control_request("GET", SECRETS_PATH).await?);
        let files: SecretFiles<'_> =
            serde_json::from_slice(&body).context("the secrets answer is not one")?;
        Ok(files
            .secrets
            .into_iter()
            .map(|f| (f.name.to_owned(), SecretString::from(f.value.to_owned())))
            .collect())
    }

    /// One request on a fresh control connection; the body of its 200 answer.
    async fn control_request(&self, method: &str, path: &str) -> anyhow::Result<Vec<u8>> {
        let stream = self.dial_retrying(Purpose::Control).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("control connection")?;
        let driving = tokio::spawn(conn.in_current_span());
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "threadgate")
            .body(Full::new(hyper::body::Bytes::new()))
            .context("control request")?;
        let answered = async {
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_CONTROL_ANSWER)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("control answer: {e}"))?
                .to_bytes();
            anyhow::ensure!(status.is_success(), "{path} answered {status}");
            Ok(body.to_vec())
        };
        let answered = tokio::time::timeout(DIAL_TIMEOUT, answered)
            .await
            .map_err(|_| anyhow::anyhow!("{path} was not answered in time"))?;
        driving.abort();
        answered
    }
}

/// How long to wait before renewing `credential`: two thirds of what is left of its
/// life, at least [`MIN_RENEW_WAIT`]. A credential whose expiry cannot be read is
/// renewed at once.
fn renew_wait(credential: &SecretString, now_ms: i64) -> Duration {
    let expiry = credential
        .expose_secret()
        .split('.')
        .nth(2)
        .and_then(|e| e.parse::<i64>().ok());
    let left = expiry.map_or(0, |e| e.saturating_sub(now_ms)).max(0);
    Duration::from_millis(u64::try_from(left / 3 * 2).unwrap_or(0)).max(MIN_RENEW_WAIT)
}

fn now_ms() -> i64 {
    crate::clock::Clock::system().now_ms()
}

/// The host of a gateway URL (`https://HOST:PORT`), as a relay checks the certificate
/// against it; an error says what is wrong with the URL.
pub fn gateway_host(url: &str) -> anyhow::Result<String> {
    parse_gateway(url)
        .map(|(host, _)| host)
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_start_matches("--gateway: ")))
}

/// `https://HOST:PORT` (the port defaults to 443) as host and port.
fn parse_gateway(text: &str) -> anyhow::Result<(String, u16)> {
    let uri: axum::http::Uri = text
        .parse()
        .map_err(|_| anyhow::anyhow!("--gateway: {text:?} is not a URL"))?;
    anyhow::ensure!(
        uri.scheme_str() == Some("https"),
        "--gateway: {text:?} must be an https:// URL"
    );
    anyhow::ensure!(
        matches!(uri.path(), "" | "/") && uri.query().is_none(),
        "--gateway: {text:?} must have no path"
    );
    let host = uri
        .host()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
        .filter(|h| !h.is_empty())
        .ok_or_else(|| anyhow::anyhow!("--gateway: {text:?} names no host"))?;
    Ok((host.to_owned(), uri.port_u16().unwrap_or(443)))
}

/// The credential in `path`, surrounding whitespace ignored.
fn read_token(path: &Path) -> anyhow::Result<SecretString> {
    let text = std::fs::read_to_string(path)
        .map(zeroize::Zeroizing::new)
        .with_context(|| format!("--token-file: cannot read {}", path.display()))?;
    let token = text.trim();
    anyhow::ensure!(
        !token.is_empty() && !token.contains(char::is_whitespace),
        "--token-file: {} holds no credential",
        path.display()
    );
    Ok(SecretString::from(token.to_owned()))
}

/// Binds the agent's socket with [`SOCKET_MODE`], replacing a socket left by an earlier
/// run of the relay (the volume outlives the container).
fn bind_socket(path: &Path) -> anyhow::Result<UnixListener> {
    if std::fs::symlink_metadata(path).is_ok() {
        std::fs::remove_file(path)
            .with_context(|| format!("--listen: cannot remove the old {}", path.display()))?;
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("--listen: cannot bind {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .with_context(|| format!("--listen: cannot set the mode of {}", path.display()))?;
    Ok(listener)
}

/// Writes each secret to `dir/NAME` (mode 0400), replacing an older file atomically. A
/// name that is not a plain file name is refused, naming it (never its value).
fn write_secrets(dir: &Path, secrets: &[(String, SecretString)]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("--secrets-dir: cannot create {}", dir.display()))?;
    for (name, value) in secrets {
        let plain = crate::secrets::validate_name("secret", name).is_ok() && !name.starts_with('.');
        anyhow::ensure!(plain, "the secret name {name:?} is not a plain file name");
        let path = dir.join(name);
        let staged = dir.join(format!(".{name}.new"));
        let _ = std::fs::remove_file(&staged);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(&staged)
            .with_context(|| format!("--secrets-dir: cannot create {}", staged.display()))?;
        std::io::Write::write_all(&mut file, value.expose_secret().as_bytes())
            .and_then(|()| file.sync_all())
            .with_context(|| format!("--secrets-dir: cannot write {}", staged.display()))?;
        std::fs::rename(&staged, &path)
            .with_context(|| format!("--secrets-dir: cannot put {} in place", path.display()))?;
    }
    tracing::info!(dir = %dir.display(), count = secrets.len(), "the session's secrets are in place");
    Ok(())
}

/// A 502 in the sandbox API's error shape, closing the connection.
fn unavailable(e: &DialError) -> String {
    let code = match e {
        DialError::Refused(Refused::Stopped) => "session_stopped",
        DialError::Refused(Refused::Busy) => "too_many_connections",
        _ => "gateway_unreachable",
    };
    let body = serde_json::json!({
        "status": "error",
        "error": code,
        "message": format!("the relay could not reach the gateway: {e}"),
    })
    .to_string();
    format!(
        "HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_url_gives_host_and_port() {
        let ok = |t: &str| parse_gateway(t).expect(t);
        assert_eq!(ok("https://gw.internal:7443"), ("gw.internal".into(), 7443));
        assert_eq!(ok("https://gw.internal"), ("gw.internal".into(), 443));
        assert_eq!(ok("https://[::1]:9/"), ("::1".into(), 9));
        for bad in ["http://gw:1", "gw:1", "https://gw:1/x", "https://:1", ""] {
            let e = parse_gateway(bad).expect_err(bad).to_string();
            assert!(e.starts_with("--gateway"), "{e}");
        }
    }

    /// A parked pod's relay (its pod's token, refused `invalid` until adopted) waits for
    /// its adoption; a minted credential refused, or any other failure, backs off.
    #[test]
    fn an_unadopted_pods_relay_waits_and_everything_else_backs_off() {
        let refused = || anyhow::Error::from(DialError::Refused(Refused::Invalid));
        let pod_token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJwb2QifQ.sig";
        assert!(refused_unadopted(&refused(), pod_token));
        let wrapped = refused().context("control connection");
        assert!(refused_unadopted(&wrapped, pod_token));
        let minted = "tgr1.s1.91000.n.m";
        assert!(super::super::credential::is_minted(minted));
        assert!(!refused_unadopted(&refused(), minted));
        let unavailable = anyhow::Error::from(DialError::Refused(Refused::Unavailable));
        assert!(!refused_unadopted(&unavailable, pod_token));
        let io = anyhow::anyhow!("connection refused");
        assert!(!refused_unadopted(&io, pod_token));
        assert!(WAIT_ANSWER_TIMEOUT > wire::ADOPTION_WAIT_HOLD + DIAL_TIMEOUT);
    }

    #[test]
    fn renewal_waits_two_thirds_of_what_is_left() {
        let c = |s: &str| SecretString::from(s.to_owned());
        assert_eq!(
            renew_wait(&c("tgr1.s1.91000.n.m"), 1_000),
            Duration::from_secs(60)
        );
        assert_eq!(renew_wait(&c("tgr1.s1.500.n.m"), 1_000), MIN_RENEW_WAIT);
        assert_eq!(renew_wait(&c("garbage"), 1_000), MIN_RENEW_WAIT);
    }

    #[test]
    fn secrets_are_written_read_only_and_a_path_name_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let secrets = vec![(
            "stripe_api_key".to_owned(),
            SecretString::from("fake_key_1".to_owned()),
        )];
        write_secrets(dir.path(), &secrets).expect("written");
        // Written again (a restarted relay): replaced, still read-only.
        write_secrets(dir.path(), &secrets).expect("written again");
        let path = dir.path().join("stripe_api_key");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "fake_key_1");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        for bad in ["..", ".hidden", "a/b"] {
            let e = write_secrets(
                dir.path(),
                &[(bad.to_owned(), SecretString::from("fake_key_2".to_owned()))],
            )
            .expect_err(bad)
            .to_string();
            assert!(e.contains(bad) && !e.contains("fake_key_2"), "{e}");
        }
    }
}
