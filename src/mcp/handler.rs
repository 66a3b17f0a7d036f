//! One session's MCP tools: list, call through the gate, wait (with progress
//! notifications), and redeem a sealed request state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ElicitRequest, ElicitRequestParams,
    Implementation, InputRequest, InputRequiredResult, JsonObject, ListToolsResult, MetaObject,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

use threadgate_api::CallAnswer;

use super::McpServer;
use super::state::{HeldState, StateError, fresh_nonce, request_digest};
use super::tools::{DIAGNOSIS, WAIT_TOOL, gateway_tool, wait_tool};
use crate::executions::store::{Execution, Status};
use crate::gateway::answers::{call_answer, held, rfc3339};
use crate::gateway::slots::Full;
use crate::gateway::wait::{ExecutionWatch, Settled, WaitError, WaitProgress};
use crate::gateway::{CallReply, CallRequest, Refusal};
use crate::session::SessionScope;

/// The `_meta` key prefix of threadgate's fields.
const META: &str = "threadgate";

/// Where a wait reports its progress: the client's token of the request, and the
/// request's peer.
struct Progress {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    /// The last progress value sent (each must be larger).
    last: f64,
    /// How often a wait reports (`[mcp] progress_interval`).
    every: Duration,
}

impl Progress {
    /// The progress reporter of a request, when its `_meta` carries a token.
    fn of(context: &RequestContext<RoleServer>, every: Duration) -> Option<Progress> {
        let token = context.meta.get_progress_token()?;
        Some(Progress {
            peer: context.peer.clone(),
            token,
            last: -1.0,
            every,
        })
    }

    /// Sends one notification: seconds waited of `timeout`, and what is awaited.
    async fn report(&mut self, waited: Duration, timeout: Duration, exec: &Execution) {
        let progress = waited.as_secs_f64().max(self.last + 0.001);
        self.last = progress;
        let param = ProgressNotificationParam::new(self.token.clone(), progress)
            .with_total(timeout.as_secs_f64())
            .with_message(format!(
                "waiting for a person's decision on execution {} ({})",
                exec.id,
                exec.status.as_str()
            ));
        if let Err(e) = self.peer.notify_progress(param).await {
            // The client went away; the wait ends with its request.
            tracing::debug!(error = %e, "cannot send a progress notification");
        }
    }
}

/// A wait reports only to a request that carries a progress token.
impl WaitProgress for Option<Progress> {
    fn interval(&self) -> Option<Duration> {
        self.as_ref().map(|p| p.every)
    }

    async fn report(&mut self, waited: Duration, timeout: Duration, execution: &Execution) {
        if let Some(p) = self {
            p.report(waited, timeout, execution).await;
        }
    }
}

/// The MCP server as one session's socket serves it.
#[derive(Clone)]
pub struct SessionTools {
    server: Arc<McpServer>,
    scope: SessionScope,
}

impl SessionTools {
    /// The tools of the session `scope`.
    pub fn new(server: Arc<McpServer>, scope: SessionScope) -> SessionTools {
        SessionTools { server, scope }
    }

    /// The tools the agent may call, in the catalog's order, then `threadgate_wait`.
    pub fn tools(&self) -> Vec<rmcp::model::Tool> {
        let gate = &self.server.gate;
        let wait = wait_tool(self.server.settings.wait_default.as_secs());
        let Some(offered) = gate.offered_tools(&self.scope.agent) else {
            return vec![wait];
        };
        let mut tools: Vec<_> = offered.into_iter().map(gateway_tool).collect();
        tools.push(wait);
        tools
    }

    /// A gateway tool's call. A name the catalog does not have is an invalid-params
    /// error (-32602), after the gate has counted and logged it as on REST.
    async fn call(
        &self,
        params: CallToolRequestParams,
        (url_mode, context): (bool, &RequestContext<RoleServer>),
        progress: Option<Progress>,
    ) -> Result<CallToolResponse, ErrorData> {
        let gate = &self.server.gate;
        gate.supervisor().touch(&self.scope.thread_id);
        let mut args = Value::Object(params.arguments.unwrap_or_default());
        let diagnosis = args
            .as_object_mut()
            .and_then(|m| m.remove(DIAGNOSIS))
            .and_then(|d| d.as_str().map(str::to_owned))
            .filter(|d| !d.trim().is_empty());
        let tool = params.name.into_owned();
        let digest = request_digest(&tool, &args);
        if let Some(sealed) = params.request_state {
            let redeemed = self.redeem(&tool, &sealed, &digest, progress);
            return Ok(self.until_hung_up(context, redeemed).await);
        }
        let reply = gate
            .call_to_the_end(
                &self.scope,
                CallRequest {
                    tool,
                    args,
                    diagnosis,
                },
            )
            .await;
        Ok(match reply {
            CallReply::Refused(Refusal::UnknownTool(message)) => {
                return Err(ErrorData::invalid_params(
                    message,
                    Some(json!({"error": "unknown_tool"})),
                ));
            }
            CallReply::Held {
                execution,
                approval_url,
            } if url_mode => self
                .input_required(&execution, &approval_url, digest)
                .into(),
            other => reply_result(other).into(),
        })
    }

    /// The held call as an input request: the approval page to open, and the sealed
    /// state that brings the client back to the result.
    fn input_required(
        &self,
        execution: &Execution,
        approval_url: &str,
        request_digest: String,
    ) -> InputRequiredResult {
        let state = HeldState {
            execution_id: execution.id.to_string(),
            binding_hash: execution.binding_hash.clone(),
            request_digest,
            expires_at_ms: execution.expires_at_ms.unwrap_or(0),
            nonce: fresh_nonce(),
        };
        let sealed = self.server.sealer.seal(&self.scope.session_id, &state);
        let message = format!(
            "`{}` is held for a person's approval: {}. Open the approval page; once it is \
             decided, this call returns its result.",
            execution.tool,
            execution.summary.as_deref().unwrap_or("no summary"),
        );
        let request = ElicitRequest::new(ElicitRequestParams::UrlElicitationParams {
            meta: None,
            message,
            url: approval_url.to_owned(),
            elicitation_id: execution.id.to_string(),
        });
        let requests =
            BTreeMap::from([("approval".to_owned(), InputRequest::Elicitation(request))]);
        InputRequiredResult::new(Some(requests), Some(sealed))
            .with_meta(held_meta(execution, approval_url))
    }

    /// A retry with a request state: the state must be this server's, for this
    /// session and this exact call, unexpired and unused; then it waits on the
    /// execution like `threadgate_wait`. Still undecided at the wait's end, the client
    /// gets a fresh input request (the redeemed state is spent).
    async fn redeem(
        &self,
        tool: &str,
        sealed: &str,
        digest: &str,
        mut progress: Option<Progress>,
    ) -> CallToolResponse {
        let gate = &self.server.gate;
        let state = match self
            .server
            .sealer
            .redeem(&self.scope.session_id, sealed, digest, gate.now())
            .await
        {
            Ok(state) => state,
            Err(StateError::Store) => {
                return refused("internal", &StateError::Store.to_string()).into();
            }
            Err(e) => {
                tracing::warn!(session = %self.scope.session_id, error = %e, "request state refused");
                return refused("invalid_request_state", &e.to_string()).into();
            }
        };
        let mut watch = ExecutionWatch::new(gate, &self.scope.session_id);
        let exec = match watch.load(&state.execution_id).await {
            Ok(e) => e,
            Err(e) => return wait_refused(e).into(),
        };
        if exec.binding_hash != state.binding_hash || exec.tool != tool {
            return refused(
                "invalid_request_state",
                "the request state does not match this call",
            )
            .into();
        }
        let wait = self.server.settings.wait_default;
        match watch.settle(exec, wait, &mut progress).await {
            Ok(Settled {
                execution,
                expired: false,
            }) if !execution.status.is_final() => {
                let url = gate.approval_url(&execution.id);
                self.input_required(&execution, &url, state.request_digest)
                    .into()
            }
            Ok(settled) => execution_result(&settled).into(),
            Err(e) => wait_refused(e).into(),
        }
    }

    /// `waiting` (a wait on an execution) in one of the session's wait places, ended
    /// when the client hangs up. rmcp runs each request's handler on a task of its own
    /// and, when the connection goes, only cancels the request's token: a wait nobody
    /// will receive would otherwise run on to its timeout (up to
    /// [`super::MAX_WAIT_SECONDS`], reading the execution every second), and an agent
    /// that sends waits and hangs up could keep any number of them. Past the session's
    /// or the instance's cap the wait is refused `too_many_waits`.
    async fn until_hung_up<T: From<CallToolResult>>(
        &self,
        context: &RequestContext<RoleServer>,
        waiting: impl std::future::Future<Output = T>,
    ) -> T {
        let session = &self.scope.session_id;
        let _place = match self.server.waits.try_take(session) {
            Ok(place) => place,
            Err(full) => {
                let (limit, whose) = match full {
                    Full::Session(limit) => (limit, "this session"),
                    Full::Instance(limit) => (limit, "this threadgate instance"),
                };
                let message = format!(
                    "{whose} already has {limit} waits under way, the most it may have at \
                     once: wait again once one has ended"
                );
                return refused("too_many_waits", &message).into();
            }
        };
        tokio::select! {
            answer = waiting => answer,
            () = context.ct.cancelled() => {
                tracing::debug!(session = %session, "mcp wait ended: its client hung up");
                refused("cancelled", "the client hung up").into()
            }
        }
    }

    async fn wait(&self, args: &JsonObject, mut progress: Option<Progress>) -> CallToolResult {
        let Some(id) = args.get("execution_id").and_then(Value::as_str) else {
            return refused("invalid_arguments", "execution_id (a string) is required");
        };
        let seconds = match args.get("timeout_seconds") {
            None => self.server.settings.wait_default.as_secs(),
            Some(v) => match v.as_u64() {
                Some(s) if s >= 1 => s.min(super::MAX_WAIT_SECONDS),
                _ => {
                    return refused(
                        "invalid_arguments",
                        "timeout_seconds must be a positive integer",
                    );
                }
            },
        };
        let mut watch = ExecutionWatch::new(&self.server.gate, &self.scope.session_id);
        let settled = match watch.load(id).await {
            Ok(exec) => {
                watch
                    .settle(exec, Duration::from_secs(seconds), &mut progress)
                    .await
            }
            Err(e) => Err(e),
        };
        match settled {
            Ok(settled) => execution_result(&settled),
            Err(e) => wait_refused(e),
        }
    }
}

impl ServerHandler for SessionTools {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("threadgate", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(format!(
            "threadgate's gated tools for support thread {}. Every call is decided by policy: \
             it runs, is held for a person (pending_approval: call {WAIT_TOOL} with its \
             execution_id, never retry with other arguments), or is blocked.",
            self.scope.thread_id
        ));
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let progress = Progress::of(&context, self.server.settings.progress_interval);
        if request.name == WAIT_TOOL {
            let args = request.arguments.unwrap_or_default();
            return Ok(self
                .until_hung_up(&context, self.wait(&args, progress))
                .await
                .into());
        }

        let modern = context
            .protocol_version()
            .is_some_and(|v| !v.has_initialize());
        let url_mode = modern
            && context
                .client_capabilities()
                .and_then(|c| c.elicitation)
                .is_some_and(|e| e.url.is_some());
        self.call(request, (url_mode, &context), progress).await
    }
}

/// The gate's answer as a tool result: the REST answer's body (a refusal's with its
/// HTTP status alongside); a held call with what to do next ([`held_result`]).
fn reply_result(reply: CallReply) -> CallToolResult {
    if let CallReply::Held {
        execution,
        approval_url,
    } = &reply
    {
        return held_result(execution, approval_url);
    }
    let (status, answer) = call_answer(reply);
    let mut body = serde_json::to_value(&answer).unwrap_or_default();
    match answer {
        CallAnswer::Ok(_) | CallAnswer::PendingApproval(_) => CallToolResult::structured(body),
        CallAnswer::Failed(_) | CallAnswer::Blocked(_) => CallToolResult::structured_error(body),
        CallAnswer::Error(_) => {
            if let Some(fields) = body.as_object_mut() {
                fields.insert("http_status".into(), json!(status.as_u16()));
            }
            CallToolResult::structured_error(body)
        }
    }
}

/// A held call for a client without URL elicitation: the same fields as the REST
/// 202, the link and id in `_meta` too, and what to do next in the text.
fn held_result(execution: &Execution, approval_url: &str) -> CallToolResult {
    let answer = CallAnswer::PendingApproval(held(execution, approval_url));
    let body = serde_json::to_value(&answer).unwrap_or_default();
    let expires_at = execution.expires_at_ms.map(rfc3339);
    let mut result = CallToolResult::structured(body.clone());
    result.content = vec![rmcp::model::ContentBlock::text(format!(
        "pending_approval: `{}` is held for a person's approval (execution {}; approval \
         link {approval_url}; expires at {}). Nothing has run. Call {WAIT_TOOL} with \
         {{\"execution_id\": \"{}\"}} to get its result; do not retry with other arguments.\n{body}",
        execution.tool,
        execution.id,
        expires_at.as_deref().unwrap_or("never"),
        execution.id,
    ))];
    result.with_meta(Some(held_meta(execution, approval_url)))
}

fn held_meta(execution: &Execution, approval_url: &str) -> MetaObject {
    let mut meta = JsonObject::new();
    meta.insert(format!("{META}/status"), json!("pending_approval"));
    meta.insert(format!("{META}/execution_id"), json!(execution.id));
    meta.insert(format!("{META}/approval_url"), json!(approval_url));
    meta.insert(
        format!("{META}/expires_at"),
        json!(execution.expires_at_ms.map(rfc3339)),
    );
    MetaObject(meta)
}

/// What a wait answers: the execution as the REST API shows it; a call whose approval
/// ran out is `expired` even before the sweeper marks it.
fn execution_result(settled: &Settled) -> CallToolResult {
    let view = settled.view();
    let exec = &settled.execution;
    let failed = matches!(
        exec.status,
        Status::Failed | Status::NeedsCheck | Status::Blocked
    );
    let mut meta = JsonObject::new();
    meta.insert(format!("{META}/execution_id"), json!(exec.id));
    meta.insert(format!("{META}/status"), json!(view.status));
    let body = serde_json::to_value(&view).unwrap_or_default();
    let result = if failed {
        CallToolResult::structured_error(body)
    } else {
        CallToolResult::structured(body)
    };
    result.with_meta(Some(MetaObject(meta)))
}

/// A [`WaitError`] as a refused tool result.
fn wait_refused(e: WaitError) -> CallToolResult {
    let code = match e {
        WaitError::NotFound => "not_found",
        WaitError::Internal => "internal",
    };
    refused(code, &e.to_string())
}

fn refused(code: &str, message: &str) -> CallToolResult {
    CallToolResult::structured_error(json!({"status": code, "error": code, "message": message}))
}
