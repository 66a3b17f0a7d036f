//! Every wire type: its fixed JSON sample (which pins the bytes the server sends) reads
//! back as the same value, and the value writes as exactly that sample.

#![expect(
    clippy::unwrap_used,
    reason = "test code: an unwrap that fails is a failed test, with its message"
)]

use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use threadgate_api::*;

/// `value` writes as `wire`, and `wire` reads back as `value`.
fn check<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: T, wire: &str) {
    let written = serde_json::to_string(&value).unwrap();
    assert_eq!(written, wire, "{value:?} written");
    let read: T = serde_json::from_str(wire).unwrap();
    assert_eq!(read, value, "{wire} read back");
    let again: T = serde_json::from_str(&written).unwrap();
    assert_eq!(again, value);
}

#[test]
fn error_answer() {
    check(
        ErrorAnswer::new("not_found", "no such execution in this session"),
        r#"{"status":"error","error":"not_found","message":"no such execution in this session"}"#,
    );
    check(
        ErrorAnswer::Error(ErrorBody {
            error: "invalid_arguments".into(),
            message: "t: a; b".into(),
            problems: vec!["a".into(), "b".into()],
        }),
        r#"{"status":"error","error":"invalid_arguments","message":"t: a; b","problems":["a","b"]}"#,
    );
    // Only `error` is required of an answer; another status is not an error answer.
    let bare: ErrorAnswer = serde_json::from_str(r#"{"status":"error","error":"x"}"#).unwrap();
    assert_eq!(bare.body().error, "x");
    assert!(serde_json::from_str::<ErrorAnswer>(r#"{"status":"ok","error":"x"}"#).is_err());
}

#[test]
fn events_page_and_feed_event() {
    let event = FeedEvent {
        position: 3,
        event_id: "ev_1".into(),
        event_type: "thread.email_received".into(),
        occurred_at_ms: 1_700_000_000_000,
        event: json!({"payload": {"email": {"textContent": "hi"}}}),
    };
    check(
        event.clone(),
        r#"{"event_id":"ev_1","occurred_at_ms":1700000000000,"position":3,"type":"thread.email_received","event":{"payload":{"email":{"textContent":"hi"}}}}"#,
    );
    check(
        EventsPage {
            events: vec![event],
            next: 3,
        },
        r#"{"events":[{"event_id":"ev_1","occurred_at_ms":1700000000000,"position":3,"type":"thread.email_received","event":{"payload":{"email":{"textContent":"hi"}}}}],"next":3}"#,
    );
    check(
        EventsPage::<serde_json::Value> {
            events: vec![],
            next: 7,
        },
        r#"{"events":[],"next":7}"#,
    );
}

#[test]
fn the_server_writes_a_stored_event_as_it_is() {
    let raw = serde_json::value::RawValue::from_string(r#"{"b":1,"a":2}"#.to_owned()).unwrap();
    let event = FeedEvent {
        position: 1,
        event_id: "e".into(),
        event_type: "t".into(),
        occurred_at_ms: 0,
        event: raw,
    };
    assert_eq!(
        serde_json::to_string(&event).unwrap(),
        r#"{"event_id":"e","occurred_at_ms":0,"position":1,"type":"t","event":{"b":1,"a":2}}"#
    );
}

fn agent() -> AgentView {
    AgentView {
        description: "Support".into(),
        harness: None,
        instructions: "Be careful.".into(),
        limits: Some(AgentLimits {
            max_tokens: 1000,
            max_turns: 8,
        }),
        model: Some("scripted-1".into()),
        name: "support".into(),
        session_id: "se_1".into(),
        skills: vec![SkillView {
            body: "Refund duplicates only.".into(),
            description: "Refund rules".into(),
            name: "refunds".into(),
        }],
        thread_id: "th_1".into(),
        tools: vec!["stripe.*".into()],
    }
}

#[test]
fn agent_view() {
    check(
        agent(),
        r#"{"description":"Support","harness":null,"instructions":"Be careful.","limits":{"max_tokens":1000,"max_turns":8},"model":"scripted-1","name":"support","session_id":"se_1","skills":[{"body":"Refund duplicates only.","description":"Refund rules","name":"refunds"}],"thread_id":"th_1","tools":["stripe.*"]}"#,
    );
    let with_harness = AgentView {
        harness: Some(HarnessView {
            command: vec!["codex".into(), "{mcp_url}".into()],
            port: 7345,
        }),
        ..agent()
    };
    check(
        with_harness,
        r#"{"description":"Support","harness":{"command":["codex","{mcp_url}"],"port":7345},"instructions":"Be careful.","limits":{"max_tokens":1000,"max_turns":8},"model":"scripted-1","name":"support","session_id":"se_1","skills":[{"body":"Refund duplicates only.","description":"Refund rules","name":"refunds"}],"thread_id":"th_1","tools":["stripe.*"]}"#,
    );
    // An older server's skill `text`, and only a name otherwise.
    let old: AgentView =
        serde_json::from_str(r#"{"name":"a","skills":[{"name":"s","text":"T"}]}"#).unwrap();
    assert_eq!(old.skills[0].body, "T");
    assert_eq!((old.limits, old.model), (None, None));
}

#[test]
fn tool_listing() {
    check(
        ToolListing {
            tools: vec![
                ToolEntry {
                    args: vec![ToolArg {
                        description: Some("Why.".into()),
                        values: Some(vec!["duplicate".into(), "fraudulent".into()]),
                        name: "reason".into(),
                        required: false,
                        ty: "string".into(),
                    }],
                    description: Some("Refunds a charge.".into()),
                    name: "stripe.create_refund".into(),
                    risk: "write".into(),
                },
                ToolEntry {
                    args: vec![ToolArg {
                        description: None,
                        values: None,
                        name: "labels".into(),
                        required: true,
                        ty: "array of strings".into(),
                    }],
                    description: None,
                    name: "github.create_issue".into(),
                    risk: "write".into(),
                },
            ],
        },
        r#"{"tools":[{"args":[{"description":"Why.","enum":["duplicate","fraudulent"],"name":"reason","required":false,"type":"string"}],"description":"Refunds a charge.","name":"stripe.create_refund","risk":"write"},{"args":[{"name":"labels","required":true,"type":"array of strings"}],"name":"github.create_issue","risk":"write"}]}"#,
    );
}

#[test]
fn call_request() {
    check(
        CallRequest {
            tool: "stripe.create_refund".into(),
            args: json!({"charge": "ch_1"}),
            diagnosis: Some("a duplicate".into()),
        },
        r#"{"args":{"charge":"ch_1"},"diagnosis":"a duplicate","tool":"stripe.create_refund"}"#,
    );
    let bare: CallRequest = serde_json::from_str(r#"{"tool":"t"}"#).unwrap();
    assert_eq!((bare.args, bare.diagnosis), (json!({}), None));
    let unknown = serde_json::from_str::<CallRequest>(r#"{"tool":"t","argz":{}}"#).unwrap_err();
    assert!(unknown.to_string().contains("argz"), "{unknown}");
}

#[test]
fn call_answers() {
    check(
        CallAnswer::Ok(Ran {
            execution_id: "ex_1".into(),
            replayed: false,
            result: json!({"id": "in_1"}),
        }),
        r#"{"status":"ok","execution_id":"ex_1","replayed":false,"result":{"id":"in_1"}}"#,
    );
    check(
        CallAnswer::Failed(Failed {
            error: "stripe: 500".into(),
            execution_id: "ex_2".into(),
            retry_after_ms: None,
        }),
        r#"{"status":"failed","error":"stripe: 500","execution_id":"ex_2","retry_after_ms":null}"#,
    );
    check(
        CallAnswer::PendingApproval(Held {
            approval_summary: Some("Refund 25.00 USD".into()),
            approval_url: "http://r/approvals/ex_3".into(),
            execution_id: "ex_3".into(),
            expires_at: Some("2026-01-01T00:00:00.000Z".into()),
        }),
        r#"{"status":"pending_approval","approval_summary":"Refund 25.00 USD","approval_url":"http://r/approvals/ex_3","execution_id":"ex_3","expires_at":"2026-01-01T00:00:00.000Z"}"#,
    );
    check(
        CallAnswer::Blocked(Blocked {
            execution_id: "ex_4".into(),
            rule: "policy.yaml:12".into(),
        }),
        r#"{"status":"blocked","execution_id":"ex_4","rule":"policy.yaml:12"}"#,
    );
    let refused = CallAnswer::Error(ErrorBody {
        error: "out_of_scope".into(),
        message: "another thread".into(),
        problems: vec![],
    });
    check(
        refused.clone(),
        r#"{"status":"error","error":"out_of_scope","message":"another thread"}"#,
    );
    assert_eq!((refused.status(), refused.execution_id()), ("error", None));
    assert!(serde_json::from_str::<CallAnswer>(r#"{"status":"maybe"}"#).is_err());
}

#[test]
fn execution_view_in_every_status() {
    let statuses = [
        (ExecutionStatus::Ok, "ok", true),
        (ExecutionStatus::PendingApproval, "pending_approval", false),
        (ExecutionStatus::Running, "running", false),
        (ExecutionStatus::Failed, "failed", true),
        (ExecutionStatus::NeedsCheck, "needs_check", true),
        (ExecutionStatus::Denied, "denied", true),
        (ExecutionStatus::Expired, "expired", true),
        (ExecutionStatus::Blocked, "blocked", true),
    ];
    for (status, name, is_final) in statuses {
        assert_eq!(status.is_final(), is_final, "{name}");
        check(
            ExecutionView {
                error: None,
                execution_id: "ex_1".into(),
                expires_at: None,
                message: Some("not a duplicate".into()),
                result: serde_json::Value::Null,
                reviewer: Some("ana".into()),
                status,
                tool: "stripe.create_refund".into(),
            },
            &format!(
                r#"{{"error":null,"execution_id":"ex_1","expires_at":null,"message":"not a duplicate","result":null,"reviewer":"ana","status":"{name}","tool":"stripe.create_refund"}}"#
            ),
        );
    }
}

fn call_message() -> ChatMessage {
    ChatMessage {
        content: None,
        role: Role::Assistant,
        tool_call_id: None,
        tool_calls: vec![ToolCall {
            function: FunctionCall {
                arguments: r#"{"customer":"cus_1"}"#.into(),
                name: "stripe__list_invoices".into(),
            },
            id: "call_1".into(),
            kind: "function".into(),
        }],
    }
}

#[test]
fn chat_messages() {
    check(
        ChatMessage::text(Role::System, "Be careful."),
        r#"{"content":"Be careful.","role":"system"}"#,
    );
    check(
        call_message(),
        r#"{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{\"customer\":\"cus_1\"}","name":"stripe__list_invoices"},"id":"call_1","type":"function"}]}"#,
    );
    check(
        ChatMessage::tool_result("call_1", "{}"),
        r#"{"content":"{}","role":"tool","tool_call_id":"call_1"}"#,
    );
}

#[test]
fn chat_request_and_answer() {
    check(
        ChatRequest {
            max_tokens: 4096,
            messages: vec![ChatMessage::text(Role::User, "hi")],
            model: Some("scripted-1".into()),
            tool_choice: "auto".into(),
            tools: vec![json!({"type": "function"})],
        },
        r#"{"max_tokens":4096,"messages":[{"content":"hi","role":"user"}],"model":"scripted-1","tool_choice":"auto","tools":[{"type":"function"}]}"#,
    );
    check(
        ChatAnswer {
            choices: vec![ChatChoice {
                message: call_message(),
            }],
        },
        r#"{"choices":[{"message":{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{\"customer\":\"cus_1\"}","name":"stripe__list_invoices"},"id":"call_1","type":"function"}]}}]}"#,
    );
    // The proxy's whole `chat.completion` reads as the part the runner uses.
    let full = json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "done"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}});
    let answer: ChatAnswer = serde_json::from_value(full).unwrap();
    assert_eq!(
        answer.choices[0].message,
        ChatMessage::text(Role::Assistant, "done")
    );
}

#[test]
fn transcript() {
    check(
        Transcript {
            events_consumed: 2,
            messages: vec![ChatMessage::text(Role::User, "hi"), call_message()],
        },
        r#"{"events_consumed":2,"messages":[{"content":"hi","role":"user"},{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{\"customer\":\"cus_1\"}","name":"stripe__list_invoices"},"id":"call_1","type":"function"}]}]}"#,
    );
    check(
        Transcript::default(),
        r#"{"events_consumed":0,"messages":[]}"#,
    );
}

#[test]
fn checkpoint_answer() {
    check(
        CheckpointAnswer {
            branch: "threadgate/th_1".into(),
            commit: Some("0123abcd".into()),
            left_out: 1,
            push: "pushed".into(),
        },
        r#"{"branch":"threadgate/th_1","commit":"0123abcd","left_out":1,"push":"pushed"}"#,
    );
    check(
        CheckpointAnswer {
            branch: "threadgate/th_1".into(),
            commit: None,
            left_out: 0,
            push: "not_needed".into(),
        },
        r#"{"branch":"threadgate/th_1","commit":null,"left_out":0,"push":"not_needed"}"#,
    );
}
