//! The gateway's tools as MCP tool definitions: JSON input schemas from the catalog's
//! arguments, annotations from its risk classes, and threadgate's own
//! `threadgate_wait`.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Map, Value, json};

use crate::policy::{ArgType, Risk, ToolSpec};

/// The tool that waits on a held call's execution.
pub const WAIT_TOOL: &str = "threadgate_wait";

/// The optional argument every gateway tool takes: what the agent found and why it
/// makes the call, shown to the person who approves a held call.
pub const DIAGNOSIS: &str = "diagnosis";

/// The MCP definition of catalog tool `spec`.
pub fn gateway_tool(spec: &ToolSpec) -> Tool {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for arg in spec.args {
        let mut schema = schema_of(arg.ty);
        if arg.filled_by_gateway {
            schema["description"] = json!("Filled in by threadgate from the session; optional.");
        }
        properties.insert(arg.name.to_owned(), schema);
        if arg.required {
            required.push(arg.name);
        }
    }
    properties.insert(
        DIAGNOSIS.into(),
        json!({"type": "string", "description":
            "What you found and why you make this call, with the evidence. A person reads it if the call is held for approval."}),
    );
    let schema = json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    });
    let description = format!(
        "Gateway tool `{}` (risk: {}). threadgate's policy decides each call: it runs, is held \
         for a person (the result says pending_approval; then call {WAIT_TOOL}), or is blocked.",
        spec.name, spec.risk
    );
    Tool::new(spec.name, description, Arc::new(object(schema))).with_annotations(annotations(spec))
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

/// The definition of [`WAIT_TOOL`].
pub fn wait_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "execution_id": {"type": "string", "description": "The execution id of a held call (from its pending_approval result)."},
            "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": super::MAX_WAIT_SECONDS,
                "description": "How long to wait at most (default 60); never past the approval's expiry."},
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

fn schema_of(ty: ArgType) -> Value {
    match ty {
        ArgType::String => json!({"type": "string"}),
        ArgType::Integer => json!({"type": "integer"}),
        ArgType::Boolean => json!({"type": "boolean"}),
        ArgType::StringArray => json!({"type": "array", "items": {"type": "string"}}),
    }
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}
