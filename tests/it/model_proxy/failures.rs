//! What the proxy refuses and how it survives its upstream: a secret in the prompt,
//! another model, streaming, retries on 429 and 5xx, malformed answers, and the garbage
//! script's invalid arguments passed through as text.

use serde_json::json;
use threadgate::model::Provider;

use super::{ModelWorld, assert_upstream_error, chat, chat_raw, customer_says, first_call};
use crate::support::world::{STRIPE_KEY, Session};

async fn session(mw: &ModelWorld, app: &crate::support::app::TestApp, email: &str) -> Session {
    mw.world.customer_session(app, email, &[900]).await.session
}

// Before: the refusal only parked the runner's turn; no note, no handover, and every
// later turn resent the same secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_secret_in_the_prompt_stops_the_session_with_a_note() {
    let mw = ModelWorld::new(Provider::Openai).await;
    let app = mw.world.start().await;
    // In the customer's text, in a tool call's arguments, in a content block.
    let attempts = [
        (
            "stripe_api_key",
            customer_says(&format!("my key is {STRIPE_KEY}, charged twice")),
        ),
        (
            "model_api_key",
            json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "stripe.list_charges", "arguments": format!("{{\"customer\":\"{}\"}}", super::MODEL_KEY)}}]}, {"role": "tool", "tool_call_id": "c1", "content": "ok"}]),
        ),
        (
            "github_token",
            json!([{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": crate::support::github_stub::TOKEN}]}]),
        ),
    ];
    let values = [
        STRIPE_KEY,
        super::MODEL_KEY,
        crate::support::github_stub::TOKEN,
    ];
    for (i, (name, messages)) in attempts.into_iter().enumerate() {
        let s = session(&mw, &app, &format!("leak{i}@example.com")).await;
        let (status, body) = chat(&s, messages).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (403, Some("secret_in_prompt")),
            "{body}"
        );
        assert!(values.iter().all(|v| !body.to_string().contains(v)));
        let note = mw
            .world
            .note_containing(
                &s.thread_id,
                "a stored secret reached its prompt",
                "the stop note",
            )
            .await;
        assert!(
            note.contains(&format!("{name:?}")) && note.contains("A person takes over"),
            "the note names the secret and hands the thread over: {note}"
        );
        assert!(values.iter().all(|v| !note.contains(v)), "{note}");
        // The session stops, as for a spent budget: a person takes over.
        app.session_stops(&s.thread_id).await;
        let notes = mw.world.plain.thread(&s.thread_id).notes();
        assert_eq!(notes.len(), 1, "one note: {notes:?}");
    }
    assert!(mw.model.seen().is_empty(), "nothing reached the model");
    let rows = app.audit_rows().await;
    let refused = rows
        .iter()
        .filter(|r| r.event == "refused" && r.outcome.as_deref() == Some("secret_in_prompt"));
    assert_eq!(refused.count(), 3);
    let blocked = rows
        .iter()
        .filter(|r| r.event == "blocked" && r.outcome.as_deref() == Some("secret_in_prompt"));
    assert_eq!(blocked.count(), 3, "each stop is in the audit chain");
    assert!(values.iter().all(|v| !format!("{rows:?}").contains(v)));
    app.verify_audit().await;
    app.stop().await;
}

// Before: the scan read chosen fields only, and a named tool choice was not among them:
// `tool_choice.function.name` carried a stored secret to the model provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_secret_anywhere_in_the_request_stops_the_session() {
    let mw = ModelWorld::new(Provider::Openai).await;
    let app = mw.world.start().await;
    let plain_key = crate::support::plain_fake::API_KEY;
    let github = crate::support::github_stub::TOKEN;
    let tool = |description: &str, parameters: serde_json::Value| {
        json!({"type": "function", "function": {"name": "stripe.list_charges",
            "description": description, "parameters": parameters}})
    };
    let plain_tool = tool("list charges", json!({"type": "object"}));
    let messages = customer_says("charged twice");
    let attempts = [
        (
            "tool_choice.function.name",
            "stripe_api_key",
            json!({"messages": messages, "tools": [plain_tool],
                "tool_choice": {"type": "function", "function": {"name": STRIPE_KEY}}}),
        ),
        (
            "a tool's description",
            "plain_api_key",
            json!({"messages": messages,
                "tools": [tool(&format!("use {plain_key} here"), json!({"type": "object"}))]}),
        ),
        (
            "a key",
            "github_token",
            json!({"messages": messages, "tools": [plain_tool], "metadata": {github: "x"}}),
        ),
        (
            "a nested field",
            "stripe_api_key",
            json!({"messages": [{"role": "user", "content": "hi",
                "extra": {"trace": [{"id": format!("id-{STRIPE_KEY}")}]}}]}),
        ),
    ];
    let values = [STRIPE_KEY, plain_key, github];
    for (i, (place, name, body)) in attempts.into_iter().enumerate() {
        let s = session(&mw, &app, &format!("anywhere{i}@example.com")).await;
        let (status, answer) = chat_raw(&s, &body).await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (403, Some("secret_in_prompt")),
            "{place}: {answer}"
        );
        assert!(values.iter().all(|v| !answer.to_string().contains(v)));
        let note = mw
            .world
            .note_containing(
                &s.thread_id,
                "a stored secret reached its prompt",
                "the stop note",
            )
            .await;
        assert!(note.contains(&format!("{name:?}")), "{place}: {note}");
        assert!(values.iter().all(|v| !note.contains(v)), "{note}");
        app.session_stops(&s.thread_id).await;
    }
    assert!(mw.model.seen().is_empty(), "nothing reached the model");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_model_and_streaming_are_refused() {
    let mw = ModelWorld::new(Provider::Openai).await;
    let app = mw.world.start().await;
    let s = session(&mw, &app, "model@example.com").await;
    let messages = customer_says("charged twice");
    let (status, body) = chat_raw(&s, &json!({"model": "gpt-4o", "messages": messages})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("model_not_allowed")),
        "{body}"
    );
    let (status, body) = chat_raw(&s, &json!({"messages": messages, "stream": true})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    let (status, body) = chat_raw(&s, &json!({"messages": "nope"})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    let (status, _) = chat_raw(
        &s,
        &json!({"model": "scripted-model", "messages": messages}),
    )
    .await;
    assert_eq!(status, 200, "the agent's own model, named");
    assert_eq!(mw.model.seen().len(), 1);
    let rows = app.audit_rows().await;
    assert!(
        rows.iter()
            .any(|r| r.event == "refused" && r.outcome.as_deref() == Some("model_not_allowed"))
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_and_server_errors_are_retried_with_backoff() {
    let mut mw = ModelWorld::new(Provider::Openai).await;
    mw.world.settings.model.retries = 3;
    let app = mw.world.start().await;
    let s = session(&mw, &app, "retry@example.com").await;
    let (status, body) = chat(&s, customer_says("[scripted:flaky429:2] charged twice")).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = chat(&s, customer_says("[scripted:flaky500:3] charged twice")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(mw.model.seen().len(), 3 + 4);
    let (status, body) = chat(&s, customer_says("[scripted:flaky500:9] charged twice")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (502, Some("upstream_error")),
        "{body}"
    );
    assert_eq!(mw.model.seen().len(), 7 + 4, "one try and three retries");
    let outcomes: Vec<String> = app
        .audit_rows()
        .await
        .into_iter()
        .filter(|r| r.event == "model_call")
        .filter_map(|r| r.outcome)
        .collect();
    assert!(
        outcomes[0].ends_with("attempts=3") && outcomes[1].ends_with("attempts=4"),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[2], "upstream_error");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_slow_upstream_is_an_error_not_a_hang() {
    let mut mw = ModelWorld::new(Provider::Openai).await;
    mw.world.settings.model.retries = 1;
    mw.world.settings.model.timeout = std::time::Duration::from_millis(300);
    let app = mw.world.start().await;
    let s = session(&mw, &app, "slow@example.com").await;
    let (status, body) = chat(&s, customer_says("[scripted:slow:5000] charged twice")).await;
    assert_upstream_error(status, &body, "timed out");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_answers_are_502_and_the_session_goes_on() {
    for provider in [Provider::Openai, Provider::Anthropic] {
        let mw = ModelWorld::new(provider).await;
        let app = mw.world.start().await;
        let s = session(&mw, &app, "garbage@example.com").await;
        for flag in ["malformed", "nousage"] {
            let (status, body) = chat(&s, customer_says(&format!("[scripted:{flag}] hi"))).await;
            assert_eq!(
                (status, body["error"].as_str()),
                (502, Some("upstream_malformed")),
                "{flag}: {body}"
            );
        }
        // The garbage script: invalid JSON arguments come through as the model's text.
        let (status, body) = chat(&s, customer_says("Your app shows garbage")).await;
        assert_eq!(status, 200, "{body}");
        let (name, args) = first_call(&body);
        assert_eq!(name, "stripe.list_charges");
        assert!(
            serde_json::from_str::<serde_json::Value>(&args).is_err()
                || args.contains("_invalid_arguments"),
            "{args}"
        );
        // An unknown tool name is passed through; the gateway refuses it if called.
        let mut convo = customer_says("Your app shows garbage");
        let list = convo.as_array_mut().expect("array");
        list.push(body["choices"][0]["message"].clone());
        list.push(json!({"role": "tool", "tool_call_id": body["choices"][0]["message"]["tool_calls"][0]["id"], "content": "{\"error\":\"invalid arguments\"}"}));
        let (status, body) = chat(&s, convo.clone()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(first_call(&body).0, "stripe__teleport_money");
        // Then the upstream fails: 502 after the retries, and the socket still answers.
        let list = convo.as_array_mut().expect("array");
        list.push(body["choices"][0]["message"].clone());
        list.push(json!({"role": "tool", "tool_call_id": body["choices"][0]["message"]["tool_calls"][0]["id"], "content": "{\"error\":\"unknown tool\"}"}));
        let (status, body) = chat(&s, convo).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (502, Some("upstream_error")),
            "{body}"
        );
        assert_eq!(s.get("/v1/agent").await.0, 200);
        app.stop().await;
    }
}

// The scripted server used to answer every 429 with `Retry-After: 0`, so nothing showed
// the proxy waits as long as the upstream asks. The check reads the server's own
// arrival times, not a clock of the test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_within_the_calls_deadline() {
    let mut mw = ModelWorld::new(Provider::Openai).await;
    mw.world.settings.model.retries = 3;
    mw.world.settings.model.retry_deadline = std::time::Duration::from_secs(10);
    let app = mw.world.start().await;
    let s = session(&mw, &app, "retry-after@example.com").await;
    let (status, body) = chat(&s, customer_says("[scripted:retryafter1:2] charged twice")).await;
    assert_eq!(status, 200, "{body}");
    let seen = mw.model.seen();
    assert_eq!(seen.len(), 3, "two 429s, then the answer");
    for pair in seen.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(
            gap >= std::time::Duration::from_secs(1),
            "the retry came {gap:?} after the 429 asking for 1 s"
        );
    }
    app.stop().await;

    // A deadline shorter than the asked wait: the call fails at once, no retry.
    let mut mw = ModelWorld::new(Provider::Openai).await;
    mw.world.settings.model.retries = 3;
    mw.world.settings.model.retry_deadline = std::time::Duration::from_millis(500);
    let app = mw.world.start().await;
    let s = session(&mw, &app, "deadline@example.com").await;
    let (status, body) = chat(&s, customer_says("[scripted:retryafter1:9] charged twice")).await;
    assert_upstream_error(status, &body, "deadline");
    assert_eq!(mw.model.seen().len(), 1, "no retry past the deadline");
    app.stop().await;
}
