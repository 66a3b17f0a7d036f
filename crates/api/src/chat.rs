//! The model proxy's shapes the runner uses (`POST /v1/model/chat/completions`, the
//! OpenAI chat format) and the conversation it saves (`GET`/`PUT /v1/transcript`).
//!
//! Only what the runner sends and reads is here: the proxy accepts and answers more
//! of the format (it is OpenAI-compatible for harnesses), which stays the proxy's.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// The text; `null` for an assistant message that only calls tools.
    #[serde(default)]
    pub content: Option<String>,
    pub role: Role,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tools an assistant message calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

impl ChatMessage {
    /// A message of `role` with `content` and nothing else.
    pub fn text(role: Role, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            content: Some(content.into()),
            role,
            tool_call_id: None,
            tool_calls: Vec::new(),
        }
    }

    /// The answer to tool call `call_id`.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            tool_call_id: Some(call_id.into()),
            ..ChatMessage::text(Role::Tool, content)
        }
    }
}

/// A tool call of an assistant message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub function: FunctionCall,
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
}

fn function_kind() -> String {
    "function".to_owned()
}

/// The function a tool call names, with its arguments as the model wrote them (JSON
/// text, possibly not valid).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    #[serde(default)]
    pub arguments: String,
    pub name: String,
}

/// What the runner asks the model proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub max_tokens: u64,
    pub messages: Vec<ChatMessage>,
    /// The agent's model; absent, the proxy uses the agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `auto`, `none` or `required`.
    pub tool_choice: String,
    /// OpenAI function tools (JSON schemas, built by the runner).
    #[serde(default)]
    pub tools: Vec<Value>,
}

/// The part of the proxy's `chat.completion` answer the runner reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatAnswer {
    pub choices: Vec<ChatChoice>,
}

/// One choice of an answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatChoice {
    pub message: ChatMessage,
}

/// The saved conversation: its messages and how many feed events it has taken in.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Transcript {
    #[serde(default)]
    pub events_consumed: i64,
    #[serde(default)]
    pub messages: Vec<ChatMessage>,
}
