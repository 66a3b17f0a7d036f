//! rmcp's own client on a session's socket (or on the runner's bridge), as an agent
//! harness would use it, and a raw HTTP request for what a client never sends.

use std::path::Path;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    ElicitationCapability, Implementation, ProgressNotificationParam, ProtocolVersion,
    UrlElicitationCapability,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt as _, NotificationContext, RunningService,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt as _};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A connected MCP client.
pub(crate) type Client = RunningService<RoleClient, ClientConfig>;

/// A client of revision 2026-07-28 (`server/discover`, no handshake) over the session
/// socket at `socket`; `url_elicitation` declares URL-mode elicitation.
pub(crate) async fn connect(socket: &Path, url_elicitation: bool) -> Client {
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    config(url_elicitation)
        .serve_with_lifecycle(transport(socket), lifecycle)
        .await
        .expect("the MCP client connects")
}

/// A client of revision 2026-07-28 whose progress notifications arrive on the
/// answered channel.
pub(crate) async fn connect_with_progress(
    socket: &Path,
) -> (
    RunningService<RoleClient, ProgressRecorder>,
    tokio::sync::mpsc::UnboundedReceiver<ProgressNotificationParam>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let recorder = ProgressRecorder {
        config: config(false),
        seen: tx,
    };
    let client = recorder
        .serve_with_lifecycle(transport(socket), lifecycle)
        .await
        .expect("the MCP client connects");
    (client, rx)
}

/// A client handler that passes on every progress notification.
pub(crate) struct ProgressRecorder {
    config: ClientConfig,
    seen: tokio::sync::mpsc::UnboundedSender<ProgressNotificationParam>,
}

impl ClientHandler for ProgressRecorder {
    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.seen.send(params);
    }
}

/// A client of an earlier revision (the `initialize` handshake).
pub(crate) async fn connect_legacy(socket: &Path, url_elicitation: bool) -> Client {
    config(url_elicitation)
        .with_protocol_version(ProtocolVersion::V_2025_11_25)
        .serve(transport(socket))
        .await
        .expect("the MCP client connects")
}

fn transport(
    socket: &Path,
) -> StreamableHttpClientTransport<rmcp::transport::UnixSocketHttpClient> {
    StreamableHttpClientTransport::from_unix_socket(
        socket.to_str().expect("utf-8 socket path"),
        "http://threadgate/mcp",
    )
}

fn config(url_elicitation: bool) -> ClientConfig {
    let mut caps = ClientCapabilities::default();
    if url_elicitation {
        caps.elicitation =
            Some(ElicitationCapability::new().with_url(UrlElicitationCapability::new()));
    }
    ClientConfig::new(caps, Implementation::new("threadgate-mcp-test", "0.1.0"))
}

/// One `tools/call` without MRTR rounds.
pub(crate) async fn call_once(client: &Client, tool: &str, args: Value) -> CallToolResponse {
    let Value::Object(args) = args else {
        panic!("arguments must be an object");
    };
    client
        .call_tool_once(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .expect("tools/call answers")
}

/// One `tools/call` that must complete; answers its result.
pub(crate) async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    match call_once(client, tool, args).await {
        CallToolResponse::Complete(r) => r,
        other => panic!("{tool}: expected a complete result, got {other:?}"),
    }
}

/// Asks over MCP for a refund of `amount` on `charge` that the shipped policy holds
/// (`requested_by_customer`) and answers the held execution's id; panics unless it is
/// held.
pub(crate) async fn held_refund(client: &Client, charge: &str, amount: u64) -> String {
    let args =
        serde_json::json!({"charge": charge, "amount": amount, "reason": "requested_by_customer"});
    let held = body(&call(client, "stripe.create_refund", args).await);
    assert_eq!(held["status"], "pending_approval", "{held}");
    held["execution_id"].as_str().expect("id").to_owned()
}

/// The structured content of a result.
pub(crate) fn body(result: &CallToolResult) -> Value {
    result.structured_content.clone().unwrap_or(Value::Null)
}

/// The text of a result's first content block.
pub(crate) fn text(result: &CallToolResult) -> String {
    result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_default()
}

/// A raw `POST /mcp` with `extra_headers`; answers the status code and the text.
pub(crate) async fn raw_post(socket: &Path, extra_headers: &str, body: &str) -> (u16, String) {
    let headers = format!(
        "Host: threadgate\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         {extra_headers}"
    );
    raw_request(socket, "POST /mcp", &headers, body).await
}

/// A raw HTTP/1.1 request (`line` is its method and path) with `headers` (each ending
/// in CRLF, `Host` included when wanted); answers the status code and the text.
pub(crate) async fn raw_request(
    socket: &Path,
    line: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect");
    let request = format!(
        "{line} HTTP/1.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // The server may answer (413) and close before a large body is all written.
    let _ = stream.write_all(request.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}
