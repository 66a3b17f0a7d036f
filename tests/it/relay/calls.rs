//! A call through the relay is answered as the same call on the session's unix socket:
//! run, hold, block and out-of-scope, the long poll, the agent and tool listings.

use std::time::{Duration, Instant};

use serde_json::json;

use super::stable;
use crate::support::relay::{RelaySetup, RunningRelay};
use crate::support::world::World;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_through_the_relay_is_answered_as_on_the_unix_socket() {
    let mut world = World::new().await;
    let tls = world.use_relay();
    let app = world.start().await;
    let (ada, bob) = world.ada_and_bob(&app).await;
    let relay = RunningRelay::start(
        &app,
        world.dir.path(),
        "ada",
        RelaySetup::minted(&app, &tls.ca_file, &ada.session),
    )
    .await;
    let (socket, pod) = (&ada.session, relay.session(&ada.session));
    let charge = &ada.charges[0];

    // Each call once on the socket and once through the relay: the same answer.
    let calls = [
        ("run", "stripe.get_charge", json!({"charge": charge}), 200),
        (
            "block",
            "stripe.delete_customer",
            json!({"customer": ada.id}),
            403,
        ),
        (
            "out of scope",
            "stripe.get_charge",
            json!({"charge": bob.charges[0]}),
            403,
        ),
    ];
    for (what, tool, args, want) in calls {
        let (status, direct) = socket.call(tool, args.clone(), None).await;
        assert_eq!(status, want, "{what} on the socket: {direct}");
        let (status, relayed) = pod.call(tool, args, None).await;
        assert_eq!(status, want, "{what} through the relay: {relayed}");
        assert_eq!(stable(relayed), stable(direct), "{what}");
    }

    // A hold: the same call through the relay is the same held call of the same session.
    let held = socket.hold_refund(charge, 1200).await;
    let args = json!({"charge": charge, "amount": 1200, "reason": "requested_by_customer"});
    let (status, again) = pod.call("stripe.create_refund", args, None).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(again["execution_id"], held.as_str(), "{again}");
    assert_eq!(again["status"], "pending_approval");

    // The long poll waits its time through the relay and answers as on the socket.
    let started = Instant::now();
    let waited = pod.wait(&held, 1).await;
    assert!(started.elapsed() >= Duration::from_millis(900), "{waited}");
    assert_eq!(waited, socket.wait(&held, 0).await);

    for path in ["/v1/agent", "/v1/tools", "/v1/events?after=0"] {
        let (direct_status, direct) = socket.get(path).await;
        let (relayed_status, relayed) = pod.get(path).await;
        assert_eq!(
            (relayed_status, &relayed),
            (direct_status, &direct),
            "{path}"
        );
    }

    // Every call the relay carried was recorded as the session's own.
    let rows = app.executions().await;
    let relayed: Vec<_> = rows
        .iter()
        .filter(|r| r.session_id == ada.session.id)
        .collect();
    assert_eq!(
        relayed.len(),
        5,
        "two reads, two blocks and one hold: {rows:?}"
    );
    assert!(rows.iter().all(|r| r.session_id != bob.session.id));
    relay.stop().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_connection_the_gateway_closed_does_not_carry_a_call() {
    let mut world = World::new().await;
    let tls = world.use_relay();
    // The gateway closes an idle connection after a second: the relay's warm
    // connection (kept up to four) goes stale while it waits.
    world.settings.server.header_timeout = Duration::from_secs(1);
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let relay = RunningRelay::start(
        &app,
        world.dir.path(),
        "ada",
        RelaySetup::minted(&app, &tls.ca_file, &ada.session),
    )
    .await;
    let pod = relay.session(&ada.session);
    for round in 0..3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (status, body) = pod
            .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
            .await;
        assert_eq!(status, 200, "round {round}: {body}");
    }
    relay.stop().await;
    app.stop().await;
}
