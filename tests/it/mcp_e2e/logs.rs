//! Issue 17, item 9: with the most verbose logging (`RUST_LOG=trace`, as the harness
//! captures it through threadgate's own subscriber), an MCP call refused for carrying
//! a stored secret, a read whose answer holds the customer's email and a held call
//! leave neither the secret nor the email anywhere in the logs (rmcp logs raw requests
//! and results at debug and trace).

use serde_json::json;

use super::client::{body, call, connect};
use crate::support::logs::captured_text;
use crate::support::world::World;

const SECRET: &str = "mcp-log-probe-secret-7d41c9e2b05a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_or_email_reaches_the_logs_at_trace() {
    let world = World::new().await;
    world.store_secret("mcp_log_probe", SECRET).await;
    let app = world.start().await;
    let email = "mcp-log-probe-8c1e@example.com";
    let ada = world.customer_session(&app, email, &[5000]).await;
    let client = connect(&ada.session.socket, false).await;

    let refused = call(
        &client,
        "helpdesk.add_note",
        json!({"text": format!("the key is {SECRET}")}),
    )
    .await;
    assert_eq!(
        body(&refused)["error"],
        "secret_in_arguments",
        "{refused:?}"
    );
    let read = call(&client, "stripe.get_customer", json!({"customer": ada.id})).await;
    assert_eq!(body(&read)["status"], "ok", "{read:?}");
    assert!(
        body(&read).to_string().contains(email),
        "the answer holds the email"
    );
    let held = call(
        &client,
        "stripe.create_refund",
        json!({"charge": ada.charges[0], "amount": 1000, "reason": "requested_by_customer",
               "diagnosis": format!("customer {email} asks")}),
    )
    .await;
    assert_eq!(body(&held)["status"], "pending_approval", "{held:?}");
    let thread = ada.session.thread_id.clone();
    client.cancel().await.expect("close");
    app.stop().await;

    let logs = captured_text();
    assert!(logs.contains(&thread), "this session's lines were captured");
    assert!(!logs.contains(SECRET), "the secret is in the logs");
    assert!(!logs.contains(email), "the email is in the logs");
}
