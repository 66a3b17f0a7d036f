//! The runner against a small mock of the session socket API: an axum server on a unix
//! socket in a temp dir, with a scripted model queue and recorded gateway calls.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use threadgate_api::{ChatMessage, Role, ToolListing};

use crate::agent::{RoundEnd, Runner, Settings};

#[derive(Default)]
struct Mock {
    model: VecDeque<(u16, Value)>,
    model_requests: Vec<Value>,
    calls: Vec<Value>,
    /// tool → (status, body) of `POST /v1/calls`; 200 ok otherwise.
    call_replies: HashMap<String, (u16, Value)>,
    /// execution id → its final view on `/wait`.
    executions: HashMap<String, Value>,
    events: Vec<Value>,
    transcript: Option<Value>,
    transcript_puts: usize,
    /// `PUT /v1/transcript` above this many bytes is 413.
    transcript_cap: Option<usize>,
    /// `POST /v1/checkpoint` requests; the first is answered, later ones are too soon.
    checkpoints: usize,
}

type Shared = Arc<Mutex<Mock>>;

fn m(s: &Shared) -> std::sync::MutexGuard<'_, Mock> {
    s.lock().unwrap()
}

pub(crate) fn listing() -> ToolListing {
    serde_json::from_value(listing_json()).unwrap()
}

fn listing_json() -> Value {
    json!({"tools": [
        {"name": "stripe.list_invoices", "risk": "read", "args": [{"name": "customer", "type": "string", "required": false}, {"name": "limit", "type": "integer", "required": false}]},
        {"name": "stripe.create_refund", "risk": "write", "description": "Refunds a charge.", "args": [{"name": "charge", "type": "string", "required": true}, {"name": "amount", "type": "integer", "required": false}, {"name": "reason", "type": "string", "required": false, "description": "Why.", "enum": ["duplicate", "fraudulent"]}]},
        {"name": "helpdesk.reply_to_thread", "risk": "write", "args": [{"name": "thread_id", "type": "string", "required": true}, {"name": "text", "type": "string", "required": true}]},
        {"name": "helpdesk.add_note", "risk": "write", "args": [{"name": "thread_id", "type": "string", "required": true}, {"name": "text", "type": "string", "required": true}]},
        {"name": "github.create_issue", "risk": "write", "args": [{"name": "labels", "type": "array of strings", "required": false}]}
    ]})
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/agent", get(|| async { Json(json!({
            "name": "support", "model": "scripted-1", "instructions": "Be careful.",
            "limits": {"max_tokens": 1000, "max_turns": 8}, "thread_id": "th_1",
            "skills": [{"name": "refunds", "description": "Refund rules", "body": "Refund duplicates only."}],
        })) }))
        .route("/v1/tools", get(|| async { Json(listing_json()) }))
        .route("/v1/checkpoint", post(|State(s): State<Shared>| async move {
            let mut g = m(&s);
            g.checkpoints += 1;
            if g.checkpoints > 1 {
                return (StatusCode::TOO_MANY_REQUESTS, Json(json!({"status": "error", "error": "too_soon", "message": "try again in 9000 ms"})));
            }
            (StatusCode::OK, Json(json!({"branch": "threadgate/th_1", "commit": "abc123", "left_out": 0, "push": "pushed"})))
        }))
        .route("/v1/transcript", get(|State(s): State<Shared>| async move {
            Json(m(&s).transcript.clone().unwrap_or(json!({"messages": [], "events_consumed": 0})))
        }).put(|State(s): State<Shared>, Json(body): Json<Value>| async move {
            let mut g = m(&s);
            if g.transcript_cap.is_some_and(|cap| body.to_string().len() > cap) {
                return (StatusCode::PAYLOAD_TOO_LARGE, Json(json!({"status": "error", "error": "transcript_too_large"})));
            }
            g.transcript = Some(body);
            g.transcript_puts += 1;
            (StatusCode::OK, Json(json!({"status": "ok"})))
        }))
        .route("/v1/events", get(|State(s): State<Shared>, Query(q): Query<HashMap<String, String>>| async move {
            let after: i64 = q.get("after").and_then(|a| a.parse().ok()).unwrap_or(0);
            let events: Vec<Value> = m(&s).events.iter().filter(|e| e["position"].as_i64().unwrap() > after).cloned().collect();
            let next = events.last().map_or(after, |e| e["position"].as_i64().unwrap());
            Json(json!({"events": events, "next": next}))
        }))
        .route("/v1/model/chat/completions", post(|State(s): State<Shared>, Json(body): Json<Value>| async move {
            let mut g = m(&s);
            g.model_requests.push(body);
            let (status, answer) = g.model.pop_front().unwrap_or((429, json!({"status": "error", "error": "budget_exhausted", "message": "script over"})));
            (StatusCode::from_u16(status).unwrap(), Json(answer))
        }))
        .route("/v1/calls", post(|State(s): State<Shared>, Json(body): Json<Value>| async move {
            let mut g = m(&s);
            let tool = body["tool"].as_str().unwrap_or("").to_owned();
            g.calls.push(body);
            let (status, reply) = g.call_replies.get(&tool).cloned().unwrap_or((200, json!({"status": "ok", "execution_id": "ex_ok", "result": {"ok": true}})));
            (StatusCode::from_u16(status).unwrap(), Json(reply))
        }))
        .route("/v1/executions/{id}/wait", get(|State(s): State<Shared>, Path(id): Path<String>| async move {
            let view = m(&s).executions.get(&id).cloned();
            match view {
                Some(v) => (StatusCode::OK, Json(v)),
                None => (StatusCode::NOT_FOUND, Json(json!({"status": "error", "error": "not_found"}))),
            }
        }))
        .with_state(state)
}

struct World {
    state: Shared,
    _dir: tempfile::TempDir,
    workspace: tempfile::TempDir,
    settings: Settings,
}

async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let state: Shared = Arc::default();
    let app = router(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let workspace = tempfile::tempdir().unwrap();
    let settings = Settings {
        socket,
        workspace: workspace.path().to_path_buf(),
        poll_wait: 0,
        journal: Some(dir.path().join("state/events.jsonl")),
    };
    World {
        state,
        _dir: dir,
        workspace,
        settings,
    }
}

fn tool_call(id: &str, name: &str, arguments: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

fn answer(content: Option<&str>, calls: Vec<Value>) -> (u16, Value) {
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    (
        200,
        json!({"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        "threadgate": {"tokens_used": 15, "tokens_budget": 1000, "turns_used": 1, "turns_budget": 8}}),
    )
}

fn customer_event(position: i64, text: &str) -> Value {
    json!({"position": position, "event_id": format!("pEv_{position}"), "type": "thread.chat_received", "occurred_at_ms": 0,
        "event": {"payload": {"chat": {"text": text}, "thread": {"id": "th_1"}}}})
}

fn tool_results(messages: &[ChatMessage]) -> Vec<Value> {
    messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| serde_json::from_str(m.content.as_deref().unwrap()).unwrap())
        .collect()
}

#[tokio::test]
async fn a_customer_message_runs_the_tools_and_ends_at_the_reply() {
    let w = world().await;
    {
        let mut g = m(&w.state);
        g.events.push(customer_event(1, "I was charged twice"));
        g.model.push_back(answer(
            None,
            vec![tool_call(
                "c1",
                "stripe__list_invoices",
                r#"{"customer":"cus_1","diagnosis":"checking invoices"}"#,
            )],
        ));
        g.model.push_back(answer(
            Some("Refunding."),
            vec![tool_call(
                "c2",
                "helpdesk__reply_to_thread",
                r#"{"thread_id":"th_1","text":"Refunded."}"#,
            )],
        ));
    }
    let mut r = Runner::load(w.settings.clone()).await.unwrap();
    r.read_events().await;
    assert_eq!(r.round().await, RoundEnd::Done);
    let g = m(&w.state);
    assert_eq!(g.calls.len(), 2);
    assert_eq!(g.calls[0]["tool"], "stripe.list_invoices");
    assert_eq!(g.calls[0]["args"], json!({"customer": "cus_1"}));
    assert_eq!(g.calls[0]["diagnosis"], "checking invoices");
    // Without a diagnosis argument, the assistant's text goes with the call.
    assert_eq!(g.calls[1]["diagnosis"], "Refunding.");
    let first = &g.model_requests[0];
    assert_eq!(first["model"], "scripted-1");
    assert!(
        first["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("Refund duplicates only.")
    );
    assert!(
        first["messages"][1]["content"]
            .as_str()
            .unwrap()
            .contains("I was charged twice")
    );
    assert!(
        first["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "workspace__search_code")
    );
    let saved = g.transcript.clone().unwrap();
    assert_eq!(saved["events_consumed"], 1);
    assert_eq!(saved["messages"].as_array().unwrap().len(), 6);
}

#[tokio::test]
async fn garbage_from_the_model_is_reported_to_it_and_nothing_runs() {
    let w = world().await;
    {
        let mut g = m(&w.state);
        g.events.push(customer_event(1, "help"));
        g.model.push_back(answer(
            None,
            vec![
                tool_call(
                    "g1",
                    "stripe__create_refund",
                    r#"{"charge": "ch_1", "amount": 5"#,
                ),
                tool_call("g2", "stripe__teleport", "{}"),
                tool_call("g3", "stripe__list_invoices", "[1,2]"),
            ],
        ));
        g.model.push_back((
            500,
            json!({"status": "error", "error": "upstream_error", "message": "boom"}),
        ));
        g.model.push_back((
            502,
            json!({"status": "error", "error": "upstream_malformed", "message": "??"}),
        ));
        g.model.push_back(answer(Some("Sorry."), vec![]));
    }
    let mut r = Runner::load(w.settings.clone()).await.unwrap();
    r.read_events().await;
    assert_eq!(r.round().await, RoundEnd::Quiet);
    let results = tool_results(r.messages());
    assert_eq!(results.len(), 3);
    assert!(
        results[0]["error"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    assert!(
        results[1]["error"]
            .as_str()
            .unwrap()
            .contains("no tool `stripe__teleport`")
    );
    assert!(
        results[2]["error"]
            .as_str()
            .unwrap()
            .contains("JSON object")
    );
    let g = m(&w.state);
    assert!(g.calls.is_empty(), "nothing may run: {:?}", g.calls);
    assert_eq!(g.model_requests.len(), 4);
}

fn held(id: &str) -> (u16, Value) {
    (
        202,
        json!({"status": "pending_approval", "execution_id": id, "approval_url": "http://x/approvals/1",
        "expires_at": (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339()}),
    )
}

#[tokio::test]
async fn an_approved_hold_feeds_back_the_real_result() {
    let w = world().await;
    {
        let mut g = m(&w.state);
        g.events.push(customer_event(1, "refund please"));
        g.call_replies
            .insert("stripe.create_refund".into(), held("ex_1"));
        g.executions.insert(
            "ex_1".into(),
            json!({"execution_id": "ex_1", "tool": "stripe.create_refund", "status": "ok", "result": {"refund": "re_9"}}),
        );
        g.model.push_back(answer(
            None,
            vec![tool_call(
                "c1",
                "stripe__create_refund",
                r#"{"charge":"ch_1","diagnosis":"bad month, no duplicate"}"#,
            )],
        ));
        g.model.push_back(answer(
            None,
            vec![tool_call(
                "c2",
                "helpdesk__reply_to_thread",
                r#"{"thread_id":"th_1","text":"Done"}"#,
            )],
        ));
    }
    let mut r = Runner::load(w.settings.clone()).await.unwrap();
    r.read_events().await;
    assert_eq!(r.round().await, RoundEnd::Done);
    let results = tool_results(r.messages());
    assert_eq!(results[0]["result"]["refund"], "re_9");
    assert_eq!(m(&w.state).calls[0]["diagnosis"], "bad month, no duplicate");
    // The diagnosis also lands in the workspace, for the thread's branch.
    let findings =
        std::fs::read_to_string(w.workspace.path().join(".threadgate/findings.md")).unwrap();
    assert!(
        findings.contains("stripe.create_refund")
            && findings.contains("bad month, no duplicate")
            && findings.contains("http://x/approvals/1")
    );
}

#[tokio::test]
async fn a_denied_hold_gives_the_model_the_persons_message() {
    let w = world().await;
    {
        let mut g = m(&w.state);
        g.events.push(customer_event(1, "refund please"));
        g.call_replies
            .insert("stripe.create_refund".into(), held("ex_2"));
        g.executions.insert("ex_2".into(), json!({"execution_id": "ex_2", "tool": "stripe.create_refund", "status": "denied", "message": "Offer a credit instead"}));
        g.model.push_back(answer(
            None,
            vec![tool_call(
                "c1",
                "stripe__create_refund",
                r#"{"charge":"ch_1"}"#,
            )],
        ));
        g.model.push_back(answer(
            None,
            vec![tool_call(
                "c2",
                "helpdesk__reply_to_thread",
                r#"{"thread_id":"th_1","text":"We can offer a credit"}"#,
            )],
        ));
    }
    let mut r = Runner::load(w.settings.clone()).await.unwrap();
    r.read_events().await;
    assert_eq!(r.round().await, RoundEnd::Done);
    let results = tool_results(r.messages());
    assert_eq!(results[0]["status"], "denied");
    assert_eq!(results[0]["message"], "Offer a credit instead");
    // The model saw the denial before it replied.
    let seen = m(&w.state).model_requests[1]["messages"].to_string();
    assert!(seen.contains("Offer a credit instead"));
}

#[tokio::test]
async fn an_expired_hold_stops_and_leaves_a_note() {
    let w = world().await;
    {
        let mut g = m(&w.state);
        g.events.push(customer_event(1, "refund please"));
        g.call_replies
            .insert("stripe.create_refund".into(), held("ex_3"));
        g.executions.insert(
            "ex_3".into(),
            json!({"execution_id": "ex_3", "tool": "stripe.create_refund", "status": "expired"}),
        );
        g.model.push_back(answer(
            None,
            vec![
                tool_call("c1", "stripe__create_refund", r#"{"charge":"ch_1"}"#),
                tool_call(
                    "c2",
                    "helpdesk__reply_to_thread",
                    r#"{"thread_id":"th_1","text":"Done"}"#,
                ),
            ],
        ));
    }
    let mut r = Runner::load(w.settings.clone()).await.unwrap();
    r.read_events().await;
    assert_eq!(r.round().await, RoundEnd::LeftToPerson);
    let g = m(&w.state);
    let tools: Vec<&str> = g
        .calls
        .iter()
        .map(|c| c["tool"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["stripe.create_refund", "helpdesk.add_note"],
        "the reply after the expiry must not run"
    );
    assert_eq!(g.model_requests.len(), 1);
    // Every tool call has its answer, so the transcript stays valid for the model.
    assert_eq!(tool_results(r.messages()).len(), 2);
}

#[tokio::test]
async fn the_budget_stops_the_runner() {
    let w = world().await;
    {
        let mut g = m(&w.state);
        g.events.push(customer_event(1, "loop"));
        for i in 0..3 {
            g.model.push_back(answer(
                None,
                vec![tool_call(&format!("c{i}"), "stripe__list_invoices", "{}")],
            ));
        }
        // Then the mock answers 429 budget_exhausted.
    }
    let mut r = Runner::load(w.settings.clone()).await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(20), r.run())
        .await
        .expect("run returns at the budget")
        .unwrap();
    let g = m(&w.state);
    assert_eq!(g.calls.len(), 3);
    assert_eq!(g.model_requests.len(), 4);
}

// Before: a 403 secret_in_prompt parked the turn and every later turn resent the secret.
#[tokio::test]
async fn a_secret_in_the_prompt_stops_the_runner() {
    let w = world().await;
    {
        let mut g = m(&w.state);
        g.events.push(customer_event(1, "my key is sk_live_x"));
        g.events.push(customer_event(2, "hello?"));
        let refused = json!({"status": "error", "error": "secret_in_prompt", "message": "the stored secret \"stripe\""});
        g.model.push_back((403, refused));
        g.model
            .push_back(answer(Some("must never be asked"), vec![]));
    }
    let mut r = Runner::load(w.settings.clone()).await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(20), r.run())
        .await
        .expect("run returns at the refusal")
        .unwrap();
    let g = m(&w.state);
    assert_eq!(g.model_requests.len(), 1, "the prompt is not sent again");
    assert!(g.calls.is_empty());
}

#[tokio::test]
async fn a_resumed_session_goes_on_with_the_same_conversation() {
    let w = world().await;
    {
        let mut g = m(&w.state);
        g.events.push(customer_event(1, "first message"));
        g.model.push_back(answer(
            None,
            vec![tool_call(
                "c1",
                "helpdesk__reply_to_thread",
                r#"{"thread_id":"th_1","text":"Hello"}"#,
            )],
        ));
    }
    let mut first = Runner::load(w.settings.clone()).await.unwrap();
    first.read_events().await;
    assert_eq!(first.round().await, RoundEnd::Done);
    drop(first);
    {
        let mut g = m(&w.state);
        g.events.push(customer_event(2, "second message"));
        g.model.push_back(answer(
            None,
            vec![tool_call(
                "c2",
                "helpdesk__reply_to_thread",
                r#"{"thread_id":"th_1","text":"Again"}"#,
            )],
        ));
    }
    let mut second = Runner::load(w.settings.clone()).await.unwrap();
    second.read_events().await;
    assert_eq!(second.round().await, RoundEnd::Done);
    let g = m(&w.state);
    let seen = g.model_requests[1]["messages"].as_array().unwrap();
    let text = serde_json::to_string(seen).unwrap();
    assert!(text.contains("first message") && text.contains("second message"));
    assert_eq!(
        text.matches("first message").count(),
        1,
        "event 1 is not read twice"
    );
    assert_eq!(g.transcript.as_ref().unwrap()["events_consumed"], 2);
}

#[tokio::test]
async fn events_that_are_not_the_customers_do_not_wake_the_model() {
    let w = world().await;
    m(&w.state).events.push(json!({"position": 1, "event_id": "pEv_1", "type": "thread.note_created", "occurred_at_ms": 0, "event": {"payload": {"note": {"text": "internal"}}}}));
    let mut r = Runner::load(w.settings.clone()).await.unwrap();
    r.read_events().await;
    assert_eq!(r.messages().len(), 1, "only the system message");
    let journal = std::fs::read_to_string(w.settings.journal.as_ref().unwrap()).unwrap();
    assert!(journal.contains("thread.note_created"));
    m(&w.state).events.push(customer_event(2, "hello"));
    r.read_events().await;
    let last = r.messages().last().unwrap().content.clone().unwrap();
    assert!(last.contains("internal") && last.contains("hello"));
}

#[tokio::test]
async fn a_flood_of_events_and_a_huge_result_are_capped_and_the_transcript_fits() {
    let w = world().await;
    {
        let mut g = m(&w.state);
        for i in 1..=150 {
            g.events.push(customer_event(
                i,
                &format!("message {i} {}", "x".repeat(5000)),
            ));
        }
        g.transcript_cap = Some(60 * 1024);
        let huge = json!({"status": "ok", "execution_id": "ex_big", "result": {"data": "y".repeat(1 << 20)}});
        g.call_replies
            .insert("stripe.list_invoices".into(), (200, huge));
        for i in 0..4 {
            g.model.push_back(answer(
                None,
                vec![tool_call(&format!("c{i}"), "stripe__list_invoices", "{}")],
            ));
        }
        g.model.push_back(answer(Some("done"), vec![]));
    }
    let mut r = Runner::load(w.settings.clone()).await.unwrap();
    r.read_events().await;
    let events = r.messages()[1].content.clone().unwrap();
    assert!(events.len() <= 33 * 1024, "{}", events.len());
    assert!(events.contains("earlier events left out") && events.contains("message 150 "));
    assert_eq!(r.round().await, RoundEnd::Quiet);
    for message in r.messages().iter().filter(|m| m.role == Role::Tool) {
        assert!(message.content.as_deref().unwrap().len() <= 33 * 1024);
    }
    let g = m(&w.state);
    let saved = g.transcript.clone().unwrap();
    assert!(saved.to_string().len() <= 60 * 1024);
    // The last turn is saved: the cap elided older results, not the conversation.
    assert_eq!(
        saved["messages"].as_array().unwrap().last().unwrap()["content"],
        "done"
    );
}

#[tokio::test]
async fn a_session_stopped_while_a_call_is_held_waits_on_it_again_when_resumed() {
    let w = world().await;
    {
        let mut g = m(&w.state);
        g.events.push(customer_event(1, "refund please"));
        g.call_replies
            .insert("stripe.create_refund".into(), held("ex_r"));
        g.model.push_back(answer(
            None,
            vec![
                tool_call("c1", "stripe__create_refund", r#"{"charge":"ch_1"}"#),
                tool_call(
                    "c2",
                    "helpdesk__add_note",
                    r#"{"thread_id":"th_1","text":"after"}"#,
                ),
            ],
        ));
    }
    // The first run waits (no decision yet: the mock's wait is 404) until the session
    // stops: the task is dropped once the pending call is saved.
    let settings = w.settings.clone();
    let first = tokio::spawn(async move {
        let mut r = Runner::load(settings).await.unwrap();
        r.read_events().await;
        r.round().await
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !m(&w.state)
        .transcript
        .as_ref()
        .is_some_and(|t| t.to_string().contains("ex_r"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the hold was never saved"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    first.abort();
    let _ = first.await;
    {
        let mut g = m(&w.state);
        g.executions.insert(
            "ex_r".into(),
            json!({"execution_id": "ex_r", "tool": "stripe.create_refund", "status": "ok", "result": {"refund": "re_7"}}),
        );
        g.model.push_back(answer(
            None,
            vec![tool_call(
                "c3",
                "helpdesk__reply_to_thread",
                r#"{"thread_id":"th_1","text":"Refunded"}"#,
            )],
        ));
    }
    let mut resumed = Runner::load(w.settings.clone()).await.unwrap();
    resumed.resume_pending_hold().await;
    assert_eq!(resumed.round().await, RoundEnd::Done);
    let g = m(&w.state);
    let tools: Vec<&str> = g
        .calls
        .iter()
        .map(|c| c["tool"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["stripe.create_refund", "helpdesk.reply_to_thread"],
        "the held call is not sent twice; the unstarted one is not run blindly"
    );
    let seen = g.model_requests.last().unwrap()["messages"].to_string();
    assert!(
        seen.contains("re_7"),
        "the approved result reached the model"
    );
    assert!(
        seen.contains("interrupted"),
        "the call that never ran is reported"
    );
}

#[tokio::test]
async fn the_model_asks_for_a_checkpoint_and_reads_the_answer() {
    let w = world().await;
    {
        let mut g = m(&w.state);
        g.events.push(customer_event(1, "please fix the invoice"));
        g.model.push_back(answer(
            None,
            vec![
                tool_call("k1", "workspace__checkpoint", "{}"),
                tool_call("k2", "workspace__checkpoint", ""),
            ],
        ));
        g.model.push_back(answer(
            Some("Saved."),
            vec![tool_call(
                "k3",
                "helpdesk__reply_to_thread",
                r#"{"thread_id":"th_1","text":"Fixed."}"#,
            )],
        ));
    }
    let mut r = Runner::load(w.settings.clone()).await.unwrap();
    r.read_events().await;
    assert_eq!(r.round().await, RoundEnd::Done);
    assert_eq!(m(&w.state).checkpoints, 2);
    assert!(
        m(&w.state)
            .calls
            .iter()
            .all(|c| c["tool"] != "workspace.checkpoint"),
        "a checkpoint is no gateway call"
    );
    let results = tool_results(r.messages());
    assert_eq!(
        results[0],
        json!({"status": "ok", "checkpoint": {"branch": "threadgate/th_1", "commit": "abc123", "left_out": 0, "push": "pushed"}})
    );
    assert_eq!(results[1]["status"], "error");
    let refused = results[1]["error"].as_str().unwrap();
    assert!(
        refused.contains("too_soon") && refused.contains("9000 ms"),
        "{refused}"
    );
    let g = m(&w.state);
    let offered = &g.model_requests[0]["tools"];
    assert!(
        offered
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "workspace__checkpoint")
    );
}
