//! `GET /v1/events?after=N&wait=S`: a page of the thread's feed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A page of the feed: the events after the asked position, and where the next page
/// starts (the last event's position, or the asked one when the page is empty).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventsPage<E = Value> {
    pub events: Vec<FeedEvent<E>>,
    pub next: i64,
}

/// One event of the feed. `event` is the webhook's JSON as Plain sent it; the server
/// writes it as stored text (`E` = `serde_json::value::RawValue`), the runner reads it
/// as a [`Value`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedEvent<E = Value> {
    /// Plain's id of the event.
    pub event_id: String,
    /// When it happened, in unix milliseconds.
    pub occurred_at_ms: i64,
    /// The event's place in the thread's feed (1, 2, …).
    pub position: i64,
    /// Plain's event type, e.g. `thread.email_received`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The event as Plain sent it (last, as the feed has always written it).
    pub event: E,
}
