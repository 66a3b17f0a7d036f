//! A minimal MCP harness for `tests/mcp_e2e` (not shipped): run inside a sandbox
//! container by `threadgate-agent-runner` as the agent file's `harness:`, it uses
//! rmcp's client on `THREADGATE_MCP_URL` (the runner's bridge) to do what a harness
//! does — list the tools, read, get refunds held, wait, redeem an input request — and
//! what a hostile one tries: another thread's id, a stored secret, a forged and a
//! replayed request state. Each step prints one line `PROBE {"step": …, "body": …}`.
//!
//! Usage: `mcp_probe PLAN.json` where the plan names `customer`, `charges` (two),
//! `other_thread` and `secret`.

#![expect(
    clippy::indexing_slicing,
    reason = "example code: an index out of range stops the example with its message"
)]

use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig,
    ElicitationCapability, Implementation, ProtocolVersion, UrlElicitationCapability,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt as _, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Value, json};

type Client = RunningService<RoleClient, ClientConfig>;

fn say(step: &str, body: Value) {
    println!("PROBE {}", json!({"step": step, "body": body}));
}

async fn connect(url: &str, url_elicitation: bool) -> anyhow::Result<Client> {
    let mut caps = ClientCapabilities::default();
    if url_elicitation {
        caps.elicitation =
            Some(ElicitationCapability::new().with_url(UrlElicitationCapability::new()));
    }
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    Ok(
        ClientConfig::new(caps, Implementation::new("mcp-probe", "0.1.0"))
            .serve_with_lifecycle(
                StreamableHttpClientTransport::from_uri(url.to_owned()),
                lifecycle,
            )
            .await?,
    )
}

fn params(tool: &str, args: Value) -> CallToolRequestParams {
    let args = match args {
        Value::Object(m) => m,
        _ => Default::default(),
    };
    CallToolRequestParams::new(tool.to_owned()).with_arguments(args)
}

/// One call; the structured body, `is_error` added, or the input request's fields.
async fn call(client: &Client, p: CallToolRequestParams) -> anyhow::Result<Value> {
    Ok(match client.call_tool_once(p).await? {
        CallToolResponse::Complete(r) => {
            let mut body = r.structured_content.clone().unwrap_or(Value::Null);
            body["is_error"] = json!(r.is_error);
            body
        }
        CallToolResponse::InputRequired(r) => json!({
            "input_required": true,
            "request_state": r.request_state,
            "input_requests": serde_json::to_value(&r.input_requests)?,
            "meta": r.meta.map(|m| Value::Object(m.0)),
        }),
        other => json!({"unexpected": format!("{other:?}")}),
    })
}

async fn with_state(
    client: &Client,
    tool: &str,
    args: &Value,
    state: &str,
) -> anyhow::Result<Value> {
    let mut p = params(tool, args.clone());
    p.request_state = Some(state.to_owned());
    p.input_responses = Some(
        [("approval".to_owned(), json!({"action": "accept"}))]
            .into_iter()
            .collect(),
    );
    call(client, p).await
}

/// One chat completion through the model proxy, as an OpenAI-compatible harness asks.
async fn ask_model() -> anyhow::Result<Value> {
    let base = std::env::var("OPENAI_BASE_URL")?;
    let model = std::env::var("THREADGATE_MODEL")?;
    let answer = reqwest::Client::new()
        .post(format!("{base}/chat/completions"))
        .bearer_auth(std::env::var("OPENAI_API_KEY").unwrap_or_default())
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await?;
    let status = answer.status().as_u16();
    let body: Value = answer.json().await.unwrap_or(Value::Null);
    Ok(json!({"status": status, "object": body["object"], "model": body["model"]}))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("THREADGATE_MCP_URL")?;
    let plan_file = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "probe.json".into());
    let plan: Value = serde_json::from_str(&std::fs::read_to_string(plan_file)?)?;
    say(
        "env",
        json!({"mcp_url": url, "model_base_url": std::env::var("OPENAI_BASE_URL").ok()}),
    );

    say("model", ask_model().await?);
    let plain = connect(&url, false).await?;
    let tools = plain.list_all_tools().await?;
    say(
        "tools",
        json!(tools.iter().map(|t| t.name.to_string()).collect::<Vec<_>>()),
    );
    let read = call(
        &plain,
        params("stripe.list_charges", json!({"customer": plan["customer"]})),
    )
    .await?;
    say("read", read);
    let other = json!({"thread_id": plan["other_thread"], "text": "Your refund is on its way."});
    say(
        "other_thread",
        call(&plain, params("helpdesk.reply_to_thread", other)).await?,
    );
    let secret = json!({"text": format!("the key is {}", plan["secret"].as_str().unwrap_or(""))});
    say(
        "secret",
        call(&plain, params("helpdesk.add_note", secret)).await?,
    );

    let refund = json!({"charge": plan["charges"][0], "amount": 1000, "reason": "requested_by_customer",
        "diagnosis": "a goodwill refund the customer asked for"});
    let held = call(&plain, params("stripe.create_refund", refund)).await?;
    say("held", held.clone());
    let id = held["execution_id"].clone();
    let mut waited = Value::Null;
    for _ in 0..5 {
        waited = call(
            &plain,
            params(
                "threadgate_wait",
                json!({"execution_id": id, "timeout_seconds": 60}),
            ),
        )
        .await?;
        if waited["status"] != "pending_approval" {
            break;
        }
    }
    say("waited", waited);

    let asking = connect(&url, true).await?;
    let second =
        json!({"charge": plan["charges"][1], "amount": 500, "reason": "requested_by_customer"});
    let asked = call(&asking, params("stripe.create_refund", second.clone())).await?;
    say("input_required", asked.clone());
    let state = asked["request_state"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut forged = state.clone().into_bytes();
    if let Some(b) = forged.get_mut(state.len() / 2) {
        *b = if *b == b'A' { b'B' } else { b'A' };
    }
    let forged = String::from_utf8_lossy(&forged).into_owned();
    say(
        "forged",
        with_state(&asking, "stripe.create_refund", &second, &forged).await?,
    );
    say(
        "redeemed",
        with_state(&asking, "stripe.create_refund", &second, &state).await?,
    );
    say(
        "replayed",
        with_state(&asking, "stripe.create_refund", &second, &state).await?,
    );
    let _ = plain.cancel().await;
    let _ = asking.cancel().await;
    println!("PROBE DONE");
    Ok(())
}
