//! The relay in tests: certificates made here with `rcgen` (a CA and the gateway's
//! certificate for `localhost`), a world whose application serves the relay listener,
//! a `threadgate relay` run in-process for one session, and a raw client that speaks the
//! relay's greeting itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use threadgate::relay::{Relay, RelayOptions};
use threadgate::secrets::{ExposeSecret as _, SecretString};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

use super::app::TestApp;
use super::wait::wait_for;
use super::world::{Customer, Session, World};

/// A CA and a gateway certificate it signed, written as PEM files in `dir`.
pub struct TlsFiles {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TlsFiles {
    /// A fresh CA (`NAME-ca.pem`) and a certificate for `localhost` and 127.0.0.1 it
    /// signed (`NAME-cert.pem`, `NAME-key.pem`).
    pub fn make(dir: &Path, name: &str) -> TlsFiles {
        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("server key");
        let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("server params");
        let cert = params.signed_by(&key, &issuer).expect("server cert");
        let files = TlsFiles {
            ca_file: dir.join(format!("{name}-ca.pem")),
            cert_file: dir.join(format!("{name}-cert.pem")),
            key_file: dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&files.ca_file, ca_cert.pem()).expect("write ca");
        std::fs::write(&files.cert_file, cert.pem()).expect("write cert");
        std::fs::write(&files.key_file, key.serialize_pem()).expect("write key");
        files
    }
}

impl World {
    /// Turns the relay listener on (127.0.0.1, any port) with a certificate made here.
    pub fn use_relay(&mut self) -> TlsFiles {
        let tls = TlsFiles::make(self.dir.path(), "gateway");
        self.settings.relay.listen = Some("127.0.0.1:0".parse().expect("addr"));
        self.settings.relay.cert_file = Some(tls.cert_file.clone());
        self.settings.relay.key_file = Some(tls.key_file.clone());
        tls
    }
}

impl World {
    /// Ada (one 50.00 charge) and Bob (one 7.00 charge), each with a running session on
    /// `app`: the two customers the relay tests keep apart.
    pub async fn ada_and_bob(&self, app: &TestApp) -> (Customer, Customer) {
        let ada = self.customer_session(app, "ada@example.com", &[5000]).await;
        let bob = self.customer_session(app, "bob@example.com", &[700]).await;
        (ada, bob)
    }
}

/// A relay run in-process for one session; stopped when dropped.
pub struct RunningRelay {
    /// The socket it serves: what the agent in the pod connects to.
    pub socket: PathBuf,
    /// The file it read its credential from.
    pub token_file: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// How a test relay is started, beyond its session and the gateway.
pub struct RelaySetup<'a> {
    pub ca_file: &'a Path,
    pub credential: SecretString,
    pub secrets_dir: Option<PathBuf>,
    pub max_connections: usize,
    /// The pod's workspace (its volume and the relay's git directory), when the relay
    /// carries the session's workspace in and out.
    pub workspace: Option<threadgate::workspace::PodWorkspace>,
}

impl<'a> RelaySetup<'a> {
    /// The usual setup: a credential `app` minted for `session`, trusting `ca_file`, no
    /// secrets directory, the session socket's default connection cap. A test changes
    /// what it is about with `RelaySetup { field, ..RelaySetup::minted(..) }`.
    pub fn minted(app: &TestApp, ca_file: &'a Path, session: &Session) -> RelaySetup<'a> {
        let id = threadgate::ids::SessionId::parse(session.id.as_str()).expect("session id");
        RelaySetup {
            ca_file,
            credential: app.relay_credentials.mint(&id),
            secrets_dir: None,
            max_connections: 32,
            workspace: None,
        }
    }
}

impl RunningRelay {
    /// Starts a relay for `session` carrying to `app`'s relay listener, and waits until
    /// its socket exists.
    pub async fn start(
        app: &TestApp,
        dir: &Path,
        name: &str,
        setup: RelaySetup<'_>,
    ) -> RunningRelay {
        let relay_addr = app.relay_addr.expect("the relay listener is on");
        RunningRelay::start_at(relay_addr, dir, name, setup).await
    }

    /// [`RunningRelay::start`] with the session's workspace carried in and out through
    /// `workspace` (the pod's volume and the relay's git directory).
    pub async fn start_with(
        app: &TestApp,
        dir: &Path,
        name: &str,
        setup: RelaySetup<'_>,
        workspace: Option<threadgate::workspace::PodWorkspace>,
    ) -> RunningRelay {
        RunningRelay::start(app, dir, name, RelaySetup { workspace, ..setup }).await
    }

    /// A relay to `app` that presents `credential` (one minted elsewhere, expired, a
    /// pod's token), trusting `ca_file`, otherwise as [`RelaySetup::minted`].
    pub async fn presenting(
        app: &TestApp,
        dir: &Path,
        name: &str,
        ca_file: &Path,
        credential: SecretString,
    ) -> RunningRelay {
        let setup = RelaySetup {
            ca_file,
            credential,
            secrets_dir: None,
            max_connections: 32,
            workspace: None,
        };
        RunningRelay::start(app, dir, name, setup).await
    }

    /// As [`RunningRelay::start`], dialling `relay_addr` (as `localhost`).
    pub async fn start_at(
        relay_addr: std::net::SocketAddr,
        dir: &Path,
        name: &str,
        setup: RelaySetup<'_>,
    ) -> RunningRelay {
        let token_file = dir.join(format!("{name}.token"));
        std::fs::write(&token_file, setup.credential.expose_secret()).expect("write token");
        let socket = dir.join(format!("{name}.sock"));
        let relay = Relay::new(RelayOptions {
            listen: socket.clone(),
            gateway: format!("https://localhost:{}", relay_addr.port()),
            token_file: token_file.clone(),
            ca_file: setup.ca_file.to_owned(),
            secrets_dir: setup.secrets_dir,
            max_connections: setup.max_connections,
            workspace: setup.workspace,
            workspace_limits: threadgate::workspace::BundleLimits::default(),
        })
        .expect("the relay starts");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(relay.run(async move {
            let _ = stopped.await;
        }));
        let bound = wait_for(Duration::from_secs(20), || async {
            socket.exists().then_some(())
        })
        .await;
        assert!(bound.is_some(), "the relay's socket did not appear");
        RunningRelay {
            socket,
            token_file,
            stop: Some(stop),
            task,
        }
    }

    /// The session as its agent in the pod drives it: through the relay's socket.
    pub fn session(&self, of: &Session) -> Session {
        Session {
            socket: self.socket.clone(),
            ..of.clone()
        }
    }

    /// Stops the relay and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let ran = tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("the relay stops");
        ran.expect("the relay task").expect("the relay ran");
    }
}

impl Drop for RunningRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A connection to the relay listener that has sent `greeting` (a whole line, newline
/// included) and read the answer line: the answer, and the stream for more.
pub async fn greet(
    app: &TestApp,
    ca_file: &Path,
    greeting: &str,
) -> (
    String,
    BufReader<tokio_rustls::client::TlsStream<TcpStream>>,
) {
    greet_at(app.relay_addr.expect("relay listener"), ca_file, greeting).await
}

/// As [`greet`], to the relay listener at `addr`.
pub async fn greet_at(
    addr: std::net::SocketAddr,
    ca_file: &Path,
    greeting: &str,
) -> (
    String,
    BufReader<tokio_rustls::client::TlsStream<TcpStream>>,
) {
    let mut stream = tls_connect_at(addr, ca_file)
        .await
        .expect("TLS to the relay listener");
    stream
        .write_all(greeting.as_bytes())
        .await
        .expect("send greeting");
    stream.flush().await.expect("flush");
    let mut answer = String::new();
    stream.read_line(&mut answer).await.expect("read answer");
    (answer, stream)
}

/// TLS to the relay listener, trusting `ca_file`.
pub async fn tls_connect(
    app: &TestApp,
    ca_file: &Path,
) -> std::io::Result<BufReader<tokio_rustls::client::TlsStream<TcpStream>>> {
    tls_connect_at(app.relay_addr.expect("relay listener"), ca_file).await
}

/// TLS to the relay listener at `addr` (as `localhost`), trusting `ca_file`.
pub async fn tls_connect_at(
    addr: std::net::SocketAddr,
    ca_file: &Path,
) -> std::io::Result<BufReader<tokio_rustls::client::TlsStream<TcpStream>>> {
    tls_over(TcpStream::connect(addr).await?, ca_file).await
}

/// A TCP connection to `addr` from the local address `from` (any of 127.0.0.0/8 on
/// loopback: another client address for a listener's per-address cap).
pub async fn tcp_from(
    from: std::net::Ipv4Addr,
    addr: std::net::SocketAddr,
) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(from.into(), 0))?;
    socket.connect(addr).await
}

/// TLS (as `localhost`, trusting `ca_file`) over a connection to the relay listener.
pub async fn tls_over(
    tcp: TcpStream,
    ca_file: &Path,
) -> std::io::Result<BufReader<tokio_rustls::client::TlsStream<TcpStream>>> {
    let config = threadgate::relay::tls::client_config(ca_file).expect("client config");
    let tls = TlsConnector::from(Arc::clone(&config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await?;
    Ok(BufReader::new(tls))
}
