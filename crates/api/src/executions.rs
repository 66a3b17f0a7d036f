//! `GET /v1/executions/{id}` and its long poll `.../wait`: what the agent sees of an
//! execution (the MCP `threadgate_wait` answers the same).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An execution as the agent sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionView {
    /// Why it failed, when it did.
    #[serde(default)]
    pub error: Option<String>,
    pub execution_id: String,
    /// When its approval runs out (RFC 3339), if it does.
    #[serde(default)]
    pub expires_at: Option<String>,
    /// The person's message with their decision.
    #[serde(default)]
    pub message: Option<String>,
    /// The connector's result once it ran; `null` before.
    #[serde(default)]
    pub result: Value,
    /// Who decided.
    #[serde(default)]
    pub reviewer: Option<String>,
    pub status: ExecutionStatus,
    /// The catalog name.
    pub tool: String,
}

/// Where an execution stands, as the agent is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    /// It ran.
    Ok,
    /// Held, or approved and not yet running.
    PendingApproval,
    Running,
    Failed,
    /// Its outcome is unknown; a person checks before anything is sent again.
    NeedsCheck,
    Denied,
    Expired,
    Blocked,
}

impl ExecutionStatus {
    /// Whether nothing will change it any more.
    pub fn is_final(self) -> bool {
        !matches!(
            self,
            ExecutionStatus::PendingApproval | ExecutionStatus::Running
        )
    }
}
