//! The relay's own requests, served only on a `control` connection (one its credential
//! opened; the agent's piped connections are `stream` and never reach these routes):
//!
//! - `POST /relay/v1/renew`: a fresh credential for the same session, valid for the
//!   configured ttl. The relay renews before its credential expires, so a credential
//!   never needs to live long and nothing has to rewrite the pod's files on time.
//! - `GET /relay/v1/secrets`: the secrets the session's agent asks for and is granted,
//!   exactly those a Docker container gets as files at start.
//!
//! Answers carry a credential or secret values: they are never logged.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use crate::api_error::ApiError;
use crate::gateway::SessionService;
use crate::secrets::ExposeSecret as _;
use crate::server::LimitedRouter;
use crate::session::SessionScope;

/// What the relay listener serves from (its control routes read it too).
#[derive(Clone)]
pub struct RelayParts {
    pub credentials: Arc<super::credential::RelayCredentials>,
    /// Verifies claimed pods' service-account tokens (Kubernetes with agent-sandbox);
    /// without one only minted credentials are accepted.
    pub pod_tokens: Option<Arc<dyn crate::sandbox::PodTokenVerifier>>,
    pub sessions: Arc<crate::gateway::SocketHost>,
    pub agents: Arc<crate::session::AgentBook>,
    pub secrets: Arc<dyn crate::session::SecretSource>,
    /// Sends a relay whose session runs on another instance there; without it such a
    /// relay is refused `stopped`.
    pub redirects: Option<super::redirect::Redirects>,
    /// The sessions' workspaces in pods (`relay::pod_workspace`).
    pub pod_workspaces: Arc<super::pod_workspace::PodWorkspaces>,
}

/// `POST /relay/v1/renew`'s path.
pub const RENEW_PATH: &str = "/relay/v1/renew";
/// `GET /relay/v1/secrets`'s path.
pub const SECRETS_PATH: &str = "/relay/v1/secrets";

/// The answer of a renewal.
#[derive(Serialize, Deserialize)]
pub struct Renewed<'a> {
    /// The new credential (secret).
    pub credential: &'a str,
    /// When it expires, ms since the epoch.
    pub expires_at_ms: i64,
}

/// One granted secret.
#[derive(Serialize, Deserialize)]
pub struct SecretFile<'a> {
    pub name: &'a str,
    pub value: &'a str,
}

/// The answer of a secrets fetch.
#[derive(Serialize, Deserialize)]
pub struct SecretFiles<'a> {
    #[serde(borrow)]
    pub secrets: Vec<SecretFile<'a>>,
}

#[derive(Clone)]
struct Control {
    scope: SessionScope,
    parts: RelayParts,
}

/// The control routes of `service`'s session, with its socket's limits.
pub(super) fn router(service: &SessionService, parts: &RelayParts) -> LimitedRouter {
    let router = Router::new()
        .route(RENEW_PATH, post(renew))
        .route(SECRETS_PATH, get(secrets))
        .with_state(Arc::new(Control {
            scope: service.scope.clone(),
            parts: parts.clone(),
        }))
        .merge(super::pod_workspace::routes(
            &service.scope,
            &parts.pod_workspaces,
        ));
    LimitedRouter::new(router, service.router.limits())
}

async fn renew(State(control): State<Arc<Control>>) -> Response {
    let credential = control.parts.credentials.mint(&control.scope.session_id);
    let verified = match control.parts.credentials.verify(&credential) {
        Ok(verified) => verified,
        Err(e) => {
            tracing::error!(error = %e, "a freshly minted relay credential does not verify");
            return ApiError::internal().into_response();
        }
    };
    tracing::info!(session = %control.scope.session_id, "relay credential renewed");
    json(&Renewed {
        credential: credential.expose_secret(),
        expires_at_ms: verified.expires_at_ms,
    })
}

async fn secrets(State(control): State<Arc<Control>>) -> Response {
    let Some(agent) = control.parts.agents.get(&control.scope.agent) else {
        tracing::error!(agent = %control.scope.agent, "the session's agent has no definition");
        return ApiError::internal().into_response();
    };
    let values = match control
        .parts
        .secrets
        .for_agent(&agent.name, &agent.secrets)
        .await
    {
        Ok(values) => values,
        Err(e) => {
            tracing::error!(agent = %agent.name, error = %e, "cannot read the agent's secrets for its relay");
            return ApiError::internal().into_response();
        }
    };
    let files = SecretFiles {
        secrets: values
            .iter()
            .map(|(name, value)| SecretFile {
                name,
                value: value.expose_secret(),
            })
            .collect(),
    };
    tracing::info!(session = %control.scope.session_id, count = files.secrets.len(), "secrets handed to the session's relay");
    json(&files)
}

fn json(value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response(),
        Err(_) => ApiError::internal().into_response(),
    }
}
