//! The webhook intake alone: `threadgate::webhook::router` on 127.0.0.1:0 with its own
//! SQLite file, a clock fixed at a given instant, and the notification channel the
//! application would consume kept here, so a test sees every notification the intake
//! sends. The whole application is [`super::app::spawn_app`]; this is the intake's
//! own, smaller surface, for the tests of its edge cases.

use std::path::PathBuf;

use serde_json::Value;
use threadgate::store::Db;
use threadgate::webhook::{IntakeConfig, IntakeState, SigningSecret, StoredEvent, router, sign};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc::{self, UnboundedReceiver};

/// A served intake router.
pub struct IntakeApp {
    /// `http://127.0.0.1:PORT/webhooks/plain`.
    pub url: String,
    pub addr: std::net::SocketAddr,
    pub db: Db,
    pub db_path: PathBuf,
    pub secret: Vec<u8>,
    pub client: reqwest::Client,
    events: UnboundedReceiver<StoredEvent>,
    _dir: tempfile::TempDir,
}

/// A stored event row, as the orchestrator would read it.
#[derive(Debug, PartialEq)]
pub struct EventRow {
    pub event_id: String,
    pub event_type: String,
    pub class: String,
    pub thread_id: Option<String>,
    pub thread_status: Option<String>,
    pub customer_id: Option<String>,
    pub customer_email: Option<String>,
    pub actor: String,
}

/// Serves the intake router signed with `secret`, its clock fixed at `now_ms`;
/// `configure` may change the limits.
pub async fn spawn_intake(
    secret: &[u8],
    now_ms: i64,
    configure: impl FnOnce(&mut IntakeConfig),
) -> IntakeApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_path = dir.path().join("state.db");
    let db = Db::open(&db_path).expect("open db");
    serve_intake(db, dir, db_path, secret, now_ms, configure).await
}

/// As [`spawn_intake`], storing in `db` (a Postgres pool: one instance's intake);
/// `db_path` then names nothing.
pub async fn spawn_intake_on(db: Db, secret: &[u8], now_ms: i64) -> IntakeApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_path = dir.path().join("unused.db");
    serve_intake(db, dir, db_path, secret, now_ms, |_| {}).await
}

async fn serve_intake(
    db: Db,
    dir: tempfile::TempDir,
    db_path: PathBuf,
    secret: &[u8],
    now_ms: i64,
    configure: impl FnOnce(&mut IntakeConfig),
) -> IntakeApp {
    let mut config = IntakeConfig::new(SigningSecret::new(secret).expect("secret"));
    configure(&mut config);
    let (notify, events) = mpsc::unbounded_channel();
    let state = IntakeState {
        db: db.clone(),
        config,
        clock: threadgate::clock::Clock::fixed(now_ms),
        notify,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(listener, router(state)).await.expect("serve");
    });
    IntakeApp {
        url: format!("http://{addr}/webhooks/plain"),
        addr,
        db,
        db_path,
        secret: secret.to_vec(),
        client: reqwest::Client::new(),
        events,
        _dir: dir,
    }
}

impl IntakeApp {
    /// Posts `body` with `signature` as `Plain-Request-Signature` (none if `None`).
    pub async fn post(&self, body: Vec<u8>, signature: Option<String>) -> (u16, Value) {
        let mut request = self.client.post(&self.url).body(body);
        if let Some(signature) = signature {
            request = request.header("Plain-Request-Signature", signature);
        }
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    /// Posts `body` signed with the intake's secret.
    pub async fn post_signed(&self, body: Vec<u8>) -> (u16, Value) {
        let signature = sign(&self.secret, &body);
        self.post(body, Some(signature)).await
    }

    /// Every stored event, in order.
    pub async fn rows(&self) -> Vec<EventRow> {
        self.db
            .read(|c| {
                let mut s = c.prepare(
                    "SELECT event_id, event_type, class, thread_id, thread_status, customer_id, \
                     customer_email, actor FROM events ORDER BY seq",
                )?;
                let rows = s.query_map((), |r| {
                    Ok(EventRow {
                        event_id: r.get(0)?,
                        event_type: r.get(1)?,
                        class: r.get(2)?,
                        thread_id: r.get(3)?,
                        thread_status: r.get(4)?,
                        customer_id: r.get(5)?,
                        customer_email: r.get(6)?,
                        actor: r.get(7)?,
                    })
                })?;
                rows.collect()
            })
            .await
            .expect("read rows")
    }

    /// How many events are stored.
    pub async fn row_count(&self) -> i64 {
        self.db
            .read(|c| c.query_row("SELECT count(*) FROM events", (), |r| r.get(0)))
            .await
            .expect("count")
    }

    /// Every notification sent so far (each is sent before its 200).
    pub fn notifications(&mut self) -> Vec<StoredEvent> {
        let mut out = Vec::new();
        while let Ok(event) = self.events.try_recv() {
            out.push(event);
        }
        out
    }

    /// Sends raw HTTP/1.1 and returns the status code of the answer.
    pub async fn raw_status(&self, head: &str, body: &[u8]) -> u16 {
        let mut stream = TcpStream::connect(self.addr).await.expect("connect");
        stream.write_all(head.as_bytes()).await.expect("head");
        // The server may answer and close before reading everything: ignore write errors.
        let _ = stream.write_all(body).await;
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer);
        answer
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"))
    }
}
