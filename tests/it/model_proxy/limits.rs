//! What one session may hold in flight and spend in one call: at most
//! `max_queued_calls` model calls wait behind the running one (more are refused
//! before their body is read, naming the limit) while other sessions go on; and a
//! request whose size alone cannot fit the tokens left is refused before it is sent.

use std::path::Path;

use serde_json::{Value, json};
use threadgate::model::Provider;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{ModelWorld, chat_raw, customer_says};
use crate::support::wait::eventually;

/// A chat request with `text` as the customer's message, padded past `pad` bytes with
/// a tool schema of zeros (a large parsed tree for few bytes).
pub(super) fn padded(text: &str, pad: usize) -> Vec<u8> {
    let zeros = vec![0u8; pad / 2];
    let body = json!({
        "messages": customer_says(text),
        "tools": [{"type": "function", "function": {"name": "pad",
            "parameters": {"type": "object", "pad": zeros}}}],
    });
    serde_json::to_vec(&body).expect("body")
}

/// `POST /v1/model/chat/completions` with `body`, read even when the server answers
/// before reading it all (a write error then is expected; the answer is what counts).
pub(super) async fn post_tolerant(socket: &Path, body: &[u8]) -> (u16, Value) {
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/model/chat/completions HTTP/1.1\r\nHost: threadgate\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body).await;
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let answer = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, answer)
}

// Before: every request was read and parsed before it waited for the session's turn,
// so 31 padded requests of one session held 31 parsed trees (336 MB to 2.5 GB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_queue_are_refused_naming_the_limit_and_others_go_on() {
    let mw = ModelWorld::new(Provider::Openai)
        .await
        .with_limits(100_000_000, 100);
    let app = mw.world.start().await;
    let a = mw
        .world
        .customer_session(&app, "queue-a@example.com", &[900])
        .await
        .session;
    let b = mw
        .world
        .customer_session(&app, "queue-b@example.com", &[900])
        .await
        .session;
    // The running call: it stays upstream (a generous liveness bound) while the rest
    // arrive.
    let slow = {
        let a = a.clone();
        tokio::spawn(async move {
            chat_raw(
                &a,
                &json!({"messages": customer_says("[scripted:slow:60000] hi")}),
            )
            .await
        })
    };
    eventually("the first call reaches the upstream", || async {
        mw.model.seen().len() == 1
    })
    .await;
    // The default queue holds 2: of 4 more, 2 wait and 2 are refused at once.
    let body = padded("charged twice", 512 * 1024);
    let more: Vec<_> = (0..4)
        .map(|_| {
            let (socket, body) = (a.socket.clone(), body.clone());
            tokio::spawn(async move { post_tolerant(&socket, &body).await })
        })
        .collect();
    eventually("two calls are refused", || async {
        more.iter().filter(|c| c.is_finished()).count() >= 2
    })
    .await;
    assert!(!slow.is_finished(), "the running call still runs");
    let mut refused = Vec::new();
    let mut waiting = Vec::new();
    for call in more {
        if call.is_finished() {
            refused.push(call.await.expect("call"));
        } else {
            waiting.push(call);
        }
    }
    assert_eq!((refused.len(), waiting.len()), (2, 2));
    for (status, answer) in &refused {
        assert_eq!(
            (*status, answer["error"].as_str()),
            (429, Some("too_many_calls")),
            "{answer}"
        );
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("[model] max_queued_calls (2)"),
            "{message}"
        );
    }
    // Another session is not held up by this one's queue.
    let (status, answer) = chat_raw(&b, &json!({"messages": customer_says("charged twice")})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(mw.model.seen().len(), 2, "the waiting calls wait");
    slow.abort();
    waiting.iter().for_each(|c| c.abort());
    app.stop().await;
}

// Before: only the next call was refused; a 4 MB prompt took a session to 1,052,819
// tokens against a budget of 200,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_too_large_for_the_tokens_left_is_refused_before_it_is_sent() {
    let mw = ModelWorld::new(Provider::Openai)
        .await
        .with_limits(5000, 40);
    let app = mw.world.start().await;
    let s = mw
        .world
        .customer_session(&app, "overshoot@example.com", &[900])
        .await
        .session;
    let (status, first) = chat_raw(
        &s,
        &json!({"messages": customer_says("[scripted:tokens:4000] charged twice")}),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    let used = first["threadgate"]["tokens_used"].as_u64().expect("tokens");
    assert!((4000..5000).contains(&used), "{used}");
    // 100 kB are at least 12,500 tokens at 8 bytes a token: far more than what is left.
    let big = format!("charged twice {}", "lorem ipsum ".repeat(100_000 / 12));
    let (status, answer) = chat_raw(&s, &json!({"messages": customer_says(&big)})).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (429, Some("budget_exhausted")),
        "{answer}"
    );
    let message = answer["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("budget of 5000 model tokens")
            && message.contains(&format!("{} left", 5000 - used))
            && message.contains("[model] bytes_per_token (8)"),
        "{message}"
    );
    assert_eq!(mw.model.seen().len(), 1, "the large request was never sent");
    mw.world
        .note_containing(&s.thread_id, "model budget is spent", "the budget note")
        .await;
    app.session_stops(&s.thread_id).await;
    app.stop().await;
}
