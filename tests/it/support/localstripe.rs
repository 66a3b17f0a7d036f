//! localstripe for integration tests: a real stateful Stripe fake (PyPI `localstripe`,
//! run through `shared/peers/localstripe_plus.py`) started on a free port for one test
//! and killed when the handle drops.
//!
//! Needs `.venv-peers` at the repository root: `scripts/localstripe.sh setup` creates it.
//! `localstripe_plus.py` is found in `$THREADGATE_SHARED/peers`, else in the first
//! `shared/peers` beside the repository or one of its parents.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::plain::shared_dir;

/// A key localstripe accepts (any `sk_…` key does).
pub const TEST_KEY: &str = "sk_test_threadgate_localstripe_4f9c2";

/// A running localstripe, killed on drop. Its state file is its own (in a temporary
/// directory removed on drop), never localstripe's shared `/tmp/localstripe.pickle`.
pub struct LocalStripe {
    child: Child,
    port: u16,
    http: reqwest::Client,
    state: tempfile::TempDir,
}

impl LocalStripe {
    /// Starts localstripe on a free loopback port and waits until it answers. The port
    /// is free when chosen but another process (a test starting its own localstripe) can
    /// take it before localstripe binds it; an instance that exits at once is started
    /// again on another port, a few times.
    pub fn start() -> Self {
        const ATTEMPTS: usize = 5;
        for attempt in 1..=ATTEMPTS {
            let mut stripe = Self::spawn();
            match stripe.wait_until_ready() {
                Ok(()) => return stripe,
                Err(status) if attempt < ATTEMPTS => {
                    eprintln!("localstripe exited before answering ({status}); another port");
                }
                Err(status) => {
                    panic!("localstripe exited before answering, {ATTEMPTS} times: {status}")
                }
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    fn spawn() -> Self {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let python = repo.join(".venv-peers/bin/python");
        assert!(
            python.exists(),
            "localstripe is not installed: run `scripts/localstripe.sh setup` \
             (it creates .venv-peers at the repository root)"
        );
        let script = shared_dir().join("peers/localstripe_plus.py");
        assert!(
            script.exists(),
            "{} not found: set THREADGATE_SHARED to the shared/ directory",
            script.display()
        );
        let port = free_port();
        let state = tempfile::Builder::new()
            .prefix("localstripe-")
            .tempdir()
            .expect("localstripe state directory");
        let child = Command::new(&python)
            .env("LOCALSTRIPE_PICKLE", state.path().join("state.pickle"))
            .arg(repo.join("scripts/localstripe_isolated.py"))
            .arg(&script)
            .args(["--port", &port.to_string(), "--from-scratch"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", python.display()));
        Self {
            child,
            port,
            http: reqwest::Client::new(),
            state,
        }
    }

    /// The file this instance keeps its state in.
    pub fn state_file(&self) -> PathBuf {
        self.state.path().join("state.pickle")
    }

    /// The base URL to give the connector.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until localstripe answers; `Err` with its exit status when it exits first.
    fn wait_until_ready(&mut self) -> Result<(), std::process::ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(status);
            }
            if answers(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "localstripe did not answer on port {} within 30 s",
            self.port
        );
    }

    /// `POST /v1/<path>` with form pairs; panics unless localstripe answers 2xx.
    pub async fn post(&self, path: &str, form: &[(&str, &str)]) -> Value {
        let request = self
            .http
            .post(format!("{}/v1/{path}", self.base_url()))
            .bearer_auth(TEST_KEY)
            .form(form);
        self.expect_ok(request).await
    }

    /// `GET /v1/<path>`; panics unless localstripe answers 2xx.
    pub async fn get(&self, path: &str) -> Value {
        let request = self
            .http
            .get(format!("{}/v1/{path}", self.base_url()))
            .bearer_auth(TEST_KEY);
        self.expect_ok(request).await
    }

    async fn expect_ok(&self, request: reqwest::RequestBuilder) -> Value {
        let response = request.send().await.expect("localstripe request");
        let status = response.status();
        let body: Value = response.json().await.expect("localstripe json");
        assert!(status.is_success(), "localstripe answered {status}: {body}");
        body
    }

    /// A customer with `email` and a Visa test card as default source.
    pub async fn create_customer(&self, email: &str) -> String {
        let customer = self
            .post(
                "customers",
                &[
                    ("email", email),
                    ("source[object]", "card"),
                    ("source[number]", "4242424242424242"),
                    ("source[exp_month]", "12"),
                    ("source[exp_year]", "2030"),
                    ("source[cvc]", "123"),
                ],
            )
            .await;
        id_of(&customer)
    }

    /// A succeeded charge of `amount` on the customer's card.
    pub async fn create_charge(&self, customer: &str, amount: u64, currency: &str) -> String {
        let amount = amount.to_string();
        let charge = self
            .post(
                "charges",
                &[
                    ("customer", customer),
                    ("amount", &amount),
                    ("currency", currency),
                ],
            )
            .await;
        id_of(&charge)
    }

    /// A monthly plan with id `plan_id`.
    pub async fn create_plan(&self, plan_id: &str, amount: u64) -> String {
        let amount = amount.to_string();
        let plan = self
            .post(
                "plans",
                &[
                    ("id", plan_id),
                    ("amount", &amount),
                    ("currency", "usd"),
                    ("interval", "month"),
                    ("product[name]", plan_id),
                ],
            )
            .await;
        id_of(&plan)
    }

    /// A subscription of the customer to `plan`.
    pub async fn create_subscription(&self, customer: &str, plan: &str) -> String {
        let subscription = self
            .post(
                "subscriptions",
                &[("customer", customer), ("items[0][plan]", plan)],
            )
            .await;
        id_of(&subscription)
    }
}

impl Drop for LocalStripe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn id_of(object: &Value) -> String {
    object["id"]
        .as_str()
        .unwrap_or_else(|| panic!("localstripe object without id: {object}"))
        .to_owned()
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

fn answers(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!(
        "GET /v1/customers HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TEST_KEY}\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    // aiohttp answers in the request's version: `HTTP/1.0 200 OK`.
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && head.ends_with(b" 200")
}
