//! threadgate's integration tests, one binary: each module below was a test binary of
//! its own. One binary links the library and the shared `support` harness once.
//! Three stay apart: `webhook_logging` (it asserts on the process-wide log subscriber's
//! whole output), `otlp_export` (built with `--features otlp`) and `demo_e2e` (it mounts
//! the demo example's modules, written for a crate root of their own, and starts itself
//! again as the demo's process).

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]
#![expect(
    clippy::indexing_slicing,
    reason = "test code: an index out of range is a failed test"
)]

pub mod support;

mod agent_e2e;
mod agents_lint;
mod audit_log;
mod audit_pg;
mod call_counts;
mod connectors_github;
mod connectors_helpdesk;
mod connectors_stripe;
mod gateway_e2e;
mod instances;
mod instances_approvals;
mod instances_pg;
mod mcp_e2e;
mod model_proxy;
mod ops_cli;
mod pg_store;
mod pg_tls;
mod policy_cli;
mod relay;
mod review_cli;
mod review_web;
mod sandbox_docker;
mod scripted_model_cli;
mod secrets_redact;
mod secrets_store;
mod sessions_docker;
mod sessions_docker_pool;
mod webhook_intake;
mod workspace_git;
