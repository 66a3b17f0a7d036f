//! Issue 12: MCP on the session socket. rmcp's client lists the gated tools, runs a
//! read, gets a refund held, waits, and receives the result after a reviewer's
//! approval; scope and secret refusals are the REST path's; URL-mode elicitation's
//! sealed request state is good once, for its own call and session. The first tests run
//! threadgate with the fake sandbox (the client talks to the session socket from the
//! test); `in_container` runs the client inside a real sandbox container, behind the
//! runner's bridge. Issue 17 (`listing`, `logs`, `progress`): `tools/list` describes
//! tools as `GET /v1/tools` does, an unknown tool is -32602, `/mcp` and REST answer to
//! the same hosts, nothing secret reaches the logs at trace, and a wait reports
//! progress. Issue 19 (`elicitation`): a request state sealed on one instance redeems
//! on the next sharing its database and master key, and one redeemed there is refused;
//! `hang_up`: a wait whose client hangs up ends, and frees its place.
//!
//! Needs `.venv-peers` (`scripts/localstripe.sh setup`); `in_container` also needs
//! Docker and the sandbox image (see `tests/agent_e2e.rs`).

#[path = "mcp_e2e/client.rs"]
pub(crate) mod client;
#[path = "mcp_e2e/elicitation.rs"]
mod elicitation;
#[path = "mcp_e2e/gated.rs"]
mod gated;
#[path = "mcp_e2e/hang_up.rs"]
mod hang_up;
#[path = "mcp_e2e/listing.rs"]
mod listing;
#[path = "mcp_e2e/logs.rs"]
mod logs;
#[path = "mcp_e2e/progress.rs"]
mod progress;

#[path = "mcp_e2e/in_container.rs"]
mod in_container;
