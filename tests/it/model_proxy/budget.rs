//! Budgets: the turn cap and the token budget stop a looping agent with 429
//! `budget_exhausted`, one note on the thread saying a person takes over, and the
//! session stopped; concurrent calls cannot overspend.

use threadgate::model::Provider;

use super::{ModelWorld, chat, customer_says};
use crate::support::app::TestApp;
use crate::support::wait::eventually;
use crate::support::world::{Session, World};

/// Waits for the budget note on the thread and the session's stop; returns the notes
/// that speak of the budget.
async fn note_and_stop(world: &World, app: &TestApp, s: &Session) -> usize {
    eventually("the budget note reaches the thread", || async {
        world
            .plain
            .thread(&s.thread_id)
            .notes()
            .iter()
            .any(|(_, t)| t.contains("model budget is spent"))
    })
    .await;
    app.session_stops(&s.thread_id).await;
    let notes = world.plain.thread(&s.thread_id).notes();
    let budget: Vec<_> = notes
        .iter()
        .filter(|(_, t)| t.contains("model budget is spent"))
        .collect();
    assert!(budget[0].1.contains("A person takes over"), "{budget:?}");
    budget.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_agent_stops_at_the_turn_cap_with_one_note() {
    let mw = ModelWorld::new(Provider::Scripted)
        .await
        .with_limits(1_000_000, 2);
    let app = mw.world.start().await;
    let c = mw
        .world
        .customer_session(&app, "loop@example.com", &[1200])
        .await;
    let s = &c.session;
    let convo = customer_says("The billing page is stuck in a loop.");
    for turn in 1..=2 {
        let (status, body) = chat(s, convo.clone()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["threadgate"]["turns_used"], turn);
        assert_eq!(
            super::first_call(&body).0,
            "stripe.list_charges",
            "the loop script"
        );
    }
    let (status, body) = chat(s, convo.clone()).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"], "budget_exhausted");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("2 of its model turns")
            || body["message"]
                .as_str()
                .unwrap_or_default()
                .contains("all 2")
    );
    assert_eq!(
        mw.model.seen().len(),
        2,
        "the refused call never went upstream"
    );
    assert_eq!(note_and_stop(&mw.world, &app, s).await, 1);
    let blocked: Vec<_> = app.executions_of("model.chat").await;
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0].status, "blocked");
    assert!(
        app.audit_rows()
            .await
            .iter()
            .any(|r| r.outcome.as_deref() == Some("budget_exhausted"))
    );
    app.verify_audit().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_budget_counts_upstream_usage_and_caps_max_tokens() {
    // Room for the second call: its ~3.4 kB are at least ~430 tokens at 8 bytes a
    // token, which must fit what the first leaves.
    let mw = ModelWorld::new(Provider::Openai)
        .await
        .with_limits(1150, 40);
    let app = mw.world.start().await;
    let c = mw
        .world
        .customer_session(&app, "tokens@example.com", &[1200])
        .await;
    let s = &c.session;
    let convo = customer_says("[scripted:tokens:600] The page is stuck in a loop.");
    let (status, first) = chat(s, convo.clone()).await;
    assert_eq!(status, 200, "{first}");
    let used = first["threadgate"]["tokens_used"].as_u64().expect("tokens");
    assert!((600..1150).contains(&used), "{used}");
    let (status, second) = chat(s, convo.clone()).await;
    assert_eq!(status, 200, "{second}");
    assert!(
        second["threadgate"]["tokens_used"]
            .as_u64()
            .expect("tokens")
            >= 1150
    );
    // The metrics count the same tokens, by model (other tests of this process may add).
    let total = second["threadgate"]["tokens_used"]
        .as_u64()
        .expect("tokens") as f64;
    let metrics = threadgate::metrics::get().render();
    let counted = |prefix: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(
        counted("threadgate_model_tokens_total{model=") >= total,
        "{metrics}"
    );
    assert!(
        counted("threadgate_model_call_seconds_count{") >= 2.0,
        "{metrics}"
    );
    let seen = mw.model.seen();
    assert_eq!(seen[0].body["max_tokens"], 1150, "at most the budget");
    assert_eq!(
        seen[1].body["max_tokens"].as_u64(),
        Some(1150 - used),
        "at most what is left"
    );
    let (status, body) = chat(s, convo).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (429, Some("budget_exhausted")),
        "{body}"
    );
    assert_eq!(note_and_stop(&mw.world, &app, s).await, 1);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_cannot_overspend_the_turn_cap() {
    let mut mw = ModelWorld::new(Provider::Scripted)
        .await
        .with_limits(1_000_000, 3);
    // All ten may wait their turn: the budget, not the queue, is what this checks.
    mw.world.settings.model.max_queued_calls = 16;
    let app = mw.world.start().await;
    let c = mw
        .world
        .customer_session(&app, "flood@example.com", &[1200])
        .await;
    let body = serde_json::json!({
        "messages": customer_says("The page is stuck in a loop."),
        "tools": super::offered_tools(&c.session).await,
    });
    // All connected before the first answer: the session stops once its budget is out.
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let (s, body) = (c.session.clone(), body.clone());
            tokio::spawn(async move { super::chat_raw(&s, &body).await.0 })
        })
        .collect();
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.expect("call task"));
    }
    statuses.sort();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        3,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    assert_eq!(mw.model.seen().len(), 3);
    app.stop().await;
}
