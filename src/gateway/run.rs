//! A call from end to end: [`Gate::call`] prepares it, decides and records it, then
//! runs it through its connector ([`Gate::execute`], also what an approval runs) and
//! records the outcome with its audit step.

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::Instrument as _;

use super::decide::Decided;
use super::gate::{CallReply, CallRequest, Gate};
use super::outcome::{Outcome, OutcomeCommit, Ran, outcome_is_one_write, write_outcome};
use super::read_call::ReadDecision;
use super::refusal::Refusal;
use super::scope;
use super::wait::{ExecutionWatch, Unreported};
use crate::connectors::{CallContext, Connector, ConnectorError};
use crate::executions::{Execution, Status};
use crate::secrets::Redactor;
use crate::session::SessionScope;
use crate::store::leases;

impl Gate {
    /// Decides and, when allowed, runs one call of a session: prepares it (the checks
    /// before the policy), decides and records it in one transaction, then runs it,
    /// or answers that it is held or blocked.
    #[tracing::instrument(name = "gate", skip_all, fields(thread_id = %scope.thread_id, session_id = %scope.session_id))]
    pub async fn call(&self, scope: &SessionScope, req: CallRequest) -> CallReply {
        // The secrets' generation read before the checks serves the call's provider
        // requests too (`secrets::call_generation`).
        crate::secrets::call_generation::within(self.call_within(scope, req)).await
    }

    async fn call_within(&self, scope: &SessionScope, req: CallRequest) -> CallReply {
        let started = Instant::now();
        // The `gate.*` spans (trace level, off in production) time a call's phases for
        // `benches/gateway_call.rs`.
        let prepare = self.prepare(scope, req);
        let mut prepared = match prepare
            .instrument(tracing::trace_span!("gate.prepare"))
            .await
        {
            Ok(p) => p,
            Err(refusal) => return CallReply::Refused(refusal),
        };
        if !prepared.is_write && prepared.forced_hold.is_none() {
            // A read is sent while its decision commits (see `read_call`).
            let decide_read = self.decide_read(scope, prepared);
            match decide_read
                .instrument(tracing::trace_span!("gate.decide_read"))
                .await
            {
                Ok(ReadDecision::Run(exec)) => return self.run_read(scope, exec, started).await,
                Ok(ReadDecision::Undecided(back)) => prepared = back,
                Err(e) => {
                    tracing::error!(error = %e, "cannot decide a read");
                    return CallReply::Refused(Refusal::Internal);
                }
            }
        }
        let is_write = prepared.is_write;
        let decide = self.decide(scope, prepared);
        let decided = match decide.instrument(tracing::trace_span!("gate.decide")).await {
            Ok(d) => d,
            Err(e) if leases::is_lost(&e) => {
                tracing::warn!(
                    token = scope.lease.token,
                    "the session's lease is stale; call refused"
                );
                self.lease_refused(&scope.lease);
                return CallReply::Refused(Refusal::SessionMoved);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot record a call");
                return CallReply::Refused(Refusal::Internal);
            }
        };
        match decided {
            Decided::Run(exec) if is_write => self.execute_write(exec, started).await,
            Decided::Run(exec) => self.execute_read(exec, started).await,
            Decided::Replay(exec) => CallReply::Ran {
                execution_id: exec.id,
                result: exec
                    .result
                    .as_deref()
                    .and_then(|r| serde_json::from_str(r).ok())
                    .unwrap_or(Value::Null),
                replayed: true,
            },
            Decided::InFlight(twin) => self.await_twin(scope, twin).await,
            Decided::Held(exec) | Decided::Pending(exec) => {
                self.outbox.wake();
                let approval_url = self.approval_url(&exec.id);
                CallReply::Held {
                    execution: Box::new(exec),
                    approval_url,
                }
            }
            Decided::Blocked(exec) => CallReply::Blocked {
                execution_id: exec.id,
                rule: exec.because,
            },
            Decided::TooManyHolds { limit, first } => {
                if first {
                    self.stop_flooding_session(scope, limit);
                }
                CallReply::Refused(Refusal::TooManyHolds { limit })
            }
        }
    }

    /// The answer to a write whose identical twin in the session was still being sent
    /// or is in doubt: the twin's, once it ends within [`TWIN_WAIT`] (its result
    /// replayed when it succeeded, its error when it did not, and that a person must
    /// check it when its outcome is unknown); else refused `in_flight`, naming the twin
    /// to wait on. Nothing of this call is recorded or sent.
    async fn await_twin(&self, scope: &SessionScope, twin: Execution) -> CallReply {
        let session = scope.session_id.to_string();
        let mut watch = ExecutionWatch::new(self, &session);
        // Past the session's cap of waits, answered at once from the twin as it is.
        let slot = self.twin_waits.take(&scope.session_id);
        let wait = if slot.is_some() {
            TWIN_WAIT
        } else {
            Duration::ZERO
        };
        // Read again once watched: an outcome written since the decision is not missed.
        let settled = match watch.load(&twin.id).await {
            Ok(twin) => watch.settle(twin, wait, &mut Unreported).await,
            Err(e) => Err(e),
        };
        drop(slot);
        match settled {
            Ok(settled) => twin_reply(settled.execution),
            Err(e) => {
                tracing::error!(execution = %twin.id, error = %e, "cannot wait for an identical call");
                CallReply::Refused(Refusal::Internal)
            }
        }
    }

    /// A write for a session was refused by its lease's fence: the supervisor drops
    /// the session here at once (the thread belongs to another instance now).
    pub(super) fn lease_refused(&self, lease: &crate::store::leases::Lease) {
        self.supervisor.lease_refused(lease);
    }

    /// Posts the stop note already queued and stops the session, off this call: a
    /// session that asks people for more than `limit` calls at once is handed to a
    /// person.
    fn stop_flooding_session(&self, scope: &SessionScope, limit: usize) {
        tracing::warn!(
            limit,
            "too many calls waiting for a person; stopping the session"
        );
        self.outbox.wake();
        self.supervisor
            .stop_soon(&scope.thread_id, "too many calls waiting for a person");
    }

    /// Runs a call decided `run` (status `running`) through its connector, records the
    /// outcome and its audit row in one transaction, and answers the agent: an approved
    /// call, one recovery re-sends. The outcome is durable before the answer.
    pub async fn execute(&self, exec: Execution, started: Instant) -> CallReply {
        let (_, reply) = self
            .run_and_record(exec, started, OutcomeCommit::Flushed)
            .await;
        reply
    }

    /// As [`Gate::execute`], for a write the agent made, run without a person. Its
    /// outcome is recorded before the answer, so an identical write the agent sends
    /// next is answered from it (`decide`'s replay of a succeeded twin). When its
    /// provider deduplicates by idempotency key, that commit does not wait for the
    /// log's flush: a crash of the machine (SQLite) or the database server (Postgres)
    /// may lose it and leave the row `running`. An identical write then waits on it and
    /// is never sent again (`decide`'s running twin, answered `in_flight`), and
    /// recovery re-sends it with the same key within
    /// [`crate::connectors::RESEND_WITHIN_MS`] of its decision, which the provider
    /// answers with its first answer; past that a person checks it. A write to any
    /// other provider records its outcome flushed, as an approved call does.
    async fn execute_write(&self, exec: Execution, started: Instant) -> CallReply {
        let deduplicated = self
            .connectors
            .for_tool(&exec.tool)
            .is_some_and(|c| c.supports_idempotency());
        let commit = if deduplicated {
            OutcomeCommit::Unflushed
        } else {
            OutcomeCommit::Flushed
        };
        let (_, reply) = self.run_and_record(exec, started, commit).await;
        reply
    }

    /// As [`Gate::execute`], for a read the write path decided (its rule reserves
    /// limit amounts): its decision committed without waiting for its flush
    /// (`decide::record`), so the agent gets the result only once the outcome, whose
    /// synchronous commit flushes the decision too, is recorded; otherwise a 500 and
    /// no result. (Flushing the decision instead, as a read decided on a snapshot does,
    /// would hold the lease row's and the limit key's locks through the flush: Postgres
    /// releases a transaction's locks only once its commit is flushed.)
    async fn execute_read(&self, exec: Execution, started: Instant) -> CallReply {
        match self
            .run_and_record(exec, started, OutcomeCommit::Flushed)
            .await
        {
            (true, reply) => reply,
            (false, _) => CallReply::Refused(Refusal::Internal),
        }
    }

    /// Runs a decided call, records its outcome before the answer (its commit as
    /// `commit` says), and announces the change: whether the outcome was recorded, and
    /// the answer.
    #[tracing::instrument(name = "execute", skip_all, fields(execution_id = %exec.id, thread_id = %exec.thread_id, session_id = %exec.session_id, tool = %exec.tool))]
    async fn run_and_record(
        &self,
        exec: Execution,
        started: Instant,
        commit: OutcomeCommit,
    ) -> (bool, CallReply) {
        // In flight here until its outcome is written (the approvals' sweep recovers a
        // `running` row of this instance that is not).
        let _in_flight = self.sending.start(&exec.id);
        let ran = self.run_decided(&exec).await;
        let recorded = self
            .record_outcome(&exec, ran.record, started, commit)
            .await;
        self.notify(&exec.id);
        (recorded, ran.reply)
    }

    /// Runs a decided call through its connector and says what to record and what to
    /// answer; records nothing itself.
    pub(super) async fn run_decided(&self, exec: &Execution) -> Ran {
        let Some(connector) = self.connectors.for_tool(&exec.tool) else {
            let error = format!("no connector is configured for {}", exec.tool);
            return Ran {
                record: Outcome::Failed(error.clone()),
                reply: CallReply::Failed {
                    execution_id: exec.id.clone(),
                    error,
                    retry_after_ms: None,
                },
            };
        };
        let args: Value = serde_json::from_str(&exec.args).unwrap_or(Value::Null);
        let outcome = send(connector.as_ref(), exec, &args)
            .instrument(tracing::trace_span!("gate.send"))
            .await;
        if let Ok(result) = &outcome
            && let Err(message) = scope::check_result(&exec.tool, &args, result)
        {
            // The answer is dropped, never stored nor returned.
            return Ran {
                record: Outcome::Failed(message.clone()),
                reply: CallReply::Refused(Refusal::OutOfScope(message)),
            };
        }
        let redact = tracing::trace_span!("gate.redact");
        self.refresh_redactor().instrument(redact.clone()).await;
        let redactor = self.current_redactor();
        match outcome {
            Ok(mut result) => {
                redact.in_scope(|| redactor.redact_json(&mut result));
                Ran {
                    record: Outcome::Succeeded(result.clone()),
                    reply: CallReply::Ran {
                        execution_id: exec.id.clone(),
                        result,
                        replayed: false,
                    },
                }
            }
            Err(e) => {
                let (record, reply) = failed(exec, e, connector.supports_idempotency(), &redactor);
                Ran { record, reply }
            }
        }
    }

    /// Records how a call ended and its audit step, in one transaction; whether it was
    /// recorded. One that cannot be is logged and left `running`, for recovery. The
    /// write borrows nothing of the gate: a read's outcome may be written after its
    /// answer, by a task of its own (`trailing`).
    pub(super) fn record_outcome(
        &self,
        exec: &Execution,
        outcome: Outcome,
        started: Instant,
        commit: OutcomeCommit,
    ) -> impl Future<Output = bool> + Send + 'static {
        let (db, redactor, now) = (self.db.clone(), self.current_redactor(), self.now());
        let (exec, runner) = (exec.clone(), self.runner());
        let duration = crate::clock::ms(started.elapsed());
        let one_write = outcome_is_one_write(&exec, &outcome);
        let write = move |conn: &crate::store::Conn<'_>| {
            let (call, ended) = ((&exec, &*runner), (&outcome, one_write));
            write_outcome(conn, &redactor, call, ended, (duration, now))
        };
        // Reads nothing it decides on: the outcome is written by id, its charges given
        // back by execution id. The usual outcome is one statement on Postgres, sent
        // with no transaction around it (one round trip where BEGIN and COMMIT made four).
        async move {
            let written = match (one_write, commit) {
                (true, OutcomeCommit::Flushed) => db.write_single(write).await,
                (true, OutcomeCommit::Unflushed) => db.write_unflushed(write).await,
                // Rare (a definite failure, a held call's run): synchronous either way.
                (false, _) => db.write_locking(write).await,
            };
            if let Err(e) = &written {
                tracing::error!(error = %e, "cannot record a call's outcome");
            }
            written.is_ok()
        }
        .instrument(tracing::trace_span!("gate.outcome"))
    }
}

/// How long a write waits for its identical twin still being sent before it is refused
/// `in_flight`: longer than a provider's usual answer, shorter than a client's patience.
pub(super) const TWIN_WAIT: Duration = Duration::from_secs(20);

/// What a write is answered from its identical twin as the wait left it.
fn twin_reply(twin: Execution) -> CallReply {
    match twin.status {
        Status::Succeeded => CallReply::Ran {
            execution_id: twin.id,
            result: twin
                .result
                .as_deref()
                .and_then(|r| serde_json::from_str(r).ok())
                .unwrap_or(Value::Null),
            replayed: true,
        },
        Status::Running => CallReply::Refused(Refusal::InFlight(twin.id)),
        Status::NeedsCheck => CallReply::Failed {
            error: format!(
                "an identical call ({}) may have run and waits for a person to check the provider ({}); it is not sent again",
                twin.id,
                twin.error.as_deref().unwrap_or("outcome unknown")
            ),
            execution_id: twin.id,
            retry_after_ms: None,
        },
        other => CallReply::Failed {
            error: twin
                .error
                .unwrap_or_else(|| format!("an identical call ended {}", other.as_str())),
            execution_id: twin.id,
            retry_after_ms: None,
        },
    }
}

/// Sends the call; an unknown outcome is retried only where the provider deduplicates
/// by execution id.
async fn send(
    connector: &dyn Connector,
    exec: &Execution,
    args: &Value,
) -> Result<Value, ConnectorError> {
    let ctx = CallContext {
        execution_id: &exec.id,
    };
    let mut outcome = connector.call(&exec.tool, args, &ctx).await;
    let mut retries = 0;
    while matches!(outcome, Err(ConnectorError::Unknown { .. }))
        && connector.supports_idempotency()
        && retries < 2
    {
        retries += 1;
        tokio::time::sleep(std::time::Duration::from_millis(200 * retries)).await;
        outcome = connector.call(&exec.tool, args, &ctx).await;
    }
    outcome
}

/// A connector's error as recorded and as answered (redacted; an unknown outcome
/// without idempotency says it will not be re-sent).
fn failed(
    exec: &Execution,
    e: ConnectorError,
    idempotent: bool,
    redactor: &Redactor,
) -> (Outcome, CallReply) {
    let definite = e.is_definite();
    let retry_after_ms = match &e {
        ConnectorError::RateLimited { retry_after } => Some(crate::clock::ms_u64(*retry_after)),
        _ => None,
    };
    let error = redactor.redact(&e.to_string()).into_owned();
    let error = if definite || idempotent {
        error
    } else {
        format!(
            "{error}; the outcome is unknown and the call will not be re-sent: a person must check the provider"
        )
    };
    let reply = CallReply::Failed {
        execution_id: exec.id.clone(),
        error: error.clone(),
        retry_after_ms,
    };
    let outcome = if definite {
        Outcome::Failed(error)
    } else {
        Outcome::Unknown(error)
    };
    (outcome, reply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{ExecutionId, SessionId, ThreadId};

    fn twin(status: Status, result: Option<&str>, error: Option<&str>) -> Execution {
        let scope = SessionScope {
            session_id: SessionId::parse("se_1").expect("id"),
            thread_id: ThreadId::parse("th_1").expect("id"),
            agent: "support".into(),
            customer_id: None,
            customer_email: None,
            lease: crate::store::leases::Lease {
                thread_id: ThreadId::parse("th_1").expect("id"),
                owner: "inst".into(),
                token: 1,
            },
        };
        let id = ExecutionId::parse("ex_twin").expect("id");
        let decided = ("run", status);
        let mut exec = Execution::by_threadgate(
            &id,
            &scope,
            "stripe.create_refund",
            "{}".into(),
            decided,
            "r",
            1,
        );
        exec.result = result.map(str::to_owned);
        exec.error = error.map(str::to_owned);
        exec
    }

    /// A write waiting on its identical twin is answered from the twin as the wait
    /// left it: its result, replayed; its error; or, still running, refused with the
    /// twin's id, never sent.
    #[test]
    fn a_twins_answer_is_its_result_its_error_or_in_flight() {
        let ran = twin_reply(twin(Status::Succeeded, Some(r#"{"id":"re_1"}"#), None));
        let CallReply::Ran {
            execution_id,
            result,
            replayed,
        } = ran
        else {
            panic!("{ran:?}");
        };
        assert_eq!(
            (execution_id.as_str(), result, replayed),
            ("ex_twin", serde_json::json!({"id": "re_1"}), true)
        );
        let failed = twin_reply(twin(Status::Failed, None, Some("card_declined")));
        assert!(
            matches!(&failed, CallReply::Failed { error, execution_id, .. }
                if error == "card_declined" && execution_id.as_str() == "ex_twin"),
            "{failed:?}"
        );
        let unknown = twin_reply(twin(Status::NeedsCheck, None, Some("timed out")));
        assert!(
            matches!(&unknown, CallReply::Failed { error, .. }
                if error.contains("waits for a person to check the provider (timed out)")),
            "{unknown:?}"
        );
        let denied = twin_reply(twin(Status::Denied, None, None));
        assert!(
            matches!(&denied, CallReply::Failed { error, .. }
                if error == "an identical call ended denied"),
            "{denied:?}"
        );
        let open = twin_reply(twin(Status::Running, None, None));
        assert!(
            matches!(&open, CallReply::Refused(Refusal::InFlight(id)) if id.as_str() == "ex_twin"),
            "{open:?}"
        );
    }
}
