//! The one way a test runs threadgate: [`spawn_app`] builds the real `Application` from
//! `Settings` and `Overrides` (a fake sandbox or real Docker, an injected clock) on port
//! 0, serves it on a runtime of its own, and answers a [`TestApp`]. Its own runtime lets a
//! test crash it ([`TestApp::crash`]: every task stops at once while containers and the
//! database file stay) as well as stop it cleanly ([`TestApp::stop`]).
//!
//! The worlds ([`super::world`], [`super::sessions`], [`super::agent`]) only make the
//! settings; every one of them starts its app here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use threadgate::secrets::ExposeSecret as _;

use serde_json::{Value, json};
use threadgate::app::{Application, Overrides};
use threadgate::config::Settings;
use threadgate::gateway::Gate;
use threadgate::session::SupervisorHandle;
use threadgate::store::Db;

use super::logs;

/// A served application. [`TestApp::stop`] shuts it down cleanly, [`TestApp::crash`] as a
/// crash would; dropping it is a crash too.
pub struct TestApp {
    /// The people's listener (webhooks, approvals, the review page), on 127.0.0.1.
    pub addr: SocketAddr,
    /// The metrics listener, when the settings turn it on.
    pub metrics_addr: Option<SocketAddr>,
    /// The relay listener, when the settings turn it on.
    pub relay_addr: Option<SocketAddr>,
    /// What mints the sessions' relay credentials.
    pub relay_credentials: Arc<threadgate::relay::RelayCredentials>,
    pub db: Db,
    pub gate: Arc<Gate>,
    /// The reviewers' password-hashing pool of this application.
    pub hasher: Arc<threadgate::reviewers::hasher::Hasher>,
    pub supervisor: SupervisorHandle,
    /// An HTTP client for the tests' requests.
    pub http: reqwest::Client,
    signing_secret: Vec<u8>,
    recovered: tokio::sync::watch::Receiver<bool>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// Builds the real application from `settings` and `overrides` on a runtime of its own
/// and serves it until the answer is stopped, crashed or dropped.
pub async fn spawn_app(settings: Settings, overrides: Overrides) -> TestApp {
    logs::capture_logs();
    let signing_secret = settings
        .plain
        .signing_secret
        .as_ref()
        .map(|s| s.expose_secret().as_bytes().to_vec())
        .unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("threadgate-app")
        .enable_all()
        .build()
        .expect("app runtime");
    let (built_tx, built_rx) = tokio::sync::oneshot::channel();
    let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = runtime.spawn(async move {
        let app = match Application::build(settings, overrides).await {
            Ok(app) => app,
            Err(e) => {
                let _ = built_tx.send(Err(format!("{e:#}")));
                return Ok(());
            }
        };
        let parts = (
            (app.addr, app.metrics_addr, app.relay_addr),
            app.relay_credentials.clone(),
            app.db.clone(),
            app.gate.clone(),
            app.hasher.clone(),
            app.supervisor.clone(),
            app.recovered.clone(),
        );
        let _ = built_tx.send(Ok(parts));
        app.run_until(async move {
            let _ = stopped.await;
        })
        .await
    });
    let (
        (addr, metrics_addr, relay_addr),
        relay_credentials,
        db,
        gate,
        hasher,
        supervisor,
        recovered,
    ) = built_rx
        .await
        .expect("the app task answers")
        .unwrap_or_else(|e| panic!("cannot build the application: {e}"));
    let addr = if addr.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], addr.port()))
    } else {
        addr
    };
    TestApp {
        addr,
        metrics_addr,
        relay_addr,
        relay_credentials,
        db,
        gate,
        hasher,
        supervisor,
        http: reqwest::Client::new(),
        signing_secret,
        recovered,
        shutdown: Some(shutdown),
        task: Some(task),
        runtime: Some(runtime),
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl TestApp {
    /// Shuts the application down and waits until it has stopped serving.
    /// Waits until `thread`'s session is no longer running (stopped or ended).
    pub async fn session_stops(&self, thread: &str) {
        super::wait::eventually("the session stops", || async {
            let t = threadgate::ids::ThreadId::parse(thread).expect("thread id");
            let row = self
                .db
                .read(move |c| threadgate::session::store::get(c, &t))
                .await
                .expect("read");
            row.is_none_or(|r| r.state != threadgate::session::SessionState::Running)
        })
        .await;
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        logs::dump_if_asked();
    }

    /// Kills the app as a crash would: every task stops, nothing is shut down cleanly.
    pub fn crash(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Waits until the calls an earlier run left behind have been recovered (or there
    /// were none): after this, recovery will not touch another execution.
    pub async fn recovered(&self) {
        let mut recovered = self.recovered.clone();
        let done = tokio::time::timeout(Duration::from_secs(30), recovered.wait_for(|d| *d))
            .await
            .expect("recovery finishes within 30 s");
        done.expect("the recovery task ended without finishing");
    }

    /// Posts `body` to `/webhooks/plain`, signed with the app's signing secret by the
    /// library's own signer; answers the status and the JSON body.
    pub async fn deliver(&self, body: &[u8]) -> (u16, Value) {
        let signature = threadgate::webhook::sign(&self.signing_secret, body);
        let response = self
            .http
            .post(format!("http://{}/webhooks/plain", self.addr))
            .header("Plain-Request-Signature", signature)
            .header("Content-Type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .expect("webhook request");
        let status = response.status().as_u16();
        let json = response.json().await.unwrap_or(Value::Null);
        (status, json)
    }

    /// As [`TestApp::deliver`], answering the status alone.
    pub async fn send_webhook(&self, body: &[u8]) -> u16 {
        self.deliver(body).await.0
    }

    /// A reviewer's decision: `POST /api/approvals/{id}` on the people's listener.
    pub async fn decide(
        &self,
        execution_id: &str,
        token: &str,
        decision: &str,
        message: &str,
    ) -> (u16, Value) {
        let response = self
            .http
            .post(format!("http://{}/api/approvals/{execution_id}", self.addr))
            .bearer_auth(token)
            .json(&json!({"decision": decision, "message": message}))
            .send()
            .await
            .expect("approval request");
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    /// Creates a reviewer and returns its token.
    pub async fn add_reviewer(&self, name: &str) -> String {
        let created = threadgate::reviewers::add(&self.db, name)
            .await
            .expect("add reviewer");
        created.token.expose_secret().to_owned()
    }
}
