//! What a model call counts against the session's budget when it does not simply
//! answer. Each turn reserves what it may cost at most (its request's tokens at the
//! least, and the whole answer it may have) before it goes upstream; the tokens the
//! upstream reports replace the reservation. A call that fails or times out keeps it:
//! the upstream may have billed what it began; one the upstream refused outright (a
//! 4xx other than 429) gives it back. And a runner that hangs up mid-call no longer
//! cuts it: the call runs to its answer, which is counted and audited; one that hangs
//! up while its call still waits for its turn has it given up, unsent.
//!
//! Before, a call counted only the tokens its answer reported: a call that timed out
//! (each of its attempts perhaps billed) counted 0, and one whose runner hung up was
//! dropped with its request, counted 0 and left no audit row: an agent could spend
//! past its budget by hanging up on its own calls or asking for answers too long to
//! finish in time.

use std::time::Duration;

use serde_json::{Value, json};
use threadgate::model::Provider;

use super::{ModelWorld, chat, chat_raw, customer_says};
use crate::support::app::TestApp;
use crate::support::wait::eventually_within;
use crate::support::world::Session;

/// The session's tokens used, as stored.
async fn tokens_used(app: &TestApp, session: &Session) -> u64 {
    let id = session.id.clone();
    let used: i64 = app
        .db
        .read(move |c| {
            c.query_row(
                "SELECT coalesce(sum(tokens_used), 0) FROM model_usage WHERE session_id = ?1",
                [&id],
                |r| r.get(0),
            )
        })
        .await
        .expect("model usage");
    u64::try_from(used).expect("not negative")
}

/// The `args` of each `model_call` audit row, oldest first.
async fn model_calls(app: &TestApp) -> Vec<(Value, String)> {
    app.audit_rows()
        .await
        .into_iter()
        .filter(|r| r.event == "model_call")
        .map(|r| {
            let args = serde_json::from_str(r.args.as_deref().unwrap_or("null")).expect("json");
            (args, r.outcome.unwrap_or_default())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_times_out_keeps_what_it_reserved() {
    let mut mw = ModelWorld::new(Provider::Openai).await;
    mw.world.settings.model.retries = 1;
    mw.world.settings.model.timeout = Duration::from_millis(300);
    let app = mw.world.start().await;
    let s = mw
        .world
        .customer_session(&app, "slow@example.com", &[900])
        .await
        .session;
    let asked = 700;
    let body = json!({"messages": customer_says("[scripted:slow:5000] charged twice"),
        "max_tokens": asked});
    let (status, answer) = chat_raw(&s, &body).await;
    assert_eq!(status, 502, "{answer}");

    // The reservation stands: the request's tokens at the least plus the answer asked.
    let reserved = tokens_used(&app, &s).await;
    let bytes = body.to_string().len() as u64;
    assert!(
        reserved > asked && reserved < asked + 2 * bytes,
        "reserved {reserved} for max_tokens {asked} and a request of about {bytes} bytes"
    );
    let calls = model_calls(&app).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].1, "upstream_error");
    assert_eq!(
        (
            calls[0].0["tokens"].as_u64(),
            calls[0].0["reserved"].as_u64()
        ),
        (Some(reserved), Some(reserved)),
        "the audit row says what was counted: {}",
        calls[0].0
    );

    // A call that answers counts what the upstream reports, on top.
    let (status, answer) = chat(&s, customer_says("charged twice")).await;
    assert_eq!(status, 200, "{answer}");
    let reported = answer["usage"]["total_tokens"].as_u64().expect("usage");
    assert_eq!(
        answer["threadgate"]["tokens_used"].as_u64(),
        Some(reserved + reported),
        "{answer}"
    );
    assert_eq!(tokens_used(&app, &s).await, reserved + reported);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_runner_hangs_up_runs_to_its_answer_and_is_counted() {
    let mw = ModelWorld::new(Provider::Openai).await;
    let app = mw.world.start().await;
    let s = mw
        .world
        .customer_session(&app, "gone@example.com", &[900])
        .await
        .session;
    let cut = {
        let s = s.clone();
        tokio::spawn(
            async move { chat(&s, customer_says("[scripted:slow:1500] charged twice")).await },
        )
    };
    // The runner hangs up once its call is upstream.
    eventually_within(
        Duration::from_secs(30),
        "the call reached the model",
        || async { !mw.model.seen().is_empty() },
    )
    .await;
    cut.abort();
    assert!(
        cut.await.is_err_and(|e| e.is_cancelled()),
        "cut before its answer"
    );

    // The call itself goes on: its answer's tokens are counted and it is audited.
    eventually_within(
        Duration::from_secs(30),
        "the cut call is audited",
        || async { model_calls(&app).await.len() == 1 },
    )
    .await;
    let calls = model_calls(&app).await;
    assert!(calls[0].1.starts_with("ok "), "{calls:?}");
    let counted = calls[0].0["tokens"].as_u64().expect("tokens");
    assert!(counted > 0 && counted < calls[0].0["reserved"].as_u64().expect("reserved"));
    assert_eq!(
        tokens_used(&app, &s).await,
        counted,
        "settled to what the answer reported"
    );

    // And the session goes on.
    let (status, answer) = chat(&s, customer_says("charged twice")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(model_calls(&app).await.len(), 2);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_upstream_refuses_gives_its_reservation_back() {
    let mw = ModelWorld::new(Provider::Openai).await;
    let app = mw.world.start().await;
    let s = mw
        .world
        .customer_session(&app, "refused@example.com", &[900])
        .await
        .session;
    let (status, answer) = chat(&s, customer_says("[scripted:refuse400] charged twice")).await;
    assert_eq!(status, 502, "{answer}");
    assert_eq!(tokens_used(&app, &s).await, 0, "nothing was billed");
    let calls = model_calls(&app).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].0["tokens"].as_u64(), Some(0), "{}", calls[0].0);
    assert!(calls[0].0["reserved"].as_u64().is_some_and(|r| r > 0));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_runner_hangs_up_before_its_turn_is_never_sent() {
    let mw = ModelWorld::new(Provider::Openai).await;
    let app = mw.world.start().await;
    let s = mw
        .world
        .customer_session(&app, "queued@example.com", &[900])
        .await
        .session;
    // A slow call runs; a second waits behind it, and its runner hangs up.
    let first = {
        let s = s.clone();
        tokio::spawn(async move { chat(&s, customer_says("[scripted:slow:1500] first")).await })
    };
    eventually_within(
        Duration::from_secs(30),
        "the first call reached the model",
        || async { mw.model.seen().len() == 1 },
    )
    .await;
    let second = {
        let s = s.clone();
        tokio::spawn(async move { chat(&s, customer_says("second")).await })
    };
    // Time for the second to take its place in the queue (were it not queued yet, it
    // would never be sent either, and the test would prove less, not fail).
    tokio::time::sleep(Duration::from_millis(300)).await;
    second.abort();
    assert!(second.await.is_err_and(|e| e.is_cancelled()));
    let (status, answer) = first.await.expect("the first call");
    assert_eq!(status, 200, "{answer}");

    // A third call runs after both: the cut one, queued before it, would have reached
    // the model first. Only the first and the third did.
    let (status, answer) = chat(&s, customer_says("third")).await;
    assert_eq!(status, 200, "{answer}");
    let seen = mw.model.seen();
    assert_eq!(seen.len(), 2, "the cut call was never sent");
    assert_eq!(model_calls(&app).await.len(), 2);
    app.stop().await;
}
