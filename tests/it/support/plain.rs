//! Plain's side of the tests: the shared directory (Plain's examples, schema and test
//! vectors, the peers), the repository root, Plain-shaped ids, and example deliveries
//! re-aimed at a test's thread. Deliveries are signed with the library's own
//! [`threadgate::webhook::sign`]; there is no second signer here.

use std::path::PathBuf;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

/// The repository root (policies, agents, skills, scripts).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shared directory: `$THREADGATE_SHARED`, else the first `shared/` holding
/// `plain/` beside the repository or one of its parents.
pub fn shared_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("THREADGATE_SHARED") {
        return PathBuf::from(dir);
    }
    let repo = repo_root();
    repo.ancestors()
        .map(|dir| dir.join("shared"))
        .find(|shared| shared.join("plain").is_dir())
        .unwrap_or_else(|| repo.join("../shared"))
}

/// Plain's example directory; panics naming it (and `THREADGATE_SHARED`) when missing.
pub fn examples_dir() -> PathBuf {
    let dir = shared_dir().join("plain/examples");
    assert!(
        dir.is_dir(),
        "{} not found: set THREADGATE_SHARED to the shared directory",
        dir.display()
    );
    dir
}

/// The bytes of one of Plain's example files.
pub fn example(name: &str) -> Vec<u8> {
    let path = examples_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// A unique Plain-shaped id with `prefix` (`th`, `c`, ...).
pub fn plain_id(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        uuid::Uuid::new_v4().simple().to_string().to_uppercase()
    )
}

/// A fresh thread id shaped like Plain's (`th_` + 26 upper-case alphanumerics).
pub fn thread_id() -> String {
    format!(
        "th_{}",
        &uuid::Uuid::new_v4().simple().to_string().to_uppercase()[..26]
    )
}

/// A fresh event id shaped like Plain's.
pub fn event_id() -> String {
    format!(
        "pEv_{}",
        &uuid::Uuid::new_v4().simple().to_string().to_uppercase()[..26]
    )
}

/// `at` as Plain writes timestamps (RFC 3339, milliseconds, `Z`).
pub fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A `thread.email_received` delivery for `thread_id`, built from Plain's example with
/// a fresh event id and timestamps of now.
pub fn email_received(thread_id: &str, customer_id: &str, email: &str) -> Vec<u8> {
    let mut event: Value =
        serde_json::from_slice(&example("email-received.json")).expect("example json");
    let now = rfc3339(Utc::now());
    event["id"] = json!(format!("pEv_{}", uuid::Uuid::new_v4().simple()));
    event["timestamp"] = json!(now);
    event["webhookMetadata"]["webhookDeliveryAttemptTimestamp"] = json!(now);
    let thread = &mut event["payload"]["thread"];
    thread["id"] = json!(thread_id);
    thread["customer"]["id"] = json!(customer_id);
    thread["customer"]["email"]["email"] = json!(email);
    for actor in ["createdBy", "updatedBy", "statusChangedBy"] {
        thread[actor]["customerId"] = json!(customer_id);
    }
    let mail = &mut event["payload"]["email"];
    mail["from"]["email"] = json!(email);
    mail["from"]["emailActor"]["customerId"] = json!(customer_id);
    mail["createdBy"]["customerId"] = json!(customer_id);
    mail["textContent"] = json!("I was charged twice for my order.");
    serde_json::to_vec(&event).expect("serialize")
}

/// One of Plain's example deliveries (`thread-created.json`, `email-received.json`,
/// `thread-status-transitioned.json`) re-aimed at `thread` with a new event id, the
/// event at `at` and the delivery attempt now.
pub fn plain_event(example_name: &str, thread: &str, event: &str, at: DateTime<Utc>) -> Value {
    let mut body: Value = serde_json::from_slice(&example(example_name)).expect("example is JSON");
    body["id"] = Value::from(event);
    body["timestamp"] = Value::from(rfc3339(at));
    body["payload"]["thread"]["id"] = Value::from(thread);
    body["webhookMetadata"]["webhookDeliveryAttemptId"] =
        Value::from(format!("whAttempt_{}", uuid::Uuid::new_v4().simple()));
    body["webhookMetadata"]["webhookDeliveryAttemptNumber"] = Value::from(1);
    body["webhookMetadata"]["webhookDeliveryAttemptTimestamp"] = Value::from(rfc3339(Utc::now()));
    body
}

/// A retry of `body` as Plain sends it: same event id, a new attempt (id, number,
/// timestamp), so a new body and a new signature.
pub fn retry_of(body: &Value) -> Value {
    let mut retry = body.clone();
    let meta = &mut retry["webhookMetadata"];
    meta["webhookDeliveryAttemptId"] =
        Value::from(format!("whAttempt_{}", uuid::Uuid::new_v4().simple()));
    meta["webhookDeliveryAttemptNumber"] = Value::from(2);
    meta["webhookDeliveryAttemptTimestamp"] =
        Value::from(rfc3339(Utc::now() + chrono::Duration::milliseconds(7)));
    retry
}
