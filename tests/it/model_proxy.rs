//! The model proxy end to end: a real threadgate (as in `gateway_e2e`) whose
//! `[model]` upstream is the scripted model server, driven over a session's unix socket
//! as the runner drives it: both adapters, budgets and their note, the secret scan,
//! retries, malformed answers, the model check, and the transcript.
//!
//! Needs `.venv-peers`: run `scripts/localstripe.sh setup` once.

use crate::support;

#[path = "model_proxy/adapters.rs"]
mod adapters;
#[path = "model_proxy/budget.rs"]
mod budget;
#[path = "model_proxy/failures.rs"]
mod failures;
#[path = "model_proxy/lease_fence.rs"]
mod lease_fence;
#[path = "model_proxy/limits.rs"]
mod limits;
#[path = "model_proxy/memory.rs"]
mod memory;
#[path = "model_proxy/reservation.rs"]
mod reservation;
#[path = "model_proxy/transcript.rs"]
mod transcript;

use serde_json::{Value, json};
use threadgate::model::Provider;
use threadgate::model::scripted::ScriptedModel;

use support::unix_http::unix_request;
use support::world::{Session, World};

/// The model key threadgate holds; never sent anywhere but the upstream.
pub(crate) const MODEL_KEY: &str = "sk-model-e2e-4f1c9a7d2b6e8035";

/// A world whose model upstream is a fresh scripted server.
pub(crate) struct ModelWorld {
    pub world: World,
    pub model: ScriptedModel,
}

impl ModelWorld {
    /// A world under the repository's policy and agents, its model on `provider`.
    pub(crate) async fn new(provider: Provider) -> ModelWorld {
        let mut world = World::new().await;
        let model = world.use_scripted_model(provider, MODEL_KEY).await;
        ModelWorld { world, model }
    }

    /// Uses a copy of `agents/support.md` with these limits.
    pub(crate) fn with_limits(mut self, max_tokens: u64, max_turns: u64) -> ModelWorld {
        self.world.limit_agent(max_tokens, max_turns);
        self
    }
}

/// The session's gateway tools as OpenAI function tools (as the runner offers them).
pub(crate) async fn offered_tools(session: &Session) -> Vec<Value> {
    let (status, body) = session.get("/v1/tools").await;
    assert_eq!(status, 200);
    body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            let props: serde_json::Map<String, Value> = t["args"]
                .as_array()
                .expect("args")
                .iter()
                .map(|a| {
                    (
                        a["name"].as_str().expect("name").to_owned(),
                        json!({"type": "string"}),
                    )
                })
                .collect();
            json!({"type": "function", "function": {
                "name": t["name"], "description": "a gateway tool",
                "parameters": {"type": "object", "properties": props},
            }})
        })
        .collect()
}

/// `POST /v1/model/chat/completions` with `messages` and the session's tools.
pub(crate) async fn chat(session: &Session, messages: Value) -> (u16, Value) {
    let body = json!({"messages": messages, "tools": offered_tools(session).await});
    chat_raw(session, &body).await
}

/// `POST /v1/model/chat/completions` with exactly `body`.
pub(crate) async fn chat_raw(session: &Session, body: &Value) -> (u16, Value) {
    unix_request(
        &session.socket,
        "POST",
        "/v1/model/chat/completions",
        Some(body),
    )
    .await
}

/// A conversation opening with the customer's `text`.
/// Asserts a model call failed upstream (502 `upstream_error`) with `why` in its message.
pub(crate) fn assert_upstream_error(status: u16, body: &Value, why: &str) {
    assert_eq!(
        (status, body["error"].as_str()),
        (502, Some("upstream_error")),
        "{body}"
    );
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains(why), "{why}: {body}");
}

pub(crate) fn customer_says(text: &str) -> Value {
    json!([
        {"role": "system", "content": "You are the support agent."},
        {"role": "user", "content": text},
    ])
}

/// The first tool call of an answer: (name, arguments text).
pub(crate) fn first_call(answer: &Value) -> (String, String) {
    let call = &answer["choices"][0]["message"]["tool_calls"][0]["function"];
    (
        call["name"].as_str().unwrap_or_default().to_owned(),
        call["arguments"].as_str().unwrap_or_default().to_owned(),
    )
}
