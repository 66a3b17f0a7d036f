//! Refused deliveries are logged with their reason (and the event id once known), and
//! the logs never carry the signing secret or the delivery's body. A binary of its own
//! because it installs the process-wide tracing subscriber.

#![expect(
    clippy::indexing_slicing,
    reason = "test code: an index out of range is a failed test"
)]
#![expect(
    clippy::expect_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]

#[path = "it/support/mod.rs"]
pub mod support;

use serde_json::json;

use support::intake::spawn_intake;
use threadgate::webhook::sign;

const SECRET: &str = "whsec-logging-secret-4f1c";
const NOW_MS: i64 = 1_709_728_631_577;
const BODY_MARKER: &str = "customer-private-text-9d2e";

fn delivery(id: &str, attempt: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id,
        "type": "thread.email_received",
        "timestamp": "2024-03-06T12:37:10.228Z",
        "webhookMetadata": { "webhookDeliveryAttemptTimestamp": attempt },
        "payload": { "thread": { "id": "th_log" }, "email": { "textContent": BODY_MARKER } },
    }))
    .expect("json")
}

#[tokio::test]
async fn refusals_are_logged_with_their_reason_and_without_secrets_or_bodies() {
    support::logs::capture_logs();

    let app = spawn_intake(SECRET.as_bytes(), NOW_MS, |_| {}).await;
    let (client, url) = (&app.client, &app.url);
    let post = |body: Vec<u8>, signature: String| {
        client
            .post(url)
            .header("Plain-Request-Signature", signature)
            .body(body)
            .send()
    };

    let fresh = delivery("pEv_fresh", "2024-03-06T12:37:11.577Z");
    let wrong = sign(b"not the secret", &fresh);
    assert_eq!(
        post(fresh.clone(), wrong).await.expect("send").status(),
        401
    );
    let stale = delivery("pEv_stale", "2024-03-06T12:00:00.000Z");
    let signature = sign(SECRET.as_bytes(), &stale);
    assert_eq!(post(stale, signature).await.expect("send").status(), 401);
    let signature = sign(SECRET.as_bytes(), &fresh);
    assert_eq!(post(fresh, signature).await.expect("send").status(), 200);

    let logs = support::logs::captured_text();
    let refusals: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("webhook delivery refused"))
        .collect();
    assert_eq!(refusals.len(), 2, "{logs}");
    assert!(refusals[0].contains("does not match the body"), "{logs}");
    assert!(refusals[1].contains("pEv_stale"), "{logs}");
    assert!(refusals[1].contains("beyond the 300 s window"), "{logs}");
    assert!(!logs.contains(SECRET), "{logs}");
    assert!(!logs.contains(BODY_MARKER), "{logs}");
}
