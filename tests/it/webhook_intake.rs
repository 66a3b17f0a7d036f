//! `POST /webhooks/plain` end to end: the real router on a loopback port, a temporary
//! SQLite file, a fixed clock, and Plain's own example payloads and test vectors.

use crate::support;

use serde_json::{Value, json};

use support::intake::{EventRow, IntakeApp, spawn_intake};
use support::plain::{example, examples_dir};
use threadgate::ids::ThreadId;
use threadgate::store::Db;
use threadgate::webhook::{EventClass, IntakeConfig, StoredEvent, sign, verify_signature};

const SECRET: &[u8] = b"whsec-test-secret";
/// The fixed "now" for synthetic deliveries: 2024-03-06T12:37:11.577Z.
const NOW_MS: i64 = 1_709_728_631_577;

async fn spawn_app(now_ms: i64) -> IntakeApp {
    spawn_intake(SECRET, now_ms, |_| {}).await
}

/// A synthetic `thread.email_received` delivery built from Plain's example.
fn email_delivery(event_id: &str, thread_id: &str, attempt_ms: i64) -> Value {
    let mut value: Value =
        serde_json::from_slice(&example("email-received.json")).expect("example json");
    value["id"] = json!(event_id);
    value["payload"]["thread"]["id"] = json!(thread_id);
    value["webhookMetadata"]["webhookDeliveryAttemptTimestamp"] = json!(rfc3339(attempt_ms));
    value
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("valid time")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("serialize")
}

#[test]
fn plain_signature_test_vectors_verify() {
    let dir = examples_dir();
    let vectors: Value =
        serde_json::from_slice(&example("signature-test-vectors.json")).expect("vectors");
    let vectors = vectors["vectors"].as_array().expect("vector list");
    assert!(!vectors.is_empty());
    for vector in vectors {
        let secret = vector["secret"].as_str().expect("secret").as_bytes();
        let body = match (vector["body_file"].as_str(), vector["body_utf8"].as_str()) {
            (Some(file), _) => std::fs::read(dir.join(file)).expect("body file"),
            (None, Some(text)) => text.as_bytes().to_vec(),
            (None, None) => panic!("vector without a body: {vector}"),
        };
        let expected = vector["expected_signature"].as_str().expect("signature");
        assert_eq!(sign(secret, &body), expected);
        assert_eq!(verify_signature(secret, &body, Some(expected)), Ok(()));
        let mut flipped = expected.to_owned().into_bytes();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).expect("ascii");
        assert!(verify_signature(secret, &body, Some(&flipped)).is_err());
    }
}

struct Expected {
    file: &'static str,
    class: EventClass,
    thread_id: Option<&'static str>,
    thread_status: Option<&'static str>,
    customer: Option<(&'static str, &'static str)>,
    actor: &'static str,
}

#[tokio::test]
async fn every_plain_example_is_accepted_with_its_class() {
    const THREAD: &str = "th_01HR9VZR2VZT8GJAEY61VSJB0V";
    const JOHN: (&str, &str) = ("c_01HGX4W7D6ACNX5HAC5AYAZK94", "help@example.com");
    let peter = ("c_01HD44FHDPG82VQ4QNHDR4N2T0", "peter@example.com");
    let created = |file| Expected {
        file,
        class: EventClass::Customer,
        thread_id: Some("th_01HD44FHMCDSSWE38N14FSYV6K"),
        thread_status: Some("TODO"),
        customer: Some(peter),
        actor: "system",
    };
    let cases = [
        created("thread-created.json"),
        created("thread-created.body.compact.json"),
        Expected {
            file: "email-received.json",
            class: EventClass::Customer,
            thread_id: Some("th_01HR9W9147XGMZWYF9D030XJ9J"),
            thread_status: Some("TODO"),
            customer: Some(("c_01H0MHCVC5EGDGY3EJXTHHWTGR", "john@example.com")),
            actor: "customer",
        },
        Expected {
            file: "thread-status-transitioned.json",
            class: EventClass::Done,
            thread_id: Some(THREAD),
            thread_status: Some("DONE"),
            customer: Some(JOHN),
            actor: "user",
        },
        Expected {
            file: "thread-assignment-transitioned.json",
            class: EventClass::Info,
            thread_id: Some(THREAD),
            thread_status: Some("DONE"),
            customer: Some(JOHN),
            actor: "user",
        },
        Expected {
            file: "customer-created.json",
            class: EventClass::Ignored,
            thread_id: None,
            thread_status: None,
            customer: None,
            actor: "system",
        },
        // Schema-invalid (`user` where `thread` belongs), but every envelope field we
        // need is there: accepted and recorded, and with no thread it is ignored.
        Expected {
            file: "invalid-thread-status-transitioned.json",
            class: EventClass::Ignored,
            thread_id: None,
            thread_status: None,
            customer: None,
            actor: "unknown",
        },
    ];
    for case in cases {
        let body = example(case.file);
        let value: Value = serde_json::from_slice(&body).expect("json");
        let attempt = value["webhookMetadata"]["webhookDeliveryAttemptTimestamp"]
            .as_str()
            .expect("attempt timestamp");
        let attempt_ms = chrono::DateTime::parse_from_rfc3339(attempt)
            .expect("rfc3339")
            .timestamp_millis();
        let mut app = spawn_app(attempt_ms + 2_000).await;

        let (status, answer) = app.post_signed(body).await;

        assert_eq!(status, 200, "{}: {answer}", case.file);
        assert_eq!(answer["status"], "stored", "{}", case.file);
        let rows = app.rows().await;
        let expected = EventRow {
            event_id: value["id"].as_str().expect("id").to_owned(),
            event_type: value["type"].as_str().expect("type").to_owned(),
            class: case.class.as_str().to_owned(),
            thread_id: case.thread_id.map(str::to_owned),
            thread_status: case.thread_status.map(str::to_owned),
            customer_id: case.customer.map(|c| c.0.to_owned()),
            customer_email: case.customer.map(|c| c.1.to_owned()),
            actor: case.actor.to_owned(),
        };
        assert_eq!(rows, vec![expected], "{}", case.file);
        let notified = app.notifications();
        match case.thread_id {
            Some(thread_id) if case.class != EventClass::Ignored => assert_eq!(
                notified,
                vec![StoredEvent {
                    seq: answer["seq"].as_i64().expect("seq"),
                    thread_id: ThreadId::parse(thread_id).expect("thread id"),
                    class: case.class,
                }],
                "{}",
                case.file
            ),
            _ => assert_eq!(notified, vec![], "{}", case.file),
        }
    }
}

#[tokio::test]
async fn missing_wrong_or_malformed_signatures_are_401_and_store_nothing() {
    let mut app = spawn_app(NOW_MS).await;
    let body = bytes(&email_delivery("pEv_sig", "th_sig", NOW_MS));
    let wrong = sign(b"another secret", &body);
    for signature in [
        None,
        Some(wrong),
        Some("not-hex".to_owned()),
        Some(String::new()),
    ] {
        let (status, answer) = app.post(body.clone(), signature.clone()).await;
        assert_eq!(status, 401, "{signature:?}: {answer}");
    }
    assert_eq!(app.row_count().await, 0);
    assert_eq!(app.notifications(), vec![]);
}

#[tokio::test]
async fn the_signature_is_checked_before_the_body_is_parsed() {
    let app = spawn_app(NOW_MS).await;
    let (status, _) = app.post(b"{not json".to_vec(), None).await;
    assert_eq!(status, 401);
    // Plain's second vector: a valid signature over a body that is not JSON.
    let (status, answer) = app.post_signed(b"hello-world".to_vec()).await;
    assert_eq!(status, 400);
    assert!(
        answer["message"]
            .as_str()
            .expect("message")
            .contains("JSON"),
        "{answer}"
    );
    assert_eq!(app.row_count().await, 0);
}

#[tokio::test]
async fn a_missing_envelope_field_is_400_naming_it() {
    let app = spawn_app(NOW_MS).await;
    let mut value = email_delivery("pEv_missing", "th_missing", NOW_MS);
    value["webhookMetadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("webhookDeliveryAttemptTimestamp");
    let (status, answer) = app.post_signed(bytes(&value)).await;
    assert_eq!(status, 400);
    assert_eq!(answer["error"], "invalid_envelope");
    assert_eq!(
        answer["message"],
        "missing field webhookMetadata.webhookDeliveryAttemptTimestamp"
    );
    let mut value = email_delivery("pEv_missing", "th_missing", NOW_MS);
    value["id"] = json!(42);
    let (status, answer) = app.post_signed(bytes(&value)).await;
    assert_eq!(status, 400);
    assert_eq!(
        answer["message"],
        "invalid field id: expected a non-empty string"
    );
    assert_eq!(app.row_count().await, 0);
}

#[tokio::test]
async fn a_thread_id_that_cannot_name_a_branch_is_400_naming_the_field_and_stores_nothing() {
    let mut app = spawn_app(NOW_MS).await;
    for (n, bad) in ["../outside", "a/b", "-rf", "x.lock", "th 1"]
        .iter()
        .enumerate()
    {
        let value = email_delivery(&format!("pEv_bad{n}"), bad, NOW_MS);
        let (status, answer) = app.post_signed(bytes(&value)).await;
        assert_eq!(status, 400, "{bad:?}: {answer}");
        assert_eq!(answer["error"], "invalid_envelope", "{bad:?}");
        let message = answer["message"].as_str().expect("message");
        assert!(
            message.starts_with("invalid field payload.thread.id: invalid thread id"),
            "{bad:?}: {message}"
        );
    }
    assert_eq!(app.row_count().await, 0);
    assert_eq!(app.notifications(), vec![]);
    // The same delivery with a good thread id is stored: only the id was refused.
    let (status, _) = app
        .post_signed(bytes(&email_delivery("pEv_bad0", "th_good", NOW_MS)))
        .await;
    assert_eq!(status, 200);
    assert_eq!(app.row_count().await, 1);
}

#[tokio::test]
async fn deliveries_outside_the_window_are_refused_and_store_nothing() {
    let mut app = spawn_app(NOW_MS).await;
    for (id, attempt) in [
        ("pEv_old", NOW_MS - 301_000),
        ("pEv_future", NOW_MS + 301_000),
    ] {
        let (status, answer) = app
            .post_signed(bytes(&email_delivery(id, "th_window", attempt)))
            .await;
        assert_eq!(status, 401, "{id}: {answer}");
    }
    // Just inside the window either way.
    for (id, attempt) in [
        ("pEv_edge1", NOW_MS - 300_000),
        ("pEv_edge2", NOW_MS + 300_000),
    ] {
        let (status, _) = app
            .post_signed(bytes(&email_delivery(id, "th_window", attempt)))
            .await;
        assert_eq!(status, 200, "{id}");
    }
    let ids: Vec<String> = app.rows().await.into_iter().map(|r| r.event_id).collect();
    assert_eq!(ids, vec!["pEv_edge1", "pEv_edge2"]);
    assert_eq!(app.notifications().len(), 2);
}

#[tokio::test]
async fn a_retry_with_a_new_body_and_signature_is_stored_and_notified_once() {
    let mut app = spawn_app(NOW_MS).await;
    let first = email_delivery("pEv_retry", "th_retry", NOW_MS - 60_000);
    let mut retry = email_delivery("pEv_retry", "th_retry", NOW_MS);
    retry["webhookMetadata"]["webhookDeliveryAttemptNumber"] = json!(2);
    retry["webhookMetadata"]["webhookDeliveryAttemptId"] = json!("whAttempt_second");
    assert_ne!(bytes(&first), bytes(&retry));

    let (status, answer) = app.post_signed(bytes(&first)).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("stored")));
    let (status, answer) = app.post_signed(bytes(&retry)).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("duplicate"))
    );

    assert_eq!(app.row_count().await, 1);
    assert_eq!(app.notifications().len(), 1);
    let stored: String = app
        .db
        .read(|c| c.query_row("SELECT body FROM events", (), |r| r.get(0)))
        .await
        .expect("body");
    assert_eq!(
        stored.as_bytes(),
        bytes(&first),
        "the first delivery's body is kept"
    );
}

#[tokio::test]
async fn unknown_event_types_are_stored_as_ignored_and_not_notified() {
    let mut app = spawn_app(NOW_MS).await;
    let mut value = email_delivery("pEv_unknown", "th_unknown", NOW_MS);
    value["type"] = json!("thread.something_plain_adds_later");
    value["payload"]["eventType"] = json!("thread.something_plain_adds_later");
    value["webhookMetadata"]["webhookTargetVersion"] = json!("2099-12-31");
    let (status, answer) = app.post_signed(bytes(&value)).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("stored")));
    let rows = app.rows().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].class, "ignored");
    assert_eq!(rows[0].event_type, "thread.something_plain_adds_later");
    assert_eq!(app.notifications(), vec![]);
}

#[tokio::test]
async fn a_machine_user_event_is_stored_as_ignored_and_not_notified() {
    let mut app = spawn_app(NOW_MS).await;
    let mut value = email_delivery("pEv_bot", "th_bot", NOW_MS);
    value["type"] = json!("thread.email_sent");
    value["payload"]["email"]["createdBy"] =
        json!({ "actorType": "machineUser", "machineUserId": "mu_01H0MHCVC5EGDGY3EJXTHHWTGR" });
    let (status, _) = app.post_signed(bytes(&value)).await;
    assert_eq!(status, 200);
    let rows = app.rows().await;
    assert_eq!(
        (rows[0].class.as_str(), rows[0].actor.as_str()),
        ("ignored", "machine_user")
    );
    assert_eq!(app.notifications(), vec![]);
}

#[tokio::test]
async fn an_oversized_body_is_413_and_stores_nothing() {
    let app = spawn_app(NOW_MS).await;
    let mut value = email_delivery("pEv_big", "th_big", NOW_MS);
    value["payload"]["email"]["textContent"] =
        json!("x".repeat(IntakeConfig::DEFAULT_MAX_BODY_BYTES));
    let (status, _) = app.post_signed(bytes(&value)).await;
    assert_eq!(status, 413);
    assert_eq!(app.row_count().await, 0);
}

#[tokio::test]
async fn the_body_limit_holds_for_chunked_bodies_and_false_lengths() {
    let app = spawn_intake(SECRET, NOW_MS, |c| c.max_body_bytes = 4096).await;
    let mut value = email_delivery("pEv_chunked", "th_chunked", NOW_MS);
    value["payload"]["email"]["textContent"] = json!("y".repeat(8192));
    let body = bytes(&value);
    let signature = sign(SECRET, &body);

    // Chunked: no Content-Length to check up front.
    let mut chunked = Vec::new();
    for chunk in body.chunks(1000) {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(chunk);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let head = format!(
        "POST /webhooks/plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Plain-Request-Signature: {signature}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    assert_eq!(app.raw_status(&head, &chunked).await, 413);

    // A Content-Length far larger than what is sent: refused once the limit is passed.
    let head = format!(
        "POST /webhooks/plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Plain-Request-Signature: {signature}\r\nContent-Length: 100000000\r\n\r\n"
    );
    assert_eq!(app.raw_status(&head, &body).await, 413);
    assert_eq!(app.row_count().await, 0);
}

#[tokio::test]
async fn two_hundred_concurrent_deliveries_are_each_stored_once() {
    let mut app = spawn_app(NOW_MS).await;
    let app_ref = &app;
    let answers = futures::future::join_all((0..200).map(|i| async move {
        let value = email_delivery(&format!("pEv_c{i}"), &format!("th_c{}", i % 17), NOW_MS);
        app_ref.post_signed(bytes(&value)).await
    }))
    .await;
    assert!(
        answers
            .iter()
            .all(|(status, a)| *status == 200 && a["status"] == "stored")
    );
    assert_eq!(app.row_count().await, 200);
    let mut seqs: Vec<i64> = app.notifications().iter().map(|e| e.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), 200);
}

#[tokio::test]
async fn fifty_concurrent_copies_of_one_event_are_stored_once() {
    let mut app = spawn_app(NOW_MS).await;
    let app_ref = &app;
    let answers = futures::future::join_all((0..50).map(|i| async move {
        // Each copy is a distinct attempt: different body, different signature.
        let value = email_delivery("pEv_same", "th_same", NOW_MS - i * 1000);
        app_ref.post_signed(bytes(&value)).await
    }))
    .await;
    assert!(answers.iter().all(|(status, _)| *status == 200));
    let stored = answers
        .iter()
        .filter(|(_, a)| a["status"] == "stored")
        .count();
    assert_eq!(stored, 1);
    assert_eq!(app.row_count().await, 1);
    assert_eq!(app.notifications().len(), 1);
}

#[tokio::test]
async fn an_acknowledged_event_is_readable_from_a_fresh_open_of_the_file() {
    let app = spawn_app(NOW_MS).await;
    let (status, _) = app
        .post_signed(bytes(&email_delivery("pEv_durable", "th_durable", NOW_MS)))
        .await;
    assert_eq!(status, 200);
    let fresh = Db::open(&app.db_path).expect("reopen");
    let (event_id, thread_id): (String, String) = fresh
        .read(|c| {
            c.query_row("SELECT event_id, thread_id FROM events", (), |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
        })
        .await
        .expect("row");
    assert_eq!(
        (event_id.as_str(), thread_id.as_str()),
        ("pEv_durable", "th_durable")
    );
}
