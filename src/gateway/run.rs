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
use crate::connectors::{CallContext, ConnectorError};
use crate::executions::{self, AuditStep, Execution, Status, store as exec_store};
use crate::session::SessionScope;

impl Gate {
    /// Decides and, when allowed, runs one call of a session: prepares it (the checks
    /// before the policy), decides and records it in one transaction, then runs it,
    /// or answers that it is held or blocked.
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
    pub async fn execute(&self, exec: Execution, started: Instant) -> CallReply {
        let id = exec.id.clone();
        let Some(connector) = self.connectors.for_tool(&exec.tool) else {
            let error = format!("no connector is configured for {}", exec.tool);
            self.record_outcome(&exec, Err((error.clone(), true)), started)
                .await;
            return CallReply::Failed {
                execution_id: id,
                error,
                retry_after_ms: None,
            };
        };
        let args: Value = serde_json::from_str(&exec.args).unwrap_or(Value::Null);
        let ctx = CallContext {
            execution_id: &exec.id,
        };
        let mut outcome = connector.call(&exec.tool, &args, &ctx).await;
        // Retrying is safe only where the provider deduplicates by execution id.
        let mut retries = 0;
        while matches!(outcome, Err(ConnectorError::Unknown { .. }))
            && connector.supports_idempotency()
            && retries < 2
        {
            retries += 1;
            tokio::time::sleep(std::time::Duration::from_millis(200 * retries)).await;
            outcome = connector.call(&exec.tool, &args, &ctx).await;
        }
        if let Ok(result) = &outcome
            && let Err(message) = scope::check_result(&exec.tool, &args, result)
        {
            // The answer is dropped, never stored nor returned.
            self.record_outcome(&exec, Err((message.clone(), true)), started)
                .await;
            self.notify(&exec.id);
            return CallReply::Refused(Refusal::OutOfScope(message));
        }
        self.refresh_redactor().await;
        let redactor = self.current_redactor();
        let reply = match outcome {
            Ok(mut result) => {
                redactor.redact_json(&mut result);
                self.record_outcome(&exec, Ok(result.clone()), started)
                    .await;
                CallReply::Ran {
                    execution_id: id,
                    result,
                    replayed: false,
                }
            }
            Err(e) => {
                let definite = e.is_definite();
                let retry_after_ms = match &e {
                    ConnectorError::RateLimited { retry_after } => {
                        Some(retry_after.as_millis() as u64)
                    }
                    _ => None,
                };
                let error = redactor.redact(&e.to_string()).into_owned();
                let final_error = if definite || connector.supports_idempotency() {
                    error.clone()
                } else {
                    format!(
                        "{error}; the outcome is unknown and the call will not be re-sent: a person must check the provider"
                    )
                };
                self.record_outcome(&exec, Err((final_error.clone(), definite)), started)
                    .await;
                CallReply::Failed {
                    execution_id: id,
                    error: final_error,
                    retry_after_ms,
                }
            }
        };
        self.notify(&exec.id);
        reply
    }

    async fn record_outcome(
        &self,
        exec: &Execution,
        outcome: Result<Value, (String, bool)>,
        started: Instant,
    ) {
        let redactor = self.current_redactor();
        let now = self.now();
        let exec = exec.clone();
        let duration = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let written = self
            .db
            .write(move |conn| {
                match &outcome {
                    Ok(result) => {
                        exec_store::finish(
                            conn,
                            &exec.id,
                            Status::Succeeded,
                            Some(&result.to_string()),
                            None,
                            now,
                        )?;
                        executions::audit(
                            conn,
                            &redactor,
                            &exec,
                            AuditStep::new(AuditEvent::Ran)
                                .outcome(Some("ok"))
                                .duration_ms(duration),
                        )?;
                    }
                    Err((error, true)) => {
                        exec_store::finish(conn, &exec.id, Status::Failed, None, Some(error), now)?;
                        exec_store::release_charges(conn, &exec.id)?;
                        executions::audit(
                            conn,
                            &redactor,
                            &exec,
                            AuditStep::new(AuditEvent::Failed)
                                .outcome(Some(error))
                                .duration_ms(duration),
                        )?;
                    }
                    Err((error, false)) => {
                        exec_store::finish(
                            conn,
                            &exec.id,
                            Status::NeedsCheck,
                            None,
                            Some(error),
                            now,
                        )?;
                        executions::audit(
                            conn,
                            &redactor,
                            &exec,
                            AuditStep::new(AuditEvent::Failed)
                                .outcome(Some(error))
                                .duration_ms(duration),
                        )?;
                    }
                }
                Ok(())
            })
            .await;
        if let Err(e) = written {
            tracing::error!(error = %e, "cannot record a call's outcome");
        }
    }
}
