//! The second and third steps of a call: the verdict and its record, in one write
//! transaction. A replay of a succeeded binding or an identical pending call is found
//! first; otherwise the policy decides (limit totals read from `limit_charges`, in the
//! same transaction), a run becomes a hold while another call to the tool waits for a
//! person, and the execution row, its limit charges, its audit steps and, for a hold,
//! the note are written together. A hold past the session's `max_pending_holds` is
//! refused instead, and the session's stop note queued in the same transaction.

use std::sync::Arc;

use crate::store::Conn;

use super::gate::{Gate, LoadedPolicy};
use super::prepare::PreparedCall;
use crate::audit::{AuditEvent, AuditRecord};
use crate::executions::{self, Execution, Status, redact_args, store as exec_store, trail};
use crate::notes::stop::StopNote;
use crate::policy::{Catalog, LimitCharge, LimitHistory, Verdict};
use crate::secrets::Redactor;
use crate::session::SessionScope;
use crate::store::leases;

/// What the deciding transaction found.
pub(super) enum Decided {
    Run(Execution),
    Held(Execution),
    Blocked(Execution),
    Replay(Execution),
    Pending(Execution),
    /// A write whose identical twin in the session is still being sent, or in doubt
    /// (`needs_check`): it is not sent again; it waits for the twin's outcome and is
    /// answered from it (`run`'s `await_twin`).
    InFlight(Execution),
    /// Would be held while `limit` calls of the session already wait for a person:
    /// refused, nothing of it recorded, and the session's stop note queued (`first`:
    /// by this call).
    TooManyHolds {
        limit: usize,
        first: bool,
    },
}

/// Limits read from the charges table inside the deciding transaction (and inside the
/// approvals' re-decisions, which must count the same totals).
pub(crate) struct SqlHistory<'c, 'a>(pub(crate) &'c Conn<'a>);

impl LimitHistory for SqlHistory<'_, '_> {
    fn total(&self, key: &str, since_unix_ms: i64) -> u128 {
        match exec_store::charged_total(self.0, key, since_unix_ms) {
            Ok(total) => u128::try_from(total).unwrap_or(0),
            // INVARIANT: an unreadable history counts as exhausted, so a limited
            // always_run rule does not match and the call falls through (fails closed).
            Err(_) => u128::MAX,
        }
    }
}

/// The verdict on a prepared call, before it is written.
pub(super) struct Verdicted {
    pub verdict: Verdict,
    pub because: String,
    pub rule_line: Option<i64>,
    pub charges: Vec<LimitCharge>,
}

/// What the deciding transaction reads besides the call.
pub(super) struct Context {
    pub loaded: Arc<LoadedPolicy>,
    pub catalog: Catalog,
    pub redactor: Arc<Redactor>,
    pub scope: SessionScope,
    pub now: i64,
    /// The approval link without the execution id.
    pub url_prefix: String,
    /// This instance: the runner of a call decided `run`.
    pub runner: Arc<str>,
}

impl Context {
    /// What the gate holds now, for a call of `scope`.
    pub(super) fn of(gate: &Gate, scope: &SessionScope) -> Context {
        Context {
            loaded: gate.current_policy(),
            catalog: gate.catalog().clone(),
            redactor: gate.current_redactor(),
            scope: scope.clone(),
            now: gate.now(),
            url_prefix: gate.approval_url(""),
            runner: gate.runner(),
        }
    }
}

impl Gate {
    /// Decides a prepared call and records the decision, in one write transaction.
    pub(super) async fn decide(
        &self,
        scope: &SessionScope,
        call: PreparedCall,
    ) -> Result<Decided, crate::store::StoreError> {
        let cx = Context::of(self, scope);
        let holds = self.holds.clone();
        let max_holds = self.max_pending_holds;
        self.db
            .write_locking(move |conn| {
                // Refused (and nothing below written) once another instance has taken
                // the session's thread over; the thread's lease row stays locked to the
                // end, so the session's other deciding writes, and any takeover, wait
                // for this one (what is read below is the thread's own, or a limit
                // total read under its key's lock).
                leases::fence_exclusive(conn, &cx.scope.lease)?;
                // The session's earlier calls that bear on this one, in one statement. A
                // read in a session with no hold mark has none: what it could find is a
                // pending twin or a held call to its tool, and a hold marks its session
                // before it commits, in a transaction the lease row's lock orders before
                // this one (`holds`). A write always asks: a succeeded twin is replayed.
                let earlier = if call.is_write || holds.may_have(&cx.scope.session_id) {
                    exec_store::earlier_calls(
                        conn,
                        &cx.scope.session_id,
                        &call.binding_hash,
                        &call.tool,
                        cx.now,
                    )?
                } else {
                    exec_store::EarlierCalls::default()
                };
                if call.is_write
                    && let Some(done) = earlier.succeeded
                {
                    return Ok(Decided::Replay(done));
                }
                // The same write still being sent (an agent that retried while the first
                // was on its way, or whose first outcome was lost) or whose outcome a
                // person must check: sending it again would be a second refund under a
                // key of its own.
                if call.is_write
                    && let Some(twin) = earlier.unsettled
                {
                    return Ok(Decided::InFlight(twin));
                }
                if let Some(pending) = earlier.pending {
                    return Ok(Decided::Pending(pending));
                }
                let verdicted = held_verdict(
                    policy_verdict(&cx, &call, &SqlHistory(conn)),
                    &call,
                    earlier.held_for_tool,
                );
                if verdicted.verdict == Verdict::Hold {
                    if let Some(over) = too_many_holds(conn, &cx, max_holds)? {
                        return Ok(over);
                    }
                    // Before the commit, so a read never misses a hold it could see.
                    holds.mark(&cx.scope.session_id);
                }
                record(conn, &cx, call.clone(), verdicted)
            })
            .await
    }
}

/// When `limit` (not 0) calls of the session already wait for a person, the refusal of
/// one more, with the session's stop note queued in this transaction (once).
fn too_many_holds(
    conn: &Conn<'_>,
    cx: &Context,
    limit: usize,
) -> crate::store::Result<Option<Decided>> {
    if limit == 0 || exec_store::held_count(conn, &cx.scope.session_id, cx.now)? < limit {
        return Ok(None);
    }
    let note = StopNote::too_many_holds(limit);
    let first = crate::notes::stop::queue(conn, &cx.scope, &note, cx.now, &cx.redactor)?;
    Ok(Some(Decided::TooManyHolds { limit, first }))
}

/// The policy's verdict, made a hold when completion forced one or another call to the
/// same tool is held in the session.
pub(super) fn verdict(
    conn: &Conn<'_>,
    cx: &Context,
    call: &PreparedCall,
) -> crate::store::Result<Verdicted> {
    let out = policy_verdict(cx, call, &SqlHistory(conn));
    if out.verdict != Verdict::Run {
        return Ok(out);
    }
    let held = exec_store::held_for_tool(conn, &cx.scope.session_id, &call.tool, cx.now)?;
    Ok(held_verdict(out, call, held))
}

/// `out` made a hold when it runs but completion forced a hold or `held_for_tool` (the
/// session's call to the same tool waiting for a person) is set.
fn held_verdict(
    mut out: Verdicted,
    call: &PreparedCall,
    held_for_tool: Option<String>,
) -> Verdicted {
    if out.verdict != Verdict::Run {
        return out;
    }
    let reason = call.forced_hold.clone().or_else(|| {
        held_for_tool.map(|id| format!("another {} call ({id}) is waiting for a person", call.tool))
    });
    if let Some(reason) = reason {
        out.verdict = Verdict::Hold;
        out.because = reason;
        out.rule_line = None;
    }
    out
}

/// The policy's verdict alone, with limit totals from `history` (no hold of the session
/// taken into account).
pub(super) fn policy_verdict(
    cx: &Context,
    call: &PreparedCall,
    history: &dyn LimitHistory,
) -> Verdicted {
    let decision = cx.loaded.policy.decide_with_evidence(
        &call.tool,
        &call.args,
        &cx.catalog,
        history,
        cx.now,
        &call.evidence,
    );
    let mut because = decision.because.to_string();
    for check in &decision.evidence {
        because.push_str(&format!("; evidence {check}"));
    }
    Verdicted {
        verdict: decision.verdict,
        because,
        rule_line: decision.rule_line.map(i64::from),
        charges: decision.charges,
    }
}

/// Writes the execution frozen as decided, its charges, its audit steps and, for a
/// hold, the note for people.
fn record(
    conn: &Conn<'_>,
    cx: &Context,
    call: PreparedCall,
    v: Verdicted,
) -> crate::store::Result<Decided> {
    let redacted = redact_args(&cx.redactor, &call.args);
    let rule_text = match v.rule_line {
        Some(line) => format!("{} ({}:{line})", v.because, cx.loaded.name),
        None => v.because.clone(),
    };
    let summary = super::summary::held_summary(&call.tool, &redacted, &rule_text);
    let is_write = call.is_write;
    let exec = frozen(cx, call, &v, summary);
    // A call decided `run` is written with its runner: recovery knows whose it is.
    let runner = (exec.status == Status::Running).then_some(&*cx.runner);
    let (event, charges) = match v.verdict {
        Verdict::Run => {
            let charges: Vec<(String, i64)> = v
                .charges
                .iter()
                .map(|c| (c.key.clone(), i64::try_from(c.amount).unwrap_or(i64::MAX)))
                .collect();
            (AuditEvent::Decided, charges)
        }
        Verdict::Hold => (AuditEvent::Held, Vec::new()),
        Verdict::Block => (AuditEvent::Blocked, Vec::new()),
    };
    if v.verdict == Verdict::Run && !is_write {
        // A read is answered only after its outcome's synchronous commit, which flushes
        // this one too: a crash before it loses a read nobody was given, with its
        // reservation. Asked before the row's statement, which carries it on Postgres.
        conn.commit_unflushed()?;
    }
    // The row, its charges and both steps at once (one statement on Postgres).
    let steps = vec![
        AuditRecord::new(AuditEvent::Requested),
        AuditRecord::new(event),
    ];
    executions::audit::insert_decided(
        conn,
        &cx.redactor,
        (&exec, runner),
        (&charges, cx.now),
        steps,
    )?;
    match v.verdict {
        Verdict::Run => Ok(Decided::Run(exec)),
        Verdict::Hold => {
            let url = format!("{}{}", cx.url_prefix, exec.id);
            let note =
                crate::notes::held::held_note(&exec, &redacted, &rule_text, &url, &cx.redactor);
            exec_store::enqueue_note(conn, &note, cx.now)?;
            trail::enqueue(conn, &trail::held(&exec, &url), cx.now)?;
            Ok(Decided::Held(exec))
        }
        Verdict::Block => Ok(Decided::Blocked(exec)),
    }
}

/// The execution row of a decided call.
pub(super) fn frozen(
    cx: &Context,
    call: PreparedCall,
    v: &Verdicted,
    summary: String,
) -> Execution {
    let ttl_ms = crate::clock::ms(cx.loaded.policy.approval_ttl());
    let (status, expires) = match v.verdict {
        Verdict::Run => (Status::Running, None),
        Verdict::Hold => (Status::Held, Some(cx.now.saturating_add(ttl_ms))),
        Verdict::Block => (Status::Blocked, None),
    };
    Execution {
        id: crate::ids::ExecutionId::random(),
        session_id: cx.scope.session_id.clone(),
        thread_id: cx.scope.thread_id.clone(),
        agent: cx.scope.agent.clone(),
        tool: call.tool,
        args: call.canonical,
        account: call.account,
        binding_hash: call.binding_hash,
        diagnosis: call.diagnosis,
        verdict: v.verdict.as_str().to_owned(),
        because: v.because.clone(),
        rule_line: v.rule_line,
        policy_hash: cx.loaded.hash_hex.clone(),
        status,
        summary: (v.verdict == Verdict::Hold).then_some(summary),
        expires_at_ms: expires,
        reviewer: None,
        decision_message: None,
        decided_at_ms: None,
        result: None,
        error: None,
        attempts: 0,
        created_at_ms: cx.now,
        finished_at_ms: None,
    }
}
