//! The scripted server's side of both wire formats: it reads Anthropic requests and
//! writes answers in either format.

use serde_json::{Value, json};

use super::MODEL_LABEL;
use super::scenarios::offered;
use super::step::{LABEL, Step};
use crate::model::types::{ChatRequest, Message, Role, ToolCall, ToolDef};

/// A rough count: four bytes of request per token.
pub(super) fn estimate_tokens(body: &Value) -> u64 {
    (body.to_string().len() as u64 / 4).max(1)
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// Reads an Anthropic Messages request into the internal type.
pub(super) fn parse_anthropic_request(v: &Value) -> Result<ChatRequest, String> {
    let mut messages = Vec::new();
    if let Some(system) = v.get("system") {
        messages.push(Message {
            role: Role::System,
            content: text_of(system),
            tool_calls: vec![],
            tool_call_id: None,
        });
    }
    for m in v["messages"]
        .as_array()
        .ok_or("messages must be an array")?
    {
        let role = match m["role"].as_str() {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            _ => return Err("role must be user or assistant".into()),
        };
        let blocks = match &m["content"] {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(b) => b.clone(),
            _ => return Err("content must be a string or blocks".into()),
        };
        let mut msg = Message {
            role,
            content: String::new(),
            tool_calls: vec![],
            tool_call_id: None,
        };
        for b in blocks {
            let field = |key: &str| b.get(key).unwrap_or(&Value::Null);
            match field("type").as_str() {
                Some("text") => msg
                    .content
                    .push_str(field("text").as_str().unwrap_or_default()),
                Some("tool_use") => msg.tool_calls.push(ToolCall {
                    id: field("id").as_str().unwrap_or_default().to_owned(),
                    name: field("name").as_str().unwrap_or_default().to_owned(),
                    arguments: field("input").to_string(),
                }),
                Some("tool_result") => messages.push(Message {
                    role: Role::Tool,
                    content: text_of(field("content")),
                    tool_calls: vec![],
                    tool_call_id: field("tool_use_id").as_str().map(str::to_owned),
                }),
                _ => return Err("unknown content block".into()),
            }
        }
        if !msg.content.is_empty() || !msg.tool_calls.is_empty() {
            messages.push(msg);
        }
    }
    if v["max_tokens"].as_u64().is_none() {
        return Err("max_tokens is required".into());
    }
    let tools = v["tools"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| ToolDef {
                    name: t["name"].as_str().unwrap_or_default().to_owned(),
                    description: t["description"].as_str().unwrap_or_default().to_owned(),
                    parameters: t["input_schema"].clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(ChatRequest {
        model: v["model"].as_str().unwrap_or_default().to_owned(),
        messages,
        tools,
        tool_choice: None,
        max_tokens: v["max_tokens"]
            .as_u64()
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
    })
}

fn call_id(request: &ChatRequest) -> String {
    format!("call_scripted_{}", request.messages.len())
}

/// An OpenAI `chat.completion` for `step`.
pub(super) fn openai_answer(request: &ChatRequest, step: &Step, prompt_tokens: u64) -> Value {
    let (message, finish, completion) = match step {
        Step::Call {
            text,
            tool,
            arguments,
        } => (
            json!({
                "role": "assistant",
                "content": format!("{LABEL} {text}"),
                "tool_calls": [{"id": call_id(request), "type": "function", "function": {"name": offered(request, tool), "arguments": arguments}}],
            }),
            "tool_calls",
            (text.len() + arguments.len()) as u64 / 4 + 5,
        ),
        Step::Say(text) => (
            json!({"role": "assistant", "content": format!("{LABEL} {text}")}),
            "stop",
            text.len() as u64 / 4 + 5,
        ),
        _ => (json!({"role": "assistant", "content": LABEL}), "stop", 5),
    };
    json!({
        "id": format!("chatcmpl-scripted-{}", request.messages.len()),
        "object": "chat.completion",
        "created": chrono::Utc::now().timestamp(),
        "model": MODEL_LABEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion},
    })
}

/// An Anthropic `message` for `step`.
pub(super) fn anthropic_answer(request: &ChatRequest, step: &Step, prompt_tokens: u64) -> Value {
    let (content, stop, completion) = match step {
        Step::Call {
            text,
            tool,
            arguments,
        } => {
            // Anthropic's input is an object; invalid arguments travel as text in one.
            let input = serde_json::from_str::<Value>(arguments)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({"_invalid_arguments": arguments}));
            (
                json!([{"type": "text", "text": format!("{LABEL} {text}")}, {"type": "tool_use", "id": call_id(request), "name": offered(request, tool), "input": input}]),
                "tool_use",
                (text.len() + arguments.len()) as u64 / 4 + 5,
            )
        }
        Step::Say(text) => (
            json!([{"type": "text", "text": format!("{LABEL} {text}")}]),
            "end_turn",
            text.len() as u64 / 4 + 5,
        ),
        _ => (json!([{"type": "text", "text": LABEL}]), "end_turn", 5),
    };
    json!({
        "id": format!("msg_scripted_{}", request.messages.len()),
        "type": "message",
        "role": "assistant",
        "model": MODEL_LABEL,
        "content": content,
        "stop_reason": stop,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": completion},
    })
}
