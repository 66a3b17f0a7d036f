//! The gate's answers as the sandbox API's types (`threadgate_api`): a call's answer
//! with its HTTP status, a held call, an execution as the agent sees it, and a
//! refusal as an [`ApiError`]. `POST /v1/calls` and the MCP tools answer with the same
//! values, so the agent runner reads one contract.

use axum::http::StatusCode;
use serde_json::Value;
use threadgate_api::{Blocked, CallAnswer, ExecutionStatus, ExecutionView, Failed, Held, Ran};

use super::gate::CallReply;
use super::refusal::Refusal;
use crate::api_error::ApiError;
use crate::executions::store::{Execution, Status};

/// A call's answer and its status: 200 ran, 502 failed, 202 held, 403 blocked, and a
/// refusal's status through [`ApiError`].
pub fn call_answer(reply: CallReply) -> (StatusCode, CallAnswer) {
    match reply {
        CallReply::Ran {
            execution_id,
            result,
            replayed,
        } => (
            StatusCode::OK,
            CallAnswer::Ok(Ran {
                execution_id: execution_id.into_string(),
                replayed,
                result,
            }),
        ),
        CallReply::Failed {
            execution_id,
            error,
            retry_after_ms,
        } => (
            StatusCode::BAD_GATEWAY,
            CallAnswer::Failed(Failed {
                error,
                execution_id: execution_id.into_string(),
                retry_after_ms,
            }),
        ),
        CallReply::Held {
            execution,
            approval_url,
        } => (
            StatusCode::ACCEPTED,
            CallAnswer::PendingApproval(held(&execution, &approval_url)),
        ),
        CallReply::Blocked { execution_id, rule } => (
            StatusCode::FORBIDDEN,
            CallAnswer::Blocked(Blocked {
                execution_id: execution_id.into_string(),
                rule,
            }),
        ),
        CallReply::Refused(refusal) => {
            let e = ApiError::from(refusal);
            (e.status, CallAnswer::Error(e.error_body()))
        }
    }
}

/// A held call as the agent is told of it.
pub fn held(execution: &Execution, approval_url: &str) -> Held {
    Held {
        approval_summary: execution.summary.clone(),
        approval_url: approval_url.to_owned(),
        execution_id: execution.id.to_string(),
        expires_at: execution.expires_at_ms.map(rfc3339),
    }
}

/// What the agent sees of an execution.
pub fn agent_view(e: &Execution) -> ExecutionView {
    let result: Value = e
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or(Value::Null);
    let status = match e.status {
        Status::Succeeded => ExecutionStatus::Ok,
        Status::Held | Status::Approved => ExecutionStatus::PendingApproval,
        Status::Running => ExecutionStatus::Running,
        Status::Failed => ExecutionStatus::Failed,
        Status::NeedsCheck => ExecutionStatus::NeedsCheck,
        Status::Denied => ExecutionStatus::Denied,
        Status::Expired => ExecutionStatus::Expired,
        Status::Blocked => ExecutionStatus::Blocked,
    };
    ExecutionView {
        error: e.error.clone(),
        execution_id: e.id.to_string(),
        expires_at: e.expires_at_ms.map(rfc3339),
        message: e.decision_message.clone(),
        result,
        reviewer: e.reviewer.clone(),
        status,
        tool: e.tool.clone(),
    }
}

/// RFC 3339 for a unix-ms instant.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> ApiError {
        let status = match &refusal {
            Refusal::NotGranted(_) | Refusal::SecretInArguments(_) | Refusal::OutOfScope(_) => {
                StatusCode::FORBIDDEN
            }
            Refusal::UnknownTool(_) => StatusCode::NOT_FOUND,
            Refusal::InvalidArguments { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Refusal::LookupFailed { definite: true, .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Refusal::LookupFailed {
                definite: false, ..
            } => StatusCode::BAD_GATEWAY,
            Refusal::TooManyHolds { .. }
            | Refusal::TooManyCalls { .. }
            | Refusal::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Refusal::InstanceBusy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::SessionMoved | Refusal::InFlight(_) => StatusCode::CONFLICT,
            Refusal::Internal => return ApiError::internal(),
        };
        let code = refusal.code();
        match refusal {
            Refusal::InvalidArguments { message, problems } => {
                ApiError::new(status, code, message).with_problems(problems)
            }
            other => ApiError::new(status, code, other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_refusal_maps_to_one_status_and_the_common_body() {
        let cases = [
            (Refusal::NotGranted("n".into()), 403, "not_granted"),
            (Refusal::UnknownTool("u".into()), 404, "unknown_tool"),
            (Refusal::invalid("i"), 422, "invalid_arguments"),
            (
                Refusal::SecretInArguments("s".into()),
                403,
                "secret_in_arguments",
            ),
            (Refusal::OutOfScope("o".into()), 403, "out_of_scope"),
            (
                Refusal::LookupFailed {
                    message: "l".into(),
                    definite: true,
                },
                422,
                "lookup_failed",
            ),
            (
                Refusal::LookupFailed {
                    message: "l".into(),
                    definite: false,
                },
                502,
                "lookup_failed",
            ),
            (Refusal::TooManyHolds { limit: 3 }, 429, "too_many_holds"),
            (Refusal::TooManyCalls { limit: 64 }, 429, "too_many_calls"),
            (Refusal::InstanceBusy { limit: 1024 }, 503, "instance_busy"),
            (
                Refusal::RateLimited {
                    per_second: 20,
                    burst: 100,
                    retry_after_ms: 50,
                },
                429,
                "rate_limited",
            ),
            (Refusal::SessionMoved, 409, "session_moved"),
            (
                Refusal::InFlight(crate::ids::ExecutionId::parse("ex_1").expect("id")),
                409,
                "in_flight",
            ),
            (Refusal::Internal, 500, "internal"),
        ];
        for (refusal, status, code) in cases {
            let e = ApiError::from(refusal);
            assert_eq!((e.status.as_u16(), e.code), (status, code));
            assert_eq!(e.body()["status"], "error");
        }
        let listed = ApiError::from(Refusal::InvalidArguments {
            message: "t: a; b".into(),
            problems: vec!["a".into(), "b".into()],
        });
        assert_eq!(listed.body()["problems"], json!(["a", "b"]));
    }

    #[test]
    fn a_refused_call_answers_the_error_body_with_the_refusals_status() {
        let (status, answer) = call_answer(CallReply::Refused(Refusal::OutOfScope(
            "another thread".into(),
        )));
        assert_eq!(status, StatusCode::FORBIDDEN);
        let CallAnswer::Error(body) = answer else {
            panic!("not an error answer: {answer:?}");
        };
        assert_eq!(body.error, "out_of_scope");
        let (status, answer) = call_answer(CallReply::Blocked {
            execution_id: crate::ids::ExecutionId::parse("ex_1").expect("id"),
            rule: "policy.yaml:3".into(),
        });
        assert_eq!(
            (status, answer.status()),
            (StatusCode::FORBIDDEN, "blocked")
        );
    }
}
