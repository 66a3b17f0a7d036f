//! threadgate killed between "approved" and "ran": the next start runs the call exactly
//! once (`Approvals::recover`), re-sends a Stripe call whose answer was lost with the
//! same idempotency key while Stripe still keeps it, and never re-sends a Plain call
//! whose outcome is unknown.

use std::time::Duration;

use serde_json::{Value, json};
use threadgate::connectors::{CallContext, Connector, Credential, StripeConnector};
use threadgate::store::rusqlite;

use crate::support::app::TestApp;
use crate::support::wait::eventually;
use crate::support::world::{STRIPE_KEY, World, refunds};

/// Sets an execution's status behind threadgate's back (it is stopped), decided now.
fn force_status(world: &World, id: &str, status: &str) {
    force_status_decided_at(world, id, status, chrono::Utc::now().timestamp_millis());
}

/// As [`force_status`], decided at `decided_at_ms`.
fn force_status_decided_at(world: &World, id: &str, status: &str, decided_at_ms: i64) {
    let conn = rusqlite::Connection::open(world.settings.database_path()).expect("open db");
    conn.busy_timeout(Duration::from_secs(10)).expect("busy");
    let changed = conn
        .execute(
            "UPDATE executions SET status = ?2, reviewer = 'alice', decided_at_ms = ?3 \
             WHERE id = ?1",
            rusqlite::params![id, status, decided_at_ms],
        )
        .expect("update");
    assert_eq!(changed, 1);
}

async fn status_becomes(app: &TestApp, id: &str, want: &str) {
    eventually(&format!("{id} becomes {want}"), || async {
        app.execution(id).await.status == want
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_left_by_a_crash_runs_once_after_restart() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let thread = ada.session.thread_id.clone();
    let id = ada.session.hold_refund(&ada.charges[0], 1200).await;
    app.stop().await;

    // Approved, then the process died before it ran the call.
    force_status(&world, &id, "approved");
    assert!(refunds(&world.stripe).await.is_empty());

    let app = world.start().await;
    status_becomes(&app, &id, "succeeded").await;
    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 1, "{made:#?}");
    assert_eq!(made[0]["metadata"]["threadgate_execution_id"], id.as_str());
    // The session's container was adopted and its socket reopened: the agent's wait
    // gets the result.
    let session = world.session_of(&app, &thread).await;
    let done = session.wait(&id, 10).await;
    assert_eq!(done["status"], "ok", "{done}");
    assert_eq!(done["result"]["id"], made[0]["id"]);
    app.stop().await;

    // Another restart finds nothing left to run.
    let app = world.start().await;
    app.recovered().await;
    assert_eq!(refunds(&world.stripe).await.len(), 1);
    assert_eq!(app.execution(&id).await.status, "succeeded");
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

/// Ada's refund of 7.00, held, then claimed and sent (decided at `decided_at_ms`):
/// Stripe made the refund, then threadgate died before recording the answer. The
/// request is the one the gate sends, with its idempotency key. The execution's id and
/// Stripe's answer; threadgate is stopped.
async fn a_refund_sent_and_lost(world: &World, decided_at_ms: i64) -> (String, Value) {
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let id = ada.session.hold_refund(&ada.charges[0], 700).await;
    let frozen: Value = app.execution(&id).await.args;
    app.stop().await;

    force_status_decided_at(world, &id, "running", decided_at_ms);
    let stripe = StripeConnector::new(&world.stripe.base_url(), Credential::new(STRIPE_KEY))
        .expect("connector");
    let first = stripe
        .call(
            "stripe.create_refund",
            &frozen,
            &CallContext { execution_id: &id },
        )
        .await
        .expect("the refund reached Stripe");
    assert_eq!(refunds(&world.stripe).await.len(), 1);
    (id, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_whose_answer_was_lost_is_resent_with_its_key_and_runs_once() {
    let world = World::new().await;
    let (id, first) = a_refund_sent_and_lost(&world, chrono::Utc::now().timestamp_millis()).await;

    let app = world.start().await;
    status_becomes(&app, &id, "succeeded").await;
    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 1, "re-sent with the same key: {made:#?}");
    let result: Value =
        serde_json::from_str(&app.execution(&id).await.result.expect("result")).expect("json");
    assert_eq!(result["id"], first["id"]);
    app.stop().await;
}

/// A refund whose answer was lost a day after its decision is not re-sent: Stripe may
/// have forgotten its idempotency key by then, and the same key would refund again. A
/// person checks it instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_whose_key_may_have_expired_is_marked_for_a_person_not_resent() {
    let world = World::new().await;
    // Approved and sent 24 hours ago; the answer never recorded.
    let day_ago = chrono::Utc::now().timestamp_millis() - 24 * 60 * 60 * 1000;
    let (id, _) = a_refund_sent_and_lost(&world, day_ago).await;

    let app = world.start().await;
    status_becomes(&app, &id, "needs_check").await;
    app.recovered().await;
    // localstripe keeps keys for ever, so a re-send would make no second refund there:
    // the audit says whether it was sent again (a re-send records `ran`).
    assert_eq!(refunds(&world.stripe).await.len(), 1);
    let row = app.execution(&id).await;
    let error = row.error.unwrap_or_default();
    assert!(
        error.contains("idempotency key may have expired"),
        "{error}"
    );
    let events = app.audit_events_of(&id).await;
    assert!(
        !events.iter().any(|e| e == "ran"),
        "not re-sent: {events:?}"
    );
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_call_in_flight_at_a_crash_is_marked_for_a_person_not_resent() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let (status, held) = ada
        .session
        .call(
            "helpdesk.escalate_to_engineer",
            json!({"summary": "Invoices are submitted twice."}),
            Some("the Pay button double-submits"),
        )
        .await;
    assert_eq!(status, 202, "{held}");
    let id = held["execution_id"].as_str().expect("id").to_owned();
    eventually("the held-call note", || async {
        !world
            .plain
            .thread(&ada.session.thread_id)
            .notes()
            .is_empty()
    })
    .await;
    app.stop().await;
    let notes_before = world.plain.thread(&ada.session.thread_id).notes().len();

    force_status(&world, &id, "running");
    let app = world.start().await;
    status_becomes(&app, &id, "needs_check").await;
    app.recovered().await;
    assert_eq!(
        world.plain.thread(&ada.session.thread_id).notes().len(),
        notes_before,
        "the escalation note was not re-sent"
    );
    let row = app.execution(&id).await;
    assert!(
        row.error.as_deref().unwrap_or_default().contains("check"),
        "{row:?}"
    );
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

/// A read whose outcome was lost (its decision is on disk before the agent is answered;
/// its outcome commits without its flush) is sent again at the next start even on a
/// provider without idempotency keys: a read changes nothing there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_read_whose_outcome_was_lost_is_sent_again_not_marked() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world.customer_session(&app, "ada@example.com", &[]).await;
    let (status, read) = ada
        .session
        .call("helpdesk.get_thread", json!({}), None)
        .await;
    assert_eq!(status, 200, "{read}");
    let id = read["execution_id"].as_str().expect("id").to_owned();
    app.stop().await;

    force_status(&world, &id, "running");
    let app = world.start().await;
    status_becomes(&app, &id, "succeeded").await;
    app.recovered().await;
    let row = app.execution(&id).await;
    assert_eq!(row.error, None, "{row:?}");
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_now_blocks_beats_an_earlier_hold_and_its_approval() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let thread = ada.session.thread_id.clone();
    let (status, held) = ada
        .session
        .call(
            "stripe.create_refund",
            json!({"charge": ada.charges[0], "amount": 900, "reason": "requested_by_customer"}),
            None,
        )
        .await;
    assert_eq!(status, 202, "{held}");
    let id = held["execution_id"].as_str().expect("id").to_owned();
    app.stop().await;

    // The operator tightens the policy and restarts: refunds are now blocked.
    let text = std::fs::read_to_string(&world.settings.policy_file).expect("policy");
    let tightened = text.replacen(
        "policies:\n",
        "policies:\n  - match: \"stripe.create_refund\"\n    action: block\n\n",
        1,
    );
    assert_ne!(text, tightened);
    std::fs::write(&world.settings.policy_file, tightened).expect("write policy");
    let app = world.start().await;
    let token = app.add_reviewer("alice").await;
    let (status, body) = app.decide(&id, &token, "approve", "go ahead").await;
    assert_eq!(status, 200, "{body}");
    status_becomes(&app, &id, "blocked").await;
    let session = world.session_of(&app, &thread).await;
    let seen = session.wait(&id, 10).await;
    assert_eq!(seen["status"], "blocked", "{seen}");
    assert!(refunds(&world.stripe).await.is_empty());

    // The audit records the hash of the policy that held it and of the one that
    // blocked it.
    let hashes: Vec<(String, String)> = app
        .db
        .read({
            let id = id.clone();
            move |c| {
                let mut stmt = c.prepare(
                    "SELECT event, policy_hash FROM audit WHERE execution_id = ?1 ORDER BY id",
                )?;
                let rows = stmt.query_map([&id], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect()
            }
        })
        .await
        .expect("audit");
    let held_hash = &hashes.iter().find(|(e, _)| e == "held").expect("held").1;
    let rechecked = &hashes
        .iter()
        .find(|(e, _)| e == "rechecked")
        .expect("rechecked")
        .1;
    assert_ne!(held_hash, rechecked, "{hashes:?}");
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_note_posted_just_before_a_crash_is_not_posted_twice() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let thread = ada.session.thread_id.clone();
    let (status, held) = ada
        .session
        .call(
            "stripe.create_refund",
            json!({"charge": ada.charges[0], "amount": 300, "reason": "requested_by_customer"}),
            None,
        )
        .await;
    assert_eq!(status, 202, "{held}");
    let id = held["execution_id"].as_str().expect("id").to_owned();
    let mark = threadgate::notes::held::reference(&id);
    let count = || {
        world
            .plain
            .thread(&thread)
            .notes()
            .iter()
            .filter(|(_, text)| text.contains(&mark))
            .count()
    };
    eventually("the note is posted", || async { count() == 1 }).await;
    app.stop().await;

    // The crash came after Plain had the note but before the outbox recorded it.
    let conn = rusqlite::Connection::open(world.settings.database_path()).expect("open db");
    let changed = conn
        .execute(
            "UPDATE note_outbox SET sent_at_ms = NULL WHERE execution_id = ?1 AND attempts > 0",
            [&id],
        )
        .expect("update");
    assert_eq!(changed, 1);
    drop(conn);

    let app = world.start().await;
    eventually("the outbox settles the note", || async {
        let id = id.clone();
        app.db
            .read(move |c| {
                c.query_row(
                    "SELECT sent_at_ms IS NOT NULL FROM note_outbox WHERE execution_id = ?1",
                    [&id],
                    |r| r.get::<_, bool>(0),
                )
            })
            .await
            .expect("outbox")
    })
    .await;
    assert_eq!(count(), 1, "found on the timeline, not posted again");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_leaves_alone_the_calls_made_after_the_restart() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[10_000])
        .await;
    let thread = ada.session.thread_id.clone();
    let mut approved = Vec::new();
    for i in 0..10 {
        let (status, held) = ada
            .session
            .call(
                "stripe.create_refund",
                json!({"charge": ada.charges[0], "amount": 100 + i, "reason": "requested_by_customer"}),
                None,
            )
            .await;
        assert_eq!(status, 202, "{held}");
        approved.push(held["execution_id"].as_str().expect("id").to_owned());
    }
    // The outbox is done before the stop, so the next request Plain sees is the agent's.
    eventually("the ten held-call notes", || async {
        world.plain.thread(&thread).notes().len() == 10
    })
    .await;
    app.stop().await;
    for id in &approved {
        force_status(&world, id, "approved");
    }

    // After the restart, while recovery runs the approved refunds, the agent adds a
    // note; Plain rate-limits it, so it is still in flight when recovery looks for
    // calls a crash left running.
    let reset = (chrono::Utc::now() + chrono::Duration::milliseconds(2500))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    world.plain.fail_next(
        1,
        crate::support::plain_fake::Failure::RateLimited { reset },
    );
    let app = world.start().await;
    let session = world.session_of(&app, &thread).await;
    let (status, body) = session
        .call(
            "helpdesk.add_note",
            json!({"text": "Checking the refunds."}),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let note_id = body["execution_id"].as_str().expect("id").to_owned();
    for id in &approved {
        status_becomes(&app, id, "succeeded").await;
    }
    assert_eq!(refunds(&world.stripe).await.len(), 10);
    // Recovery is over: whatever it would do to the note call, it has done.
    app.recovered().await;
    let row = app.execution(&note_id).await;
    assert_eq!(row.status, "succeeded", "{row:?}");
    let audit = app.audit_rows().await;
    let events: Vec<&str> = audit
        .iter()
        .filter(|r| r.execution_id.as_deref() == Some(note_id.as_str()))
        .map(|r| r.event.as_str())
        .collect();
    assert_eq!(events, ["requested", "decided", "ran"], "{audit:#?}");
    let notes = world.plain.thread(&thread).notes();
    assert_eq!(
        notes
            .iter()
            .filter(|(_, t)| t.contains("Checking the refunds."))
            .count(),
        1
    );
    app.stop().await;
}
