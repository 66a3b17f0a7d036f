//! MCP on the session socket: the gateway's tools, decided by the same gate, for any
//! agent harness in the sandbox that speaks MCP (revision 2026-07-28: stateless
//! streamable HTTP at `POST /mcp`, `server/discover`, `MCP-Protocol-Version`, `Origin`
//! refused when present), built on the official SDK, `rmcp`.
//!
//! - `tools/list`: the tools the agent's grant and the policy leave callable (as
//!   `GET /v1/tools`), in the catalog's order, with JSON input schemas and annotations
//!   from their risk classes, then `threadgate_wait`.
//! - `tools/call`: [`Gate::call_to_the_end`] with the socket's scope, exactly as
//!   `POST /v1/calls` (a client that hangs up does not cut the call). A held call
//!   answers `pending_approval` (execution id and approval link in `_meta` and in the
//!   text); a client that declares URL-mode elicitation also gets it as an
//!   input request pointing at the approval page, whose sealed `requestState`
//!   ([`state`]) redeems once for the call's result.
//! - `threadgate_wait`: waits on an execution of this session, never past its expiry
//!   (`[mcp] wait_default` when not told), sending progress notifications while it
//!   waits to a client that gave a progress token. A wait (and a redeemed request
//!   state's) ends when its client hangs up (rmcp cancels the request), and a session
//!   has at most as many at once as it may have calls under way (`too_many_waits`).
//! - A tool name the catalog does not have is JSON-RPC error -32602 (invalid params),
//!   as the MCP specification asks; a known tool the gate refuses is an error result.
//!
//! The socket's one `Host` check ([`crate::gateway::host`]) stands in front of `/mcp`
//! as of every other route; rmcp's own is off, so there is one list.
//!
//! Inside the container a harness reaches this at `http://127.0.0.1:PORT/mcp` through
//! the runner's bridge (`threadgate-agent-runner`).

mod handler;
mod settings;
pub mod state;
pub mod tools;

use std::sync::Arc;

use axum::Router;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use crate::gateway::slots::SessionSlots;
use crate::gateway::{Gate, SandboxRouter};
use crate::secrets::SealingKey;
use crate::session::SessionScope;

pub use handler::SessionTools;
pub use settings::McpSettings;
pub use state::StateSealer;

/// The longest one `threadgate_wait` call waits.
pub const MAX_WAIT_SECONDS: u64 = 300;
/// The largest MCP request body read.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// The path the MCP endpoint is served at, on the socket and on the runner's bridge.
pub const MCP_PATH: &str = "/mcp";

/// The MCP server shared by every session's socket.
pub struct McpServer {
    pub gate: Arc<Gate>,
    pub sealer: StateSealer,
    pub settings: McpSettings,
    /// The waits under way, by session: under the same caps as the gate's calls
    /// under way (twice the socket's connection cap a session, as the socket's and the
    /// relayed connections are capped apart, so an agent that waits on every
    /// connection it may open never meets it).
    pub waits: Arc<SessionSlots>,
}

impl McpServer {
    /// An MCP server over `gate`, sealing request states under `key` (derived from the
    /// master key with [`crate::secrets::SealPurpose::McpRequestState`], so every
    /// instance opens every other's) and remembering redeemed ones in the gate's
    /// database.
    pub fn new(gate: Arc<Gate>, settings: McpSettings, key: SealingKey) -> McpServer {
        let (per_session, in_all) = gate.call_caps();
        McpServer {
            sealer: StateSealer::new(key, gate.db().clone(), settings.max_redeemed_per_session),
            gate,
            settings,
            waits: Arc::new(SessionSlots::with_caps(per_session, in_all)),
        }
    }
}

impl SandboxRouter for Arc<McpServer> {
    fn router(&self, scope: SessionScope) -> Router {
        let tools = SessionTools::new(self.clone(), scope);
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_sse_keep_alive(None)
            // The socket's one `Host` check (`gateway::host`) is in front of every route.
            .disable_allowed_hosts()
            // No browser has a business here: any `Origin` is refused with 403.
            .enforce_origin_validation()
            .with_max_request_body_bytes(MAX_REQUEST_BYTES);
        let service = StreamableHttpService::new(
            move || Ok(tools.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        );
        Router::new().route_service(MCP_PATH, service)
    }
}

/// The tool-call routes of the sandbox API together with the MCP endpoint: what the
/// sandbox API's `calls` slot serves.
pub struct CallsWithMcp {
    pub gate: Arc<Gate>,
    pub mcp: Arc<McpServer>,
}

impl CallsWithMcp {
    /// REST tool calls and MCP over the same gate; `key` seals MCP's request states.
    pub fn new(gate: Arc<Gate>, settings: McpSettings, key: SealingKey) -> CallsWithMcp {
        CallsWithMcp {
            mcp: Arc::new(McpServer::new(gate.clone(), settings, key)),
            gate,
        }
    }
}

impl SandboxRouter for CallsWithMcp {
    fn router(&self, scope: SessionScope) -> Router {
        self.gate
            .router(scope.clone())
            .merge(self.mcp.router(scope))
    }
}
