//! The metrics listener (`THREADGATE_METRICS_LISTEN`): `GET /metrics`, with the gauges
//! of stored state read from the database at each scrape.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing;
use prometheus_client::encoding::prometheus_text;
use std::time::Duration;

use crate::clock::Clock;
use crate::store::Db;

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

fn read_stored(c: &crate::store::Conn<'_>) -> crate::store::Result<Stored> {
    let (held, oldest_held_ms) = crate::executions::store::held_summary(c)?;
    Ok(Stored {
        sessions: crate::session::store::count_by_state(c)?,
        held,
        oldest_held_ms,
        outbox: crate::executions::store::outbox_backlog(c)?,
    })
}

/// What the metrics listener serves.
#[derive(Clone)]
pub(super) struct MetricsState {
    /// Read at each scrape for the stored-state gauges.
    pub db: Db,
    /// Now, in unix milliseconds (the held calls' age).
    pub clock: Clock,
}

/// The metrics listener's routes: `GET /metrics`.
pub(super) fn router(state: MetricsState) -> Router {
    Router::new()
        .route("/metrics", routing::get(scrape))
        .with_state(state)
}

async fn scrape(State(s): State<MetricsState>) -> Response {
    match s.db.read(read_stored).await {
        Ok(stored) => {
            let sessions: Vec<(&'static str, i64)> = SESSION_STATES
                .iter()
                .map(|state| {
                    let n = stored
                        .sessions
                        .iter()
                        .find(|(s, _)| s == state)
                        .map_or(0, |(_, n)| *n);
                    (*state, n)
                })
                .collect();
            let age_ms = stored.oldest_held_ms.map_or(0, |at| s.clock.now_ms() - at);
            let age = Duration::from_millis(age_ms.max(0) as u64);
            crate::metrics::stored_state(&sessions, stored.held, age, stored.outbox);
        }
        // The counters still answer; the stored-state gauges keep their last values.
        Err(e) => tracing::warn!(error = %e, "metrics: cannot read stored state"),
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
        crate::metrics::get().render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stored_state_is_read_from_the_database() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(&dir.path().join("t.db")).expect("open");
        let stored = db.read(read_stored).await.expect("read");
        assert_eq!(stored, Stored::default());
    }
}
