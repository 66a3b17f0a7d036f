use serde_json::{Value, json};

use super::*;

/// A minimal delivery of `event_type` whose payload is `payload`.
fn delivery(event_type: &str, payload: Value) -> Value {
    json!({
        "id": "pEv_01HD44FHHJ0YABSNGKWMG3CJ5J",
        "type": event_type,
        "timestamp": "2024-03-06T12:37:10.228Z",
        "workspaceId": "w_01FXQ6A83FXNN9XA00415VR1XP",
        "webhookMetadata": {
            "webhookDeliveryAttemptTimestamp": "2024-03-06T12:37:11.577Z"
        },
        "payload": payload,
    })
}

fn actor(actor_type: &str) -> Value {
    json!({ "actorType": actor_type, "id": "x_1" })
}

fn thread(status: &str, updated_by: &str) -> Value {
    json!({
        "id": "th_1",
        "status": status,
        "customer": { "id": "c_1", "email": { "email": "a@example.com" } },
        "createdBy": actor("system"),
        "statusChangedBy": actor(updated_by),
        "updatedBy": actor(updated_by),
    })
}

fn parse(value: &Value) -> Envelope {
    Envelope::parse(value.to_string().as_bytes()).expect("parses")
}

/// Parses `value` and checks its actor and class.
fn check(value: Value, expected_actor: ActorKind, expected_class: EventClass) {
    let envelope = parse(&value);
    assert_eq!(
        (envelope.actor, envelope.class()),
        (expected_actor, expected_class),
        "for {}",
        value["type"]
    );
}

#[test]
fn message_events_take_the_actor_from_the_message() {
    let cases = [
        ("thread.email_received", "email", EventClass::Customer),
        ("thread.chat_received", "chat", EventClass::Customer),
        (
            "thread.slack_message_received",
            "slackMessage",
            EventClass::Customer,
        ),
        (
            "thread.ms_teams_message_received",
            "msTeamsMessage",
            EventClass::Customer,
        ),
        (
            "thread.discord_message_received",
            "discordMessage",
            EventClass::Customer,
        ),
        ("thread.email_sent", "email", EventClass::Info),
        ("thread.chat_sent", "chat", EventClass::Info),
        ("thread.note_created", "note", EventClass::Info),
    ];
    for (event_type, object, class) in cases {
        // The thread was last touched by a user; the message decides the actor.
        let payload = json!({
            "thread": thread("TODO", "user"),
            object: { "createdBy": actor("customer") },
        });
        check(delivery(event_type, payload), ActorKind::Customer, class);
    }
}

#[test]
fn a_machine_user_message_or_new_thread_is_ignored() {
    for (event_type, object) in [
        ("thread.email_sent", "email"),
        ("thread.note_created", "note"),
        ("thread.chat_received", "chat"),
    ] {
        let payload = json!({
            "thread": thread("TODO", "user"),
            object: { "createdBy": actor("machineUser") },
        });
        check(
            delivery(event_type, payload),
            ActorKind::MachineUser,
            EventClass::Ignored,
        );
    }
    let mut created = thread("TODO", "system");
    created["createdBy"] = actor("machineUser");
    check(
        delivery("thread.thread_created", json!({ "thread": created })),
        ActorKind::MachineUser,
        EventClass::Ignored,
    );
}

#[test]
fn a_system_created_thread_starts_a_session() {
    check(
        delivery(
            "thread.thread_created",
            json!({ "thread": thread("TODO", "system") }),
        ),
        ActorKind::System,
        EventClass::Customer,
    );
}

#[test]
fn status_transitions_use_status_changed_by_and_done_ends_whoever_made_it() {
    let transition = |status: &str, by: &str| {
        delivery(
            "thread.thread_status_transitioned",
            json!({ "previousThread": thread("TODO", "user"), "thread": thread(status, by) }),
        )
    };
    check(
        transition("DONE", "user"),
        ActorKind::User,
        EventClass::Done,
    );
    check(
        transition("DONE", "machineUser"),
        ActorKind::MachineUser,
        EventClass::Done,
    );
    check(
        transition("SNOOZED", "user"),
        ActorKind::User,
        EventClass::Info,
    );
    check(
        transition("TODO", "system"),
        ActorKind::System,
        EventClass::Info,
    );
    check(
        transition("TODO", "machineUser"),
        ActorKind::MachineUser,
        EventClass::Ignored,
    );
}

#[test]
fn a_null_status_changed_by_falls_back_to_updated_by() {
    let mut t = thread("DONE", "user");
    t["statusChangedBy"] = Value::Null;
    let value = delivery(
        "thread.thread_status_transitioned",
        json!({ "previousThread": thread("TODO", "user"), "thread": t }),
    );
    check(value, ActorKind::User, EventClass::Done);
}

#[test]
fn unknown_types_and_threadless_events_are_ignored_but_parsed() {
    check(
        delivery(
            "thread.something_new",
            json!({ "thread": thread("TODO", "user") }),
        ),
        ActorKind::User,
        EventClass::Ignored,
    );
    check(
        delivery("discussion.discussion_created", json!({ "discussion": {} })),
        ActorKind::Unknown,
        EventClass::Ignored,
    );
    let mut no_payload = delivery("thread.email_received", Value::Null);
    no_payload
        .as_object_mut()
        .expect("object")
        .remove("payload");
    check(no_payload, ActorKind::Unknown, EventClass::Ignored);
}

#[test]
fn unknown_actor_types_are_unknown_not_errors() {
    check(
        delivery(
            "thread.thread_created",
            json!({ "thread": {
            "id": "th_1", "createdBy": { "actorType": "UNKNOWN" } } }),
        ),
        ActorKind::Unknown,
        EventClass::Customer,
    );
}

#[test]
fn thread_fields_are_read_when_present() {
    let envelope = parse(&delivery(
        "thread.thread_status_transitioned",
        json!({ "thread": thread("DONE", "user") }),
    ));
    assert_eq!(envelope.thread_id.as_deref(), Some("th_1"));
    assert_eq!(envelope.thread_status.as_deref(), Some("DONE"));
    assert_eq!(
        envelope.customer,
        Some(Customer {
            id: "c_1".into(),
            email: Some("a@example.com".into())
        })
    );
    assert_eq!(envelope.occurred_at_ms, 1_709_728_630_228);
    assert_eq!(envelope.attempt_at_ms, 1_709_728_631_577);
    assert_eq!(
        envelope.workspace_id.as_deref(),
        Some("w_01FXQ6A83FXNN9XA00415VR1XP")
    );
}

#[test]
fn errors_name_the_missing_or_invalid_field() {
    let base = delivery("thread.thread_created", json!({}));
    let cases: [(&str, Option<Value>, &str); 6] = [
        ("id", None, "missing field id"),
        (
            "type",
            Some(json!(7)),
            "invalid field type: expected a non-empty string",
        ),
        ("timestamp", Some(Value::Null), "missing field timestamp"),
        (
            "timestamp",
            Some(json!("yesterday")),
            "invalid field timestamp: expected an RFC 3339 date-time",
        ),
        (
            "webhookMetadata",
            None,
            "missing field webhookMetadata.webhookDeliveryAttemptTimestamp",
        ),
        (
            "webhookMetadata",
            Some(json!({ "webhookDeliveryAttemptTimestamp": 5 })),
            "invalid field webhookMetadata.webhookDeliveryAttemptTimestamp: \
             expected an RFC 3339 date-time",
        ),
    ];
    for (field, replacement, message) in cases {
        let mut value = base.clone();
        let object = value.as_object_mut().expect("object");
        match replacement {
            Some(v) => object.insert(field.to_owned(), v),
            None => object.remove(field),
        };
        let err = Envelope::parse(value.to_string().as_bytes()).expect_err(field);
        assert_eq!(err.to_string(), message);
    }
}

#[test]
fn non_json_and_non_objects_are_refused() {
    assert!(matches!(
        Envelope::parse(b"hello-world"),
        Err(EnvelopeError::NotJson(_))
    ));
    assert!(matches!(
        Envelope::parse(b"[1,2]"),
        Err(EnvelopeError::NotObject)
    ));
}

#[test]
fn target_version_and_unknown_fields_do_not_matter() {
    let mut value = delivery(
        "thread.thread_created",
        json!({ "thread": thread("TODO", "system") }),
    );
    value["webhookMetadata"]["webhookTargetVersion"] = json!("2099-01-01");
    value["somethingNew"] = json!({ "nested": [1, 2, 3] });
    value["payload"]["thread"]["priority"] = json!("not a number any more");
    assert_eq!(parse(&value).class(), EventClass::Customer);
}

#[test]
fn signatures_round_trip_and_reject_tampering() {
    let body = br#"{"id":"pEv_1"}"#;
    let signature = sign(b"secret", body);
    assert_eq!(verify_signature(b"secret", body, Some(&signature)), Ok(()));
    assert_eq!(
        verify_signature(b"other", body, Some(&signature)),
        Err(SignatureError::Mismatch)
    );
    assert_eq!(
        verify_signature(b"secret", b"{\"id\":\"pEv_2\"}", Some(&signature)),
        Err(SignatureError::Mismatch)
    );
    assert_eq!(
        verify_signature(b"secret", body, Some(&signature[..63])),
        Err(SignatureError::Malformed)
    );
    assert_eq!(
        verify_signature(b"secret", body, Some("zz")),
        Err(SignatureError::Malformed)
    );
    assert_eq!(
        verify_signature(b"secret", body, None),
        Err(SignatureError::Missing)
    );
}

#[test]
fn the_signing_secret_never_prints_and_cannot_be_empty() {
    let secret = SigningSecret::new("hunter2-very-secret").expect("secret");
    let config = IntakeConfig::new(secret);
    let printed = format!("{config:?}");
    assert!(!printed.contains("hunter2"), "{printed}");
    assert!(SigningSecret::new("").is_err());
}

#[tokio::test]
async fn pending_events_come_back_typed_and_an_unknown_class_is_an_error() {
    use crate::store::Db;
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open(&dir.path().join("state.db")).expect("open");
    let row = |id: &str, class: &str| {
        format!(
            "INSERT INTO events (event_id, event_type, class, thread_id, actor, occurred_at_ms, \
             received_at_ms, body) VALUES ('{id}', 'thread.email_received', '{class}', 'th_1', \
             'customer', 1, 1, '{{}}')"
        )
    };
    let (customer, done) = (row("e1", "customer"), row("e2", "done"));
    db.write(move |c| c.execute_batch(&format!("{customer}; {done};")))
        .await
        .expect("insert");
    let pending = db
        .read(|c| super::store::pending_events(c, &crate::ids::ThreadId::parse("th_1").unwrap()))
        .await
        .expect("read");
    let classes: Vec<EventClass> = pending.iter().map(|e| e.class).collect();
    assert_eq!(classes, [EventClass::Customer, EventClass::Done]);
    let bogus = row("e3", "bogus");
    db.write(move |c| c.execute(&bogus, ()))
        .await
        .expect("insert");
    let err = db
        .read(|c| super::store::pending_events(c, &crate::ids::ThreadId::parse("th_1").unwrap()))
        .await
        .expect_err("an unknown class is not read as a valid one");
    assert!(err.to_string().contains("bogus"), "{err}");
}
