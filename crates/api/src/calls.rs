//! `POST /v1/calls`: a gated tool call and the gate's answers (the MCP tools answer
//! with the same bodies).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::ErrorBody;

/// A tool call as the agent sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    /// The arguments (an object); `{}` when absent.
    #[serde(default = "empty_object")]
    pub args: Value,
    /// What the agent found and why it makes the call, for the person who approves it.
    #[serde(default)]
    pub diagnosis: Option<String>,
    /// The catalog name.
    pub tool: String,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// The gate's answer, tagged by `status`: 200 `ok`, 502 `failed`, 202
/// `pending_approval`, 403 `blocked`, or a refusal (`error`, with the status of
/// [`ErrorBody`]'s code).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CallAnswer {
    /// It ran (or an identical call had already succeeded: `replayed`).
    Ok(Ran),
    /// It was sent and failed.
    Failed(Failed),
    /// Held for a person.
    PendingApproval(Held),
    /// The policy blocks it.
    Blocked(Blocked),
    /// Refused before anything was decided.
    Error(ErrorBody),
}

/// A call that ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ran {
    pub execution_id: String,
    #[serde(default)]
    pub replayed: bool,
    /// The connector's result.
    #[serde(default)]
    pub result: Value,
}

/// A call that was sent and failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failed {
    #[serde(default)]
    pub error: String,
    pub execution_id: String,
    /// When the provider said to try again, in milliseconds.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
}

/// A call held for a person's approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// What the person is asked to approve, in one line.
    #[serde(default)]
    pub approval_summary: Option<String>,
    /// The approval page.
    pub approval_url: String,
    pub execution_id: String,
    /// When the approval runs out (RFC 3339), if it does.
    #[serde(default)]
    pub expires_at: Option<String>,
}

/// A call the policy blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocked {
    pub execution_id: String,
    /// The rule that blocked it (the policy file's name and line).
    pub rule: String,
}

impl CallAnswer {
    /// The execution id, when the call got one.
    pub fn execution_id(&self) -> Option<&str> {
        match self {
            CallAnswer::Ok(r) => Some(&r.execution_id),
            CallAnswer::Failed(f) => Some(&f.execution_id),
            CallAnswer::PendingApproval(h) => Some(&h.execution_id),
            CallAnswer::Blocked(b) => Some(&b.execution_id),
            CallAnswer::Error(_) => None,
        }
    }

    /// The `status` tag.
    pub fn status(&self) -> &'static str {
        match self {
            CallAnswer::Ok(_) => "ok",
            CallAnswer::Failed(_) => "failed",
            CallAnswer::PendingApproval(_) => "pending_approval",
            CallAnswer::Blocked(_) => "blocked",
            CallAnswer::Error(_) => "error",
        }
    }
}
