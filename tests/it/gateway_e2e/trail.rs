//! A held call's trail on its Plain thread: beside the note, one thread event when it
//! is held (external id `<execution>:held`, a "Review in threadgate" button to its
//! approval page), one when it is decided (approved by whom, narrowed to what, denied
//! with which message, expired) and one when it ran. Every event goes through the
//! outbox, and an event sent again after a lost answer shows once.

use std::collections::BTreeMap;
use std::time::Duration;

use threadgate::approvals::Approvals;

use crate::support::app::TestApp;
use crate::support::plain_fake::{MutationErrorSpec, ThreadEventRecord};
use crate::support::wait::eventually;
use crate::support::world::World;

/// Waits until `thread` has at least `count` thread events and returns them all.
async fn events_at_least(world: &World, thread: &str, count: usize) -> Vec<ThreadEventRecord> {
    eventually(&format!("{count} thread events on {thread}"), || async {
        world.plain.thread(thread).events().len() >= count
    })
    .await;
    world.plain.thread(thread).events()
}

/// Whether the outbox row of the event `external_id` is recorded as sent.
async fn event_sent(app: &TestApp, external_id: &str) -> bool {
    let id = external_id.to_owned();
    app.db
        .read(move |c| {
            c.query_row(
                "SELECT sent_at_ms IS NOT NULL FROM thread_event_outbox WHERE external_id = ?1",
                [&id],
                |r| r.get(0),
            )
        })
        .await
        .expect("outbox row")
}

fn external_ids(events: &[ThreadEventRecord]) -> Vec<String> {
    events
        .iter()
        .map(|e| e.external_id.clone().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_gets_one_note_and_one_event_with_a_review_button() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let thread = ada.session.thread_id.clone();
    let id = ada.session.hold_refund(&ada.charges[0], 1000).await;

    world
        .note_containing(&thread, &id, "the held call's note")
        .await;
    let events = events_at_least(&world, &thread, 1).await;
    assert_eq!(external_ids(&events), [format!("{id}:held")]);
    let held = &events[0];
    assert!(held.title.contains("stripe.create_refund"), "{held:?}");
    assert!(held.text().contains(&id), "{held:?}");
    let buttons = held.link_buttons();
    assert_eq!(buttons.len(), 1, "{held:?}");
    assert!(
        buttons[0].0.ends_with(&format!("/approvals/{id}")),
        "{buttons:?}"
    );
    assert_eq!(buttons[0].1, "Review in threadgate");
    assert_eq!(world.plain.thread(&thread).notes().len(), 1);
    assert!(
        world.plain.invalid_requests().is_empty(),
        "{:#?}",
        world.plain.invalid_requests()
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_sent_again_after_a_lost_answer_shows_once() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let thread = ada.session.thread_id.clone();
    let id = ada.session.hold_refund(&ada.charges[0], 1000).await;
    let external_id = format!("{id}:held");
    events_at_least(&world, &thread, 1).await;
    eventually("the held event is recorded as sent", || {
        event_sent(&app, &external_id)
    })
    .await;

    // As if threadgate crashed after Plain made the event but before the outbox wrote
    // it down, and the crashed drainer's claim has expired: the row is due again.
    let row = external_id.clone();
    app.db
        .write(move |c| {
            c.execute(
                "UPDATE thread_event_outbox SET sent_at_ms = NULL, next_attempt_ms = 0 \
                 WHERE external_id = ?1",
                [&row],
            )
        })
        .await
        .expect("reset");
    app.gate.outbox().wake();
    eventually("the re-sent event is recorded as sent", || {
        event_sent(&app, &external_id)
    })
    .await;
    let posts = world
        .plain
        .operations()
        .iter()
        .filter(|op| op.root_fields == ["createThreadEvent"])
        .count();
    assert_eq!(posts, 2, "the event was sent again");
    assert_eq!(
        external_ids(&world.plain.thread(&thread).events()),
        [external_id],
        "plain refused the second one; the thread shows it once"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_then_ran_events_follow_the_held_one() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let thread = ada.session.thread_id.clone();
    let id = ada.session.hold_refund(&ada.charges[0], 1000).await;
    let alice = app.add_reviewer("alice").await;
    let (status, body) = app.decide(&id, &alice, "approve", "ok, refund it").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ada.session.wait(&id, 30).await["status"], "ok");

    let events = events_at_least(&world, &thread, 3).await;
    assert_eq!(
        external_ids(&events),
        [
            format!("{id}:held"),
            format!("{id}:approved"),
            format!("{id}:ran")
        ]
    );
    assert_eq!(events[1].title, "Approved by alice");
    assert!(
        events[1].text().contains("ok, refund it"),
        "{:?}",
        events[1]
    );
    assert_eq!(events[2].title, "Ran: succeeded");
    assert!(world.plain.invalid_requests().is_empty());
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowed_approval_says_what_it_narrowed() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let thread = ada.session.thread_id.clone();
    let id = ada.session.hold_refund(&ada.charges[0], 1000).await;
    let approvals = Approvals::new(app.gate.clone(), threadgate::tasks::Tasks::new());
    let lower = BTreeMap::from([("amount".to_owned(), 500)]);
    approvals
        .approve_narrowed(
            &threadgate::ids::ExecutionId::parse(id.as_str()).expect("id"),
            "alice",
            None,
            lower,
        )
        .await
        .expect("decided")
        .expect("narrowed");

    let events = events_at_least(&world, &thread, 3).await;
    assert_eq!(
        events[1].external_id.as_deref(),
        Some(&*format!("{id}:approved"))
    );
    assert_eq!(events[1].title, "Approved by alice");
    assert!(
        events[1]
            .text()
            .contains("narrowed from 10.00 USD by alice"),
        "{:?}",
        events[1]
    );
    assert_eq!(events[2].title, "Ran: succeeded");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_and_an_expiry_each_get_their_event() {
    let world = World::with_approval_ttl("1m").await;
    let (app, clock) = world.start_with_clock().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000, 7000])
        .await;
    let thread = ada.session.thread_id.clone();
    let denied = ada.session.hold_refund(&ada.charges[0], 1000).await;
    let alice = app.add_reviewer("alice").await;
    let message = "Offer a coupon instead.";
    let (status, body) = app.decide(&denied, &alice, "deny", message).await;
    assert_eq!(status, 200, "{body}");
    let events = events_at_least(&world, &thread, 2).await;
    assert_eq!(
        external_ids(&events),
        [format!("{denied}:held"), format!("{denied}:denied")]
    );
    assert_eq!(events[1].title, "Denied by alice");
    assert!(
        events[1].text().contains(&format!("denied: {message}")),
        "{:?}",
        events[1]
    );

    let expired = ada.session.hold_refund(&ada.charges[1], 1000).await;
    events_at_least(&world, &thread, 3).await;
    clock.advance(Duration::from_secs(120));
    let (status, _) = app.decide(&expired, &alice, "approve", "too late").await;
    assert_eq!(status, 410);
    let events = events_at_least(&world, &thread, 4).await;
    assert_eq!(
        events[3].external_id.as_deref(),
        Some(&*format!("{expired}:expired"))
    );
    assert_eq!(events[3].title, "Approval expired");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_plain_fails_is_retried_until_it_is_there() {
    let world = World::new().await;
    let (app, clock) = world.start_with_clock().await;
    world.plain.mutation_error_on(
        "createThreadEvent",
        MutationErrorSpec {
            message: "internal".into(),
            error_type: "INTERNAL".into(),
            code: "internal_error".into(),
            fields: Vec::new(),
        },
    );
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let thread = ada.session.thread_id.clone();
    let id = ada.session.hold_refund(&ada.charges[0], 1000).await;
    let external_id = format!("{id}:held");
    let row = external_id.clone();
    eventually("the failed attempt is recorded", || async {
        let row = row.clone();
        app.db
            .read(move |c| {
                c.query_row(
                    "SELECT last_error IS NOT NULL FROM thread_event_outbox WHERE external_id = ?1",
                    [&row],
                    |r| r.get::<_, bool>(0),
                )
            })
            .await
            .expect("row")
    })
    .await;
    assert!(world.plain.thread(&thread).events().is_empty());

    // Past its backoff on threadgate's clock: the next round sends it.
    clock.advance(Duration::from_secs(60));
    app.gate.outbox().wake();
    let events = events_at_least(&world, &thread, 1).await;
    assert_eq!(external_ids(&events), std::slice::from_ref(&external_id));
    eventually("the event is recorded as sent", || {
        event_sent(&app, &external_id)
    })
    .await;
    app.stop().await;
}
