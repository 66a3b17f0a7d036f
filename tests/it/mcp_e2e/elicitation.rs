//! A held call as a URL-mode input request: the approval page to open and a sealed
//! request state that redeems once, for this call and this session only.

use rmcp::model::{CallToolRequestParams, CallToolResponse, InputRequest, InputRequiredResult};
use serde_json::{Value, json};

use super::client::{Client, body, call_once, connect, connect_legacy};
use crate::support::world::{World, refunds};

async fn retry(client: &Client, tool: &str, args: &Value, state: &str) -> Value {
    let Value::Object(args) = args.clone() else {
        panic!("object");
    };
    let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
    params.request_state = Some(state.to_owned());
    params.input_responses = Some(
        [("approval".to_owned(), json!({"action": "accept"}))]
            .into_iter()
            .collect(),
    );
    match client.call_tool_once(params).await.expect("tools/call") {
        CallToolResponse::Complete(r) => {
            let mut b = body(&r);
            b["is_error"] = json!(r.is_error);
            b
        }
        other => panic!("expected a complete result: {other:?}"),
    }
}

fn input_required(r: CallToolResponse) -> InputRequiredResult {
    match r {
        CallToolResponse::InputRequired(r) => r,
        other => panic!("expected input_required: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_is_an_approval_page_and_its_state_is_good_once() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000, 2000])
        .await;
    let bob = world
        .customer_session(&app, "bob@example.com", &[900])
        .await;
    let client = connect(&ada.session.socket, true).await;
    let args = json!({"charge": ada.charges[0], "amount": 1000, "reason": "requested_by_customer"});
    let asked = input_required(call_once(&client, "stripe.create_refund", args.clone()).await);
    let state = asked.request_state.clone().expect("requestState");
    let requests = asked.input_requests.clone().expect("inputRequests");
    let Some(InputRequest::Elicitation(req)) = requests.get("approval") else {
        panic!("an elicitation: {requests:?}");
    };
    let shown = serde_json::to_value(&req.params).expect("json");
    assert_eq!(shown["mode"], "url");
    let meta = &asked.meta.as_ref().expect("_meta").0;
    let id = meta["threadgate/execution_id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(shown["url"], meta["threadgate/approval_url"]);
    assert!(shown["url"].as_str().expect("url").contains(&id));
    assert!(!state.contains(&id), "the state is sealed, not readable");
    assert_eq!(app.execution(&id).await.status, "held");

    // Forged: one character changed; and a string never issued.
    let mut forged = state.clone().into_bytes();
    let i = forged.len() / 2;
    forged[i] = if forged[i] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).expect("ascii");
    for bad in [forged.as_str(), "rs2.abc.def", ""] {
        let got = retry(&client, "stripe.create_refund", &args, bad).await;
        assert_eq!(got["error"], "invalid_request_state", "{bad}: {got}");
        assert_eq!(got["is_error"], true);
    }
    // The state for other arguments (a larger refund) or another session.
    let larger =
        json!({"charge": ada.charges[0], "amount": 5000, "reason": "requested_by_customer"});
    let got = retry(&client, "stripe.create_refund", &larger, &state).await;
    assert_eq!(got["error"], "invalid_request_state", "{got}");
    let bobs = connect(&bob.session.socket, true).await;
    let got = retry(&bobs, "stripe.create_refund", &args, &state).await;
    assert_eq!(got["error"], "invalid_request_state", "{got}");
    let _ = bobs.cancel().await;

    let alice = app.add_reviewer("alice").await;
    let (status, decided) = app.decide(&id, &alice, "approve", "fine").await;
    assert_eq!(status, 200, "{decided}");
    let done = retry(&client, "stripe.create_refund", &args, &state).await;
    assert_eq!(done["status"], "ok", "{done}");
    assert_eq!(done["execution_id"], json!(id));
    assert_eq!(done["result"]["amount"], 1000);
    // Replayed: the same state again.
    let again = retry(&client, "stripe.create_refund", &args, &state).await;
    assert_eq!(again["error"], "invalid_request_state", "{again}");
    assert!(
        again["message"]
            .as_str()
            .expect("message")
            .contains("already used")
    );
    assert_eq!(refunds(&world.stripe).await.len(), 1, "one refund");

    // A client of an earlier revision cannot take an input request: it gets the plain
    // pending result, whatever it declares.
    let legacy = connect_legacy(&ada.session.socket, true).await;
    let other = json!({"charge": ada.charges[1], "amount": 500, "reason": "requested_by_customer"});
    match call_once(&legacy, "stripe.create_refund", other).await {
        CallToolResponse::Complete(r) => assert_eq!(body(&r)["status"], "pending_approval"),
        got => panic!("{got:?}"),
    }
    let _ = legacy.cancel().await;
    client.cancel().await.expect("close");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_returns_the_persons_message_through_the_state() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let client = connect(&ada.session.socket, true).await;
    let args = json!({"charge": ada.charges[0], "amount": 1000, "reason": "requested_by_customer"});
    let asked = input_required(call_once(&client, "stripe.create_refund", args.clone()).await);
    let state = asked.request_state.expect("state");
    let id = asked.meta.expect("meta").0["threadgate/execution_id"].clone();
    let alice = app.add_reviewer("alice").await;
    let message = "Offer a coupon instead.";
    let (status, _) = app
        .decide(id.as_str().expect("id"), &alice, "deny", message)
        .await;
    assert_eq!(status, 200);
    let done = retry(&client, "stripe.create_refund", &args, &state).await;
    assert_eq!(done["status"], "denied", "{done}");
    assert_eq!(done["message"], message);
    assert!(refunds(&world.stripe).await.is_empty());
    client.cancel().await.expect("close");
    app.stop().await;
}

/// Issue 19: request states are sealed under a key derived from the master key and
/// their redemptions kept in the database, so another instance sharing both (here the
/// next one on the same data directory: same key file, same database, nothing of the
/// first one's memory) opens a state the first sealed, and refuses one the first
/// redeemed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_redeemed_on_one_instance_is_refused_on_another() {
    let world = World::new().await;
    let a = world.start().await;
    let ada = world
        .customer_session(&a, "ada@example.com", &[5000, 2000])
        .await;
    let client = connect(&ada.session.socket, true).await;
    let first =
        json!({"charge": ada.charges[0], "amount": 1000, "reason": "requested_by_customer"});
    let second =
        json!({"charge": ada.charges[1], "amount": 500, "reason": "requested_by_customer"});
    let mut asked = Vec::new();
    for args in [&first, &second] {
        let held = input_required(call_once(&client, "stripe.create_refund", args.clone()).await);
        let id = held.meta.as_ref().expect("_meta").0["threadgate/execution_id"]
            .as_str()
            .expect("id")
            .to_owned();
        asked.push((id, held.request_state.expect("requestState")));
    }
    let alice = a.add_reviewer("alice").await;
    for (id, _) in &asked {
        let (status, decided) = a.decide(id, &alice, "approve", "fine").await;
        assert_eq!(status, 200, "{decided}");
    }
    let done = retry(&client, "stripe.create_refund", &first, &asked[0].1).await;
    assert_eq!(done["status"], "ok", "redeemed on a: {done}");
    let _ = client.cancel().await;
    a.stop().await;

    let b = world.start().await;
    let session = world.session_of(&b, &ada.session.thread_id).await;
    let client = connect(&session.socket, true).await;
    let again = retry(&client, "stripe.create_refund", &first, &asked[0].1).await;
    assert_eq!(again["error"], "invalid_request_state", "{again}");
    assert!(
        again["message"]
            .as_str()
            .expect("message")
            .contains("already used"),
        "{again}"
    );
    let done = retry(&client, "stripe.create_refund", &second, &asked[1].1).await;
    assert_eq!(done["status"], "ok", "sealed on a, redeemed on b: {done}");
    assert_eq!(done["execution_id"], json!(asked[1].0));
    let replayed = retry(&client, "stripe.create_refund", &second, &asked[1].1).await;
    assert_eq!(replayed["error"], "invalid_request_state", "{replayed}");
    assert_eq!(refunds(&world.stripe).await.len(), 2, "one refund each");
    client.cancel().await.expect("close");
    b.stop().await;
}
