//! An identical write sent while the first is still on its way to Stripe (an agent that
//! retried because its first call seemed slow) is not sent again: it waits for the
//! first's outcome and is answered from it. Before, it was decided anew with an
//! idempotency key of its own, and Stripe made a second refund.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;

use crate::support::slow_stripe;
use crate::support::world::{Backends, REFUNDS_RUN_POLICY, World, refunds};

/// How long Stripe holds the first refund: the second call arrives meanwhile.
const SLOW_REFUND: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_refund_sent_while_the_first_is_in_flight_is_answered_from_it() {
    let backends = Backends::from_env();
    for backend in backends.names() {
        let mut world = backends.world(backend, REFUNDS_RUN_POLICY).await;
        let refund_arrived = Arc::new(Notify::new());
        world.settings.stripe.api_url =
            slow_stripe::start(world.stripe.base_url(), SLOW_REFUND, refund_arrived.clone()).await;
        let app = world.start().await;
        let ada = world
            .customer_session(&app, "ada@example.com", &[5000])
            .await;
        let args =
            json!({"charge": ada.charges[0], "amount": 700, "reason": "requested_by_customer"});

        let first = {
            let (session, args) = (&ada.session, args.clone());
            async move { session.call("stripe.create_refund", args, None).await }
        };
        let second = async {
            tokio::time::timeout(Duration::from_secs(30), refund_arrived.notified())
                .await
                .expect("the first refund reaches Stripe");
            ada.session
                .call("stripe.create_refund", args.clone(), None)
                .await
        };
        let ((s1, a1), (s2, a2)) = tokio::join!(first, second);
        assert_eq!((s1, &a1["status"]), (200, &json!("ok")), "{backend}: {a1}");
        assert_eq!((s2, &a2["status"]), (200, &json!("ok")), "{backend}: {a2}");
        assert_eq!(a1["replayed"], false, "{backend}: {a1}");
        assert_eq!(a2["replayed"], true, "{backend}: {a2}");
        assert_eq!(a2["execution_id"], a1["execution_id"], "{backend}");
        assert_eq!(a2["result"]["id"], a1["result"]["id"], "{backend}");

        // One refund at Stripe, one execution, its audit whole.
        let made = refunds(&world.stripe).await;
        assert_eq!(made.len(), 1, "{backend}: {made:#?}");
        assert_eq!(made[0]["id"], a1["result"]["id"], "{backend}");
        let refund_calls: Vec<_> = app.executions_of("stripe.create_refund").await;
        assert_eq!(refund_calls.len(), 1, "{backend}: {refund_calls:#?}");
        assert_eq!(refund_calls[0].status, "succeeded", "{backend}");
        assert!(app.verify_audit().await > 0, "{backend}");

        // Once it is done, the same call again is a replay as before, and a different
        // amount is a refund of its own.
        let (status, again) = ada.session.call("stripe.create_refund", args, None).await;
        assert_eq!(
            (status, &again["replayed"]),
            (200, &json!(true)),
            "{backend}: {again}"
        );
        let other =
            json!({"charge": ada.charges[0], "amount": 300, "reason": "requested_by_customer"});
        let (status, more) = ada.session.call("stripe.create_refund", other, None).await;
        assert_eq!(
            (status, &more["replayed"]),
            (200, &json!(false)),
            "{backend}: {more}"
        );
        assert_eq!(refunds(&world.stripe).await.len(), 2, "{backend}");
        app.stop().await;
    }
}

/// A refund's outcome commits without waiting for the log's flush (Stripe deduplicates
/// by its idempotency key), so a crash of the database server may take it back and
/// leave the row `running` while this instance lives on and the agent already has its
/// answer. The same refund asked again is then not sent under a key of its own: it
/// waits for the first, which this instance's sweep finds `running` with nothing here
/// sending it (two passes in a row), re-sends with its key and records; the second is
/// answered as a replay of it. One refund at Stripe, no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_whose_outcome_was_lost_is_recovered_here_and_not_sent_again() {
    let world = World::with_policy_text(REFUNDS_RUN_POLICY).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let args = json!({"charge": ada.charges[0], "amount": 700, "reason": "requested_by_customer"});
    let (status, first) = ada
        .session
        .call("stripe.create_refund", args.clone(), None)
        .await;
    assert_eq!(
        (status, &first["replayed"]),
        (200, &json!(false)),
        "{first}"
    );
    let id = first["execution_id"].as_str().expect("id").to_owned();

    // The outcome lost: the row as its decision left it.
    let lost = id.clone();
    app.db
        .write(move |c| {
            c.execute(
                "UPDATE executions SET status = 'running', result = NULL, \
                 finished_at_ms = NULL WHERE id = ?1",
                [lost.as_str()],
            )
        })
        .await
        .expect("lose the outcome");
    let (status, again) = ada.session.call("stripe.create_refund", args, None).await;
    assert_eq!((status, &again["replayed"]), (200, &json!(true)), "{again}");
    assert_eq!(again["execution_id"], id.as_str(), "{again}");
    assert_eq!(again["result"]["id"], first["result"]["id"], "{again}");
    assert_eq!(
        refunds(&world.stripe).await.len(),
        1,
        "one refund at Stripe"
    );
    let refund_calls = app.executions_of("stripe.create_refund").await;
    assert_eq!(refund_calls.len(), 1, "nothing of the second call recorded");
    assert_eq!(refund_calls[0].status, "succeeded");
    // The re-send is audited: a second `ran`.
    let events = app.audit_events_of(&id).await;
    assert_eq!(events, ["requested", "decided", "ran", "ran"], "{events:?}");
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

/// A hostile agent's retries cannot pile up waits: at most 4 identical writes of one
/// session wait for the twin still being sent; one more is answered at once (409
/// `in_flight`, naming the twin), and none is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_waits_on_its_twins_only_so_many_at_once() {
    let mut world = World::with_policy_text(REFUNDS_RUN_POLICY).await;
    let refund_arrived = Arc::new(Notify::new());
    world.settings.stripe.api_url = slow_stripe::start(
        world.stripe.base_url(),
        Duration::from_secs(4),
        refund_arrived.clone(),
    )
    .await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let args = json!({"charge": ada.charges[0], "amount": 700, "reason": "requested_by_customer"});
    let first = ada.session.call("stripe.create_refund", args.clone(), None);
    let retries = async {
        tokio::time::timeout(Duration::from_secs(30), refund_arrived.notified())
            .await
            .expect("the first refund reaches Stripe");
        let calls = (0..6).map(|_| ada.session.call("stripe.create_refund", args.clone(), None));
        futures::future::join_all(calls).await
    };
    let ((status, first), retries) = tokio::join!(first, retries);
    assert_eq!(status, 200, "{first}");
    let id = first["execution_id"].clone();
    let replayed = retries
        .iter()
        .filter(|(s, a)| *s == 200 && a["replayed"] == true && a["execution_id"] == id)
        .count();
    let at_once = retries
        .iter()
        .filter(|(s, a)| *s == 409 && a["error"] == "in_flight")
        .count();
    assert_eq!((replayed, at_once), (4, 2), "{retries:#?}");
    assert_eq!(refunds(&world.stripe).await.len(), 1);
    assert_eq!(app.executions_of("stripe.create_refund").await.len(), 1);
    app.stop().await;
}
