//! The runner's only way out: HTTP/1.1 over the session's unix socket
//! (`/run/threadgate/api.sock`), one connection per request.
//!
//! Every answer is read in full (bounded by [`MAX_BODY`]) and parsed as JSON; a body
//! that is not JSON becomes `{"raw": "..."}` so the caller can still report it. Callers
//! read a body as its `threadgate_api` type with [`Reply::read`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use threadgate_api::ErrorAnswer;
use tokio::net::UnixStream;

/// The largest answer the runner reads from the socket.
const MAX_BODY: usize = 8 * 1024 * 1024;

/// How long one request may take, long polls included (they wait at most 60 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);

/// One answer from the socket: its status and its JSON body.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    /// Whether the status is 2xx.
    pub(crate) fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as the API's type `T`.
    pub(crate) fn read<T: DeserializeOwned>(&self) -> anyhow::Result<T> {
        T::deserialize(&self.body).with_context(|| {
            format!(
                "HTTP {}: the answer is not a {}",
                self.status,
                std::any::type_name::<T>()
            )
        })
    }

    /// The error code of an error answer (`{"status": "error", "error": CODE}`), or `""`.
    pub(crate) fn code(&self) -> String {
        self.read::<ErrorAnswer>()
            .map(|e| e.body().error.clone())
            .unwrap_or_default()
    }
}

/// A client of the session socket.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    socket: PathBuf,
}

impl Api {
    /// A client for the socket at `socket`.
    pub(crate) fn new(socket: impl Into<PathBuf>) -> Api {
        Api {
            socket: socket.into(),
        }
    }

    /// `GET path`.
    pub(crate) async fn get(&self, path: &str) -> anyhow::Result<Reply> {
        self.send(Method::GET, path, None).await
    }

    /// `POST path` with `body` as JSON.
    pub(crate) async fn post(&self, path: &str, body: &impl Serialize) -> anyhow::Result<Reply> {
        let body = serde_json::to_vec(body)?;
        self.send(Method::POST, path, Some(body)).await
    }

    /// `PUT path` with `body` as JSON.
    pub(crate) async fn put(&self, path: &str, body: &impl Serialize) -> anyhow::Result<Reply> {
        let body = serde_json::to_vec(body)?;
        self.send(Method::PUT, path, Some(body)).await
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Reply> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.send_inner(method.clone(), path, body))
            .await
            .map_err(|_| anyhow!("{method} {path}: no answer within {REQUEST_TIMEOUT:?}"))?
    }

    async fn send_inner(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Reply> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .with_context(|| format!("connect {}", self.socket.display()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("http handshake on the session socket")?;
        let driver = tokio::spawn(async move {
            // The connection ends with the request; its error, if any, shows in the reply.
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header("host", "threadgate");
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(Full::new(body.map(Bytes::from).unwrap_or_default()))?;
        let res = sender
            .send_request(req)
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = res.status().as_u16();
        let collected = Limited::new(res.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| anyhow!("{method} {path}: reading the answer: {e}"))?
            .to_bytes();
        driver.abort();
        let body = serde_json::from_slice(&collected).unwrap_or_else(
            |_| json!({"raw": String::from_utf8_lossy(collected.get(..2000).unwrap_or(&collected))}),
        );
        Ok(Reply { status, body })
    }
}

#[cfg(test)]
mod tests {
    use threadgate_api::{CallAnswer, ExecutionView};

    use super::*;

    #[test]
    fn an_answer_reads_as_its_type_or_says_what_it_is_not() {
        let refused = Reply {
            status: 403,
            body: json!({"status": "error", "error": "out_of_scope", "message": "m"}),
        };
        assert_eq!(refused.code(), "out_of_scope");
        assert!(matches!(
            refused.read::<CallAnswer>(),
            Ok(CallAnswer::Error(_))
        ));
        let e = refused.read::<ExecutionView>().unwrap_err();
        assert!(
            format!("{e:#}").contains("HTTP 403: the answer is not a"),
            "{e:#}"
        );
        let raw = Reply {
            status: 502,
            body: json!({"raw": "Bad Gateway"}),
        };
        assert_eq!(raw.code(), "", "not an error answer");
        assert!(raw.read::<CallAnswer>().is_err());
    }
}
