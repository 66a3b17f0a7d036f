//! The model proxy: one model call of a session's runner, checked and forwarded.
//!
//! Order of checks: the request parses (400), names no model but the agent's (403
//! `model_not_allowed`), the session's budget is not spent (429 `budget_exhausted`,
//! with the note queued and the session stopped), no stored secret value is in the
//! prompt (403 `secret_in_prompt`, with a note naming the secret and the session
//! stopped like a spent budget: every later call is refused). Then the turn is counted, the call forwarded with
//! retries, the tokens counted and an audit row written (never the text).
//! Calls of one session are serialised, so concurrent calls cannot overspend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Value, json};

use super::config::ModelSettings;
use super::names::ToolNames;
use super::store as model_store;
use super::types::ChatRequest;
use super::upstream::{Answered, Upstream, UpstreamError};
use super::{budget_note, openai};
use crate::approvals::stop_note::StopNote;
use crate::audit::{self, AuditEvent, AuditRecord};
use crate::gateway::Gate;
use crate::session::{AgentDefinition, SessionScope};

/// Why a model call was refused or failed; each maps to a status and error code of
/// the socket's contract.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    ModelNotAllowed(String),
    #[error("{0}")]
    SecretInPrompt(String),
    #[error("{0}")]
    BudgetExhausted(String),
    #[error("{0}")]
    Upstream(String),
    #[error("{0}")]
    Malformed(String),
    #[error("internal error")]
    Internal,
}

fn internal(e: impl std::fmt::Display) -> ProxyError {
    tracing::error!(error = %e, "model proxy");
    ProxyError::Internal
}

/// Serves every session's model calls.
pub struct ModelProxy {
    pub gate: Arc<Gate>,
    pub settings: ModelSettings,
    upstream: Upstream,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl ModelProxy {
    /// A proxy forwarding to `upstream` under `settings`.
    pub fn new(gate: Arc<Gate>, settings: ModelSettings, upstream: Upstream) -> ModelProxy {
        ModelProxy {
            gate,
            settings,
            upstream,
            locks: Mutex::new(HashMap::new()),
        }
    }

    fn session_lock(&self, session_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(session_id.to_owned()).or_default().clone()
    }

    fn agent(&self, scope: &SessionScope) -> Result<AgentDefinition, ProxyError> {
        self.gate.agents.get(&scope.agent).cloned().ok_or_else(|| {
            ProxyError::ModelNotAllowed("the session has no agent definition".into())
        })
    }

    /// One model call: `body` is the runner's chat-completions request; the answer is
    /// a `chat.completion` object with the session's spending under `threadgate`.
    #[tracing::instrument(name = "model_call", skip_all, fields(thread_id = %scope.thread_id, session_id = %scope.session_id))]
    pub async fn chat(&self, scope: &SessionScope, body: &Value) -> Result<Value, ProxyError> {
        let mut request = openai::parse_request(body).map_err(ProxyError::BadRequest)?;
        let agent = self.agent(scope)?;
        self.check_model(scope, &agent, &request.model).await?;
        request.model = agent.model.clone();
        let lock = self.session_lock(&scope.session_id);
        let _serial = lock.lock().await;
        let spent = self.spent(scope).await?;
        if let Some(why) = over_budget(&agent, &spent) {
            self.stop(scope, budget_note::budget(&why)).await?;
            return Err(ProxyError::BudgetExhausted(why));
        }
        if let Some(name) = self.secret_in(&request) {
            self.refused(scope, &agent, "secret_in_prompt").await?;
            self.stop(scope, budget_note::secret(&name)).await?;
            return Err(ProxyError::SecretInPrompt(format!(
                "the prompt holds the value of the stored secret {name:?}; it is never sent to the model, and the session stops"
            )));
        }
        let remaining = agent.limits.max_tokens.saturating_sub(spent.tokens);
        let cap = u32::try_from(remaining).unwrap_or(u32::MAX).max(1);
        // Never more than the budget left, nor (when the runner names none) more than
        // the configured default: Anthropic refuses a max_tokens above the model's.
        let asked = request
            .max_tokens
            .unwrap_or(self.settings.default_max_tokens);
        request.max_tokens = Some(asked.min(cap));
        let (s, t) = (scope.session_id.clone(), scope.thread_id.clone());
        self.gate
            .db
            .write(move |c| model_store::add_turn(c, &s, &t))
            .await
            .map_err(internal)?;
        self.gate.supervisor.touch(&scope.thread_id);
        let names = ToolNames::for_request(&request);
        let wire_request = names.to_wire(request);
        let started = Instant::now();
        let redactor = self.gate.current_redactor();
        let sent = self.upstream.send(&wire_request, &redactor).await;
        let latency = started.elapsed().as_millis() as i64;
        self.finish(scope, &agent, sent, latency, names).await
    }

    /// Only the agent's model, and only when the config allows it.
    async fn check_model(
        &self,
        scope: &SessionScope,
        agent: &AgentDefinition,
        asked: &str,
    ) -> Result<(), ProxyError> {
        if !asked.is_empty() && asked != agent.model {
            self.refused(scope, agent, "model_not_allowed").await?;
            return Err(ProxyError::ModelNotAllowed(format!(
                "this session may use only {:?}",
                agent.model
            )));
        }
        if !self.settings.allows(&agent.model) {
            return Err(ProxyError::ModelNotAllowed(format!(
                "{:?} is not among the configured models",
                agent.model
            )));
        }
        Ok(())
    }

    async fn finish(
        &self,
        scope: &SessionScope,
        agent: &AgentDefinition,
        sent: Result<Answered, UpstreamError>,
        latency_ms: i64,
        names: ToolNames,
    ) -> Result<Value, ProxyError> {
        let (outcome, tokens, answer) = match sent {
            Ok(Answered {
                mut answer,
                attempts,
            }) => {
                names.from_wire(&mut answer);
                let u = answer.usage;
                let outcome = format!(
                    "ok prompt_tokens={} completion_tokens={} attempts={attempts}",
                    u.prompt_tokens, u.completion_tokens
                );
                (outcome, u.total(), Ok(answer))
            }
            Err(UpstreamError::Failed(e)) => {
                ("upstream_error".into(), 0, Err(ProxyError::Upstream(e)))
            }
            Err(UpstreamError::Malformed(e)) => (
                "upstream_malformed".into(),
                0,
                Err(ProxyError::Malformed(e)),
            ),
        };
        let took = std::time::Duration::from_millis(latency_ms.max(0) as u64);
        crate::metrics::model_call(&agent.model, tokens, took, answer.is_ok());
        let record = AuditRecord {
            args: Some(
                json!({"model": agent.model, "provider": self.settings.provider.as_str(), "tokens": tokens}),
            ),
            outcome: Some(outcome),
            duration_ms: Some(latency_ms),
            ..model_record(scope, AuditEvent::ModelCall)
        };
        let redactor = self.gate.current_redactor();
        let session = scope.session_id.clone();
        let spent = self
            .gate
            .db
            .write(move |c| {
                model_store::add_tokens(c, &session, tokens)?;
                audit::append(c, &record, &redactor)?;
                model_store::spent(c, &session)
            })
            .await
            .map_err(internal)?;
        let answer = answer?;
        let mut wire = openai::answer_to_wire(&answer, self.gate.now() / 1000);
        wire["threadgate"] = json!({
            "tokens_used": spent.tokens,
            "tokens_budget": agent.limits.max_tokens,
            "turns_used": spent.turns,
            "turns_budget": agent.limits.max_turns,
        });
        Ok(wire)
    }

    /// The audit row of a model call refused before it went upstream.
    async fn refused(
        &self,
        scope: &SessionScope,
        agent: &AgentDefinition,
        code: &str,
    ) -> Result<(), ProxyError> {
        let record = AuditRecord {
            args: Some(json!({"model": agent.model})),
            outcome: Some(code.to_owned()),
            ..model_record(scope, AuditEvent::Refused)
        };
        let redactor = self.gate.current_redactor();
        self.gate
            .db
            .write(move |c| audit::append(c, &record, &redactor))
            .await
            .map(|_| ())
            .map_err(internal)
    }

    async fn spent(&self, scope: &SessionScope) -> Result<model_store::Spent, ProxyError> {
        let s = scope.session_id.clone();
        self.gate
            .db
            .read(move |c| model_store::spent(c, &s))
            .await
            .map_err(internal)
    }

    /// The name of a stored secret whose value the prompt holds (never the value).
    fn secret_in(&self, request: &ChatRequest) -> Option<String> {
        let redactor = self.gate.current_redactor();
        let params: Vec<String> = request
            .tools
            .iter()
            .map(|t| t.parameters.to_string())
            .collect();
        request
            .texts()
            .chain(params.iter().map(String::as_str))
            .find_map(|t| redactor.find(t.as_bytes()).map(str::to_owned))
    }

    /// Marks the session's model calls stopped; the first time, queues `note` on the
    /// thread and stops the session so a person takes over.
    async fn stop(&self, scope: &SessionScope, note: StopNote) -> Result<(), ProxyError> {
        let now = self.gate.now();
        let redactor = self.gate.current_redactor();
        let outcome = note.outcome;
        let scope_w = scope.clone();
        let first = self
            .gate
            .db
            .write(move |c| budget_note::queue(c, &scope_w, &note, now, &redactor))
            .await
            .map_err(internal)?;
        if first {
            tracing::info!(session = %scope.session_id, thread = %scope.thread_id, outcome, "session stopped by the model proxy");
            self.gate.outbox.notify_one();
            let h = self.gate.supervisor.clone();
            let thread = scope.thread_id.clone();
            tokio::spawn(async move {
                if let Err(e) = h.stop(&thread).await {
                    tracing::warn!(thread, error = %e, "cannot stop the session the model proxy stopped");
                }
            });
        }
        Ok(())
    }
}

/// An audit record of the pseudo-tool `model.chat` for the session.
fn model_record(scope: &SessionScope, event: AuditEvent) -> AuditRecord {
    AuditRecord {
        session_id: Some(scope.session_id.clone()),
        thread_id: Some(scope.thread_id.clone()),
        agent: Some(scope.agent.clone()),
        tool: Some("model.chat".into()),
        ..AuditRecord::new(event)
    }
}

/// Why the agent may not call the model again, if its budget is spent.
fn over_budget(agent: &AgentDefinition, spent: &model_store::Spent) -> Option<String> {
    let l = &agent.limits;
    if spent.tokens >= l.max_tokens {
        Some(format!(
            "the session used {} of its {} model tokens",
            spent.tokens, l.max_tokens
        ))
    } else if spent.turns >= l.max_turns {
        Some(format!(
            "the session used all {} of its model turns",
            l.max_turns
        ))
    } else if spent.exhausted {
        Some("the session was stopped and may not call the model again".into())
    } else {
        None
    }
}
