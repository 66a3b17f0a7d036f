//! Cumulative limits: under `policies/examples/refund-limits.yaml` ($25 unattended, at
//! most $100 a day per customer), twenty concurrent $24 refunds of one customer's
//! charges run $96: exactly four, the rest wait for a person.

use serde_json::json;

use crate::support::plain::repo_root;
use crate::support::world::{World, refunds};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_small_refunds_run_at_most_the_daily_limit() {
    let policy = repo_root().join("policies/examples/refund-limits.yaml");
    let text = std::fs::read_to_string(&policy).expect("policy");
    assert!(
        text.contains("lte: 2500") && text.contains("max: 10000"),
        "{text}"
    );
    let world = World::with_policy(&policy).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[3000; 20])
        .await;

    let mut calls = Vec::new();
    for charge in &ada.charges {
        let session = ada.session.clone();
        let args = json!({"charge": charge, "amount": 2400, "reason": "requested_by_customer"});
        calls.push(tokio::spawn(async move {
            session.call("stripe.create_refund", args, None).await
        }));
    }
    let mut ran = 0;
    let mut held = 0;
    for call in calls {
        let (status, body) = call.await.expect("task");
        match status {
            200 => ran += 1,
            202 => held += 1,
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!((ran, held), (4, 16));

    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 4, "{made:#?}");
    let total: u64 = made
        .iter()
        .map(|r| r["amount"].as_u64().expect("amount"))
        .sum();
    assert_eq!(total, 9600);
    let rows = app.executions().await;
    assert_eq!(rows.iter().filter(|r| r.status == "succeeded").count(), 4);
    assert_eq!(rows.iter().filter(|r| r.status == "held").count(), 16);
    let charged: i64 = app
        .db
        .read(|c| {
            c.query_row(
                "SELECT coalesce(sum(amount), 0) FROM limit_charges WHERE released = 0",
                (),
                |r| r.get(0),
            )
        })
        .await
        .expect("charges");
    assert_eq!(charged, 9600);
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_the_provider_refuses_gives_its_amount_back_to_the_limit() {
    let policy = repo_root().join("policies/examples/refund-limits.yaml");
    let world = World::with_policy(&policy).await;
    let app = world.start().await;
    // Four charges that can take a $24 refund, and one of $10 that cannot.
    let ada = world
        .customer_session(&app, "ada@example.com", &[1000, 3000, 3000, 3000, 3000])
        .await;
    let refund = |charge: &String| json!({"charge": charge, "amount": 2400, "reason": "duplicate"});

    let (status, body) = ada
        .session
        .call("stripe.create_refund", refund(&ada.charges[0]), None)
        .await;
    assert_eq!(
        status, 502,
        "Stripe refuses a refund larger than the charge: {body}"
    );
    assert_eq!(body["status"], "failed");
    let failed = app
        .execution(body["execution_id"].as_str().expect("id"))
        .await;
    assert_eq!(failed.status, "failed");

    // The refused $24 does not count: four more run ($96).
    for charge in &ada.charges[1..] {
        let (status, body) = ada
            .session
            .call("stripe.create_refund", refund(charge), None)
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 4);
    let charged: (i64, i64) = app
        .db
        .read(|c| {
            c.query_row(
                "SELECT coalesce(sum(amount) FILTER (WHERE released = 0), 0), \
                 coalesce(sum(amount) FILTER (WHERE released = 1), 0) FROM limit_charges",
                (),
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .await
        .expect("charges");
    assert_eq!(charged, (9600, 2400));
    app.stop().await;
}
