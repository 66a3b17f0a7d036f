//! Approving a narrower request from the page: the narrowed request is bound anew (a new
//! binding hash), and it is decided again against the policy in force with the limits'
//! real totals, so a `block` rule, including one that applies only once earlier calls
//! used a limit up, refuses it.

use serde_json::json;

use super::web::{Web, add_reviewer};
use crate::support::app::TestApp;
use crate::support::world::{World, refunds};

/// Small refunds (at most $5) run alone up to $10 a customer a day; past that they are
/// refused; a refund of at most $1 is always refused; larger ones wait for a person.
const POLICY: &str = "\
policy:
  default_mode: risk

policies:
  - match: \"stripe.create_refund\"
    action: block
    conditions:
      - arg: amount
        lte: 100
  - match: \"stripe.create_refund\"
    action: always_run
    conditions:
      - arg: amount
        lte: 500
    limits:
      - sum: amount
        per: customer
        window: 24h
        max: 1000
  - match: \"stripe.create_refund\"
    action: block
    conditions:
      - arg: amount
        lte: 500
  - match: \"stripe.create_refund\"
    action: require_approval
";

async fn binding_of(app: &TestApp, id: &str) -> String {
    let id = id.to_owned();
    app.db
        .read(move |c| {
            c.query_row(
                "SELECT binding_hash FROM executions WHERE id = ?1",
                [id],
                |r| r.get(0),
            )
        })
        .await
        .expect("binding hash")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowed_request_is_bound_anew_and_a_block_rule_refuses_it() {
    let world = World::with_policy_text(POLICY).await;
    let app = world.start().await;
    add_reviewer(&app, "alice").await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let id = ada.session.hold_refund(&ada.charges[0], 1000).await;
    let held = binding_of(&app, &id).await;
    let web = Web::sign_in(&app, "alice").await;

    // $0.50 falls under the first rule: blocked, and nothing changes.
    let (status, body) = web.approve_lower(&id, "amount", "0.50").await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("blocked by the current policy"),
        "the block rule refuses the narrowed request: {body}"
    );
    let row = app.execution(&id).await;
    assert_eq!(
        (row.status.as_str(), row.args["amount"].as_u64()),
        ("held", Some(1000))
    );
    assert_eq!(binding_of(&app, &id).await, held);

    let (status, body) = web.approve_lower(&id, "amount", "6.00").await;
    assert_eq!(status, 200, "{body}");
    let narrowed = binding_of(&app, &id).await;
    assert_ne!(
        narrowed, held,
        "the narrowed request has a binding of its own"
    );
    assert_eq!(app.execution(&id).await.args["amount"], 600);
    let done = ada.session.wait(&id, 30).await;
    assert_eq!(done["status"], "ok", "{done}");
    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 1, "{made:#?}");
    assert_eq!(made[0]["amount"], 600);
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

/// The re-decision counts the limit's real totals: with $10 of small refunds already
/// run for the customer today, a held $20 refund narrowed to $4 is refused by the rule
/// that blocks small refunds past the limit. (It used to be re-decided against an empty
/// history, so the limited `always_run` rule matched and the refund ran.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowed_request_is_decided_with_the_limits_real_totals() {
    let world = World::with_policy_text(POLICY).await;
    let app = world.start().await;
    add_reviewer(&app, "alice").await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000, 5000, 5000])
        .await;
    for charge in &ada.charges[..2] {
        let args = json!({"charge": charge, "amount": 500, "reason": "requested_by_customer"});
        let (status, body) = ada.session.call("stripe.create_refund", args, None).await;
        assert_eq!(status, 200, "a small refund within the limit runs: {body}");
    }
    let id = ada.session.hold_refund(&ada.charges[2], 2000).await;
    let web = Web::sign_in(&app, "alice").await;

    let (status, body) = web.approve_lower(&id, "amount", "4").await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("blocked by the current policy"), "{body}");
    assert_eq!(app.execution(&id).await.status, "held");
    assert_eq!(refunds(&world.stripe).await.len(), 2, "nothing more ran");

    // Approved as asked, it is not a small refund: it runs.
    let (status, body) = web.approve_lower(&id, "amount", "20.00").await;
    assert_eq!(status, 200, "{body}");
    let done = ada.session.wait(&id, 30).await;
    assert_eq!(done["status"], "ok", "{done}");
    assert_eq!(refunds(&world.stripe).await.len(), 3);
    app.stop().await;
}

/// Money on the page is in its currency's units: the held $25.00 refund is shown and
/// narrowed as "25.00" USD (a reviewer typing 10 approves ten dollars, not ten cents),
/// converted exactly (more decimals than USD has are refused by name); afterwards the
/// page and the history say what ran and who lowered it, and the same reviewer
/// submitting again is told it was her own decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amounts_are_shown_and_narrowed_in_the_currency_units() {
    let world = World::new().await;
    let app = world.start().await;
    add_reviewer(&app, "alice").await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let id = ada.session.hold_refund(&ada.charges[0], 2500).await;
    let web = Web::sign_in(&app, "alice").await;
    let page_path = format!("/approvals/{id}");
    let (_, page) = web.get(&page_path).await;
    assert!(
        page.contains("amount in USD (at most 25.00 USD") && page.contains("value=\"25.00\""),
        "{page}"
    );
    assert!(page.contains("step=\"0.01\""), "{page}");

    let (status, body) = web.approve_lower(&id, "amount", "10.005").await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("more decimals than USD has (2)"), "{body}");
    assert_eq!(app.execution(&id).await.status, "held");

    let (status, body) = web.approve_lower(&id, "amount", "10").await;
    assert_eq!(status, 200, "{body}");
    let done = ada.session.wait(&id, 30).await;
    assert_eq!(done["status"], "ok", "{done}");
    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 1, "{made:#?}");
    assert_eq!(made[0]["amount"], 1000, "ten dollars, in cents");

    let (_, page) = web.get(&page_path).await;
    let told = "Refund 10.00 USD on";
    let narrowed = "narrowed from 25.00 USD by alice";
    assert!(page.contains(told) && page.contains(narrowed), "{page}");
    assert!(page.contains("amount 25.00 USD -&#62; 10.00 USD"), "{page}");
    let (_, history) = web.get("/approvals/history").await;
    assert!(
        history.contains(told) && history.contains(narrowed),
        "{history}"
    );

    // Alice submits again (a second tab, a double click): her own decision, said so.
    let (status, body) = web.approve_lower(&id, "amount", "10").await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("You approved this at"), "{body}");
    assert_eq!(refunds(&world.stripe).await.len(), 1, "nothing more ran");
    app.stop().await;
}
