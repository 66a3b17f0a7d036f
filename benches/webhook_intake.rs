//! Webhook intake figures: verified, deduplicated and durably stored deliveries per
//! second, and p50/p99 time to the 200, against the real router on a loopback port
//! with a SQLite file (`synchronous=FULL`, group commit) and with Postgres (one
//! autocommit `INSERT … ON CONFLICT DO NOTHING` per delivery, one round trip,
//! `synchronous_commit` as the server has it, printed), in one run, each phase on one
//! backend then the other; on Postgres also the store alone (no HTTP), the intake's
//! insert through `Db::write` (`BEGIN`, insert, `COMMIT`: three round trips) against
//! `Db::write_single` (one), alternating; plus the CPU cost of `verify_signature` +
//! `Envelope::parse` alone.
//!
//! `cargo bench --bench webhook_intake`. Environment: `WEBHOOK_BENCH_N` (deliveries,
//! default 20000), `WEBHOOK_BENCH_CLIENTS` (concurrent keep-alive HTTP/1.1 clients,
//! default 64), `WEBHOOK_BENCH_RATES` (offered deliveries/s of the open-loop runs, one
//! after another, default `2000,5000`), `WEBHOOK_BENCH_STORE` (`sqlite`, `postgres` or
//! `both`; default `both` when `THREADGATE_TEST_DATABASE_URL` names a Postgres server,
//! e.g. the URL `scripts/postgres-up.sh` prints, else `sqlite`; on Postgres the bench
//! creates a database of its own there and drops it after), `WEBHOOK_BENCH_SKIP_PARSE`
//! (skip the CPU microbenchmark), `THREADGATE_SHARED` (the shared directory with
//! Plain's examples).

#![expect(
    clippy::indexing_slicing,
    reason = "test code: an index out of range is a failed test"
)]
#![expect(
    clippy::expect_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use threadgate::store::Db;
use threadgate::store::testing::{TestDb, test_database_url};
use threadgate::webhook::store as events;
use threadgate::webhook::{
    Envelope, IntakeConfig, IntakeState, SigningSecret, router, sign, verify_signature,
};

const SECRET: &[u8] = b"whsec-bench-secret";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn example_body() -> Vec<u8> {
    let shared = std::env::var_os("THREADGATE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    let path = shared.join("plain/examples/email-received.json");
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e} (set THREADGATE_SHARED)",
            path.display()
        )
    })
}

/// `n` distinct signed `thread.email_received` deliveries over 1,000 threads, stamped
/// now, with ids starting `pEv_<prefix>`.
fn deliveries(template: &Value, prefix: &str, n: usize) -> Vec<(Vec<u8>, String)> {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    (0..n)
        .map(|i| {
            let mut value = template.clone();
            value["id"] = json!(format!("pEv_{prefix}{i:08}"));
            value["payload"]["thread"]["id"] = json!(format!("th_bench{:05}", i % 1000));
            value["webhookMetadata"]["webhookDeliveryAttemptTimestamp"] = json!(now);
            let body = serde_json::to_vec(&value).expect("serialize");
            let signature = sign(SECRET, &body);
            (body, signature)
        })
        .collect()
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "a rank in a sorted sample, rounded and within its length"
)]
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Starts the intake on its own runtime (as `serve` would), returning its address.
fn start_server(db: Db) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let (notify, mut events) = mpsc::unbounded_channel();
    let state = IntakeState {
        db,
        config: IntakeConfig::new(SigningSecret::new(SECRET).expect("secret")),
        clock: threadgate::clock::Clock::system(),
        notify,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("intake-server")
        .build()
        .expect("server runtime");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let handle = std::thread::spawn(move || {
        runtime.block_on(async move {
            // The orchestrator's side of the channel: drain it.
            tokio::spawn(async move { while events.recv().await.is_some() {} });
            axum::serve(listener, router(state)).await.expect("serve");
        });
    });
    (addr, handle)
}

/// A keep-alive HTTP/1.1 connection that writes a prepared request and reads the
/// answer: the lightest client possible, so that on this small machine the CPU goes to
/// the server being measured rather than to the load generator.
struct Connection {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl Connection {
    async fn open(addr: SocketAddr) -> Connection {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Connection {
            stream,
            buffer: Vec::with_capacity(4096),
        }
    }

    /// Sends `request` and returns the answer's status code once its body is read.
    async fn send(&mut self, request: &[u8]) -> u16 {
        self.stream.write_all(request).await.expect("write");
        self.buffer.clear();
        loop {
            let mut chunk = [0u8; 1024];
            let read = self.stream.read(&mut chunk).await.expect("read");
            assert!(read > 0, "server closed the connection");
            self.buffer.extend_from_slice(&chunk[..read]);
            let Some(end) = find(&self.buffer, b"\r\n\r\n") else {
                continue;
            };
            let head = std::str::from_utf8(&self.buffer[..end]).expect("ascii head");
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .expect("content-length");
            if self.buffer.len() >= end + 4 + length {
                return head[9..12].parse().expect("status code");
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The full HTTP/1.1 request for one delivery.
fn request(addr: SocketAddr, (body, signature): (Vec<u8>, String)) -> Vec<u8> {
    let mut request = format!(
        "POST /webhooks/plain HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Plain-Request-Signature: {signature}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    request
}

/// Sends every delivery from `clients` keep-alive connections and returns each
/// latency, sorted. Closed loop (`rate` `None`): each connection sends its next
/// delivery as soon as the last is answered; latency is send to 200. Open loop:
/// delivery `i` is due at `i / rate` seconds, and its latency runs from when it was due
/// (so time spent waiting for a free connection counts), which is what Plain would see.
async fn send_all(
    addr: SocketAddr,
    work: Vec<(Vec<u8>, String)>,
    clients: usize,
    rate: Option<f64>,
) -> Vec<Duration> {
    let total = work.len();
    let requests: Vec<Vec<u8>> = work.into_iter().map(|w| request(addr, w)).collect();
    let queue = Arc::new(std::sync::Mutex::new(requests.into_iter().enumerate()));
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let queue = Arc::clone(&queue);
        tasks.push(tokio::spawn(async move {
            let mut connection = Connection::open(addr).await;
            let mut latencies = Vec::new();
            loop {
                let next = queue.lock().expect("work queue").next();
                let Some((i, request)) = next else {
                    return latencies;
                };
                let due = match rate {
                    Some(rate) => start + Duration::from_secs_f64(i as f64 / rate),
                    None => tokio::time::Instant::now(),
                };
                tokio::time::sleep_until(due).await;
                let status = connection.send(&request).await;
                latencies.push(due.elapsed());
                assert_eq!(status, 200, "delivery refused");
            }
        }));
    }
    let mut all = Vec::with_capacity(total);
    for task in tasks {
        all.extend(task.await.expect("client task"));
    }
    all.sort_unstable();
    all
}

fn stored(db: &Db, prefix: &str) -> usize {
    let pattern = format!("pEv_{prefix}%");
    let count: i64 = db
        .read_inline(|c| {
            c.query_row(
                "SELECT count(*) FROM events WHERE event_id LIKE ?1",
                [pattern],
                |r| r.get(0),
            )
        })
        .expect("count");
    usize::try_from(count).expect("count fits")
}

/// Postgres' count of the database's committed and rolled-back transactions (`None`
/// on SQLite).
fn transactions(db: &Db) -> Option<(i64, i64)> {
    if db.dialect() != threadgate::store::Dialect::Postgres {
        return None;
    }
    db.read_inline(|c| {
        c.query_row(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database \
             WHERE datname = current_database()",
            (),
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    })
    .ok()
}

fn report(label: &str, n: usize, elapsed: Duration, latencies: &[Duration]) {
    let until = if label.contains("store only") {
        "committed"
    } else {
        "200"
    };
    println!("  {label}");
    println!(
        "    {:.0} deliveries/s ({n} in {:.2} s); time to {until}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        n as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64(),
        ms(percentile(latencies, 0.50)),
        ms(percentile(latencies, 0.99)),
        ms(percentile(latencies, 1.0))
    );
}

/// One backend under test: its store, its server's address, and (Postgres) the
/// database dropped after.
struct Backend {
    name: &'static str,
    db: Db,
    addr: SocketAddr,
    _server: std::thread::JoinHandle<()>,
    _database: Option<TestDb>,
}

/// The backends asked for: `WEBHOOK_BENCH_STORE`, else both when a Postgres server is
/// named.
fn backends_wanted() -> Vec<&'static str> {
    let asked = std::env::var("WEBHOOK_BENCH_STORE").unwrap_or_default();
    match asked.as_str() {
        "sqlite" => vec!["sqlite"],
        "postgres" => vec!["postgres"],
        "both" => vec!["sqlite", "postgres"],
        "" if test_database_url().is_some() => vec!["sqlite", "postgres"],
        "" => vec!["sqlite"],
        other => panic!("WEBHOOK_BENCH_STORE is {other:?}: sqlite, postgres or both"),
    }
}

fn open_backend(name: &'static str, dir: &Path) -> Backend {
    let (db, database) = if name == "postgres" {
        let server = test_database_url().expect(
            "WEBHOOK_BENCH_STORE=postgres needs THREADGATE_TEST_DATABASE_URL \
             (scripts/postgres-up.sh prints one)",
        );
        let database = TestDb::postgres(&server).expect("create the bench database");
        let db = database.open().expect("connect");
        let settings: String = db
            .read_inline(|c| {
                c.query_row(
                    "SELECT current_setting('synchronous_commit') || ', fsync=' || \
                     current_setting('fsync') || ', commit_delay=' || \
                     current_setting('commit_delay') || ', server ' || \
                     current_setting('server_version')",
                    (),
                    |r| r.get(0),
                )
            })
            .expect("settings");
        println!("postgres: synchronous_commit={settings}");
        (db, Some(database))
    } else {
        let db = Db::open(&dir.join("state.db")).expect("open db");
        (db, None)
    };
    let (addr, server) = start_server(db.clone());
    Backend {
        name,
        db,
        addr,
        _server: server,
        _database: database,
    }
}

fn intake_benchmark(template: &Value) {
    // `cargo test --all-targets` runs this without `--bench`: a small smoke run then.
    let full = std::env::args().any(|a| a == "--bench");
    let n = env_usize("WEBHOOK_BENCH_N", if full { 20_000 } else { 200 });
    let clients = env_usize("WEBHOOK_BENCH_CLIENTS", 64);
    let rates: Vec<f64> = std::env::var("WEBHOOK_BENCH_RATES")
        .unwrap_or_else(|_| "2000,5000".into())
        .split(',')
        .map(|r| {
            r.trim()
                .parse()
                .expect("WEBHOOK_BENCH_RATES: numbers, comma-separated")
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    fsync_probe(dir.path());
    let backends: Vec<Backend> = backends_wanted()
        .into_iter()
        .map(|name| open_backend(name, dir.path()))
        .collect();
    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("bench-client")
        .build()
        .expect("client runtime");
    let run = |backend: &Backend, prefix: &str, count: usize, rate: Option<f64>| {
        let work = deliveries(template, prefix, count);
        let before = transactions(&backend.db);
        let start = Instant::now();
        let latencies = client_runtime.block_on(send_all(backend.addr, work, clients, rate));
        let elapsed = start.elapsed();
        assert_eq!(
            stored(&backend.db, prefix),
            count,
            "every delivery stored exactly once"
        );
        if let (Some((commits, rollbacks)), Some(_)) = (before, backend._database.as_ref()) {
            // Postgres reports its counters at most once a second.
            std::thread::sleep(Duration::from_millis(1_100));
            if let Some((c, r)) = transactions(&backend.db) {
                println!(
                    "    postgres: {} transactions committed, {} rolled back (a write that \
                     lost a race is rolled back and run again)",
                    c - commits,
                    r - rollbacks
                );
            }
        }
        (elapsed, latencies)
    };

    println!(
        "webhook intake: signed deliveries from {clients} keep-alive HTTP/1.1 connections; \
         SQLite synchronous=FULL with group commit, Postgres one autocommit statement per \
         delivery; load average {}",
        load_average()
    );
    for backend in &backends {
        run(backend, "warmup", 1_000, None);
    }
    for backend in &backends {
        let (elapsed, latencies) = run(backend, "closed", n, None);
        let label = format!(
            "{}: closed loop (each connection sends as soon as answered): capacity",
            backend.name
        );
        report(&label, n, elapsed, &latencies);
    }
    for rate in rates.iter().copied() {
        for backend in &backends {
            let (elapsed, latencies) = run(backend, &format!("open{rate:.0}_"), n, Some(rate));
            let label = format!(
                "{}: open loop at {rate:.0}/s offered (latency from when each delivery was due)",
                backend.name
            );
            report(&label, n, elapsed, &latencies);
        }
    }
    for backend in backends.iter().filter(|b| b.name == "postgres") {
        store_only(&backend.db, template, n, clients, None, &client_runtime);
        for rate in &rates {
            store_only(
                &backend.db,
                template,
                n,
                clients,
                Some(*rate),
                &client_runtime,
            );
        }
    }
    println!("  load average after: {}", load_average());
    // The servers keep running until the process ends; the Postgres databases are
    // dropped (FORCE) with the backends.
}

/// The store alone, without HTTP: the intake's insert from `clients` tasks (open loop
/// at `rate` when given, latency from when each was due), through `Db::write` (`BEGIN`
/// SERIALIZABLE, the insert, `COMMIT`: three round trips, as the intake stored a
/// delivery before) and through `Db::write_single` (one autocommit statement: one round
/// trip, as it does now), alternating twice, in one run on one database.
fn store_only(
    db: &Db,
    template: &Value,
    n: usize,
    clients: usize,
    rate: Option<f64>,
    runtime: &tokio::runtime::Runtime,
) {
    let loop_kind = rate.map_or_else(|| "closed loop".to_owned(), |r| format!("{r:.0}/s offered"));
    for round in 0..2 {
        for single in [false, true] {
            let prefix = format!(
                "store{round}{}{}_",
                if single { "s" } else { "t" },
                rate.map_or_else(String::new, |r| format!("{r:.0}"))
            );
            let work: Vec<(Envelope, String)> = deliveries(template, &prefix, n)
                .into_iter()
                .map(|(body, _)| {
                    let text = String::from_utf8(body).expect("utf-8");
                    (Envelope::parse(text.as_bytes()).expect("envelope"), text)
                })
                .collect();
            let queue = Arc::new(std::sync::Mutex::new(work.into_iter().enumerate()));
            let started = Instant::now();
            let latencies = runtime.block_on(async {
                let start = tokio::time::Instant::now();
                let mut tasks = Vec::new();
                for _ in 0..clients {
                    let (queue, db) = (Arc::clone(&queue), db.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut latencies = Vec::new();
                        loop {
                            let next = queue.lock().expect("work queue").next();
                            let Some((i, (envelope, text))) = next else {
                                return latencies;
                            };
                            let due = match rate {
                                Some(rate) => start + Duration::from_secs_f64(i as f64 / rate),
                                None => tokio::time::Instant::now(),
                            };
                            tokio::time::sleep_until(due).await;
                            let insert = move |c: &threadgate::store::Conn<'_>| {
                                events::insert(c, &envelope, &text, 1)
                            };
                            let outcome = if single {
                                db.write_single(insert).await
                            } else {
                                db.write(insert).await
                            };
                            assert!(
                                matches!(outcome, Ok(events::InsertOutcome::Inserted { .. })),
                                "insert failed: {outcome:?}"
                            );
                            latencies.push(due.elapsed());
                        }
                    }));
                }
                let mut all = Vec::with_capacity(n);
                for task in tasks {
                    all.extend(task.await.expect("store task"));
                }
                all.sort_unstable();
                all
            });
            let label = format!(
                "postgres store only, {loop_kind}, {}",
                if single {
                    "Db::write_single (1 round trip)"
                } else {
                    "Db::write (BEGIN/INSERT/COMMIT, 3 round trips)"
                }
            );
            report(&label, n, started.elapsed(), &latencies);
        }
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(", "))
        .unwrap_or_else(|_| "unknown".into())
}

fn parse_benchmark(template: &Value) {
    let (body, signature) = deliveries(template, "parse", 1).remove(0);
    let iterations = if std::env::args().any(|a| a == "--bench") {
        50_000
    } else {
        500
    };
    for _ in 0..1_000 {
        verify_signature(SECRET, &body, Some(&signature)).expect("valid");
        Envelope::parse(&body).expect("parses");
    }
    let start = Instant::now();
    for _ in 0..iterations {
        verify_signature(SECRET, std::hint::black_box(&body), Some(&signature)).expect("valid");
        std::hint::black_box(Envelope::parse(&body).expect("parses").class());
    }
    let per_op = start.elapsed() / iterations;
    println!(
        "verify_signature + Envelope::parse ({} byte body): {:.1} us/delivery ({:.0}/s on one core)",
        body.len(),
        per_op.as_secs_f64() * 1e6,
        1.0 / per_op.as_secs_f64()
    );
}

/// The floor under any durable answer: how long this disk takes to fsync a 4 KiB
/// append (each group commit needs at least one).
fn fsync_probe(dir: &Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(dir.join("fsync-probe")).expect("probe file");
    let mut times: Vec<Duration> = (0..200)
        .map(|_| {
            file.write_all(&[0u8; 4096]).expect("write");
            let start = Instant::now();
            file.sync_all().expect("fsync");
            start.elapsed()
        })
        .collect();
    times.sort_unstable();
    println!(
        "fsync of a 4 KiB append on the database's disk: p50 {:.2} ms, p99 {:.2} ms",
        ms(percentile(&times, 0.50)),
        ms(percentile(&times, 0.99))
    );
}

fn main() {
    // `cargo bench` passes `--bench`; there are no other options.
    let template: Value = serde_json::from_slice(&example_body()).expect("example json");
    if std::env::var_os("WEBHOOK_BENCH_SKIP_PARSE").is_none() {
        parse_benchmark(&template);
    }
    intake_benchmark(&template);
}
