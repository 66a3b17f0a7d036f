//! `GET /login/oidc` (off to the provider) and `GET /login/oidc/callback` (back from
//! it). Every refusal is a page saying why, and clears the browser's sign-in cookie.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use openidconnect::core::CoreAuthenticationFlow;
use openidconnect::{CsrfToken, Nonce, PkceCodeChallenge, Scope};
use serde::Deserialize;

use super::Oidc;
use super::identity::{self, Refusal};
use super::sealed::{self, SignIn};
use crate::review::auth::{self, NextQuery, cookie, cookie_header_with, safe_next};
use crate::review::{ReviewState, message};
use crate::reviewers::{self, ReviewerError};

/// The cookie that binds a sign-in at the provider to the browser that started it.
pub(super) const OIDC_COOKIE: &str = "tg_oidc";
/// Where that cookie is sent: only to the callback (the provider's redirect back).
const OIDC_COOKIE_PATH: &str = super::CALLBACK_PATH;

/// `GET /login/oidc?next=`: seals a fresh sign-in into the browser's cookie and sends
/// the browser to the provider. Nothing is stored: a flood of these costs the server
/// nothing and crowds out no one.
pub async fn begin(State(state): State<ReviewState>, Query(q): Query<NextQuery>) -> Response {
    let Some(oidc) = state.oidc.clone() else {
        return not_configured();
    };
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let scopes = oidc.settings.scopes.iter().map(|s| Scope::new(s.clone()));
    let client = oidc.client();
    let (url, csrf, nonce) = client
        .authorize_url(
            CoreAuthenticationFlow::AuthorizationCode,
            CsrfToken::new_random,
            Nonce::new_random,
        )
        .add_scopes(scopes)
        .set_pkce_challenge(challenge)
        .url();
    let now = state.approvals.gate.now();
    let cookie = oidc.cookies.seal(&SignIn {
        state: csrf.secret().clone(),
        nonce: nonce.secret().clone(),
        pkce_verifier: verifier.secret().clone(),
        next: safe_next(&q.next),
        expires_at_ms: now.saturating_add(sealed::TTL_MS),
    });
    let mut response = Redirect::to(url.as_str()).into_response();
    with_cookie(&mut response, &state, &cookie, sealed::TTL_MS / 1000);
    response
}

/// What the provider sends back.
#[derive(Debug, Default, Deserialize)]
pub struct CallbackQuery {
    #[serde(default)]
    code: String,
    #[serde(default)]
    state: String,
    iss: Option<String>,
    error: Option<String>,
}

/// `GET /login/oidc/callback`: opens the sign-in sealed in the browser's cookie,
/// verifies the provider's answer, checks the allow-list and opens the reviewer's session.
pub async fn finish(
    State(state): State<ReviewState>,
    headers: HeaderMap,
    Query(q): Query<CallbackQuery>,
) -> Response {
    let Some(oidc) = state.oidc.clone() else {
        return not_configured();
    };
    let mut response = match signed_in(&state, &oidc, &headers, q).await {
        Ok(response) => response,
        Err(refused) => *refused,
    };
    with_cookie(&mut response, &state, "", 0);
    response
}

async fn signed_in(
    state: &ReviewState,
    oidc: &Oidc,
    headers: &HeaderMap,
    q: CallbackQuery,
) -> Result<Response, Box<Response>> {
    let refuse = |status, text: &str| Box::new(message(status, None, "Not signed in", text));
    let now = state.approvals.gate.now();
    let db = state.approvals.gate.db();
    let sealed = cookie(headers, OIDC_COOKIE);
    let returned = match oidc.cookies.open(sealed, &q.state, now) {
        Ok(returned) => returned,
        Err(refused) => {
            tracing::info!(refusal = %refused, "a returning sign-in was refused");
            let text = format!("{}. Sign in again.", upper_first(&refused.to_string()));
            return Err(refuse(StatusCode::BAD_REQUEST, &text));
        }
    };
    if let Some(error) = q.error {
        let text = format!(
            "The identity provider did not sign you in ({}).",
            short(&error)
        );
        return Err(refuse(StatusCode::UNAUTHORIZED, &text));
    }
    if q.iss.as_deref().is_some_and(|iss| iss != oidc.issuer) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "The answer came from another identity provider than this site's.",
        ));
    }
    let claims = match oidc
        .redeem(q.code, returned.pkce_verifier, returned.nonce)
        .await
    {
        Ok(claims) => claims,
        Err(e) => {
            tracing::warn!(error = %e, "a sign-in at the identity provider did not verify");
            return Err(refuse(
                StatusCode::UNAUTHORIZED,
                "The identity provider's answer did not verify; you are not signed in.",
            ));
        }
    };
    let who = identity::judge(&oidc.settings, &oidc.issuer, &claims).map_err(|r| refused(&r))?;
    let reviewer = match reviewers::provider::sign_in(db, &who.subject, &who.name).await {
        Ok(reviewer) => reviewer,
        Err(e) => return Err(name_refused(e)),
    };
    let token = auth::open_session(state, &reviewer).await?;
    let next = safe_next(&returned.next);
    let mut response = auth::continue_to(StatusCode::OK, &next, "Signed in", "Continue");
    if let Ok(v) = auth::session_cookie(state, &token).parse() {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    Ok(response)
}

/// Sets (or, with `max_age_s` 0, clears) the sign-in cookie. SameSite=Lax, unlike the
/// session's Strict: the provider's redirect back is a navigation from another site,
/// which must carry it.
fn with_cookie(response: &mut Response, state: &ReviewState, value: &str, max_age_s: i64) {
    let header = cookie_header_with(
        state.secure_cookies,
        OIDC_COOKIE,
        value,
        OIDC_COOKIE_PATH,
        max_age_s,
        "Lax",
    );
    if let Ok(v) = header.parse() {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
}

fn refused(why: &Refusal) -> Box<Response> {
    tracing::info!(refusal = %why, "a sign-in at the identity provider was refused");
    let text = match why {
        Refusal::NotAllowed(_) => {
            format!("{why}. Ask whoever runs threadgate to add you to [review.oidc]'s allow-list.")
        }
        _ => format!("{}.", upper_first(&why.to_string())),
    };
    Box::new(message(StatusCode::FORBIDDEN, None, "Not allowed", &text))
}

fn name_refused(e: ReviewerError) -> Box<Response> {
    let text = match &e {
        ReviewerError::DuplicateName(name) => format!(
            "The name {name} belongs to another reviewer (added with a password, or another \
             account at the provider), so it cannot be yours. Ask whoever runs threadgate."
        ),
        ReviewerError::InvalidName(name) => format!(
            "Your name at the identity provider ({name:?}) cannot name a reviewer: use 1 to \
             64 letters, digits, '_', '.', '@' or '-' (see [review.oidc] name_claim)."
        ),
        _ => return internal(e),
    };
    Box::new(message(StatusCode::CONFLICT, None, "Not signed in", &text))
}

fn internal(e: impl std::fmt::Display) -> Box<Response> {
    tracing::error!(error = %e, "a sign-in at the identity provider failed");
    Box::new(message(
        StatusCode::INTERNAL_SERVER_ERROR,
        None,
        "Error",
        "Internal error.",
    ))
}

fn not_configured() -> Response {
    message(
        StatusCode::NOT_FOUND,
        None,
        "Not found",
        "Sign-in through an identity provider is not configured here.",
    )
}

/// At most 100 characters of a provider's error code, of the characters such codes use.
fn short(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii_alphanumeric() || "_-. ".contains(*c))
        .take(100)
        .collect()
}

fn upper_first(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
