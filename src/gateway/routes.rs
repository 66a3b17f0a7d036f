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
use serde_json::{Value, json};

use super::gate::{CallReply, CallRequest, Gate};
use super::refusal::Refusal;
use super::socket::SandboxRouter;
use crate::api_error::ApiError;
use crate::executions::store::{self as exec_store, Execution, Status};
use crate::ids::ExecutionId;
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
    let reply = s.gate.call(&s.scope, req).await;
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

/// The gate's answer as HTTP: 200 ran, 502 failed, 202 held, 403 blocked, and a
/// refusal through [`ApiError`].
fn reply_response(reply: CallReply) -> Response {
    match reply {
        CallReply::Ran {
            execution_id,
            result,
            replayed,
        } => Json(json!({
            "status": "ok",
            "execution_id": execution_id,
            "result": result,
            "replayed": replayed,
        }))
        .into_response(),
        CallReply::Failed {
            execution_id,
            error,
            retry_after_ms,
        } => (
            StatusCode::BAD_GATEWAY,
            Json(json!({
                "status": "failed",
                "execution_id": execution_id,
                "error": error,
                "retry_after_ms": retry_after_ms,
            })),
        )
            .into_response(),
        CallReply::Held {
            execution,
            approval_url,
        } => (
            StatusCode::ACCEPTED,
            Json(json!({
                "status": "pending_approval",
                "execution_id": execution.id,
                "approval_url": approval_url,
                "approval_summary": execution.summary,
                "expires_at": execution.expires_at_ms.map(rfc3339),
            })),
        )
            .into_response(),
        CallReply::Blocked { execution_id, rule } => (
            StatusCode::FORBIDDEN,
            Json(json!({"status": "blocked", "execution_id": execution_id, "rule": rule})),
        )
            .into_response(),
        CallReply::Refused(refusal) => ApiError::from(refusal).into_response(),
    }
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

/// RFC 3339 for a unix-ms instant.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// `GET /v1/tools`: the tools the session's agent is granted, without those the policy
/// blocks outright, with their descriptions and argument values (`tool_docs`).
async fn tools(State(s): State<Scoped>) -> Response {
    let Some(offered) = s.gate.offered_tools(&s.scope.agent) else {
        return Json(json!({"tools": []})).into_response();
    };
    let tools: Vec<Value> = offered
        .into_iter()
        .map(|t| {
            let args: Vec<Value> = t
                .args
                .iter()
                .map(|a| super::tool_docs::arg_listing(t, a))
                .collect();
            let mut tool = json!({"name": t.name, "risk": t.risk.as_str(), "args": args});
            if let Some(d) = super::tool_docs::tool_description(t.name) {
                tool["description"] = json!(d);
            }
            tool
        })
        .collect();
    Json(json!({"tools": tools})).into_response()
}

/// The execution `id` of the socket's session. A text that is no execution id is
/// answered as an id that is not there.
async fn load(s: &Scoped, id: &str) -> Result<Execution, Response> {
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such execution in this session",
        )
        .into_response()
    };
    let id = ExecutionId::parse(id).map_err(|_| not_found())?;
    let found = s.gate.db().read(move |c| exec_store::get(c, &id)).await;
    match found {
        Ok(Some(e)) if e.session_id == s.scope.session_id => Ok(e),
        Ok(_) => Err(not_found()),
        Err(e) => {
            tracing::error!(error = %e, "cannot read execution");
            Err(ApiError::internal().into_response())
        }
    }
}

/// What the agent sees of an execution.
pub fn agent_view(e: &Execution) -> Value {
    let result: Value = e
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or(Value::Null);
    let status = match e.status {
        Status::Succeeded => "ok",
        Status::Held | Status::Approved => "pending_approval",
        Status::Running => "running",
        Status::Failed => "failed",
        Status::NeedsCheck => "needs_check",
        Status::Denied => "denied",
        Status::Expired => "expired",
        Status::Blocked => "blocked",
    };
    json!({
        "execution_id": e.id,
        "status": status,
        "tool": e.tool,
        "result": result,
        "error": e.error,
        "message": e.decision_message,
        "reviewer": e.reviewer,
        "expires_at": e.expires_at_ms.map(rfc3339),
    })
}

async fn execution(State(s): State<Scoped>, Path(id): Path<String>) -> Response {
    match load(&s, &id).await {
        Ok(e) => Json(agent_view(&e)).into_response(),
        Err(r) => r,
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
/// expired, blocked) or the timeout passes, then answers as `GET /v1/executions/{id}`.
async fn wait(
    State(s): State<Scoped>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
) -> Response {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(q.timeout).min(MAX_WAIT);
    let mut changes = s.gate.changes();
    loop {
        let e = match load(&s, &id).await {
            Ok(e) => e,
            Err(r) => return r,
        };
        if e.status.is_final() || tokio::time::Instant::now() >= deadline {
            return Json(agent_view(&e)).into_response();
        }
        let _ = tokio::time::timeout_at(deadline, async {
            loop {
                match changes.recv().await {
                    Ok(changed) if changed.as_str() == id => break,
                    Ok(_) => continue,
                    Err(_) => break,
                }
            }
        })
        .await;
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> ApiError {
        let status = match &refusal {
            Refusal::NotGranted(_) | Refusal::SecretInArguments(_) | Refusal::OutOfScope(_) => {
                StatusCode::FORBIDDEN
            }
            Refusal::UnknownTool(_) => StatusCode::NOT_FOUND,
            Refusal::InvalidArguments { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Refusal::LookupFailed { definite: true, .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Refusal::LookupFailed {
                definite: false, ..
            } => StatusCode::BAD_GATEWAY,
            Refusal::TooManyHolds { .. } => StatusCode::TOO_MANY_REQUESTS,
            Refusal::Internal => return ApiError::internal(),
        };
        let code = refusal.code();
        match refusal {
            Refusal::InvalidArguments { message, problems } => {
                ApiError::new(status, code, message).with_problems(problems)
            }
            other => ApiError::new(status, code, other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_maps_to_one_status_and_the_common_body() {
        let cases = [
            (Refusal::NotGranted("n".into()), 403, "not_granted"),
            (Refusal::UnknownTool("u".into()), 404, "unknown_tool"),
            (Refusal::invalid("i"), 422, "invalid_arguments"),
            (
                Refusal::SecretInArguments("s".into()),
                403,
                "secret_in_arguments",
            ),
            (Refusal::OutOfScope("o".into()), 403, "out_of_scope"),
            (
                Refusal::LookupFailed {
                    message: "l".into(),
                    definite: true,
                },
                422,
                "lookup_failed",
            ),
            (
                Refusal::LookupFailed {
                    message: "l".into(),
                    definite: false,
                },
                502,
                "lookup_failed",
            ),
            (Refusal::TooManyHolds { limit: 3 }, 429, "too_many_holds"),
            (Refusal::Internal, 500, "internal"),
        ];
        for (refusal, status, code) in cases {
            let e = ApiError::from(refusal);
            assert_eq!((e.status.as_u16(), e.code), (status, code));
            assert_eq!(e.body()["status"], "error");
        }
        let listed = ApiError::from(Refusal::InvalidArguments {
            message: "t: a; b".into(),
            problems: vec!["a".into(), "b".into()],
        });
        assert_eq!(listed.body()["problems"], json!(["a", "b"]));
    }
}
