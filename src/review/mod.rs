//! The review page: where a person signs in and approves or denies held calls.
//!
//! Server-rendered HTML (askama templates under `templates/review/`), served only on the
//! people's TCP listener, never on a session socket. It depends on [`crate::approvals`]
//! (decisions go through the same compare-and-set as the JSON API, so a call is decided
//! and run once whichever way a person decides it), never the reverse.
//!
//! Safety: reviewers sign in with name and password ([`auth`]; argon2id through the
//! bounded [`Hasher`]; failures lock a name from one client address and that address,
//! and slow a name from anywhere) or through the team's OpenID provider ([`oidc`]);
//! every page handler takes the signed-in reviewer as an extractor ([`auth::Signed`]);
//! the session cookie is HttpOnly, SameSite=Strict, Secure when the public URL is
//! https, and expires after [`auth::IDLE_MS`] idle or [`auth::ABSOLUTE_MS`] in all; every form carries the session's CSRF token; every
//! response carries a strict CSP without inline script, `X-Frame-Options: DENY`,
//! `Referrer-Policy: no-referrer` and `no-store`.

pub mod auth;
pub mod oidc;
mod pages;
mod queue;
mod views;

use std::sync::Arc;

use askama::Template;
use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};

use crate::approvals::Approvals;
use crate::reviewers::hasher::Hasher;
use crate::reviewers::throttle::Throttle;

/// The Content-Security-Policy of every page: no script at all, styles only from here.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
    form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What the page's handlers share.
/// The failure throttle's namespace of the review page's sign-ins.
pub const SIGN_IN_THROTTLE: &str = "review_sign_in";

#[derive(Clone)]
pub struct ReviewState {
    /// Decisions and the executions table.
    pub approvals: Approvals,
    /// The bounded argon2 pool for sign-ins.
    pub hasher: Arc<Hasher>,
    /// Failed sign-ins per name and client address, per address, and per name.
    pub throttle: Arc<Throttle>,
    /// Whether cookies carry `Secure` (the public URL is https).
    pub secure_cookies: bool,
    /// Plain's link to a thread, with `{thread_id}` in it, when configured.
    pub thread_url: Option<String>,
    /// The team's identity provider, when `[review.oidc]` is set.
    pub oidc: Option<Arc<oidc::Oidc>>,
}

impl ReviewState {
    /// The page's state for a server whose people reach it at `public_url`, checking
    /// passwords through `hasher`.
    pub fn new(
        approvals: Approvals,
        hasher: Arc<Hasher>,
        public_url: &str,
        thread_url: Option<String>,
    ) -> Self {
        let throttle = Throttle::new(approvals.gate.db().clone(), SIGN_IN_THROTTLE);
        ReviewState {
            hasher,
            approvals,
            throttle: Arc::new(throttle),
            secure_cookies: is_https(public_url),
            thread_url,
            oidc: None,
        }
    }

    /// The same state with sign-in through `oidc` beside the password sign-in.
    pub fn with_oidc(mut self, oidc: Option<Arc<oidc::Oidc>>) -> Self {
        self.oidc = oidc;
        self
    }

    /// The same state with the per-name sign-in back-off at most `max`
    /// (`[server] sign_in_backoff_max`).
    pub fn with_sign_in_backoff_max(mut self, max: std::time::Duration) -> Self {
        let max_ms = crate::clock::ms(max);
        self.throttle = Arc::new((*self.throttle).clone().with_backoff_max(max_ms));
        self
    }

    /// The Plain link of a thread, or "" when none is configured.
    fn thread_link(&self, thread_id: &str) -> String {
        self.thread_url
            .as_deref()
            .map(|t| t.replace("{thread_id}", thread_id))
            .unwrap_or_default()
    }
}

/// Whether people reach the server over https (then cookies are `Secure`).
pub fn is_https(public_url: &str) -> bool {
    public_url
        .trim()
        .to_ascii_lowercase()
        .starts_with("https://")
}

/// The page's routes (for the TCP listener only).
pub fn router(state: ReviewState) -> Router {
    Router::new()
        .route("/login", get(auth::login_form).post(auth::login))
        .route("/login/oidc", get(oidc::begin))
        .route(oidc::CALLBACK_PATH, get(oidc::finish))
        .route("/logout", post(auth::logout))
        .route("/approvals", get(queue::queue))
        .route("/approvals/history", get(pages::history))
        .route("/approvals/{id}", get(pages::approval))
        .route("/approvals/{id}/decide", post(pages::decide))
        .route("/threads/{thread_id}", get(pages::thread))
        .route("/review/style.css", get(style))
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(state)
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../../templates/review/style.css"),
    )
        .into_response()
}

async fn secure_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Renders `page` with `status`; a template error is a plain 500.
fn render(status: StatusCode, page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "cannot render a review page");
            (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
        }
    }
}

/// A page saying one thing.
#[derive(Template)]
#[template(path = "review/message.html")]
struct MessagePage<'a> {
    reviewer: &'a str,
    csrf: &'a str,
    banner: &'a str,
    banner_kind: &'a str,
    heading: &'a str,
    text: &'a str,
    back: &'a str,
}

/// A message page for a signed-in reviewer or a stranger (empty `who`).
fn message(status: StatusCode, who: Option<&auth::Signed>, heading: &str, text: &str) -> Response {
    let (reviewer, csrf) = who
        .map(|s| (s.reviewer.name.as_str(), s.csrf.as_str()))
        .unwrap_or(("", ""));
    render(
        status,
        &MessagePage {
            reviewer,
            csrf,
            banner: "",
            banner_kind: "",
            heading,
            text,
            back: "/approvals",
        },
    )
}
