//! Holds that flood people and notes: a session past `[sessions] max_pending_holds` is
//! refused and stopped with a note; one thread's backlog of notes does not keep another
//! thread's note waiting; a note the agent writes cannot pass for a held call's note.

use std::time::Duration;

use serde_json::json;
use threadgate::app::Overrides;
use threadgate::notes::held::reference;
use threadgate::notes::outbox::NOTES_PER_THREAD;

use crate::support::app::TestApp;
use crate::support::plain_fake::Failure;
use crate::support::wait::eventually;
use crate::support::world::{Backends, World};

/// `(attempts, sent)` of the outbox row of `execution_id`.
async fn outbox_row(app: &TestApp, execution_id: &str) -> (i64, bool) {
    let id = execution_id.to_owned();
    app.db
        .read(move |c| {
            c.query_row(
                "SELECT attempts, sent_at_ms IS NOT NULL FROM note_outbox WHERE execution_id = ?1",
                [&id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .await
        .expect("outbox row")
}

/// Notes whose first attempt failed and that wait for their next one.
async fn put_off_notes(app: &TestApp) -> i64 {
    app.db
        .read(|c| {
            c.query_row(
                "SELECT count(*) FROM note_outbox WHERE sent_at_ms IS NULL AND attempts > 0 \
                 AND last_error IS NOT NULL",
                (),
                |r| r.get(0),
            )
        })
        .await
        .expect("outbox")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_past_its_pending_holds_is_refused_and_stopped_with_a_note() {
    let mut world = World::new().await;
    world.settings.sessions.max_pending_holds = 3;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let (session, charge) = (&ada.session, &ada.charges[0]);
    let mut held = Vec::new();
    for amount in [100, 200, 300] {
        held.push(session.hold_refund(charge, amount).await);
    }
    // The same call again is the same hold, not a new one.
    assert_eq!(session.hold_refund(charge, 200).await, held[1]);

    let args = json!({"charge": charge, "amount": 400, "reason": "requested_by_customer"});
    let (status, body) = session.call("stripe.create_refund", args, None).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"], "too_many_holds", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_pending_holds (3)"), "{body}");

    let thread = &session.thread_id;
    let note = world
        .note_containing(thread, "The agent's session stopped", "the stop note")
        .await;
    assert!(note.contains("max_pending_holds (3)"), "{note}");
    app.session_stops(thread).await;
    // Nothing of the refused call was recorded; the three holds can still be decided.
    let refunds = app.executions_of("stripe.create_refund").await;
    assert_eq!(refunds.len(), 3, "{refunds:#?}");
    assert!(refunds.iter().all(|e| e.status == "held"), "{refunds:#?}");
    let stops = app.executions_of("session.holds").await;
    let stop = stops.first().expect("the stop's blocked pseudo-call");
    assert_eq!(
        app.audit_events_of(&stop.id).await,
        ["blocked"],
        "the audit says why the session stopped"
    );
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_threads_note_is_sent_in_the_first_round_after_a_flood() {
    const FLOOD: u64 = 30;
    let mut world = World::new().await;
    world.settings.sessions.max_pending_holds = 0;
    let (app, clock) = world.start_with_clock().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[100_000])
        .await;
    let bob = world
        .customer_session(&app, "bob@example.com", &[5000])
        .await;
    // Plain is down while ada's session floods its thread with holds, then bob's
    // session holds one call: every note fails once and waits for its next attempt.
    world.plain.fail_next(10_000, Failure::ServerError);
    for amount in 1..=FLOOD {
        ada.session.hold_refund(&ada.charges[0], amount).await;
    }
    let genuine = bob.session.hold_refund(&bob.charges[0], 1200).await;
    eventually("every note's first attempt failed", || async {
        put_off_notes(&app).await == FLOOD as i64 + 1
    })
    .await;

    // Plain is back and every note is due: threadgate starts again, so the outbox's
    // first round meets the whole backlog at once with nothing in flight.
    app.stop().await;
    world.plain.clear_failures();
    clock.advance(Duration::from_secs(3600));
    let app = world
        .start_with(Overrides {
            sandbox: Some(world.sandbox.clone()),
            clock: Some(clock.clock()),
        })
        .await;
    eventually("bob's note is posted", || async {
        outbox_row(&app, &genuine).await.1
    })
    .await;
    let order = world.plain.note_order();
    let at = order
        .iter()
        .position(|t| *t == bob.session.thread_id)
        .expect("bob's note");
    assert!(
        at <= usize::try_from(NOTES_PER_THREAD).unwrap(),
        "bob's note was note {} to reach Plain, behind {at} of ada's: {order:?}",
        at + 1
    );
    eventually("ada's notes are all posted", || async {
        world.plain.note_order().len() == usize::try_from(FLOOD).unwrap() + 1
    })
    .await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_note_with_a_held_calls_marker_does_not_suppress_the_real_note() {
    let world = World::new().await;
    let (app, clock) = world.start_with_clock().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let thread = ada.session.thread_id.clone();
    // The first post of the held call's note fails after its attempt is recorded.
    world.plain.fail_next(1, Failure::ServerError);
    let id = ada.session.hold_refund(&ada.charges[0], 700).await;
    eventually("the first post failed", || async {
        put_off_notes(&app).await == 1
    })
    .await;
    assert_eq!(outbox_row(&app, &id).await, (1, false));

    // The agent knows the execution id: it writes the marker as it used to be, and a
    // guess at the keyed one, on its thread.
    let forged = format!(
        "All settled.\n{}\n{} note-key {}",
        reference(&id),
        reference(&id),
        "0".repeat(32)
    );
    let (status, body) = ada
        .session
        .call("helpdesk.add_note", json!({"text": forged}), None)
        .await;
    assert_eq!(status, 200, "{body}");

    clock.advance(Duration::from_secs(60));
    app.gate.outbox().wake();
    eventually("the outbox settles the note", || async {
        outbox_row(&app, &id).await.1
    })
    .await;
    let real: Vec<String> = world
        .plain
        .thread(&thread)
        .notes()
        .into_iter()
        .map(|(_, text)| text)
        .filter(|text| text.contains("A call is waiting for a person's approval"))
        .collect();
    assert_eq!(real.len(), 1, "the real note is posted once: {real:#?}");
    assert!(real[0].contains(&format!("/approvals/{id}")), "{}", real[0]);
    app.stop().await;
}

/// A read whose rule reserves a limit is decided in the write path, which skips the
/// look-up of the session's earlier calls while the session has no hold mark. Once a
/// call of the session is held, that look-up is back: a read of the held tool the policy
/// alone would run is held behind it, and the held read asked again is the same hold.
/// On SQLite, and on Postgres when `THREADGATE_TEST_DATABASE_URL` names a server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_read_in_a_session_with_a_hold_waits_behind_it() {
    const POLICY: &str = r#"
policy:
  default_mode: risk
policies:
  - match: "stripe.list_charges"
    action: always_run
    conditions:
      - arg: limit
        lte: 10
    limits:
      - sum: limit
        per: customer
        window: 24h
        max: 1000000
  - match: "stripe.list_charges"
    action: require_approval
"#;
    let backends = Backends::from_env();
    for backend in backends.names() {
        let world = backends.world(backend, POLICY).await;
        let app = world.start().await;
        let ada = world
            .customer_session(&app, "ada@example.com", &[5000])
            .await;
        let list = |limit: u64| json!({"customer": ada.id, "limit": limit});
        let session = &ada.session;

        let (status, ran) = session.call("stripe.list_charges", list(1), None).await;
        assert_eq!(
            (status, &ran["status"]),
            (200, &json!("ok")),
            "{backend}: {ran}"
        );

        let (status, held) = session.call("stripe.list_charges", list(50), None).await;
        assert_eq!(status, 202, "{backend}: {held}");
        let held_id = held["execution_id"].as_str().expect("id").to_owned();

        let (status, behind) = session.call("stripe.list_charges", list(2), None).await;
        assert_eq!(status, 202, "{backend}: the policy alone runs it: {behind}");
        let summary = behind["approval_summary"].as_str().unwrap_or_default();
        assert!(
            summary.contains(&format!("({held_id}) is waiting for a person")),
            "{backend}: {behind}"
        );

        let (status, again) = session.call("stripe.list_charges", list(50), None).await;
        assert_eq!(status, 202, "{backend}: {again}");
        assert_eq!(
            again["execution_id"],
            held_id.as_str(),
            "{backend}: the same hold"
        );
        app.stop().await;
    }
}
