//! The gateway's tools (from `GET /v1/tools`) as OpenAI function tools, and back.
//!
//! OpenAI and Anthropic allow only `[a-zA-Z0-9_-]` in a function's name, so the
//! catalog's `stripe.create_refund` is offered as `stripe__create_refund`. Every gateway
//! tool also takes an optional `diagnosis` argument: the runner strips it from the
//! arguments and sends it with the call, for the person who approves a held call.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use threadgate_api::ToolListing;

/// The argument the runner adds to every gateway tool.
pub(crate) const DIAGNOSIS: &str = "diagnosis";

/// The gateway tools the session may call, by their function name.
#[derive(Debug, Default, Clone)]
pub(crate) struct GatewayTools {
    /// function name → catalog name
    names: BTreeMap<String, String>,
    definitions: Vec<Value>,
}

/// A catalog name as a function name.
pub(crate) fn function_name(tool: &str) -> String {
    tool.replace('.', "__")
}

impl GatewayTools {
    /// The function tools of `GET /v1/tools`'s listing (descriptions and enums as it
    /// gives them).
    pub(crate) fn from_listing(listing: &ToolListing) -> GatewayTools {
        let mut tools = GatewayTools::default();
        for tool in &listing.tools {
            let mut properties = Map::new();
            let mut required = Vec::new();
            for arg in &tool.args {
                let mut schema = schema_of(&arg.ty);
                if let Some(d) = &arg.description {
                    schema.insert("description".into(), json!(d));
                }
                if let Some(values) = &arg.values {
                    schema.insert("enum".into(), json!(values));
                }
                properties.insert(arg.name.clone(), Value::Object(schema));
                if arg.required {
                    required.push(arg.name.clone());
                }
            }
            properties.insert(
                DIAGNOSIS.into(),
                json!({"type": "string", "description":
                    "What you found and why you make this call, with the evidence. A person reads it if the call is held for approval."}),
            );
            let name = &tool.name;
            let risk = if tool.risk.is_empty() {
                "unknown"
            } else {
                &tool.risk
            };
            let fname = function_name(name);
            tools.definitions.push(json!({"type": "function", "function": {
                "name": fname,
                "description": format!("{}Gateway tool `{name}` (risk: {risk}). The policy may run it, hold it for a person, or block it.",
                    tool.description.as_deref().map(|d| format!("{d} ")).unwrap_or_default()),
                "parameters": {"type": "object", "properties": properties, "required": required, "additionalProperties": false},
            }}));
            tools.names.insert(fname, name.to_owned());
        }
        tools
    }

    /// The OpenAI function tools.
    pub(crate) fn definitions(&self) -> &[Value] {
        &self.definitions
    }

    /// The catalog name for a function name the model used (the dotted name is
    /// accepted too).
    pub(crate) fn resolve(&self, function: &str) -> Option<&str> {
        self.names
            .get(function)
            .or_else(|| self.names.get(&function_name(function)))
            .map(String::as_str)
    }

    /// Whether the session may call catalog tool `tool`.
    pub(crate) fn has(&self, tool: &str) -> bool {
        self.names.contains_key(&function_name(tool))
    }

    /// The function names, for an error message.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }
}

/// The JSON schema of a listed argument type; an unknown type takes any value.
fn schema_of(ty: &str) -> Map<String, Value> {
    let mut schema = Map::new();
    let json_type = match ty {
        "string" => "string",
        "integer" => "integer",
        "boolean" => "boolean",
        "array of strings" => {
            schema.insert("items".into(), json!({"type": "string"}));
            "array"
        }
        _ => return schema,
    };
    schema.insert("type".into(), json!(json_type));
    schema
}

/// Splits a call's arguments into the gateway's arguments and the diagnosis.
pub(crate) fn split_diagnosis(mut args: Value) -> (Value, Option<String>) {
    let diagnosis = args
        .as_object_mut()
        .and_then(|m| m.remove(DIAGNOSIS))
        .and_then(|d| d.as_str().map(str::to_owned))
        .filter(|d| !d.trim().is_empty());
    (args, diagnosis)
}
