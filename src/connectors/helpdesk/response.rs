//! Reading Plain's GraphQL answers: HTTP status, top-level `errors`, mutation
//! `error { message type code fields }`, and the thread shape the agent sees.

use chrono::Utc;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::connectors::http::{self, HttpResponse};
use crate::connectors::rate_limit::retry_after_from_headers;
use crate::connectors::{ConnectorError, Credential};

/// Error codes that mean Plain failed internally: the outcome is unknown.
const INTERNAL_CODES: &[&str] = &["INTERNAL", "INTERNAL_SERVER_ERROR"];

/// The `data` of a GraphQL answer, or the error it carries.
pub(crate) fn interpret(response: HttpResponse, key: &Credential) -> Result<Value, ConnectorError> {
    let status = response.status;
    let code = status.as_u16();
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Err(ConnectorError::RateLimited {
            retry_after: retry_after_from_headers(&response.headers, Utc::now()),
        });
    }
    let excerpt = || key.redact(&http::body_excerpt(&response.body));
    if status.is_server_error() {
        return Err(ConnectorError::unknown(format!(
            "plain answered {code}: {}",
            excerpt()
        )));
    }
    let Ok(body) = serde_json::from_slice::<Value>(&response.body) else {
        let message = format!(
            "plain answered {code} with a body that is not json: {}",
            excerpt()
        );
        return Err(if status.is_success() {
            ConnectorError::unknown(message)
        } else {
            ConnectorError::Rejected {
                status: code,
                code: None,
                message,
            }
        });
    };
    if let Some(errors) = body
        .get("errors")
        .and_then(Value::as_array)
        .filter(|errors| !errors.is_empty())
    {
        return Err(graphql_errors(code, errors, key));
    }
    if !status.is_success() {
        return Err(ConnectorError::Rejected {
            status: code,
            code: None,
            message: format!("plain answered {code}: {}", excerpt()),
        });
    }
    match body.get("data") {
        Some(data) if data.is_object() => Ok(data.clone()),
        _ => Err(ConnectorError::unknown(format!(
            "plain answered {code} without data: {}",
            excerpt()
        ))),
    }
}

fn graphql_errors(status: u16, errors: &[Value], key: &Credential) -> ConnectorError {
    let message = errors
        .iter()
        .map(|error| error["message"].as_str().unwrap_or("unnamed error"))
        .collect::<Vec<_>>()
        .join("; ");
    let message = key.redact(&message);
    let code = errors
        .iter()
        .find_map(|error| error.pointer("/extensions/code").and_then(Value::as_str))
        .map(str::to_owned);
    if code
        .as_deref()
        .is_some_and(|code| INTERNAL_CODES.contains(&code))
    {
        return ConnectorError::Unknown { message };
    }
    ConnectorError::Rejected {
        status,
        code,
        message,
    }
}

/// The output object of mutation `field`, or the `MutationError` it carries.
pub(crate) fn mutation_output<'a>(
    data: &'a Value,
    field: &str,
    key: &Credential,
) -> Result<&'a Value, ConnectorError> {
    let output = &data[field];
    if !output.is_object() {
        return Err(ConnectorError::unknown(format!(
            "plain answered without `{field}` output"
        )));
    }
    let error = &output["error"];
    if error.is_null() {
        return Ok(output);
    }
    let mut message = error["message"]
        .as_str()
        .unwrap_or("mutation failed")
        .to_owned();
    let fields: Vec<String> = error["fields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|field| {
            format!(
                "{}: {}",
                field["field"].as_str().unwrap_or("?"),
                field["message"].as_str().unwrap_or("invalid")
            )
        })
        .collect();
    if !fields.is_empty() {
        message.push_str(&format!(" ({})", fields.join("; ")));
    }
    let message = key.redact(&format!("{field}: {message}"));
    if error["type"]
        .as_str()
        .is_some_and(|kind| INTERNAL_CODES.contains(&kind))
    {
        return Err(ConnectorError::Unknown { message });
    }
    Err(ConnectorError::Rejected {
        status: 200,
        code: error["code"].as_str().map(str::to_owned),
        message,
    })
}

/// `data.thread`, or a 404 rejection naming the thread.
pub(crate) fn thread<'a>(data: &'a Value, thread_id: &str) -> Result<&'a Value, ConnectorError> {
    let thread = &data["thread"];
    if thread.is_object() {
        Ok(thread)
    } else {
        Err(ConnectorError::Rejected {
            status: 404,
            code: Some("not_found".into()),
            message: format!("thread `{thread_id}` not found"),
        })
    }
}

/// The thread as the agent sees it: plain names, no GraphQL wrapping.
pub(crate) fn thread_view(thread: &Value) -> Value {
    let labels: Vec<Value> = thread["labels"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|label| json!({"id": label["id"], "name": label.pointer("/labelType/name")}))
        .collect();
    let assignee = &thread["assignedTo"];
    let assigned_to = if assignee.is_object() {
        json!({
            "kind": assignee["__typename"],
            "id": assignee["id"],
            "name": assignee["fullName"],
        })
    } else {
        Value::Null
    };
    let timeline: Vec<Value> = thread
        .pointer("/timelineEntries/edges")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|edge| timeline_entry(&edge["node"]))
        .collect();
    let customer = &thread["customer"];
    json!({
        "thread_id": thread["id"],
        "ref": thread["ref"],
        "title": thread["title"],
        "description": thread["description"],
        "status": thread["status"],
        "priority": thread["priority"],
        "created_at": thread.pointer("/createdAt/iso8601"),
        "customer": {
            "id": customer["id"],
            "name": customer["fullName"],
            "email": customer.pointer("/email/email"),
            "email_verified": customer.pointer("/email/isVerified"),
        },
        "labels": labels,
        "assigned_to": assigned_to,
        "timeline": timeline,
        "earlier_entries": thread.pointer("/timelineEntries/pageInfo/hasPreviousPage"),
    })
}

fn timeline_entry(node: &Value) -> Value {
    let entry = &node["entry"];
    let mut view = json!({
        "id": node["id"],
        "at": node.pointer("/timestamp/iso8601"),
        "actor": node.pointer("/actor/__typename"),
    });
    let details = match entry["__typename"].as_str() {
        Some("NoteEntry") => json!({
            "kind": "note", "note_id": entry["noteId"],
            "text": entry["noteText"], "markdown": entry["markdown"],
        }),
        Some("ChatEntry") => json!({"kind": "chat", "text": entry["chatText"]}),
        Some("EmailEntry") => json!({
            "kind": "email", "subject": entry["subject"], "text": entry["textContent"],
            "from": entry.pointer("/from/email"),
        }),
        other => json!({"kind": other.unwrap_or("unknown")}),
    };
    if let (Value::Object(view), Value::Object(details)) = (&mut view, details) {
        view.extend(details);
    }
    view
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue};
    use std::time::Duration;

    const KEY: &str = "plain_test_secret_key";

    fn answer(status: u16, body: &str, headers: &[(&'static str, &str)]) -> HttpResponse {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        HttpResponse {
            status: StatusCode::from_u16(status).unwrap(),
            headers: map,
            body: body.as_bytes().to_vec(),
        }
    }

    fn check(status: u16, body: &str, expected: Result<Value, ConnectorError>) {
        let key = Credential::new(KEY);
        assert_eq!(
            interpret(answer(status, body, &[]), &key),
            expected,
            "{status} {body}"
        );
    }

    #[test]
    fn answers_map_to_data_or_errors() {
        check(
            200,
            r#"{"data":{"thread":null}}"#,
            Ok(json!({"thread": null})),
        );
        check(
            200,
            r#"{"errors":[{"message":"Cannot query field","extensions":{"code":"GRAPHQL_VALIDATION_FAILED"}}]}"#,
            Err(ConnectorError::Rejected {
                status: 200,
                code: Some("GRAPHQL_VALIDATION_FAILED".into()),
                message: "Cannot query field".into(),
            }),
        );
        check(
            401,
            r#"{"errors":[{"message":"unauthenticated"}]}"#,
            Err(ConnectorError::Rejected {
                status: 401,
                code: None,
                message: "unauthenticated".into(),
            }),
        );
        let key = Credential::new(KEY);
        for (status, body) in [
            (500, "boom"),
            (200, "not json"),
            (
                200,
                r#"{"errors":[{"message":"x","extensions":{"code":"INTERNAL_SERVER_ERROR"}}]}"#,
            ),
            (200, r#"{"data":null}"#),
        ] {
            let result = interpret(answer(status, body, &[]), &key);
            assert!(
                matches!(result, Err(ConnectorError::Unknown { .. })),
                "{status} {body}"
            );
        }
    }

    #[test]
    fn rate_limit_uses_the_reset_header() {
        let key = Credential::new(KEY);
        let reset = (Utc::now() + chrono::Duration::seconds(30)).to_rfc3339();
        let result = interpret(answer(429, "{}", &[("x-ratelimit-reset", &reset)]), &key);
        let Err(ConnectorError::RateLimited { retry_after }) = result else {
            panic!("expected a rate limit, got {result:?}");
        };
        assert!(retry_after > Duration::from_secs(25) && retry_after <= Duration::from_secs(30));
    }

    #[test]
    fn mutation_errors_are_rejections_unless_internal() {
        let key = Credential::new(KEY);
        let data = json!({"createNote": {"note": null, "error": {
            "message": "bad input", "type": "VALIDATION", "code": "input_validation",
            "fields": [{"field": "text", "message": "must not be empty", "type": "REQUIRED"}]
        }}});
        assert_eq!(
            mutation_output(&data, "createNote", &key),
            Err(ConnectorError::Rejected {
                status: 200,
                code: Some("input_validation".into()),
                message: "createNote: bad input (text: must not be empty)".into(),
            })
        );
        let internal = json!({"replyToThread": {"error": {
            "message": format!("failed for {KEY}"), "type": "INTERNAL", "code": "internal", "fields": []
        }}});
        let error = mutation_output(&internal, "replyToThread", &key).unwrap_err();
        assert!(matches!(error, ConnectorError::Unknown { .. }));
        assert!(!error.to_string().contains(KEY));
        let ok = json!({"replyToThread": {"error": null}});
        assert!(mutation_output(&ok, "replyToThread", &key).is_ok());
    }
}
