//! What every script answers with: one [`Step`] per request, every text labelled
//! [`LABEL`]. A leaf of its own, so the scripts (`scenarios`, `bug_report`) share it
//! without importing each other.

/// The label every answer carries.
pub const LABEL: &str = "[scripted model, not a real model]";

/// What the scripted model does for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Calls `tool` (a gateway name, or a name the request did not offer) with the raw
    /// `arguments` text, saying `text`.
    Call {
        text: String,
        tool: String,
        arguments: String,
    },
    /// Answers with text only (the turn is over).
    Say(String),
    /// Answers HTTP `status` (with `Retry-After: 0` on a 429).
    Status(u16),
    /// Answers 200 with a body that is not JSON.
    NotJson,
    /// Answers 200 with JSON lacking `usage`.
    NoUsage,
}
