//! Thread events (`createThreadEvent`): entries on a thread's timeline that support
//! staff read beside the conversation, each with an external id that Plain takes once.
//!
//! Plain answers a second event with an external id it already has with a
//! `MutationError`; its code is not part of the schema, so the refusal is known by the
//! field it names (`externalId`) or a code saying the id already exists. That refusal
//! means the event is on the thread: [`EventPosted::AlreadyThere`], not an error, so a
//! re-sent event is safe.

use serde_json::{Value, json};

use super::{HelpdeskConnector, checked_thread_id, documents, response};
use crate::connectors::ConnectorError;

/// One event as sent: a title, a plain-text body and an optional link button.
#[derive(Debug, Clone, Copy)]
pub struct ThreadEvent<'a> {
    pub thread_id: &'a str,
    /// Plain refuses a second event with the same external id.
    pub external_id: &'a str,
    pub title: &'a str,
    /// Shown as written (`componentPlainText`: no Markdown is rendered).
    pub body: &'a str,
    /// A link button: `(url, label)`.
    pub link: Option<(&'a str, &'a str)>,
}

/// What became of a thread event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventPosted {
    /// Plain made it; its id.
    Created(String),
    /// Plain already had an event with this external id.
    AlreadyThere,
}

impl HelpdeskConnector {
    /// Adds an event to the thread's timeline.
    pub async fn create_thread_event(
        &self,
        event: &ThreadEvent<'_>,
    ) -> Result<EventPosted, ConnectorError> {
        let thread_id = checked_thread_id(event.thread_id)?;
        if event.external_id.is_empty() {
            return Err(ConnectorError::invalid(
                "a thread event needs an external id",
            ));
        }
        let mut components = vec![json!({"componentPlainText": {"plainText": event.body}})];
        if let Some((url, label)) = event.link {
            components.push(json!({
                "componentLinkButton": {"linkButtonUrl": url, "linkButtonLabel": label}
            }));
        }
        let input = json!({
            "threadId": thread_id,
            "externalId": event.external_id,
            "title": event.title,
            "components": components,
        });
        let data = self
            .execute(documents::CREATE_THREAD_EVENT, json!({"input": input}))
            .await?;
        if is_duplicate_external_id(
            data.pointer("/createThreadEvent/error")
                .unwrap_or(&Value::Null),
        ) {
            return Ok(EventPosted::AlreadyThere);
        }
        let output = response::mutation_output(&data, "createThreadEvent", &self.key)?;
        output
            .pointer("/threadEvent/id")
            .and_then(Value::as_str)
            .map(|id| EventPosted::Created(id.to_owned()))
            .ok_or_else(|| ConnectorError::unknown("plain created a thread event but sent no id"))
    }
}

/// Whether a `MutationError` is Plain refusing an external id it already has.
fn is_duplicate_external_id(error: &Value) -> bool {
    if error.is_null() {
        return false;
    }
    let code = error["code"]
        .as_str()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let names_external_id = error["fields"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|field| field["field"].as_str() == Some("externalId"));
    names_external_id || code.contains("already_exists") || code.contains("duplicate")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::is_duplicate_external_id;

    #[test]
    fn only_a_refused_external_id_counts_as_already_there() {
        let duplicate = json!({"message": "already exists", "type": "VALIDATION",
            "code": "input_validation",
            "fields": [{"field": "externalId", "message": "taken", "type": "VALIDATION"}]});
        assert!(is_duplicate_external_id(&duplicate));
        let other = json!({"message": "no", "type": "VALIDATION", "code": "input_validation",
            "fields": [{"field": "threadId", "message": "not found", "type": "NOT_FOUND"}]});
        assert!(!is_duplicate_external_id(&other));
        assert!(!is_duplicate_external_id(&json!(null)));
    }
}
