//! Reads with their durable commit beside the provider's answer.
//!
//! A call of catalog risk class `read` is decided on a read snapshot (no commit), then
//! sent while its decision (its execution row, `running`, with its `requested` and
//! `decided` audit rows) is committed: one durable group commit, in flight at the same
//! time as the request to the provider. The agent is answered only once both are done:
//! a read the audit lacks is a read nobody saw, so if the commit fails (or the lease's
//! fence refuses it) the agent gets an error and no result. The outcome (`ran` or
//! `failed`, the row's final status) is written after the answer, by a task of its
//! own, without waiting for the log's flush ([`super::slots`]: at most a few per
//! session and a bound in all; a read past them writes its outcome before answering).
//! The decision it follows is on disk, and an outcome lost to a crash of the machine,
//! the process or the database server leaves the row `running`, which recovery
//! re-sends (the read is idempotent), as for any call cut off mid-flight. A read sent
//! whose decision never committed (the process died in between) changed nothing at the
//! provider and reached nobody.
//!
//! In a session that has never had a hold ([`super::holds`]) there is nothing pending
//! to find, so the policy alone decides, without a database read; otherwise the
//! snapshot is asked. Only a read the snapshot plainly lets run takes this way. A read
//! held or blocked by the policy, one with an identical call pending, one whose rule
//! reserves limit amounts, or one completion forces to hold goes back to the write path
//! ([`Gate::call`]'s `decide`), which decides it durably in the writer before anything
//! runs, as it does for every write. [`verdict`] is the decision itself, shared by both
//! ways.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tracing::Instrument as _;

use super::decide::{Context, frozen, policy_verdict, verdict};
use super::gate::{CallReply, Gate};
use super::outcome::{OutcomeCommit, write_sent_read};
use super::prepare::PreparedCall;
use super::refusal::Refusal;
use crate::executions::{Execution, store as exec_store};
use crate::policy::{LimitHistory, Verdict};
use crate::session::SessionScope;
use crate::store::StoreError;
use crate::store::leases;

/// What the snapshot decided of a read.
pub(super) enum ReadDecision {
    /// It runs: the execution (status `running`), not yet written anywhere.
    Run(Box<Execution>),
    /// The write path decides it; the call is handed back.
    Undecided(PreparedCall),
}

/// A limit history that answers nothing: a rule that asks for totals sends the read to
/// the write path, which reads them in its transaction.
#[derive(Default)]
struct Unasked(AtomicBool);

impl Unasked {
    fn asked(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl LimitHistory for Unasked {
    fn total(&self, _key: &str, _since_unix_ms: i64) -> u128 {
        self.0.store(true, Ordering::Relaxed);
        // Counted as exhausted, as an unreadable history is; the answer is not used.
        u128::MAX
    }
}

impl Gate {
    /// Decides a read on a snapshot, writing nothing. The snapshot is read on the
    /// calling thread: a few indexed lookups, cheaper than a trip to the blocking pool.
    pub(super) async fn decide_read(
        &self,
        scope: &SessionScope,
        call: PreparedCall,
    ) -> Result<ReadDecision, StoreError> {
        let cx = Context::of(self, scope);
        let judged = if self.holds.may_have(&scope.session_id) {
            let judged = self.db.read_inline(|conn| {
                let pending = exec_store::has_pending_binding(
                    conn,
                    &cx.scope.session_id,
                    &call.binding_hash,
                    cx.now,
                )?;
                if pending {
                    return Ok(None);
                }
                verdict(conn, &cx, &call).map(Some)
            })?;
            match judged {
                Some(judged) => judged,
                None => return Ok(ReadDecision::Undecided(call)),
            }
        } else {
            // Nothing of this session waits for a person: no identical call pending and
            // no held call to the tool, so only the policy decides, without the database
            // unless a rule asks for limit totals (then the write path decides).
            let history = Unasked::default();
            let judged = policy_verdict(&cx, &call, &history);
            if history.asked() || call.forced_hold.is_some() {
                return Ok(ReadDecision::Undecided(call));
            }
            judged
        };
        if judged.verdict != Verdict::Run || !judged.charges.is_empty() {
            return Ok(ReadDecision::Undecided(call));
        }
        let exec = frozen(&cx, call, &judged, String::new());
        Ok(ReadDecision::Run(Box::new(exec)))
    }

    /// Runs a read decided on a snapshot while its decision (the row, `running`, and
    /// its requested and decided steps) is committed, and answers once both are done:
    /// the read's result reaches the agent only after its decision is on disk. The
    /// commit carries the session's lease: once another instance has taken the thread
    /// over it is refused, nothing is written and the result is dropped (the read itself
    /// was sent: a read changes nothing at the provider). Its outcome is then written
    /// without waiting for the log's flush ([`OutcomeCommit::Unflushed`]), after the
    /// answer while the session has a trailing slot free.
    pub(super) async fn run_read(
        &self,
        scope: &SessionScope,
        exec: Box<Execution>,
        started: Instant,
    ) -> CallReply {
        // In flight here from before its row exists until its outcome is written.
        let in_flight = self.sending.start(&exec.id);
        let (lease, redactor, runner) =
            (scope.lease.clone(), self.current_redactor(), self.runner());
        let row = exec.clone();
        let decision = self
            .db
            .write_single(move |conn| write_sent_read(conn, &redactor, &lease, &row, &runner))
            .instrument(tracing::trace_span!("gate.record_read"));
        let (recorded, ran) = tokio::join!(decision, self.run_decided(&exec));
        match recorded {
            Ok(()) => {}
            Err(e) if leases::is_lost(&e) => {
                // INVARIANT: as below, the result is dropped: the thread's new owner
                // holds no record of this read, so the agent never sees it.
                self.lease_refused(&scope.lease);
                return CallReply::Refused(Refusal::SessionMoved);
            }
            Err(e) => {
                // INVARIANT: the result is dropped; the agent never sees a read the audit
                // does not hold.
                tracing::error!(error = %e, execution_id = %exec.id, "cannot record a read");
                return CallReply::Refused(Refusal::Internal);
            }
        }
        // The audit holds the read: the answer goes out even if its outcome cannot be
        // written (the row stays `running`, and recovery re-sends or marks it), and
        // without waiting for it while the session and the instance have a slot free
        // (`trailing`); otherwise once it is written, as every other call's.
        let write = self.record_outcome(&exec, ran.record, started, OutcomeCommit::Unflushed);
        let (changes, id) = (self.changes_sender(), exec.id.clone());
        let recorded = async move {
            write.await;
            drop(in_flight);
            let _ = changes.send(id);
        };
        match self.trailing.take(&scope.session_id) {
            Some(slot) => {
                self.tasks.spawn(crate::store::counts::carried(async move {
                    recorded.await;
                    drop(slot);
                }));
            }
            None => recorded.await,
        }
        ran.reply
    }
}
