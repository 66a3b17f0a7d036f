//! Approvals: twenty reviewers' requests racing on one held refund make one refund;
//! the approval binds one exact request; a denial's message reaches the agent; an
//! expired hold answers 410 and never runs.

use std::time::Duration;

use serde_json::json;

use crate::support::unix_http::unix_request;
use crate::support::world::{World, refunds};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_approvals_make_exactly_one_refund() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let charge = ada.charges[0].clone();
    let args = json!({"charge": charge, "amount": 1000, "reason": "requested_by_customer"});
    let (status, held) = ada
        .session
        .call(
            "stripe.create_refund",
            args.clone(),
            Some("the customer cancelled within the trial"),
        )
        .await;
    assert_eq!(status, 202, "{held}");
    let id = held["execution_id"].as_str().expect("id").to_owned();

    // The agent's socket has no route to decide anything.
    let (status, _) = unix_request(
        &ada.session.socket,
        "POST",
        &format!("/api/approvals/{id}"),
        Some(&json!({"decision": "approve"})),
    )
    .await;
    assert_eq!(status, 404);
    // The approval link is a pointer: without a reviewer's credential it shows nothing.
    let anonymous = app
        .http
        .get(format!("http://{}/approvals/{id}", app.addr))
        .send()
        .await
        .expect("get");
    assert_eq!(anonymous.status().as_u16(), 401);
    assert_eq!(app.execution(&id).await.status, "held");

    let alice = app.add_reviewer("alice").await;
    let bob = app.add_reviewer("bob").await;
    let mut racing = Vec::new();
    for i in 0..20 {
        let token = if i % 2 == 0 {
            alice.clone()
        } else {
            bob.clone()
        };
        let (addr, http, id) = (app.addr, app.http.clone(), id.clone());
        racing.push(tokio::spawn(async move {
            let response = http
                .post(format!("http://{addr}/api/approvals/{id}"))
                .bearer_auth(token)
                .json(&json!({"decision": "approve", "message": "ok, refund it"}))
                .send()
                .await
                .expect("approve");
            response.status().as_u16()
        }));
    }
    let mut statuses = Vec::new();
    for task in racing {
        statuses.push(task.await.expect("task"));
    }
    statuses.sort();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let conflict = statuses.iter().filter(|s| **s == 409).count();
    assert_eq!((ok, conflict), (1, 19), "{statuses:?}");

    // The agent's wait returns the real refund.
    let done = ada.session.wait(&id, 30).await;
    assert_eq!(done["status"], "ok", "{done}");
    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 1, "{made:#?}");
    assert_eq!(done["result"]["id"], made[0]["id"]);
    assert_eq!(made[0]["amount"], 1000);
    assert_eq!(made[0]["metadata"]["threadgate_execution_id"], id.as_str());
    let row = app.execution(&id).await;
    assert_eq!(row.status, "succeeded");
    assert!(
        ["alice", "bob"].contains(&done["reviewer"].as_str().unwrap_or_default()),
        "{done}"
    );

    // The same request again is answered with the earlier result; nothing runs again.
    let (status, replay) = ada
        .session
        .call("stripe.create_refund", args.clone(), None)
        .await;
    assert_eq!(status, 200, "{replay}");
    assert_eq!(replay["execution_id"], id.as_str());
    assert_eq!(replay["replayed"], true);

    // Changed arguments need their own approval.
    let changed = json!({"charge": charge, "amount": 500, "reason": "requested_by_customer"});
    let (status, again) = ada
        .session
        .call("stripe.create_refund", changed, Some("a partial refund"))
        .await;
    assert_eq!(status, 202, "{again}");
    let second = again["execution_id"].as_str().expect("id").to_owned();
    assert_ne!(second, id);
    assert_eq!(app.execution(&second).await.status, "held");

    // A denial's message reaches the agent through the execution; nothing runs.
    let message = "Offer a coupon instead of a second refund.";
    let (status, denied) = app.decide(&second, &alice, "deny", message).await;
    assert_eq!(status, 200, "{denied}");
    let seen = ada.session.wait(&second, 30).await;
    assert_eq!(seen["status"], "denied", "{seen}");
    assert_eq!(seen["message"], message);
    assert_eq!(seen["reviewer"], "alice");
    let (status, _) = app.decide(&second, &bob, "approve", "").await;
    assert_eq!(status, 409, "a denied call cannot be approved afterwards");
    // Denied is final (every move of a call is a compare-and-set from the state before),
    // and the refused approval left no trace: nothing can run it now.
    assert_eq!(app.execution(&second).await.status, "denied");
    assert_never_approved_or_ran(&app.audit_events_of(&second).await, "denied");
    assert_eq!(refunds(&world.stripe).await.len(), 1);
    let charge_now = world.stripe.get(&format!("charges/{charge}")).await;
    assert_eq!(charge_now["amount_refunded"], 1000);

    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_approval_answers_410_and_never_runs() {
    let world = World::with_approval_ttl("1s").await;
    let (app, clock) = world.start_with_clock().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let id = ada.session.hold_refund(&ada.charges[0], 1000).await;
    let alice = app.add_reviewer("alice").await;
    // Past the ttl on threadgate's clock, without waiting for it.
    clock.advance(Duration::from_secs(2));

    let (status, body) = app.decide(&id, &alice, "approve", "too late").await;
    assert_eq!(status, 410, "{body}");
    let seen = ada.session.wait(&id, 5).await;
    assert_eq!(seen["status"], "expired", "{seen}");
    let (status, _) = app.decide(&id, &alice, "approve", "again").await;
    assert_eq!(status, 410);
    let row = app.execution(&id).await;
    assert_eq!(row.status, "expired");
    assert_never_approved_or_ran(&app.audit_events_of(&id).await, "expired");
    assert!(refunds(&world.stripe).await.is_empty());

    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

/// A call's audit trail ends in `last` and never shows an approval or a run.
fn assert_never_approved_or_ran(events: &[String], last: &str) {
    assert_eq!(events.last().map(String::as_str), Some(last), "{events:?}");
    assert!(
        !events.iter().any(|e| e == "approved" || e == "ran"),
        "{events:?}"
    );
}

/// A decision recorded by another instance (here: written to the shared database without
/// this instance's announcement) reaches the agent waiting on this one: the wait reads
/// its execution again every `RELOAD_EVERY`, whether or not a change was announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_made_elsewhere_reaches_the_waiting_agent() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let id = ada.session.hold_refund(&ada.charges[0], 1000).await;
    let session = ada.session.clone();
    let waiting_id = id.clone();
    let waiting = tokio::spawn(async move { session.wait(&waiting_id, 20).await });
    // The wait is under way (it reads the execution as held) before the change.
    tokio::time::sleep(threadgate::gateway::wait::RELOAD_EVERY).await;
    let row_id = id.clone();
    let changed = app
        .db
        .write(move |c| {
            c.execute(
                "UPDATE executions SET status = 'denied', reviewer = 'bob', \
                 decision_message = 'decided on another instance' \
                 WHERE id = ?1 AND status = 'held'",
                [row_id.clone()],
            )
        })
        .await
        .expect("write");
    assert_eq!(changed, 1);
    let seen = waiting.await.expect("wait task");
    // Without the reload the wait would have run its 20 s and answered `held`.
    assert_eq!(seen["status"], "denied", "{seen}");
    assert_eq!(seen["message"], "decided on another instance");
    assert!(refunds(&world.stripe).await.is_empty());
    app.stop().await;
}
