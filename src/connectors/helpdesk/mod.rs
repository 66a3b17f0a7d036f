//! The helpdesk connector: the `helpdesk.*` tools over Plain's GraphQL API.
//!
//! Every request is a `POST <base>/graphql/v1` with `Authorization: Bearer <api key>`.
//! GraphQL `errors` and a mutation's `error { message type code fields }` become
//! [`ConnectorError::Rejected`] (or `Unknown` when Plain reports an internal error);
//! HTTP 429 becomes [`ConnectorError::RateLimited`] with the wait read from
//! `x-ratelimit-reset`, and is retried here up to a bound ([`RateLimitRetry`]).
//!
//! Plain has no idempotency keys, so a write whose outcome is unknown must not be sent
//! again blindly. For the internal note on a held call, the note outbox checks with
//! [`HelpdeskConnector::find_note_containing`] before posting again.
//!
//! The exact documents sent are in [`documents`].

pub mod documents;
mod labels;
mod response;
mod thread_events;

pub use labels::{LabelTypeState, StateLabels};
pub use thread_events::{EventPosted, ThreadEvent};

use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Client, Url};
use serde_json::{Value, json};

use super::args::Args;
use super::http;
use super::rate_limit::{RateLimitRetry, retry_rate_limited};
use super::{CallContext, ConfigError, Connector, ConnectorError, Credential, action_name};

/// The tools this connector runs, as the policy catalog names them.
pub const TOOLS: &[&str] = &[
    "helpdesk.get_thread",
    "helpdesk.reply_to_thread",
    "helpdesk.add_note",
    "helpdesk.escalate_to_engineer",
    "helpdesk.mark_done",
];

/// How many of the latest timeline entries `helpdesk.get_thread` returns.
const THREAD_TIMELINE_ENTRIES: u64 = 50;
/// Page size when scanning a thread's notes.
const NOTES_PAGE_SIZE: u64 = 100;
/// How many pages of notes [`HelpdeskConnector::find_note_containing`] reads at most.
const MAX_NOTE_PAGES: usize = 50;

/// How `helpdesk.escalate_to_engineer` routes a thread to engineering, besides the note
/// it always adds. Each part is optional and workspace-specific.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EscalationRouting {
    /// Label types added to the thread (`addLabels`), e.g. an "engineering" label.
    pub label_type_ids: Vec<String>,
    /// A user the thread is assigned to (`assignThread`).
    pub assign_to_user_id: Option<String>,
    /// Whether to move the thread along its workspace escalation path (`escalateThread`).
    pub use_escalation_path: bool,
}

/// The customer of a thread, as the gateway uses it to scope calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadCustomer {
    /// Plain's customer id (`c_…`).
    pub customer_id: String,
    /// The customer's email address.
    pub email: String,
}

/// The Plain helpdesk connector. Cheap to clone.
#[derive(Clone)]
pub struct HelpdeskConnector {
    client: Client,
    endpoint: Url,
    key: Credential,
    routing: EscalationRouting,
    retry: RateLimitRetry,
    state_labels: StateLabels,
}

impl std::fmt::Debug for HelpdeskConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelpdeskConnector")
            .field("endpoint", &self.endpoint.as_str())
            .field("key", &self.key)
            .field("routing", &self.routing)
            .field("retry", &self.retry)
            .field("state_labels", &self.state_labels)
            .finish()
    }
}

impl HelpdeskConnector {
    /// A connector for the Plain API at `base_url` (e.g. `https://core-api.uk.plain.com`
    /// or a fake's address); requests go to `<base_url>/graphql/v1`.
    pub fn new(base_url: &str, api_key: Credential) -> Result<Self, ConfigError> {
        let base = http::parse_base_url(base_url)?;
        Ok(Self {
            client: http::build_client(http::DEFAULT_TIMEOUT)?,
            endpoint: http::endpoint(&base, &["graphql", "v1"]),
            key: api_key,
            routing: EscalationRouting::default(),
            retry: RateLimitRetry::default(),
            state_labels: StateLabels::default(),
        })
    }

    /// Sets how escalations are routed.
    pub fn with_escalation(mut self, routing: EscalationRouting) -> Self {
        self.routing = routing;
        self
    }

    /// Sets the bound on retrying rate-limited requests.
    pub fn with_rate_limit_retry(mut self, retry: RateLimitRetry) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the bound on each request's total time.
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        self.client = http::build_client(timeout)?;
        Ok(self)
    }

    /// The customer of a thread.
    pub async fn thread_customer(&self, thread_id: &str) -> Result<ThreadCustomer, ConnectorError> {
        let thread_id = checked_thread_id(thread_id)?;
        let data = self
            .execute(documents::THREAD_CUSTOMER, json!({"threadId": thread_id}))
            .await?;
        let customer = &response::thread(&data, thread_id)?["customer"];
        let (Some(customer_id), Some(email)) = (
            customer["id"].as_str(),
            customer.pointer("/email/email").and_then(Value::as_str),
        ) else {
            return Err(ConnectorError::unknown(format!(
                "plain answered thread `{thread_id}` without its customer"
            )));
        };
        Ok(ThreadCustomer {
            customer_id: customer_id.to_owned(),
            email: email.to_owned(),
        })
    }

    /// The id of the first note on the thread whose text or markdown contains `marker`,
    /// reading the thread's notes oldest first.
    pub async fn find_note_containing(
        &self,
        thread_id: &str,
        marker: &str,
    ) -> Result<Option<String>, ConnectorError> {
        let thread_id = checked_thread_id(thread_id)?;
        if marker.is_empty() {
            return Err(ConnectorError::invalid("the note marker must not be empty"));
        }
        let mut after = Value::Null;
        for _ in 0..MAX_NOTE_PAGES {
            let variables =
                json!({"threadId": thread_id, "first": NOTES_PAGE_SIZE, "after": after});
            let data = self.execute(documents::THREAD_NOTES, variables).await?;
            let entries = &response::thread(&data, thread_id)?["timelineEntries"];
            let found = entries["edges"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|edge| edge.pointer("/node/entry").unwrap_or(&Value::Null))
                .find(|entry| {
                    let contains =
                        |key: &str| entry[key].as_str().is_some_and(|t| t.contains(marker));
                    contains("text") || contains("markdown")
                });
            if let Some(entry) = found {
                return Ok(entry["noteId"].as_str().map(str::to_owned));
            }
            let page = &entries["pageInfo"];
            match (page["hasNextPage"].as_bool(), page["endCursor"].as_str()) {
                (Some(true), Some(cursor)) => after = json!(cursor),
                _ => return Ok(None),
            }
        }
        Err(ConnectorError::unknown(format!(
            "thread `{thread_id}` has more than {} notes; cannot tell whether the marker is there",
            MAX_NOTE_PAGES as u64 * NOTES_PAGE_SIZE
        )))
    }

    /// Adds an internal note to the thread and returns the note's id.
    pub async fn create_note(
        &self,
        thread_id: &str,
        text: &str,
        markdown: Option<&str>,
    ) -> Result<String, ConnectorError> {
        let thread_id = checked_thread_id(thread_id)?;
        let customer = self.thread_customer(thread_id).await?;
        self.create_note_for(&customer, thread_id, text, markdown)
            .await
    }

    async fn create_note_for(
        &self,
        customer: &ThreadCustomer,
        thread_id: &str,
        text: &str,
        markdown: Option<&str>,
    ) -> Result<String, ConnectorError> {
        let mut input = json!({
            "customerId": customer.customer_id,
            "threadId": thread_id,
            "text": text,
        });
        if let Some(markdown) = markdown
            && let Some(fields) = input.as_object_mut()
        {
            fields.insert("markdown".into(), json!(markdown));
        }
        let data = self
            .execute(documents::CREATE_NOTE, json!({"input": input}))
            .await?;
        let output = response::mutation_output(&data, "createNote", &self.key)?;
        output
            .pointer("/note/id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| ConnectorError::unknown("plain created a note but sent no note id"))
    }

    async fn get_thread(&self, args: &Value) -> Result<Value, ConnectorError> {
        let args = Args::new("helpdesk.get_thread", args, &["thread_id"])?;
        let thread_id = args.id("thread_id")?;
        let variables = json!({"threadId": thread_id, "last": THREAD_TIMELINE_ENTRIES});
        let data = self.execute(documents::GET_THREAD, variables).await?;
        Ok(response::thread_view(response::thread(&data, thread_id)?))
    }

    async fn reply_to_thread(&self, args: &Value) -> Result<Value, ConnectorError> {
        let args = Args::new(
            "helpdesk.reply_to_thread",
            args,
            &["thread_id", "text", "markdown"],
        )?;
        let thread_id = args.id("thread_id")?;
        let mut input = json!({"threadId": thread_id, "textContent": args.str("text")?});
        if let Some(markdown) = args.opt_str("markdown")?
            && let Some(fields) = input.as_object_mut()
        {
            fields.insert("markdownContent".into(), json!(markdown));
        }
        let data = self
            .execute(documents::REPLY_TO_THREAD, json!({"input": input}))
            .await?;
        response::mutation_output(&data, "replyToThread", &self.key)?;
        Ok(json!({"thread_id": thread_id, "replied": true}))
    }

    async fn add_note(&self, args: &Value) -> Result<Value, ConnectorError> {
        let args = Args::new(
            "helpdesk.add_note",
            args,
            &["thread_id", "text", "markdown"],
        )?;
        let thread_id = args.id("thread_id")?;
        let text = args.str("text")?;
        let markdown = args.opt_str("markdown")?;
        let note_id = self.create_note(thread_id, text, markdown).await?;
        Ok(json!({"thread_id": thread_id, "note_id": note_id}))
    }

    /// Routes the thread first (labels, assignment, escalation path: each safe to repeat)
    /// and adds the note last, so a failed routing step has posted nothing.
    async fn escalate_to_engineer(&self, args: &Value) -> Result<Value, ConnectorError> {
        let args = Args::new(
            "helpdesk.escalate_to_engineer",
            args,
            &["thread_id", "summary"],
        )?;
        let thread_id = args.id("thread_id")?;
        let summary = args.str("summary")?;
        let customer = self.thread_customer(thread_id).await?;
        let routing = &self.routing;
        if !routing.label_type_ids.is_empty() {
            let input = json!({"threadId": thread_id, "labelTypeIds": routing.label_type_ids});
            let data = self
                .execute(documents::ADD_LABELS, json!({"input": input}))
                .await?;
            response::mutation_output(&data, "addLabels", &self.key)?;
        }
        if let Some(user_id) = &routing.assign_to_user_id {
            let input = json!({"threadId": thread_id, "userId": user_id});
            let data = self
                .execute(documents::ASSIGN_THREAD, json!({"input": input}))
                .await?;
            response::mutation_output(&data, "assignThread", &self.key)?;
        }
        if routing.use_escalation_path {
            let input = json!({"threadId": thread_id});
            let data = self
                .execute(documents::ESCALATE_THREAD, json!({"input": input}))
                .await?;
            response::mutation_output(&data, "escalateThread", &self.key)?;
        }
        let text = format!("Escalated to engineering by the support agent.\n\n{summary}");
        let markdown = format!("**Escalated to engineering** by the support agent.\n\n{summary}");
        let note_id = self
            .create_note_for(&customer, thread_id, &text, Some(&markdown))
            .await?;
        Ok(json!({
            "thread_id": thread_id,
            "note_id": note_id,
            "labels_added": routing.label_type_ids,
            "assigned_to": routing.assign_to_user_id,
            "escalation_path": routing.use_escalation_path,
        }))
    }

    async fn mark_done(&self, args: &Value) -> Result<Value, ConnectorError> {
        let args = Args::new("helpdesk.mark_done", args, &["thread_id"])?;
        let thread_id = args.id("thread_id")?;
        let input = json!({"threadId": thread_id});
        let data = self
            .execute(documents::MARK_THREAD_AS_DONE, json!({"input": input}))
            .await?;
        let output = response::mutation_output(&data, "markThreadAsDone", &self.key)?;
        Ok(json!({"thread_id": thread_id, "status": output.pointer("/thread/status")}))
    }

    /// Sends one GraphQL operation, retrying rate limits up to the bound, and returns
    /// its `data`.
    async fn execute(&self, document: &str, variables: Value) -> Result<Value, ConnectorError> {
        let body = json!({"query": document, "variables": variables});
        retry_rate_limited(self.retry, || async {
            let request = self.client.post(self.endpoint.clone()).json(&body);
            let answer = http::send(request, &self.key).await?;
            response::interpret(answer, &self.key)
        })
        .await
    }
}

#[async_trait]
impl Connector for HelpdeskConnector {
    fn name(&self) -> &'static str {
        "helpdesk"
    }

    async fn call(
        &self,
        tool: &str,
        args: &Value,
        _ctx: &CallContext<'_>,
    ) -> Result<Value, ConnectorError> {
        match action_name(self.name(), tool) {
            "get_thread" => self.get_thread(args).await,
            "reply_to_thread" => self.reply_to_thread(args).await,
            "add_note" => self.add_note(args).await,
            "escalate_to_engineer" => self.escalate_to_engineer(args).await,
            "mark_done" => self.mark_done(args).await,
            other => Err(ConnectorError::invalid(format!(
                "unknown tool helpdesk.{other}"
            ))),
        }
    }

    fn supports_idempotency(&self) -> bool {
        false
    }
}

fn checked_thread_id(thread_id: &str) -> Result<&str, ConnectorError> {
    if super::args::is_plain_id(thread_id) {
        Ok(thread_id)
    } else {
        Err(ConnectorError::invalid(
            "thread id must be made of letters, digits, `_` and `-`",
        ))
    }
}
