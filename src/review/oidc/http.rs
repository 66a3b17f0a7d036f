//! The HTTP client `openidconnect` calls the provider with (discovery, keys, the token
//! endpoint): the server's own reqwest, without redirects (a redirect could point a
//! request anywhere), with a deadline and a cap on every answer's size.

use std::time::Duration;

use openidconnect::{HttpRequest, HttpResponse};

/// The most bytes read of one answer of the provider.
pub const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// How long one request to the provider may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request to the provider failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderHttpError {
    #[error("cannot reach the identity provider: {0}")]
    Send(#[source] reqwest::Error),
    #[error("the identity provider's answer is over {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
    #[error("the identity provider's answer cannot be read: {0}")]
    Answer(String),
}

/// The provider's HTTP client.
#[derive(Clone)]
pub struct ProviderHttp {
    client: reqwest::Client,
}

impl ProviderHttp {
    /// A client that follows no redirect and gives up after [`TIMEOUT`].
    pub fn new() -> Result<ProviderHttp, ProviderHttpError> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(TIMEOUT)
            .build()
            .map_err(ProviderHttpError::Send)?;
        Ok(ProviderHttp { client })
    }

    /// The client as `openidconnect` calls it: each request on a clone of this client,
    /// so the future borrows nothing (and stays `Send` wherever it is awaited).
    pub fn caller(
        &self,
    ) -> impl Fn(
        HttpRequest,
    ) -> std::pin::Pin<
        Box<dyn Future<Output = Result<HttpResponse, ProviderHttpError>> + Send>,
    > + use<> {
        let http = self.clone();
        move |request| {
            let http = http.clone();
            Box::pin(async move { http.send(request).await })
        }
    }

    /// Sends `request` and reads its answer (at most [`MAX_ANSWER_BYTES`]).
    pub async fn send(&self, request: HttpRequest) -> Result<HttpResponse, ProviderHttpError> {
        let request = reqwest::Request::try_from(request).map_err(ProviderHttpError::Send)?;
        let mut answer = self
            .client
            .execute(request)
            .await
            .map_err(ProviderHttpError::Send)?;
        let mut body = Vec::new();
        while let Some(chunk) = answer.chunk().await.map_err(ProviderHttpError::Send)? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(ProviderHttpError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        let mut built = openidconnect::http::Response::builder().status(answer.status());
        for (name, value) in answer.headers() {
            built = built.header(name, value);
        }
        built
            .body(body)
            .map_err(|e| ProviderHttpError::Answer(e.to_string()))
    }
}
