//! The first step of a call: everything checked before the policy sees it. The agent's
//! grant, the catalog, the argument shape, the secret scan, the scope (thread,
//! customer, repositories) and the completion of the arguments. The result is a
//! [`PreparedCall`] (canonical arguments and the binding hash it will be frozen under)
//! or a typed [`Refusal`].

use serde_json::{Map, Value};
use tracing::Instrument as _;

use super::complete::{self, CompleteError, Completion};
use super::gate::{CallRequest, Gate};
use super::refusal::Refusal;
use super::scope::{self, ScopeError};
use crate::executions::{self, binding_hash};
use crate::policy::{Evidence, Risk};
use crate::secrets::Redactor;
use crate::session::SessionScope;

/// A call that passed every check before the policy, ready to be decided.
#[derive(Debug, Clone)]
pub struct PreparedCall {
    pub tool: String,
    pub args: Value,
    /// Canonical JSON of `args` (what is frozen and hashed).
    pub canonical: String,
    pub account: String,
    pub binding_hash: String,
    pub diagnosis: Option<String>,
    /// Why the call must wait for a person whatever the policy says (an object the
    /// thread's customer does not own), if it must.
    pub forced_hold: Option<String>,
    pub evidence: Evidence,
    pub is_write: bool,
}

impl Gate {
    /// Checks a call and completes its arguments; a refusal that touched the session's
    /// boundary (a secret, another customer) is audited.
    pub(super) async fn prepare(
        &self,
        scope: &SessionScope,
        req: CallRequest,
    ) -> Result<PreparedCall, Refusal> {
        let (spec_connector, is_write, takes_thread) = self.granted(scope, &req.tool)?;
        let Value::Object(mut args) = req.args else {
            return Err(Refusal::invalid("args must be a JSON object"));
        };
        self.refresh_redactor().await;
        let redactor = self.current_redactor();
        if let Some(name) = secret_in(&redactor, &args, req.diagnosis.as_deref()) {
            self.audit_refusal(scope, &req.tool, &format!("secret {name} in arguments"))
                .await;
            return Err(Refusal::SecretInArguments(format!(
                "the call contains the value of stored secret {name}; it was not sent"
            )));
        }
        self.validate(&req.tool, &args)?;
        if let Err(e) = self
            .check_scope(&req.tool, &mut args, scope, is_write)
            .instrument(tracing::trace_span!("gate.scope"))
            .await
        {
            return Err(self.refuse_scope(scope, &req.tool, e, &redactor).await);
        }
        let completion = self
            .complete(
                scope,
                &req.tool,
                &mut args,
                (takes_thread, is_write),
                &redactor,
            )
            .instrument(tracing::trace_span!("gate.complete"))
            .await?;
        let args = Value::Object(args);
        let canonical = executions::canonical_args(&args);
        let account = format!("{spec_connector}:default");
        Ok(PreparedCall {
            binding_hash: binding_hash(&req.tool, &canonical, &account, &scope.session_id),
            tool: req.tool,
            args,
            canonical,
            account,
            diagnosis: req.diagnosis,
            forced_hold: completion.forced_hold,
            evidence: completion.evidence,
            is_write,
        })
    }

    /// Completes the arguments (a refund's charge, currency and remaining amount) and
    /// gathers the evidence the policy asks for.
    async fn complete(
        &self,
        scope: &SessionScope,
        tool: &str,
        args: &mut Map<String, Value>,
        (takes_thread, is_write): (bool, bool),
        redactor: &Redactor,
    ) -> Result<Completion, Refusal> {
        let wanted = self.current_policy().policy.evidence_wanted(tool);
        let stripe = self.connectors.stripe.as_deref();
        let completed =
            complete::complete(tool, args, scope, takes_thread, is_write, stripe, &wanted).await;
        match completed {
            Ok(c) => Ok(c),
            Err(e @ CompleteError::OutOfScope { .. }) => {
                self.audit_refusal(scope, tool, &e.to_string()).await;
                Err(Refusal::OutOfScope(e.to_string()))
            }
            Err(CompleteError::Lookup { what, source }) => Err(Refusal::LookupFailed {
                message: format!(
                    "cannot look up {what}: {}",
                    redactor.redact(&source.to_string())
                ),
                definite: source.is_definite(),
            }),
        }
    }

    /// The tool's connector, whether it writes and whether it takes a `thread_id`, when
    /// the tool exists and the session's agent is granted it.
    fn granted(
        &self,
        scope: &SessionScope,
        tool: &str,
    ) -> Result<(&'static str, bool, bool), Refusal> {
        let Some(agent) = self.agents.get(&scope.agent) else {
            return Err(Refusal::NotGranted(format!(
                "agent {} has no definition",
                scope.agent
            )));
        };
        let Some(spec) = self.catalog.get(tool) else {
            return Err(Refusal::UnknownTool(format!("no tool named {tool}")));
        };
        if !agent.grants(tool) {
            return Err(Refusal::NotGranted(format!(
                "agent {} is not granted {tool}",
                agent.name
            )));
        }
        Ok((
            spec.connector(),
            spec.risk != Risk::Read,
            spec.arg("thread_id").is_some(),
        ))
    }

    /// The arguments against the tool's catalog entry, each problem listed.
    fn validate(&self, tool: &str, args: &Map<String, Value>) -> Result<(), Refusal> {
        let Err(problems) = self
            .catalog
            .validate_args(tool, &Value::Object(args.clone()))
        else {
            return Ok(());
        };
        let problems: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        Err(Refusal::InvalidArguments {
            message: format!("{tool}: {}", problems.join("; ")),
            problems,
        })
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
    ) -> Refusal {
        match error {
            ScopeError::OutOfScope(message) => {
                self.audit_refusal(scope, tool, &message).await;
                Refusal::OutOfScope(message)
            }
            ScopeError::Lookup { what, source } => {
                let message = format!(
                    "cannot look up {what}: {}",
                    redactor.redact(&source.to_string())
                );
                self.audit_refusal(scope, tool, &message).await;
                Refusal::LookupFailed {
                    message,
                    definite: source.is_definite(),
                }
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
