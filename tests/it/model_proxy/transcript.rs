//! The transcript: durable per session across a restart of threadgate, capped in size,
//! and a refused write leaves the stored one as it was.

use std::time::Duration;

use serde_json::json;
use threadgate::app::Overrides;
use threadgate::model::Provider;
use threadgate::model::store as model_store;

use threadgate::session::{SessionState, store as sessions};

use super::ModelWorld;
use crate::support::plain::email_received;
use crate::support::unix_http::unix_request;
use crate::support::wait::eventually;
use crate::support::world::STRIPE_KEY;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transcript_survives_a_restart_and_is_capped() {
    let mut mw = ModelWorld::new(Provider::Scripted).await;
    mw.world.settings.model.transcript_max_bytes = 4096;
    let app = mw.world.start().await;
    let s = mw
        .world
        .customer_session(&app, "transcript@example.com", &[900])
        .await
        .session;
    let (status, empty) = unix_request(&s.socket, "GET", "/v1/transcript", None).await;
    assert_eq!(status, 200);
    assert_eq!(empty, json!({"messages": [], "events_consumed": 0}));

    let stored = json!({"messages": [{"role": "user", "content": "I was charged twice"}, {"role": "assistant", "content": "Looking."}], "events_consumed": 3});
    let (status, body) = unix_request(&s.socket, "PUT", "/v1/transcript", Some(&stored)).await;
    assert_eq!(status, 200, "{body}");

    // Above the cap: 413, and the stored transcript is unchanged.
    let huge =
        json!({"messages": [{"role": "user", "content": "x".repeat(5000)}], "events_consumed": 4});
    let (status, body) = unix_request(&s.socket, "PUT", "/v1/transcript", Some(&huge)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (413, Some("too_large")),
        "{body}"
    );
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(300_000)}]});
    assert_eq!(
        put_early_refused(&s.socket, &big.to_string()).await,
        413,
        "far above the cap, refused before reading it all"
    );
    for bad in [
        json!({"messages": "x"}),
        json!({"messages": [], "events_consumed": -1}),
    ] {
        let (status, _) = unix_request(&s.socket, "PUT", "/v1/transcript", Some(&bad)).await;
        assert_eq!(status, 400);
    }

    app.stop().await;
    let app = mw.world.start().await;
    let s = mw.world.session_of(&app, &s.thread_id).await;
    let (status, back) = unix_request(&s.socket, "GET", "/v1/transcript", None).await;
    assert_eq!(status, 200);
    assert_eq!(back, stored, "kept across a restart");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transcript_is_kept_across_an_idle_stop_and_resume() {
    let mut mw = ModelWorld::new(Provider::Scripted).await;
    mw.world.settings.sessions.idle_timeout = std::time::Duration::from_millis(300);
    let app = mw.world.start().await;
    let c = mw
        .world
        .customer_session(&app, "idle@example.com", &[900])
        .await;
    let s = c.session;
    let stored = json!({"messages": [{"role": "user", "content": "I was charged twice"}], "events_consumed": 1});
    let (status, _) = unix_request(&s.socket, "PUT", "/v1/transcript", Some(&stored)).await;
    assert_eq!(status, 200);
    let thread = s.thread_id.clone();
    eventually("the quiet session goes idle", || async {
        let t = threadgate::ids::ThreadId::parse(thread.as_str()).expect("thread id");
        let row = app
            .db
            .read(move |c| sessions::get(c, &t))
            .await
            .expect("read");
        row.is_some_and(|r| r.state == SessionState::Idle)
    })
    .await;
    // The customer writes again: the same session resumes in a new container.
    let customer_id = mw.world.plain.thread(&thread).customer.id;
    let status = app
        .send_webhook(&email_received(&thread, &customer_id, "idle@example.com"))
        .await;
    assert_eq!(status, 200);
    let resumed = mw.world.session_of(&app, &thread).await;
    assert_eq!(resumed.id, s.id, "the same session");
    let (status, back) = unix_request(&resumed.socket, "GET", "/v1/transcript", None).await;
    assert_eq!((status, back), (200, stored));
    app.stop().await;
}

// Before: a transcript was stored whatever it held; it is text that leaves the sandbox
// like a prompt, and was the one not scanned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transcript_holding_a_stored_secret_is_refused_and_the_stored_one_kept() {
    let mw = ModelWorld::new(Provider::Scripted).await;
    let app = mw.world.start().await;
    let s = mw
        .world
        .customer_session(&app, "transcript-leak@example.com", &[900])
        .await
        .session;
    let clean = json!({"messages": [{"role": "user", "content": "I was charged twice"}], "events_consumed": 1});
    let (status, _) = unix_request(&s.socket, "PUT", "/v1/transcript", Some(&clean)).await;
    assert_eq!(status, 200);
    let github = crate::support::github_stub::TOKEN;
    let leaks = [
        (
            "stripe_api_key",
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                "type": "function", "function": {"name": "stripe.list_charges",
                "arguments": format!("{{\"key\":\"{STRIPE_KEY}\"}}")}}]}]}),
        ),
        (
            "github_token",
            json!({"messages": [{"role": "tool", "tool_call_id": "c1", "content": "ok", github: 1}]}),
        ),
    ];
    for (name, leaky) in leaks {
        let (status, body) = unix_request(&s.socket, "PUT", "/v1/transcript", Some(&leaky)).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (403, Some("secret_in_transcript")),
            "{body}"
        );
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains(&format!("{name:?}")), "{message}");
        assert!(!message.contains(STRIPE_KEY) && !message.contains(github));
    }
    let (status, back) = unix_request(&s.socket, "GET", "/v1/transcript", None).await;
    assert_eq!(
        (status, back),
        (200, clean),
        "the stored transcript is unchanged"
    );
    let rows = app.audit_rows().await;
    let refused = rows
        .iter()
        .filter(|r| r.event == "refused" && r.outcome.as_deref() == Some("secret_in_transcript"));
    assert_eq!(refused.count(), 2, "each refusal is audited");
    let all = format!("{rows:?}");
    assert!(!all.contains(STRIPE_KEY) && !all.contains(github));
    app.verify_audit().await;
    app.stop().await;
}

// Before: a transcript (the whole conversation) was kept for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transcript_past_its_retention_is_deleted_and_a_newer_one_kept() {
    let mw = ModelWorld::new(Provider::Scripted).await;
    assert_eq!(
        mw.world.settings.model.transcript_retention,
        Duration::from_secs(30 * DAY),
        "the default retention"
    );
    let (app, clock) = mw.world.start_with_clock().await;
    let old = mw
        .world
        .customer_session(&app, "retention-old@example.com", &[900])
        .await
        .session;
    let new = mw
        .world
        .customer_session(&app, "retention-new@example.com", &[900])
        .await
        .session;
    let stored = json!({"messages": [{"role": "user", "content": "I was charged twice"}], "events_consumed": 1});
    let (status, _) = unix_request(&old.socket, "PUT", "/v1/transcript", Some(&stored)).await;
    assert_eq!(status, 200);
    clock.advance(Duration::from_secs(20 * DAY));
    let (status, _) = unix_request(&new.socket, "PUT", "/v1/transcript", Some(&stored)).await;
    assert_eq!(status, 200);
    app.stop().await;
    // 31 days after the first write, 11 after the second: the sweep at start deletes
    // only the first.
    clock.advance(Duration::from_secs(11 * DAY));
    let app = mw
        .world
        .start_with(Overrides {
            sandbox: Some(mw.world.sandbox.clone()),
            clock: Some(clock.clock()),
        })
        .await;
    let transcript_of = |session: String| {
        let db = app.db.clone();
        async move {
            db.read(move |c| model_store::transcript(c, &session))
                .await
                .expect("read")
        }
    };
    eventually("the old transcript is deleted", || async {
        transcript_of(old.id.clone()).await.is_none()
    })
    .await;
    let kept = transcript_of(new.id.clone())
        .await
        .expect("the newer one is kept");
    assert_eq!(kept.events_consumed, 1);
    app.stop().await;
}

const DAY: u64 = 24 * 3600;

/// A PUT whose body the server may refuse before reading it: a write error is
/// expected, the status line is what counts.
async fn put_early_refused(socket: &std::path::Path, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect");
    let head = format!(
        "PUT /v1/transcript HTTP/1.1\r\nHost: threadgate\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw);
    text.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}
