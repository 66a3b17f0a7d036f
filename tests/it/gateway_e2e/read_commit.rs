//! Reads with their durable commit beside the provider's answer (issue 11, "The gateway
//! under a millisecond"; issue 19, the read's commit off the answer's path): a read's
//! execution row and decision are committed while it is sent, and the agent is answered
//! only after that commit, so a read whose decision cannot be committed is never
//! returned; its outcome follows without waiting for the log's flush. A write's
//! decision is still durable before it runs.

use serde_json::json;

use crate::support::app::TestApp;
use crate::support::rows::AuditRow;
use crate::support::wait::eventually;
use crate::support::world::{Customer, World, limited_reads_policy};

/// Makes every audit row of `event` fail to insert, as a full disk or a failed commit
/// would: the job writing it rolls back whole.
async fn fail_audit_event(app: &TestApp, event: &'static str) {
    app.db
        .write(move |c| {
            c.execute_batch(&format!(
                "CREATE TRIGGER fail_{event} BEFORE INSERT ON audit WHEN NEW.event = '{event}' \
                 BEGIN SELECT RAISE(ABORT, 'injected commit failure'); END;"
            ))
        })
        .await
        .expect("install the trigger");
}

async fn allow_audit_event(app: &TestApp, event: &'static str) {
    app.db
        .write(move |c| c.execute_batch(&format!("DROP TRIGGER fail_{event};")))
        .await
        .expect("drop the trigger");
}

fn events_of(rows: &[AuditRow], execution_id: &str) -> Vec<String> {
    rows.iter()
        .filter(|r| r.execution_id.as_deref() == Some(execution_id))
        .map(|r| r.event.clone())
        .collect()
}

/// A world on the shipped policy, its app, and Ada's session with one charge of 49.00.
async fn ada_with_a_charge() -> (World, TestApp, Customer) {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900])
        .await;
    (world, app, ada)
}

/// Ada's read of her charge: the status and the body answered.
async fn get_charge(ada: &Customer) -> (u16, serde_json::Value) {
    ada.session
        .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_commits_its_decision_then_its_outcome() {
    let (_world, app, ada) = ada_with_a_charge().await;

    let (status, body) = get_charge(&ada).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["amount"], 4900, "{body}");
    let id = body["execution_id"].as_str().expect("execution id");

    let exec = app.execution(id).await;
    assert_eq!(exec.status, "succeeded");
    assert_eq!(exec.verdict, "run");
    assert!(exec.result.is_some_and(|r| r.contains("4900")));
    // The decision and the outcome, in order, and the chain still verifies.
    let rows = app.audit_rows().await;
    assert_eq!(events_of(&rows, id), ["requested", "decided", "ran"]);
    assert_eq!(app.verify_audit().await, rows.len());
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_decision_cannot_be_committed_is_never_returned() {
    let (_world, app, ada) = ada_with_a_charge().await;
    let of_calls = |rows: Vec<AuditRow>| rows.iter().filter(|r| r.execution_id.is_some()).count();
    let before = of_calls(app.audit_rows().await);

    // The read is sent to localstripe, but its decision cannot be recorded.
    fail_audit_event(&app, "decided").await;
    let (status, body) = get_charge(&ada).await;
    assert_eq!(status, 500, "{body}");
    assert!(body.get("result").is_none(), "{body}");
    assert!(!body.to_string().contains("4900"), "{body}");
    // Nothing of it was kept: no execution, no audit row (its `requested` row went with
    // the decision's transaction), no outcome written after.
    assert!(
        app.executions()
            .await
            .iter()
            .all(|e| e.tool != "stripe.get_charge")
    );
    assert_eq!(of_calls(app.audit_rows().await), before);

    // Once the audit can be written again, the same read is answered and recorded.
    allow_audit_event(&app, "decided").await;
    let (status, body) = get_charge(&ada).await;
    assert_eq!(status, 200, "{body}");
    let id = body["execution_id"].as_str().expect("execution id");
    assert_eq!(
        events_of(&app.audit_rows().await, id),
        ["requested", "decided", "ran"]
    );
    app.verify_audit().await;
    app.stop().await;
}

/// A read whose decision is on disk but whose outcome cannot be written is answered:
/// the audit holds the read. Its row stays `running`, sent by this instance, for
/// recovery to re-send (a read is idempotent) once the instance restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_outcome_cannot_be_written_is_answered_and_left_running() {
    let (world, app, ada) = ada_with_a_charge().await;

    fail_audit_event(&app, "ran").await;
    let (status, body) = get_charge(&ada).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["amount"], 4900, "{body}");
    let id = body["execution_id"].as_str().expect("execution id");
    let exec = app.execution(id).await;
    assert_eq!(exec.status, "running");
    assert_eq!(
        events_of(&app.audit_rows().await, id),
        ["requested", "decided"]
    );
    app.verify_audit().await;
    allow_audit_event(&app, "ran").await;
    app.stop().await;

    // The next start re-sends it and records its outcome.
    let app = world.start().await;
    app.recovered().await;
    eventually(&format!("{id} is recovered"), || async {
        app.execution(id).await.status == "succeeded"
    })
    .await;
    assert_eq!(
        events_of(&app.audit_rows().await, id),
        ["requested", "decided", "ran"]
    );
    app.verify_audit().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_decided_durably_before_it_runs() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world.customer_session(&app, "ada@example.com", &[]).await;

    // The note's outcome cannot be recorded; its decision was committed before it ran.
    fail_audit_event(&app, "ran").await;
    let _ = ada
        .session
        .call(
            "helpdesk.add_note",
            json!({"text": "Checked the invoice."}),
            None,
        )
        .await;
    let exec = app
        .executions()
        .await
        .into_iter()
        .find(|e| e.tool == "helpdesk.add_note")
        .expect("the write's execution was committed before it ran");
    assert_eq!(exec.status, "running");
    assert_eq!(
        events_of(&app.audit_rows().await, &exec.id),
        ["requested", "decided"]
    );
    let thread = world.plain.thread(&ada.session.thread_id);
    assert!(
        format!("{thread:?}").contains("Checked the invoice."),
        "the note ran: {thread:?}"
    );
    app.verify_audit().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_read_whose_outcome_is_not_recorded_is_never_returned() {
    let world = World::with_policy_text(&limited_reads_policy(1000)).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900])
        .await;
    let args = json!({"customer": ada.id, "limit": 1});

    // Its decision (and reservation) is written, it runs against localstripe, but its
    // outcome cannot be recorded: the agent gets a 500 and no result.
    fail_audit_event(&app, "ran").await;
    let (status, body) = ada
        .session
        .call("stripe.list_charges", args.clone(), None)
        .await;
    assert_eq!(status, 500, "{body}");
    assert!(body.get("result").is_none(), "{body}");
    assert!(!body.to_string().contains("4900"), "{body}");
    let decided = app
        .executions()
        .await
        .into_iter()
        .find(|e| e.tool == "stripe.list_charges")
        .expect("the decision was written before the read ran");
    assert_eq!(decided.verdict, "run");
    assert_eq!(decided.status, "running", "its outcome was not recorded");

    // Once the audit can be written again, the same read is answered and recorded.
    allow_audit_event(&app, "ran").await;
    let (status, body) = ada.session.call("stripe.list_charges", args, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.to_string().contains("4900"), "{body}");
    let id = body["execution_id"].as_str().expect("execution id");
    assert_eq!(
        events_of(&app.audit_rows().await, id),
        ["requested", "decided", "ran"]
    );
    app.stop().await;
}
