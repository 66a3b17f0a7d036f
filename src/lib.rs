//! threadgate: an orchestrator that lets an AI support agent work a customer's thread
//! end to end while a person keeps the last word on anything that moves money or
//! changes an account.
//!
//! `ARCHITECTURE.md` at the repository root maps these modules and the path a webhook
//! and a tool call take through them.

pub mod api_error;
pub mod app;
pub mod approvals;
pub mod audit;
pub mod cli;
pub mod clock;
pub mod config;
pub mod connectors;
pub mod executions;
pub mod gateway;
pub mod health;
pub mod ids;
pub mod mcp;
pub mod metrics;
pub mod model;
pub mod money;
pub mod notes;
pub mod relay;
/// The policy engine, a crate of its own (`crates/policy`) so its purity is checked by
/// the compiler: re-exported here so `threadgate::policy` stays its path.
pub use threadgate_policy as policy;
pub mod retry;
pub mod review;
pub mod reviewers;
pub mod sandbox;
pub mod secrets;
pub mod server;
pub mod session;
pub mod store;
pub mod tasks;
pub mod telemetry;
pub mod webhook;
pub mod workspace;
