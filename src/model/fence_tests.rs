//! The writes the gate and the model proxy make for a session carry the session's
//! lease: once another instance has taken the thread over, the old owner's gated call
//! and model call are refused (`session_moved`) and leave no row. On every backend.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use tower::ServiceExt as _;

use super::config::ModelSettings;
use super::proxy::{ModelProxy, ProxyError};
use super::upstream::Upstream;
use crate::clock::Clock;
use crate::connectors::Credential;
use crate::gateway::{
    CallReply, CallRequest, Connectors, Gate, GateParts, LoadedPolicy, Refusal, SandboxRouter,
};
use crate::ids::{SessionId, ThreadId};
use crate::policy::Policy;
use crate::secrets::Redactor;
use crate::session::{AgentBook, AgentDefinition, SessionScope, Supervisor};
use crate::store::leases::{self, Lease};
use crate::store::testing::each_backend;
use crate::store::{Db, params};

const POLICY: &str = r#"
policy:
  default_mode: risk
policies:
  - match: "helpdesk.add_note"
    action: require_approval
  - match: "helpdesk.get_thread"
    action: always_run
"#;

const NOW: i64 = 1_000_000;
const LEASE_MS: i64 = 30_000;

fn agents() -> AgentBook {
    let mut agents = AgentBook::default();
    agents.insert(AgentDefinition {
        name: "support".into(),
        description: String::new(),
        command: None,
        tools: vec!["*".into()],
        secrets: vec![],
        skills: vec![],
        model: super::scripted::MODEL_ID.into(),
        limits: Default::default(),
        harness: None,
        instructions: String::new(),
    });
    agents
}

fn gate(db: &Db) -> Arc<Gate> {
    let clock = Clock::fixed(NOW);
    let (supervisor, _inbox) = Supervisor::channel(clock.clone());
    let policy = Policy::parse(POLICY, "fence.yaml").unwrap();
    Arc::new(Gate::new(GateParts {
        db: db.clone(),
        policy: Arc::new(LoadedPolicy::new(policy, "fence.yaml".into())),
        connectors: Connectors::default(),
        redactor: Arc::new(Redactor::empty()),
        redactor_source: None,
        agents: Arc::new(agents()),
        public_url: "http://127.0.0.1:1".into(),
        clock,
        supervisor,
        max_pending_holds: 0,
        max_calls_per_session: 64,
        max_calls_in_all: 1024,
        call_rate: crate::gateway::rate::CallRate {
            per_second: 0,
            burst: 0,
        },
        instance_id: "inst-a".into(),
        tasks: crate::tasks::Tasks::new(),
    }))
}

fn scope(lease: Lease) -> SessionScope {
    SessionScope {
        session_id: SessionId::parse("se_fence").unwrap(),
        thread_id: ThreadId::parse("th_fence").unwrap(),
        agent: "support".into(),
        customer_id: None,
        customer_email: None,
        lease,
    }
}

/// `inst-a` took the thread's lease, let it expire, and `inst-b` took it over: the
/// stale lease and the current one.
async fn taken_over(db: &Db) -> (Lease, Lease) {
    db.write(|c| {
        let thread = ThreadId::parse("th_fence").unwrap();
        let old = leases::acquire(c, &thread, "inst-a", NOW - 2 * LEASE_MS, LEASE_MS)?;
        let new = leases::acquire(c, &thread, "inst-b", NOW, LEASE_MS)?;
        Ok((old.unwrap(), new.unwrap()))
    })
    .await
    .unwrap()
}

/// Rows the session left in each table a call or a model call writes.
async fn rows(db: &Db) -> Vec<(&'static str, i64)> {
    db.read(|c| {
        let mut out = Vec::new();
        for (table, column) in [
            ("executions", "session_id"),
            ("limit_charges", "execution_id"),
            ("note_outbox", "thread_id"),
            ("thread_event_outbox", "thread_id"),
            ("model_usage", "session_id"),
            ("transcripts", "session_id"),
        ] {
            let n: i64 = c.query_row(
                &format!("SELECT count(*) FROM {table} WHERE {column} IS NOT NULL"),
                params![],
                |r| r.get(0),
            )?;
            out.push((table, n));
        }
        Ok(out)
    })
    .await
    .unwrap()
}

fn nothing() -> Vec<(&'static str, i64)> {
    [
        "executions",
        "limit_charges",
        "note_outbox",
        "thread_event_outbox",
        "model_usage",
        "transcripts",
    ]
    .into_iter()
    .map(|t| (t, 0))
    .collect()
}

fn call(tool: &str) -> CallRequest {
    serde_json::from_value(serde_json::json!({
        "tool": tool,
        "args": if tool == "helpdesk.add_note" {
            serde_json::json!({"text": "a note"})
        } else {
            serde_json::json!({})
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owners_gated_calls_are_refused_and_leave_no_row() {
    let dir = tempfile::tempdir().unwrap();
    for backend in each_backend(dir.path()) {
        let db = backend.open().unwrap();
        let (stale, current) = taken_over(&db).await;
        assert_eq!((stale.token, current.token), (1, 2));
        let gate = gate(&db);
        // A write the policy holds: the execution row, its audit, the note and the
        // trail event would be written in the deciding transaction.
        let held = gate
            .call(&scope(stale.clone()), call("helpdesk.add_note"))
            .await;
        assert!(
            matches!(held, CallReply::Refused(Refusal::SessionMoved)),
            "{held:?}"
        );
        // A read decided on a snapshot and run: its decision's commit is refused.
        let read = gate
            .call(&scope(stale.clone()), call("helpdesk.get_thread"))
            .await;
        assert!(
            matches!(read, CallReply::Refused(Refusal::SessionMoved)),
            "{read:?}"
        );
        assert_eq!(rows(&db).await, nothing());
        // The thread's owner makes the same call: held, written.
        let held = gate.call(&scope(current), call("helpdesk.add_note")).await;
        assert!(matches!(held, CallReply::Held { .. }), "{held:?}");
        let written = rows(&db).await;
        assert!(written.contains(&("executions", 1)), "{written:?}");
        assert!(written.contains(&("note_outbox", 1)), "{written:?}");
    }
}

fn proxy(gate: Arc<Gate>) -> Arc<ModelProxy> {
    // Never reached: a stale owner's call is refused before it goes upstream.
    let settings = ModelSettings {
        base_url: "http://127.0.0.1:1/v1".into(),
        ..ModelSettings::default()
    };
    let upstream = Upstream::new(settings.clone(), Credential::new("fake_key_model")).unwrap();
    Arc::new(ModelProxy::new(gate, settings, upstream))
}

async fn put_transcript(proxy: &Arc<ModelProxy>, lease: Lease) -> (StatusCode, String) {
    let router = proxy.router(scope(lease));
    let request = Request::put("/v1/transcript")
        .header("content-type", "application/json")
        .body(Body::from(
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
        ))
        .unwrap();
    let answer = router.oneshot(request).await.unwrap();
    let status = answer.status();
    let body = axum::body::to_bytes(answer.into_body(), 1 << 16)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owners_model_call_and_transcript_are_refused_and_leave_no_row() {
    let dir = tempfile::tempdir().unwrap();
    for backend in each_backend(dir.path()) {
        let db = backend.open().unwrap();
        let (stale, current) = taken_over(&db).await;
        let proxy = proxy(gate(&db));
        let stale_scope = scope(stale.clone());
        let place = proxy.queue(&stale_scope).unwrap();
        let body = Bytes::from_static(br#"{"messages": [{"role": "user", "content": "hi"}]}"#);
        let answer = proxy.chat(place, &stale_scope, body).await;
        assert!(
            matches!(answer, Err(ProxyError::SessionMoved)),
            "{answer:?}"
        );
        let (status, body) = put_transcript(&proxy, stale).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(body.contains("session_moved"), "{body}");
        assert_eq!(rows(&db).await, nothing());
        // The owner's transcript is stored.
        let (status, body) = put_transcript(&proxy, current).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(rows(&db).await.contains(&("transcripts", 1)));
    }
}
