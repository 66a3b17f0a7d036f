//! Both adapters, over the socket, against the scripted server: the "charged twice"
//! script's first two turns, with the tool's real result (localstripe) in between.

use serde_json::{Value, json};
use threadgate::model::Provider;
use threadgate::model::scripted::{LABEL, MODEL_ID};

use super::{MODEL_KEY, ModelWorld, chat, first_call};

/// Runs list_charges → the model's refund of the duplicate, and checks what the
/// upstream saw. Returns the scripted server's view for adapter-specific checks.
async fn duplicate_flow(provider: Provider) -> Vec<threadgate::model::scripted::Seen> {
    let mw = ModelWorld::new(provider).await;
    let app = mw.world.start().await;
    let customer = mw
        .world
        .customer_session(&app, "twice@example.com", &[2500, 2500])
        .await;
    let s = &customer.session;

    let (status, agent) = s.get("/v1/agent").await;
    assert_eq!(status, 200);
    assert_eq!(agent["model"], MODEL_ID);
    assert_eq!(
        agent["limits"],
        json!({"max_tokens": 200000, "max_turns": 40})
    );
    assert!(
        agent["instructions"]
            .as_str()
            .unwrap_or_default()
            .contains("Investigate first")
    );
    let skills: Vec<&str> = agent["skills"]
        .as_array()
        .expect("skills")
        .iter()
        .filter_map(|k| k["name"].as_str())
        .collect();
    assert_eq!(
        skills,
        ["billing-duplicate-charges", "bug-reports", "reply-tone"]
    );
    assert!(
        agent["skills"][0]["body"]
            .as_str()
            .unwrap_or_default()
            .contains("reason: duplicate")
    );

    let mut messages = json!([
        {"role": "system", "content": "You are the support agent."},
        {"role": "user", "content": format!("Customer {}: I was charged twice for my order.", customer.id)},
    ]);
    let (status, first) = chat(s, messages.clone()).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["object"], "chat.completion");
    assert!(
        first["model"]
            .as_str()
            .unwrap_or_default()
            .contains("not a real model")
    );
    assert!(
        first["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .starts_with(LABEL)
    );
    let (name, args) = first_call(&first);
    assert_eq!(name, "stripe.list_charges", "the wire name is mapped back");
    let args: Value = serde_json::from_str(&args).expect("JSON arguments");
    assert_eq!(args["customer"], customer.id.as_str());
    let tg = &first["threadgate"];
    assert_eq!(
        (tg["turns_used"].as_u64(), tg["turns_budget"].as_u64()),
        (Some(1), Some(40))
    );
    assert!(tg["tokens_used"].as_u64().unwrap_or(0) > 0, "{tg}");
    assert_eq!(tg["tokens_used"], first["usage"]["total_tokens"]);

    // The runner runs the call through the gateway and hands the result back.
    let (status, listed) = s.call("stripe.list_charges", args, None).await;
    assert_eq!(status, 200, "{listed}");
    let call_id = first["choices"][0]["message"]["tool_calls"][0]["id"].clone();
    let list = messages.as_array_mut().expect("array");
    list.push(first["choices"][0]["message"].clone());
    list.push(
        json!({"role": "tool", "tool_call_id": call_id, "content": listed["result"].to_string()}),
    );
    // Then it checks the invoices (none explains the second charge).
    let (status, invoices) = chat(s, messages.clone()).await;
    assert_eq!(status, 200, "{invoices}");
    let (name, args) = first_call(&invoices);
    assert_eq!(name, "stripe.list_invoices", "the wire name is mapped back");
    let args: Value = serde_json::from_str(&args).expect("JSON arguments");
    let (status, listed) = s.call("stripe.list_invoices", args, None).await;
    assert_eq!(status, 200, "{listed}");
    let call_id = invoices["choices"][0]["message"]["tool_calls"][0]["id"].clone();
    let list = messages.as_array_mut().expect("array");
    list.push(invoices["choices"][0]["message"].clone());
    list.push(
        json!({"role": "tool", "tool_call_id": call_id, "content": listed["result"].to_string()}),
    );
    let (status, second) = chat(s, messages).await;
    assert_eq!(status, 200, "{second}");
    let (name, args) = first_call(&second);
    assert_eq!(name, "stripe.create_refund");
    let args: Value = serde_json::from_str(&args).expect("JSON arguments");
    assert!(
        customer
            .charges
            .contains(&args["charge"].as_str().unwrap_or_default().to_owned()),
        "{args}"
    );
    assert_eq!(
        (args["amount"].as_i64(), args["reason"].as_str()),
        (Some(2500), Some("duplicate"))
    );
    assert_eq!(second["threadgate"]["turns_used"], 3);

    // One audit row per model call: tokens, latency, model; never the conversation.
    let rows = app.audit_rows().await;
    let calls: Vec<_> = rows.iter().filter(|r| r.event == "model_call").collect();
    assert_eq!(calls.len(), 3);
    for r in &calls {
        let args = r.args.as_deref().unwrap_or_default();
        assert!(args.contains(MODEL_ID) && args.contains("tokens"), "{args}");
        assert!(
            r.outcome
                .as_deref()
                .unwrap_or_default()
                .starts_with("ok prompt_tokens=")
        );
    }
    let all = format!("{rows:?}");
    assert!(!all.contains("charged twice") && !all.contains(MODEL_KEY));
    app.verify_audit().await;
    app.stop().await;

    let seen = mw.model.seen();
    assert_eq!(seen.len(), 3);
    for r in &seen {
        assert_eq!(r.model, MODEL_ID, "only the agent's model goes upstream");
        let names = r.body["tools"].to_string();
        assert!(
            names.contains("stripe__create_refund") && !names.contains("stripe.create_refund"),
            "wire-safe names"
        );
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_adapter_forwards_with_the_bearer_key_and_maps_tool_names_back() {
    let seen = duplicate_flow(Provider::Openai).await;
    for r in &seen {
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(r.bearer.as_deref(), Some(MODEL_KEY));
        assert_eq!(r.api_key, None);
    }
    // Each offered tool's schema goes as it was offered.
    let tool = &seen[0].body["tools"][0]["function"];
    assert_eq!(tool["parameters"]["type"], "object", "{tool}");
    assert!(tool["parameters"]["properties"].is_object(), "{tool}");
    // The tool result went back as a `tool` message answering the call.
    let last = &seen[1].body["messages"];
    assert_eq!(last[3]["role"], "tool");
    assert_eq!(last[3]["tool_call_id"], last[2]["tool_calls"][0]["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_adapter_converts_tool_use_and_tool_result_both_ways() {
    let seen = duplicate_flow(Provider::Anthropic).await;
    for r in &seen {
        assert_eq!(r.path, "/v1/messages");
        assert_eq!(r.api_key.as_deref(), Some(MODEL_KEY));
        assert_eq!(r.anthropic_version.as_deref(), Some("2023-06-01"));
        assert_eq!(r.bearer, None);
        assert_eq!(r.body["system"], "You are the support agent.");
        assert!(r.body["max_tokens"].as_u64().is_some());
        let schema = &r.body["tools"][0]["input_schema"];
        assert!(
            schema["properties"].is_object(),
            "the schema as offered: {schema}"
        );
    }
    let messages = &seen[1].body["messages"];
    assert_eq!(messages[1]["role"], "assistant");
    let tool_use = messages[1]["content"]
        .as_array()
        .expect("blocks")
        .iter()
        .find(|b| b["type"] == "tool_use")
        .cloned()
        .expect("tool_use");
    assert_eq!(tool_use["name"], "stripe__list_charges");
    assert!(tool_use["input"].is_object());
    assert_eq!(messages[2]["role"], "user");
    assert_eq!(messages[2]["content"][0]["type"], "tool_result");
    assert_eq!(messages[2]["content"][0]["tool_use_id"], tool_use["id"]);
}

// Before: the key was read once when threadgate started, so a key set (or rotated)
// later was never used until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_key_set_after_start_is_used_by_the_next_call() {
    let mw = ModelWorld::new(Provider::Openai).await;
    let secrets = {
        let db = threadgate::store::Db::open(&mw.world.settings.database_path()).expect("db");
        threadgate::app::open_secrets(&db, &mw.world.settings).expect("secrets")
    };
    secrets.delete("model_api_key").await.expect("delete");
    let app = mw.world.start().await;
    let s = mw
        .world
        .customer_session(&app, "late-key@example.com", &[700])
        .await
        .session;
    let (status, body) = chat(&s, super::customer_says("charged twice")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (502, Some("upstream_error")),
        "no key yet: {body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("model_api_key"),
        "{body}"
    );
    assert!(mw.model.seen().is_empty(), "nothing is sent without a key");
    for key in [
        "sk-model-set-later-1a2b3c4d5e",
        "sk-model-rotated-9f8e7d6c5b",
    ] {
        secrets
            .set("model_api_key", key.to_owned().into())
            .await
            .expect("set");
        let (status, body) = chat(&s, super::customer_says("charged twice")).await;
        assert_eq!(status, 200, "{body}");
        let seen = mw.model.seen();
        assert_eq!(seen.last().and_then(|r| r.bearer.as_deref()), Some(key));
    }
    app.stop().await;
}
