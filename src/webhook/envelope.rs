//! The envelope of a Plain webhook delivery: the few fields threadgate reads from it,
//! and what the event means for a session ([`EventClass`]).
//!
//! Plain's schema changes by version and each webhook target is pinned to its own, so
//! parsing reads only what threadgate needs and never rejects a delivery for its
//! `webhookTargetVersion`, an unknown event type or a field it does not know. Only the
//! envelope fields below are required; everything derived from `payload` is optional
//! and simply absent when the payload has another shape.

use chrono::DateTime;
use serde_json::{Map, Value};

use crate::ids::{InvalidId, ThreadId};

/// What threadgate reads from one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Plain's event id (`pEv_…`): the same on every retry, the idempotency key.
    pub id: String,
    /// The event type (`thread.email_received`, ...), from the envelope's `type`.
    pub event_type: String,
    /// When the event happened (`timestamp`), in unix milliseconds.
    pub occurred_at_ms: i64,
    /// The Plain workspace (`workspaceId`), when present.
    pub workspace_id: Option<String>,
    /// When this delivery attempt was made
    /// (`webhookMetadata.webhookDeliveryAttemptTimestamp`), in unix milliseconds.
    pub attempt_at_ms: i64,
    /// `payload.thread.id`, for thread events: parsed here, so a delivery whose thread
    /// id could not name a branch or a directory is refused before anything is stored.
    pub thread_id: Option<ThreadId>,
    /// `payload.thread.status`: the thread's status after the event (for
    /// `thread.thread_status_transitioned`, the new status).
    pub thread_status: Option<String>,
    /// `payload.thread.customer`, for thread events.
    pub customer: Option<Customer>,
    /// Who caused the event, from the actor field that fits its type.
    pub actor: ActorKind,
}

/// The customer a thread belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Customer {
    /// Plain's customer id (`c_…`).
    pub id: String,
    /// The customer's email address, when the payload has one.
    pub email: Option<String>,
}

/// The kind of actor behind an event, from Plain's `actorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ActorKind {
    /// A customer (`customer`, or `deletedCustomer` on emails).
    Customer,
    /// A person in the support workspace (`user`).
    User,
    /// An API key's machine user (`machineUser`): threadgate itself, or another bot.
    MachineUser,
    /// Plain itself (`system`), e.g. the email inbound handler creating a thread.
    System,
    /// Absent, `UNKNOWN`, or an actor type this version of threadgate does not know.
    Unknown,
}

impl ActorKind {
    /// Maps Plain's `actorType` value.
    pub fn from_actor_type(actor_type: &str) -> ActorKind {
        match actor_type {
            "customer" | "deletedCustomer" => ActorKind::Customer,
            "user" => ActorKind::User,
            "machineUser" => ActorKind::MachineUser,
            "system" => ActorKind::System,
            _ => ActorKind::Unknown,
        }
    }

    /// The name stored in the `events.actor` column.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What an event means for the thread's session. Stored by name in `events.class`
/// (`as_str`, read back with `FromStr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum EventClass {
    /// A customer-side message or a new thread: starts the thread's session or feeds
    /// the running one.
    Customer,
    /// The thread moved to `DONE`: ends its session.
    Done,
    /// Another known thread event a running session may read (notes, replies sent,
    /// other status changes, assignment, labels, ...). Starts nothing.
    Info,
    /// Recorded only: unknown types, events without a thread, and events a machine user
    /// caused (threadgate's own replies and notes coming back).
    Ignored,
}

impl EventClass {
    /// The name stored in the `events.class` column.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why a body is not a usable envelope. Messages name the offending field.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// The body is not JSON at all.
    #[error("body is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The body is JSON but not an object.
    #[error("body is not a JSON object")]
    NotObject,
    /// A required envelope field is absent or null.
    #[error("missing field {0}")]
    Missing(&'static str),
    /// A required envelope field has the wrong type or format.
    #[error("invalid field {field}: expected {expected}")]
    Invalid {
        field: &'static str,
        expected: &'static str,
    },
    /// An id field that is not an id of its kind.
    #[error("invalid field {field}: {error}")]
    InvalidId {
        field: &'static str,
        #[source]
        error: InvalidId,
    },
}

/// Event types in which a customer writes to the thread (or opens it).
const CUSTOMER_TYPES: &[&str] = &[
    "thread.thread_created",
    "thread.email_received",
    "thread.chat_received",
    "thread.slack_message_received",
    "thread.ms_teams_message_received",
    "thread.discord_message_received",
];

/// Other thread events a running session may want to read.
const INFO_TYPES: &[&str] = &[
    "thread.thread_assignment_transitioned",
    "thread.email_sent",
    "thread.chat_sent",
    "thread.slack_message_sent",
    "thread.slack_message_updated",
    "thread.ms_teams_message_sent",
    "thread.discord_message_sent",
    "thread.discord_message_updated",
    "thread.note_created",
    "thread.note_mention_created",
    "thread.thread_labels_changed",
    "thread.thread_priority_changed",
    "thread.thread_field_created",
    "thread.thread_field_updated",
    "thread.thread_field_deleted",
    "thread.service_level_agreement_status_transitioned",
    "thread.thread_tenant_updated",
    "thread.thread_locked",
];

const STATUS_TRANSITIONED: &str = "thread.thread_status_transitioned";

impl Envelope {
    /// Reads the envelope from a delivery's raw body.
    pub fn parse(body: &[u8]) -> Result<Envelope, EnvelopeError> {
        let root: Value = serde_json::from_slice(body).map_err(EnvelopeError::NotJson)?;
        let root = root.as_object().ok_or(EnvelopeError::NotObject)?;
        let id = required_str(root.get("id"), "id")?;
        let event_type = required_str(root.get("type"), "type")?;
        let occurred_at_ms = required_time(root.get("timestamp"), "timestamp")?;
        let attempt_at_ms = required_time(
            root.get("webhookMetadata")
                .and_then(|m| m.get("webhookDeliveryAttemptTimestamp")),
            "webhookMetadata.webhookDeliveryAttemptTimestamp",
        )?;
        let workspace_id = optional_str(root.get("workspaceId"));
        let payload = root.get("payload").and_then(Value::as_object);
        let thread = payload
            .and_then(|p| p.get("thread"))
            .and_then(Value::as_object);
        let thread_id = thread
            .and_then(|t| optional_str(t.get("id")))
            .map(ThreadId::parse)
            .transpose()
            .map_err(|error| EnvelopeError::InvalidId {
                field: "payload.thread.id",
                error,
            })?;
        let thread_status = thread.and_then(|t| optional_str(t.get("status")));
        let customer = thread
            .and_then(|t| t.get("customer"))
            .and_then(parse_customer);
        let actor = payload.map_or(ActorKind::Unknown, |p| actor_of(&event_type, p));
        Ok(Envelope {
            id,
            event_type,
            occurred_at_ms,
            workspace_id,
            attempt_at_ms,
            thread_id,
            thread_status,
            customer,
            actor,
        })
    }

    /// What this event means for the thread's session.
    ///
    /// Machine-user events are ignored (threadgate's own replies and notes come back as
    /// webhooks), with one exception: a transition to `DONE` ends the session whoever
    /// made it, since it starts and feeds nothing and a session must not outlive its
    /// thread. The actor is otherwise not required to be a customer: a new thread's
    /// actor is often `system`.
    pub fn class(&self) -> EventClass {
        if self.thread_id.is_none() {
            return EventClass::Ignored;
        }
        let event_type = self.event_type.as_str();
        if event_type == STATUS_TRANSITIONED && self.thread_status.as_deref() == Some("DONE") {
            return EventClass::Done;
        }
        if self.actor == ActorKind::MachineUser {
            return EventClass::Ignored;
        }
        if CUSTOMER_TYPES.contains(&event_type) {
            EventClass::Customer
        } else if event_type == STATUS_TRANSITIONED || INFO_TYPES.contains(&event_type) {
            EventClass::Info
        } else {
            EventClass::Ignored
        }
    }
}

/// Finds the actor that caused an event of `event_type`: the message's author for
/// messages and notes, `statusChangedBy` for a status change, the thread's creator for
/// a new thread, and the thread's last updater for other thread changes.
fn actor_of(event_type: &str, payload: &Map<String, Value>) -> ActorKind {
    let field = |object: &str, key: &str| payload.get(object).and_then(|o| o.get(key));
    let actor = match event_type {
        "thread.thread_created" => field("thread", "createdBy"),
        STATUS_TRANSITIONED => field("thread", "statusChangedBy")
            .filter(|a| !a.is_null())
            .or_else(|| field("thread", "updatedBy")),
        "thread.email_received" | "thread.email_sent" => field("email", "createdBy"),
        "thread.chat_received" | "thread.chat_sent" => field("chat", "createdBy"),
        "thread.slack_message_received" | "thread.slack_message_sent" => {
            field("slackMessage", "createdBy")
        }
        "thread.slack_message_updated" => field("slackMessage", "updatedBy"),
        "thread.discord_message_received" | "thread.discord_message_sent" => {
            field("discordMessage", "createdBy")
        }
        "thread.discord_message_updated" => field("discordMessage", "updatedBy"),
        "thread.ms_teams_message_received" | "thread.ms_teams_message_sent" => {
            field("msTeamsMessage", "createdBy")
        }
        "thread.note_created" => field("note", "createdBy"),
        t if t.starts_with("customer.") => {
            field("customer", "updatedBy").or_else(|| field("previousCustomer", "updatedBy"))
        }
        _ => field("thread", "updatedBy"),
    };
    actor
        .and_then(|a| a.get("actorType"))
        .and_then(Value::as_str)
        .map_or(ActorKind::Unknown, ActorKind::from_actor_type)
}

fn parse_customer(value: &Value) -> Option<Customer> {
    let id = optional_str(value.get("id"))?;
    let email = optional_str(value.get("email").and_then(|e| e.get("email")));
    Some(Customer { id, email })
}

fn optional_str(value: Option<&Value>) -> Option<String> {
    value
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn required_str(value: Option<&Value>, field: &'static str) -> Result<String, EnvelopeError> {
    match value {
        None | Some(Value::Null) => Err(EnvelopeError::Missing(field)),
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(_) => Err(EnvelopeError::Invalid {
            field,
            expected: "a non-empty string",
        }),
    }
}

fn required_time(value: Option<&Value>, field: &'static str) -> Result<i64, EnvelopeError> {
    let invalid = EnvelopeError::Invalid {
        field,
        expected: "an RFC 3339 date-time",
    };
    match value {
        None | Some(Value::Null) => Err(EnvelopeError::Missing(field)),
        Some(Value::String(s)) => DateTime::parse_from_rfc3339(s)
            .map(|t| t.timestamp_millis())
            .map_err(|_| invalid),
        Some(_) => Err(invalid),
    }
}
