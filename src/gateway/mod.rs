//! The gateway: everything a session's sandbox can reach, served on the session's own
//! unix socket. Tool calls go through the policy gate here and run with credentials
//! the agent never sees.

pub mod answers;
mod complete;
mod decide;
mod fresh;
pub mod gate;
pub mod holds;
pub mod host;
mod outcome;
mod prepare;
pub mod rate;
mod read_call;
pub mod refusal;
pub mod routes;
mod run;
pub mod sandbox_api;
mod scope;
pub mod sending;
pub mod session_labels;
pub mod slots;
pub mod socket;
mod summary;
pub mod tool_docs;
pub mod wait;

pub(crate) use decide::SqlHistory;
pub use gate::{CallReply, CallRequest, Connectors, Gate, GateParts, LoadedPolicy, policy_name};
pub use prepare::PreparedCall;
pub use refusal::Refusal;
pub use sandbox_api::SandboxApi;
pub use socket::{SOCKET_NAME, SandboxRouter, SessionService, SocketHost};
pub(crate) use summary::{HELD_BY, phrase as call_phrase};
