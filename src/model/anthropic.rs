//! The Anthropic Messages wire format: system prompts lifted into `system`, tool calls
//! as `tool_use` blocks, tool results as `tool_result` blocks in a user turn, and turns
//! merged so roles alternate.

use serde_json::{Value, json};

use super::types::{ChatAnswer, ChatRequest, Message, Role, ToolCall, ToolChoice, Usage};

/// A tool call's arguments as Anthropic's `input` object. Invalid JSON (the model's
/// own earlier output) is kept as text under `_invalid_arguments` rather than dropped.
fn input_of(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ if arguments.trim().is_empty() => json!({}),
        _ => json!({"_invalid_arguments": arguments}),
    }
}

fn blocks_of(m: &Message) -> Vec<Value> {
    let mut blocks = Vec::new();
    match m.role {
        Role::Tool => blocks.push(json!({
            "type": "tool_result",
            "tool_use_id": m.tool_call_id.clone().unwrap_or_default(),
            "content": m.content,
        })),
        _ => {
            if !m.content.is_empty() {
                blocks.push(json!({"type": "text", "text": m.content}));
            }
            for c in &m.tool_calls {
                blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input_of(&c.arguments)}));
            }
        }
    }
    blocks
}

/// The request sent to Anthropic; `default_max_tokens` when the runner gave none.
pub fn request_to_wire(r: &ChatRequest, default_max_tokens: u32) -> Value {
    let system: Vec<&str> = r
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| m.content.as_str())
        .collect();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for m in r.messages.iter().filter(|m| m.role != Role::System) {
        let role = if m.role == Role::Assistant {
            "assistant"
        } else {
            "user"
        };
        let blocks = blocks_of(m);
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let mut out = json!({
        "model": r.model,
        "max_tokens": r.max_tokens.unwrap_or(default_max_tokens),
        "messages": messages,
    });
    if !system.is_empty()
        && let Some(fields) = out.as_object_mut()
    {
        fields.insert("system".into(), json!(system.join("\n\n")));
    }
    if !r.tools.is_empty() {
        let tools: Value = r
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
        if let Some(fields) = out.as_object_mut() {
            fields.insert("tools".into(), tools);
        }
    }
    if let Some(choice) = &r.tool_choice {
        let tool_choice = match choice {
            ToolChoice::Auto => json!({"type": "auto"}),
            ToolChoice::None => json!({"type": "none"}),
            ToolChoice::Required => json!({"type": "any"}),
            ToolChoice::Named(n) => json!({"type": "tool", "name": n}),
        };
        if let Some(fields) = out.as_object_mut() {
            fields.insert("tool_choice".into(), tool_choice);
        }
    }
    out
}

/// Reads a Messages answer; anything else is malformed.
pub fn parse_answer(v: &Value) -> Result<ChatAnswer, String> {
    if v["type"].as_str() != Some("message") {
        return Err("the answer is not a message".into());
    }
    let blocks = v["content"]
        .as_array()
        .ok_or("the answer has no content array")?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => text.push_str(b["text"].as_str().ok_or("a text block without text")?),
            Some("tool_use") => tool_calls.push(ToolCall {
                id: b["id"]
                    .as_str()
                    .ok_or("a tool_use block without id")?
                    .to_owned(),
                name: b["name"]
                    .as_str()
                    .ok_or("a tool_use block without name")?
                    .to_owned(),
                arguments: b.get("input").map(Value::to_string).unwrap_or_default(),
            }),
            // Thinking and other blocks carry nothing the runner uses.
            Some(_) => {}
            None => return Err("a content block without type".into()),
        }
    }
    let finish_reason = match v["stop_reason"].as_str() {
        Some("tool_use") => "tool_calls",
        Some("max_tokens") => "length",
        _ if !tool_calls.is_empty() => "tool_calls",
        _ => "stop",
    };
    let usage = v.get("usage").ok_or("the answer has no usage")?;
    let count = |k: &str| {
        usage[k]
            .as_u64()
            .ok_or_else(|| format!("usage.{k} is not a count"))
    };
    Ok(ChatAnswer {
        id: v["id"].as_str().unwrap_or("msg").to_owned(),
        model: v["model"].as_str().unwrap_or_default().to_owned(),
        message: Message {
            role: Role::Assistant,
            content: text,
            tool_calls,
            tool_call_id: None,
        },
        finish_reason: finish_reason.to_owned(),
        usage: Usage {
            prompt_tokens: count("input_tokens")?,
            completion_tokens: count("output_tokens")?,
        },
    })
}
