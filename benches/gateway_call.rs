//! What the gateway adds to a call, measured in one run, side by side, alternating call
//! by call, against the same request straight to localstripe with reqwest:
//!
//! - a read, `stripe.get_charge` (scope check, secret scan, a decision on a snapshot,
//!   the connector, then decision and outcome in one group commit), with Stripe's events
//!   configured so the customer's email is remembered, and the same read right after a
//!   signed `customer.updated` made it ask Stripe again (as every read does without
//!   Stripe's events);
//! - a write, `stripe.create_refund` under an `always_run` rule (completion lookups, the
//!   decision durable before it runs, the connector, the outcome commit);
//! - and the parts of the read path on their own: the two ownership lookups the scope
//!   check makes when nothing is remembered (`GET` charge, `GET` customer, straight to
//!   localstripe), one durable commit through the application's writer, and a request
//!   on the session socket that reaches no handler (a 404: connect, HTTP, routing).
//!
//! Custom harness: `cargo bench --bench gateway_call`. Needs `.venv-peers`
//! (`scripts/localstripe.sh setup`). Environment: `GATEWAY_BENCH_N` (calls of each
//! kind, default 400), `GATEWAY_BENCH_LOGS=capture` (keep the test harness's debug-level
//! log capture instead of the production default, `info` to stderr).

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

use std::time::Instant;

use serde_json::json;
use support::figures::{Series, load_average};

const WARM_UP: usize = 20;
const WEBHOOK_SECRET: &str = "whsec_bench_0123456789";

/// Reads run; a refund runs without a person (only this bench's policy says so).
const BENCH_POLICY: &str = r#"
policy:
  default_mode: risk
policies:
  - match: "stripe.create_refund"
    action: always_run
  - match: "stripe.get_*"
    action: always_run
"#;

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs the harness with no
    // such flag and only needs it to build.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if std::env::var("GATEWAY_BENCH_LOGS").as_deref() != Ok("capture") {
        // Installed first, so the harness's debug-level capture does not install.
        threadgate::telemetry::init().expect("logging");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let n: usize = std::env::var("GATEWAY_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut world = support::world::World::with_policy_text(BENCH_POLICY).await;
    // Stripe's events configured, as the README recommends: the scope check remembers
    // customer emails until Stripe says one changed.
    world.use_stripe_events(WEBHOOK_SECRET).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900, 1_000_000, 1_000_000])
        .await;
    let (charge, refunded, direct_refunded) = (
        ada.charges[0].clone(),
        ada.charges[1].clone(),
        ada.charges[2].clone(),
    );
    let base = world.stripe.base_url();
    let http = reqwest::Client::new();
    let get = |path: String| {
        let http = http.clone();
        let url = format!("{base}{path}");
        async move {
            let response = http
                .get(url)
                .bearer_auth(support::world::STRIPE_KEY)
                .send()
                .await
                .expect("localstripe");
            assert!(response.status().is_success());
            response.bytes().await.expect("body")
        }
    };
    let refund_direct = |amount: u64| {
        let http = http.clone();
        let url = format!("{base}/v1/refunds");
        let form = [
            ("charge", direct_refunded.clone()),
            ("amount", amount.to_string()),
            ("reason", "requested_by_customer".to_owned()),
        ];
        async move {
            let response = http
                .post(url)
                .bearer_auth(support::world::STRIPE_KEY)
                .form(&form)
                .send()
                .await
                .expect("localstripe");
            assert!(response.status().is_success());
            let _ = response.bytes().await.expect("body");
        }
    };
    // What Stripe sends when a customer changes: the next read asks Stripe again, as
    // every read does without Stripe's events.
    let forget_ada = || {
        let http = http.clone();
        let url = format!("http://{}/webhooks/stripe", app.addr);
        let event = json!({
            "id": "evt_bench", "type": "customer.updated",
            "data": {"object": {"id": ada.id, "object": "customer"}},
        })
        .to_string();
        async move {
            let signature = threadgate::connectors::stripe::events::sign(
                event.as_bytes(),
                WEBHOOK_SECRET.as_bytes(),
                chrono::Utc::now().timestamp(),
            );
            let response = http
                .post(url)
                .header("Stripe-Signature", signature)
                .body(event)
                .send()
                .await
                .expect("threadgate");
            assert!(response.status().is_success());
        }
    };
    let commit = |i: usize| {
        let db = app.db.clone();
        async move {
            db.write(move |c| {
                c.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('bench-commit', ?1)",
                    [i.to_string()],
                )
            })
            .await
            .expect("commit");
        }
    };

    let mut gateway_read = Series::new("read through the gateway", n);
    let mut asked_read = Series::new("read, customer's email asked again", n);
    let mut direct_read = Series::new("read straight to localstripe", n);
    let mut lookups = Series::new("  two scope lookups (none remembered), straight", n);
    let mut commits = Series::new("  one durable commit (the writer)", n);
    let mut socket = Series::new("  the session socket's round trip (a 404)", n);
    let mut gateway_write = Series::new("write (refund) through the gateway", n);
    let mut direct_write = Series::new("write (refund) straight to localstripe", n);
    let read_through_gateway = || async {
        let started = Instant::now();
        let (status, body) = ada
            .session
            .call("stripe.get_charge", json!({"charge": charge}), None)
            .await;
        let took = started.elapsed();
        assert_eq!(status, 200, "{body}");
        took
    };
    let load_before = load_average();
    for i in 0..WARM_UP + n {
        let keep = i >= WARM_UP;
        let took = read_through_gateway().await;
        keep.then(|| gateway_read.times.push(took));

        let started = Instant::now();
        get(format!("/v1/charges/{charge}")).await;
        keep.then(|| direct_read.times.push(started.elapsed()));

        forget_ada().await;
        let took = read_through_gateway().await;
        keep.then(|| asked_read.times.push(took));

        let started = Instant::now();
        get(format!("/v1/charges/{charge}")).await;
        get(format!("/v1/customers/{}", ada.id)).await;
        keep.then(|| lookups.times.push(started.elapsed()));

        let started = Instant::now();
        commit(i).await;
        keep.then(|| commits.times.push(started.elapsed()));

        let started = Instant::now();
        let (status, _) = ada.session.get("/v1/no-such-route").await;
        keep.then(|| socket.times.push(started.elapsed()));
        assert_eq!(status, 404);

        // Distinct amounts: an identical refund would be answered from the first.
        let amount = 1 + i as u64;
        let started = Instant::now();
        let args = json!({"charge": refunded, "amount": amount, "reason": "requested_by_customer"});
        let (status, body) = ada.session.call("stripe.create_refund", args, None).await;
        let took = started.elapsed();
        assert_eq!(status, 200, "{body}");
        keep.then(|| gateway_write.times.push(took));

        let started = Instant::now();
        refund_direct(amount).await;
        keep.then(|| direct_write.times.push(started.elapsed()));
    }
    let load_after = load_average();
    println!(
        "gateway calls, N = {n} of each kind, alternating, after {WARM_UP} warm-up rounds; \
         load average {load_before} before, {load_after} after"
    );
    for series in [
        &mut gateway_read,
        &mut asked_read,
        &mut direct_read,
        &mut lookups,
        &mut commits,
        &mut socket,
        &mut gateway_write,
        &mut direct_write,
    ] {
        series.print();
    }
    let (read_g, _) = gateway_read.median_p99();
    let (read_d, _) = direct_read.median_p99();
    let (asked, _) = asked_read.median_p99();
    let (write_g, _) = gateway_write.median_p99();
    let (write_d, _) = direct_write.median_p99();
    println!(
        "  added by the gateway at the median: read {:.0} us (email asked again: {:.0} us), \
         write {:.0} us",
        read_g - read_d,
        asked - read_d,
        write_g - write_d
    );
    let rows = app.executions().await;
    let audit = app.audit_rows().await;
    println!(
        "  recorded: {} executions, {} audit rows ({:.1} per call); chain verifies ({} rows)",
        rows.len(),
        audit.len(),
        audit.len() as f64 / rows.len().max(1) as f64,
        app.verify_audit().await
    );
    app.stop().await;
}
