//! Tool names upstream: OpenAI and Anthropic accept only `[A-Za-z0-9_-]`, while the
//! gateway's tools are `connector.action`. The proxy renames each offered tool for the
//! wire (`stripe.create_refund` → `stripe__create_refund`) and maps the model's calls
//! back, so the runner sees the gateway's names whichever upstream answers. A name the
//! request did not offer is passed through as the upstream wrote it.

use std::collections::HashMap;

use super::types::{ChatAnswer, ChatRequest, ToolChoice};

/// The renaming for one request.
#[derive(Debug, Default)]
pub struct ToolNames {
    /// Wire name → the runner's name.
    back: HashMap<String, String>,
}

/// The wire form of `name`.
pub fn wire_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c.to_string()
            } else if c == '.' {
                "__".into()
            } else {
                "_".into()
            }
        })
        .collect()
}

impl ToolNames {
    /// The renaming of the tools `request` offers.
    pub fn for_request(request: &ChatRequest) -> ToolNames {
        let back = request
            .tools
            .iter()
            .map(|t| (wire_name(&t.name), t.name.clone()))
            .collect();
        ToolNames { back }
    }

    /// Renames offered tools, earlier calls and a named tool choice for the wire.
    pub fn to_wire(&self, mut request: ChatRequest) -> ChatRequest {
        for t in &mut request.tools {
            t.name = wire_name(&t.name);
        }
        for m in &mut request.messages {
            for c in &mut m.tool_calls {
                if self.back.contains_key(&wire_name(&c.name)) {
                    c.name = wire_name(&c.name);
                }
            }
        }
        if let Some(ToolChoice::Named(n)) = &mut request.tool_choice {
            *n = wire_name(n);
        }
        request
    }

    /// Maps the model's calls back to the runner's names.
    pub fn from_wire(&self, answer: &mut ChatAnswer) {
        for c in &mut answer.message.tool_calls {
            if let Some(original) = self.back.get(&c.name) {
                c.name = original.clone();
            }
        }
    }
}
