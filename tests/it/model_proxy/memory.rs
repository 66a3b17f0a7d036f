//! The figure behind `[model] max_queued_calls`: the peak memory of threadgate while
//! one session sends N padded model calls at once. Not a test of behaviour (that is
//! `limits.rs`); ignored by default and run by `scripts/model-memory.sh`.
//!
//! threadgate runs in this process; the scripted upstream runs as a child process
//! (`threadgate scripted-model`), so the bodies it parses are not counted. The client
//! sends the same shared body on every connection. The peak is the process's VmHWM,
//! reset through `/proc/self/clear_refs` just before the calls.

use std::sync::Arc;

use threadgate::model::Provider;

use super::ModelWorld;
use super::limits::{padded, post_tolerant};

/// A `threadgate scripted-model` child process, killed when dropped.
struct ScriptedChild {
    child: std::process::Child,
    base: String,
}

impl ScriptedChild {
    async fn start() -> ScriptedChild {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_threadgate"))
            .args(["scripted-model", "--listen", &format!("127.0.0.1:{port}")])
            .spawn()
            .expect("start the scripted model");
        let health = format!("http://127.0.0.1:{port}/healthz");
        crate::support::wait::eventually("the scripted model answers", || async {
            reqwest::get(&health).await.is_ok()
        })
        .await;
        ScriptedChild {
            child,
            base: format!("http://127.0.0.1:{port}/v1"),
        }
    }
}

impl Drop for ScriptedChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `VmRSS` and `VmHWM` of this process, in MiB.
fn rss_and_peak() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .expect("a VmRSS/VmHWM line")
    };
    (kib("VmRSS:") / 1024, kib("VmHWM:") / 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: scripts/model-memory.sh"]
async fn peak_memory_of_one_session_sending_padded_calls_at_once() {
    let calls: usize = std::env::var("MODEL_MEMORY_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(31);
    let upstream = ScriptedChild::start().await;
    let mut mw = ModelWorld::new(Provider::Scripted)
        .await
        .with_limits(1_000_000_000_000, 1_000_000);
    mw.world.settings.model.base_url = upstream.base.clone();
    let max = mw.world.settings.model.max_request_bytes;
    let app = mw.world.start().await;
    let s = mw
        .world
        .customer_session(&app, "memory@example.com", &[900])
        .await
        .session;
    let body = Arc::new(padded("[scripted:slow:1000] charged twice", max - 4096));
    assert!(body.len() <= max, "{} bytes", body.len());
    let (rss_before, _) = rss_and_peak();
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let sent: Vec<_> = (0..calls)
        .map(|_| {
            let (socket, body) = (s.socket.clone(), body.clone());
            tokio::spawn(async move { post_tolerant(&socket, &body).await })
        })
        .collect();
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    for call in sent {
        let (status, answer) = call.await.expect("call");
        let code = answer["error"].as_str().unwrap_or("ok");
        *statuses.entry(format!("{status} {code}")).or_default() += 1;
    }
    let (rss_after, peak) = rss_and_peak();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "model-memory: {calls} calls of {} bytes from one session: VmRSS before {rss_before} MiB, \
         VmHWM during {peak} MiB, VmRSS after {rss_after} MiB; answers {statuses:?}; loadavg {}",
        body.len(),
        load.trim()
    );
    app.stop().await;
}
