//! Sign-in, sign-out, the session cookie and CSRF tokens of the review page.
//!
//! A session is a random 32-byte cookie value; the database keeps only its SHA-256
//! (`review_sessions`), with the reviewer, the session's CSRF token and its times. A
//! session ends after [`IDLE_MS`] without a request, [`ABSOLUTE_MS`] after sign-in, at
//! sign-out (the row is deleted) or when the reviewer is removed. The sign-in form's
//! own CSRF token is a double-submit cookie scoped to `/login`.

use askama::Template;
use axum::Form;
use std::convert::Infallible;

use crate::store::{OptionalExtension as _, params};
use axum::extract::{FromRequestParts, OptionalFromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::Rng as _;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use super::{ReviewState, render};
use crate::reviewers::throttle::{SignInKeys, request_client_key};
use crate::reviewers::{self, Reviewer, ReviewerError};
use crate::secrets::SecretString;

/// A session ends after this long without a request.
pub const IDLE_MS: i64 = 30 * 60 * 1000;
/// A session ends this long after sign-in, however busy.
pub const ABSOLUTE_MS: i64 = 12 * 60 * 60 * 1000;
/// The session cookie.
pub const SESSION_COOKIE: &str = "tg_review";
/// The sign-in form's double-submit cookie.
pub const LOGIN_COOKIE: &str = "tg_login";

/// A signed-in reviewer.
#[derive(Debug, Clone)]
pub struct Signed {
    /// Who.
    pub reviewer: Reviewer,
    /// The token every form of this session must carry.
    pub csrf: String,
    digest: String,
}

/// 32 random bytes, URL-safe base64.
pub(super) fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether two tokens are equal, in constant time (and neither is empty).
pub fn same_token(a: &str, b: &str) -> bool {
    !a.is_empty() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The value of cookie `name` in the request.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn set_cookie(state: &ReviewState, name: &str, value: &str, path: &str, max_age_s: i64) -> String {
    cookie_header(state.secure_cookies, name, value, path, max_age_s)
}

/// A `Set-Cookie` value: always HttpOnly and SameSite=Strict, Secure when `secure`.
pub fn cookie_header(secure: bool, name: &str, value: &str, path: &str, max_age_s: i64) -> String {
    cookie_header_with(secure, name, value, path, max_age_s, "Strict")
}

/// [`cookie_header`] with another SameSite value (`Lax` for the provider's way back).
pub fn cookie_header_with(
    secure: bool,
    name: &str,
    value: &str,
    path: &str,
    max_age_s: i64,
    same_site: &str,
) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{name}={value}; Path={path}; Max-Age={max_age_s}; HttpOnly; SameSite={same_site}{secure}"
    )
}

/// The extractor of every review page: the signed-in reviewer of a live session, or
/// (rejected) the page that sends the browser to sign in and back to this page. A form
/// post returns to the page its form is on (`/approvals/{id}/decide` to
/// `/approvals/{id}`). `Option<Signed>` is the reviewer or `None`, never a rejection.
impl FromRequestParts<ReviewState> for Signed {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &ReviewState,
    ) -> Result<Self, Self::Rejection> {
        match current(state, &parts.headers).await {
            Some(signed) => Ok(signed),
            None => Err(sign_in_first(&return_to(parts))),
        }
    }
}

impl OptionalFromRequestParts<ReviewState> for Signed {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &ReviewState,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(current(state, &parts.headers).await)
    }
}

/// The page to come back to after signing in: the request's path, or for a form post
/// the page the form is on.
fn return_to(parts: &Parts) -> String {
    let path = parts.uri.path();
    if parts.method == Method::GET {
        return path.to_owned();
    }
    path.strip_suffix("/decide").unwrap_or(path).to_owned()
}

/// The signed-in reviewer of the request, if its session is live; touches the session.
async fn current(state: &ReviewState, headers: &HeaderMap) -> Option<Signed> {
    let token = cookie(headers, SESSION_COOKIE)?;
    if token.len() > 100 {
        return None;
    }
    let digest = digest(token);
    let now = state.approvals.gate.now();
    let found = state
        .approvals
        .gate
        .db()
        .write(move |c| {
            let row = c
                .query_row(
                    "SELECT reviewer_id, csrf, created_at_ms, last_seen_ms FROM review_sessions \
                     WHERE token_digest = ?1",
                    [&digest],
                    |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, i64>(2)?,
                            r.get::<_, i64>(3)?,
                        ))
                    },
                )
                .optional()?;
            let Some((reviewer_id, csrf, created, seen)) = row else {
                return Ok(None);
            };
            let reviewer = reviewers::by_id(c, reviewer_id)?;
            let live = now - seen < IDLE_MS && now - created < ABSOLUTE_MS;
            match reviewer {
                Some(reviewer) if live => {
                    c.execute(
                        "UPDATE review_sessions SET last_seen_ms = ?2 WHERE token_digest = ?1",
                        params![digest, now],
                    )?;
                    Ok(Some(Signed {
                        reviewer,
                        csrf,
                        digest: digest.clone(),
                    }))
                }
                _ => {
                    c.execute(
                        "DELETE FROM review_sessions WHERE token_digest = ?1",
                        [&digest],
                    )?;
                    Ok(None)
                }
            }
        })
        .await;
    found.unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot read a review session");
        None
    })
}

/// The longest page a sign-in returns to: longer is no page of ours, and it is kept
/// with every pending sign-in.
const MAX_NEXT_BYTES: usize = 256;

/// Where to go after sign-in: only this site's approval and thread pages.
pub fn safe_next(next: &str) -> String {
    let ok = next.len() <= MAX_NEXT_BYTES
        && (next.starts_with("/approvals") || next.starts_with("/threads/"))
        && !next.starts_with("//")
        && next
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_-.".contains(&b));
    if ok {
        next.to_owned()
    } else {
        "/approvals".to_owned()
    }
}

/// The response to a request without a live session: a page that sends the browser to
/// the sign-in form (a same-site navigation, so a SameSite=Strict cookie the browser
/// does hold is sent there, and a signed-in reviewer arriving from Plain goes straight
/// back), with `next` as the page to return to.
pub fn sign_in_first(next: &str) -> Response {
    let target = format!("/login?next={}", safe_next(next));
    continue_to(
        StatusCode::UNAUTHORIZED,
        &target,
        "Sign in required",
        "Continue to sign in",
    )
}

#[derive(Template)]
#[template(path = "review/redirect.html")]
struct RedirectPage<'a> {
    reviewer: &'a str,
    csrf: &'a str,
    banner: &'a str,
    banner_kind: &'a str,
    target: &'a str,
    heading: &'a str,
    link_text: &'a str,
}

#[derive(Template)]
#[template(path = "review/login.html")]
struct LoginPage<'a> {
    reviewer: &'a str,
    csrf: &'a str,
    banner: &'a str,
    banner_kind: &'a str,
    login_csrf: &'a str,
    next: &'a str,
    name: &'a str,
    /// The identity provider's button label; empty: no such button.
    sso: &'a str,
}

/// `?next=` of the sign-in form.
#[derive(Debug, Deserialize)]
pub struct NextQuery {
    #[serde(default)]
    pub(super) next: String,
}

fn login_page(
    state: &ReviewState,
    status: StatusCode,
    next: &str,
    name: &str,
    banner: &str,
) -> Response {
    let token = random_token();
    let page = LoginPage {
        reviewer: "",
        csrf: "",
        banner,
        banner_kind: "error",
        login_csrf: &token,
        next: &safe_next(next),
        name,
        sso: state.oidc.as_ref().map(|o| o.label()).unwrap_or_default(),
    };
    let mut response = render(status, &page);
    if let Ok(v) = set_cookie(state, LOGIN_COOKIE, &token, "/login", 3600).parse() {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
}

/// `GET /login`: the form, or straight on when already signed in.
pub async fn login_form(
    State(state): State<ReviewState>,
    signed: Option<Signed>,
    Query(q): Query<NextQuery>,
) -> Response {
    if signed.is_some() {
        return Redirect::to(&safe_next(&q.next)).into_response();
    }
    login_page(&state, StatusCode::OK, &q.next, "", "")
}

/// The sign-in form's fields.
#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    next: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    password: String,
}

/// `POST /login`.
pub async fn login(
    State(state): State<ReviewState>,
    ext: axum::http::Extensions,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let expected = cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    if !same_token(&form.csrf, expected) {
        return super::message(
            StatusCode::FORBIDDEN,
            None,
            "Refused",
            "The sign-in form was stale or did not come from this site (CSRF token missing or wrong). Open the sign-in page again.",
        );
    }
    let name = form.name.trim();
    let keys = SignInKeys::new(name, &request_client_key(&ext));
    let now = state.approvals.gate.now();
    if let Err(wait) = state.throttle.check_sign_in(&keys, now).await {
        let text = format!(
            "Too many failed sign-ins for this name or from this address. Try again in {}.",
            wait_text(wait)
        );
        return login_page(
            &state,
            StatusCode::TOO_MANY_REQUESTS,
            &form.next,
            name,
            &text,
        );
    }
    let password = SecretString::from(form.password);
    match reviewers::verify_password(state.approvals.gate.db(), &state.hasher, name, password).await
    {
        Ok(Some(reviewer)) => {
            state.throttle.clear_sign_in(&keys).await;
            start_session(&state, reviewer, &form.next).await
        }
        Ok(None) => {
            state.throttle.fail_sign_in(&keys, now).await;
            login_page(
                &state,
                StatusCode::UNAUTHORIZED,
                &form.next,
                name,
                "Wrong name or password.",
            )
        }
        Err(ReviewerError::Busy) => login_page(
            &state,
            StatusCode::SERVICE_UNAVAILABLE,
            &form.next,
            name,
            "Too many sign-ins at once. Try again in a moment.",
        ),
        Err(e) => {
            tracing::error!(error = %e, "cannot check a reviewer's password");
            super::message(
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                "Error",
                "Internal error.",
            )
        }
    }
}

/// A wait for people: seconds below two minutes, minutes above.
fn wait_text(seconds: u64) -> String {
    match seconds {
        1 => "1 second".to_owned(),
        0..120 => format!("{seconds} seconds"),
        _ => format!("{} minutes", seconds.div_ceil(60)),
    }
}

async fn start_session(state: &ReviewState, reviewer: Reviewer, next: &str) -> Response {
    let token = match open_session(state, &reviewer).await {
        Ok(token) => token,
        Err(response) => return *response,
    };
    let mut response = Redirect::to(&safe_next(next)).into_response();
    let cookies = [
        session_cookie(state, &token),
        set_cookie(state, LOGIN_COOKIE, "", "/login", 0),
    ];
    for c in cookies {
        if let Ok(v) = c.parse() {
            response.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    response
}

/// Opens a session for `reviewer` (its row written, sessions that ended without a
/// sign-out removed) and returns the cookie value that names it, or the error page.
pub(super) async fn open_session(
    state: &ReviewState,
    reviewer: &Reviewer,
) -> Result<String, Box<Response>> {
    let token = random_token();
    let (d, csrf, now, id) = (
        digest(&token),
        random_token(),
        state.approvals.gate.now(),
        reviewer.id,
    );
    let written = state
        .approvals
        .gate
        .db()
        .write(move |c| {
            // Sessions that ended without a sign-out go when anyone signs in.
            c.execute(
                "DELETE FROM review_sessions WHERE last_seen_ms <= ?1 OR created_at_ms <= ?2",
                params![now - IDLE_MS, now - ABSOLUTE_MS],
            )?;
            c.execute(
                "INSERT INTO review_sessions (token_digest, reviewer_id, csrf, created_at_ms, \
                 last_seen_ms) VALUES (?1, ?2, ?3, ?4, ?4)",
                params![d, id, csrf, now],
            )
        })
        .await;
    if let Err(e) = written {
        tracing::error!(error = %e, "cannot start a review session");
        return Err(Box::new(super::message(
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            "Error",
            "Internal error.",
        )));
    }
    tracing::info!(reviewer = %reviewer.name, "reviewer signed in");
    Ok(token)
}

/// The `Set-Cookie` of a session whose cookie value is `token`.
pub(super) fn session_cookie(state: &ReviewState, token: &str) -> String {
    set_cookie(state, SESSION_COOKIE, token, "/", ABSOLUTE_MS / 1000)
}

/// A page that sends the browser on to `target` by itself (a same-site navigation, so
/// the SameSite=Strict session cookie goes with it even when the page was reached from
/// another site, as from an identity provider).
pub(super) fn continue_to(
    status: StatusCode,
    target: &str,
    heading: &str,
    link_text: &str,
) -> Response {
    render(
        status,
        &RedirectPage {
            reviewer: "",
            csrf: "",
            banner: "",
            banner_kind: "",
            target,
            heading,
            link_text,
        },
    )
}

/// A form's CSRF field.
#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /logout`: ends the session server side.
pub async fn logout(
    State(state): State<ReviewState>,
    signed: Option<Signed>,
    Form(form): Form<CsrfForm>,
) -> Response {
    let Some(signed) = signed else {
        return Redirect::to("/login").into_response();
    };
    if !same_token(&form.csrf, &signed.csrf) {
        return csrf_refused(&signed);
    }
    let d = signed.digest.clone();
    let _ = state
        .approvals
        .gate
        .db()
        .write(move |c| c.execute("DELETE FROM review_sessions WHERE token_digest = ?1", [&d]))
        .await;
    let mut response = Redirect::to("/login").into_response();
    if let Ok(v) = set_cookie(&state, SESSION_COOKIE, "", "/", 0).parse() {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
}

/// The answer to a form post without the session's CSRF token.
pub fn csrf_refused(signed: &Signed) -> Response {
    super::message(
        StatusCode::FORBIDDEN,
        Some(signed),
        "Refused",
        "The form was stale or did not come from this site (CSRF token missing or wrong). Nothing was changed; open the page again.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_secure_exactly_when_the_public_url_is_https() {
        for (url, secure) in [
            ("https://review.example.com", true),
            (" HTTPS://review.example.com/", true),
            ("http://review.example.com", false),
            ("http://127.0.0.1:8080", false),
        ] {
            let header = cookie_header(super::super::is_https(url), SESSION_COOKIE, "v", "/", 60);
            assert!(header.contains("; HttpOnly; SameSite=Strict"), "{header}");
            assert_eq!(header.ends_with("; Secure"), secure, "{url}: {header}");
        }
    }

    #[test]
    fn next_stays_on_this_site() {
        assert_eq!(safe_next("/approvals/ex_1"), "/approvals/ex_1");
        assert_eq!(safe_next("/threads/th_1"), "/threads/th_1");
        for bad in [
            "https://evil.test/",
            "//evil.test/approvals",
            "/approvals\\x",
            "/login",
            "/approvals?x=\"><",
        ] {
            assert_eq!(safe_next(bad), "/approvals", "{bad}");
        }
        // A page past the cap would be kept whole with every pending sign-in.
        let long = format!("/approvals/{}", "a".repeat(MAX_NEXT_BYTES));
        assert_eq!(safe_next(&long), "/approvals");
        let longest = format!("/approvals/{}", "a".repeat(MAX_NEXT_BYTES - 11));
        assert_eq!(safe_next(&longest), longest);
    }

    #[test]
    fn a_signed_out_request_returns_to_its_page_and_a_form_post_to_its_form() {
        let parts = |method: Method, uri: &str| {
            let request = axum::http::Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .expect("request");
            request.into_parts().0
        };
        for (method, uri, back) in [
            (Method::GET, "/approvals/history", "/approvals/history"),
            (Method::GET, "/approvals?page=2", "/approvals"),
            (Method::GET, "/threads/th_1", "/threads/th_1"),
            (Method::POST, "/approvals/ex_1/decide", "/approvals/ex_1"),
        ] {
            assert_eq!(return_to(&parts(method, uri)), back, "{uri}");
        }
    }

    #[test]
    fn tokens_compare_only_when_equal_and_not_empty() {
        assert!(same_token("abc", "abc"));
        assert!(!same_token("abc", "abd"));
        assert!(!same_token("", ""));
        assert!(!same_token("abc", "abcd"));
    }
}
