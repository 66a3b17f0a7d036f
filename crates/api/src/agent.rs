//! `GET /v1/agent`: the session's agent definition as the runner needs it.

use serde::{Deserialize, Serialize};

/// The session's agent: model, limits, instructions, granted tool patterns, its
/// playbooks, and the harness it runs when it names one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentView {
    #[serde(default)]
    pub description: String,
    /// A team's own harness instead of the built-in loop; `null` for the loop.
    #[serde(default)]
    pub harness: Option<HarnessView>,
    /// The standing instructions (Markdown).
    #[serde(default)]
    pub instructions: String,
    /// Absent only from servers older than the limits.
    #[serde(default)]
    pub limits: Option<AgentLimits>,
    #[serde(default)]
    pub model: Option<String>,
    pub name: String,
    #[serde(default)]
    pub session_id: String,
    #[serde(default)]
    pub skills: Vec<SkillView>,
    /// The Plain thread the session works.
    #[serde(default)]
    pub thread_id: String,
    /// The tool patterns the agent is granted.
    #[serde(default)]
    pub tools: Vec<String>,
}

/// The agent's token budget and turn cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentLimits {
    /// Prompt and completion tokens over the session.
    pub max_tokens: u64,
    /// Model calls over the session.
    pub max_turns: u64,
}

/// A playbook of the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillView {
    /// The playbook (Markdown). Older servers sent it as `text`.
    #[serde(alias = "text", default)]
    pub body: String,
    #[serde(default)]
    pub description: String,
    pub name: String,
}

/// The harness command and the bridge's port on the container's loopback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HarnessView {
    /// The program and its arguments.
    pub command: Vec<String>,
    pub port: u16,
}
