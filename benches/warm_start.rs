//! Warm starts against the real Docker engine (custom harness, not criterion: each
//! sample starts a session).
//!
//! 1. Webhook to agent working: from the moment a new thread's signed delivery is sent
//!    to the runner's first request on its session socket (the line "first request on
//!    the session's socket"), and to the session's row saying `running`; one app with
//!    the pool (`sessions.pool_size`, default 2) and one without, their threads
//!    interleaved in the same run, so both meet the same load.
//! 2. A steady stream of one new thread per second to the pooled app: the hit rate
//!    (`threadgate_session_launches_total` warm / all) and the same latencies.
//!
//! Every thread is marked done once its agent works, so containers do not pile up.
//! The load average is printed before and after.
//!
//! `cargo bench --bench warm_start`. Needs root (mounting into running containers),
//! `scripts/docker-up.sh` and `scripts/build-sandbox-image.sh` (with the runner of this
//! tree: it looks for its socket every 5 ms). `WARM_BENCH_PAIRS` (default 30),
//! `WARM_BENCH_STREAM_SECS` (default 60) and `WARM_BENCH_POOL` (default 2) change the
//! sizes. Under `cargo test --all-targets` it is a smoke run (2 pairs, 3 s of stream).

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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::Utc;
use support::app::TestApp;
use support::plain::{event_id, plain_event, thread_id};
use support::sessions::{AppOptions, DockerWorld};
use tracing_subscriber::layer::{Context, SubscriberExt as _};

/// When each session's socket got its first request, by session id.
static FIRST_REQUESTS: OnceLock<Arc<Mutex<HashMap<String, Instant>>>> = OnceLock::new();

/// Records the instant of every "first request on the session's socket" line.
struct FirstRequests;

#[derive(Default)]
struct Fields {
    message: String,
    session: String,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "session" => self.session = format!("{value:?}"),
            _ => {}
        }
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "session" {
            self.session = value.to_owned();
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for FirstRequests {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let at = Instant::now();
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields
            .message
            .contains("first request on the session's socket")
        {
            let map = FIRST_REQUESTS.get_or_init(Default::default);
            map.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(fields.session, at);
        }
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "a rank in a sorted sample, rounded and within its length"
)]
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(label: &str, samples: &mut [f64]) {
    if samples.is_empty() {
        println!("{label:<40} no samples");
        return;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{label:<40} n={:<3} min {:>6.1}  p50 {:>6.1}  p90 {:>6.1}  p99 {:>6.1}  max {:>6.1} ms",
        samples.len(),
        samples[0],
        percentile(samples, 0.5),
        percentile(samples, 0.9),
        percentile(samples, 0.99),
        samples[samples.len() - 1],
    );
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    if support::docker::skip() {
        return;
    }
    let subscriber = tracing_subscriber::registry()
        .with(FirstRequests)
        .with(tracing_subscriber::filter::LevelFilter::INFO);
    tracing::subscriber::set_global_default(subscriber).expect("the bench's subscriber");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let full = std::env::args().any(|a| a == "--bench");
    let (pairs, stream) = if full { (30, 60) } else { (2, 3) };
    rt.block_on(async {
        println!("load average at start: {}", load_average());
        side_by_side(
            env_usize("WARM_BENCH_PAIRS", pairs),
            env_usize("WARM_BENCH_POOL", 2),
        )
        .await;
        println!("load average after the pairs: {}", load_average());
        steady_stream(
            env_usize("WARM_BENCH_STREAM_SECS", stream),
            env_usize("WARM_BENCH_POOL", 2),
        )
        .await;
        println!("load average at the end: {}", load_average());
    });
}

/// What one new thread took: to its row saying running, to the agent's first request.
struct Sample {
    running: Duration,
    first_request: Duration,
}

/// Opens a thread, waits for its agent's first request, then marks it done.
async fn one_thread(app: &TestApp) -> Sample {
    let thread = thread_id();
    let body = plain_event("thread-created.json", &thread, &event_id(), Utc::now()).to_string();
    let started = Instant::now();
    let (status, answer) = app.deliver(body.as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    let mut running = None;
    let mut session = None;
    let first_request = loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{thread}: no first request after 60 s"
        );
        if (running.is_none() || session.is_none())
            && let Some((state, _, id)) = app.session(&thread).await
        {
            session = Some(id);
            if state == "running" {
                running = Some(started.elapsed());
            }
        }
        if let Some(id) = &session {
            let seen = FIRST_REQUESTS
                .get_or_init(Default::default)
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(id)
                .copied();
            if let (Some(at), Some(_)) = (seen, running) {
                break at.saturating_duration_since(started);
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let done_at = Utc::now() + chrono::Duration::seconds(1);
    let done = plain_event(
        "thread-status-transitioned.json",
        &thread,
        &event_id(),
        done_at,
    );
    let (status, answer) = app.deliver(done.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    Sample {
        running: running.expect("running"),
        first_request,
    }
}

fn options(pool_size: usize) -> AppOptions {
    AppOptions {
        max_live: 64,
        pool_size,
        ..AppOptions::default()
    }
}

/// Waits until the pooled app has `size` sandboxes parked (bounded).
async fn pool_full(world: &DockerWorld, size: usize) {
    let runtime =
        threadgate::sandbox::DockerRuntime::connect(&world.instance, world.secrets_root.clone())
            .await
            .expect("runtime");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        use threadgate::sandbox::SandboxRuntime as _;
        if runtime.list_parked().await.map(|p| p.len()).unwrap_or(0) >= size {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("the pool did not fill in 60 s (not root? warm starts are off then)");
}

async fn side_by_side(pairs: usize, pool: usize) {
    println!(
        "== webhook -> agent working, warm pool ({pool} per agent) vs cold, {pairs} threads each, interleaved =="
    );
    let (warm_world, cold_world) = (DockerWorld::new(), DockerWorld::new());
    let warm_app = warm_world.start(options(pool)).await;
    let cold_app = cold_world.start(options(0)).await;
    pool_full(&warm_world, pool).await;
    // One warm-up of each, not counted.
    one_thread(&warm_app).await;
    one_thread(&cold_app).await;
    let (w0, c0) = launches();
    let (mut warm_first, mut warm_running, mut cold_first, mut cold_running) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..pairs {
        // Give the pool the time a real stream would (about a second between threads).
        tokio::time::sleep(Duration::from_millis(700)).await;
        let warm = one_thread(&warm_app).await;
        warm_first.push(ms(warm.first_request));
        warm_running.push(ms(warm.running));
        let cold = one_thread(&cold_app).await;
        cold_first.push(ms(cold.first_request));
        cold_running.push(ms(cold.running));
    }
    let (w1, c1) = launches();
    summary("warm: webhook -> agent's first request", &mut warm_first);
    summary("cold: webhook -> agent's first request", &mut cold_first);
    summary("warm: webhook -> session running", &mut warm_running);
    summary("cold: webhook -> session running", &mut cold_running);
    println!(
        "launches in these pairs: {} warm, {} cold (the cold app's {pairs} included)",
        w1 - w0,
        c1 - c0
    );
    warm_app.stop().await;
    cold_app.stop().await;
}

fn launches() -> (u64, u64) {
    (
        threadgate::metrics::session_launches("warm"),
        threadgate::metrics::session_launches("cold"),
    )
}

async fn steady_stream(secs: usize, pool: usize) {
    println!("== steady stream: one new thread per second for {secs} s, pool {pool} per agent ==");
    let world = DockerWorld::new();
    let app = Arc::new(world.start(options(pool)).await);
    pool_full(&world, pool).await;
    let (w0, c0) = launches();
    let started = Instant::now();
    let mut running = Vec::new();
    for i in 0..secs {
        let at = started + Duration::from_secs(u64::try_from(i).expect("a second's index"));
        tokio::time::sleep_until(at.into()).await;
        let app = app.clone();
        running.push(tokio::spawn(async move { one_thread(&app).await }));
    }
    let mut first = Vec::new();
    for sample in running {
        first.push(ms(sample
            .await
            .expect("a thread of the stream")
            .first_request));
    }
    let (w1, c1) = launches();
    let (warm, cold) = (w1 - w0, c1 - c0);
    #[expect(
        clippy::cast_precision_loss,
        reason = "counts of a minute's threads, far below 2^52"
    )]
    let rate = if warm + cold == 0 {
        0.0
    } else {
        warm as f64 * 100.0 / (warm + cold) as f64
    };
    summary("stream: webhook -> agent's first request", &mut first);
    println!(
        "hit rate: {warm} warm / {} launches = {rate:.1}%",
        warm + cold
    );
    if let Ok(app) = Arc::try_unwrap(app) {
        app.stop().await;
    }
}
