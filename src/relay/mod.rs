//! The relay: how an agent whose sandbox runs in a pod (no inbound route, egress only
//! to the gateway) reaches its session's gateway service exactly as a Docker
//! container reaches its unix socket.
//!
//! ```text
//! agent ─unix─▶ relay (sidecar, `threadgate relay`) ─TLS, credential─▶ relay listener
//!                                                       ─▶ the session's own router
//! ```
//!
//! - `credential`: the session-bound, short-lived credential a backend mints at start
//!   ([`RelayCredentials::mint`]) and the relay renews.
//! - `listener`: the gateway's TLS listener (`[relay]`, off by default); a verified
//!   connection is served by the very router the session's unix socket serves
//!   (`gateway::SocketHost::service`), so scope, grants, secrets and refusals are the
//!   same; `control`: the relay's own renewal and secrets routes; `pod_workspace`: the
//!   session's workspace carried into its pod and its work back.
//! - `redirect`: a relay that reached an instance not running its session is sent to
//!   the session's lease owner's advertised address.
//! - `client`: relay mode, the sidecar; `wire`: the one-line greeting both speak;
//!   `tls`: rustls configs from PEM files.

pub mod client;
pub mod control;
pub mod credential;
pub mod listener;
pub mod pod_workspace;
pub mod redirect;
pub mod settings;
pub mod tls;
pub mod wire;

pub use client::{Relay, RelayOptions};
pub use control::RelayParts;
pub use credential::{CredentialError, RelayCredentials, Verified};
pub use listener::start;
pub use pod_workspace::PodWorkspaces;
pub use redirect::Redirects;
pub use settings::RelaySettings;
