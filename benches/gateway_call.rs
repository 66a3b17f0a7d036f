//! What the gateway adds to a call: `stripe.get_charge` through a session's socket
//! (scope, secret scan, policy decision and its durable execution and audit rows, the
//! connector, the outcome row) against the same request straight to localstripe with
//! reqwest, in the same run, alternating, N = 200 each after a warm-up.
//!
//! Custom harness: `cargo bench --bench gateway_call`. Needs `.venv-peers`
//! (`scripts/localstripe.sh setup`).

// Benchmark code: an unwrap or expect that fails stops the run with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/github_stub.rs"]
mod github_stub;
#[path = "../tests/support/localstripe.rs"]
mod localstripe;
#[path = "../tests/support/plain_fake.rs"]
mod plain_fake;

#[path = "../tests/gateway_e2e/harness.rs"]
mod harness;
#[path = "../tests/gateway_e2e/unix_http.rs"]
mod unix_http;

use std::time::{Duration, Instant};

use serde_json::json;

const N: usize = 200;
const WARM_UP: usize = 20;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs the harness with no
    // such flag and only needs it to build.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let world = harness::World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900])
        .await;
    let charge = ada.charges[0].clone();
    let direct_url = format!("{}/v1/charges/{charge}", world.stripe.base_url());
    let http = reqwest::Client::new();

    let through_gateway = || {
        let session = ada.session.clone();
        let charge = charge.clone();
        async move {
            let started = Instant::now();
            let (status, body) = session
                .call("stripe.get_charge", json!({"charge": charge}), None)
                .await;
            let took = started.elapsed();
            assert_eq!(status, 200, "{body}");
            took
        }
    };
    let direct = || {
        let http = http.clone();
        let url = direct_url.clone();
        async move {
            let started = Instant::now();
            let response = http
                .get(url)
                .bearer_auth(harness::STRIPE_KEY)
                .send()
                .await
                .expect("localstripe");
            assert!(response.status().is_success());
            let _ = response.bytes().await.expect("body");
            started.elapsed()
        }
    };

    for _ in 0..WARM_UP {
        through_gateway().await;
        direct().await;
    }
    let mut gateway = Vec::with_capacity(N);
    let mut straight = Vec::with_capacity(N);
    for _ in 0..N {
        gateway.push(through_gateway().await);
        straight.push(direct().await);
    }
    gateway.sort();
    straight.sort();
    let (g50, s50) = (percentile(&gateway, 0.5), percentile(&straight, 0.5));
    let (g90, s90) = (percentile(&gateway, 0.9), percentile(&straight, 0.9));
    println!("stripe.get_charge, N = {N} each (alternating, after {WARM_UP} warm-up calls)");
    println!(
        "  straight to localstripe:  median {:8.0} us   p90 {:8.0} us",
        micros(s50),
        micros(s90)
    );
    println!(
        "  through the gateway:      median {:8.0} us   p90 {:8.0} us",
        micros(g50),
        micros(g90)
    );
    println!(
        "  added by the gateway:     median {:8.0} us",
        micros(g50) - micros(s50)
    );
    let rows = app.executions().await;
    let audit = app.audit_rows().await;
    println!(
        "  recorded: {} executions, {} audit rows ({:.1} per call)",
        rows.len(),
        audit.len(),
        audit.len() as f64 / rows.len().max(1) as f64
    );
    app.stop().await;
}
