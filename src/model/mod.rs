//! The model proxy on the session socket. The container has no network and no model
//! key: the runner sends OpenAI chat-completions requests to
//! `POST /v1/model/chat/completions` on its socket, and threadgate forwards them to the
//! configured upstream ([`config::Provider`]: OpenAI-compatible, Anthropic Messages,
//! or the [`scripted`] server) with the key from the secrets store.
//!
//! - [`types`]: the one internal message type; [`openai`] and [`anthropic`]: the two
//!   adapters; [`names`]: tool names made wire-safe and mapped back.
//! - [`proxy`]: the checks (only the agent's model, the per-session token budget and
//!   turn cap, the secret scan of every request ([`scan`])), the audit row of each call (tokens,
//!   latency, model; never text) and, when the budget is spent, the note on the
//!   thread ([`budget_note`]) and the session's stop.
//! - [`queue`]: a session's calls one at a time, a bounded number waiting.
//! - [`upstream`]: retries of timeouts, 429s (`Retry-After`) and 5xx; a malformed
//!   answer is an error the runner sees.
//! - [`routes`]: the socket's routes, including `GET`/`PUT /v1/transcript`, the
//!   runner's conversation kept durably per session ([`store`]), scanned for secrets
//!   like a prompt and deleted after `transcript_retention` ([`retention`]).

pub mod anthropic;
pub mod budget_note;
pub mod config;
pub mod names;
pub mod openai;
pub mod proxy;
pub mod queue;
pub mod retention;
pub mod routes;
pub mod scan;
pub mod scripted;
pub mod store;
pub mod types;
pub mod upstream;

pub use config::{ModelSettings, Provider};
pub use proxy::{ModelProxy, ProxyError};
pub use upstream::Upstream;

#[cfg(test)]
mod fence_tests;
#[cfg(test)]
mod tests;
