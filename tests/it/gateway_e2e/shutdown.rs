//! A clean shutdown (issue 18): work in flight is owned by the application and finishes
//! before it stops. A reviewer approves a refund, Stripe is slow to answer it, and the
//! application is told to stop meanwhile: it stops only once the refund has run and
//! its outcome is recorded, not with the call left `running` for the next start.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use threadgate::store::rusqlite;
use tokio::sync::Notify;

use crate::support::world::{World, refunds};

/// How long the slow Stripe holds a refund before passing it on.
const SLOW_REFUND: Duration = Duration::from_secs(2);

/// A Stripe in front of localstripe that passes every request on, holding each refund
/// for [`SLOW_REFUND`] and telling [`SlowStripe::refund_arrived`] when one comes.
#[derive(Clone)]
struct SlowStripe {
    upstream: String,
    http: reqwest::Client,
    refund_arrived: Arc<Notify>,
}

async fn pass_on(
    State(stripe): State<SlowStripe>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method == Method::POST && uri.path() == "/v1/refunds" {
        stripe.refund_arrived.notify_one();
        tokio::time::sleep(SLOW_REFUND).await;
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

/// Starts the slow Stripe in front of `upstream`; answers its base URL.
async fn slow_stripe(upstream: String, refund_arrived: Arc<Notify>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = axum::Router::new()
        .fallback(pass_on)
        .with_state(SlowStripe {
            upstream,
            http: reqwest::Client::new(),
            refund_arrived,
        });
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    format!("http://{addr}")
}

/// The execution's status, read from the database file (the app has stopped).
fn stored_status(world: &World, id: &str) -> String {
    let conn = rusqlite::Connection::open(world.settings.database_path()).expect("open db");
    conn.query_row("SELECT status FROM executions WHERE id = ?1", [id], |r| {
        r.get(0)
    })
    .expect("the execution's row")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_shutdown_waits_for_an_approved_call_in_flight() {
    let mut world = World::new().await;
    let refund_arrived = Arc::new(Notify::new());
    world.settings.stripe.api_url =
        slow_stripe(world.stripe.base_url(), refund_arrived.clone()).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let id = ada.session.hold_refund(&ada.charges[0], 900).await;
    let alice = app.add_reviewer("alice").await;
    let (status, body) = app.decide(&id, &alice, "approve", "").await;
    assert_eq!(status, 200, "{body}");

    // The approved refund is on its way to Stripe, which holds it: stop now.
    tokio::time::timeout(Duration::from_secs(30), refund_arrived.notified())
        .await
        .expect("the approved refund reaches Stripe");
    app.stop().await;

    assert_eq!(stored_status(&world, &id), "succeeded");
    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 1, "{made:#?}");
    assert_eq!(made[0]["metadata"]["threadgate_execution_id"], id.as_str());
}
