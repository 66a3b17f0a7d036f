//! A Stripe in front of localstripe that passes every request on, holding each refund
//! for a while and telling the test when one arrives: a refund still on its way, for
//! as long as a test needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use tokio::sync::Notify;

/// The slow Stripe's state: where it passes requests on, and how long it holds a refund.
#[derive(Clone)]
struct SlowStripe {
    upstream: String,
    hold: Duration,
    http: reqwest::Client,
    refund_arrived: Arc<Notify>,
    refunds: Arc<AtomicUsize>,
}

async fn pass_on(
    State(stripe): State<SlowStripe>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method == Method::POST && uri.path() == "/v1/refunds" {
        stripe.refunds.fetch_add(1, Ordering::SeqCst);
        stripe.refund_arrived.notify_one();
        tokio::time::sleep(stripe.hold).await;
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = stripe
        .http
        .request(method, format!("{}{path}", stripe.upstream))
        .body(body);
    for (name, value) in &headers {
        if name != "host" && name != "content-length" {
            request = request.header(name, value);
        }
    }
    let answer = request.send().await.expect("localstripe answers");
    let status = StatusCode::from_u16(answer.status().as_u16()).expect("status");
    let kind = answer.headers().get("content-type").cloned();
    let body = answer.bytes().await.expect("localstripe's body");
    let mut response = (status, body).into_response();
    if let Some(kind) = kind {
        response.headers_mut().insert("content-type", kind);
    }
    response
}

/// Starts a Stripe in front of `upstream` that holds each refund (`POST /v1/refunds`)
/// for `hold` before passing it on, and notifies `refund_arrived` as one comes (one
/// permit is kept when nobody waits yet). Answers its base URL.
pub async fn start(upstream: String, hold: Duration, refund_arrived: Arc<Notify>) -> String {
    start_counted(upstream, hold, refund_arrived).await.0
}

/// [`start`], also answering how many refunds have arrived so far (each counted as it
/// arrives, before its hold).
pub async fn start_counted(
    upstream: String,
    hold: Duration,
    refund_arrived: Arc<Notify>,
) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let refunds = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .fallback(pass_on)
        .with_state(SlowStripe {
            upstream,
            hold,
            http: reqwest::Client::new(),
            refund_arrived,
            refunds: refunds.clone(),
        });
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (format!("http://{addr}"), refunds)
}
