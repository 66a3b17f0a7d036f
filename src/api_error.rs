//! One error answer for every HTTP surface (the sandbox API on the session sockets, the
//! approvals API, webhook intake): a status and one JSON body shape,
//! `{"status": "error", "error": CODE, "message": TEXT}`, with `problems` (a list of
//! texts) when a request had several: `threadgate_api::ErrorAnswer`, the type the agent
//! runner reads. Domain errors stay typed in their modules; the HTTP layer maps them to
//! an [`ApiError`].

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use threadgate_api::{ErrorAnswer, ErrorBody};

/// An error answer: its status, a stable machine code and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub problems: Vec<String>,
}

impl ApiError {
    /// An answer with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            problems: Vec::new(),
        }
    }

    /// A 500 that says nothing specific (the cause goes to the log, never the answer).
    pub fn internal() -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    }

    /// The same answer listing each of `problems`.
    pub fn with_problems(mut self, problems: Vec<String>) -> ApiError {
        self.problems = problems;
        self
    }

    /// What the answer says besides its `"status": "error"`.
    pub fn error_body(&self) -> ErrorBody {
        ErrorBody {
            error: self.code.to_owned(),
            message: self.message.clone(),
            problems: self.problems.clone(),
        }
    }

    /// The answer as it is sent.
    pub fn answer(&self) -> ErrorAnswer {
        ErrorAnswer::Error(self.error_body())
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(self.answer()).unwrap_or_default()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.answer())).into_response()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_answer_has_the_same_shape() {
        let e = ApiError::new(StatusCode::GONE, "expired", "call ex_1 expired");
        assert_eq!(
            e.body(),
            json!({"status": "error", "error": "expired", "message": "call ex_1 expired"})
        );
        let listed = ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_arguments", "x")
            .with_problems(vec!["a: missing".into()]);
        assert_eq!(listed.body()["problems"], json!(["a: missing"]));
        let internal = ApiError::internal();
        assert_eq!(internal.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(internal.body()["message"], "internal error");
    }
}
