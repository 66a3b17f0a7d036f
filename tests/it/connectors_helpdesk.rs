//! The helpdesk connector against a fake Plain endpoint that validates every query and
//! mutation against Plain's GraphQL schema.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::plain_fake::{API_KEY, Failure, MutationErrorSpec, PlainFake};
use threadgate::connectors::helpdesk::{EscalationRouting, ThreadCustomer, documents};
use threadgate::connectors::{
    CallContext, Connector, ConnectorError, Credential, HelpdeskConnector, RateLimitRetry,
};

const THREAD: &str = "th_01JTHREADGATE";
const CUSTOMER: &str = "c_01JCUSTOMER";
const EMAIL: &str = "ada@example.com";

async fn fake_with_thread() -> PlainFake {
    let fake = PlainFake::start().await;
    fake.add_thread(THREAD, CUSTOMER, EMAIL);
    fake
}

fn connector(fake: &PlainFake) -> HelpdeskConnector {
    HelpdeskConnector::new(fake.base_url(), Credential::new(API_KEY)).unwrap()
}

async fn call(
    connector: &HelpdeskConnector,
    tool: &str,
    args: Value,
) -> Result<Value, ConnectorError> {
    connector
        .call(
            tool,
            &args,
            &CallContext {
                execution_id: "exec-1",
            },
        )
        .await
}

fn operation_names(fake: &PlainFake) -> Vec<String> {
    fake.operations()
        .into_iter()
        .map(|op| op.name.unwrap_or_default())
        .collect()
}

fn assert_all_valid(fake: &PlainFake) {
    assert_eq!(fake.invalid_requests(), Vec::<String>::new());
}

#[test]
fn every_document_validates_against_plains_schema() {
    for document in documents::ALL {
        if let Err(errors) = support::plain_fake::validate(document) {
            panic!("{document}\n{errors}");
        }
    }
    let wrong_field =
        r#"mutation { replyToThread(input: {threadId: "t", textContent: "x"}) { ok } }"#;
    assert!(support::plain_fake::validate(wrong_field).is_err());
    let wrong_argument = r#"query { thread(id: "t") { id } }"#;
    assert!(support::plain_fake::validate(wrong_argument).is_err());
}

#[tokio::test]
async fn get_thread_returns_the_customer_and_the_timeline() {
    let fake = fake_with_thread().await;
    let note_id = fake.add_note(THREAD, "earlier note");
    let connector = connector(&fake);

    let thread = call(
        &connector,
        "helpdesk.get_thread",
        json!({"thread_id": THREAD}),
    )
    .await
    .unwrap();
    assert_eq!(thread["thread_id"], THREAD);
    assert_eq!(thread["status"], "TODO");
    assert_eq!(thread["customer"]["id"], CUSTOMER);
    assert_eq!(thread["customer"]["email"], EMAIL);
    let timeline = thread["timeline"].as_array().unwrap();
    assert_eq!(timeline.len(), 2);
    assert_eq!(timeline[0]["kind"], "chat");
    assert_eq!(timeline[0]["actor"], "CustomerActor");
    assert_eq!(timeline[0]["text"], "I was charged twice for my order.");
    assert_eq!(timeline[1]["kind"], "note");
    assert_eq!(timeline[1]["note_id"], note_id.as_str());
    assert_eq!(thread["earlier_entries"], false);
    assert_eq!(operation_names(&fake), ["ThreadgateGetThread"]);
    assert_all_valid(&fake);
}

#[tokio::test]
async fn unknown_threads_are_rejected_with_404() {
    let fake = fake_with_thread().await;
    let connector = connector(&fake);
    let error = call(&connector, "get_thread", json!({"thread_id": "th_missing"}))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ConnectorError::Rejected { status: 404, .. }),
        "{error:?}"
    );
    let error = connector.thread_customer("th_missing").await.unwrap_err();
    assert!(error.to_string().contains("th_missing"), "{error}");
    assert_all_valid(&fake);
}

#[tokio::test]
async fn reply_to_thread_sends_text_and_markdown() {
    let fake = fake_with_thread().await;
    let connector = connector(&fake);
    let args = json!({"thread_id": THREAD, "text": "Refunded.", "markdown": "**Refunded.**"});
    let result = call(&connector, "helpdesk.reply_to_thread", args)
        .await
        .unwrap();
    assert_eq!(result, json!({"thread_id": THREAD, "replied": true}));
    assert_eq!(
        fake.thread(THREAD).replies(),
        [("Refunded.".to_owned(), Some("**Refunded.**".to_owned()))]
    );
    let operation = &fake.operations()[0];
    assert!(operation.is_mutation);
    assert_eq!(operation.root_fields, ["replyToThread"]);
    assert_eq!(
        operation.variables["input"],
        json!({"threadId": THREAD, "textContent": "Refunded.", "markdownContent": "**Refunded.**"})
    );
    assert_all_valid(&fake);
}

#[tokio::test]
async fn add_note_looks_up_the_customer_then_creates_the_note() {
    let fake = fake_with_thread().await;
    let connector = connector(&fake);
    let result = call(
        &connector,
        "helpdesk.add_note",
        json!({"thread_id": THREAD, "text": "internal"}),
    )
    .await
    .unwrap();
    let notes = fake.thread(THREAD).notes();
    assert_eq!(notes.len(), 1);
    assert_eq!(result["note_id"], notes[0].0.as_str());
    assert_eq!(notes[0].1, "internal");
    assert_eq!(
        operation_names(&fake),
        ["ThreadgateThreadCustomer", "ThreadgateCreateNote"]
    );
    assert_eq!(
        fake.operations()[1].variables["input"]["customerId"],
        CUSTOMER
    );
    assert_eq!(
        connector.thread_customer(THREAD).await.unwrap(),
        ThreadCustomer {
            customer_id: CUSTOMER.into(),
            email: EMAIL.into()
        }
    );
    assert_all_valid(&fake);
}

#[tokio::test]
async fn escalation_routes_the_thread_then_adds_the_note() {
    let fake = fake_with_thread().await;
    fake.add_label_type("lt_engineering", "engineering");
    let connector = connector(&fake).with_escalation(EscalationRouting {
        label_type_ids: vec!["lt_engineering".into()],
        assign_to_user_id: Some("u_oncall".into()),
        use_escalation_path: true,
    });
    let args =
        json!({"thread_id": THREAD, "summary": "Double charge from a retry bug in checkout."});
    let result = call(&connector, "helpdesk.escalate_to_engineer", args)
        .await
        .unwrap();

    let thread = fake.thread(THREAD);
    assert_eq!(thread.label_type_ids, ["lt_engineering"]);
    assert_eq!(thread.assigned_user_id.as_deref(), Some("u_oncall"));
    assert_eq!(thread.escalations, 1);
    let notes = thread.notes();
    assert_eq!(notes.len(), 1);
    assert!(
        notes[0].1.contains("Double charge from a retry bug"),
        "{}",
        notes[0].1
    );
    assert_eq!(result["note_id"], notes[0].0.as_str());
    assert_eq!(
        operation_names(&fake),
        [
            "ThreadgateThreadCustomer",
            "ThreadgateAddLabels",
            "ThreadgateAssignThread",
            "ThreadgateEscalateThread",
            "ThreadgateCreateNote"
        ]
    );
    assert_all_valid(&fake);
}

#[tokio::test]
async fn a_failed_routing_step_posts_no_note() {
    let fake = fake_with_thread().await;
    let connector = connector(&fake).with_escalation(EscalationRouting {
        label_type_ids: vec!["lt_unknown".into()],
        ..EscalationRouting::default()
    });
    let args = json!({"thread_id": THREAD, "summary": "s"});
    let error = call(&connector, "helpdesk.escalate_to_engineer", args)
        .await
        .unwrap_err();
    match &error {
        ConnectorError::Rejected { code, message, .. } => {
            assert_eq!(code.as_deref(), Some("input_validation"));
            assert!(message.contains("labelTypeIds"), "{message}");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert!(fake.thread(THREAD).notes().is_empty());
    assert_all_valid(&fake);
}

#[tokio::test]
async fn mark_done_sets_the_status() {
    let fake = fake_with_thread().await;
    let connector = connector(&fake);
    let result = call(
        &connector,
        "helpdesk.mark_done",
        json!({"thread_id": THREAD}),
    )
    .await
    .unwrap();
    assert_eq!(result["status"], "DONE");
    assert_eq!(fake.thread(THREAD).status, "DONE");
    assert_eq!(operation_names(&fake), ["ThreadgateMarkThreadAsDone"]);
    assert_all_valid(&fake);
}

#[tokio::test]
async fn find_note_containing_pages_through_notes_only() {
    let fake = fake_with_thread().await;
    let connector = connector(&fake);
    let mut ids = Vec::new();
    for index in 0..130 {
        ids.push(fake.add_note(THREAD, &format!("held call note [threadgate:exec-{index}]")));
    }
    call(
        &connector,
        "reply_to_thread",
        json!({"thread_id": THREAD, "text": "see [threadgate:reply-only]"}),
    )
    .await
    .unwrap();

    let early = connector
        .find_note_containing(THREAD, "[threadgate:exec-3]")
        .await
        .unwrap();
    assert_eq!(early.as_deref(), Some(ids[3].as_str()));
    let before = fake.operations().len();
    let late = connector
        .find_note_containing(THREAD, "[threadgate:exec-120]")
        .await
        .unwrap();
    assert_eq!(late.as_deref(), Some(ids[120].as_str()));
    assert_eq!(fake.operations().len() - before, 2, "two pages of notes");
    let second_page = fake.operations().last().unwrap().variables.clone();
    assert!(second_page["after"].is_string(), "{second_page}");

    assert_eq!(
        connector
            .find_note_containing(THREAD, "[threadgate:exec-999]")
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        connector
            .find_note_containing(THREAD, "[threadgate:reply-only]")
            .await
            .unwrap(),
        None
    );
    assert_all_valid(&fake);
}

#[tokio::test]
async fn mutation_errors_map_to_rejected_or_unknown() {
    let fake = fake_with_thread().await;
    let connector = connector(&fake);
    fake.mutation_error_on(
        "replyToThread",
        MutationErrorSpec {
            message: "Input validation failed".into(),
            error_type: "VALIDATION".into(),
            code: "input_validation".into(),
            fields: vec![("textContent".into(), "too long".into(), "VALIDATION".into())],
        },
    );
    let args = json!({"thread_id": THREAD, "text": "hello"});
    let error = call(&connector, "helpdesk.reply_to_thread", args.clone())
        .await
        .unwrap_err();
    assert_eq!(
        error,
        ConnectorError::Rejected {
            status: 200,
            code: Some("input_validation".into()),
            message: "replyToThread: Input validation failed (textContent: too long)".into(),
        }
    );
    assert!(fake.thread(THREAD).replies().is_empty());

    fake.mutation_error_on(
        "markThreadAsDone",
        MutationErrorSpec {
            message: "internal".into(),
            error_type: "INTERNAL".into(),
            code: "internal_server_error".into(),
            fields: Vec::new(),
        },
    );
    let error = call(
        &connector,
        "helpdesk.mark_done",
        json!({"thread_id": THREAD}),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, ConnectorError::Unknown { .. }), "{error:?}");
    assert_all_valid(&fake);
}

#[tokio::test]
async fn rate_limits_are_waited_out_up_to_the_bound() {
    let fake = fake_with_thread().await;
    let reset = (chrono::Utc::now() + chrono::Duration::milliseconds(300)).to_rfc3339();
    fake.fail_next(
        2,
        Failure::RateLimited {
            reset: reset.clone(),
        },
    );
    let connector = connector(&fake);
    let args = json!({"thread_id": THREAD, "text": "after the limit"});
    call(&connector, "helpdesk.reply_to_thread", args.clone())
        .await
        .unwrap();
    assert_eq!(fake.request_count(), 3);
    assert_eq!(fake.thread(THREAD).replies().len(), 1);

    let impatient = connector.clone().with_rate_limit_retry(RateLimitRetry {
        max_retries: 1,
        max_wait: Duration::from_secs(5),
    });
    fake.fail_next(
        2,
        Failure::RateLimited {
            reset: "2020-01-01T00:00:00Z".into(),
        },
    );
    let error = call(&impatient, "helpdesk.reply_to_thread", args.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(error, ConnectorError::RateLimited { .. }),
        "{error:?}"
    );
    assert!(error.is_definite());

    let far = (chrono::Utc::now() + chrono::Duration::seconds(3600)).to_rfc3339();
    fake.fail_next(1, Failure::RateLimited { reset: far });
    let error = call(&connector, "helpdesk.reply_to_thread", args)
        .await
        .unwrap_err();
    let ConnectorError::RateLimited { retry_after } = error else {
        panic!("expected a rate limit, got {error:?}");
    };
    assert!(retry_after > Duration::from_secs(3500), "{retry_after:?}");
    assert_eq!(
        fake.thread(THREAD).replies().len(),
        1,
        "no rate-limited request ran"
    );
    assert_all_valid(&fake);
}

#[tokio::test]
async fn server_errors_are_unknown_and_not_retried() {
    let fake = fake_with_thread().await;
    fake.fail_next(1, Failure::ServerError);
    let connector = connector(&fake);
    let error = call(
        &connector,
        "helpdesk.reply_to_thread",
        json!({"thread_id": THREAD, "text": "x"}),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, ConnectorError::Unknown { .. }), "{error:?}");
    assert!(!error.is_definite());
    assert_eq!(fake.request_count(), 1);
}

#[tokio::test]
async fn bad_arguments_send_nothing() {
    let fake = fake_with_thread().await;
    let connector = connector(&fake);
    let cases = [
        ("helpdesk.reply_to_thread", json!({"thread_id": THREAD})),
        ("helpdesk.add_note", json!({"thread_id": THREAD, "text": 5})),
        ("helpdesk.get_thread", json!({"thread_id": "th/../x"})),
        (
            "helpdesk.mark_done",
            json!({"thread_id": THREAD, "status": "DONE"}),
        ),
        (
            "helpdesk.escalate_to_engineer",
            json!({"thread_id": THREAD}),
        ),
        ("helpdesk.close", json!({})),
    ];
    for (tool, args) in cases {
        let result = call(&connector, tool, args.clone()).await;
        assert!(
            matches!(result, Err(ConnectorError::InvalidArgs { .. })),
            "{tool} {args}: {result:?}"
        );
    }
    assert!(matches!(
        connector.find_note_containing(THREAD, "").await,
        Err(ConnectorError::InvalidArgs { .. })
    ));
    assert_eq!(fake.request_count(), 0);
}

#[tokio::test]
async fn the_key_never_appears_in_errors_or_debug_output() {
    let fake = fake_with_thread().await;
    fake.fail_next(1, Failure::EchoAuthorization);
    let connector = connector(&fake);
    let error = call(
        &connector,
        "helpdesk.get_thread",
        json!({"thread_id": THREAD}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, ConnectorError::Rejected { status: 400, .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("[redacted]"), "{error}");

    let wrong_key =
        HelpdeskConnector::new(fake.base_url(), Credential::new("plainApiKey_wrong_one")).unwrap();
    let refused = call(
        &wrong_key,
        "helpdesk.get_thread",
        json!({"thread_id": THREAD}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(refused, ConnectorError::Rejected { status: 401, .. }),
        "{refused:?}"
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = HelpdeskConnector::new(
        &format!("http://127.0.0.1:{port}"),
        Credential::new(API_KEY),
    )
    .unwrap();
    let unreachable = call(&dead, "helpdesk.get_thread", json!({"thread_id": THREAD}))
        .await
        .unwrap_err();
    assert!(
        matches!(unreachable, ConnectorError::Unreachable { .. }),
        "{unreachable:?}"
    );

    for text in [
        error.to_string(),
        format!("{error:?}"),
        unreachable.to_string(),
        format!("{connector:?}"),
    ] {
        assert!(!text.contains(API_KEY), "{text}");
    }
}
