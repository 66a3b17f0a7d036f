//! What the relay adds to an agent's call, measured in one run, side by side,
//! alternating call by call, against the same call on the session's unix socket (as
//! the agent on Docker makes it):
//!
//! - a gated read, `stripe.get_charge` (scope check with the customer's email
//!   remembered through Stripe's events, secret scan, a decision on a snapshot, the
//!   connector, one group commit), on the socket and through the relay;
//! - a request that reaches no handler (a 404): the transport alone (for the relay:
//!   the agent's unix socket, TCP, a TLS 1.3 handshake (resumed after the first), the
//!   greeting and its `OK`, the gateway's router).
//!
//! Each call is one connection, as the agent runner makes them. Custom harness:
//! `cargo bench --bench relay_call`. Needs `.venv-peers` (`scripts/localstripe.sh
//! setup`). Environment: `RELAY_BENCH_N` (calls of each kind, default 400).

#![expect(
    clippy::indexing_slicing,
    reason = "test code: an index out of range is a failed test"
)]
#![expect(
    clippy::expect_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]

#[path = "../tests/it/support/mod.rs"]
pub mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::figures::{Series, load_average};
use support::relay::{RelaySetup, RunningRelay};
use support::world::Session;

const WARM_UP: usize = 20;
const WEBHOOK_SECRET: &str = "whsec_bench_relay_0123456789";

/// Reads run (only this bench's policy says so for every read).
const BENCH_POLICY: &str = r#"
policy:
  default_mode: risk
policies:
  - match: "stripe.get_*"
    action: always_run
"#;

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` only needs it to build.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    threadgate::telemetry::init().expect("logging");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn read(session: &Session, charge: &str) -> Duration {
    let started = Instant::now();
    let (status, body) = session
        .call("stripe.get_charge", json!({"charge": charge}), None)
        .await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{body}");
    took
}

async fn not_found(session: &Session) -> Duration {
    let started = Instant::now();
    let (status, _) = session.get("/v1/no-such-route").await;
    let took = started.elapsed();
    assert_eq!(status, 404);
    took
}

async fn run() {
    let n: usize = std::env::var("RELAY_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut world = support::world::World::with_policy_text(BENCH_POLICY).await;
    // The bench's one session calls back to back, faster than an agent is let.
    world.settings.sessions.calls_per_second = 0;
    world.use_stripe_events(WEBHOOK_SECRET).await;
    let tls = world.use_relay();
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900])
        .await;
    let charge = ada.charges[0].clone();
    let relay = RunningRelay::start(
        &app,
        world.dir.path(),
        "bench",
        RelaySetup::minted(&app, &tls.ca_file, &ada.session),
    )
    .await;
    let (socket, pod) = (ada.session.clone(), relay.session(&ada.session));

    let mut socket_read = Series::new("read on the unix socket", n);
    let mut relay_read = Series::new("read through the relay", n);
    let mut socket_404 = Series::new("  a 404 on the unix socket", n);
    let mut relay_404 = Series::new("  a 404 through the relay", n);
    let load_before = load_average();
    for i in 0..WARM_UP + n {
        let keep = i >= WARM_UP;
        // Alternate which goes first, so neither always runs on a warmer cache.
        let (a, b) = if i % 2 == 0 {
            let a = read(&socket, &charge).await;
            (a, read(&pod, &charge).await)
        } else {
            let b = read(&pod, &charge).await;
            (read(&socket, &charge).await, b)
        };
        let c = not_found(&socket).await;
        let d = not_found(&pod).await;
        if keep {
            socket_read.times.push(a);
            relay_read.times.push(b);
            socket_404.times.push(c);
            relay_404.times.push(d);
        }
    }
    let load_after = load_average();
    println!(
        "relay vs unix socket, N = {n} of each kind, alternating, after {WARM_UP} warm-up rounds; \
         load average {load_before} before, {load_after} after"
    );
    for series in [
        &mut socket_read,
        &mut relay_read,
        &mut socket_404,
        &mut relay_404,
    ] {
        series.print();
    }
    let (read_s, read_s99) = socket_read.median_p99();
    let (read_r, read_r99) = relay_read.median_p99();
    let (nf_s, _) = socket_404.median_p99();
    let (nf_r, _) = relay_404.median_p99();
    println!(
        "  added by the relay: read p50 {:.0} us (p99 {:.0} us), 404 p50 {:.0} us",
        read_r - read_s,
        read_r99 - read_s99,
        nf_r - nf_s
    );
    relay.stop().await;
    app.stop().await;
}
