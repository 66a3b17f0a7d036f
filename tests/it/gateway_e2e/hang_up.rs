//! A client that hangs up mid-call does not cut the call. The sandbox API runs each call
//! on the application's tasks (`Gate::call_to_the_end`), so a refund already decided
//! and on its way to Stripe runs to its outcome and is recorded by the call itself;
//! only the answer is lost. Before, hyper dropped the handler with the connection, the
//! row stayed `running`, and the refund was sent a second time by recovery.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;

use crate::support::logs::captured_text;
use crate::support::slow_stripe;
use crate::support::wait::{eventually, eventually_within};
use crate::support::world::{Backends, REFUNDS_RUN_POLICY, World, refunds};

/// How long Stripe holds the refund: longer than the instance's sweep takes to find a
/// call that nothing here sends (two passes a second apart), so a cut call would be
/// sent again before the first could answer.
const SLOW_REFUND: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_whose_client_hangs_up_runs_to_its_outcome_and_is_sent_once() {
    let backends = Backends::from_env();
    for backend in backends.names() {
        hang_up_on(&backends, backend).await;
    }
}

async fn hang_up_on(backends: &Backends, backend: &str) {
    let mut world = backends.world(backend, REFUNDS_RUN_POLICY).await;
    let refund_arrived = Arc::new(Notify::new());
    let (stripe_url, arrivals) =
        slow_stripe::start_counted(world.stripe.base_url(), SLOW_REFUND, refund_arrived.clone())
            .await;
    world.settings.stripe.api_url = stripe_url;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let args = json!({"charge": ada.charges[0], "amount": 700, "reason": "requested_by_customer"});

    // The agent hangs up once its refund has reached Stripe: the call's future, and
    // with it the connection to the session's socket, is dropped.
    tokio::select! {
        (status, answer) = ada.session.call("stripe.create_refund", args.clone(), None) => {
            panic!("answered before Stripe let the refund through: {status} {answer}");
        }
        () = refund_arrived.notified() => {}
    }

    // The call itself records Stripe's one answer. A refund sent again would arrive
    // before any outcome could be recorded (each is held as long), so the count when
    // the row succeeds says whether the first was cut.
    eventually("the refund's outcome is recorded", || async {
        app.executions_of("stripe.create_refund")
            .await
            .first()
            .is_some_and(|row| row.status == "succeeded")
    })
    .await;
    assert_eq!(
        arrivals.load(Ordering::SeqCst),
        1,
        "{backend}: the refund reached Stripe once"
    );
    let rows = app.executions_of("stripe.create_refund").await;
    assert_eq!(rows.len(), 1, "{backend}: {rows:#?}");
    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 1, "{backend}: {made:#?}");
    let result: serde_json::Value =
        serde_json::from_str(rows[0].result.as_deref().expect("a result")).expect("json");
    assert_eq!(result["id"], made[0]["id"], "the row holds Stripe's refund");
    let events = app.audit_events_of(&rows[0].id).await;
    assert_eq!(
        events,
        ["requested", "decided", "ran"],
        "{backend}: {events:?}"
    );
    assert!(app.verify_audit().await > 0);

    // The agent asking again is answered from it, and nothing more is sent.
    let (status, again) = ada.session.call("stripe.create_refund", args, None).await;
    assert_eq!((status, &again["replayed"]), (200, &json!(true)), "{again}");
    assert_eq!(again["execution_id"], rows[0].id.as_str(), "{again}");
    assert_eq!(arrivals.load(Ordering::SeqCst), 1, "{backend}");

    // The server saw the hang-up: the first call's handler was dropped before it could
    // answer, so the one answer logged for this execution is the replay's. Were the
    // handler kept to the end, it would log a `ran` answer too, and this test would
    // prove nothing about a cut call.
    let logs = captured_text();
    let answered: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("tool call answered") && line.contains(rows[0].id.as_str()))
        .collect();
    assert_eq!(answered.len(), 1, "{backend}: {answered:#?}");
    assert!(
        answered[0].contains("replayed"),
        "{backend}: the one answer is the replay's: {}",
        answered[0]
    );
    app.stop().await;
}

/// An agent that hangs up and calls again cannot keep more calls on their way than its
/// session's cap: the socket frees a connection at each hang-up, but every call holds
/// one of the session's slots of calls under way until it ends (`Gate::call_to_the_end`).
/// Without the cap each round below would add as many calls again, up to whatever the
/// provider's timeout lets pile up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_whose_client_hung_up_count_against_the_sessions_cap() {
    let mut world = World::with_policy_text(REFUNDS_RUN_POLICY).await;
    // Held long enough that no refund of the rounds below ends before the last call.
    let (stripe_url, arrivals) = slow_stripe::start_counted(
        world.stripe.base_url(),
        Duration::from_secs(15),
        Arc::new(Notify::new()),
    )
    .await;
    world.settings.stripe.api_url = stripe_url;
    let connections = world.settings.sessions.socket_max_connections;
    let cap = 2 * connections;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[50_000])
        .await;
    let charge = ada.charges[0].clone();
    let refund = move |cents: usize| json!({"charge": charge, "amount": cents, "reason": "requested_by_customer"});

    // Rounds of half as many calls as the socket lets in (the session's agent may hold
    // a connection too), each cut once all of its refunds reached Stripe: the socket's
    // connections are free again after each round.
    let per_round = connections / 2;
    for round in 0..cap / per_round {
        let calls: Vec<_> = (0..per_round)
            .map(|i| {
                let (session, args) = (ada.session.clone(), refund(1 + round * per_round + i));
                tokio::spawn(async move { session.call("stripe.create_refund", args, None).await })
            })
            .collect();
        let sent = (round + 1) * per_round;
        eventually_within(
            Duration::from_secs(60),
            &format!("{sent} refunds reached Stripe"),
            || async { arrivals.load(Ordering::SeqCst) == sent },
        )
        .await;
        for call in &calls {
            call.abort();
        }
        for call in calls {
            assert!(
                call.await.is_err_and(|e| e.is_cancelled()),
                "cut before its answer"
            );
        }
    }

    // The socket takes the next call, but the session has its cap of calls under way:
    // refused before anything is recorded or sent, a read as much as a write.
    let (status, answer) = ada
        .session
        .call("stripe.create_refund", refund(999), None)
        .await;
    assert_eq!(
        (status, &answer["error"]),
        (429, &json!("too_many_calls")),
        "{answer}"
    );
    assert!(
        answer["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("{cap} calls under way"))),
        "{answer}"
    );
    let (status, answer) = ada
        .session
        .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
        .await;
    assert_eq!(
        (status, &answer["error"]),
        (429, &json!("too_many_calls")),
        "{answer}"
    );
    assert_eq!(
        arrivals.load(Ordering::SeqCst),
        cap,
        "nothing more reached Stripe"
    );
    assert_eq!(app.executions_of("stripe.create_refund").await.len(), cap);
    assert!(app.executions_of("stripe.get_charge").await.is_empty());

    // Each cut call runs to its outcome and gives its slot back: the session calls again.
    eventually_within(
        Duration::from_secs(60),
        "every cut refund succeeded",
        || async {
            let rows = app.executions_of("stripe.create_refund").await;
            rows.len() == cap && rows.iter().all(|row| row.status == "succeeded")
        },
    )
    .await;
    assert_eq!(refunds(&world.stripe).await.len(), cap, "each sent once");
    let (status, answer) = ada
        .session
        .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
        .await;
    assert_eq!(status, 200, "{answer}");
    app.stop().await;
}
