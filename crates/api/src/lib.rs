//! The sandbox API on the wire: every request and answer that crosses a session's
//! socket between threadgate and the agent in the container, as serde types.
//!
//! The server builds its answers from these types and the agent runner reads them as
//! these types, so a renamed or retyped field fails to compile on both sides instead
//! of reading as a missing key. Field names, tags and `null`s are those the API has
//! always sent; each type has a round-trip test and a fixed sample in
//! `tests/round_trip.rs` that pins its JSON.
//!
//! Plain structs keep their fields in the byte order of their JSON keys, so they
//! serialise exactly as the untyped maps they replace did.

pub mod agent;
pub mod calls;
pub mod chat;
pub mod checkpoint;
pub mod error;
pub mod events;
pub mod executions;
pub mod tools;

pub use agent::{AgentLimits, AgentView, HarnessView, SkillView};
pub use calls::{Blocked, CallAnswer, CallRequest, Failed, Held, Ran};
pub use chat::{
    ChatAnswer, ChatChoice, ChatMessage, ChatRequest, FunctionCall, Role, ToolCall, Transcript,
};
pub use checkpoint::CheckpointAnswer;
pub use error::{ErrorAnswer, ErrorBody};
pub use events::{EventsPage, FeedEvent};
pub use executions::{ExecutionStatus, ExecutionView};
pub use tools::{ToolArg, ToolEntry, ToolListing};
