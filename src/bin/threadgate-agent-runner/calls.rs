//! A gateway call from the model: `POST /v1/calls`, and when the policy holds it, the
//! wait for the person's decision within the approval's ttl.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::api::{Api, Reply};

/// How long past the approval's expiry the runner keeps asking, for the server's clock.
const EXPIRY_GRACE: Duration = Duration::from_secs(30);
/// How long the runner waits for a held call whose expiry it does not know.
const UNKNOWN_TTL: Duration = Duration::from_secs(24 * 3600);

/// What a gateway call means for the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Feed the result to the model and go on.
    Continue,
    /// The customer got a reply, or the thread went to an engineer: the turn is over.
    Done,
    /// A held call expired without a decision: leave the thread to a person.
    Expired,
}

/// The gateway's first answer to a call.
#[derive(Debug)]
pub enum Submitted {
    /// The tool message's content and what comes next.
    Final(Value, Flow),
    /// Held for a person: the 202 body, to wait on with [`wait_held`].
    Held(Value),
}

/// Calls catalog tool `tool` and, when it is held, waits for the decision.
pub async fn call(
    api: &Api,
    tool: &str,
    args: Value,
    diagnosis: Option<String>,
    findings: Option<&Path>,
) -> (Value, Flow) {
    match submit(api, tool, args, diagnosis, findings).await {
        Submitted::Final(content, flow) => (content, flow),
        Submitted::Held(held) => wait_held(api, tool, &held).await,
    }
}

/// `POST /v1/calls`. A held call's diagnosis is also written to `findings` (in the
/// workspace, so it lands on the thread's branch for the engineers).
pub async fn submit(
    api: &Api,
    tool: &str,
    args: Value,
    diagnosis: Option<String>,
    findings: Option<&Path>,
) -> Submitted {
    let body = json!({"tool": tool, "args": args, "diagnosis": diagnosis});
    let reply = match api.post("/v1/calls", &body).await {
        Ok(r) => r,
        Err(e) => {
            return Submitted::Final(
                json!({"status": "error", "error": format!("the gateway did not answer: {e:#}")}),
                Flow::Continue,
            );
        }
    };
    log(tool, &reply.body);
    if reply.status == 202 {
        if let Some(file) = findings {
            record_hold(file, tool, &body, &reply.body);
        }
        return Submitted::Held(reply.body);
    }
    let done = reply.status == 200 && ends_turn(tool);
    Submitted::Final(
        answer(&reply),
        if done { Flow::Done } else { Flow::Continue },
    )
}

/// The most the findings file grows to.
const FINDINGS_CAP: u64 = 256 * 1024;

/// Appends a held call, its arguments and the diagnosis to the findings file.
fn record_hold(file: &Path, tool: &str, call: &Value, held: &Value) {
    use std::io::Write;
    let entry = format!(
        "## `{tool}` held for a person\n\nExecution: {}\nApproval: {}\nArguments: `{}`\n\n{}\n\n",
        held["execution_id"].as_str().unwrap_or("?"),
        held["approval_url"].as_str().unwrap_or("-"),
        call["args"],
        call["diagnosis"].as_str().unwrap_or("(no diagnosis given)"),
    );
    if std::fs::metadata(file).map_or(0, |m| m.len()) + entry.len() as u64 > FINDINGS_CAP {
        return;
    }
    let written = file
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(file)
        })
        .and_then(|mut f| f.write_all(entry.as_bytes()));
    if let Err(e) = written {
        eprintln!("threadgate-agent-runner: cannot write the findings file: {e}");
    }
}

fn log(tool: &str, body: &Value) {
    let status = body["status"].as_str().unwrap_or("?");
    let id = body["execution_id"].as_str().unwrap_or("-");
    eprintln!("threadgate-agent-runner: gateway call {tool}: {status} (execution {id})");
}

/// Whether a successful call of `tool` ends the agent's turn.
fn ends_turn(tool: &str) -> bool {
    matches!(
        tool,
        "helpdesk.reply_to_thread" | "helpdesk.escalate_to_engineer"
    )
}

/// The gateway's answer as the model sees it: its body, with the HTTP status added when
/// the body does not say what happened.
fn answer(reply: &Reply) -> Value {
    let mut body = reply.body.clone();
    if let Some(map) = body.as_object_mut() {
        map.entry("http_status").or_insert(json!(reply.status));
        if reply.status == 403 && map.get("status").and_then(Value::as_str) == Some("blocked") {
            map.insert(
                "note".into(),
                json!("The policy blocks this call: do not retry it; tell the customer what a person will do instead."),
            );
        }
    }
    body
}

/// Waits for the decision on a held call, until its expiry (plus a grace period).
pub async fn wait_held(api: &Api, tool: &str, held: &Value) -> (Value, Flow) {
    let Some(id) = held["execution_id"].as_str() else {
        return (
            json!({"status": "error", "error": "held without an execution id"}),
            Flow::Continue,
        );
    };
    let ttl = held["expires_at"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| {
            let left = t.timestamp_millis() - chrono::Utc::now().timestamp_millis();
            Duration::from_millis(left.max(0) as u64)
        })
        .unwrap_or(UNKNOWN_TTL);
    let deadline = tokio::time::Instant::now() + ttl + EXPIRY_GRACE;
    let path = format!("/v1/executions/{id}/wait?timeout=60");
    eprintln!("threadgate-agent-runner: {tool} is held for a person (execution {id}); waiting");
    loop {
        if tokio::time::Instant::now() >= deadline {
            return expired(id, held);
        }
        let view = match api.get(&path).await {
            Ok(r) if r.ok() => r.body,
            Ok(r) => {
                eprintln!(
                    "threadgate-agent-runner: waiting on {id}: HTTP {} {}",
                    r.status,
                    r.code()
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => {
                eprintln!("threadgate-agent-runner: waiting on {id}: {e:#}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        match view["status"].as_str().unwrap_or("") {
            "pending_approval" | "running" => continue,
            "expired" => return expired(id, held),
            "ok" => {
                let flow = if ends_turn(tool) {
                    Flow::Done
                } else {
                    Flow::Continue
                };
                return (decided(view, "A person approved this call; it ran."), flow);
            }
            "denied" => {
                return (
                    decided(
                        view,
                        "A person denied this call. Read their message and tell the customer what happens next; do not retry it.",
                    ),
                    Flow::Continue,
                );
            }
            _ => return (decided(view, "The call did not run."), Flow::Continue),
        }
    }
}

fn decided(mut view: Value, note: &str) -> Value {
    if let Some(map) = view.as_object_mut() {
        map.insert("note".into(), json!(note));
    }
    view
}

fn expired(id: &str, held: &Value) -> (Value, Flow) {
    eprintln!("threadgate-agent-runner: held call {id} expired without a decision");
    (
        json!({
            "status": "expired",
            "execution_id": id,
            "approval_url": held["approval_url"],
            "note": "No one decided on this call in time; it did not run. The thread is left to a person.",
        }),
        Flow::Expired,
    )
}
