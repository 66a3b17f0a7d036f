//! The HTTP plumbing the connectors share: base URLs, the client, and the mapping of
//! transport failures to [`ConnectorError`].

use crate::secrets::ExposeSecret as _;
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{Client, RequestBuilder, StatusCode, Url};
use tracing::Instrument as _;

use super::{ConfigError, ConnectorError, Credential};

/// How long a request may take, connect to last byte, unless a connector is told otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A provider's answer, fully read.
pub(crate) struct HttpResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// Parses a connector's base URL: absolute, `http` or `https`, no query or fragment.
pub(crate) fn parse_base_url(url: &str) -> Result<Url, ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidBaseUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let parsed = Url::parse(url).map_err(|error| invalid(&error.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https"));
    }
    if parsed.cannot_be_a_base() || parsed.host().is_none() {
        return Err(invalid("it must be an absolute url with a host"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid("it must not carry a query or fragment"));
    }
    Ok(parsed)
}

/// `base` with `segments` appended as path segments (each one percent-encoded), keeping
/// any path the base already has.
pub(crate) fn endpoint(base: &Url, segments: &[&str]) -> Url {
    let mut url = base.clone();
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(segments);
    }
    url
}

/// The client every connector uses: rustls, no proxy from the environment, bounded time.
pub(crate) fn build_client(timeout: Duration) -> Result<Client, ConfigError> {
    Client::builder()
        .timeout(timeout)
        .connect_timeout(CONNECT_TIMEOUT.min(timeout))
        .user_agent(concat!("threadgate/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|error| ConfigError::Client(error_chain(&error)))
}

/// Sends `request` with `Authorization: Bearer <secret>` (the credential's current
/// value) and reads the whole answer. Transport failures become
/// [`ConnectorError::Unreachable`] when nothing can have been sent and
/// [`ConnectorError::Unknown`] otherwise; any text is scrubbed of `secret`.
pub(crate) async fn send(
    request: RequestBuilder,
    secret: &Credential,
) -> Result<HttpResponse, ConnectorError> {
    // The `http.*` spans (trace level, off in production) time the exchange's parts
    // for `benches/gateway_call.rs`.
    let key = secret
        .resolve()
        .instrument(tracing::trace_span!("http.resolve"))
        .await?;
    crate::store::counts::bump(crate::store::counts::Event::ProviderRequest);
    let response = request
        .bearer_auth(key.expose_secret())
        .send()
        .instrument(tracing::trace_span!("http.exchange"))
        .await
        .map_err(|error| classify_send_error(&error, secret))?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .bytes()
        .instrument(tracing::trace_span!("http.body"))
        .await
        .map_err(|error| ConnectorError::Unknown {
            message: secret.redact(&format!(
                "the request was sent but reading the answer failed: {}",
                error_chain(&error)
            )),
        })?;
    Ok(HttpResponse {
        status,
        headers,
        body: body.to_vec(),
    })
}

fn classify_send_error(error: &reqwest::Error, secret: &Credential) -> ConnectorError {
    let message = secret.redact(&error_chain(error));
    // INVARIANT: a builder or connect error happens before any request byte is written.
    if error.is_builder() || error.is_connect() {
        ConnectorError::Unreachable { message }
    } else {
        ConnectorError::Unknown { message }
    }
}

/// An error and its sources, joined with `: `.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A short, printable excerpt of a body for error messages.
pub(crate) fn body_excerpt(body: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(body);
    let trimmed = text.trim();
    match trimmed.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &trimmed[..cut]),
        None => trimmed.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked() {
        assert!(parse_base_url("http://127.0.0.1:8420").is_ok());
        assert!(parse_base_url("https://api.example.test/stripe/").is_ok());
        for bad in ["ftp://x", "not a url", "http://x/?a=1", "mailto:a@b"] {
            let error = parse_base_url(bad).unwrap_err();
            assert!(error.to_string().contains(bad), "{error}");
        }
    }

    #[test]
    fn endpoints_keep_the_base_path_and_encode_segments() {
        let base = parse_base_url("http://h:1/prefix/").unwrap();
        assert_eq!(
            endpoint(&base, &["v1", "charges", "ch_1"]).as_str(),
            "http://h:1/prefix/v1/charges/ch_1"
        );
        let root = parse_base_url("http://h:1").unwrap();
        assert_eq!(
            endpoint(&root, &["v1", "a/b"]).as_str(),
            "http://h:1/v1/a%2Fb"
        );
    }

    #[test]
    fn excerpts_are_bounded() {
        let long = "x".repeat(500);
        assert_eq!(body_excerpt(long.as_bytes()).chars().count(), 201);
        assert_eq!(body_excerpt(b"  short \n"), "short");
    }
}
