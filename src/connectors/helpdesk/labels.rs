//! A thread's state labels: the label types threadgate keeps in step with a session
//! (`addLabels`, `removeLabels`), and the check at start that each configured label type
//! is one Plain knows (`labelType`).
//!
//! Plain adds labels by label type but removes them by the label's own id, so a sync
//! reads the thread's labels first; both steps are safe to repeat.

use serde::Deserialize;
use serde_json::{Value, json};

use super::{HelpdeskConnector, checked_thread_id, documents, response};
use crate::connectors::ConnectorError;

/// `[plain] labels`: the label type (`lt_…`) each state of a thread is shown with, so
/// support staff can filter their queue. Each is checked against Plain at start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateLabels {
    /// While the thread has a call waiting for a person.
    pub waiting_for_approval: Option<String>,
    /// While the thread's session runs.
    pub agent_working: Option<String>,
    /// Once the session stopped on its own (budget, secret, too many holds, workspace
    /// full) and a person takes over.
    pub handed_to_person: Option<String>,
}

impl StateLabels {
    /// Every configured label: `(its key as written in the TOML, label type id)`.
    pub fn configured(&self) -> Vec<(&'static str, &str)> {
        [
            ("waiting_for_approval", &self.waiting_for_approval),
            ("agent_working", &self.agent_working),
            ("handed_to_person", &self.handed_to_person),
        ]
        .into_iter()
        .filter_map(|(key, id)| id.as_deref().map(|id| (key, id)))
        .collect()
    }
}

/// What Plain says of a label type id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelTypeState {
    /// Plain has it, not archived.
    Usable,
    /// Plain has it, archived: it cannot be added.
    Archived,
    /// Plain does not know it.
    Unknown,
}

impl HelpdeskConnector {
    /// Whether Plain knows the label type `label_type_id` and it can be used.
    pub async fn label_type_state(
        &self,
        label_type_id: &str,
    ) -> Result<LabelTypeState, ConnectorError> {
        let data = self
            .execute(documents::LABEL_TYPE, json!({"labelTypeId": label_type_id}))
            .await?;
        let label_type = data.get("labelType").unwrap_or(&Value::Null);
        Ok(if label_type.is_null() {
            LabelTypeState::Unknown
        } else if label_type["isArchived"].as_bool() == Some(true) {
            LabelTypeState::Archived
        } else {
            LabelTypeState::Usable
        })
    }

    /// Makes the thread carry, of the `managed` label types, exactly the `wanted` ones;
    /// labels of any other type are left alone.
    pub async fn sync_labels(
        &self,
        thread_id: &str,
        managed: &[&str],
        wanted: &[&str],
    ) -> Result<(), ConnectorError> {
        let thread_id = checked_thread_id(thread_id)?;
        let data = self
            .execute(documents::THREAD_LABELS, json!({"threadId": thread_id}))
            .await?;
        let labels = response::thread(&data, thread_id)?["labels"]
            .as_array()
            .cloned()
            .ok_or_else(|| ConnectorError::unknown("plain answered a thread without labels"))?;
        let present: Vec<(String, String)> = labels
            .iter()
            .filter_map(|label| {
                Some((
                    label["id"].as_str()?.to_owned(),
                    label.pointer("/labelType/id")?.as_str()?.to_owned(),
                ))
            })
            .collect();
        let missing: Vec<&str> = wanted
            .iter()
            .copied()
            .filter(|id| !present.iter().any(|(_, t)| t == id))
            .collect();
        if !missing.is_empty() {
            let input = json!({"threadId": thread_id, "labelTypeIds": missing});
            let data = self
                .execute(documents::ADD_LABELS, json!({"input": input}))
                .await?;
            response::mutation_output(&data, "addLabels", &self.key)?;
        }
        let stale: Vec<&str> = present
            .iter()
            .filter(|(_, t)| managed.contains(&t.as_str()) && !wanted.contains(&t.as_str()))
            .map(|(id, _)| id.as_str())
            .collect();
        if !stale.is_empty() {
            let input = json!({"labelIds": stale});
            let data = self
                .execute(documents::REMOVE_LABELS, json!({"input": input}))
                .await?;
            response::mutation_output(&data, "removeLabels", &self.key)?;
        }
        Ok(())
    }
}

impl HelpdeskConnector {
    /// Sets the label types that show a thread's state.
    pub fn with_state_labels(mut self, labels: StateLabels) -> Self {
        self.state_labels = labels;
        self
    }

    /// The label types that show a thread's state.
    pub fn state_labels(&self) -> &StateLabels {
        &self.state_labels
    }
}
