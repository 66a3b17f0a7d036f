//! What the gateway adds to a call, measured in one run, side by side, alternating call
//! by call, against the same request straight to localstripe with reqwest, on SQLite
//! and on Postgres (each backend its own app, localstripe and customer; rounds
//! alternate between them, so both see the same load):
//!
//! - a read, `stripe.get_charge` (scope check, secret scan, a decision on a snapshot,
//!   the connector, then decision and outcome in one group commit), with Stripe's events
//!   configured so the customer's email is remembered, and the same read right after a
//!   signed `customer.updated` made it ask Stripe again (as every read does without
//!   Stripe's events);
//! - a write, `stripe.create_refund` under an `always_run` rule (completion lookups, the
//!   decision durable before it runs, the connector, the outcome commit);
//! - the parts of the path on their own: the two ownership lookups the scope check makes
//!   when nothing is remembered (`GET` charge, `GET` customer, straight to localstripe:
//!   the same two requests a refund's completion made before this round), one durable
//!   commit through the application's store, one read transaction, and a request on the
//!   session socket that reaches no handler (a 404: connect, HTTP, routing);
//! - and the phases of each gated call, timed inside the app by the `gate.*`, `db.*`,
//!   `pg.*` and `sqlite.*` spans (trace level, off in production) through a layer this
//!   bench installs: preparation (scope, completion), the deciding transaction, the
//!   connector, the outcome's transaction, the commits and, on Postgres, the statements
//!   (one round trip each), prepares and attempts (a SERIALIZABLE retry is a second
//!   attempt) per call.
//!
//! Custom harness: `cargo bench --bench gateway_call`. Needs `.venv-peers`
//! (`scripts/localstripe.sh setup`). Environment: `GATEWAY_BENCH_N` (calls of each
//! kind, default 400); `GATEWAY_BENCH_STORE` (`sqlite`, `postgres` or `both`; default
//! `both` when `THREADGATE_TEST_DATABASE_URL` names a Postgres server, e.g. the URL
//! `scripts/postgres-up.sh` prints, else `sqlite`): on Postgres the bench creates a
//! database of its own there and drops it after; `GATEWAY_BENCH_LOGS=capture` (keep the
//! test harness's debug-level log capture instead of warnings to stderr; the phases are
//! then not timed).

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

use serde_json::json;
use support::app::TestApp;
use support::figures::{load_average, micros, percentile};
use support::world::{Customer, World};
use threadgate::store::testing::{TestDb, test_database_url};

const WARM_UP: usize = 20;
const WEBHOOK_SECRET: &str = "whsec_bench_0123456789";

/// Latencies of one kind of call or phase.
#[derive(Default)]
struct Series {
    times: Vec<Duration>,
}

impl Series {
    fn median_p99(&self) -> (f64, f64) {
        let mut sorted = self.times.clone();
        sorted.sort();
        (
            micros(percentile(&sorted, 0.5)),
            micros(percentile(&sorted, 0.99)),
        )
    }
}

/// The phases of the gated calls, timed by spans inside the app.
mod phases {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use tracing::span;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::Context;
    use tracing_subscriber::registry::LookupSpan;

    /// A closed span: its name, how long it lived, and whether it was part of a gated
    /// call (it has the `gate` span among its ancestors).
    pub(crate) struct Closed {
        pub name: &'static str,
        pub took: Duration,
        pub in_call: bool,
    }

    static CLOSED: Mutex<Vec<Closed>> = Mutex::new(Vec::new());

    struct Opened(Instant);

    /// Records every span of the phases when it closes.
    pub(crate) struct Timing;

    pub(crate) fn timed(meta: &tracing::Metadata<'_>) -> bool {
        let name = meta.name();
        meta.is_span()
            && (name == "gate"
                || ["gate.", "db.", "pg.", "sqlite.", "http."]
                    .iter()
                    .any(|p| name.starts_with(p)))
    }

    impl<S> Layer<S> for Timing
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        fn on_new_span(&self, _: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(Opened(Instant::now()));
            }
        }

        fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
            let Some(span) = ctx.span(&id) else {
                return;
            };
            let Some(took) = span.extensions().get::<Opened>().map(|o| o.0.elapsed()) else {
                return;
            };
            let in_call = span.scope().skip(1).any(|s| s.name() == "gate");
            CLOSED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(Closed {
                    name: span.name(),
                    took,
                    in_call,
                });
        }
    }

    /// The spans closed since the last call.
    pub(crate) fn drain() -> Vec<Closed> {
        std::mem::take(
            &mut *CLOSED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// The kinds of measurement, in the order they are printed.
const KINDS: &[&str] = &[
    "read through the gateway",
    "read, customer's email asked again",
    "read straight to localstripe",
    "  two lookups (GET charge, GET customer), straight",
    "  one durable commit (the store's write)",
    "  one read transaction (SELECT 1)",
    "  the session socket's round trip (a 404)",
    "write (refund) through the gateway",
    "write (refund) straight to localstripe",
];

/// Per-call figures of one backend: latencies by kind, and for the gated reads and
/// writes their phases (durations) and counts (statements, commits, attempts).
#[derive(Default)]
struct Figures {
    kinds: BTreeMap<&'static str, Series>,
    /// (call kind, phase) → durations.
    phases: BTreeMap<(&'static str, &'static str), Series>,
    /// (call kind, span) → how many per call, summed; and the calls counted.
    counts: BTreeMap<(&'static str, &'static str), usize>,
    calls: BTreeMap<&'static str, usize>,
}

impl Figures {
    fn push(&mut self, kind: &'static str, took: Duration) {
        self.kinds.entry(kind).or_default().times.push(took);
    }

    /// Files the spans of one gated call of `call`.
    fn file_call(&mut self, call: &'static str, closed: Vec<phases::Closed>) {
        *self.calls.entry(call).or_default() += 1;
        for c in closed {
            // The SQLite writer's commit runs on its own thread, outside the call's
            // spans; this bench's calls are one at a time, so it is the call's.
            if !c.in_call && c.name != "sqlite.commit" {
                continue;
            }
            *self.counts.entry((call, c.name)).or_default() += 1;
            self.phases
                .entry((call, c.name))
                .or_default()
                .times
                .push(c.took);
        }
    }

    fn median(&self, kind: &str) -> f64 {
        self.kinds.get(kind).map_or(0.0, |s| s.median_p99().0)
    }
}

/// One backend's app, its customer and what was measured on it.
struct Backend {
    name: &'static str,
    world: World,
    app: TestApp,
    ada: Customer,
    http: reqwest::Client,
    figures: Figures,
    /// The Postgres database (dropped after the app stops).
    database: Option<TestDb>,
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs the harness with no
    // such flag and only needs it to build.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if std::env::var("GATEWAY_BENCH_LOGS").as_deref() != Ok("capture") {
        // Installed first, so the harness's debug-level capture does not install.
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        let lines = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(tracing_subscriber::filter::LevelFilter::WARN);
        let timing =
            phases::Timing.with_filter(tracing_subscriber::filter::filter_fn(phases::timed));
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(lines).with(timing),
        )
        .expect("logging");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

/// The backends asked for: `GATEWAY_BENCH_STORE`, else both when a Postgres server is
/// named.
fn backends_wanted() -> Vec<&'static str> {
    let asked = std::env::var("GATEWAY_BENCH_STORE").unwrap_or_default();
    match asked.as_str() {
        "sqlite" => vec!["sqlite"],
        "postgres" => vec!["postgres"],
        "both" => vec!["sqlite", "postgres"],
        "" if test_database_url().is_some() => vec!["sqlite", "postgres"],
        "" => vec!["sqlite"],
        other => panic!("GATEWAY_BENCH_STORE is {other:?}: sqlite, postgres or both"),
    }
}

async fn start_backend(name: &'static str) -> Backend {
    let mut world = World::with_policy_text(support::world::REFUNDS_RUN_POLICY).await;
    // The bench's one session calls back to back, faster than an agent is let.
    world.settings.sessions.calls_per_second = 0;
    let database = if name == "postgres" {
        let server = test_database_url().expect(
            "GATEWAY_BENCH_STORE=postgres needs THREADGATE_TEST_DATABASE_URL \
             (scripts/postgres-up.sh prints one)",
        );
        let db = tokio::task::spawn_blocking(move || TestDb::postgres(&server))
            .await
            .expect("create the bench database")
            .expect("create the bench database");
        world.use_postgres(db.url().expect("a url")).await;
        Some(db)
    } else {
        None
    };
    // Stripe's events configured, as the README recommends: the scope check remembers
    // customer emails until Stripe says one changed.
    world.use_stripe_events(WEBHOOK_SECRET).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900, 1_000_000, 1_000_000])
        .await;
    Backend {
        name,
        world,
        app,
        ada,
        http: reqwest::Client::new(),
        figures: Figures::default(),
        database,
    }
}

impl Backend {
    async fn get(&self, path: String) {
        let url = format!("{}{path}", self.world.stripe.base_url());
        let response = self
            .http
            .get(url)
            .bearer_auth(support::world::STRIPE_KEY)
            .send()
            .await
            .expect("localstripe");
        assert!(response.status().is_success());
        let _ = response.bytes().await.expect("body");
    }

    async fn refund_direct(&self, amount: u64) {
        let url = format!("{}/v1/refunds", self.world.stripe.base_url());
        let form = [
            ("charge", self.ada.charges[2].clone()),
            ("amount", amount.to_string()),
            ("reason", "requested_by_customer".to_owned()),
        ];
        let response = self
            .http
            .post(url)
            .bearer_auth(support::world::STRIPE_KEY)
            .form(&form)
            .send()
            .await
            .expect("localstripe");
        assert!(response.status().is_success());
        let _ = response.bytes().await.expect("body");
    }

    /// What Stripe sends when a customer changes: the next read asks Stripe again, as
    /// every read does without Stripe's events.
    async fn forget_ada(&self) {
        let url = format!("http://{}/webhooks/stripe", self.app.addr);
        let event = json!({
            "id": "evt_bench", "type": "customer.updated",
            "data": {"object": {"id": self.ada.id, "object": "customer"}},
        })
        .to_string();
        let signature = threadgate::connectors::stripe::events::sign(
            event.as_bytes(),
            WEBHOOK_SECRET.as_bytes(),
            chrono::Utc::now().timestamp(),
        );
        let response = self
            .http
            .post(url)
            .header("Stripe-Signature", signature)
            .body(event)
            .send()
            .await
            .expect("threadgate");
        assert!(response.status().is_success());
    }

    async fn commit(&self, i: usize) {
        self.app
            .db
            .write(move |c| {
                c.execute(
                    "INSERT INTO meta (key, value) VALUES ('bench-commit', ?1)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    [i.to_string()],
                )
            })
            .await
            .expect("commit");
    }

    async fn read_transaction(&self) {
        let one = self
            .app
            .db
            .read(|c| c.query_row("SELECT 1", (), |r| r.get::<_, i64>(0)))
            .await
            .expect("read");
        assert_eq!(one, 1);
    }

    async fn read_through_gateway(&self) -> (Duration, Vec<phases::Closed>) {
        phases::drain();
        let started = Instant::now();
        let (status, body) = self
            .ada
            .session
            .call(
                "stripe.get_charge",
                json!({"charge": self.ada.charges[0]}),
                None,
            )
            .await;
        let took = started.elapsed();
        assert_eq!(status, 200, "{body}");
        (took, phases::drain())
    }

    /// One round of every kind; recorded when `keep`. Which call of a side-by-side pair
    /// goes first alternates round by round: localstripe answers the first request
    /// after a write more slowly (it has just rewritten its store), and a round's first
    /// read follows the previous round's refunds.
    async fn round(&mut self, i: usize, keep: bool) {
        let charge = self.ada.charges[0].clone();
        let gated_first = i.is_multiple_of(2);
        let mut f = std::mem::take(&mut self.figures);

        for gated in [gated_first, !gated_first] {
            if gated {
                let (took, closed) = self.read_through_gateway().await;
                if keep {
                    f.push(KINDS[0], took);
                    f.file_call("read", closed);
                }
            } else {
                let started = Instant::now();
                self.get(format!("/v1/charges/{charge}")).await;
                keep.then(|| f.push(KINDS[2], started.elapsed()));
            }
        }

        self.forget_ada().await;
        let (took, _) = self.read_through_gateway().await;
        keep.then(|| f.push(KINDS[1], took));

        let started = Instant::now();
        self.get(format!("/v1/charges/{charge}")).await;
        self.get(format!("/v1/customers/{}", self.ada.id)).await;
        keep.then(|| f.push(KINDS[3], started.elapsed()));

        let started = Instant::now();
        self.commit(i).await;
        keep.then(|| f.push(KINDS[4], started.elapsed()));

        let started = Instant::now();
        self.read_transaction().await;
        keep.then(|| f.push(KINDS[5], started.elapsed()));

        let started = Instant::now();
        let (status, _) = self.ada.session.get("/v1/no-such-route").await;
        keep.then(|| f.push(KINDS[6], started.elapsed()));
        assert_eq!(status, 404);

        // Distinct amounts: an identical refund would be answered from the first.
        let amount = 1 + i as u64;
        for gated in [gated_first, !gated_first] {
            if gated {
                let (took, closed) = self.refund_through_gateway(amount).await;
                if keep {
                    f.push(KINDS[7], took);
                    f.file_call("write", closed);
                }
            } else {
                let started = Instant::now();
                self.refund_direct(amount).await;
                keep.then(|| f.push(KINDS[8], started.elapsed()));
            }
        }
        self.figures = f;
    }

    async fn refund_through_gateway(&self, amount: u64) -> (Duration, Vec<phases::Closed>) {
        let args = json!({
            "charge": self.ada.charges[1], "amount": amount, "reason": "requested_by_customer",
        });
        phases::drain();
        let started = Instant::now();
        let (status, body) = self
            .ada
            .session
            .call("stripe.create_refund", args, None)
            .await;
        let took = started.elapsed();
        let closed = phases::drain();
        assert_eq!(status, 200, "{body}");
        (took, closed)
    }
}

async fn run() {
    let n: usize = std::env::var("GATEWAY_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut backends = Vec::new();
    for name in backends_wanted() {
        backends.push(start_backend(name).await);
    }
    let load_before = load_average();
    for i in 0..WARM_UP + n {
        for backend in &mut backends {
            backend.round(i, i >= WARM_UP).await;
        }
    }
    let load_after = load_average();
    println!(
        "gateway calls, N = {n} of each kind, alternating, after {WARM_UP} warm-up rounds; \
         load average {load_before} before, {load_after} after"
    );
    report(&backends);
    for backend in backends {
        let rows = backend.app.executions().await;
        let audit = backend.app.audit_rows().await;
        println!(
            "  {}: recorded {} executions, {} audit rows ({:.1} per call); chain verifies ({} rows)",
            backend.name,
            rows.len(),
            audit.len(),
            audit.len() as f64 / rows.len().max(1) as f64,
            backend.app.verify_audit().await
        );
        backend.app.stop().await;
        drop(backend.database);
    }
}

/// Prints the backends' figures side by side.
fn report(backends: &[Backend]) {
    let header: String = backends
        .iter()
        .map(|b| format!(" | {:>8} p50 {:>7} p99", b.name, ""))
        .collect();
    println!("  {:<52}{header}", "(microseconds)");
    for kind in KINDS {
        let cells: String = backends
            .iter()
            .map(|b| {
                let (p50, p99) = b
                    .figures
                    .kinds
                    .get(kind)
                    .map_or((0.0, 0.0), Series::median_p99);
                format!(" | {p50:12.0} {p99:11.0}")
            })
            .collect();
        println!("  {kind:<52}{cells}");
    }
    let added: String = backends
        .iter()
        .map(|b| {
            let f = &b.figures;
            let direct = f.median(KINDS[2]);
            format!(
                "\n    {}: read {:.0} us (email asked again: {:.0} us), write {:.0} us",
                b.name,
                f.median(KINDS[0]) - direct,
                f.median(KINDS[1]) - direct,
                f.median(KINDS[7]) - f.median(KINDS[8]),
            )
        })
        .collect();
    println!("  added by the gateway at the median:{added}");
    for call in ["read", "write"] {
        println!("  phases of a gated {call}, from the app's spans (median us; per call):");
        let mut names: Vec<&'static str> = backends
            .iter()
            .flat_map(|b| b.figures.phases.keys())
            .filter(|(c, _)| *c == call)
            .map(|(_, name)| *name)
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let cells: String = backends
                .iter()
                .map(|b| {
                    let f = &b.figures;
                    let calls = f.calls.get(call).copied().unwrap_or(0).max(1);
                    let count = f.counts.get(&(call, name)).copied().unwrap_or(0);
                    let p50 = f
                        .phases
                        .get(&(call, name))
                        .map_or(0.0, |s| s.median_p99().0);
                    format!(" | {p50:12.0} {:>9.2}x", count as f64 / calls as f64)
                })
                .collect();
            println!("    {name:<50}{cells}");
        }
    }
}
