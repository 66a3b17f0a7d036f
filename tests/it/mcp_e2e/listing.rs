//! Issue 17, items 16 and 18: `tools/list` tells an MCP client's model what
//! `GET /v1/tools` tells the built-in runner's; an unknown tool is JSON-RPC error
//! -32602; `/mcp` and the REST API answer to the same `Host` names.

use rmcp::ServiceError;
use rmcp::model::{CallToolRequestParams, ErrorCode};
use serde_json::{Map, Value, json};

use super::client::{connect, raw_request};
use crate::support::world::World;

/// An argument's JSON schema as the built-in runner makes it from its `/v1/tools`
/// entry (`threadgate-agent-runner`'s `tools.rs`): the type, then the description and
/// values as listed.
fn runner_schema(arg: &Value) -> Value {
    let mut schema = match arg["type"].as_str() {
        Some("string") => json!({"type": "string"}),
        Some("integer") => json!({"type": "integer"}),
        Some("boolean") => json!({"type": "boolean"}),
        Some("array of strings") => json!({"type": "array", "items": {"type": "string"}}),
        other => panic!("unknown type {other:?}"),
    };
    for key in ["description", "enum"] {
        if !arg[key].is_null() {
            schema[key] = arg[key].clone();
        }
    }
    schema
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_list_describes_every_tool_and_argument_as_v1_tools_does() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let client = connect(&ada.session.socket, false).await;
    let listed = client.list_all_tools().await.expect("tools/list");
    let (status, rest) = ada.session.get("/v1/tools").await;
    assert_eq!(status, 200);
    let rest = rest["tools"].as_array().expect("tools").clone();
    assert!(!rest.is_empty());
    let mut described_args = 0;
    for tool in &rest {
        let name = tool["name"].as_str().expect("name");
        let mcp = listed
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} is not in tools/list"));
        let own = tool["description"]
            .as_str()
            .expect("every tool is described");
        let said = mcp.description.as_deref().unwrap_or_default();
        assert!(
            said.starts_with(&format!("{own} ")),
            "{name}: MCP says {said:?}, /v1/tools {own:?}"
        );
        let schema = Value::Object((*mcp.input_schema).clone());
        let mut expected = Map::new();
        let mut required = Vec::new();
        for arg in tool["args"].as_array().expect("args") {
            let arg_name = arg["name"].as_str().expect("arg name");
            expected.insert(arg_name.to_owned(), runner_schema(arg));
            if arg["required"] == json!(true) {
                required.push(arg_name);
            }
            described_args += usize::from(arg["description"].is_string());
        }
        let mut properties = schema["properties"]
            .as_object()
            .expect("properties")
            .clone();
        let diagnosis = properties.remove("diagnosis").expect("diagnosis");
        assert_eq!(diagnosis["type"], "string");
        assert_eq!(Value::Object(properties), Value::Object(expected), "{name}");
        assert_eq!(schema["required"], json!(required), "{name}");
    }
    assert!(described_args > 0);
    let refund = listed
        .iter()
        .find(|t| t.name == "stripe.create_refund")
        .expect("refund");
    assert_eq!(
        refund.input_schema["properties"]["reason"]["enum"],
        json!(["duplicate", "fraudulent", "requested_by_customer"])
    );
    client.cancel().await.expect("close");
    app.stop().await;
}

/// A name the catalog does not have is invalid params (-32602), as the MCP
/// specification asks; a known tool the gate refuses stays an error result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_tool_is_json_rpc_error_invalid_params() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let client = connect(&ada.session.socket, true).await;
    let Value::Object(args) = json!({"amount": 1}) else {
        unreachable!()
    };
    let asked = client
        .call_tool_once(CallToolRequestParams::new("stripe.mint_money").with_arguments(args))
        .await;
    match asked {
        Err(ServiceError::McpError(e)) => {
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{e:?}");
            assert!(e.message.contains("stripe.mint_money"), "{e:?}");
        }
        other => panic!("expected a JSON-RPC error: {other:?}"),
    }
    let (status, rest) = ada
        .session
        .call("stripe.mint_money", json!({"amount": 1}), None)
        .await;
    assert_eq!(
        (status, rest["error"].as_str()),
        (404, Some("unknown_tool"))
    );
    client.cancel().await.expect("close");
    app.stop().await;
}

/// One `Host` check for the whole socket: what the REST API answers to, `/mcp` answers
/// to, and what one refuses the other refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_and_rest_answer_to_the_same_hosts() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let socket = &ada.session.socket;
    let discover =
        json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }}})
        .to_string();
    let statuses = |host: String| {
        let discover = discover.clone();
        async move {
            let host_line = if host.is_empty() {
                String::new()
            } else {
                format!("Host: {host}\r\n")
            };
            let (rest, _) = raw_request(socket, "GET /v1/tools", &host_line, "").await;
            let headers = format!(
                "{host_line}Content-Type: application/json\r\nAccept: application/json, \
                 text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: server/discover\r\n"
            );
            let (mcp, text) = raw_request(socket, "POST /mcp", &headers, &discover).await;
            (rest, mcp, text)
        }
    };
    for host in [
        "threadgate",
        "sandbox",
        "localhost",
        "127.0.0.1:7345",
        "[::1]",
        "[::1]:7345",
    ] {
        let (rest, mcp, text) = statuses(host.to_owned()).await;
        assert_eq!((rest, mcp), (200, 200), "Host: {host}: {text}");
    }
    for host in ["evil.example", "127.0.0.1.evil.example:7345", ""] {
        let (rest, mcp, text) = statuses(host.to_owned()).await;
        assert_eq!((rest, mcp), (403, 403), "Host: {host:?}: {text}");
        assert!(text.contains("host_not_allowed"), "{text}");
    }
    app.stop().await;
}
