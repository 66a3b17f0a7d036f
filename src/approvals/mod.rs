//! Approvals: a person's decision on a held call, and running an approved call exactly
//! once.
//!
//! A held call's row is frozen when it is held. Deciding it is a compare-and-set from
//! `held` (two reviewers at once: one wins, the other is told it was already decided);
//! running it is a second compare-and-set from `approved` to `running`, so a retried
//! request, a second reviewer or a restart can never send it twice. Stripe also gets an
//! idempotency key derived from the execution id; a call to a provider without one whose
//! outcome is unknown after a crash is marked `needs_check` for a person, never re-sent
//! (a read, which changes nothing at the provider, is sent again).
//!
//! With several instances on one database, the instance that records the approval runs
//! it at once; any instance may (credentials and connectors are the same on each, and
//! the claim is what makes it run once). Every instance's periodic [`Approvals::sweep`]
//! claims an approved call no one claimed within the grace time (its decider died
//! between approve and claim) and takes over, in one conditional statement, a running
//! call whose runner's heartbeat went stale (it died while sending), then re-sends or
//! marks it exactly as a start's recovery does. The result reaches the waiting agent
//! through the database: its wait, on the instance running its session, reads the call
//! again at least every [`crate::gateway::wait::RELOAD_EVERY`].

pub mod http;
pub mod narrow;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::audit::{AuditEvent, AuditRecord};
use crate::executions::{self, Execution, Status, store, trail};
use crate::gateway::gate::Resend;
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
    /// The calls this instance is running or recovering now (by id), so a sweep does
    /// not start a second task for a call whose first task is still at work here.
    in_flight: Arc<Mutex<HashSet<String>>>,
    /// This instance's `running` calls the last sweep found neither sent here nor
    /// worked on: one found so again by the next sweep lost its outcome
    /// ([`Approvals::lost_here`]).
    suspects: Arc<Mutex<HashSet<String>>>,
}

/// How the periodic sweep decides that a call was left behind ([`Approvals::sweep`]).
#[derive(Debug, Clone, Copy)]
pub struct SweepTimes {
    /// An approved call not claimed this long after its decision is claimed by any
    /// instance (its decider claims it within milliseconds when alive).
    pub grace: Duration,
    /// An instance whose heartbeat is older than this is dead (the instance registry's
    /// window: `sessions.lease_time`); its running calls are taken over.
    pub alive_within: Duration,
}

/// What an earlier run of threadgate left to recover ([`Approvals::leftovers`]).
#[derive(Debug, Default)]
pub struct Leftovers {
    approved: Vec<Execution>,
    running: Vec<store::RunningCall>,
    /// The liveness bound the running calls were read with (taking one over checks it
    /// again).
    alive_after_ms: i64,
}

/// What one sweep started: approved calls claimed and running calls taken over.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub approved: usize,
    pub taken_over: usize,
    /// This instance's own calls found `running` though nothing here sends them.
    pub lost_here: usize,
}

/// A call this instance works on, marked in [`Approvals::in_flight`] until dropped.
struct Working {
    set: Arc<Mutex<HashSet<String>>>,
    id: String,
}

impl Drop for Working {
    fn drop(&mut self) {
        lock(&self.set).remove(&self.id);
    }
}

fn lock(set: &Mutex<HashSet<String>>) -> std::sync::MutexGuard<'_, HashSet<String>> {
    set.lock().unwrap_or_else(|p| p.into_inner())
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
        Approvals {
            gate,
            tasks,
            in_flight: Arc::default(),
            suspects: Arc::default(),
        }
    }

    /// Marks `id` as worked on here; `None` when a task of this instance already is.
    fn working(&self, id: &str) -> Option<Working> {
        lock(&self.in_flight)
            .insert(id.to_owned())
            .then(|| Working {
                set: self.in_flight.clone(),
                id: id.to_owned(),
            })
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
                    let _ = self.spawn_run(&exec.id);
                }
                self.after_change(&exec);
                Ok(exec)
            }
        }
    }

    /// Runs an approved call off the reviewer's request, in the application's tasks
    /// (shutdown waits for it; a run cut at the deadline is recovered at the next start).
    /// Does nothing when a task of this instance already runs it.
    fn spawn_run(&self, id: &ExecutionId) -> bool {
        let Some(working) = self.working(id) else {
            return false;
        };
        let (me, id) = (self.clone(), id.clone());
        self.tasks.spawn(async move {
            me.run_approved(&id).await;
            drop(working);
        });
        true
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
        Ok(Leftovers {
            approved,
            running,
            alive_after_ms,
        })
    }

    /// After a restart: runs approved calls that had not run, re-sends calls whose
    /// outcome is unknown where that is safe (a read, or a provider that deduplicates by
    /// idempotency key: [`crate::gateway::gate::Gate::may_resend`]), and marks the others
    /// for a person to check. A running call is first taken over
    /// ([`store::take_over`]): another instance's sweep may be recovering the same dead
    /// instance's call, and only the one that takes it re-sends it.
    pub async fn recover(&self, left: Leftovers) {
        for exec in left.approved {
            tracing::info!(execution = %exec.id, "running an approved call left by a restart");
            self.run_approved(&exec.id).await;
        }
        for call in left.running {
            let Some(exec) = self.take_over(call, left.alive_after_ms).await else {
                continue;
            };
            self.resend_or_mark(exec, "after a restart").await;
        }
    }

    /// One pass of the periodic sweep every instance runs (beside the expiry of held
    /// calls): approved calls no instance claimed within `times.grace` of their decision
    /// are run here (the claim, `approved` to `running`, is the one compare-and-set, so
    /// of the instances sweeping at once one runs each), and running calls whose runner's
    /// heartbeat is older than `times.alive_within` are taken over (one conditional
    /// statement names the dead runner, so one instance wins) and re-sent where that is
    /// safe (a read, or a provider that deduplicates by idempotency key), else marked
    /// `needs_check`. A call a live
    /// instance is sending is never touched. The runs go on in the application's tasks;
    /// what was started is returned.
    pub async fn sweep(&self, times: SweepTimes) -> Swept {
        let now = self.gate.now();
        let db = self.gate.db();
        let decided_before = now.saturating_sub(crate::clock::ms(times.grace));
        let alive_after = now.saturating_sub(crate::clock::ms(times.alive_within));
        let me = self.gate.runner();
        let found = db
            .read(move |c| {
                let approved = store::unclaimed_approved(c, decided_before)?;
                let running = store::orphaned_running(c, &me, alive_after)?;
                let own = store::own_running(c, &me)?;
                Ok((approved, running, own))
            })
            .await;
        let (approved, running, own) = match found {
            Ok(found) => found,
            Err(e) => {
                // Nothing is lost: the next pass finds the same calls.
                tracing::error!(error = %e, "cannot read the calls left behind; retried next pass");
                return Swept::default();
            }
        };
        let mut swept = Swept::default();
        for exec in approved {
            if self.spawn_run(&exec.id) {
                tracing::info!(execution = %exec.id, "running an approved call no instance claimed");
                swept.approved += 1;
            }
        }
        for call in running {
            let Some(working) = self.working(&call.execution.id) else {
                continue;
            };
            let Some(exec) = self.take_over(call, alive_after).await else {
                continue;
            };
            swept.taken_over += 1;
            let me = self.clone();
            self.tasks.spawn(async move {
                me.resend_or_mark(exec, "after its instance died").await;
                drop(working);
            });
        }
        for exec in self.lost_here(own) {
            let Some(working) = self.working(&exec.id) else {
                continue;
            };
            let me = Some(self.gate.runner().to_string());
            let call = store::RunningCall {
                execution: exec,
                runner: me,
            };
            // Still running and still this instance's, in one conditional statement.
            let Some(exec) = self.take_over(call, alive_after).await else {
                continue;
            };
            swept.lost_here += 1;
            let me = self.clone();
            self.tasks.spawn(async move {
                me.resend_or_mark(exec, "after its outcome was lost while this instance ran")
                    .await;
                drop(working);
            });
        }
        swept
    }

    /// Of `own` (this instance's `running` calls, as just read), those whose outcome
    /// was lost: nothing here sends them ([`Gate::is_sending`]) nor works on them, and
    /// the previous sweep found the same. Two sweeps, a second or more apart: a call
    /// is marked as sent just after the commit that makes it `running` (its decision,
    /// an approval's claim), and one pass could fall between the two. Lost so: an
    /// unflushed outcome a database server's crash took back, an outcome that could not
    /// be written, a call cut at the shutdown deadline.
    fn lost_here(&self, own: Vec<Execution>) -> Vec<Execution> {
        let unsent: Vec<Execution> = {
            let working = lock(&self.in_flight);
            own.into_iter()
                .filter(|e| !self.gate.is_sending(&e.id) && !working.contains(e.id.as_str()))
                .collect()
        };
        let mut suspects = lock(&self.suspects);
        let lost = unsent
            .iter()
            .filter(|e| suspects.contains(e.id.as_str()))
            .cloned()
            .collect();
        *suspects = unsent.iter().map(|e| e.id.to_string()).collect();
        lost
    }

    /// Takes a running call left behind over for this instance; `None` when another
    /// instance took it first, it finished meanwhile, or its runner is alive again.
    async fn take_over(&self, call: store::RunningCall, alive_after_ms: i64) -> Option<Execution> {
        let me = self.gate.runner();
        let id = call.execution.id.clone();
        let seen = call.runner.clone();
        let taken = self
            .gate
            .db()
            .write(move |c| store::take_over(c, &id, seen.as_deref(), &me, alive_after_ms))
            .await;
        match taken {
            Ok(true) => Some(call.execution),
            Ok(false) => None,
            Err(e) => {
                tracing::error!(execution = %call.execution.id, error = %e, "cannot take over a running call; retried later");
                None
            }
        }
    }

    /// A running call whose outcome was lost: re-sent if it is a read or its provider
    /// deduplicates by idempotency key, else marked for a person to check.
    async fn resend_or_mark(&self, exec: Execution, why: &'static str) {
        let reason = match self.gate.may_resend(&exec, self.gate.now()) {
            Resend::Yes => {
                tracing::info!(execution = %exec.id, why, "re-sending a read, or a call with its idempotency key");
                self.gate.execute(exec.clone(), Instant::now()).await;
                self.after_change(&exec);
                return;
            }
            Resend::NoKey => {
                "threadgate stopped while this call was in flight; the provider has no idempotency key, so it was not re-sent: check the provider"
            }
            Resend::KeyExpired => {
                "threadgate stopped while this call was in flight and its idempotency key may have expired at the provider (decided more than 23 hours ago), so it was not re-sent: check the provider"
            }
        };
        self.mark_needs_check(exec, reason).await;
    }

    async fn mark_needs_check(&self, exec: Execution, reason: &'static str) {
        let now = self.gate.now();
        let redactor = self.gate.current_redactor();
        let e = exec.clone();
        let me = self.gate.runner();
        let written = self
            .gate
            .db()
            .write(move |conn| {
                // Only while it is still running and still ours: a runner thought dead
                // that recorded its real outcome meanwhile is not overwritten.
                if !store::mark_needs_check(conn, &e.id, &me, reason, now)? {
                    return Ok(());
                }
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
        if !store::block_approved(conn, id, &reason, now)? {
            return Ok(None);
        }
        executions::audit(
            conn,
            redactor,
            &exec,
            recheck.clone().outcome(Some(&reason)),
        )?;
        trail::enqueue(conn, &trail::blocked(&exec, &reason, redactor), now)?;
        return Ok(Some((exec, false)));
    }
    // The one compare-and-set that makes it run once, with its runner.
    if !store::claim_approved(conn, id, runner)? {
        return Ok(None);
    }
    executions::audit(conn, redactor, &exec, recheck.outcome(Some("run")))?;
    Ok(Some((exec, true)))
}
