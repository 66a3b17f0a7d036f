//! The one internal message type both adapters convert to and from. It holds what a
//! tool-using chat needs and nothing provider-specific.

use serde_json::Value;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result, answering the assistant's call `tool_call_id`.
    Tool,
}

impl Role {
    /// The OpenAI name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A call the model asks for. `arguments` is the upstream's text, possibly invalid JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    /// The text (empty when an assistant message only calls tools).
    pub content: String,
    /// The assistant's tool calls.
    pub tool_calls: Vec<ToolCall>,
    /// For [`Role::Tool`]: the call this answers.
    pub tool_call_id: Option<String>,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments.
    pub parameters: Value,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

/// One model call.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The model forwarded upstream (set by the proxy to the agent's model).
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    pub tool_choice: Option<ToolChoice>,
    pub max_tokens: Option<u32>,
}

/// Tokens the upstream reports for one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Usage {
    /// Both together: what the budget counts.
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// The model's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatAnswer {
    pub id: String,
    /// The model the upstream says answered.
    pub model: String,
    /// Always [`Role::Assistant`].
    pub message: Message,
    /// OpenAI's names: `stop`, `tool_calls`, `length`.
    pub finish_reason: String,
    pub usage: Usage,
}
