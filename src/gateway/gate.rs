//! The gate: decides a session's tool call against the policy, records it, and runs it
//! with the connector's credentials, holds it for a person, or blocks it.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::{Notify, broadcast};

use super::complete::{self, CompleteError};
use super::scope::{self, ScopeError};
use crate::audit::AuditEvent;
use crate::connectors::{
    CallContext, Connector, ConnectorError, GithubConnector, HelpdeskConnector, StripeConnector,
};
use crate::executions::{
    self, AuditStep, Execution, Status, binding_hash, new_execution_id, redact_args,
    store as exec_store,
};
use crate::policy::{Catalog, Evidence, LimitHistory, Policy, Risk, Verdict};
use crate::secrets::{Redactor, RedactorSource};
use crate::session::{AgentBook, SessionScope, SupervisorHandle};
use crate::store::Db;

/// The connectors threadgate calls tools through; any may be absent (not configured),
/// in which case its tools fail cleanly.
#[derive(Default, Clone)]
pub struct Connectors {
    pub stripe: Option<Arc<StripeConnector>>,
    pub helpdesk: Option<Arc<HelpdeskConnector>>,
    pub github: Option<Arc<GithubConnector>>,
}

impl Connectors {
    /// The connector serving `tool` (by its prefix).
    pub fn for_tool(&self, tool: &str) -> Option<Arc<dyn Connector>> {
        let prefix = tool.split('.').next().unwrap_or_default();
        match prefix {
            "stripe" => self.stripe.clone().map(|c| c as Arc<dyn Connector>),
            "helpdesk" => self.helpdesk.clone().map(|c| c as Arc<dyn Connector>),
            "github" => self.github.clone().map(|c| c as Arc<dyn Connector>),
            _ => None,
        }
    }
}

/// The policy in force, with what the audit records about it.
pub struct LoadedPolicy {
    pub policy: Policy,
    pub file: String,
    pub hash_hex: String,
}

impl LoadedPolicy {
    pub fn new(policy: Policy, file: String) -> LoadedPolicy {
        let hash_hex = hex::encode(policy.hash());
        LoadedPolicy {
            policy,
            file,
            hash_hex,
        }
    }
}

/// A tool call as the agent sends it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    pub tool: String,
    #[serde(default = "empty_object")]
    pub args: Value,
    #[serde(default)]
    pub diagnosis: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// The gate's answer to a call, before it becomes HTTP.
#[derive(Debug)]
pub enum CallReply {
    Ran {
        execution_id: String,
        result: Value,
        replayed: bool,
    },
    Failed {
        execution_id: String,
        error: String,
        retry_after_ms: Option<u64>,
    },
    Held {
        execution: Box<Execution>,
        approval_url: String,
    },
    Blocked {
        execution_id: String,
        rule: String,
    },
    /// Refused before any decision: (status, error code, message).
    Refused {
        status: u16,
        error: &'static str,
        message: String,
        details: Option<Value>,
    },
}

/// Everything the gate needs; shared by the sandbox API and the approvals service.
pub struct Gate {
    pub db: Db,
    pub policy: RwLock<Arc<LoadedPolicy>>,
    pub catalog: Catalog,
    pub connectors: Connectors,
    pub redactor: RwLock<Arc<Redactor>>,
    /// Rebuilds `redactor` when a secret was set or deleted (checked before each call
    /// and before a result is redacted); `None` keeps `redactor` as it is.
    pub redactor_source: Option<RedactorSource>,
    pub agents: Arc<AgentBook>,
    pub public_url: String,
    pub clock: crate::session::Clock,
    /// Execution ids whose status changed (long polls wait on this).
    pub changes: broadcast::Sender<String>,
    /// Wakes the note outbox.
    pub outbox: Notify,
    /// The supervisor, created before the gate (its channel first, its task later).
    pub supervisor: SupervisorHandle,
}

/// Limits read from the charges table inside the deciding transaction.
struct SqlHistory<'c>(&'c rusqlite::Connection);

impl LimitHistory for SqlHistory<'_> {
    fn total(&self, key: &str, since_unix_ms: i64) -> u128 {
        match exec_store::charged_total(self.0, key, since_unix_ms) {
            Ok(total) => u128::try_from(total).unwrap_or(0),
            // INVARIANT: an unreadable history counts as exhausted, so a limited
            // always_run rule does not match and the call falls through (fails closed).
            Err(_) => u128::MAX,
        }
    }
}

/// What the deciding transaction found.
enum Decided {
    Run(Execution),
    Held(Execution),
    Blocked(Execution),
    Replay(Execution),
    Pending(Execution),
}

impl Gate {
    pub fn now(&self) -> i64 {
        (self.clock)()
    }

    pub fn current_policy(&self) -> Arc<LoadedPolicy> {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn current_redactor(&self) -> Arc<Redactor> {
        self.redactor
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Brings `redactor` up to date with the secret store (one small read when nothing
    /// changed), so a secret stored a moment ago is already found.
    pub async fn refresh_redactor(&self) {
        if let Some(source) = &self.redactor_source {
            source.refresh(&self.redactor).await;
        }
    }

    /// The link a person follows to a held call (a pointer: using it needs a reviewer's
    /// credential).
    pub fn approval_url(&self, execution_id: &str) -> String {
        format!(
            "{}/approvals/{execution_id}",
            self.public_url.trim_end_matches('/')
        )
    }

    fn notify(&self, execution_id: &str) {
        let _ = self.changes.send(execution_id.to_owned());
    }

    /// Decides and, when allowed, runs one call of a session.
    pub async fn call(&self, scope: &SessionScope, req: CallRequest) -> CallReply {
        let started = Instant::now();
        let Some(agent) = self.agents.get(&scope.agent) else {
            return refused(
                403,
                "not_granted",
                format!("agent {} has no definition", scope.agent),
            );
        };
        let Some(spec) = self.catalog.get(&req.tool) else {
            return refused(404, "unknown_tool", format!("no tool named {}", req.tool));
        };
        if !agent.grants(&req.tool) {
            return refused(
                403,
                "not_granted",
                format!("agent {} is not granted {}", agent.name, req.tool),
            );
        }
        let Value::Object(mut args) = req.args else {
            return refused(
                422,
                "invalid_arguments",
                "args must be a JSON object".into(),
            );
        };
        self.refresh_redactor().await;
        let redactor = self.current_redactor();
        if let Some(name) = secret_in(&redactor, &args, req.diagnosis.as_deref()) {
            self.audit_refusal(scope, &req.tool, &format!("secret {name} in arguments"))
                .await;
            return refused(
                403,
                "secret_in_arguments",
                format!("the call contains the value of stored secret {name}; it was not sent"),
            );
        }
        let takes_thread = spec.arg("thread_id").is_some();
        if let Err(problems) = self
            .catalog
            .validate_args(&req.tool, &Value::Object(args.clone()))
        {
            let list: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
            return CallReply::Refused {
                status: 422,
                error: "invalid_arguments",
                message: format!("{}: {}", req.tool, list.join("; ")),
                details: Some(json!(list)),
            };
        }
        let is_write = spec.risk != Risk::Read;
        if let Err(e) = self
            .check_scope(&req.tool, &mut args, scope, is_write)
            .await
        {
            return self.refuse_scope(scope, &req.tool, e, &redactor).await;
        }
        let wanted = self.current_policy().policy.evidence_wanted(&req.tool);
        let completion = match complete::complete(
            &req.tool,
            &mut args,
            scope,
            takes_thread,
            is_write,
            self.connectors.stripe.as_deref(),
            &wanted,
        )
        .await
        {
            Ok(c) => c,
            Err(e @ CompleteError::OutOfScope { .. }) => {
                self.audit_refusal(scope, &req.tool, &e.to_string()).await;
                return refused(403, "out_of_scope", e.to_string());
            }
            Err(CompleteError::Lookup { what, source }) => {
                let status = if source.is_definite() { 422 } else { 502 };
                return refused(
                    status,
                    "lookup_failed",
                    format!(
                        "cannot look up {what}: {}",
                        redactor.redact(&source.to_string())
                    ),
                );
            }
        };
        let args = Value::Object(args);
        let canonical = args.to_string();
        let account = format!("{}:default", spec.connector());
        let binding_hash = binding_hash(&req.tool, &canonical, &account, &scope.session_id);
        let decided = self
            .decide(
                scope,
                &req.tool,
                args,
                canonical,
                account,
                binding_hash,
                req.diagnosis,
                completion.forced_hold,
                completion.evidence,
                is_write,
            )
            .await;
        let decided = match decided {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "cannot record a call");
                return refused(500, "internal", "internal error".into());
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

    #[allow(clippy::too_many_arguments)]
    async fn decide(
        &self,
        scope: &SessionScope,
        tool: &str,
        args: Value,
        canonical: String,
        account: String,
        binding_hash: String,
        diagnosis: Option<String>,
        forced_hold: Option<String>,
        evidence: Evidence,
        is_write: bool,
    ) -> Result<Decided, crate::store::StoreError> {
        let loaded = self.current_policy();
        let catalog = self.catalog.clone();
        let redactor = self.current_redactor();
        let now = self.now();
        let scope = scope.clone();
        let tool = tool.to_owned();
        let public_url = self.approval_url("");
        self.db
            .write(move |conn| {
                if is_write
                    && let Some(done) =
                        exec_store::succeeded_binding(conn, &scope.session_id, &binding_hash)?
                {
                    return Ok(Decided::Replay(done));
                }
                if let Some(pending) =
                    exec_store::pending_binding(conn, &scope.session_id, &binding_hash, now)?
                {
                    return Ok(Decided::Pending(pending));
                }
                let decision = loaded.policy.decide_with_evidence(
                    &tool,
                    &args,
                    &catalog,
                    &SqlHistory(conn),
                    now,
                    &evidence,
                );
                let mut verdict = decision.verdict;
                let mut because = decision.because.to_string();
                for check in &decision.evidence {
                    because.push_str(&format!("; evidence {check}"));
                }
                let mut rule_line = decision.rule_line.map(i64::from);
                if verdict == Verdict::Run {
                    let earlier = exec_store::held_for_tool(conn, &scope.session_id, &tool, now)?;
                    let reason = forced_hold.or_else(|| {
                        earlier
                            .map(|id| format!("another {tool} call ({id}) is waiting for a person"))
                    });
                    if let Some(reason) = reason {
                        verdict = Verdict::Hold;
                        because = reason;
                        rule_line = None;
                    }
                }
                let id = new_execution_id();
                let ttl_ms =
                    i64::try_from(loaded.policy.approval_ttl().as_millis()).unwrap_or(i64::MAX);
                let (status, expires) = match verdict {
                    Verdict::Run => (Status::Running, None),
                    Verdict::Hold => (Status::Held, Some(now.saturating_add(ttl_ms))),
                    Verdict::Block => (Status::Blocked, None),
                };
                let redacted = redact_args(&redactor, &args);
                let rule_text = match rule_line {
                    Some(line) => format!("{because} ({}:{line})", loaded.file),
                    None => because.clone(),
                };
                let summary = format!("{tool} {redacted} held: {rule_text}");
                let exec = Execution {
                    id: id.clone(),
                    session_id: scope.session_id.clone(),
                    thread_id: scope.thread_id.clone(),
                    agent: scope.agent.clone(),
                    tool: tool.clone(),
                    args: canonical,
                    account,
                    binding_hash,
                    diagnosis: diagnosis.clone(),
                    verdict: verdict.as_str().to_owned(),
                    because: because.clone(),
                    rule_line,
                    policy_hash: loaded.hash_hex.clone(),
                    status,
                    summary: (verdict == Verdict::Hold).then(|| summary.clone()),
                    expires_at_ms: expires,
                    reviewer: None,
                    decision_message: None,
                    decided_at_ms: None,
                    result: None,
                    error: None,
                    attempts: 0,
                    created_at_ms: now,
                    finished_at_ms: None,
                };
                exec_store::insert(conn, &exec)?;
                executions::audit(
                    conn,
                    &redactor,
                    &exec,
                    AuditStep::new(AuditEvent::Requested),
                )?;
                match verdict {
                    Verdict::Run => {
                        for charge in &decision.charges {
                            let amount = i64::try_from(charge.amount).unwrap_or(i64::MAX);
                            exec_store::charge(conn, &id, &charge.key, amount, now)?;
                        }
                        executions::audit(
                            conn,
                            &redactor,
                            &exec,
                            AuditStep::new(AuditEvent::Decided),
                        )?;
                        Ok(Decided::Run(exec))
                    }
                    Verdict::Hold => {
                        executions::audit(
                            conn,
                            &redactor,
                            &exec,
                            AuditStep::new(AuditEvent::Held),
                        )?;
                        let note = super::note::held_note(
                            &exec,
                            &redacted,
                            &rule_text,
                            &format!("{public_url}{id}"),
                            &redactor,
                        );
                        exec_store::enqueue_note(conn, &note, now)?;
                        Ok(Decided::Held(exec))
                    }
                    Verdict::Block => {
                        executions::audit(
                            conn,
                            &redactor,
                            &exec,
                            AuditStep::new(AuditEvent::Blocked),
                        )?;
                        Ok(Decided::Blocked(exec))
                    }
                }
            })
            .await
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
            return refused(403, "out_of_scope", message);
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

    /// Scope checks before the policy: Stripe reads against the thread's customer,
    /// GitHub calls against the configured repositories.
    async fn check_scope(
        &self,
        tool: &str,
        args: &mut Map<String, Value>,
        scope: &SessionScope,
        is_write: bool,
    ) -> Result<(), ScopeError> {
        if tool.starts_with("github.") {
            return scope::check_github(tool, args, self.connectors.github.as_deref());
        }
        if tool.starts_with("stripe.") && !is_write {
            return scope::check_stripe_read(tool, args, scope, self.connectors.stripe.as_deref())
                .await;
        }
        Ok(())
    }

    async fn refuse_scope(
        &self,
        scope: &SessionScope,
        tool: &str,
        error: ScopeError,
        redactor: &Redactor,
    ) -> CallReply {
        match error {
            ScopeError::OutOfScope(message) => {
                self.audit_refusal(scope, tool, &message).await;
                refused(403, "out_of_scope", message)
            }
            ScopeError::Lookup { what, source } => {
                let status = if source.is_definite() { 422 } else { 502 };
                let message = format!(
                    "cannot look up {what}: {}",
                    redactor.redact(&source.to_string())
                );
                self.audit_refusal(scope, tool, &message).await;
                refused(status, "lookup_failed", message)
            }
        }
    }

    async fn audit_refusal(&self, scope: &SessionScope, tool: &str, reason: &str) {
        let redactor = self.current_redactor();
        let (scope, tool, reason) = (scope.clone(), tool.to_owned(), reason.to_owned());
        let policy_hash = self.current_policy().hash_hex.clone();
        let now = self.now();
        let written = self
            .db
            .write(move |conn| {
                executions::audit::refusal(
                    conn,
                    &redactor,
                    &scope,
                    &tool,
                    &reason,
                    &policy_hash,
                    now,
                )
            })
            .await;
        if let Err(e) = written {
            tracing::error!(error = %e, "cannot audit a refusal");
        }
    }
}

fn refused(status: u16, error: &'static str, message: String) -> CallReply {
    CallReply::Refused {
        status,
        error,
        message,
        details: None,
    }
}

/// The name of a stored secret whose value appears in the arguments or diagnosis.
fn secret_in(
    redactor: &Redactor,
    args: &Map<String, Value>,
    diagnosis: Option<&str>,
) -> Option<String> {
    let bytes = serde_json::to_vec(args).unwrap_or_default();
    if let Some(name) = redactor.find(&bytes) {
        return Some(name.to_owned());
    }
    // Strings are also checked unescaped: JSON escaping could hide a value.
    let mut found = None;
    visit_strings(&Value::Object(args.clone()), &mut |s| {
        if found.is_none() {
            found = redactor.find(s.as_bytes()).map(str::to_owned);
        }
    });
    found.or_else(|| diagnosis.and_then(|d| redactor.find(d.as_bytes()).map(str::to_owned)))
}

fn visit_strings(v: &Value, f: &mut impl FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(items) => items.iter().for_each(|i| visit_strings(i, f)),
        Value::Object(map) => map.iter().for_each(|(k, i)| {
            f(k);
            visit_strings(i, f)
        }),
        _ => {}
    }
}
