//! The tool-call half of the sandbox API: `POST /v1/calls`, `GET /v1/tools`,
//! `GET /v1/executions/{id}` and its long-poll `.../wait`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use threadgate_api::{ToolEntry, ToolListing};

use super::answers;
pub use super::answers::{agent_view, rfc3339};
use super::gate::{CallReply, CallRequest, Gate};
use super::socket::SandboxRouter;
use super::wait::{self, ExecutionWatch, Unreported, WaitError};
use crate::api_error::ApiError;
use crate::session::SessionScope;

/// The longest an execution wait lasts.
const MAX_WAIT: Duration = Duration::from_secs(60);

#[derive(Clone)]
struct Scoped {
    gate: Arc<Gate>,
    scope: SessionScope,
}

impl SandboxRouter for Arc<Gate> {
    fn router(&self, scope: SessionScope) -> Router {
        Router::new()
            .route("/v1/calls", post(call))
            .route("/v1/tools", get(tools))
            .route("/v1/executions/{id}", get(execution))
            .route("/v1/executions/{id}/wait", get(wait))
            .with_state(Scoped {
                gate: self.clone(),
                scope,
            })
    }
}

async fn call(State(s): State<Scoped>, body: Result<Json<CallRequest>, JsonRejection>) -> Response {
    s.gate.supervisor().touch(&s.scope.thread_id);
    let req = match body {
        Ok(Json(req)) => req,
        Err(rejection) => {
            return ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                rejection.body_text(),
            )
            .into_response();
        }
    };
    // Only catalog names become a label: an agent cannot mint series.
    let tool = match s.gate.catalog().get(&req.tool) {
        Some(_) => req.tool.clone(),
        None => "unknown".to_owned(),
    };
    let reply = s.gate.call_to_the_end(&s.scope, req).await;
    let (decision, execution_id) = outcome(&reply);
    crate::metrics::tool_call(&tool, decision);
    tracing::info!(
        thread_id = %s.scope.thread_id,
        session_id = %s.scope.session_id,
        execution_id = %execution_id.unwrap_or("-"),
        tool = %tool,
        decision,
        "tool call answered"
    );
    reply_response(reply)
}

/// The gate's answer as HTTP ([`answers::call_answer`]).
fn reply_response(reply: CallReply) -> Response {
    let (status, answer) = answers::call_answer(reply);
    (status, Json(answer)).into_response()
}

/// The decision label of a reply, and its execution id when it has one.
fn outcome(reply: &CallReply) -> (&'static str, Option<&str>) {
    match reply {
        CallReply::Ran {
            execution_id,
            replayed: true,
            ..
        } => ("replayed", Some(execution_id)),
        CallReply::Ran { execution_id, .. } => ("ran", Some(execution_id)),
        CallReply::Failed { execution_id, .. } => ("failed", Some(execution_id)),
        CallReply::Held { execution, .. } => ("held", Some(&execution.id)),
        CallReply::Blocked { execution_id, .. } => ("blocked", Some(execution_id)),
        CallReply::Refused { .. } => ("refused", None),
    }
}

/// `GET /v1/tools`: the tools the session's agent is granted, without those the policy
/// blocks outright, with their descriptions and argument values (`tool_docs`).
async fn tools(State(s): State<Scoped>) -> Response {
    let Some(offered) = s.gate.offered_tools(&s.scope.agent) else {
        return Json(ToolListing::default()).into_response();
    };
    let tools = offered
        .into_iter()
        .map(|t| ToolEntry {
            args: t
                .args
                .iter()
                .map(|a| super::tool_docs::arg_listing(t, a))
                .collect(),
            description: super::tool_docs::tool_description(t.name).map(str::to_owned),
            name: t.name.to_owned(),
            risk: t.risk.as_str().to_owned(),
        })
        .collect();
    Json(ToolListing { tools }).into_response()
}

/// A [`WaitError`] as the API's error answer.
fn wait_error(e: WaitError) -> Response {
    match e {
        WaitError::NotFound => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", e.to_string()).into_response()
        }
        WaitError::Internal => ApiError::internal().into_response(),
    }
}

async fn execution(State(s): State<Scoped>, Path(id): Path<String>) -> Response {
    match wait::load(&s.gate, &s.scope.session_id, &id).await {
        Ok(e) => Json(agent_view(&e)).into_response(),
        Err(e) => wait_error(e),
    }
}

#[derive(Deserialize)]
struct WaitQuery {
    #[serde(default = "default_wait")]
    timeout: u64,
}

fn default_wait() -> u64 {
    30
}

/// Waits until the execution is final (ran, failed, denied with the person's message,
/// blocked), its approval runs out (`expired`), or the timeout passes, then answers as
/// `GET /v1/executions/{id}` ([`ExecutionWatch::settle`], as MCP's `threadgate_wait`).
async fn wait(
    State(s): State<Scoped>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
) -> Response {
    let timeout = Duration::from_secs(q.timeout).min(MAX_WAIT);
    let mut watch = ExecutionWatch::new(&s.gate, &s.scope.session_id);
    let settled = match watch.load(&id).await {
        Ok(e) => watch.settle(e, timeout, &mut Unreported).await,
        Err(e) => Err(e),
    };
    match settled {
        Ok(settled) => Json(settled.view()).into_response(),
        Err(e) => wait_error(e),
    }
}
