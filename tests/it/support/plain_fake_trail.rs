//! The Plain fake's thread events (`createThreadEvent`, refusing an external id the
//! workspace already has, as Plain does) and label removal (`removeLabels`), beside its
//! model (`plain_fake_model`).

use serde_json::{Value, json};

use super::plain_fake_model::{Model, datetime, validation_error};

/// A thread event made with `createThreadEvent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadEventRecord {
    pub id: String,
    pub external_id: Option<String>,
    pub title: String,
    /// The components as sent (`EventComponentInput` objects).
    pub components: Vec<Value>,
}

impl ThreadEventRecord {
    /// The texts of its text components, one per line.
    pub fn text(&self) -> String {
        self.components
            .iter()
            .filter_map(|c| {
                c["componentPlainText"]["plainText"]
                    .as_str()
                    .or_else(|| c["componentText"]["text"].as_str())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Its link buttons: `(url, label)`.
    pub fn link_buttons(&self) -> Vec<(String, String)> {
        self.components
            .iter()
            .filter_map(|c| {
                let button = &c["componentLinkButton"];
                Some((
                    button["linkButtonUrl"].as_str()?.to_owned(),
                    button["linkButtonLabel"].as_str()?.to_owned(),
                ))
            })
            .collect()
    }
}

/// `createThreadEvent`: refuses an external id the workspace already has, as Plain
/// does, with a `MutationError` in a 200 answer.
pub fn create_thread_event(model: &mut Model, thread_id: &str, input: &Value) -> Value {
    let external_id = input["externalId"].as_str().map(str::to_owned);
    if let Some(external_id) = &external_id
        && !model.event_external_ids.insert(external_id.clone())
    {
        let message = format!("a thread event with external id {external_id} already exists");
        return json!({"error": {"message": message, "type": "VALIDATION",
            "code": "input_validation",
            "fields": [{"field": "externalId", "message": message, "type": "VALIDATION"}]}});
    }
    let id = model.next_id("tev");
    let event = ThreadEventRecord {
        id: id.clone(),
        external_id,
        title: input["title"].as_str().unwrap_or_default().to_owned(),
        components: input["components"].as_array().cloned().unwrap_or_default(),
    };
    let thread = model.threads.get_mut(thread_id).expect("checked");
    let customer_id = thread.customer.id.clone();
    thread.events.push(event.clone());
    json!({"threadEvent": {"id": id, "customerId": customer_id, "threadId": thread_id,
                           "title": event.title, "components": [],
                           "createdAt": datetime(), "updatedAt": datetime()},
           "error": null})
}

/// `removeLabels`: by label id (`l_<label type id>` in the fake), on whichever thread
/// carries it; an unknown label id is a validation error, as in Plain.
pub fn remove_labels(model: &mut Model, input: &Value) -> Value {
    let ids: Vec<&str> = input["labelIds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for id in &ids {
        let label_type = id.strip_prefix("l_").unwrap_or_default();
        let carrier = model
            .threads
            .values_mut()
            .find(|t| t.label_type_ids.iter().any(|l| l == label_type));
        match carrier {
            Some(thread) => thread.label_type_ids.retain(|l| l != label_type),
            None => return validation_error("labelIds", &format!("label {id} not found")),
        }
    }
    json!({"thread": null, "error": null})
}
