//! Prometheus metrics: one process-wide set of families, counted where things happen
//! (one line each, through the functions below) and served as Prometheus text on a
//! listener of its own (`THREADGATE_METRICS_LISTEN`, off by default; never on a
//! session socket, so an agent cannot read them).
//!
//! Counters and histograms are counted as events happen. Gauges that describe stored
//! state (sessions by state, held calls and the oldest one's age, the note outbox) are
//! read from the database at each scrape, so they are never out of step with it.
//!
//! Label values are bounded: tool names come from the fixed catalog (a name outside it
//! is counted as `unknown`), providers from the fixed connector list, models from the
//! configuration, refusal reasons from a fixed list. A hostile agent cannot grow the
//! series without bound.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use tracing::Instrument as _;

use crate::connectors::{CallContext, Connector, ConnectorError};
use crate::store::Db;

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

/// A connector whose calls are timed, counted by provider and traced in a
/// `connector_call` span (with the provider and the execution id).
pub struct Metered(pub Arc<dyn Connector>);

/// Wraps `connector` in [`Metered`].
pub fn metered(connector: Arc<dyn Connector>) -> Arc<dyn Connector> {
    Arc::new(Metered(connector))
}

/// The fixed label of a connector error.
fn error_kind(e: &ConnectorError) -> &'static str {
    match e {
        ConnectorError::Rejected { .. } => "rejected",
        ConnectorError::RateLimited { .. } => "rate_limited",
        ConnectorError::Unknown { .. } => "unknown",
        ConnectorError::Unreachable { .. } => "unreachable",
        ConnectorError::InvalidArgs { .. } => "invalid_args",
    }
}

#[async_trait::async_trait]
impl Connector for Metered {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    async fn call(
        &self,
        tool: &str,
        args: &serde_json::Value,
        ctx: &CallContext<'_>,
    ) -> Result<serde_json::Value, ConnectorError> {
        let provider = self.0.name();
        let span = tracing::info_span!(
            "connector_call",
            provider,
            execution_id = %ctx.execution_id
        );
        let began = Instant::now();
        let outcome = self.0.call(tool, args, ctx).instrument(span.clone()).await;
        let kind = outcome.as_ref().err().map(error_kind);
        span.in_scope(|| {
            tracing::debug!(
                took_ms = began.elapsed().as_millis() as u64,
                error = kind,
                "provider answered"
            )
        });
        connector_call(provider, began.elapsed(), kind);
        outcome
    }

    fn supports_idempotency(&self) -> bool {
        self.0.supports_idempotency()
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

/// What the scrape reads from the database.
#[derive(Debug, Default, PartialEq)]
struct Stored {
    sessions: Vec<(String, i64)>,
    held: i64,
    oldest_held_ms: Option<i64>,
    outbox: i64,
}

/// The session states the `sessions` gauge always reports (0 when none).
const SESSION_STATES: [&str; 5] = ["queued", "starting", "running", "idle", "ended"];

fn read_stored(c: &rusqlite::Connection) -> rusqlite::Result<Stored> {
    let mut stmt = c.prepare("SELECT state, count(*) FROM sessions GROUP BY state")?;
    let sessions = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let (held, oldest_held_ms) = c.query_row(
        "SELECT count(*), min(created_at_ms) FROM executions WHERE status = 'held'",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let outbox = c.query_row(
        "SELECT count(*) FROM note_outbox WHERE sent_at_ms IS NULL",
        [],
        |r| r.get(0),
    )?;
    Ok(Stored {
        sessions,
        held,
        oldest_held_ms,
        outbox,
    })
}

/// What the metrics listener serves.
#[derive(Clone)]
pub struct MetricsState {
    /// Read at each scrape for the stored-state gauges.
    pub db: Db,
    /// Now, in unix milliseconds (the held calls' age).
    pub clock: crate::session::Clock,
}

/// The metrics listener's routes: `GET /metrics`.
pub fn router(state: MetricsState) -> Router {
    Router::new()
        .route("/metrics", routing::get(scrape))
        .with_state(state)
}

async fn scrape(State(s): State<MetricsState>) -> Response {
    let m = get();
    match s.db.read(read_stored).await {
        Ok(stored) => {
            for state in SESSION_STATES {
                let n = stored
                    .sessions
                    .iter()
                    .find(|(s, _)| s == state)
                    .map_or(0, |(_, n)| *n);
                m.sessions.get_or_create(&[("state", state.into())]).set(n);
            }
            m.held_calls.set(stored.held);
            let age_ms = stored.oldest_held_ms.map_or(0, |at| (s.clock)() - at);
            m.held_oldest_seconds.set(age_ms.max(0) as f64 / 1000.0);
            m.outbox_backlog.set(stored.outbox);
        }
        // The counters still answer; the stored-state gauges keep their last values.
        Err(e) => tracing::warn!(error = %e, "metrics: cannot read stored state"),
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
        m.render(),
    )
        .into_response()
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

    #[test]
    fn stored_state_is_read_from_the_database() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(&dir.path().join("t.db")).expect("open");
        let stored = db.read_blocking(read_stored).expect("read");
        assert_eq!(stored, Stored::default());
    }
}
