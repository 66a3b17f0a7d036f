//! The sandbox API: what a session's agent can ask of threadgate over its socket (its
//! events, its agent definition, a checkpoint of its workspace; the tool calls and the
//! model proxy are merged in).
//!
//! Every handler takes the session's [`SessionScope`] from the socket the request came
//! in on; nothing in a request can name another session. Every route of the socket,
//! the merged ones included, is behind the one `Host` check ([`super::host`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::value::RawValue;
use threadgate_api::{AgentLimits, AgentView, CheckpointAnswer, FeedEvent, HarnessView, SkillView};

use super::socket::SandboxRouter;
use crate::api_error::ApiError;
use crate::session::{AgentBook, CheckpointError, SessionScope, SupervisorHandle};
use crate::store::Db;
use crate::webhook::store as events;

/// The longest a long poll waits.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// The most events a page holds.
const MAX_PAGE_EVENTS: i64 = 1000;
/// The most bytes of event bodies a page holds, beyond its first event (whose size the
/// webhook body limit bounds): forty parallel pages cost at most ~80 MiB, not gigabytes.
pub const MAX_PAGE_BYTES: usize = 1 << 20;

/// Shared by every session's router.
pub struct SandboxApi {
    pub db: Db,
    pub agents: Arc<AgentBook>,
    /// The supervisor (its channel exists before anything that reaches it).
    pub supervisor: SupervisorHandle,
    /// The tool-call routes, merged into each session's router.
    pub calls: Arc<dyn SandboxRouter>,
    /// The model proxy and transcript routes, merged into each session's router.
    pub model: Arc<dyn SandboxRouter>,
}

#[derive(Clone)]
struct SessionState {
    api: Arc<SandboxApi>,
    scope: SessionScope,
}

impl SandboxRouter for Arc<SandboxApi> {
    fn router(&self, scope: SessionScope) -> Router {
        let state = SessionState {
            api: self.clone(),
            scope: scope.clone(),
        };
        let base = Router::new()
            .route("/v1/events", get(events))
            .route("/v1/agent", get(agent))
            .route("/v1/checkpoint", post(checkpoint))
            .with_state(state);
        base.merge(self.model.router(scope.clone()))
            .merge(self.calls.router(scope))
            .layer(axum::middleware::from_fn(super::host::check_host))
    }
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    #[serde(default)]
    after: i64,
    /// Seconds to wait for an event when none is there yet.
    #[serde(default)]
    wait: u64,
    #[serde(default = "default_limit")]
    limit: i64,
}

fn default_limit() -> i64 {
    100
}

/// `GET /v1/events?after=N&wait=S`: the thread's events after position N, waiting up
/// to S seconds for one when there is none; an [`threadgate_api::EventsPage`].
async fn events(State(s): State<SessionState>, Query(q): Query<EventsQuery>) -> Response {
    let wait = Duration::from_secs(q.wait).min(MAX_WAIT);
    let deadline = tokio::time::Instant::now() + wait;
    let mut rx = s.api.supervisor.subscribe_feed();
    if q.wait == 0 {
        s.api.supervisor.touch(&s.scope.thread_id);
    }
    loop {
        let thread = s.scope.thread_id.clone();
        let limit = q.limit.clamp(1, MAX_PAGE_EVENTS);
        let after = q.after;
        let found = s
            .api
            .db
            .read(move |c| events::feed_page(c, &thread, after, limit, MAX_PAGE_BYTES))
            .await;
        let events = match found {
            Ok(events) => events,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the event feed");
                return ApiError::internal().into_response();
            }
        };
        if !events.is_empty() || tokio::time::Instant::now() >= deadline {
            return stream_page(events, q.after);
        }
        // Wake on any feed change for this thread, or at the deadline.
        let woke = tokio::time::timeout_at(deadline, async {
            loop {
                match rx.recv().await {
                    Ok(t) if t == s.scope.thread_id => break,
                    Ok(_) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        })
        .await;
        if woke.is_err() {
            continue;
        }
    }
}

/// Writes an [`threadgate_api::EventsPage`] (`{"events": [...], "next": N}`) one event at a time, each
/// a [`FeedEvent`] whose event is its stored JSON as it is (no second copy of the page
/// is built), dropping each event once written.
fn stream_page(events: Vec<events::RawFeedEvent>, after: i64) -> Response {
    let next = events.last().map_or(after, |e| e.position);
    let count = events.len();
    let head = std::iter::once(Bytes::from_static(b"{\"events\":["));
    let rows = events.into_iter().enumerate().map(move |(i, e)| {
        let mut out = Vec::with_capacity(e.event_json.len() + 128);
        if i > 0 {
            out.push(b',');
        }
        if let Err(err) = serde_json::to_writer(&mut out, &feed_event(e)) {
            tracing::error!(error = %err, "cannot write a feed event");
        }
        Bytes::from(out)
    });
    let tail = std::iter::once(Bytes::from(format!("],\"next\":{next}}}")));
    let chunks = head
        .chain(rows)
        .chain(tail)
        .map(Ok::<_, std::convert::Infallible>);
    tracing::trace!(count, "streaming an events page");
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(futures::stream::iter(chunks)),
    )
        .into_response()
}

/// A stored event as the feed shows it. Stored text that is not JSON (which intake
/// never stores) is shown as `null` rather than breaking the page.
fn feed_event(e: events::RawFeedEvent) -> FeedEvent<Box<RawValue>> {
    let event = RawValue::from_string(e.event_json).unwrap_or_else(|err| {
        tracing::error!(error = %err, event_id = %e.event_id, "a stored event is not JSON");
        RawValue::NULL.to_owned()
    });
    FeedEvent {
        position: e.position,
        event_id: e.event_id,
        event_type: e.event_type,
        occurred_at_ms: e.occurred_at_ms,
        event,
    }
}

/// `GET /v1/agent`: the session's agent definition (model, limits, instructions) and
/// its playbooks (`skills: [{name, description, body}]`).
async fn agent(State(s): State<SessionState>) -> Response {
    let Some(def) = s.api.agents.get(&s.scope.agent) else {
        return ApiError::new(StatusCode::NOT_FOUND, "not_found", "no agent definition")
            .into_response();
    };
    let skills = def
        .skills
        .iter()
        .filter_map(|name| s.api.agents.skill(name))
        .map(|skill| SkillView {
            body: skill.body.clone(),
            description: skill.description.clone(),
            name: skill.name.clone(),
        })
        .collect();
    Json(AgentView {
        description: def.description.clone(),
        harness: def.harness.as_ref().map(|h| HarnessView {
            command: h.command.clone(),
            port: h.port,
        }),
        instructions: def.instructions.clone(),
        limits: Some(AgentLimits {
            max_tokens: def.limits.max_tokens,
            max_turns: def.limits.max_turns,
        }),
        model: Some(def.model.clone()),
        name: def.name.clone(),
        session_id: s.scope.session_id.to_string(),
        skills,
        thread_id: s.scope.thread_id.to_string(),
        tools: def.tools.clone(),
    })
    .into_response()
}

/// `POST /v1/checkpoint`: commits the session's workspace onto its branch and pushes the
/// branch to the configured remote now (the supervisor does it, as it does every
/// `[repo] checkpoint_every`); a [`CheckpointAnswer`]. A failed push is an answer
/// (`"push": "failed"`, tried again at the next checkpoint), never a detail of the
/// remote. 409 `busy` while the session starts, stops or checkpoints, 409
/// `not_running`, 429 `too_soon` within 10 s of the last checkpoint.
async fn checkpoint(State(s): State<SessionState>) -> Response {
    s.api.supervisor.touch(&s.scope.thread_id);
    match s.api.supervisor.checkpoint(&s.scope.thread_id).await {
        Ok(done) => Json(CheckpointAnswer {
            branch: done.branch,
            commit: done.commit,
            left_out: u64::try_from(done.left_out).unwrap_or(u64::MAX),
            push: done.push.as_str().to_owned(),
        })
        .into_response(),
        Err(e) => {
            let (status, code) = match &e {
                CheckpointError::Busy => (StatusCode::CONFLICT, "busy"),
                CheckpointError::NotRunning => (StatusCode::CONFLICT, "not_running"),
                CheckpointError::TooSoon { .. } => (StatusCode::TOO_MANY_REQUESTS, "too_soon"),
                CheckpointError::Failed | CheckpointError::Stopped => {
                    return ApiError::internal().into_response();
                }
            };
            ApiError::new(status, code, e.to_string()).into_response()
        }
    }
}
