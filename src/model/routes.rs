//! The model half of the sandbox API: `POST /v1/model/chat/completions` and
//! `GET`/`PUT /v1/transcript`, served on each session's socket.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use super::proxy::{ModelProxy, ProxyError};
use super::scan;
use super::store::{self as model_store, StoredTranscript};
use crate::api_error::ApiError;
use crate::gateway::SandboxRouter;
use crate::session::SessionScope;

#[derive(Clone)]
struct Scoped {
    proxy: Arc<ModelProxy>,
    scope: SessionScope,
}

impl SandboxRouter for Arc<ModelProxy> {
    fn router(&self, scope: SessionScope) -> Router {
        let state = Scoped {
            proxy: self.clone(),
            scope,
        };
        // One byte over the cap still reads, so the handler answers 413 in the
        // socket's error shape instead of axum's plain text. A model call reads its
        // body itself, once it has a place in the session's queue.
        let transcript_limit = self.settings.transcript_max_bytes + 1;
        Router::new()
            .route("/v1/model/chat/completions", post(chat))
            .route(
                "/v1/transcript",
                get(get_transcript)
                    .put(put_transcript)
                    .layer(DefaultBodyLimit::max(transcript_limit)),
            )
            .with_state(state)
    }
}

/// 413: the body is over `[model] key` (`max` bytes).
fn too_large(key: &str, max: usize) -> Box<Response> {
    Box::new(
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the body exceeds [model] {key} ({max} bytes)"),
        )
        .into_response(),
    )
}

/// The body, at most `max` bytes (`[model] key`), or the error answer (413 above it,
/// 400 when it cannot be read whole, in time).
async fn read_capped(
    headers: &HeaderMap,
    body: Body,
    key: &str,
    max: usize,
) -> Result<Bytes, Box<Response>> {
    use http_body_util::BodyExt as _;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(too_large(key, max));
    }
    let mut body = body;
    let mut read = Vec::with_capacity(declared.unwrap_or(0));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            Box::new(
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("cannot read the body: {e}"),
                )
                .into_response(),
            )
        })?;
        if let Ok(data) = frame.into_data() {
            if read.len() + data.len() > max {
                return Err(too_large(key, max));
            }
            read.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(read))
}

/// The body as JSON, or the error answer (413 over `max`, 400 when not JSON).
fn json_body(body: Result<Bytes, BytesRejection>, max: usize) -> Result<Value, Box<Response>> {
    let too_large = || too_large("transcript_max_bytes", max);
    let bytes = match body {
        Ok(b) => b,
        Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_large()),
        Err(r) => {
            return Err(Box::new(
                ApiError::new(StatusCode::BAD_REQUEST, "bad_request", r.body_text())
                    .into_response(),
            ));
        }
    };
    if bytes.len() > max {
        return Err(too_large());
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        Box::new(
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("the body is not JSON: {e}"),
            )
            .into_response(),
        )
    })
}

/// `POST /v1/model/chat/completions`: a place in the session's queue first, then the
/// body (so a refused call is never read), parsed only when its turn comes.
async fn chat(State(s): State<Scoped>, headers: HeaderMap, body: Body) -> Response {
    let place = match s.proxy.queue(&s.scope) {
        Ok(place) => place,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let max = s.proxy.settings.max_request_bytes;
    let body = match read_capped(&headers, body, "max_request_bytes", max).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    match s.proxy.chat_to_the_end(place, &s.scope, body).await {
        Ok(answer) => Json(answer).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// `GET /v1/transcript`: the stored conversation, or an empty one.
async fn get_transcript(State(s): State<Scoped>) -> Response {
    let session = s.scope.session_id.clone();
    match s
        .proxy
        .gate
        .db()
        .read(move |c| model_store::transcript(c, &session))
        .await
    {
        Ok(None) => Json(json!({"messages": [], "events_consumed": 0})).into_response(),
        Ok(Some(t)) => {
            let messages: Value = serde_json::from_str(&t.messages).unwrap_or(json!([]));
            Json(json!({"messages": messages, "events_consumed": t.events_consumed}))
                .into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot read a transcript");
            ApiError::internal().into_response()
        }
    }
}

/// `PUT /v1/transcript`: replaces the conversation (at most `transcript_max_bytes`,
/// and no stored secret's value in it).
async fn put_transcript(State(s): State<Scoped>, body: Result<Bytes, BytesRejection>) -> Response {
    let max = s.proxy.settings.transcript_max_bytes;
    let body = match json_body(body, max) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Some(messages) = body.get("messages").filter(|m| m.is_array()) else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "messages must be an array",
        )
        .into_response();
    };
    let events_consumed = match body.get("events_consumed") {
        None => 0,
        Some(v) => match v.as_i64().filter(|n| *n >= 0) {
            Some(n) => n,
            None => {
                return ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "events_consumed must be a count",
                )
                .into_response();
            }
        },
    };
    // The transcript leaves the sandbox like a prompt: no stored secret's value in
    // any string or key of it (refused, audited by the secret's name, as a tool call's
    // arguments are; the stored transcript is left as it was).
    if let Some(name) = scan::secret_in_json(&s.proxy.gate.current_redactor(), &body) {
        return match s.proxy.transcript_refused(&s.scope, &name).await {
            Ok(()) => ApiError::new(
                StatusCode::FORBIDDEN,
                "secret_in_transcript",
                format!(
                    "the transcript holds the value of the stored secret {name:?}; it was not stored"
                ),
            )
            .into_response(),
            Err(e) => ApiError::from(e).into_response(),
        };
    }
    let stored = StoredTranscript {
        messages: messages.to_string(),
        events_consumed,
    };
    if stored.messages.len() > max {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the transcript exceeds {max} bytes"),
        )
        .into_response();
    }
    s.proxy.gate.supervisor().touch(&s.scope.thread_id);
    let (session, now) = (s.scope.session_id.clone(), s.proxy.gate.now());
    let lease = s.scope.lease.clone();
    let written = s
        .proxy
        .gate
        .db()
        .write(move |c| {
            // A stale owner's transcript would overwrite the new owner's.
            crate::store::leases::fence(c, &lease)?;
            model_store::put_transcript(c, &session, &stored, now)
        })
        .await;
    match written {
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(e) if crate::store::leases::is_lost(&e) => {
            s.proxy.gate.supervisor().lease_refused(&s.scope.lease);
            ApiError::from(ProxyError::SessionMoved).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot store a transcript");
            ApiError::internal().into_response()
        }
    }
}

impl From<ProxyError> for ApiError {
    fn from(e: ProxyError) -> ApiError {
        let (status, code) = match &e {
            ProxyError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ProxyError::ModelNotAllowed(_) => (StatusCode::FORBIDDEN, "model_not_allowed"),
            ProxyError::SecretInPrompt(_) => (StatusCode::FORBIDDEN, "secret_in_prompt"),
            ProxyError::BudgetExhausted(_) => (StatusCode::TOO_MANY_REQUESTS, "budget_exhausted"),
            ProxyError::TooManyCalls(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_calls"),
            ProxyError::Upstream(_) => (StatusCode::BAD_GATEWAY, "upstream_error"),
            ProxyError::Malformed(_) => (StatusCode::BAD_GATEWAY, "upstream_malformed"),
            ProxyError::SessionMoved => (StatusCode::CONFLICT, "session_moved"),
            ProxyError::Internal => return ApiError::internal(),
        };
        ApiError::new(status, code, e.to_string())
    }
}
