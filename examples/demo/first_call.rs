//! `--first-call N`: webhook → the agent's first tool call (the first execution row of
//! the session), over N threads one after the other; prints the median with the load
//! average. A figure, not a test.

use std::time::{Duration, Instant};

use threadgate::model::Provider;
use threadgate::session::store as sessions;

use crate::support::agent::AgentWorld;

/// Measures and prints the figure over `count` threads.
pub(crate) async fn figure(count: usize) {
    let w = AgentWorld::new(Provider::Scripted).await;
    let app = w.start().await;
    let mut times = Vec::new();
    for _ in 0..count {
        let customer = w.customer(&[4200, 4200]).await;
        let sent = chrono::Utc::now().timestamp_millis();
        let thread = w
            .open_thread(&app, &customer, "I was charged twice for my order.")
            .await;
        let thread = threadgate::ids::ThreadId::parse(thread.as_str()).expect("thread id");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let t = thread.clone();
            let session = app
                .db
                .read(move |c| sessions::get(c, &t))
                .await
                .ok()
                .flatten()
                .map(|row| row.session_id);
            let Some(session) = session else {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            };
            let first = app
                .db
                .read(move |c| {
                    c.query_row(
                        "SELECT min(created_at_ms) FROM executions WHERE session_id = ?1",
                        [&session],
                        |r| r.get::<_, Option<i64>>(0),
                    )
                })
                .await
                .ok()
                .flatten();
            if let Some(at) = first {
                times.push(at - sent);
                break;
            }
            assert!(Instant::now() < deadline, "no tool call on {thread}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    times.sort_unstable();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "webhook -> first tool call, scripted model, {count} threads: median {} ms (min {}, max {}); load average {}",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1],
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    app.stop().await;
}
