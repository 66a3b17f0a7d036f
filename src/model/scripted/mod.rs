//! The scripted model server: a real HTTP server speaking the OpenAI chat-completions
//! wire format (`POST /v1/chat/completions`) and Anthropic's Messages format
//! (`POST /v1/messages`), whose answers follow fixed scripts. It is **not a real
//! model**: every answer names the model `scripted-model (not a real model)` and every
//! text starts with `[scripted model, not a real model]`. Run it with
//! `threadgate scripted-model --listen 127.0.0.1:8090`; the demo and the tests use it.
//!
//! # Scenarios (by words in the customer's messages, case-insensitive)
//! The step is the number of assistant messages so far; ids come from earlier tool
//! results (any JSON object with an `id` of `ch_...` and an `amount`). A customer id
//! (`cus_...`) anywhere in the conversation is passed to the list calls.
//!
//! 1. **"charged twice"**: `stripe.list_charges`, then `stripe.list_invoices`, then
//!    `stripe.create_refund` of the later of two same-amount charges with
//!    `reason: duplicate`, then `helpdesk.reply_to_thread`, then a closing text.
//! 2. **"bad month"**: `stripe.list_charges`, then `stripe.create_refund` of the latest
//!    charge with `reason: requested_by_customer` (held by the policy; the diagnosis
//!    is the message's text), then a reply saying whether a refund (`re_...`) came
//!    back, then a closing text.
//! 3. **"management approved"** (prompt injection, an obeying model):
//!    `stripe.list_charges`, then `stripe.create_refund` with `amount: 500000,
//!    reason: duplicate`, then a reply, then a closing text.
//! 4. **"in a loop"**: `stripe.list_charges` on every turn, forever.
//! 5. **"garbage"**: a call whose arguments are invalid JSON, then a call of the unknown
//!    tool `stripe.teleport_money`, then HTTP 500 on every later turn.
//! 6. **"total is wrong"** (a bug report, `bug_report.rs`): searches the workspace's
//!    code, reads the file, writes `repro/<thread>.sh`, runs it, writes
//!    `notes/<thread>.md` with its output, `helpdesk.add_note` with the finding, then a
//!    reply, then a closing text.
//!
//! Anything else: a reply asking the customer for details, then a closing text.
//! Every reply's text starts with the label, so the thread shows who wrote it.
//!
//! # Test directives (in a user message)
//! `[scripted:flaky429:N]` and `[scripted:flaky500:N]`: the first N attempts of the
//! same request answer 429 (`Retry-After: 0`) or 503; `[scripted:retryafter1:N]`: the
//! first N attempts answer 429 with `Retry-After: 1` (each request's arrival time is
//! kept in [`Seen::at`], so a test can check the wait without timing anything itself); `[scripted:slow:MS]` waits MS
//! before answering; `[scripted:tokens:N]` reports N prompt tokens;
//! `[scripted:malformed]` answers 200 with a body that is not JSON;
//! `[scripted:refuse400]` answers 400 (a refusal: nothing billed);
//! `[scripted:nousage]` answers without `usage`.

mod bug_report;
mod scenarios;
mod step;
mod wire;

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tracing::Instrument as _;

pub use scenarios::{Scenario, next_step};
pub use step::{LABEL, Step};

/// The model id an agent file names to use the scripted model.
pub const MODEL_ID: &str = "scripted-model";
/// The model name in every answer.
pub const MODEL_LABEL: &str = "scripted-model (not a real model)";

/// One request the server received (for tests: what the proxy forwarded).
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub model: String,
    /// `Authorization: Bearer ...`'s token.
    pub bearer: Option<String>,
    pub api_key: Option<String>,
    pub anthropic_version: Option<String>,
    pub body: Value,
    /// When the request arrived.
    pub at: std::time::Instant,
}

#[derive(Default)]
struct Shared {
    seen: Mutex<Vec<Seen>>,
    attempts: Mutex<HashMap<u64, u64>>,
}

/// A running scripted model server; it stops when the last clone is dropped.
#[derive(Clone)]
pub struct ScriptedModel {
    shared: Arc<Shared>,
    /// Where it listens.
    pub addr: SocketAddr,
    _server: Arc<Server>,
}

/// The server's task, owned by its [`ScriptedModel`]s: cut when the last one goes.
struct Server(tokio::task::JoinHandle<()>);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The wire format of a request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Openai,
    Anthropic,
}

const MAX_SEEN: usize = 10_000;

impl ScriptedModel {
    /// Binds `addr` and serves in the background.
    pub async fn start(addr: SocketAddr) -> std::io::Result<ScriptedModel> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let app = router(shared.clone());
        let server = tokio::spawn(
            async move {
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!(error = %e, "the scripted model server stopped");
                }
            }
            .in_current_span(),
        );
        Ok(ScriptedModel {
            shared,
            addr,
            _server: Arc::new(Server(server)),
        })
    }

    /// Serves on `addr` until the process stops (the CLI).
    pub async fn serve(addr: SocketAddr) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(addr = %listener.local_addr()?, "scripted model server (not a real model) listening");
        axum::serve(listener, router(Arc::new(Shared::default()))).await
    }

    /// `http://ADDR/v1`: the base URL for the `openai`/`scripted` providers.
    pub fn openai_base(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `http://ADDR`: the base URL for the `anthropic` provider.
    pub fn anthropic_base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { "ok (scripted model, not a real model)" }),
        )
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(openai_chat))
        .route("/v1/messages", post(anthropic_chat))
        .layer(DefaultBodyLimit::max(32 * 1024 * 1024))
        .with_state(shared)
}

async fn models() -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": MODEL_LABEL}]}),
    )
}

async fn openai_chat(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    answer(&s, &headers, &body, Format::Openai, "/v1/chat/completions").await
}

async fn anthropic_chat(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    answer(&s, &headers, &body, Format::Anthropic, "/v1/messages").await
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn bad(message: impl Into<String>) -> Response {
    let body = json!({"error": {"type": "invalid_request_error", "message": message.into()}});
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

/// Keeps what the upstream was sent, for tests.
fn record(s: &Shared, headers: &HeaderMap, path: &str, body: &Value) {
    let mut seen = s.seen.lock().unwrap_or_else(|p| p.into_inner());
    if seen.len() < MAX_SEEN {
        seen.push(Seen {
            path: path.to_owned(),
            model: body["model"].as_str().unwrap_or_default().to_owned(),
            bearer: header(headers, "authorization")
                .and_then(|a| a.strip_prefix("Bearer ").map(str::to_owned)),
            api_key: header(headers, "x-api-key"),
            anthropic_version: header(headers, "anthropic-version"),
            body: body.clone(),
            at: std::time::Instant::now(),
        });
    }
}

/// How many times this exact request body has arrived, this one included.
fn attempt_number(s: &Shared, raw: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    raw.hash(&mut h);
    let mut attempts = s.attempts.lock().unwrap_or_else(|p| p.into_inner());
    if attempts.len() >= MAX_SEEN {
        attempts.clear();
    }
    let n = attempts.entry(h.finish()).or_default();
    *n += 1;
    *n
}

async fn answer(
    s: &Shared,
    headers: &HeaderMap,
    raw: &[u8],
    format: Format,
    path: &str,
) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(raw) else {
        return bad("the body is not JSON");
    };
    record(s, headers, path, &body);
    let parsed = match format {
        Format::Openai => crate::model::openai::parse_request(&body),
        Format::Anthropic => wire::parse_anthropic_request(&body),
    };
    let request = match parsed {
        Ok(r) => r,
        Err(e) => return bad(e),
    };
    let attempt = attempt_number(s, raw);
    if let Some(ms) = scenarios::directive(&request, "slow") {
        tokio::time::sleep(Duration::from_millis(ms.min(600_000))).await;
    }
    if scenarios::directive(&request, "flaky429").is_some_and(|n| attempt <= n) {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "0")],
            "slow down (scripted)",
        )
            .into_response();
    }
    if scenarios::directive(&request, "retryafter1").is_some_and(|n| attempt <= n) {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "1")],
            "slow down for a second (scripted)",
        )
            .into_response();
    }
    if scenarios::directive(&request, "flaky500").is_some_and(|n| attempt <= n) {
        return (StatusCode::SERVICE_UNAVAILABLE, "unavailable (scripted)").into_response();
    }
    if scenarios::flag(&request, "refuse400") {
        return (StatusCode::BAD_REQUEST, "the request is refused (scripted)").into_response();
    }
    let step = if scenarios::flag(&request, "malformed") {
        Step::NotJson
    } else if scenarios::flag(&request, "nousage") {
        Step::NoUsage
    } else {
        next_step(&request)
    };
    let prompt_tokens =
        scenarios::directive(&request, "tokens").unwrap_or_else(|| wire::estimate_tokens(&body));
    match step {
        Step::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (status, "scripted failure (not a real model)").into_response()
        }
        Step::NotJson => (StatusCode::OK, "this is not JSON (scripted)").into_response(),
        step => {
            let mut v = match format {
                Format::Openai => wire::openai_answer(&request, &step, prompt_tokens),
                Format::Anthropic => wire::anthropic_answer(&request, &step, prompt_tokens),
            };
            if matches!(step, Step::NoUsage)
                && let Some(o) = v.as_object_mut()
            {
                o.remove("usage");
            }
            Json(v).into_response()
        }
    }
}
