//! Approvals: a person's decision on a held call, and running an approved call exactly
//! once.
//!
//! A held call's row is frozen when it is held. Deciding it is a compare-and-set from
//! `held` (two reviewers at once: one wins, the other is told it was already decided);
//! running it is a second compare-and-set from `approved` to `running`, so a retried
//! request, a second reviewer or a restart can never send it twice. Stripe also gets an
//! idempotency key derived from the execution id; a call to a provider without one whose
//! outcome is unknown after a crash is marked `needs_check` for a person, never re-sent.

pub mod http;
pub mod narrow;

use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;

use crate::audit::{AuditEvent, AuditRecord};
use crate::executions::{self, Execution, Status, store, trail};
use crate::gateway::{CallReply, Gate, LoadedPolicy};
use crate::ids::ExecutionId;
use crate::policy::Verdict;
use crate::secrets::Redactor;
use crate::tasks::Tasks;

/// What a reviewer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Choice {
    Approve,
    Deny,
}

/// Why a decision was not taken.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("no held call {0}")]
    NotFound(String),
    #[error("call {id} expired; the agent must make a new call")]
    Expired { id: String },
    #[error("call {id} was already decided: {status}")]
    AlreadyDecided { id: String, status: &'static str },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// The approvals service.
#[derive(Clone)]
pub struct Approvals {
    pub gate: Arc<Gate>,
    /// The application's tasks: an approved call runs there, so shutdown waits for it.
    tasks: Tasks,
}

/// What an earlier run of threadgate left to recover ([`Approvals::leftovers`]).
#[derive(Debug, Default)]
pub struct Leftovers {
    approved: Vec<Execution>,
    running: Vec<Execution>,
}

enum Recorded {
    Decided(Execution),
    Expired(Execution),
    Already(Status),
    Missing,
}

impl Approvals {
    /// The service over `gate`; approved calls run among `tasks`.
    pub fn new(gate: Arc<Gate>, tasks: Tasks) -> Approvals {
        Approvals { gate, tasks }
    }

    /// Records a reviewer's decision on a held call and, when approved, runs it.
    pub async fn decide(
        &self,
        id: &ExecutionId,
        reviewer: &str,
        choice: Choice,
        message: Option<String>,
    ) -> Result<Execution, DecideError> {
        let now = self.gate.now();
        let redactor = self.gate.current_redactor();
        let asked = Asked {
            id: id.clone(),
            reviewer: reviewer.to_owned(),
            choice,
            message,
            now,
        };
        let recorded = self
            .gate
            .db()
            .write(move |conn| record_decision(conn, &redactor, &asked))
            .await?;
        match recorded {
            Recorded::Missing => Err(DecideError::NotFound(id.to_string())),
            Recorded::Already(Status::Expired) => Err(DecideError::Expired { id: id.to_string() }),
            Recorded::Already(status) => Err(DecideError::AlreadyDecided {
                id: id.to_string(),
                status: status.as_str(),
            }),
            Recorded::Expired(exec) => {
                crate::metrics::approval("expired", now - exec.created_at_ms);
                self.after_change(&exec);
                Err(DecideError::Expired { id: id.to_string() })
            }
            Recorded::Decided(exec) => {
                crate::metrics::approval(exec.status.as_str(), now - exec.created_at_ms);
                if exec.status == Status::Approved {
                    self.spawn_run(&exec.id);
                }
                self.after_change(&exec);
                Ok(exec)
            }
        }
    }

    /// Runs an approved call off the reviewer's request, in the application's tasks
    /// (shutdown waits for it; a run cut at the deadline is recovered at the next start).
    fn spawn_run(&self, id: &ExecutionId) {
        let (me, id) = (self.clone(), id.clone());
        self.tasks.spawn(async move {
            me.run_approved(&id).await;
        });
    }

    fn after_change(&self, exec: &Execution) {
        // The trail's event for this change is queued; the outbox posts it.
        self.gate.changed(exec);
    }

    /// Runs an approved call once: claims it (`approved` to `running`), decides it again
    /// against the current policy (a `block` now beats the approval), then sends it.
    /// Does nothing when another task already claimed it.
    pub async fn run_approved(&self, id: &ExecutionId) -> Option<CallReply> {
        let loaded = self.gate.current_policy();
        let catalog = self.gate.catalog().clone();
        let redactor = self.gate.current_redactor();
        let now = self.gate.now();
        let id_owned = id.clone();
        let runner = self.gate.runner();
        let claimed = self
            .gate
            .db()
            .write(move |conn| claim(conn, &loaded, &catalog, &redactor, &id_owned, now, &runner))
            .await;
        let (exec, run) = match claimed {
            Ok(Some(c)) => c,
            Ok(None) => return None,
            Err(e) => {
                tracing::error!(execution = %id, error = %e, "cannot claim an approved call");
                return None;
            }
        };
        if !run {
            self.after_change(&exec);
            return None;
        }
        let reply = self.gate.execute(exec.clone(), Instant::now()).await;
        self.after_change(&exec);
        Some(reply)
    }

    /// Expires held calls whose ttl has passed; they never run.
    pub async fn expire_due(&self) -> usize {
        let now = self.gate.now();
        let redactor = self.gate.current_redactor();
        let expired = self
            .gate
            .db()
            .write(move |conn| {
                let due = store::expired_holds(conn, now)?;
                let mut done = Vec::new();
                for exec in due {
                    if expire_held(conn, &redactor, &exec)? {
                        done.push(exec);
                    }
                }
                Ok(done)
            })
            .await;
        let expired = match expired {
            Ok(expired) => expired,
            Err(e) => {
                // Nothing expired in this pass; the next pass finds the same calls due.
                tracing::error!(error = %e, "cannot expire held calls; retried next pass");
                return 0;
            }
        };
        for exec in &expired {
            crate::metrics::approval("expired", now - exec.created_at_ms);
            self.after_change(exec);
        }
        expired.len()
    }

    /// The calls an earlier run of threadgate left approved or in flight. Read at start,
    /// before any session socket opens: a call a session makes after that is never a
    /// leftover, so recovery cannot re-send or mark one that is running now.
    ///
    /// With several instances on one database, the running calls taken are this
    /// instance's own (its earlier boot's), those with no runner recorded, and those of
    /// an instance whose heartbeat is not newer than `alive_after_ms`: never a call
    /// another live instance is sending now. Approved calls are all taken: running one
    /// claims it (`approved` to `running`), so of two instances one runs it.
    ///
    /// A failed read is an error, not an empty list: an approved call that is never
    /// read back would never run, so threadgate does not start without knowing them.
    pub async fn leftovers(
        &self,
        alive_after_ms: i64,
    ) -> Result<Leftovers, crate::store::StoreError> {
        let db = self.gate.db();
        let approved = db.read(|c| store::with_status(c, Status::Approved)).await?;
        let me = self.gate.runner();
        let running = db
            .read(move |c| store::leftover_running(c, &me, alive_after_ms))
            .await?;
        Ok(Leftovers { approved, running })
    }

    /// After a restart: runs approved calls that had not run, re-sends calls whose
    /// outcome is unknown where the provider deduplicates by idempotency key, and marks
    /// the others for a person to check.
    pub async fn recover(&self, left: Leftovers) {
        for exec in left.approved {
            tracing::info!(execution = %exec.id, "running an approved call left by a restart");
            self.run_approved(&exec.id).await;
        }
        for exec in left.running {
            if self.gate.may_resend(&exec.tool) {
                tracing::info!(execution = %exec.id, "re-sending a call with its idempotency key after a restart");
                self.gate.execute(exec, Instant::now()).await;
            } else {
                self.mark_needs_check(exec).await;
            }
        }
    }

    async fn mark_needs_check(&self, exec: Execution) {
        let now = self.gate.now();
        let redactor = self.gate.current_redactor();
        let reason = "threadgate stopped while this call was in flight; the provider has no idempotency key, so it was not re-sent: check the provider";
        let e = exec.clone();
        let written = self
            .gate
            .db()
            .write(move |conn| {
                store::finish(conn, &e.id, Status::NeedsCheck, None, Some(reason), now)?;
                if trail::was_held(&e) {
                    let event = trail::ran(&e, Status::NeedsCheck, Some(reason), &redactor);
                    trail::enqueue(conn, &event, now)?;
                }
                executions::audit(
                    conn,
                    &redactor,
                    &e,
                    AuditRecord::new(AuditEvent::OutcomeUnknown).outcome(Some(reason)),
                )
            })
            .await;
        if let Err(e) = written {
            tracing::error!(error = %e, "cannot mark a call for checking");
        }
        self.after_change(&exec);
    }
}

/// A reviewer's decision as asked, before it is recorded.
struct Asked {
    id: ExecutionId,
    reviewer: String,
    choice: Choice,
    message: Option<String>,
    now: i64,
}

/// Records a decision on a held call with its audit step: a compare-and-set from
/// `held`, so of two reviewers one wins; an expired hold becomes `expired` instead.
fn record_decision(
    conn: &crate::store::Conn<'_>,
    redactor: &Redactor,
    asked: &Asked,
) -> crate::store::Result<Recorded> {
    let Some(exec) = store::get(conn, &asked.id)? else {
        return Ok(Recorded::Missing);
    };
    if exec.status != Status::Held {
        return Ok(Recorded::Already(exec.status));
    }
    if exec.expires_at_ms.is_some_and(|at| at <= asked.now) {
        expire_held(conn, redactor, &exec)?;
        return Ok(Recorded::Expired(exec));
    }
    let (to, event) = match asked.choice {
        Choice::Approve => (Status::Approved, AuditEvent::Approved),
        Choice::Deny => (Status::Denied, AuditEvent::Denied),
    };
    let message = asked.message.as_deref();
    store::record_decision(conn, &asked.id, to, &asked.reviewer, message, asked.now)?;
    let step = AuditRecord::new(event)
        .outcome(message)
        .reviewer(&asked.reviewer);
    executions::audit(conn, redactor, &exec, step)?;
    let decided = store::get(conn, &asked.id)?.unwrap_or(exec);
    if let Some(event) = trail::decided(&decided, redactor) {
        trail::enqueue(conn, &event, asked.now)?;
    }
    Ok(Recorded::Decided(decided))
}

/// Moves a held call whose ttl has passed to `expired` and writes its audit step, in
/// the caller's write transaction. A compare-and-set from `held`: whether this call
/// moved it (an expiry recorded meanwhile is not recorded twice).
fn expire_held(
    conn: &crate::store::Conn<'_>,
    redactor: &Redactor,
    exec: &Execution,
) -> crate::store::Result<bool> {
    if !store::transition(conn, &exec.id, Status::Held, Status::Expired)? {
        return Ok(false);
    }
    executions::audit(conn, redactor, exec, AuditRecord::new(AuditEvent::Expired))?;
    let now = exec.expires_at_ms.unwrap_or(exec.created_at_ms);
    trail::enqueue(conn, &trail::expired(exec), now)?;
    Ok(true)
}

/// Claims an approved call (`approved` to `running`) after deciding it again against
/// the current policy: `(exec, true)` to run it, `(exec, false)` when a `block` now
/// wins, `None` when it is not (or no longer) approved.
fn claim(
    conn: &crate::store::Conn<'_>,
    loaded: &LoadedPolicy,
    catalog: &crate::policy::Catalog,
    redactor: &Redactor,
    id: &str,
    now: i64,
    runner: &str,
) -> crate::store::Result<Option<(Execution, bool)>> {
    let Some(exec) = store::get(conn, id)? else {
        return Ok(None);
    };
    if exec.status != Status::Approved {
        return Ok(None);
    }
    let args: serde_json::Value = serde_json::from_str(&exec.args).unwrap_or_default();
    // The limits' real totals, as the gate's own decision reads them.
    let history = crate::gateway::SqlHistory(conn);
    let now_decision = loaded
        .policy
        .decide(&exec.tool, &args, catalog, &history, now);
    let recheck = AuditRecord::new(AuditEvent::Rechecked).policy_hash(&loaded.hash_hex);
    if now_decision.verdict == Verdict::Block {
        let reason = format!("blocked by the current policy: {}", now_decision.because);
        store::finish(conn, id, Status::Blocked, None, Some(&reason), now)?;
        executions::audit(
            conn,
            redactor,
            &exec,
            recheck.clone().outcome(Some(&reason)),
        )?;
        trail::enqueue(conn, &trail::blocked(&exec, &reason, redactor), now)?;
        return Ok(Some((exec, false)));
    }
    store::transition(conn, id, Status::Approved, Status::Running)?;
    store::set_runner(conn, &exec.id, runner)?;
    executions::audit(conn, redactor, &exec, recheck.outcome(Some("run")))?;
    Ok(Some((exec, true)))
}
