//! Issue 12: MCP on the session socket. rmcp's client lists the gated tools, runs a
//! read, gets a refund held, waits, and receives the result after a reviewer's
//! approval; scope and secret refusals are the REST path's; URL-mode elicitation's
//! sealed request state is good once, for its own call and session. The first tests run
//! threadgate with the fake sandbox (the client talks to the session socket from the
//! test); `in_container` runs the client inside a real sandbox container, behind the
//! runner's bridge.
//!
//! Needs `.venv-peers` (`scripts/localstripe.sh setup`); `in_container` also needs
//! Docker and the sandbox image (see `tests/agent_e2e.rs`).

#[path = "support/github_stub.rs"]
mod github_stub;
#[path = "support/localstripe.rs"]
mod localstripe;
#[path = "support/plain_fake.rs"]
mod plain_fake;

#[path = "gateway_e2e/harness.rs"]
mod harness;
#[path = "gateway_e2e/unix_http.rs"]
mod unix_http;

#[path = "mcp_e2e/client.rs"]
mod client;
#[path = "mcp_e2e/elicitation.rs"]
mod elicitation;
#[path = "mcp_e2e/gated.rs"]
mod gated;
#[path = "agent_e2e/support.rs"]
mod support;

#[path = "mcp_e2e/in_container.rs"]
mod in_container;
