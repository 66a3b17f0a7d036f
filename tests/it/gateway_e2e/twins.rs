//! An identical write sent while the first is still on its way to Stripe (an agent that
//! retried because its first call seemed slow) is not sent again: it waits for the
//! first's outcome and is answered from it. Before, it was decided anew with an
//! idempotency key of its own, and Stripe made a second refund.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;

use crate::support::slow_stripe;
use crate::support::world::{World, refunds};

/// Refunds run without a person, so the two identical calls are both decided `run`
/// unless the gate sees the first still running.
const POLICY: &str = r#"
policy:
  default_mode: risk
policies:
  - match: "stripe.create_refund"
    action: always_run
  - match: "stripe.get_*"
    action: always_run
"#;

/// How long Stripe holds the first refund: the second call arrives meanwhile.
const SLOW_REFUND: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_refund_sent_while_the_first_is_in_flight_is_answered_from_it() {
    let pg = threadgate::store::testing::TestDb::postgres_from_env();
    let mut backends = vec![None];
    if let Some(pg) = &pg {
        backends.push(Some(pg.url().expect("a postgres url").to_owned()));
    }
    for url in backends {
        let backend = if url.is_some() { "postgres" } else { "sqlite" };
        let mut world = World::with_policy_text(POLICY).await;
        if let Some(url) = &url {
            world.use_postgres(url).await;
        }
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
        let refund_calls: Vec<_> = app
            .executions()
            .await
            .into_iter()
            .filter(|e| e.tool == "stripe.create_refund")
            .collect();
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
