//! A call from end to end: [`Gate::call`] prepares it, decides and records it, then
//! runs it through its connector ([`Gate::execute`], also what an approval runs) and
//! records the outcome with its audit step.

use std::time::Instant;

use serde_json::Value;

use super::decide::Decided;
use super::gate::{CallReply, CallRequest, Gate};
use super::refusal::Refusal;
use super::scope;
use crate::audit::AuditEvent;
use crate::connectors::{CallContext, Connector, ConnectorError};
use crate::executions::{self, AuditStep, Execution, Status, store as exec_store};
use crate::secrets::Redactor;
use crate::session::SessionScope;

impl Gate {
    /// Decides and, when allowed, runs one call of a session: prepares it (the checks
    /// before the policy), decides and records it in one transaction, then runs it,
    /// or answers that it is held or blocked.
    #[tracing::instrument(name = "gate", skip_all, fields(thread_id = %scope.thread_id, session_id = %scope.session_id))]
    pub async fn call(&self, scope: &SessionScope, req: CallRequest) -> CallReply {
        let started = Instant::now();
        let prepared = match self.prepare(scope, req).await {
            Ok(p) => p,
            Err(refusal) => return CallReply::Refused(refusal),
        };
        let decided = match self.decide(scope, prepared).await {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "cannot record a call");
                return CallReply::Refused(Refusal::Internal);
            }
        };
        match decided {
            Decided::Run(exec) => self.execute(exec, started).await,
            Decided::Replay(exec) => CallReply::Ran {
                execution_id: exec.id,
                result: exec
                    .result
                    .as_deref()
                    .and_then(|r| serde_json::from_str(r).ok())
                    .unwrap_or(Value::Null),
                replayed: true,
            },
            Decided::Held(exec) | Decided::Pending(exec) => {
                self.outbox.notify_one();
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
        }
    }

    /// Runs a call decided `run` (status `running`) through its connector, records the
    /// outcome and its audit row in one transaction, and answers the agent.
    #[tracing::instrument(name = "execute", skip_all, fields(execution_id = %exec.id, thread_id = %exec.thread_id, session_id = %exec.session_id, tool = %exec.tool))]
    pub async fn execute(&self, exec: Execution, started: Instant) -> CallReply {
        let Some(connector) = self.connectors.for_tool(&exec.tool) else {
            let error = format!("no connector is configured for {}", exec.tool);
            self.record_outcome(&exec, Outcome::Failed(error.clone()), started)
                .await;
            return CallReply::Failed {
                execution_id: exec.id,
                error,
                retry_after_ms: None,
            };
        };
        let args: Value = serde_json::from_str(&exec.args).unwrap_or(Value::Null);
        let outcome = send(connector.as_ref(), &exec, &args).await;
        if let Ok(result) = &outcome
            && let Err(message) = scope::check_result(&exec.tool, &args, result)
        {
            // The answer is dropped, never stored nor returned.
            self.record_outcome(&exec, Outcome::Failed(message.clone()), started)
                .await;
            self.notify(&exec.id);
            return CallReply::Refused(Refusal::OutOfScope(message));
        }
        self.refresh_redactor().await;
        let redactor = self.current_redactor();
        let reply = match outcome {
            Ok(mut result) => {
                redactor.redact_json(&mut result);
                self.record_outcome(&exec, Outcome::Succeeded(result.clone()), started)
                    .await;
                CallReply::Ran {
                    execution_id: exec.id.clone(),
                    result,
                    replayed: false,
                }
            }
            Err(e) => {
                let (failure, reply) =
                    failed(&exec, e, connector.supports_idempotency(), &redactor);
                self.record_outcome(&exec, failure, started).await;
                reply
            }
        };
        self.notify(&exec.id);
        reply
    }

    /// Records how a call ended and its audit step, in one transaction.
    async fn record_outcome(&self, exec: &Execution, outcome: Outcome, started: Instant) {
        let redactor = self.current_redactor();
        let now = self.now();
        let exec = exec.clone();
        let duration = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let written = self
            .db
            .write(move |conn| {
                let (status, result, error) = match &outcome {
                    Outcome::Succeeded(result) => {
                        (Status::Succeeded, Some(result.to_string()), None)
                    }
                    Outcome::Failed(error) => (Status::Failed, None, Some(error.as_str())),
                    Outcome::Unknown(error) => (Status::NeedsCheck, None, Some(error.as_str())),
                };
                exec_store::finish(conn, &exec.id, status, result.as_deref(), error, now)?;
                if status == Status::Failed {
                    exec_store::release_charges(conn, &exec.id)?;
                }
                let step = match error {
                    None => AuditStep::new(AuditEvent::Ran).outcome(Some("ok")),
                    Some(error) => AuditStep::new(AuditEvent::Failed).outcome(Some(error)),
                };
                executions::audit(conn, &redactor, &exec, step.duration_ms(duration))
            })
            .await;
        if let Err(e) = written {
            tracing::error!(error = %e, "cannot record a call's outcome");
        }
    }
}

/// How a sent call ended, as recorded.
enum Outcome {
    Succeeded(Value),
    /// Definitely not done: its limit charges are given back.
    Failed(String),
    /// Perhaps done, on a provider without idempotency keys: a person must check.
    Unknown(String),
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
        ConnectorError::RateLimited { retry_after } => Some(retry_after.as_millis() as u64),
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
