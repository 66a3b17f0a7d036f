//! The one `Host` check of a session socket, in front of every route it serves (the
//! REST sandbox API, the model proxy and `/mcp`): a request must name the socket by
//! one of [`SANDBOX_HOSTS`], with any port. Nothing outside the container reaches the
//! socket; the check keeps a page a rebound DNS name points at the runner's loopback
//! bridge from talking to it.

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};

use crate::api_error::ApiError;

/// The names a request to a session socket may give as its `Host` (any port): the
/// loopback names and addresses the runner's bridge is reached at inside the
/// container, and the names clients put on the unix socket itself.
pub const SANDBOX_HOSTS: &[&str] = &["localhost", "127.0.0.1", "[::1]", "threadgate", "sandbox"];

/// Whether `headers` name the socket by one of [`SANDBOX_HOSTS`]. A missing, unreadable
/// or malformed `Host` (user information included) is refused.
pub fn host_allowed(headers: &HeaderMap) -> bool {
    let Some(host) = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.contains('@'))
        .and_then(|h| h.parse::<axum::http::uri::Authority>().ok())
    else {
        return false;
    };
    let name = host.host().trim_end_matches('.');
    SANDBOX_HOSTS
        .iter()
        .any(|allowed| name.eq_ignore_ascii_case(allowed))
}

/// The middleware: 403 `host_not_allowed` unless [`host_allowed`].
pub async fn check_host(request: Request, next: Next) -> Response {
    if host_allowed(request.headers()) {
        return next.run(request).await;
    }
    ApiError::new(
        StatusCode::FORBIDDEN,
        "host_not_allowed",
        format!(
            "the Host header must name the sandbox API as one of {} (any port)",
            SANDBOX_HOSTS.join(", ")
        ),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(host: Option<&str>) -> bool {
        let mut headers = HeaderMap::new();
        if let Some(h) = host {
            headers.insert(header::HOST, h.parse().expect("header value"));
        }
        host_allowed(&headers)
    }

    #[test]
    fn loopback_and_the_sockets_names_pass_with_any_port() {
        for ok in [
            "localhost",
            "LOCALHOST:7345",
            "127.0.0.1",
            "127.0.0.1:7345",
            "[::1]",
            "[::1]:7345",
            "threadgate",
            "sandbox",
            "sandbox:80",
        ] {
            assert!(check(Some(ok)), "{ok}");
        }
        for bad in [
            None,
            Some(""),
            Some("evil.example"),
            Some("127.0.0.1.evil.example"),
            Some("localhost.evil.example:7345"),
            Some("10.0.0.1"),
            Some("[::2]"),
            Some("user@localhost"),
            Some("localhost/x"),
        ] {
            assert!(!check(bad), "{bad:?}");
        }
    }
}
