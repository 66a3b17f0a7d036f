//! Prometheus metrics: one process-wide set of families, counted where things happen
//! (one line each, through the functions below) and served as Prometheus text on a
//! listener of its own (`THREADGATE_METRICS_LISTEN`, off by default; never on a
//! session socket, so an agent cannot read them).
//!
//! Counters and histograms are counted as events happen. Gauges that describe stored
//! state (sessions by state, held calls and the oldest one's age, the note outbox) are
//! read from the database at each scrape (`app/metrics_http.rs`), so they are never out
//! of step with it. This module imports nothing of threadgate: every module may count.
//!
//! Label values are bounded: tool names come from the fixed catalog (a name outside it
//! is counted as `unknown`), providers from the fixed connector list, models from the
//! configuration, refusal reasons from a fixed list. A hostile agent cannot grow the
//! series without bound.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// One label set: `N` fixed keys with their values.
type Labels<const N: usize> = [(&'static str, String); N];
/// A histogram family whose buckets are made by a plain function.
type Histograms<const N: usize> = Family<Labels<N>, Histogram, fn() -> Histogram>;

/// Seconds from 0.5 ms to about 65 s: webhook answers, commits, calls, starts.
fn latency_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

/// Seconds from 1 s to about 36 h: how long a held call waits for a person.
fn decision_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 4.0, 10))
}

/// Jobs per group commit: 1 to 512 (the writer's largest batch).
fn batch_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 10))
}

/// Every family threadgate exports.
pub struct Metrics {
    registry: Registry,
    deliveries: Family<Labels<2>, Counter>,
    delivery_seconds: Histograms<1>,
    sessions: Family<Labels<1>, Gauge>,
    session_starts: Family<Labels<1>, Counter>,
    session_start_seconds: Histograms<1>,
    reconcile_actions: Family<Labels<1>, Counter>,
    session_launches: Family<Labels<1>, Counter>,
    pool_actions: Family<Labels<1>, Counter>,
    pool_parked: Gauge,
    tool_calls: Family<Labels<2>, Counter>,
    connector_seconds: Histograms<1>,
    connector_errors: Family<Labels<2>, Counter>,
    held_calls: Gauge,
    held_oldest_seconds: Gauge<f64, AtomicU64>,
    approvals: Family<Labels<1>, Counter>,
    approval_seconds: Histograms<1>,
    outbox_backlog: Gauge,
    db_batch_size: Histogram,
    db_commit_seconds: Histograms<1>,
    model_tokens: Family<Labels<1>, Counter>,
    model_seconds: Histograms<2>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn get() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    fn new() -> Metrics {
        let histograms = || Histograms::<1>::new_with_constructor(latency_buckets);
        let mut m = Metrics {
            registry: Registry::with_prefix("threadgate"),
            deliveries: Family::default(),
            delivery_seconds: histograms(),
            sessions: Family::default(),
            session_starts: Family::default(),
            session_start_seconds: histograms(),
            reconcile_actions: Family::default(),
            session_launches: Family::default(),
            pool_actions: Family::default(),
            pool_parked: Gauge::default(),
            tool_calls: Family::default(),
            connector_seconds: histograms(),
            connector_errors: Family::default(),
            held_calls: Gauge::default(),
            held_oldest_seconds: Gauge::default(),
            approvals: Family::default(),
            approval_seconds: Histograms::<1>::new_with_constructor(decision_buckets),
            outbox_backlog: Gauge::default(),
            db_batch_size: batch_buckets(),
            db_commit_seconds: histograms(),
            model_tokens: Family::default(),
            model_seconds: Histograms::<2>::new_with_constructor(latency_buckets),
        };
        m.register();
        m
    }

    fn register(&mut self) {
        let r = &mut self.registry;
        r.register(
            "webhook_deliveries",
            "Plain webhook deliveries by outcome (stored, duplicate, refused) and refusal reason",
            self.deliveries.clone(),
        );
        r.register(
            "webhook_answer_seconds",
            "Time from a delivery's arrival to its answer, by outcome (2xx only)",
            self.delivery_seconds.clone(),
        );
        r.register(
            "sessions",
            "Sessions by state, read from the database at scrape time",
            self.sessions.clone(),
        );
        r.register(
            "session_starts",
            "Session container starts by result (ok, failed)",
            self.session_starts.clone(),
        );
        r.register(
            "session_start_seconds",
            "Time to prepare a session's workspace and start its container, by result",
            self.session_start_seconds.clone(),
        );
        r.register(
            "reconcile_actions",
            "Reconciliation actions (adopted, reaped, resumed, secrets_reaped)",
            self.reconcile_actions.clone(),
        );
        r.register(
            "session_launches",
            "Sessions given a sandbox, by launch type: warm (a parked sandbox adopted) or \
             cold (a pool miss: a container started); the hit rate is warm / (warm + cold)",
            self.session_launches.clone(),
        );
        r.register(
            "sandbox_pool_actions",
            "Parked sandboxes by what happened to them (parked, taken, expired, removed, \
             failed)",
            self.pool_actions.clone(),
        );
        r.register(
            "sandbox_pool_parked",
            "Parked sandboxes waiting for a thread, across agents",
            self.pool_parked.clone(),
        );
        r.register(
            "tool_calls",
            "Tool calls through the gateway by tool and decision",
            self.tool_calls.clone(),
        );
        r.register(
            "connector_seconds",
            "Provider call latency by provider",
            self.connector_seconds.clone(),
        );
        r.register(
            "connector_errors",
            "Provider call errors by provider and kind (definite, unknown, rate_limited)",
            self.connector_errors.clone(),
        );
        r.register(
            "held_calls",
            "Calls waiting for a person's decision, read at scrape time",
            self.held_calls.clone(),
        );
        r.register(
            "held_call_oldest_age_seconds",
            "Age of the oldest call waiting for a decision (0 when none)",
            self.held_oldest_seconds.clone(),
        );
        r.register(
            "approvals",
            "Held calls settled, by outcome (approved, denied, expired)",
            self.approvals.clone(),
        );
        r.register(
            "approval_decision_seconds",
            "Time from a call being held to its decision, by outcome",
            self.approval_seconds.clone(),
        );
        r.register(
            "note_outbox_backlog",
            "Internal notes not yet posted to Plain, read at scrape time",
            self.outbox_backlog.clone(),
        );
        r.register(
            "db_write_batch_size",
            "Write jobs folded into one group commit",
            self.db_batch_size.clone(),
        );
        r.register(
            "db_commit_seconds",
            "Time of one group commit (run the batch, COMMIT, fsync), by result",
            self.db_commit_seconds.clone(),
        );
        r.register(
            "model_tokens",
            "Model tokens spent (prompt and completion) by model",
            self.model_tokens.clone(),
        );
        r.register(
            "model_call_seconds",
            "Model call latency by model and result",
            self.model_seconds.clone(),
        );
    }

    /// The families as Prometheus text (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// A webhook delivery's outcome: `stored`, `duplicate` or `refused` (with `reason`,
/// one of a fixed list), and for a 2xx the time to answer.
pub fn delivery(outcome: &'static str, reason: &'static str, answered: Option<Duration>) {
    let m = get();
    m.deliveries
        .get_or_create(&[("outcome", outcome.into()), ("reason", reason.into())])
        .inc();
    if let Some(took) = answered {
        m.delivery_seconds
            .get_or_create(&[("outcome", outcome.into())])
            .observe(took.as_secs_f64());
    }
}

/// A session start finished (`ok` or `failed`) after `took`.
pub fn session_start(ok: bool, took: Duration) {
    let m = get();
    let result = if ok { "ok" } else { "failed" };
    m.session_starts
        .get_or_create(&[("result", result.into())])
        .inc();
    m.session_start_seconds
        .get_or_create(&[("result", result.into())])
        .observe(took.as_secs_f64());
}

/// A session given a sandbox: `launch` is `warm` (adopted from the pool) or `cold`.
pub fn session_launch(launch: &'static str) {
    get()
        .session_launches
        .get_or_create(&[("launch", launch.into())])
        .inc();
}

/// How many sessions were launched `launch` (`warm` or `cold`) so far.
pub fn session_launches(launch: &'static str) -> u64 {
    get()
        .session_launches
        .get_or_create(&[("launch", launch.into())])
        .get()
}

/// `count` parked sandboxes went through `action` (parked, taken, expired, removed,
/// failed).
pub fn pool_action(action: &'static str, count: usize) {
    get()
        .pool_actions
        .get_or_create(&[("action", action.into())])
        .inc_by(count as u64);
}

/// How many sandboxes are parked now, across agents.
pub fn pool_parked(count: usize) {
    get()
        .pool_parked
        .set(i64::try_from(count).unwrap_or(i64::MAX));
}

/// `count` reconciliation actions of one kind.
pub fn reconcile(action: &'static str, count: usize) {
    get()
        .reconcile_actions
        .get_or_create(&[("action", action.into())])
        .inc_by(count as u64);
}

/// A tool call answered with `decision`. `tool` must be a catalog name (callers pass
/// `unknown` otherwise, so an agent cannot mint series).
pub fn tool_call(tool: &str, decision: &'static str) {
    get()
        .tool_calls
        .get_or_create(&[("tool", tool.to_owned()), ("decision", decision.into())])
        .inc();
}

/// One provider call by `provider` (a connector name) that took `took`; `error` is the
/// kind of failure, if any.
pub fn connector_call(provider: &'static str, took: Duration, error: Option<&'static str>) {
    let m = get();
    m.connector_seconds
        .get_or_create(&[("provider", provider.into())])
        .observe(took.as_secs_f64());
    if let Some(kind) = error {
        m.connector_errors
            .get_or_create(&[("provider", provider.into()), ("kind", kind.into())])
            .inc();
    }
}

/// A held call settled (`approved`, `denied`, `expired`), `waited_ms` after it was held.
pub fn approval(outcome: &'static str, waited_ms: i64) {
    let m = get();
    m.approvals
        .get_or_create(&[("outcome", outcome.into())])
        .inc();
    m.approval_seconds
        .get_or_create(&[("outcome", outcome.into())])
        .observe(waited_ms.max(0) as f64 / 1000.0);
}

/// One group commit of `jobs` write jobs that took `took`.
pub fn db_commit(jobs: usize, took: Duration, ok: bool) {
    let m = get();
    m.db_batch_size.observe(jobs as f64);
    let result = if ok { "ok" } else { "failed" };
    m.db_commit_seconds
        .get_or_create(&[("result", result.into())])
        .observe(took.as_secs_f64());
}

/// One model call to `model` spending `tokens` (prompt and completion).
pub fn model_call(model: &str, tokens: u64, took: Duration, ok: bool) {
    let m = get();
    m.model_tokens
        .get_or_create(&[("model", model.to_owned())])
        .inc_by(tokens);
    let result = if ok { "ok" } else { "failed" };
    m.model_seconds
        .get_or_create(&[("model", model.to_owned()), ("result", result.into())])
        .observe(took.as_secs_f64());
}

/// The gauges that describe stored state, as read at a scrape: sessions by state,
/// held calls and the oldest one's age, and the note outbox's backlog.
pub fn stored_state(
    sessions: &[(&'static str, i64)],
    held: i64,
    oldest_held: Duration,
    outbox: i64,
) {
    let m = get();
    for (state, n) in sessions {
        m.sessions
            .get_or_create(&[("state", (*state).into())])
            .set(*n);
    }
    m.held_calls.set(held);
    m.held_oldest_seconds.set(oldest_held.as_secs_f64());
    m.outbox_backlog.set(outbox);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample line `name{labels}` (labels in the order rendered).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn counters_render_with_their_labels() {
        let before = get().render();
        let series =
            "threadgate_tool_calls_total{tool=\"stripe.get_charge\",decision=\"unit_test\"}";
        let was = sample(&before, series).unwrap_or(0.0);
        tool_call("stripe.get_charge", "unit_test");
        tool_call("stripe.get_charge", "unit_test");
        let after = get().render();
        assert_eq!(sample(&after, series), Some(was + 2.0), "{after}");
        assert!(after.contains("# TYPE threadgate_db_write_batch_size histogram"));
    }
}
