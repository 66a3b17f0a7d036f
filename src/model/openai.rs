//! The OpenAI chat-completions wire format: the socket's own format (what the runner
//! sends and reads) and the `openai`/`scripted` upstreams'.

use serde_json::{Map, Value, json};

use super::types::{ChatAnswer, ChatRequest, Message, Role, ToolCall, ToolChoice, ToolDef, Usage};

/// Reads a chat-completions request (from the runner). The model is left as given
/// (empty when omitted); the proxy checks it.
pub fn parse_request(body: &Value) -> Result<ChatRequest, String> {
    let obj = body.as_object().ok_or("the body must be a JSON object")?;
    if obj.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err("stream: true is not supported; ask without streaming".into());
    }
    let model = match obj.get("model") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err("model must be a string".into()),
    };
    let raw = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("messages must be an array")?;
    let messages = raw
        .iter()
        .enumerate()
        .map(|(i, m)| parse_message(m).map_err(|e| format!("messages[{i}]: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(tools)) => tools
            .iter()
            .enumerate()
            .map(|(i, t)| parse_tool(t).map_err(|e| format!("tools[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("tools must be an array".into()),
    };
    let tool_choice = match obj.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "auto" => Some(ToolChoice::Auto),
        Some(Value::String(s)) if s == "none" => Some(ToolChoice::None),
        Some(Value::String(s)) if s == "required" => Some(ToolChoice::Required),
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) => Some(ToolChoice::Named(name.to_owned())),
            None => return Err("tool_choice must be auto, none, required or a function".into()),
        },
    };
    let max_tokens = match obj.get("max_tokens").or(obj.get("max_completion_tokens")) {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or("max_tokens must be a positive integer")?,
        ),
    };
    Ok(ChatRequest {
        model,
        messages,
        tools,
        tool_choice,
        max_tokens,
    })
}

/// [`parse_request`] of a body the caller gives up: the tools' schemas, which can be
/// most of a request, are moved into the request rather than copied.
pub fn take_request(mut body: Value) -> Result<ChatRequest, String> {
    let schemas: Vec<Value> = match body.get_mut("tools").and_then(Value::as_array_mut) {
        Some(tools) => tools
            .iter_mut()
            .map(|t| {
                t.pointer_mut("/function/parameters")
                    .map(Value::take)
                    .unwrap_or_default()
            })
            .collect(),
        None => Vec::new(),
    };
    let mut request = parse_request(&body)?;
    drop(body);
    for (tool, schema) in request.tools.iter_mut().zip(schemas) {
        if !schema.is_null() {
            tool.parameters = schema;
        }
    }
    Ok(request)
}

/// Text content: a string, null, or an array of `{"type":"text","text":...}` parts.
fn content_text(v: Option<&Value>) -> Result<String, String> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => return Err("only text content parts are supported".into()),
                }
            }
            Ok(out)
        }
        Some(_) => Err("content must be a string or text parts".into()),
    }
}

fn parse_message(m: &Value) -> Result<Message, String> {
    let role = match m["role"].as_str() {
        Some("system") | Some("developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        _ => return Err("role must be system, user, assistant or tool".into()),
    };
    let content = content_text(m.get("content"))?;
    let tool_calls = match m.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .map(parse_tool_call)
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("tool_calls must be an array".into()),
    };
    let tool_call_id = m["tool_call_id"].as_str().map(str::to_owned);
    if role == Role::Tool && tool_call_id.is_none() {
        return Err("a tool message needs tool_call_id".into());
    }
    Ok(Message {
        role,
        content,
        tool_calls,
        tool_call_id,
    })
}

fn parse_tool_call(c: &Value) -> Result<ToolCall, String> {
    let id = c["id"].as_str().ok_or("a tool call needs an id")?;
    let name = c
        .pointer("/function/name")
        .and_then(Value::as_str)
        .ok_or("a tool call needs function.name")?;
    let arguments = match c.pointer("/function/arguments") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    };
    Ok(ToolCall {
        id: id.to_owned(),
        name: name.to_owned(),
        arguments,
    })
}

fn parse_tool(t: &Value) -> Result<ToolDef, String> {
    if t["type"].as_str().unwrap_or("function") != "function" {
        return Err("only function tools are supported".into());
    }
    let f = &t["function"];
    let name = f["name"].as_str().ok_or("a tool needs function.name")?;
    Ok(ToolDef {
        name: name.to_owned(),
        description: f["description"].as_str().unwrap_or_default().to_owned(),
        parameters: match &f["parameters"] {
            Value::Null => json!({"type": "object", "properties": {}}),
            p => p.clone(),
        },
    })
}

/// One message in the OpenAI format.
pub fn message_to_wire(m: &Message) -> Value {
    let mut out = Map::new();
    out.insert("role".into(), json!(m.role.as_str()));
    let content = if m.content.is_empty() && !m.tool_calls.is_empty() {
        Value::Null
    } else {
        json!(m.content)
    };
    out.insert("content".into(), content);
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), json!(id));
    }
    Value::Object(out)
}

/// The request sent to an OpenAI-compatible upstream.
pub fn request_to_wire(r: &ChatRequest) -> Value {
    let mut out = json!({
        "model": r.model,
        "messages": r.messages.iter().map(message_to_wire).collect::<Vec<_>>(),
        "stream": false,
    });
    if !r.tools.is_empty() {
        let tools: Value = r
            .tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
            .collect();
        if let Some(fields) = out.as_object_mut() {
            fields.insert("tools".into(), tools);
        }
    }
    if let Some(choice) = &r.tool_choice {
        let tool_choice = match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Named(n) => json!({"type": "function", "function": {"name": n}}),
        };
        if let Some(fields) = out.as_object_mut() {
            fields.insert("tool_choice".into(), tool_choice);
        }
    }
    if let Some(n) = r.max_tokens
        && let Some(fields) = out.as_object_mut()
    {
        fields.insert("max_tokens".into(), json!(n));
    }
    out
}

/// Reads an upstream's `chat.completion`; anything else is malformed.
pub fn parse_answer(v: &Value) -> Result<ChatAnswer, String> {
    let choice = v
        .pointer("/choices/0")
        .ok_or("the answer has no choices[0]")?;
    let m = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or("choices[0] has no message")?;
    let mut message = parse_message(m).map_err(|e| format!("choices[0].message: {e}"))?;
    if message.role != Role::Assistant {
        return Err("choices[0].message is not the assistant's".into());
    }
    message.tool_call_id = None;
    let usage = v.get("usage").ok_or("the answer has no usage")?;
    let count = |k: &str| {
        usage[k]
            .as_u64()
            .ok_or_else(|| format!("usage.{k} is not a count"))
    };
    Ok(ChatAnswer {
        id: v["id"].as_str().unwrap_or("chatcmpl").to_owned(),
        model: v["model"].as_str().unwrap_or_default().to_owned(),
        finish_reason: choice["finish_reason"]
            .as_str()
            .unwrap_or(if message.tool_calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            })
            .to_owned(),
        message,
        usage: Usage {
            prompt_tokens: count("prompt_tokens")?,
            completion_tokens: count("completion_tokens")?,
        },
    })
}

/// The `chat.completion` object the socket answers with.
pub fn answer_to_wire(a: &ChatAnswer, created: i64) -> Value {
    json!({
        "id": a.id,
        "object": "chat.completion",
        "created": created,
        "model": a.model,
        "choices": [{
            "index": 0,
            "message": message_to_wire(&a.message),
            "finish_reason": a.finish_reason,
        }],
        "usage": {
            "prompt_tokens": a.usage.prompt_tokens,
            "completion_tokens": a.usage.completion_tokens,
            "total_tokens": a.usage.total(),
        },
    })
}
