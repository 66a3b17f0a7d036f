//! The gateway's tools as MCP tool definitions: JSON input schemas from the catalog's
//! arguments with the descriptions and values `GET /v1/tools` gives (one source,
//! `gateway::tool_docs`), annotations from its risk classes, and threadgate's own
//! `threadgate_wait`.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Map, Value, json};

use crate::gateway::tool_docs;
use crate::policy::{Risk, ToolSpec};

/// The tool that waits on a held call's execution.
pub const WAIT_TOOL: &str = "threadgate_wait";

/// The optional argument every gateway tool takes: what the agent found and why it
/// makes the call, shown to the person who approves a held call.
pub const DIAGNOSIS: &str = "diagnosis";

/// The MCP definition of catalog tool `spec`: its description as `GET /v1/tools`
/// gives it, then [`gate_note`]; each argument's schema with its description and
/// values from the same source.
pub fn gateway_tool(spec: &ToolSpec) -> Tool {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for arg in spec.args {
        properties.insert(arg.name.to_owned(), tool_docs::arg_schema(spec, arg));
        if arg.required {
            required.push(arg.name);
        }
    }
    properties.insert(
        DIAGNOSIS.into(),
        json!({"type": "string", "description": tool_docs::DIAGNOSIS_DESCRIPTION}),
    );
    let schema = json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    });
    let description = match tool_docs::tool_description(spec.name) {
        Some(own) => format!("{own} {}", gate_note(spec)),
        None => gate_note(spec),
    };
    Tool::new(spec.name, description, Arc::new(object(schema))).with_annotations(annotations(spec))
}

/// What follows a tool's own description: its risk and how the gate answers (the
/// built-in runner says the same after the same description).
pub fn gate_note(spec: &ToolSpec) -> String {
    format!(
        "Gateway tool `{}` (risk: {}). threadgate's policy decides each call: it runs, is held \
         for a person (the result says pending_approval; then call {WAIT_TOOL}), or is blocked.",
        spec.name, spec.risk
    )
}

/// Annotations from the risk class: reads are read-only; money and account changes
/// (Stripe writes, and every destructive call) are destructive; every tool reaches an
/// outside system.
pub fn annotations(spec: &ToolSpec) -> ToolAnnotations {
    let read = spec.risk == Risk::Read;
    let destructive = spec.risk == Risk::Destructive
        || (spec.risk == Risk::Write && spec.connector() == "stripe");
    ToolAnnotations::new()
        .read_only(read)
        .destructive(destructive)
        .idempotent(read)
        .open_world(true)
}

/// The definition of [`WAIT_TOOL`], whose `timeout_seconds` defaults to
/// `default_wait_seconds`.
pub fn wait_tool(default_wait_seconds: u64) -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "execution_id": {"type": "string", "description": "The execution id of a held call (from its pending_approval result)."},
            "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": super::MAX_WAIT_SECONDS,
                "description": format!("How long to wait at most (default {default_wait_seconds}); never past the approval's expiry. While it waits, a progress notification goes to a request that carries a progressToken.")},
        },
        "required": ["execution_id"],
        "additionalProperties": false,
    });
    Tool::new(
        WAIT_TOOL,
        "Waits for a held call's decision: returns the call's real result once a person \
         approved it and it ran, the denial with the person's message, or that the approval \
         expired. Still pending at the timeout: call again.",
        Arc::new(object(schema)),
    )
    .with_annotations(
        ToolAnnotations::new()
            .read_only(true)
            .destructive(false)
            .idempotent(true)
            .open_world(false),
    )
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}
