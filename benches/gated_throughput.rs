//! Gated tool calls per second against one Postgres primary with three instances
//! (issue 19; goal ≥ 1,000/s): three real `threadgate serve` processes (the binary
//! beside this bench's profile directory) on one Postgres database of their own and one
//! Docker engine, each running sessions of the quiet agent (a container that asks
//! nothing), opened by signed `thread.email_received` webhooks delivered to that
//! instance. The bench then drives many concurrent gated reads through the sessions'
//! unix sockets from the host, as agents would: `stripe.list_charges` of the thread's
//! own customer (localstripe) with `limit: 1`, under a policy whose rule for that read
//! carries a cumulative limit (`sum: limit, per: customer`, far too large to be
//! exhausted), so every call reserves against a limit total in the deciding
//! transaction, which sends the read down the write path: a decision transaction
//! (lease fence, earlier calls, the limit's total, the execution row, its charge, two
//! audit rows), the call to localstripe, and the outcome's transaction (one audit row).
//!
//! Printed: the calls per second in all and per instance, p50/p99 latency, the answers
//! that were not `200 ok` (by status, with a sample), the transactions committed and
//! rolled back on the database meanwhile (a SERIALIZABLE write that lost a race is
//! rolled back and run again: the rollbacks are the retries), the load average before
//! and after; then the executions, limit charges and audit rows recorded, and
//! `threadgate audit --verify` run against the shared database after the run.
//!
//! Custom harness: `cargo build --bin threadgate && cargo bench --profile dev --bench
//! gated_throughput` (`scripts/gated-throughput.sh` does both, and the release figure
//! with `--release`). Needs `THREADGATE_TEST_DATABASE_URL` (the URL
//! `scripts/postgres-up.sh` prints; the bench creates a database of its own there and
//! drops it after), Docker with the sandbox image, and `.venv-peers`
//! (`scripts/localstripe.sh setup`). Environment: `GATED_BENCH_SECONDS` (how long the
//! calls are driven, default 20), `GATED_BENCH_SESSIONS` (sessions per instance,
//! default 10), `GATED_BENCH_IN_FLIGHT` (calls in flight per session, default 2).

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
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use threadgate::secrets::{MasterKey, SecretString};
use threadgate::store::Db;
use threadgate::store::testing::{TestDb, test_database_url};

use support::figures::{cpu_by_command, cpu_spent, load_average, micros, percentile};
use support::instances::{
    InstanceOptions, Serve, Shared, SharedDb, deliver, quiet_agents, serve_with, threadgate_bin,
};
use support::localstripe::LocalStripe;
use support::plain::{email_received, plain_id};
use support::sessions::DockerWorld;
use support::unix_http::unix_request;
use support::wait::wait_for;

/// The instances sharing the database.
const INSTANCES: usize = 3;
/// Calls of each session before the measured run (connections, caches, prepares).
const WARM_UP: usize = 5;
/// The instances' lease time: long, nothing is taken over during the run.
const LEASE: Duration = Duration::from_secs(30);
/// The Stripe key the instances hold (localstripe takes any `sk_` key).
const STRIPE_KEY: &str = "sk_test_gated_throughput_7c1d";
/// Stripe's webhook signing secret: with it configured, the read scope remembers a
/// customer's email (the README's recommended set-up), so a read asks Stripe once.
const STRIPE_WEBHOOK_SECRET: &str = "whsec_gated_throughput_0c4e";

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` only builds the harness.
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

/// One open session: which instance serves it, its socket and its customer.
#[derive(Clone)]
struct Target {
    instance: usize,
    socket: PathBuf,
    customer: String,
}

/// One measured call.
struct Call {
    instance: usize,
    took: Duration,
    status: u16,
    /// The answer's `status` field (`ok` for a read that ran).
    answer: String,
    body: Value,
}

async fn run() {
    let Some(server) = test_database_url() else {
        eprintln!(
            "gated_throughput needs THREADGATE_TEST_DATABASE_URL (scripts/postgres-up.sh \
             prints one)"
        );
        return;
    };
    if support::docker::skip() {
        return;
    }
    let seconds = env_number("GATED_BENCH_SECONDS", 20);
    let per_instance = env_number("GATED_BENCH_SESSIONS", 10);
    let in_flight = env_number("GATED_BENCH_IN_FLIGHT", 2);
    println!("threadgate binary: {}", threadgate_bin().display());

    let pg = tokio::task::spawn_blocking(move || TestDb::postgres(&server))
        .await
        .expect("create the bench database")
        .expect("create the bench database");
    let world = DockerWorld::new();
    let shared = Shared {
        database: SharedDb::Url(pg.url().expect("a postgres url").to_owned()),
        master_key: world.root.path().join("master.key"),
        signing_secret: world.signing_secret.clone(),
        lease: LEASE,
    };
    MasterKey::generate()
        .write_to(&shared.master_key)
        .expect("master key");
    let stripe = Arc::new(
        tokio::task::spawn_blocking(LocalStripe::start)
            .await
            .expect("localstripe starts"),
    );
    let policy = world.root.path().join("gated.yaml");
    // A total no run can reach.
    std::fs::write(
        &policy,
        support::world::limited_reads_policy(1_000_000_000_000),
    )
    .expect("write the policy");
    let agents = quiet_agents(&world.root.path().join("agents"));
    let options = InstanceOptions {
        max_live: per_instance + 2,
        memory_bytes: 64 << 20,
        agents_dir: Some(agents),
        extra: format!(
            "[stripe]\napi_url = {:?}\nwebhook_secret = \"stripe_webhook_secret\"\n",
            stripe.base_url()
        ),
        // Every session's calls are driven as fast as the instances answer them.
        sessions_extra: "calls_per_second = 0".into(),
        policy_file: Some(policy),
    };
    let ids: Vec<String> = (0..INSTANCES)
        .map(|i| format!("{}-{i}", world.instance))
        .collect();
    let mut serves: Vec<Serve> = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        serves.push(serve_with(&world, &shared, (id, &format!("i{i}")), &options).await);
    }
    // Opened after the instances migrated the database: a binary of an earlier schema
    // (`THREADGATE_TEST_BIN`, the "before" of a comparison) refuses to start on a newer
    // one, and a connector reads its key from the store at each call.
    let db = shared.database.open();
    store_secrets(&db, &shared, &world).await;

    let targets = open_sessions(&world, &shared, &db, &stripe, &serves, per_instance).await;
    println!(
        "{} sessions open ({per_instance} per instance, {INSTANCES} instances); \
         {in_flight} calls in flight per session",
        targets.len()
    );
    for t in &targets {
        for _ in 0..WARM_UP {
            let call = list_charges(t).await;
            assert_eq!(
                (call.status, call.answer.as_str()),
                (200, "ok"),
                "warm-up call: {}",
                call.body
            );
        }
    }

    let load_before = load_average();
    let (commits_before, rollbacks_before) = transactions(&db).await;
    let cpu_before = cpu_by_command();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds as u64);
    let mut workers = tokio::task::JoinSet::new();
    for t in &targets {
        for _ in 0..in_flight {
            let t = t.clone();
            workers.spawn(async move {
                let mut calls = Vec::new();
                while Instant::now() < deadline {
                    calls.push(list_charges(&t).await);
                }
                calls
            });
        }
    }
    let sampler = tokio::spawn(sample_sessions(shared.database.open(), deadline));
    let mut calls = Vec::new();
    while let Some(done) = workers.join_next().await {
        calls.extend(done.expect("a worker"));
    }
    let elapsed = started.elapsed();
    let cpu_after = cpu_by_command();
    let load_after = load_average();
    let (commits_after, rollbacks_after) = transactions(&db).await;

    report(&calls, elapsed, (&load_before, &load_after));
    println!(
        "  database meanwhile: {} transactions committed, {} rolled back (SERIALIZABLE \
         retries and failures), {:.3} rollbacks per call",
        commits_after - commits_before,
        rollbacks_after - rollbacks_before,
        (rollbacks_after - rollbacks_before) as f64 / calls.len().max(1) as f64
    );
    print_cpu(&cpu_before, &cpu_after, calls.len());
    let samples = sampler.await.expect("the sampler");
    print_samples(&samples);
    straight(&stripe, &targets, in_flight, seconds).await;
    recorded(&db, &calls, &targets).await;
    // The instances chain in the background: what their last steps have not reached yet
    // is chained here first.
    let waiting = threadgate::audit::chain_waiting(&db)
        .await
        .expect("chain the audit rows waiting");
    println!("  audit rows still waiting after chaining: {waiting}");
    let rows = db
        .read(|c| Ok(threadgate::audit::verify(c)))
        .await
        .expect("read the audit log");
    match rows {
        Ok(n) => println!("  the chain verifies (this tree's audit::verify): {n} rows"),
        Err(e) => println!("  the chain does NOT verify (this tree's audit::verify): {e}"),
    }
    verify(&serves, &world).await;
    for serve in &serves {
        let log = serve.log();
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains(" WARN "))
            .collect();
        println!(
            "  instance {}: {} warning/error log lines{}",
            serve.instance,
            errors.len(),
            errors
                .first()
                .map(|l| format!(", the first: {}", l.chars().take(400).collect::<String>()))
                .unwrap_or_default()
        );
    }
    drop(serves);
    for id in &ids {
        support::docker::remove_instance_containers(id);
    }
    drop(db);
    drop(pg);
}

/// The Stripe key and Stripe's webhook secret, in the shared database's secrets store.
async fn store_secrets(db: &Db, shared: &Shared, world: &DockerWorld) {
    let settings = threadgate::config::Settings {
        master_key_file: shared.master_key.clone(),
        data_dir: world.root.path().join("secrets-admin"),
        ..threadgate::config::Settings::default()
    };
    let secrets = threadgate::app::open_secrets(db, &settings).expect("open secrets");
    for (name, value) in [
        ("stripe_api_key", STRIPE_KEY),
        ("stripe_webhook_secret", STRIPE_WEBHOOK_SECRET),
    ] {
        secrets
            .set(name, SecretString::from(value.to_owned()))
            .await
            .expect("store a secret");
    }
}

/// Opens `per_instance` sessions on each instance (a customer with one charge at
/// localstripe, a signed webhook delivered to that instance) and waits until each one
/// runs and its socket answers: where it runs is the lease owner's data directory.
async fn open_sessions(
    world: &DockerWorld,
    shared: &Shared,
    db: &Db,
    stripe: &LocalStripe,
    serves: &[Serve],
    per_instance: usize,
) -> Vec<Target> {
    let http = reqwest::Client::new();
    let mut threads = Vec::new();
    for (i, serve) in serves.iter().enumerate() {
        for j in 0..per_instance {
            let email = format!("gated-{i}-{j}@example.com");
            let customer = stripe.create_customer(&email).await;
            stripe.create_charge(&customer, 1200, "usd").await;
            let thread = plain_id("th");
            let body: Value =
                serde_json::from_slice(&email_received(&thread, &plain_id("c"), &email))
                    .expect("json");
            let status = deliver(&http, shared, &serve.addr, &body)
                .await
                .expect("deliver");
            assert_eq!(status, 200, "the signed webhook is accepted");
            threads.push((thread, customer));
        }
    }
    let index: BTreeMap<String, usize> = serves
        .iter()
        .enumerate()
        .map(|(i, s)| (s.instance.clone(), i))
        .collect();
    let mut targets = Vec::new();
    for (thread, customer) in threads {
        let found = wait_for(Duration::from_secs(180), || {
            let (thread, customer, index) = (thread.clone(), customer.clone(), index.clone());
            async move {
                let row: Option<(String, String, String)> = db
                    .read(move |c| {
                        use threadgate::store::OptionalExtension as _;
                        c.query_row(
                            "SELECT s.session_id, s.state, l.owner FROM sessions s \
                             JOIN session_leases l ON l.thread_id = s.thread_id \
                             WHERE s.thread_id = ?1",
                            [thread.as_str()],
                            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                        )
                        .optional()
                    })
                    .await
                    .expect("read the session");
                let (session, state, owner) = row?;
                let instance = *index.get(&owner)?;
                if state != "running" {
                    return None;
                }
                let socket = world
                    .root
                    .path()
                    .join(format!("i{instance}"))
                    .join("data/sockets")
                    .join(&session)
                    .join("api.sock");
                let (status, _) = unix_request(&socket, "GET", "/v1/agent", None).await;
                (status == 200).then_some(Target {
                    instance,
                    socket,
                    customer,
                })
            }
        })
        .await;
        targets.push(found.expect("every session starts within 180 s"));
    }
    targets
}

/// One gated read of the session's customer's charges, reserving 1 against its limit.
async fn list_charges(t: &Target) -> Call {
    let body = json!({
        "tool": "stripe.list_charges",
        "args": {"customer": t.customer, "limit": 1},
    });
    let started = Instant::now();
    let (status, body) = unix_request(&t.socket, "POST", "/v1/calls", Some(&body)).await;
    Call {
        instance: t.instance,
        took: started.elapsed(),
        status,
        answer: body["status"].as_str().unwrap_or_default().to_owned(),
        body,
    }
}

/// The ceiling the upstream sets, in the same run: the same read (`GET
/// /v1/charges?customer=…&limit=1`) straight to localstripe from one pooled HTTP client,
/// as many in flight as the gated phase had, for as long. No gated figure can pass
/// it: every gated call makes this request once.
async fn straight(stripe: &Arc<LocalStripe>, targets: &[Target], in_flight: usize, seconds: usize) {
    let load_before = load_average();
    let cpu_before = cpu_by_command();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds as u64);
    let mut workers = tokio::task::JoinSet::new();
    for t in targets {
        for _ in 0..in_flight {
            let stripe = Arc::clone(stripe);
            let path = format!("charges?customer={}&limit=1", t.customer);
            workers.spawn(async move {
                let mut took = Vec::new();
                while Instant::now() < deadline {
                    let call = Instant::now();
                    let page = stripe.get(&path).await;
                    assert_eq!(page["data"].as_array().map(Vec::len), Some(1), "{page}");
                    took.push(call.elapsed());
                }
                took
            });
        }
    }
    let mut times = Vec::new();
    while let Some(done) = workers.join_next().await {
        times.extend(done.expect("a straight worker"));
    }
    let cpu_after = cpu_by_command();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "the same read straight to localstripe (the upstream's ceiling), {} in flight, \
         {secs:.1} s; load average {load_before} before, {} after",
        targets.len() * in_flight,
        load_average()
    );
    let calls = times.len();
    print_rate("straight", times, secs);
    print_cpu(&cpu_before, &cpu_after, calls);
}

/// What [`cpu_by_command`] answers.
type CpuSnapshot = BTreeMap<(u32, u64), (String, u64)>;

/// The CPU each kind of process spent in a phase, in all and per call: where a call's
/// cost goes on a machine the instances, Postgres, localstripe and this client share.
fn print_cpu(before: &CpuSnapshot, after: &CpuSnapshot, calls: usize) {
    let spent = cpu_spent(before, after);
    let total: u64 = spent.iter().map(|(_, ms)| ms).sum();
    let per_call = |ms: u64| ms as f64 * 1000.0 / calls.max(1) as f64;
    println!(
        "  CPU spent: {total} ms in all, {:.0} us per call; by process (command name):",
        per_call(total)
    );
    for (comm, ms) in spent.iter().take(8) {
        println!(
            "    {comm:<16} {ms:>7} ms  {:>6.0} us per call",
            per_call(*ms)
        );
    }
}

/// Commits and rollbacks on the shared database so far (its statistics; they lag by
/// up to a second, so the bench reads them after a pause).
async fn transactions(db: &Db) -> (i64, i64) {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    db.read(|c| {
        c.query_row(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database \
             WHERE datname = current_database()",
            (),
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    })
    .await
    .expect("read the database's statistics")
}

/// One line of a phase's figures: `label`, the calls that succeeded (`times`), their
/// rate over `secs`, p50 and p99.
fn print_rate(label: &str, mut times: Vec<Duration>, secs: f64) {
    times.sort();
    println!(
        "  {label:<12} {:>7} calls ok {:>8.1} calls/s   p50 {:>8.0} us   p99 {:>8.0} us",
        times.len(),
        times.len() as f64 / secs,
        micros(percentile(&times, 0.5)),
        micros(percentile(&times, 0.99)),
    );
}

fn report(calls: &[Call], elapsed: Duration, (before, after): (&str, &str)) {
    let secs = elapsed.as_secs_f64();
    println!(
        "gated reads with a limit reservation, {INSTANCES} instances on one Postgres, \
         {:.1} s; load average {before} before, {after} after",
        secs
    );
    let ok = |c: &Call| c.status == 200 && c.answer == "ok";
    let times = |of: &dyn Fn(&Call) -> bool| -> Vec<Duration> {
        calls
            .iter()
            .filter(|c| ok(c) && of(c))
            .map(|c| c.took)
            .collect()
    };
    print_rate("all", times(&|_| true), secs);
    for i in 0..INSTANCES {
        print_rate(&format!("instance {i}"), times(&|c| c.instance == i), secs);
    }
    let mut failed: BTreeMap<(u16, String), (usize, String)> = BTreeMap::new();
    for c in calls.iter().filter(|c| !ok(c)) {
        let entry = failed
            .entry((c.status, c.answer.clone()))
            .or_insert_with(|| (0, c.body.to_string()));
        entry.0 += 1;
    }
    if failed.is_empty() {
        println!("  every answer was 200 ok");
    }
    for ((status, answer), (n, sample)) in failed {
        let sample: String = sample.chars().take(300).collect();
        println!("  {n} answers {status} {answer:?}, e.g. {sample}");
    }
}

/// What the database's connections were doing, sampled every 50 ms until `deadline`
/// (`pg_stat_activity`): by state and wait event, how many connection-samples. Where
/// the time goes: `idle in transaction` is a transaction waiting on its instance (the
/// client between statements), `Lock advisory` the audit chain's lock, `IO`/`LWLock`
/// WAL flushes, `active` with no wait Postgres working.
async fn sample_sessions(db: Db, deadline: Instant) -> BTreeMap<String, usize> {
    let mut tally = BTreeMap::new();
    while Instant::now() < deadline {
        let rows: Vec<String> = db
            .read(|c| {
                let mut stmt = c.prepare(
                    "SELECT coalesce(state, '') || ' ' || coalesce(wait_event_type, '') || ' ' \
                         || coalesce(wait_event, '') \
                     FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                )?;
                let rows = stmt.query_map((), |r| r.get(0))?;
                rows.collect()
            })
            .await
            .unwrap_or_default();
        for row in rows {
            *tally.entry(row).or_insert(0) += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tally
}

fn print_samples(samples: &BTreeMap<String, usize>) {
    let busy: usize = samples
        .iter()
        .filter(|(k, _)| !k.starts_with("idle Client"))
        .map(|(_, n)| n)
        .sum();
    let mut by_count: Vec<(&String, &usize)> = samples
        .iter()
        .filter(|(k, _)| !k.starts_with("idle Client"))
        .collect();
    by_count.sort_by(|a, b| b.1.cmp(a.1));
    println!("  the database's connections in a transaction, sampled (state, wait):");
    for (what, n) in by_count.into_iter().take(8) {
        println!(
            "    {:>5.1}%  {what}",
            100.0 * *n as f64 / busy.max(1) as f64
        );
    }
}

/// What the database recorded of the calls.
async fn recorded(db: &Db, calls: &[Call], targets: &[Target]) {
    let (executions, charges, audit): (i64, i64, i64) = db
        .read(|c| {
            c.query_row(
                "SELECT (SELECT count(*) FROM executions), \
                        (SELECT count(*) FROM limit_charges), \
                        (SELECT count(*) FROM audit)",
                (),
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
        })
        .await
        .expect("count the rows");
    let ok = calls.iter().filter(|c| c.status == 200).count() + targets.len() * WARM_UP;
    println!(
        "  recorded: {executions} executions, {charges} limit charges, {audit} audit rows \
         ({ok} calls answered 200, warm-up included)"
    );
}

/// `threadgate audit --verify` against the shared database, with the first instance's
/// binary and configuration (a binary of an earlier schema refuses the database this
/// bench's handle migrated: the line above checked the chain then).
async fn verify(serves: &[Serve], world: &DockerWorld) {
    let config = world
        .root
        .path()
        .join("i0")
        .join(format!("{}.toml", serves[0].instance));
    let out = tokio::process::Command::new(threadgate_bin())
        .arg("--config")
        .arg(&config)
        .args(["audit", "--verify"])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run threadgate audit --verify");
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    println!(
        "  threadgate audit --verify: {} ({first}{})",
        if out.status.success() {
            "passes"
        } else {
            "FAILS"
        },
        String::from_utf8_lossy(&out.stderr).trim()
    );
}
