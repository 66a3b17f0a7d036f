//! An instance whose session lease another instance took over, while the session's
//! socket is still open here (a paused process, a partition): its next gated call and
//! its next model call are refused with 409 `session_moved` and leave no row, and the
//! session is dropped here (its socket closes) without waiting for the next renewal.

use std::time::Duration;

use serde_json::json;
use threadgate::model::Provider;

use super::{ModelWorld, chat_raw, customer_says, offered_tools};
use crate::support::unix_http::unix_request_or_cut;
use crate::support::wait::eventually;

/// Rows of the thread's executions, its model turns, its queued notes.
async fn rows(app: &crate::support::app::TestApp, session: &str, thread: &str) -> (i64, i64, i64) {
    let (session, thread) = (session.to_owned(), thread.to_owned());
    app.db
        .read(move |c| {
            let executions: i64 = c.query_row(
                "SELECT count(*) FROM executions WHERE thread_id = ?1",
                [&thread],
                |r| r.get(0),
            )?;
            let turns: i64 = c.query_row(
                "SELECT coalesce(sum(turns_used), 0) FROM model_usage WHERE session_id = ?1",
                [&session],
                |r| r.get(0),
            )?;
            let notes: i64 = c.query_row(
                "SELECT count(*) FROM note_outbox WHERE thread_id = ?1",
                [&thread],
                |r| r.get(0),
            )?;
            Ok((executions, turns, notes))
        })
        .await
        .expect("read rows")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_lease_was_taken_over_can_neither_call_nor_spend() {
    let mut mw = ModelWorld::new(Provider::Scripted).await;
    // Renewals every 20 s: the takeover below is seen through the refused writes, not a
    // renewal.
    mw.world.settings.sessions.lease_time = Duration::from_secs(60);
    let app = mw.world.start().await;
    let c = mw
        .world
        .customer_session(&app, "fenced@example.com", &[1200])
        .await;
    let s = &c.session;
    let convo = customer_says("Please refund my last charge.");

    // The owner's calls go through.
    let chat_body = json!({"messages": convo, "tools": offered_tools(s).await});
    let (status, body) = chat_raw(s, &chat_body).await;
    assert_eq!(status, 200, "{body}");
    let held = s.hold_refund(&c.charges[0], 500).await;
    let before = rows(&app, &s.id, &s.thread_id).await;
    assert_eq!(
        (before.0, before.1),
        (1, 1),
        "{held}: one held call, one turn"
    );

    // Another instance takes the thread over (its lease, with the next token), while
    // this instance's socket for the session is still open.
    let thread = s.thread_id.clone();
    let changed = app
        .db
        .write(move |c| {
            c.execute(
                "UPDATE session_leases SET owner = 'inst-elsewhere', token = token + 1, \
                 expires_at_ms = 4000000000000000 WHERE thread_id = ?1",
                [&thread],
            )
        })
        .await
        .expect("take the lease over");
    assert_eq!(changed, 1);

    // The three requests go at once: the first refusal has the session dropped here,
    // and its socket then takes no new connection. One whose connection the socket had
    // accepted but whose request it had not begun to read when it closed is cut (the
    // server closes idle connections at its close); every one answered is refused.
    let args = json!({"tool": "stripe.create_refund",
        "args": {"charge": c.charges[0], "amount": 300, "reason": "requested_by_customer"}});
    let transcript = json!({"messages": [{"role": "user", "content": "hi"}]});
    let socket = &s.socket;
    let (call, chat, put) = tokio::join!(
        unix_request_or_cut(socket, "POST", "/v1/calls", Some(&args)),
        unix_request_or_cut(
            socket,
            "POST",
            "/v1/model/chat/completions",
            Some(&chat_body)
        ),
        unix_request_or_cut(socket, "PUT", "/v1/transcript", Some(&transcript)),
    );
    let answered: Vec<_> = [call, chat, put].into_iter().flatten().collect();
    assert!(!answered.is_empty(), "the first request is answered");
    for (status, body) in answered {
        assert_eq!(
            (status, body["error"].as_str()),
            (409, Some("session_moved")),
            "{body}"
        );
    }
    assert_eq!(
        rows(&app, &s.id, &s.thread_id).await,
        before,
        "no execution, turn or note written by the stale owner"
    );
    let transcripts: i64 = {
        let session = s.id.clone();
        app.db
            .read(move |c| {
                c.query_row(
                    "SELECT count(*) FROM transcripts WHERE session_id = ?1",
                    [&session],
                    |r| r.get(0),
                )
            })
            .await
            .expect("read transcripts")
    };
    assert_eq!(transcripts, 0);

    // The refusals told the supervisor: the session is dropped here (its socket
    // closes) well before the next renewal would have noticed.
    eventually("the stale session's socket closes", || async {
        tokio::net::UnixStream::connect(&s.socket).await.is_err()
    })
    .await;
}
