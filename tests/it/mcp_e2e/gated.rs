//! The gated tools over MCP, against the session socket.

use serde_json::{Value, json};

use super::client::{body, call, connect, held_refund, raw_post, text};
use crate::support::plain::plain_id;
use crate::support::world::{STRIPE_KEY, World, refunds};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_listed_with_schemas_and_annotations_in_a_stable_order() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let client = connect(&ada.session.socket, false).await;
    let tools = client.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    // The REST listing decides which tools (grant and policy); MCP adds the wait tool.
    let (status, listing) = ada.session.get("/v1/tools").await;
    assert_eq!(status, 200);
    let mut expected: Vec<String> = listing["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("name").to_owned())
        .collect();
    expected.push("threadgate_wait".into());
    assert_eq!(names, expected);
    assert!(
        !names.contains(&"stripe.delete_customer"),
        "blocked outright: not listed"
    );
    let again = client.list_all_tools().await.expect("tools/list");
    let again: Vec<&str> = again.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, again, "stable order");

    let tool = |name: &str| tools.iter().find(|t| t.name == name).expect(name).clone();
    let read = tool("stripe.list_charges");
    let hints = read.annotations.expect("annotations");
    assert_eq!(hints.read_only_hint, Some(true));
    assert_eq!(hints.destructive_hint, Some(false));
    let refund = tool("stripe.create_refund");
    let hints = refund.annotations.clone().expect("annotations");
    assert_eq!(hints.read_only_hint, Some(false));
    assert_eq!(hints.destructive_hint, Some(true), "money moves");
    let schema = Value::Object((*refund.input_schema).clone());
    assert_eq!(schema["required"], json!(["charge"]));
    assert_eq!(schema["properties"]["amount"]["type"], "integer");
    assert_eq!(schema["additionalProperties"], false);
    let note = tool("helpdesk.add_note").annotations.expect("annotations");
    assert_eq!(
        note.destructive_hint,
        Some(false),
        "a note is a write, not money"
    );
    client.cancel().await.expect("close");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_runs_and_a_held_refund_returns_its_result_after_approval() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let client = connect(&ada.session.socket, false).await;

    let listed = call(&client, "stripe.list_charges", json!({"customer": ada.id})).await;
    assert_eq!(listed.is_error, Some(false), "{listed:?}");
    let listed = body(&listed);
    assert_eq!(listed["status"], "ok", "{listed}");
    assert!(listed.to_string().contains(&ada.charges[0]), "{listed}");

    let args = json!({"charge": ada.charges[0], "amount": 1000, "reason": "requested_by_customer",
        "diagnosis": "the customer asks for a goodwill refund"});
    let held = call(&client, "stripe.create_refund", args).await;
    let shown = body(&held);
    assert_eq!(shown["status"], "pending_approval", "{shown}");
    let id = shown["execution_id"]
        .as_str()
        .expect("execution id")
        .to_owned();
    let url = shown["approval_url"]
        .as_str()
        .expect("approval url")
        .to_owned();
    assert!(url.contains(&id), "{url}");
    let meta = &held.meta.as_ref().expect("_meta").0;
    assert_eq!(meta["threadgate/execution_id"], json!(id));
    assert_eq!(meta["threadgate/approval_url"], json!(url));
    let said = text(&held);
    assert!(
        said.contains(&id) && said.contains(&url) && said.contains("threadgate_wait"),
        "{said}"
    );
    assert!(refunds(&world.stripe).await.is_empty(), "nothing ran");
    let row = app.execution(&id).await;
    assert_eq!(row.status, "held");

    let pending = call(
        &client,
        "threadgate_wait",
        json!({"execution_id": id, "timeout_seconds": 1}),
    )
    .await;
    assert_eq!(body(&pending)["status"], "pending_approval");

    let waiter = {
        let client_socket = ada.session.socket.clone();
        let id = id.clone();
        tokio::spawn(async move {
            let c = connect(&client_socket, false).await;
            let r = call(
                &c,
                "threadgate_wait",
                json!({"execution_id": id, "timeout_seconds": 30}),
            )
            .await;
            let _ = c.cancel().await;
            r
        })
    };
    let alice = app.add_reviewer("alice").await;
    let (status, decided) = app.decide(&id, &alice, "approve", "fine").await;
    assert_eq!(status, 200, "{decided}");
    let done = waiter.await.expect("waiter");
    let done = body(&done);
    assert_eq!(done["status"], "ok", "{done}");
    assert_eq!(done["result"]["amount"], 1000, "{done}");
    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 1);
    assert_eq!(made[0]["id"], done["result"]["id"]);

    // An execution of another session is not found, as on REST.
    let other = world
        .customer_session(&app, "bob@example.com", &[700])
        .await;
    let bob = connect(&other.session.socket, false).await;
    let foreign = call(
        &bob,
        "threadgate_wait",
        json!({"execution_id": id, "timeout_seconds": 1}),
    )
    .await;
    assert_eq!(foreign.is_error, Some(true));
    assert_eq!(body(&foreign)["error"], "not_found");
    let _ = bob.cancel().await;
    client.cancel().await.expect("close");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_threads_id_and_a_stored_secret_are_refused_as_on_rest() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let other_thread = plain_id("th");
    world
        .plain
        .add_thread(&other_thread, &plain_id("c"), "bob@example.com");
    let client = connect(&ada.session.socket, false).await;
    let cases = [
        (
            "helpdesk.reply_to_thread",
            json!({"thread_id": other_thread, "text": "Your refund is on its way."}),
        ),
        (
            "helpdesk.add_note",
            json!({"text": format!("use this key: {STRIPE_KEY}")}),
        ),
        (
            "helpdesk.add_note",
            json!({"text": "fine", "diagnosis": format!("found {STRIPE_KEY}")}),
        ),
    ];
    for (tool, args) in cases {
        let (rest_status, rest) = {
            let mut a = args.clone();
            let diagnosis = a.as_object_mut().and_then(|m| m.remove("diagnosis"));
            ada.session
                .call(tool, a, diagnosis.as_ref().and_then(Value::as_str))
                .await
        };
        assert_eq!(rest_status, 403, "{rest}");
        let over_mcp = call(&client, tool, args).await;
        assert_eq!(over_mcp.is_error, Some(true), "{over_mcp:?}");
        let got = body(&over_mcp);
        assert_eq!(got["status"], rest["status"], "{got} vs {rest}");
        assert_eq!(got["message"], rest["message"]);
        assert_eq!(got["http_status"], 403);
        assert!(!got.to_string().contains(STRIPE_KEY), "{got}");
    }
    assert!(world.plain.thread(&other_thread).replies().is_empty());
    let thread = world.plain.thread(&ada.session.thread_id);
    assert!(thread.replies().is_empty() && thread.notes().is_empty());
    client.cancel().await.expect("close");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_an_origin_is_refused_with_403() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let discover =
        json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }}})
        .to_string();
    let socket = &ada.session.socket;
    let method = "Mcp-Method: server/discover\r\n";
    let (status, text) = raw_post(socket, method, &discover).await;
    assert_eq!(status, 200, "the same request without Origin: {text}");
    for origin in ["http://127.0.0.1:8080", "https://evil.example", "null"] {
        let headers = format!("{method}Origin: {origin}\r\n");
        let (status, text) = raw_post(socket, &headers, &discover).await;
        assert_eq!(status, 403, "Origin: {origin}: {text}");
    }
    let (status, _) = raw_post(socket, method, &"[".repeat(2 << 20)).await;
    assert_eq!(status, 413, "a body over the cap");
    app.stop().await;
}

/// A wait ends at the approval's expiry, whatever timeout the agent asks for, and says
/// `expired`; nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_is_bounded_by_the_approvals_ttl() {
    let policy =
        std::fs::read_to_string(crate::support::plain::repo_root().join("policies/support.yaml"))
            .expect("policy")
            .replace("ttl: 4h", "ttl: 2s");
    assert!(policy.contains("ttl: 2s"));
    let world = World::with_policy_text(&policy).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let client = connect(&ada.session.socket, false).await;
    let id = held_refund(&client, &ada.charges[0], 1000).await;
    let started = std::time::Instant::now();
    let waited = call(
        &client,
        "threadgate_wait",
        json!({"execution_id": id, "timeout_seconds": 300}),
    )
    .await;
    assert_eq!(body(&waited)["status"], "expired", "{waited:?}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "ended at the expiry"
    );
    let too_long = call(
        &client,
        "threadgate_wait",
        json!({"execution_id": id, "timeout_seconds": 0}),
    )
    .await;
    assert_eq!(body(&too_long)["error"], "invalid_arguments");
    assert!(refunds(&world.stripe).await.is_empty());
    client.cancel().await.expect("close");
    app.stop().await;
}
