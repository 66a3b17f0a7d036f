//! A gateway call from the model: `POST /v1/calls`, and when the policy holds it, the
//! wait for the person's decision within the approval's ttl.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use threadgate_api::{CallAnswer, CallRequest, ExecutionStatus, ExecutionView, Held};

use crate::api::{Api, Reply};

/// How long past the approval's expiry the runner keeps asking, for the server's clock.
const EXPIRY_GRACE: Duration = Duration::from_secs(30);
/// How long the runner waits for a held call whose expiry it does not know.
const UNKNOWN_TTL: Duration = Duration::from_secs(24 * 3600);

/// What a gateway call means for the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Feed the result to the model and go on.
    Continue,
    /// The customer got a reply, or the thread went to an engineer: the turn is over.
    Done,
    /// A held call expired without a decision: leave the thread to a person.
    Expired,
}

/// The gateway's first answer to a call.
#[derive(Debug)]
pub(crate) enum Submitted {
    /// The tool message's content and what comes next.
    Final(Value, Flow),
    /// Held for a person: the 202 answer, to wait on with [`wait_held`].
    Held(Held),
}

/// Calls catalog tool `tool` and, when it is held, waits for the decision.
pub(crate) async fn call(
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
pub(crate) async fn submit(
    api: &Api,
    tool: &str,
    args: Value,
    diagnosis: Option<String>,
    findings: Option<&Path>,
) -> Submitted {
    let request = CallRequest {
        tool: tool.to_owned(),
        args,
        diagnosis,
    };
    let reply = match api.post("/v1/calls", &request).await {
        Ok(r) => r,
        Err(e) => {
            return Submitted::Final(
                json!({"status": "error", "error": format!("the gateway did not answer: {e:#}")}),
                Flow::Continue,
            );
        }
    };
    let answer = reply.read::<CallAnswer>().ok();
    log(tool, answer.as_ref());
    if let Some(CallAnswer::PendingApproval(held)) = answer.as_ref()
        && reply.status == 202
    {
        if let Some(file) = findings {
            record_hold(file, &request, held);
        }
        return Submitted::Held(held.clone());
    }
    let done = reply.status == 200 && ends_turn(tool);
    Submitted::Final(
        for_model(&reply, answer.as_ref()),
        if done { Flow::Done } else { Flow::Continue },
    )
}

/// The most the findings file grows to.
const FINDINGS_CAP: u64 = 256 * 1024;

/// Appends a held call, its arguments and the diagnosis to the findings file.
fn record_hold(file: &Path, request: &CallRequest, held: &Held) {
    use std::io::Write;
    let entry = format!(
        "## `{}` held for a person\n\nExecution: {}\nApproval: {}\nArguments: `{}`\n\n{}\n\n",
        request.tool,
        held.execution_id,
        held.approval_url,
        request.args,
        request
            .diagnosis
            .as_deref()
            .unwrap_or("(no diagnosis given)"),
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

fn log(tool: &str, answer: Option<&CallAnswer>) {
    let status = answer.map_or("?", CallAnswer::status);
    let id = answer.and_then(CallAnswer::execution_id).unwrap_or("-");
    eprintln!("threadgate-agent-runner: gateway call {tool}: {status} (execution {id})");
}

/// Whether a successful call of `tool` ends the agent's turn.
fn ends_turn(tool: &str) -> bool {
    matches!(
        tool,
        "helpdesk.reply_to_thread" | "helpdesk.escalate_to_engineer"
    )
}

/// The gateway's answer as the model sees it: its body as sent, with the HTTP status
/// added when the body does not say it, and what to do about a blocked call.
fn for_model(reply: &Reply, answer: Option<&CallAnswer>) -> Value {
    let mut body = reply.body.clone();
    if let Some(map) = body.as_object_mut() {
        map.entry("http_status").or_insert(json!(reply.status));
        if reply.status == 403 && matches!(answer, Some(CallAnswer::Blocked(_))) {
            map.insert(
                "note".into(),
                json!("The policy blocks this call: do not retry it; tell the customer what a person will do instead."),
            );
        }
    }
    body
}

/// Waits for the decision on a held call, until its expiry (plus a grace period).
pub(crate) async fn wait_held(api: &Api, tool: &str, held: &Held) -> (Value, Flow) {
    let id = held.execution_id.as_str();
    let ttl = held
        .expires_at
        .as_deref()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| {
            let left = t.timestamp_millis() - chrono::Utc::now().timestamp_millis();
            Duration::from_millis(u64::try_from(left).unwrap_or(0))
        })
        .unwrap_or(UNKNOWN_TTL);
    let deadline = tokio::time::Instant::now() + ttl + EXPIRY_GRACE;
    let path = format!("/v1/executions/{id}/wait?timeout=60");
    eprintln!("threadgate-agent-runner: {tool} is held for a person (execution {id}); waiting");
    loop {
        if tokio::time::Instant::now() >= deadline {
            return expired(held);
        }
        let reply = match api.get(&path).await {
            Ok(r) if r.ok() => r,
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
        let view = match reply.read::<ExecutionView>() {
            Ok(view) => view,
            Err(e) => {
                eprintln!("threadgate-agent-runner: waiting on {id}: {e:#}");
                return (noted(&reply.body, "The call did not run."), Flow::Continue);
            }
        };
        match view.status {
            ExecutionStatus::PendingApproval | ExecutionStatus::Running => continue,
            ExecutionStatus::Expired => return expired(held),
            ExecutionStatus::Ok => {
                let flow = if ends_turn(tool) {
                    Flow::Done
                } else {
                    Flow::Continue
                };
                return (noted(&view, "A person approved this call; it ran."), flow);
            }
            ExecutionStatus::Denied => {
                return (
                    noted(
                        &view,
                        "A person denied this call. Read their message and tell the customer what happens next; do not retry it.",
                    ),
                    Flow::Continue,
                );
            }
            ExecutionStatus::Failed | ExecutionStatus::NeedsCheck | ExecutionStatus::Blocked => {
                return (noted(&view, "The call did not run."), Flow::Continue);
            }
        }
    }
}

/// An answer for the model with a `note` on what to make of it.
#[derive(Serialize)]
struct Noted<'a, T> {
    #[serde(flatten)]
    answer: &'a T,
    note: &'a str,
}

fn noted<T: Serialize>(answer: &T, note: &str) -> Value {
    serde_json::to_value(Noted { answer, note })
        .unwrap_or_else(|e| json!({"status": "error", "error": format!("{e}"), "note": note}))
}

fn expired(held: &Held) -> (Value, Flow) {
    let id = &held.execution_id;
    eprintln!("threadgate-agent-runner: held call {id} expired without a decision");
    (
        json!({
            "status": "expired",
            "execution_id": id,
            "approval_url": held.approval_url,
            "note": "No one decided on this call in time; it did not run. The thread is left to a person.",
        }),
        Flow::Expired,
    )
}
