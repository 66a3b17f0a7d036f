//! A `threadgate_wait` whose client hangs up ends there. rmcp runs each request's
//! handler on a task of its own and cancels only the request's token when the
//! connection goes, so a wait that did not watch it ran on to its timeout (up to
//! 300 s, reading the execution every second) with nobody to answer, and an agent that
//! sent waits and hung up could keep any number of them: the socket's connection cap
//! never saw them. Now each wait watches the token, and a session has at most as many
//! at once as it may have calls under way.

use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResponse};
use serde_json::{Value, json};

use super::client::{body, connect, connect_with_progress, held_refund};
use crate::support::logs::captured_text;
use crate::support::wait::eventually_within;
use crate::support::world::World;

/// Waits sent and cut, in all: more than one session may have at once (twice the
/// socket's 32 connections), so were a cut wait still running, the last ones would be
/// refused and the final wait too.
const CUT: usize = 2 * 32 + 6;
/// Waits cut together, in each round.
const AT_ONCE: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_whose_client_hangs_up_ends_and_frees_its_place() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let client = connect(&ada.session.socket, false).await;
    let id = held_refund(&client, &ada.charges[0], 1000).await;
    let ended = || {
        captured_text()
            .lines()
            .filter(|l| {
                l.contains("mcp wait ended: its client hung up") && l.contains(&ada.session.id)
            })
            .count()
    };

    let mut cut = 0;
    while cut < CUT {
        let mut waits = Vec::new();
        for _ in 0..AT_ONCE.min(CUT - cut) {
            let (waiting, mut progress) = connect_with_progress(&ada.session.socket).await;
            let Value::Object(wait_args) = json!({"execution_id": id, "timeout_seconds": 300})
            else {
                unreachable!()
            };
            let params = CallToolRequestParams::new("threadgate_wait").with_arguments(wait_args);
            let task = tokio::spawn(async move { waiting.call_tool_once(params).await });
            // The wait's first progress notification: the server is waiting.
            progress.recv().await.expect("the wait started");
            waits.push(task);
        }
        // The agent hangs up on each: its client, and with it the connection, goes.
        for task in &waits {
            task.abort();
        }
        cut += waits.len();
        eventually_within(
            Duration::from_secs(30),
            &format!("{cut} cut waits ended on the server"),
            || async { ended() == cut },
        )
        .await;
    }

    // A wait sent now is served: no cut wait holds a place.
    let Value::Object(wait_args) = json!({"execution_id": id, "timeout_seconds": 1}) else {
        unreachable!()
    };
    let params = CallToolRequestParams::new("threadgate_wait").with_arguments(wait_args);
    let CallToolResponse::Complete(answer) =
        client.call_tool_once(params).await.expect("tools/call")
    else {
        panic!("a complete result");
    };
    let answer = body(&answer);
    assert_eq!(answer["status"], "pending_approval", "{answer}");
    assert_eq!(app.execution(&id).await.status, "held");
    client.cancel().await.expect("close");
    app.stop().await;
}
