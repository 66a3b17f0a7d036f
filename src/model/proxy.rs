//! The model proxy: one model call of a session's runner, checked and forwarded.
//!
//! Calls of one session are serialised, so concurrent calls cannot overspend, and at
//! most `max_queued_calls` wait (429 `too_many_calls` beyond, before the body is read;
//! [`super::queue`]). Once a call's turn comes, in order: the body is JSON (400); no
//! stored secret value is in any string or key of it, whatever the field (403
//! `secret_in_prompt`, with a note naming the secret and the session stopped like a
//! spent budget: every later call is refused); it is a chat request (400) naming no
//! model but the agent's (403 `model_not_allowed`); the session's budget is not spent
//! (429 `budget_exhausted`, with the note queued and the session stopped); no secret
//! value is in what would go upstream either (text parts joined, names rewritten; as
//! above); and the request's size alone fits the tokens left (at `bytes_per_token`;
//! else 429 `budget_exhausted` and the stop, before anything is sent). Then the turn is
//! counted with a reservation, an estimate of what the call may cost (the request's
//! fewest tokens plus its `max_tokens`), the call forwarded with retries, the
//! reservation settled to the tokens the upstream reports (a call the upstream refused
//! gives it back; one that failed otherwise or timed out keeps it) and an audit row
//! written (never the text). The sandbox API runs the
//! call to its end on the application's tasks ([`ModelProxy::chat_to_the_end`]): a
//! runner that hangs up loses the answer, not the count.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use serde_json::{Value, json};

use super::config::ModelSettings;
use super::names::ToolNames;
use super::queue::{Calls, Place};
use super::store as model_store;
use super::upstream::{Answered, Upstream, UpstreamError};
use super::{budget_note, openai, scan};
use crate::audit::{self, AuditEvent, AuditRecord};
use crate::gateway::Gate;
use crate::notes::stop::StopNote;
use crate::session::{AgentDefinition, SessionScope};
use crate::store::leases;

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
    TooManyCalls(String),
    #[error("{0}")]
    Upstream(String),
    #[error("{0}")]
    Malformed(String),
    /// The session's thread was taken over by another instance: the write that would
    /// have counted the call (or stored what it sent) was refused, nothing was written
    /// and nothing went upstream.
    #[error(
        "this session's thread was taken over by another threadgate instance; nothing was \
         recorded or sent, and this session stops here"
    )]
    SessionMoved,
    #[error("internal error")]
    Internal,
}

fn internal(e: impl std::fmt::Display) -> ProxyError {
    tracing::error!(error = %e, "model proxy");
    ProxyError::Internal
}

/// A fenced write's failure: [`ProxyError::SessionMoved`] when the session's lease
/// refused it (the supervisor is told, and drops the session here), else internal.
fn fenced_failed(gate: &Gate, scope: &SessionScope, e: crate::store::StoreError) -> ProxyError {
    if leases::is_lost(&e) {
        tracing::warn!(
            token = scope.lease.token,
            "the session's lease is stale; model write refused"
        );
        gate.supervisor().lease_refused(&scope.lease);
        return ProxyError::SessionMoved;
    }
    internal(e)
}

/// Serves every session's model calls.
pub struct ModelProxy {
    pub gate: Arc<Gate>,
    pub settings: ModelSettings,
    upstream: Upstream,
    calls: Calls,
}

impl ModelProxy {
    /// A proxy forwarding to `upstream` under `settings`.
    pub fn new(gate: Arc<Gate>, settings: ModelSettings, upstream: Upstream) -> ModelProxy {
        ModelProxy {
            gate,
            calls: Calls::new(settings.max_queued_calls),
            settings,
            upstream,
        }
    }

    fn agent(&self, scope: &SessionScope) -> Result<AgentDefinition, ProxyError> {
        self.gate.agent(&scope.agent).cloned().ok_or_else(|| {
            ProxyError::ModelNotAllowed("the session has no agent definition".into())
        })
    }

    /// A place for one more model call of the session, or 429 `too_many_calls` when
    /// one runs and `max_queued_calls` already wait (asked before the body is read).
    pub fn queue(&self, scope: &SessionScope) -> Result<Place, ProxyError> {
        self.calls.enter(&scope.session_id).map_err(|full| {
            ProxyError::TooManyCalls(format!(
                "the session already has {} model calls in flight (one running, the others waiting), \
                 the most [model] max_queued_calls ({}) allows; send the next when one answers",
                full.in_flight, full.max_queued
            ))
        })
    }

    /// [`ModelProxy::chat`] on a task of the application's own, awaited: a runner that
    /// hangs up mid-call does not cut it. The call goes on to its answer, whose tokens
    /// are counted and audited, and it keeps the session's place in the queue until
    /// then, so the session's next call still waits for it; only the answer is lost.
    /// (Cut with the request instead, the upstream would bill what it had begun while
    /// only the reservation counted it, and the audit would lack the call.)
    pub async fn chat_to_the_end(
        self: &Arc<Self>,
        place: Place,
        scope: &SessionScope,
        body: Bytes,
    ) -> Result<Value, ProxyError> {
        let (mut tx, rx) = tokio::sync::oneshot::channel();
        let (proxy, scope) = (self.clone(), scope.clone());
        self.gate.tasks().spawn(async move {
            // A call whose runner hung up while it still waited for its turn has begun
            // nothing: it gives its place up unsent and uncounted.
            let _serial = tokio::select! {
                serial = place.turn() => serial,
                () = tx.closed() => return,
            };
            let _ = tx.send(proxy.in_turn(&scope, body).await);
        });
        rx.await.unwrap_or(Err(ProxyError::Internal))
    }

    /// One model call: `body` is the runner's chat-completions request, read but not
    /// parsed; the answer is a `chat.completion` object with the session's spending
    /// under `threadgate`.
    #[tracing::instrument(name = "model_call", skip_all, fields(thread_id = %scope.thread_id, session_id = %scope.session_id))]
    pub async fn chat(
        &self,
        place: Place,
        scope: &SessionScope,
        body: Bytes,
    ) -> Result<Value, ProxyError> {
        // Parsed only once the call's turn comes: the parsed tree is many times the size
        // of the bytes, and a waiting call must not hold it.
        let _serial = place.turn().await;
        self.in_turn(scope, body).await
    }

    /// [`ModelProxy::chat`] once the call's turn has come.
    async fn in_turn(&self, scope: &SessionScope, body: Bytes) -> Result<Value, ProxyError> {
        let raw: Value = serde_json::from_slice(&body)
            .map_err(|e| ProxyError::BadRequest(format!("the body is not JSON: {e}")))?;
        drop(body);
        let agent = self.agent(scope)?;
        let redactor = self.gate.current_redactor();
        // Every string and key of what the runner sent, then of what would go upstream
        // (where text parts are joined and names rewritten).
        if let Some(name) = scan::secret_in_json(&redactor, &raw) {
            return Err(self.secret_stop(scope, &agent, &name).await);
        }
        let mut request = openai::take_request(raw).map_err(ProxyError::BadRequest)?;
        self.check_model(scope, &agent, &request.model).await?;
        request.model = agent.model.clone();
        let spent = self.spent(scope).await?;
        if let Some(why) = over_budget(&agent, &spent) {
            self.stop(scope, budget_note::budget(&why)).await?;
            return Err(ProxyError::BudgetExhausted(why));
        }
        let remaining = agent.limits.max_tokens.saturating_sub(spent.tokens);
        let cap = u32::try_from(remaining).unwrap_or(u32::MAX).max(1);
        // Never more than the budget left, nor (when the runner names none) more than
        // the configured default: Anthropic refuses a max_tokens above the model's.
        let asked = request
            .max_tokens
            .unwrap_or(self.settings.default_max_tokens);
        let request_max_tokens = asked.min(cap);
        request.max_tokens = Some(request_max_tokens);
        let names = ToolNames::for_request(&request);
        let wire = self.upstream.encode(names.to_wire(request));
        if let Some(name) = scan::secret_in_json(&redactor, &wire) {
            return Err(self.secret_stop(scope, &agent, &name).await);
        }
        let wire = Bytes::from(serde_json::to_vec(&wire).map_err(internal)?);
        if let Some(why) = self.cannot_fit(wire.len(), remaining, &agent) {
            self.stop(scope, budget_note::budget(&why)).await?;
            return Err(ProxyError::BudgetExhausted(why));
        }
        // The turn is counted under the session's lease: a stale owner's call is refused
        // here, before it goes upstream and before anything is written. It reserves an
        // estimate of what the call may cost (its request's fewest tokens, and the whole
        // answer it may have), settled to what the upstream reports once it answers: a
        // call the upstream refused gives it back, one that failed otherwise or timed out
        // (perhaps billed, attempts included) keeps it.
        let reserved = self.least_tokens(wire.len()) + u64::from(request_max_tokens);
        let (s, t, lease) = (
            scope.session_id.clone(),
            scope.thread_id.clone(),
            scope.lease.clone(),
        );
        self.gate
            .db()
            .write(move |c| {
                leases::fence(c, &lease)?;
                model_store::add_turn(c, &s, &t, reserved)
            })
            .await
            .map_err(|e| fenced_failed(&self.gate, scope, e))?;
        self.gate.supervisor().touch(&scope.thread_id);
        let started = Instant::now();
        let sent = self.upstream.send(wire, &redactor).await;
        let latency = crate::clock::ms(started.elapsed());
        self.finish(scope, &agent, (sent, reserved), latency, names)
            .await
    }

    /// The fewest tokens a request of `bytes` counts as: at most `bytes_per_token`
    /// bytes a token.
    fn least_tokens(&self, bytes: usize) -> u64 {
        (bytes as u64).div_ceil(self.settings.bytes_per_token.max(1))
    }

    /// Why a request of `bytes` cannot fit the `remaining` tokens of the session's
    /// budget, if it cannot: it counts as at least `bytes / bytes_per_token` tokens,
    /// and the answer needs one more.
    fn cannot_fit(&self, bytes: usize, remaining: u64, agent: &AgentDefinition) -> Option<String> {
        let per_token = self.settings.bytes_per_token.max(1);
        let least = self.least_tokens(bytes);
        (least >= remaining).then(|| {
            format!(
                "the request's {bytes} bytes are at least {least} tokens (at most [model] \
                 bytes_per_token ({per_token}) bytes a token), which cannot fit the {remaining} \
                 left of the session's budget of {} model tokens",
                agent.limits.max_tokens
            )
        })
    }

    /// Refuses a call holding the value of the stored secret `name`: the audit row,
    /// the note naming the secret, the session stopped like a spent budget.
    async fn secret_stop(
        &self,
        scope: &SessionScope,
        agent: &AgentDefinition,
        name: &str,
    ) -> ProxyError {
        let stopped = async {
            self.refused(scope, agent, "secret_in_prompt").await?;
            self.stop(scope, budget_note::secret(name)).await
        };
        if let Err(e) = stopped.await {
            return e;
        }
        ProxyError::SecretInPrompt(format!(
            "the prompt holds the value of the stored secret {name:?}; it is never sent to the model, and the session stops"
        ))
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
        (sent, reserved): (Result<Answered, UpstreamError>, u64),
        latency_ms: i64,
        names: ToolNames,
    ) -> Result<Value, ProxyError> {
        // Refused outright (a 4xx other than 429, or no key to send with): nothing
        // was billed.
        let refused = matches!(sent, Err(UpstreamError::Refused(_)));
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
            Err(UpstreamError::Failed(e) | UpstreamError::Refused(e)) => {
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
        // What the upstream reported replaces the reservation; a call it refused gives
        // it back; any other that did not answer keeps it (the upstream may have billed
        // what it began).
        let reserved_signed = i64::try_from(reserved).unwrap_or(i64::MAX);
        let (counted, delta) = if answer.is_ok() {
            let used = i64::try_from(tokens).unwrap_or(i64::MAX);
            (tokens, used.saturating_sub(reserved_signed))
        } else if refused {
            (0, -reserved_signed)
        } else {
            (reserved, 0)
        };
        let record = AuditRecord {
            args: Some(json!({
                "model": agent.model,
                "provider": self.settings.provider.as_str(),
                "tokens": counted,
                "reserved": reserved,
            })),
            outcome: Some(outcome),
            duration_ms: Some(latency_ms),
            ..model_record(scope, AuditEvent::ModelCall)
        };
        let redactor = self.gate.current_redactor();
        let session = scope.session_id.clone();
        let spent = self
            .gate
            .db()
            .write(move |c| {
                model_store::settle_tokens(c, &session, delta)?;
                audit::append(c, &record, &redactor)?;
                model_store::spent(c, &session)
            })
            .await
            .map_err(internal)?;
        let answer = answer?;
        let mut wire = openai::answer_to_wire(&answer, self.gate.now() / 1000);
        let usage = json!({
            "tokens_used": spent.tokens,
            "tokens_budget": agent.limits.max_tokens,
            "turns_used": spent.turns,
            "turns_budget": agent.limits.max_turns,
        });
        if let Some(fields) = wire.as_object_mut() {
            fields.insert("threadgate".into(), usage);
        }
        Ok(wire)
    }

    /// Appends one audit row of the proxy, redacted.
    async fn append_audit(&self, record: AuditRecord) -> Result<(), ProxyError> {
        let redactor = self.gate.current_redactor();
        self.gate
            .db()
            .write(move |c| audit::append(c, &record, &redactor))
            .await
            .map(|_| ())
            .map_err(internal)
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
        self.append_audit(record).await
    }

    /// The audit row of a transcript refused for holding the value of the stored
    /// secret `name` (its name only).
    pub async fn transcript_refused(
        &self,
        scope: &SessionScope,
        name: &str,
    ) -> Result<(), ProxyError> {
        let record = AuditRecord {
            tool: Some("model.transcript".into()),
            args: Some(json!({"secret": name})),
            outcome: Some("secret_in_transcript".into()),
            ..model_record(scope, AuditEvent::Refused)
        };
        self.append_audit(record).await
    }

    async fn spent(&self, scope: &SessionScope) -> Result<model_store::Spent, ProxyError> {
        let s = scope.session_id.clone();
        self.gate
            .db()
            .read(move |c| model_store::spent(c, &s))
            .await
            .map_err(internal)
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
            .db()
            .write(move |c| {
                leases::fence(c, &scope_w.lease)?;
                budget_note::queue(c, &scope_w, &note, now, &redactor)
            })
            .await
            .map_err(|e| fenced_failed(&self.gate, scope, e))?;
        if first {
            tracing::info!(session = %scope.session_id, thread = %scope.thread_id, outcome, "session stopped by the model proxy");
            self.gate.outbox().wake();
            self.gate
                .supervisor()
                .stop_soon(&scope.thread_id, "stopped by the model proxy");
        }
        Ok(())
    }
}

/// An audit record of the pseudo-tool `model.chat` for the session.
fn model_record(scope: &SessionScope, event: AuditEvent) -> AuditRecord {
    AuditRecord {
        session_id: Some(scope.session_id.to_string()),
        thread_id: Some(scope.thread_id.to_string()),
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
