//! The thread's state labels in Plain (`[plain] labels`), kept in step with its session
//! through the outbox: agent working while it runs, waiting for approval while a call
//! waits for a person, handed to a person once it stopped on its own. A label type
//! Plain does not know refuses the start, naming the key.

use std::collections::BTreeSet;

use threadgate::app::{Application, Overrides};
use threadgate::connectors::helpdesk::StateLabels;

use crate::support::wait::eventually;
use crate::support::world::World;

const WAITING: &str = "lt_waiting_for_approval";
const WORKING: &str = "lt_agent_working";
const HANDED: &str = "lt_handed_to_person";

/// A world whose Plain knows the three label types, and whose settings name them.
async fn labelled_world() -> World {
    let mut world = World::new().await;
    for (id, name) in [
        (WAITING, "Waiting for approval"),
        (WORKING, "Agent working"),
        (HANDED, "Handed to a person"),
    ] {
        world.plain.add_label_type(id, name);
    }
    world.settings.plain.labels = StateLabels {
        waiting_for_approval: Some(WAITING.into()),
        agent_working: Some(WORKING.into()),
        handed_to_person: Some(HANDED.into()),
    };
    world
}

/// Waits until `thread` carries exactly `wanted` labels.
async fn labels_become(world: &World, thread: &str, wanted: &[&str]) {
    let wanted: BTreeSet<String> = wanted.iter().map(|s| (*s).to_owned()).collect();
    eventually(&format!("{thread} carries {wanted:?}"), || async {
        let now: BTreeSet<String> = world
            .plain
            .thread(thread)
            .label_type_ids
            .into_iter()
            .collect();
        now == wanted
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_follow_the_session_and_its_held_calls() {
    let world = labelled_world().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let thread = ada.session.thread_id.clone();
    labels_become(&world, &thread, &[WORKING]).await;

    let id = ada.session.hold_refund(&ada.charges[0], 1000).await;
    labels_become(&world, &thread, &[WORKING, WAITING]).await;

    let alice = app.add_reviewer("alice").await;
    let (status, body) = app.decide(&id, &alice, "approve", "").await;
    assert_eq!(status, 200, "{body}");
    labels_become(&world, &thread, &[WORKING]).await;
    assert!(
        world.plain.invalid_requests().is_empty(),
        "{:#?}",
        world.plain.invalid_requests()
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_stops_on_its_own_is_handed_to_a_person() {
    let mut world = labelled_world().await;
    world.settings.sessions.max_pending_holds = 1;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let thread = ada.session.thread_id.clone();
    ada.session.hold_refund(&ada.charges[0], 100).await;
    labels_become(&world, &thread, &[WORKING, WAITING]).await;
    let args = serde_json::json!({"charge": ada.charges[0], "amount": 200,
                                  "reason": "requested_by_customer"});
    let (status, body) = ada.session.call("stripe.create_refund", args, None).await;
    assert_eq!(status, 429, "{body}");
    // The held call can still be decided, so it still waits for a person.
    labels_become(&world, &thread, &[HANDED, WAITING]).await;
    assert!(world.plain.invalid_requests().is_empty());
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_label_type_refuses_the_start_naming_the_key() {
    let mut world = labelled_world().await;
    world.settings.plain.labels.waiting_for_approval = Some("lt_nobody_made_this".into());
    let overrides = Overrides {
        sandbox: Some(world.sandbox.clone()),
        clock: None,
    };
    let error = match Application::build(world.settings.clone(), overrides).await {
        Ok(_) => panic!("threadgate started with an unknown label type"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        error.contains("[plain] labels.waiting_for_approval"),
        "{error}"
    );
    assert!(error.contains("lt_nobody_made_this"), "{error}");
}
