//! What a test reads back from a [`TestApp`]'s database: executions, audit rows (and the
//! audit chain's check), sessions and stored events.

use std::time::Duration;

use serde_json::Value;

use super::app::TestApp;
use super::wait::wait_for;

/// One row of the audit log, as the tests read it.
#[derive(Debug, Clone)]
pub struct AuditRow {
    pub event: String,
    pub execution_id: Option<String>,
    pub rule: Option<String>,
    pub args: Option<String>,
    pub outcome: Option<String>,
    pub reviewer: Option<String>,
}

/// One row of the executions table, as the tests read it.
#[derive(Debug, Clone)]
pub struct ExecRow {
    pub id: String,
    pub tool: String,
    pub status: String,
    pub verdict: String,
    pub because: String,
    pub args: Value,
    pub result: Option<String>,
    pub error: Option<String>,
    pub summary: Option<String>,
    pub session_id: String,
    pub decision_message: Option<String>,
}

/// A session row: `(state, container_id, session_id)`.
pub type SessionRow = (String, Option<String>, String);

impl TestApp {
    /// Every execution, oldest first, once the reads' outcomes written after their
    /// answers are (the gate's trailing outcomes).
    pub async fn executions(&self) -> Vec<ExecRow> {
        self.gate.outcomes_settled().await;
        self.db
            .read(|c| {
                let mut stmt = c.prepare(
                    "SELECT id, tool, status, verdict, because, args, result, error, summary, \
                     session_id, decision_message FROM executions ORDER BY created_at_ms, id",
                )?;
                let rows = stmt.query_map((), |r| {
                    Ok(ExecRow {
                        id: r.get(0)?,
                        tool: r.get(1)?,
                        status: r.get(2)?,
                        verdict: r.get(3)?,
                        because: r.get(4)?,
                        args: serde_json::from_str(&r.get::<_, String>(5)?).unwrap_or_default(),
                        result: r.get(6)?,
                        error: r.get(7)?,
                        summary: r.get(8)?,
                        session_id: r.get(9)?,
                        decision_message: r.get(10)?,
                    })
                })?;
                rows.collect()
            })
            .await
            .expect("read executions")
    }

    /// [`TestApp::executions`] of `tool` only, oldest first.
    pub async fn executions_of(&self, tool: &str) -> Vec<ExecRow> {
        let all = self.executions().await;
        all.into_iter().filter(|e| e.tool == tool).collect()
    }

    /// One execution by id.
    pub async fn execution(&self, id: &str) -> ExecRow {
        self.executions()
            .await
            .into_iter()
            .find(|e| e.id == id)
            .unwrap_or_else(|| panic!("no execution {id}"))
    }

    /// Every audit row, oldest first (on Postgres, every row committed so far chained
    /// first).
    pub async fn audit_rows(&self) -> Vec<AuditRow> {
        self.chain_waiting().await;
        self.db
            .read(|c| {
                let mut stmt = c.prepare(
                    "SELECT event, execution_id, rule, args_redacted, outcome, reviewer \
                     FROM audit ORDER BY id",
                )?;
                let rows = stmt.query_map((), |r| {
                    Ok(AuditRow {
                        event: r.get(0)?,
                        execution_id: r.get(1)?,
                        rule: r.get(2)?,
                        args: r.get(3)?,
                        outcome: r.get(4)?,
                        reviewer: r.get(5)?,
                    })
                })?;
                rows.collect()
            })
            .await
            .expect("read audit")
    }

    /// The audit events of one execution, oldest first.
    pub async fn audit_events_of(&self, execution_id: &str) -> Vec<String> {
        self.audit_rows()
            .await
            .into_iter()
            .filter(|r| r.execution_id.as_deref() == Some(execution_id))
            .map(|r| r.event)
            .collect()
    }

    /// Chains the audit rows waiting on Postgres (the instances' background steps may
    /// not have run yet); nothing on SQLite. The reads' outcomes written after their
    /// answers are waited for first.
    pub async fn chain_waiting(&self) {
        self.gate.outcomes_settled().await;
        let waiting = threadgate::audit::chain_waiting(&self.db)
            .await
            .expect("chain the audit rows waiting");
        assert_eq!(waiting, 0, "audit rows still waiting after chaining");
    }

    /// Checks the audit chain; returns its length.
    pub async fn verify_audit(&self) -> usize {
        self.chain_waiting().await;
        self.db
            .read(|conn| Ok(threadgate::audit::verify(conn)))
            .await
            .expect("read")
            .expect("the audit chain verifies")
    }

    /// The session row of a thread.
    pub async fn session(&self, thread: &str) -> Option<SessionRow> {
        let thread = thread.to_owned();
        self.db
            .read(move |c| {
                use threadgate::store::OptionalExtension;
                c.query_row(
                    "SELECT state, container_id, session_id FROM sessions WHERE thread_id = ?1",
                    [&thread],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()
            })
            .await
            .expect("read session")
    }

    /// Every session: `(thread, state, container_id, session_id)`.
    pub async fn sessions(&self) -> Vec<(String, String, Option<String>, String)> {
        self.db
            .read(|c| {
                let mut stmt = c.prepare(
                    "SELECT thread_id, state, container_id, session_id FROM sessions \
                     ORDER BY thread_id",
                )?;
                let rows =
                    stmt.query_map((), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
                rows.collect()
            })
            .await
            .expect("read sessions")
    }

    /// The texts of the internal notes queued for a thread, oldest first.
    pub async fn notes(&self, thread: &str) -> Vec<String> {
        let thread = thread.to_owned();
        self.db
            .read(move |c| {
                let mut stmt =
                    c.prepare("SELECT text FROM note_outbox WHERE thread_id = ?1 ORDER BY rowid")?;
                let rows = stmt.query_map([&thread], |r| r.get(0))?;
                rows.collect()
            })
            .await
            .expect("read notes")
    }

    /// How many stored events carry `event_id`.
    pub async fn event_rows(&self, event_id: &str) -> i64 {
        let id = event_id.to_owned();
        self.db
            .read(move |c| {
                c.query_row(
                    "SELECT count(*) FROM events WHERE event_id = ?1",
                    [&id],
                    |r| r.get(0),
                )
            })
            .await
            .expect("count events")
    }

    /// Waits until the thread's session is running and returns its container id.
    pub async fn running(&self, thread: &str) -> String {
        let found = wait_for(Duration::from_secs(60), || async {
            match self.session(thread).await {
                Some((state, Some(container), _)) if state == "running" => Some(container),
                _ => None,
            }
        })
        .await;
        match found {
            Some(container) => container,
            None => panic!(
                "session of {thread} not running after 60 s: {:?}",
                self.session(thread).await
            ),
        }
    }
}
