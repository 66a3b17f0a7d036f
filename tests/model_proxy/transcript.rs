//! The transcript: durable per session across a restart of threadgate, capped in size,
//! and a refused write leaves the stored one as it was.

use serde_json::json;
use threadgate::model::Provider;

use threadgate::session::{SessionState, store as sessions};

use crate::ModelWorld;
use crate::support::plain::email_received;
use crate::support::unix_http::unix_request;
use crate::support::wait::eventually;

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
        let t = thread.clone();
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
