//! Issue 7 item 1: under the shipped `policies/support.yaml`, `stripe.create_refund` with
//! `reason: duplicate` runs alone only when it is small and the gateway itself finds the
//! duplicate charge in Stripe (localstripe here). On the old policy, a refund of
//! $999,999 called a duplicate ran unattended.

use serde_json::json;

use crate::support::world::{World, refunds};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_duplicate_refund_is_held_even_when_the_duplicate_exists() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[99_999_900, 99_999_900])
        .await;
    let args = json!({"charge": ada.charges[1], "amount": 99_999_900, "reason": "duplicate"});
    let (status, body) = ada.session.call("stripe.create_refund", args, None).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "pending_approval");
    assert!(refunds(&world.stripe).await.is_empty());
    let rows = app.executions().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, "held");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_refund_without_a_duplicate_charge_is_held() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900, 2000])
        .await;
    let args = json!({"charge": ada.charges[0], "amount": 4900, "reason": "duplicate"});
    let (status, body) = ada.session.call("stripe.create_refund", args, None).await;
    assert_eq!(status, 202, "{body}");
    assert!(refunds(&world.stripe).await.is_empty());
    let rows = app.executions().await;
    assert!(
        rows[0]
            .because
            .contains("evidence duplicate_charge within 7d (line 25): not found, fails"),
        "{}",
        rows[0].because
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_refund_of_a_real_duplicate_runs_until_the_daily_limit() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900, 4900, 4900, 4900])
        .await;
    let mut statuses = Vec::new();
    for charge in &ada.charges[1..] {
        let args = json!({"charge": charge, "amount": 4900, "reason": "duplicate"});
        let (status, body) = ada.session.call("stripe.create_refund", args, None).await;
        statuses.push(status);
        if status == 200 {
            assert_eq!(body["status"], "ok", "{body}");
        }
    }
    // $49 + $49 fit the $100 a day; the third waits for a person.
    assert_eq!(statuses, [200, 200, 202]);
    assert_eq!(refunds(&world.stripe).await.len(), 2);
    let rows = app.executions().await;
    assert!(
        rows[0]
            .because
            .contains("evidence duplicate_charge within 7d (line 25): found"),
        "{}",
        rows[0].because
    );
    app.stop().await;
}
