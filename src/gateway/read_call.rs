//! Reads in one durable commit.
//!
//! A call of catalog risk class `read` is decided on a read snapshot (no commit), run,
//! and then its execution row, its `requested` and `decided` audit rows and its outcome
//! (`ran` or `failed`) are written in one transaction, which the writer folds into one
//! group commit. The agent is answered only after that commit: a read the audit lacks is
//! a read nobody saw. If the commit fails the agent gets a 500 and no result.
//!
//! Only a read the snapshot plainly lets run takes this way. A read held or blocked by
//! the policy, one with an identical call pending, one whose rule reserves limit amounts,
//! or one completion forces to hold goes back to the write path ([`Gate::call`]'s
//! `decide`), which decides it durably in the writer before anything runs, as it does
//! for every write. [`judge`] is the decision itself, shared by both ways.

use std::time::Instant;

use serde_json::Value;

use super::gate::{CallReply, Gate, LoadedPolicy, SqlHistory, refused, write_outcome};
use crate::approvals::store::{self as exec_store, Execution, Status};
use crate::audit::AuditEvent;
use crate::policy::{Catalog, Evidence, LimitCharge, Verdict};
use crate::session::SessionScope;
use crate::store::StoreError;

/// A call's frozen request, ready to decide: what its execution row records.
pub(super) struct Framed {
    pub tool: String,
    pub args: Value,
    pub canonical: String,
    pub account: String,
    pub binding_hash: String,
    pub diagnosis: Option<String>,
    pub evidence: Evidence,
}

/// What the policy (and the "another call to this tool is held" rule) says of a call.
pub(super) struct Judged {
    pub verdict: Verdict,
    pub because: String,
    pub rule_line: Option<i64>,
    /// Limit amounts to reserve if the call runs.
    pub charges: Vec<LimitCharge>,
}

/// Decides a call on `conn` (the writer's transaction, or a read snapshot): the policy
/// with limit totals from `limit_charges`, then a forced hold or an earlier held call to
/// the same tool turns a `run` into a hold.
#[allow(clippy::too_many_arguments)]
pub(super) fn judge(
    conn: &rusqlite::Connection,
    loaded: &LoadedPolicy,
    catalog: &Catalog,
    scope: &SessionScope,
    tool: &str,
    args: &Value,
    now: i64,
    evidence: &Evidence,
    forced_hold: Option<String>,
) -> rusqlite::Result<Judged> {
    let decision =
        loaded
            .policy
            .decide_with_evidence(tool, args, catalog, &SqlHistory(conn), now, evidence);
    let mut verdict = decision.verdict;
    let mut because = decision.because.to_string();
    for check in &decision.evidence {
        because.push_str(&format!("; evidence {check}"));
    }
    let mut rule_line = decision.rule_line.map(i64::from);
    if verdict == Verdict::Run {
        let earlier = exec_store::held_for_tool(conn, &scope.session_id, tool, now)?;
        let reason = forced_hold.or_else(|| {
            earlier.map(|id| format!("another {tool} call ({id}) is waiting for a person"))
        });
        if let Some(reason) = reason {
            verdict = Verdict::Hold;
            because = reason;
            rule_line = None;
        }
    }
    Ok(Judged {
        verdict,
        because,
        rule_line,
        charges: decision.charges,
    })
}

/// What the snapshot decided of a read.
pub(super) enum ReadDecision {
    /// It runs: the execution (status `running`), not yet written anywhere.
    Run(Box<Execution>),
    /// The write path decides it; the call is handed back.
    Undecided(Framed),
}

impl Gate {
    /// Decides a read on a snapshot, writing nothing. The snapshot is read on the
    /// calling thread: a few indexed lookups, cheaper than a trip to the blocking pool.
    pub(super) async fn decide_read(
        &self,
        scope: &SessionScope,
        call: Framed,
    ) -> Result<ReadDecision, StoreError> {
        let loaded = self.current_policy();
        let catalog = self.catalog.clone();
        let now = self.now();
        let scope = scope.clone();
        self.db.read_blocking(move |conn| {
            if exec_store::pending_binding(conn, &scope.session_id, &call.binding_hash, now)?
                .is_some()
            {
                return Ok(ReadDecision::Undecided(call));
            }
            let judged = judge(
                conn,
                &loaded,
                &catalog,
                &scope,
                &call.tool,
                &call.args,
                now,
                &call.evidence,
                None,
            )?;
            if judged.verdict != Verdict::Run || !judged.charges.is_empty() {
                return Ok(ReadDecision::Undecided(call));
            }
            Ok(ReadDecision::Run(Box::new(running(
                &scope,
                call,
                judged,
                &loaded.hash_hex,
                now,
            ))))
        })
    }

    /// Runs a read decided on a snapshot, then commits its execution row, decision and
    /// outcome in one transaction, and answers only once that is on disk.
    pub(super) async fn run_read(&self, exec: Box<Execution>, started: Instant) -> CallReply {
        let ran = self.run_decided(&exec).await;
        let redactor = self.current_redactor();
        let now = self.now();
        let duration = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let id = exec.id.clone();
        let record = ran.record;
        let written = self
            .db
            .write(move |conn| {
                exec_store::insert(conn, &exec)?;
                for event in [AuditEvent::Requested, AuditEvent::Decided] {
                    super::audit_log::record(conn, &redactor, &exec, event, None, None, None)?;
                }
                write_outcome(conn, &redactor, &exec, &record, duration, now)
            })
            .await;
        match written {
            Ok(()) => {
                self.notify(&id);
                ran.reply
            }
            Err(e) => {
                // INVARIANT: the result is dropped; the agent never sees a read the audit
                // does not hold.
                tracing::error!(error = %e, execution_id = %id, "cannot record a read");
                refused(500, "internal", "internal error".into())
            }
        }
    }
}

/// The execution row of a call decided `run`, before it is written.
fn running(
    scope: &SessionScope,
    call: Framed,
    judged: Judged,
    policy_hash: &str,
    now: i64,
) -> Execution {
    Execution {
        id: super::gate::new_execution_id(),
        session_id: scope.session_id.clone(),
        thread_id: scope.thread_id.clone(),
        agent: scope.agent.clone(),
        tool: call.tool,
        args: call.canonical,
        account: call.account,
        binding_hash: call.binding_hash,
        diagnosis: call.diagnosis,
        verdict: Verdict::Run.as_str().to_owned(),
        because: judged.because,
        rule_line: judged.rule_line,
        policy_hash: policy_hash.to_owned(),
        status: Status::Running,
        summary: None,
        expires_at_ms: None,
        reviewer: None,
        decision_message: None,
        decided_at_ms: None,
        result: None,
        error: None,
        attempts: 0,
        created_at_ms: now,
        finished_at_ms: None,
    }
}
