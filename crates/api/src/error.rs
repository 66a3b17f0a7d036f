//! The one error answer of every JSON surface:
//! `{"status": "error", "error": CODE, "message": TEXT}`, with `problems` (a list of
//! texts) when a request had several.

use serde::{Deserialize, Serialize};

/// What an error answer says besides its `"status": "error"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// A stable machine code (`invalid_arguments`, `not_found`, `internal`, …).
    pub error: String,
    /// A message for people.
    #[serde(default)]
    pub message: String,
    /// Each problem of a request that had several; absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// An error answer as it is sent: the body tagged `"status": "error"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ErrorAnswer {
    /// The only kind.
    Error(ErrorBody),
}

impl ErrorAnswer {
    /// The answer with `code` and `message` and no problems.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> ErrorAnswer {
        ErrorAnswer::Error(ErrorBody {
            error: code.into(),
            message: message.into(),
            problems: Vec::new(),
        })
    }

    /// Its body.
    pub fn body(&self) -> &ErrorBody {
        match self {
            ErrorAnswer::Error(body) => body,
        }
    }
}
