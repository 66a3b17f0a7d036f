//! `GET /v1/tools`: the tools the session's agent may call, with what the model is told
//! of each.

use serde::{Deserialize, Serialize};

/// The listing: `{"tools": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolListing {
    pub tools: Vec<ToolEntry>,
}

/// One catalog tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolEntry {
    #[serde(default)]
    pub args: Vec<ToolArg>,
    /// What the tool does, when the catalog documents it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The catalog name, e.g. `stripe.create_refund`.
    pub name: String,
    /// The risk class: `read`, `write` or `destructive`.
    #[serde(default)]
    pub risk: String,
}

/// One argument of a tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolArg {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The only values the argument takes, when it has such a list.
    #[serde(rename = "enum", default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<String>>,
    pub name: String,
    #[serde(default)]
    pub required: bool,
    /// `string`, `integer`, `boolean` or `array of strings`.
    #[serde(rename = "type")]
    pub ty: String,
}
