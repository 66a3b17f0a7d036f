//! A clean shutdown (issue 18): work in flight is owned by the application and finishes
//! before it stops. A reviewer approves a refund, Stripe is slow to answer it, and the
//! application is told to stop meanwhile: it stops only once the refund has run and
//! its outcome is recorded, not with the call left `running` for the next start.

use std::sync::Arc;
use std::time::Duration;

use threadgate::store::rusqlite;
use tokio::sync::Notify;

use crate::support::slow_stripe;
use crate::support::world::{World, refunds};

/// How long the slow Stripe holds a refund before passing it on.
const SLOW_REFUND: Duration = Duration::from_secs(2);

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
        slow_stripe::start(world.stripe.base_url(), SLOW_REFUND, refund_arrived.clone()).await;
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
