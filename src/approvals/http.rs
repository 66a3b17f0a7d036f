//! The people's side of approvals, on the TCP listener (never on a session socket):
//! reviewers list held calls and approve or deny them with their credential.
//! No GET changes state. The note's `approval_url` (`/approvals/{id}`) is the review
//! page's (src/review); this is the JSON API for scripts.
//!
//! Credentials are high-entropy tokens checked by digest ([`reviewers::authenticate`]);
//! after [`Throttle`]'s number of failures from one client address, that address is
//! refused (429) before any check for the throttle's window.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRef, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Approvals, Choice, DecideError};
use crate::api_error::ApiError;
use crate::executions::store::{self, Execution, Status};
use crate::gateway::routes::rfc3339;
use crate::ids::ExecutionId;
use crate::reviewers::hasher::Hasher;
use crate::reviewers::throttle::{Throttle, request_client_key};
use crate::reviewers::{self, Reviewer};

/// The API's state: the approvals service, the reviewers' hashing pool (for legacy
/// tokens) and the failure throttle.
#[derive(Clone)]
struct Api {
    approvals: Approvals,
    hasher: Arc<Hasher>,
    throttle: Arc<Throttle>,
}

impl FromRef<Api> for Approvals {
    fn from_ref(api: &Api) -> Approvals {
        api.approvals.clone()
    }
}

/// The routes for reviewers; legacy argon2 tokens are checked through `hasher`.
pub fn router(approvals: Approvals, hasher: Arc<Hasher>) -> Router {
    Router::new()
        .route("/api/approvals", get(list))
        .route("/api/approvals/{id}", get(show).post(decide))
        .with_state(Api {
            throttle: Arc::new(Throttle::new(approvals.gate.db().clone(), "approvals_api")),
            approvals,
            hasher,
        })
}

/// The reviewer of a request, with failures throttled per client address.
async fn checked(
    api: &Api,
    ext: &axum::http::Extensions,
    headers: &HeaderMap,
) -> Result<Reviewer, Response> {
    let key = request_client_key(ext);
    let now = api.approvals.gate.now();
    if let Err(wait) = api.throttle.check(&[&key], now).await {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "throttled",
            format!("too many failed credentials from this address; try again in {wait} s"),
        )
        .into_response());
    }
    let result = reviewer(api, headers).await;
    if let Err(r) = &result
        && r.status() == StatusCode::UNAUTHORIZED
    {
        api.throttle.fail(&[&key], now).await;
    }
    result
}

/// The reviewer named by the `Authorization: Bearer` credential.
async fn reviewer(api: &Api, headers: &HeaderMap) -> Result<Reviewer, Response> {
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(token) = presented else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a reviewer's credential is required (Authorization: Bearer ...)",
        )
        .into_response());
    };
    match reviewers::authenticate_with(api.approvals.gate.db(), &api.hasher, token).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unknown or wrong reviewer credential",
        )
        .into_response()),
        Err(reviewers::ReviewerError::Busy) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            "too many credential checks at once; try again in a moment",
        )
        .into_response()),
        Err(e) => {
            tracing::error!(error = %e, "cannot check a reviewer credential");
            Err(ApiError::internal().into_response())
        }
    }
}

/// What a reviewer sees of a call: redacted arguments, never credentials.
fn reviewer_view(approvals: &Approvals, e: &Execution) -> Value {
    let args: Value = serde_json::from_str(&e.args).unwrap_or_default();
    let redacted = crate::executions::redact_args(&approvals.gate.current_redactor(), &args);
    json!({
        "execution_id": e.id,
        "status": e.status.as_str(),
        "thread_id": e.thread_id,
        "session_id": e.session_id,
        "agent": e.agent,
        "tool": e.tool,
        "args": redacted,
        "because": e.because,
        "rule_line": e.rule_line,
        "summary": e.summary,
        "diagnosis": e.diagnosis.as_deref().map(|d| approvals.gate.current_redactor().redact(d).into_owned()),
        "expires_at": e.expires_at_ms.map(rfc3339),
        "reviewer": e.reviewer,
        "message": e.decision_message,
    })
}

async fn list(State(api): State<Api>, ext: axum::http::Extensions, headers: HeaderMap) -> Response {
    if let Err(r) = checked(&api, &ext, &headers).await {
        return r;
    }
    let a = api.approvals;
    let held = a
        .gate
        .db()
        .read(|c| store::with_status(c, Status::Held))
        .await;
    match held {
        Ok(rows) => {
            let now = a.gate.now();
            let items: Vec<Value> = rows
                .iter()
                .filter(|e| e.expires_at_ms.is_none_or(|at| at > now))
                .map(|e| reviewer_view(&a, e))
                .collect();
            Json(json!({"approvals": items})).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot list approvals");
            ApiError::internal().into_response()
        }
    }
}

async fn show(
    State(api): State<Api>,
    ext: axum::http::Extensions,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = checked(&api, &ext, &headers).await {
        return r;
    }
    let a = api.approvals;
    let found = a.gate.db().read(move |c| store::get(c, &id)).await;
    match found {
        Ok(Some(e)) => Json(reviewer_view(&a, &e)).into_response(),
        Ok(None) => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such call").into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot read an approval");
            ApiError::internal().into_response()
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideBody {
    decision: Choice,
    #[serde(default)]
    message: Option<String>,
}

async fn decide(
    State(api): State<Api>,
    ext: axum::http::Extensions,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<DecideBody>, JsonRejection>,
) -> Response {
    let who = match checked(&api, &ext, &headers).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let a = api.approvals;
    let body = match body {
        Ok(Json(b)) => b,
        Err(rejection) => {
            return ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                format!(
                    "{} (expected {{\"decision\": \"approve\"|\"deny\", \"message\": \"...\"}})",
                    rejection.body_text()
                ),
            )
            .into_response();
        }
    };
    // A text that is no execution id names no call.
    let Ok(id) = ExecutionId::parse(id) else {
        return ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such call").into_response();
    };
    match a.decide(&id, &who.name, body.decision, body.message).await {
        Ok(e) => Json(reviewer_view(&a, &e)).into_response(),
        Err(DecideError::NotFound(_)) => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such call").into_response()
        }
        Err(e @ DecideError::Expired { .. }) => {
            ApiError::new(StatusCode::GONE, "expired", e.to_string()).into_response()
        }
        Err(e @ DecideError::AlreadyDecided { .. }) => {
            ApiError::new(StatusCode::CONFLICT, "already_decided", e.to_string()).into_response()
        }
        Err(DecideError::Store(e)) => {
            tracing::error!(error = %e, "cannot record a decision");
            ApiError::internal().into_response()
        }
    }
}
