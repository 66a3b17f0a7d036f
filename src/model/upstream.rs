//! The upstream client: writes a [`ChatRequest`] in the configured provider's format
//! ([`Upstream::encode`]), sends that body with the stored key (read per call through the secrets store, cached until the
//! store's generation moves, like a connector's [`Credential`]), retries timeouts, 429s (honouring `Retry-After`) and 5xx with
//! backoff, all within one deadline per call (`retry_deadline`: no attempt runs and no
//! wait lasts past it), and reads a bounded answer.

use crate::secrets::ExposeSecret as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use backon::Retryable as _;
use reqwest::StatusCode;
use serde_json::Value;

use super::config::{ModelSettings, Provider};
use super::types::{ChatAnswer, ChatRequest};
use super::{anthropic, openai};
use crate::connectors::Credential;
use crate::secrets::{Redactor, SecretString};

/// Why no answer came back.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The upstream failed (after the retries, or with an error not worth retrying):
    /// it may have billed what it began.
    #[error("{0}")]
    Failed(String),
    /// The upstream refused the request outright (a 4xx other than 429), or there was
    /// no key to send it with: nothing was billed.
    #[error("{0}")]
    Refused(String),
    /// The upstream answered, but not with a usable answer.
    #[error("{0}")]
    Malformed(String),
}

/// One answer and how many attempts it took.
#[derive(Debug)]
pub struct Answered {
    pub answer: ChatAnswer,
    pub attempts: u32,
}

/// The configured upstream.
pub struct Upstream {
    settings: ModelSettings,
    key: Credential,
    client: reqwest::Client,
}

/// What one attempt came to.
enum Attempt {
    Done(Result<ChatAnswer, UpstreamError>),
    /// Worth another try, after the wait the upstream asked for (if any).
    Retry(String, Option<Duration>),
}

/// A failed attempt, as the retry sees it: final, or worth another try (why, and the
/// wait the upstream asked for).
enum Failure {
    Final(UpstreamError),
    Retry(String, Option<Duration>),
}

impl Upstream {
    /// A client for `settings` whose key is `key` (a live credential reading the
    /// secrets store's `settings.key_secret` at each call).
    pub fn new(settings: ModelSettings, key: Credential) -> anyhow::Result<Upstream> {
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Upstream {
            settings,
            key,
            client,
        })
    }

    /// `request` in the provider's format: what [`Upstream::send`] sends, once
    /// serialised (the proxy scans and measures exactly that).
    /// The tools' schemas, which can be most of a request, are moved into the body
    /// rather than copied.
    pub fn encode(&self, mut request: ChatRequest) -> Value {
        let schemas: Vec<Value> = request
            .tools
            .iter_mut()
            .map(|t| t.parameters.take())
            .collect();
        let (mut body, slot) = match self.settings.provider {
            Provider::Openai | Provider::Scripted => {
                (openai::request_to_wire(&request), "/function/parameters")
            }
            Provider::Anthropic => (
                anthropic::request_to_wire(&request, self.settings.default_max_tokens),
                "/input_schema",
            ),
        };
        drop(request);
        // Both adapters write one tool per offered tool, in order.
        if let Some(tools) = body.get_mut("tools").and_then(Value::as_array_mut) {
            for (tool, schema) in tools.iter_mut().zip(schemas) {
                if let Some(at) = tool.pointer_mut(slot) {
                    *at = schema;
                }
            }
        }
        body
    }

    /// Sends `body` (an [`Upstream::encode`]d request, serialised), retrying what is
    /// worth retrying on [`Upstream::schedule`] (a `backon` retry); `redactor` cleans
    /// error text.
    pub async fn send(&self, body: Bytes, redactor: &Redactor) -> Result<Answered, UpstreamError> {
        let key = self.current_key().await?;
        let started = tokio::time::Instant::now();
        let deadline = self.settings.retry_deadline;
        let attempts = AtomicU32::new(0);
        // The wait that would have passed the deadline, when that ended the retries.
        let mut past_deadline = None;
        let retries = usize::try_from(self.settings.retries).unwrap_or(usize::MAX);
        let (body, key, counted) = (&body, key.as_deref(), &attempts);
        let result = (move || async move {
            counted.fetch_add(1, Ordering::Relaxed);
            let left = deadline
                .saturating_sub(started.elapsed())
                .min(self.settings.timeout);
            match self.attempt(body, key, left).await {
                Attempt::Done(result) => result.map_err(Failure::Final),
                Attempt::Retry(why, asked) => Err(Failure::Retry(why, asked)),
            }
        })
        .retry(self.schedule().builder().with_max_times(retries))
        .when(|failure| matches!(failure, Failure::Retry(..)))
        .adjust(|failure, next| {
            let Failure::Retry(_, asked) = failure else {
                return None;
            };
            let wait = self.wait_before(next?, *asked);
            // The next attempt must start before the deadline.
            if started.elapsed() + wait >= deadline {
                past_deadline = Some(wait);
                return None;
            }
            Some(wait)
        })
        .notify(|_, wait| {
            tracing::warn!(
                attempt = attempts.load(Ordering::Relaxed),
                wait_ms = crate::clock::ms_u64(wait),
                "model upstream failed; retrying"
            );
        })
        .await;
        let attempts = attempts.load(Ordering::Relaxed);
        let why = match result {
            Ok(answer) => return Ok(Answered { answer, attempts }),
            Err(Failure::Final(e)) => return Err(clean(e, redactor)),
            Err(Failure::Retry(why, _)) => redactor.redact(&why).into_owned(),
        };
        Err(UpstreamError::Failed(match past_deadline {
            Some(wait) => format!(
                "the model upstream failed {attempts} times and another wait of {} ms would pass the call's deadline of {} ms; last: {why}",
                wait.as_millis(),
                deadline.as_millis()
            ),
            None => format!("the model upstream failed {attempts} times; last: {why}"),
        }))
    }

    /// The upstream's retry schedule: `retry_base`, doubling, at most 1024 times it
    /// (each wait is capped again at `max_retry_wait` by [`Upstream::wait_before`]).
    fn schedule(&self) -> crate::retry::Schedule {
        let base = self.settings.retry_base;
        crate::retry::Schedule::doubling(base, base.saturating_mul(1024))
    }

    /// The stored key as of now (`None` for the scripted server, which needs none).
    async fn current_key(&self) -> Result<Option<Arc<SecretString>>, UpstreamError> {
        match self.key.resolve().await {
            Ok(key) => Ok(Some(key)),
            Err(_) if self.settings.provider == Provider::Scripted => Ok(None),
            Err(e) => {
                tracing::warn!(secret = %self.settings.key_secret, error = %e, "no model key");
                Err(UpstreamError::Refused(format!(
                    "no model key is stored under {:?} (threadgate secrets set {})",
                    self.settings.key_secret, self.settings.key_secret
                )))
            }
        }
    }

    /// The wait before the next attempt: what the upstream asked for, else the
    /// schedule's `backoff`; never more than `max_retry_wait`.
    fn wait_before(&self, backoff: Duration, asked: Option<Duration>) -> Duration {
        asked
            .unwrap_or(crate::retry::whole_ms(backoff))
            .min(self.settings.max_retry_wait)
    }

    /// The HTTP request carrying `body`, with its key.
    fn build(&self, body: &Bytes, key: Option<&SecretString>) -> reqwest::RequestBuilder {
        let base = self.settings.base_url.trim_end_matches('/');
        let url = match self.settings.provider {
            Provider::Openai | Provider::Scripted => format!("{base}/chat/completions"),
            Provider::Anthropic => format!("{base}/v1/messages"),
        };
        let http = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        match (self.settings.provider, key) {
            (Provider::Anthropic, key) => {
                let http = http.header("anthropic-version", &self.settings.anthropic_version);
                match key {
                    Some(key) => http.header("x-api-key", key.expose_secret()),
                    None => http,
                }
            }
            (_, Some(key)) => http.bearer_auth(key.expose_secret()),
            (_, None) => http,
        }
    }

    /// One attempt, given at most `left` (the call's remaining time, at most the
    /// per-attempt timeout).
    async fn attempt(&self, body: &Bytes, key: Option<&SecretString>, left: Duration) -> Attempt {
        let http = self.build(body, key).timeout(left);
        let response = match http.send().await {
            Ok(r) => r,
            Err(e) => return Attempt::Retry(describe(&e), None),
        };
        let status = response.status();
        let asked = retry_after(&response);
        let body = match read_bounded(response, self.settings.max_answer_bytes).await {
            Ok(b) => b,
            Err(why) if status.is_success() => {
                return Attempt::Done(Err(UpstreamError::Malformed(why)));
            }
            Err(why) => return Attempt::Retry(why, asked),
        };
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            return Attempt::Retry(format!("HTTP {status}"), asked);
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(body.get(..300).unwrap_or(&body)).into_owned();
            return Attempt::Done(Err(UpstreamError::Refused(format!(
                "the model upstream refused the request: HTTP {status}: {text}"
            ))));
        }
        Attempt::Done(self.parse(&body))
    }

    /// Reads a 2xx answer's body; anything unusable is malformed.
    fn parse(&self, body: &[u8]) -> Result<ChatAnswer, UpstreamError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            UpstreamError::Malformed(format!("the model upstream's answer is not JSON: {e}"))
        })?;
        let parsed = match self.settings.provider {
            Provider::Anthropic => anthropic::parse_answer(&value),
            _ => openai::parse_answer(&value),
        };
        parsed.map_err(|e| {
            UpstreamError::Malformed(format!("the model upstream's answer is malformed: {e}"))
        })
    }
}

fn clean(e: UpstreamError, redactor: &Redactor) -> UpstreamError {
    match e {
        UpstreamError::Failed(t) => UpstreamError::Failed(redactor.redact(&t).into_owned()),
        UpstreamError::Refused(t) => UpstreamError::Refused(redactor.redact(&t).into_owned()),
        UpstreamError::Malformed(t) => UpstreamError::Malformed(redactor.redact(&t).into_owned()),
    }
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "the model upstream timed out".into()
    } else if e.is_connect() {
        "cannot connect to the model upstream".into()
    } else {
        "the model upstream request failed".into()
    }
}

/// `Retry-After` in seconds (the HTTP-date form is treated as absent).
fn retry_after(r: &reqwest::Response) -> Option<Duration> {
    r.headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

async fn read_bounded(mut r: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        match r.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > max {
                    return Err(format!("the model upstream's answer exceeds {max} bytes"));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) => return Err(describe(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use backon::BackoffBuilder as _;

    fn upstream(base: Duration, max_retry_wait: Duration) -> Upstream {
        let settings = ModelSettings {
            retry_base: base,
            max_retry_wait,
            ..ModelSettings::default()
        };
        Upstream::new(settings, Credential::new("k")).unwrap()
    }

    /// The waits before each retry when the upstream asks for none.
    fn waits(up: &Upstream, retries: usize) -> Vec<u128> {
        let schedule = up.schedule().builder().build();
        schedule
            .take(retries)
            .map(|d| up.wait_before(d, None).as_millis())
            .collect()
    }

    #[test]
    fn retries_wait_double_from_the_base_up_to_the_longest_wait() {
        let up = upstream(Duration::from_millis(500), Duration::from_secs(30));
        assert_eq!(
            waits(&up, 8),
            [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]
        );
        // The doubling itself stops at 1024 times the base.
        let quick = upstream(Duration::from_millis(1), Duration::from_secs(3600));
        assert_eq!(waits(&quick, 13)[10..], [1_024, 1_024, 1_024]);
    }

    #[test]
    fn a_retry_after_replaces_the_backoff_but_not_the_longest_wait() {
        let up = upstream(Duration::from_millis(500), Duration::from_secs(30));
        let backoff = Duration::from_millis(500);
        let asked = |s| up.wait_before(backoff, Some(Duration::from_secs(s)));
        assert_eq!(asked(3), Duration::from_secs(3));
        assert_eq!(asked(0), Duration::ZERO);
        assert_eq!(asked(90), Duration::from_secs(30));
    }
}
