//! Operating threadgate: the Prometheus endpoint moves with a webhook, a call and a
//! decision; `/readyz` names what is not ready; log lines carry the thread, session
//! and execution ids of the spans they happened in.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::app::TestApp;
use crate::support::logs::captured_logs;
use crate::support::plain::{email_received, plain_id};
use crate::support::world::World;

/// `GET /metrics` on the app's metrics listener.
async fn scrape(app: &TestApp) -> String {
    let addr = app.metrics_addr.expect("the metrics listener is on");
    let response = app
        .http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("scrape");
    assert_eq!(response.status(), 200);
    let kind = response.headers()["content-type"].to_str().unwrap_or("");
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    response.text().await.expect("metrics text")
}

/// The value of one series (`name{labels}` exactly as rendered), 0 when absent.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// A world whose app serves metrics on an ephemeral port.
async fn metered_world() -> World {
    let mut world = World::new().await;
    world.settings.telemetry.metrics_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    world
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_moves_with_a_webhook_a_call_and_a_decision() {
    let world = metered_world().await;
    let app = world.start().await;
    let before = scrape(&app).await;
    let stored = "threadgate_webhook_deliveries_total{outcome=\"stored\",reason=\"none\"}";
    let duplicate = "threadgate_webhook_deliveries_total{outcome=\"duplicate\",reason=\"none\"}";
    let bad_signature =
        "threadgate_webhook_deliveries_total{outcome=\"refused\",reason=\"signature\"}";
    let ran = "threadgate_tool_calls_total{tool=\"stripe.get_charge\",decision=\"ran\"}";
    let held = "threadgate_tool_calls_total{tool=\"stripe.create_refund\",decision=\"held\"}";
    let stripe_calls = "threadgate_connector_seconds_count{provider=\"stripe\"}";
    let approved = "threadgate_approvals_total{outcome=\"approved\"}";
    let starts = "threadgate_session_starts_total{result=\"ok\"}";
    let commits = "threadgate_db_commit_seconds_count{result=\"ok\"}";
    let answered = "threadgate_webhook_answer_seconds_count{outcome=\"stored\"}";

    let email = "ada@example.com";
    let customer = world.stripe.create_customer(email).await;
    let charge = world.stripe.create_charge(&customer, 5000, "usd").await;
    let (thread, plain_customer) = (plain_id("th"), plain_id("c"));
    let session = world
        .open_session(&app, &thread, &plain_customer, email)
        .await;
    // A second email is stored, its redelivery is a duplicate, a forged one refused.
    let again = email_received(&thread, &plain_customer, email);
    assert_eq!(app.send_webhook(&again).await, 200);
    assert_eq!(app.send_webhook(&again).await, 200);
    let forged = app
        .http
        .post(format!("http://{}/webhooks/plain", app.addr))
        .header("Plain-Request-Signature", "0".repeat(64))
        .body(again.clone())
        .send()
        .await
        .expect("forged webhook");
    assert_eq!(forged.status(), 401);

    let (status, body) = session
        .call("stripe.get_charge", json!({"charge": charge}), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let args = json!({"charge": charge, "amount": 1000, "reason": "requested_by_customer"});
    let (status, hold) = session.call("stripe.create_refund", args, None).await;
    assert_eq!(status, 202, "{hold}");
    let id = hold["execution_id"]
        .as_str()
        .expect("execution id")
        .to_owned();

    let waiting = scrape(&app).await;
    assert_eq!(value(&waiting, "threadgate_held_calls"), 1.0, "{waiting}");
    assert_eq!(
        value(&waiting, "threadgate_sessions{state=\"running\"}"),
        1.0,
        "{waiting}"
    );
    // The held call queued a note for Plain; the outbox may have sent it already.
    assert!(
        waiting.contains("\nthreadgate_note_outbox_backlog "),
        "{waiting}"
    );

    let alice = app.add_reviewer("alice").await;
    let (status, body) = app.decide(&id, &alice, "approve", "ok").await;
    assert_eq!(status, 200, "{body}");
    let done = session.wait(&id, 20).await;
    assert_eq!(done["status"], "ok", "{done}");

    let after = scrape(&app).await;
    let moved = |series: &str| value(&after, series) - value(&before, series);
    assert!(moved(stored) >= 2.0, "{stored}: {after}");
    assert!(moved(duplicate) >= 1.0, "{duplicate}: {after}");
    assert!(moved(bad_signature) >= 1.0, "{bad_signature}: {after}");
    assert!(moved(answered) >= 2.0, "{answered}: {after}");
    assert_eq!(moved(ran), 1.0, "{ran}: {after}");
    assert_eq!(moved(held), 1.0, "{held}: {after}");
    // The read, the completion's charge lookup and the approved refund reached Stripe.
    assert!(moved(stripe_calls) >= 2.0, "{stripe_calls}: {after}");
    assert_eq!(moved(approved), 1.0, "{approved}: {after}");
    assert!(moved(starts) >= 1.0, "{starts}: {after}");
    assert!(moved(commits) >= 1.0, "{commits}: {after}");
    assert_eq!(value(&after, "threadgate_held_calls"), 0.0, "{after}");

    // Never on the people's listener, never on a session socket.
    let people = app
        .http
        .get(format!("http://{}/metrics", app.addr))
        .send()
        .await
        .expect("people's listener");
    assert_eq!(people.status(), 404);
    let (status, _) = session.get("/metrics").await;
    assert_eq!(status, 404);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_off_by_default() {
    let world = World::new().await;
    let app = world.start().await;
    assert_eq!(app.metrics_addr, None);
    app.stop().await;
}

async fn readyz(app: &TestApp) -> (u16, Value) {
    let response = app
        .http
        .get(format!("http://{}/readyz", app.addr))
        .send()
        .await
        .expect("readyz");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_missing_image_and_a_database_that_does_not_commit() {
    let mut world = World::new().await;
    world.settings.telemetry.ready_timeout = Duration::from_millis(300);
    let app = world.start().await;
    let health = app
        .http
        .get(format!("http://{}/healthz", app.addr))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    let health: Value = health.json().await.expect("JSON");
    assert_eq!(health, json!({"status": "ok"}));

    let (status, body) = readyz(&app).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ready");
    assert_eq!(body["failed"], json!([]));

    world.sandbox.remove_image(&world.settings.sandbox.image);
    let (status, body) = readyz(&app).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["failed"], json!(["sandbox_image"]), "{body}");
    let error = body["checks"]["sandbox_image"]["error"]
        .as_str()
        .unwrap_or("");
    assert!(error.contains("threadgate-sandbox:latest"), "{body}");

    // Another process holds the database's write lock: writes cannot commit.
    let path = world.settings.database_path();
    let locker = std::thread::spawn(move || {
        let conn = threadgate::store::rusqlite::Connection::open(path).expect("open");
        conn.execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        conn
    })
    .join()
    .expect("locker");
    let (status, body) = readyz(&app).await;
    assert_eq!(status, 503, "{body}");
    let failed = body["failed"].as_array().cloned().unwrap_or_default();
    assert!(failed.contains(&json!("database")), "{body}");
    let error = body["checks"]["database"]["error"].as_str().unwrap_or("");
    assert!(error.contains("300ms"), "{body}");
    assert_eq!(body["checks"]["policy"]["ok"], true, "{body}");
    drop(locker);
    // With the lock gone the writer commits again (its queued writes first).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = readyz(&app).await;
        let failed = body["failed"].as_array().cloned().unwrap_or_default();
        if !failed.contains(&json!("database")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{body}");
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_carry_the_thread_session_and_execution_ids() {
    let world = World::new().await;
    let app = world.start().await;
    let thread = plain_id("th");
    let session = world
        .open_session(&app, &thread, &plain_id("c"), "lin@example.com")
        .await;
    let (status, body) = session
        .call("helpdesk.get_thread", json!({"thread_id": thread}), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let execution = body["execution_id"]
        .as_str()
        .expect("execution id")
        .to_owned();
    // supervisor → stop: the session's stop, with both ids.
    app.supervisor
        .stop(&threadgate::ids::ThreadId::parse(thread.as_str()).expect("thread id"))
        .await
        .expect("stop");
    let stopped = format!("session_id={}", session.id);
    crate::support::wait::eventually("the session stop is logged", || {
        let stopped = stopped.clone();
        async move {
            String::from_utf8_lossy(&captured_logs()).lines().any(|l| {
                l.contains("session_stop{")
                    && l.contains(&stopped)
                    && l.contains("session stop finished")
            })
        }
    })
    .await;
    app.stop().await;

    let logs = String::from_utf8_lossy(&captured_logs()).into_owned();
    let lines: Vec<&str> = logs.lines().collect();
    let with = |needles: &[&str]| {
        lines
            .iter()
            .find(|l| needles.iter().all(|n| l.contains(n)))
            .copied()
    };
    let thread_field = format!("thread_id={thread}");
    let session_field = format!("session_id={}", session.id);
    let execution_field = format!("execution_id={execution}");
    // intake: the stored event, inside the intake span naming its thread.
    assert!(
        with(&["webhook_intake{", &thread_field, "webhook event stored"]).is_some(),
        "no intake line for {thread}"
    );
    // supervisor → start: the session start, with both ids.
    assert!(
        with(&[
            "session_start{",
            &thread_field,
            &session_field,
            "session start finished"
        ])
        .is_some(),
        "no session start line for {thread}"
    );
    // socket → gate → connector: the provider's answer, with all three ids.
    assert!(
        with(&[
            "connector_call{",
            &thread_field,
            &session_field,
            &execution_field,
            "provider answered"
        ])
        .is_some(),
        "no connector line for {execution}"
    );
    // → audit: the answer to the agent names the execution.
    assert!(
        with(&[
            &thread_field,
            &session_field,
            &execution_field,
            "tool call answered"
        ])
        .is_some(),
        "no answer line for {execution}"
    );
}
