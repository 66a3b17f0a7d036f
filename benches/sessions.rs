//! Session figures against the real Docker engine (custom harness, not criterion: each
//! sample starts a container, so a handful of samples is what there is).
//!
//! 1. Webhook to container running: the median over 20 new threads, from the moment
//!    the signed delivery is sent to the moment the session's row says `running`
//!    (its container is started then), against a bare `docker run -d` of the same
//!    image with the same lock-down flags, interleaved in the same run.
//! 2. A burst of 100 new threads in one second (each delivered twice, as Plain's
//!    retries would) with `max_live` 8: every thread gets exactly one session, running
//!    or queued; no event is lost or doubled; the queue drains as slots free.
//!
//! `cargo bench --bench sessions`. Needs `scripts/docker-up.sh` and
//! `scripts/build-sandbox-image.sh`. `SESSIONS_BENCH_STARTS` (default 20) and
//! `SESSIONS_BENCH_BURST` (default 100) change the sizes. Under `cargo test
//! --all-targets` it is a smoke run (2 starts, a burst of 12).

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

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::Utc;
use support::app::TestApp;
use support::docker::docker;
use support::plain::{event_id, plain_event, retry_of, thread_id};
use support::sessions::{AppOptions, DockerWorld};
use support::wait::wait_for;

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

fn summary(label: &str, samples: &mut [f64]) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let median = percentile(samples, 0.5);
    println!(
        "{label:<34} n={:<3} min {:>7.1}  p50 {:>7.1}  p90 {:>7.1}  max {:>7.1} ms",
        samples.len(),
        samples[0],
        median,
        percentile(samples, 0.9),
        samples[samples.len() - 1],
    );
    median
}

fn main() {
    if support::docker::skip() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // `cargo bench` passes --bench; `cargo test --all-targets` does not, and gets a
    // smoke run that checks the same things on fewer threads.
    let full = std::env::args().any(|a| a == "--bench");
    let (starts, threads) = if full { (20, 100) } else { (2, 12) };
    rt.block_on(async {
        start_latency(env_usize("SESSIONS_BENCH_STARTS", starts)).await;
        burst(env_usize("SESSIONS_BENCH_BURST", threads), 8).await;
    });
}

/// `docker run -d` with the flags threadgate's runtime sets, timed as a caller sees it.
fn bare_docker_run(label: &str, workspace: &std::path::Path) -> Duration {
    let mount = format!("{}:/workspace", workspace.display());
    let started = Instant::now();
    let (code, _, err) = docker(&[
        "run",
        "-d",
        "--label",
        label,
        "--network",
        "none",
        "--read-only",
        "--tmpfs",
        "/tmp:rw,exec,nosuid,nodev,mode=1777,size=268435456",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--user",
        "10001:10001",
        "--memory",
        "256m",
        "--memory-swap",
        "256m",
        "--cpus",
        "0.5",
        "--pids-limit",
        "128",
        "--init",
        "--ipc",
        "private",
        "-v",
        &mount,
        "-w",
        "/workspace",
        &support::docker::image(),
        "/usr/local/bin/threadgate-agent-runner",
    ]);
    let took = started.elapsed();
    assert_eq!(code, 0, "docker run: {err}");
    took
}

async fn start_latency(n: usize) {
    println!("== webhook to container running, {n} new threads ==");
    let world = DockerWorld::new();
    let app = world
        .start(AppOptions {
            max_live: n + 1,
            ..AppOptions::default()
        })
        .await;
    let bare_label = format!("threadgate.bench={}", world.instance);
    let bare_workspace = world.root.path().join("bare-workspace");
    std::fs::create_dir_all(&bare_workspace).expect("bare workspace");
    // One warm-up of each, not counted.
    bare_docker_run(&bare_label, &bare_workspace);
    one_session(&app).await;

    let (mut bare, mut session, mut ack) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        bare.push(ms(bare_docker_run(&bare_label, &bare_workspace)));
        let (answered, running) = one_session(&app).await;
        ack.push(ms(answered));
        session.push(ms(running));
    }
    let bare_median = summary("bare docker run -d", &mut bare);
    let session_median = summary("webhook -> container running", &mut session);
    summary("  of which webhook -> 2xx", &mut ack);
    println!(
        "session start / bare docker run (medians): {:.2} ({:+.0}%)",
        session_median / bare_median,
        (session_median / bare_median - 1.0) * 100.0
    );
    let (_, ids, _) = docker(&["ps", "-aq", "--filter", &format!("label={bare_label}")]);
    let mut args = vec!["rm", "-f"];
    args.extend(ids.split_whitespace());
    if args.len() > 2 {
        docker(&args);
    }
}

/// Opens one new thread and returns (time to the 2xx, time until the session runs).
async fn one_session(app: &TestApp) -> (Duration, Duration) {
    let thread = thread_id();
    let body = plain_event("thread-created.json", &thread, &event_id(), Utc::now()).to_string();
    let started = Instant::now();
    let (status, answer) = app.deliver(body.as_bytes()).await;
    let answered = started.elapsed();
    assert_eq!(status, 200, "{answer}");
    loop {
        if let Some((state, _, _)) = app.session(&thread).await
            && state == "running"
        {
            return (answered, started.elapsed());
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{thread} never ran"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Counts sessions by state.
async fn states(app: &TestApp) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (_, state, _, _) in app.sessions().await {
        *counts.entry(state).or_insert(0) += 1;
    }
    counts
}

async fn burst(n: usize, max_live: usize) {
    println!(
        "== burst: {n} new threads in one second, each delivered twice, max_live {max_live} =="
    );
    let world = DockerWorld::new();
    let app = world
        .start(AppOptions {
            max_live,
            ..AppOptions::default()
        })
        .await;
    let threads: Vec<String> = (0..n).map(|_| thread_id()).collect();
    let bodies: Vec<serde_json::Value> = threads
        .iter()
        .map(|t| plain_event("thread-created.json", t, &event_id(), Utc::now()))
        .collect();
    let spacing = Duration::from_secs(1) / u32::try_from(n).expect("a count of threads");
    let started = Instant::now();
    let deliveries = bodies.iter().enumerate().flat_map(|(i, body)| {
        let i = u32::try_from(i).expect("a thread's index");
        let first = (spacing * i, body.to_string());
        let retry = (spacing * i + spacing / 2, retry_of(body).to_string());
        [first, retry]
    });
    let results = futures::future::join_all(deliveries.map(|(offset, body)| {
        let app = &app;
        async move {
            tokio::time::sleep_until((started + offset).into()).await;
            let t = Instant::now();
            let (status, answer) = app.deliver(body.as_bytes()).await;
            (
                status,
                answer["status"].as_str().unwrap_or("").to_owned(),
                ms(t.elapsed()),
            )
        }
    }))
    .await;
    let sent_in = started.elapsed();
    let mut latencies: Vec<f64> = results.iter().map(|r| r.2).collect();
    let stored = results
        .iter()
        .filter(|r| r.0 == 200 && r.1 == "stored")
        .count();
    let duplicates = results
        .iter()
        .filter(|r| r.0 == 200 && r.1 == "duplicate")
        .count();
    println!(
        "{} deliveries sent in {:.0} ms: {stored} stored, {duplicates} answered duplicate, {} other",
        results.len(),
        ms(sent_in),
        results.len() - stored - duplicates
    );
    summary("burst delivery -> 2xx", &mut latencies);

    let full = wait_for(Duration::from_secs(120), || async {
        let counts = states(&app).await;
        let running = counts.get("running").copied().unwrap_or(0);
        (running == max_live.min(n) && world.containers().len() == running).then_some(counts)
    })
    .await
    .expect("the cap fills");
    println!(
        "{max_live} running after {:.0} ms; states {full:?}",
        ms(started.elapsed())
    );
    check_burst(&world, &app, &threads, max_live).await;

    // DONE for the running ones: as many queued ones take their slots.
    let running: Vec<String> = app
        .sessions()
        .await
        .into_iter()
        .filter(|s| s.1 == "running")
        .map(|s| s.0)
        .collect();
    let freed = Instant::now();
    for thread in &running {
        let at = Utc::now() + chrono::Duration::seconds(1);
        let body = plain_event("thread-status-transitioned.json", thread, &event_id(), at);
        assert_eq!(app.deliver(body.to_string().as_bytes()).await.0, 200);
    }
    let refilled = wait_for(Duration::from_secs(120), || async {
        let counts = states(&app).await;
        let ok = counts.get("ended") == Some(&running.len())
            && counts.get("running") == Some(&max_live.min(n - running.len()))
            && world.containers().len() == max_live.min(n - running.len());
        ok.then_some(counts)
    })
    .await
    .expect("queued sessions take the freed slots");
    println!(
        "after DONE on the {} running: refilled in {:.0} ms; states {refilled:?}",
        running.len(),
        ms(freed.elapsed())
    );
    check_burst(&world, &app, &threads, max_live).await;
    println!("burst: every thread has exactly one session, one event, no container over the cap");
}

/// Every thread: one stored event, one session, at most `max_live` containers, each
/// belonging to a running session.
async fn check_burst(world: &DockerWorld, app: &TestApp, threads: &[String], max_live: usize) {
    let per_thread: Vec<(String, i64, i64)> = app
        .db
        .read(|c| {
            let mut stmt = c.prepare(
                "SELECT thread_id, count(*), count(thread_pos) FROM events \
                 WHERE class = 'customer' GROUP BY thread_id",
            )?;
            let rows = stmt.query_map((), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            rows.collect()
        })
        .await
        .expect("events");
    assert_eq!(per_thread.len(), threads.len(), "a thread's event was lost");
    for (thread, rows, fed) in &per_thread {
        assert_eq!(
            (*rows, *fed),
            (1, 1),
            "{thread}: {rows} rows, {fed} in its feed"
        );
    }
    let sessions = app.sessions().await;
    assert_eq!(sessions.len(), threads.len(), "one session per thread");
    let containers = world.containers();
    assert!(
        containers.len() <= max_live,
        "{} containers",
        containers.len()
    );
    for c in &containers {
        let session = c.label(threadgate::sandbox::LABEL_SESSION);
        assert!(
            sessions.iter().any(|s| s.1 == "running"
                && Some(&s.3) == session.as_ref()
                && s.2.as_ref() == Some(&c.id)),
            "container {} has no running session",
            c.id
        );
    }
}
