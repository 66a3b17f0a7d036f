//! The conversation loop: read the thread's events, ask the model, run the tools it
//! chooses, and save the transcript after each turn, so a session stopped for idleness
//! and resumed goes on with the same conversation.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use threadgate_api::{
    AgentView, ChatAnswer, ChatMessage, ChatRequest, CheckpointAnswer, ErrorAnswer, EventsPage,
    Held, Role, ToolCall, ToolListing, Transcript,
};

use crate::api::Api;
use crate::calls::{self, Flow, Submitted};
use crate::local;
use crate::prompt;
use crate::tools::{GatewayTools, split_diagnosis};

/// Model calls in a row that may fail (5xx, transport) before the turn is given up.
const MODEL_RETRIES: u32 = 3;
/// Model turns in one round when the agent sets no limit.
const DEFAULT_MAX_TURNS: u64 = 40;
/// The `max_tokens` of one model answer.
const ANSWER_TOKENS: u64 = 4096;

/// How a round of work on the thread ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RoundEnd {
    /// Replied or escalated.
    Done,
    /// The model answered without calling a tool.
    Quiet,
    /// A held call expired: left to a person.
    LeftToPerson,
    /// The model proxy stopped the session (its budget is spent, 429; or a stored
    /// secret reached the prompt, 403 `secret_in_prompt`): the thread has the proxy's
    /// note and a person takes over, so the runner stops working.
    Stopped,
    /// The model could not be reached, or refused the conversation.
    ModelFailed,
    /// The round reached the runner's own turn cap.
    TurnCap,
}

/// Where the runner works.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub socket: PathBuf,
    pub workspace: PathBuf,
    /// Seconds of one events long poll.
    pub poll_wait: u64,
    /// Where the events read are journaled for the agent's own tools, if anywhere.
    pub journal: Option<PathBuf>,
}

/// One session's runner.
pub(crate) struct Runner {
    api: Api,
    settings: Settings,
    agent: AgentView,
    gateway: GatewayTools,
    messages: Vec<ChatMessage>,
    events_consumed: i64,
    /// The feed position read so far (events that do not wake the agent included).
    cursor: i64,
    /// Lines of events read but not yet given to the model.
    pending: Vec<String>,
    /// A held call the previous run of the session was waiting on: (index of its tool
    /// message, tool, the 202 answer).
    resume_hold: Option<(usize, String, Held)>,
}

/// The content of a held call's tool message while it waits for a person: saved with
/// the transcript, so a resumed session waits on the same call again.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum HoldMarker {
    PendingApproval { held: Held, tool: String },
}

impl Runner {
    /// Loads the agent, its tools and the transcript from the socket.
    pub(crate) async fn load(settings: Settings) -> anyhow::Result<Runner> {
        let api = Api::new(&settings.socket);
        let agent = api.get("/v1/agent").await.context("GET /v1/agent")?;
        if !agent.ok() {
            bail!("GET /v1/agent: HTTP {} {}", agent.status, agent.body);
        }
        let agent: AgentView = agent.read()?;
        let tools = api.get("/v1/tools").await.context("GET /v1/tools")?;
        let listing = tools.read::<ToolListing>().unwrap_or_else(|e| {
            eprintln!("threadgate-agent-runner: GET /v1/tools: {e:#}; no gateway tools");
            ToolListing::default()
        });
        let gateway = GatewayTools::from_listing(&listing);
        let transcript = api
            .get("/v1/transcript")
            .await
            .context("GET /v1/transcript")?;
        let saved = if transcript.ok() {
            transcript.read::<Transcript>()
        } else {
            Err(anyhow::anyhow!("HTTP {}", transcript.status))
        };
        let Transcript {
            messages,
            events_consumed: consumed,
        } = saved.unwrap_or_else(|e| {
            eprintln!(
                "threadgate-agent-runner: no transcript ({e:#}); starting a new conversation"
            );
            Transcript::default()
        });
        let mut runner = Runner {
            api,
            settings,
            agent,
            gateway,
            messages,
            events_consumed: consumed,
            cursor: consumed,
            pending: Vec::new(),
            resume_hold: None,
        };
        runner.repair();
        Ok(runner)
    }

    /// The agent's name.
    pub(crate) fn agent_name(&self) -> &str {
        &self.agent.name
    }

    /// The conversation so far.
    pub(crate) fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// Starts a conversation, or picks up where a stopped session left it: a held call it
    /// was waiting on is waited on again; a call without a saved result gets one saying so.
    fn repair(&mut self) {
        if self.messages.is_empty() {
            self.messages.push(prompt::system_message(&self.agent));
            return;
        }
        let Some(at) = self
            .messages
            .iter()
            .rposition(|m| m.role == Role::Assistant)
        else {
            return;
        };
        let calls = self
            .messages
            .get(at)
            .map(|m| m.tool_calls.clone())
            .unwrap_or_default();
        for call in &calls {
            let answered = self
                .messages
                .iter()
                .enumerate()
                .skip(at + 1)
                .find(|(_, m)| m.tool_call_id.as_deref() == Some(&call.id))
                .map(|(i, _)| i);
            match answered {
                Some(i) => {
                    let content = self
                        .messages
                        .get(i)
                        .and_then(|m| m.content.as_deref())
                        .unwrap_or("");
                    if let Ok(HoldMarker::PendingApproval { held, tool }) =
                        serde_json::from_str(content)
                    {
                        self.resume_hold = Some((i, tool, held));
                    }
                }
                None => self.messages.push(tool_message(
                    call,
                    json!({"status": "interrupted", "note": "The session stopped before this call's result was saved; whether it ran is unknown. Check before calling again."}),
                )),
            }
        }
    }

    /// Waits again on the held call a stopped session was waiting on, if any.
    pub(crate) async fn resume_pending_hold(&mut self) {
        let Some((i, tool, held)) = self.resume_hold.take() else {
            return;
        };
        let (content, flow) = calls::wait_held(&self.api, &tool, &held).await;
        if let Some(m) = self.messages.get_mut(i) {
            m.content = Some(prompt::cap_text(&content.to_string(), TOOL_RESULT_CAP));
        }
        if flow == Flow::Expired {
            self.leave_to_person().await;
            self.messages.push(ChatMessage::text(
                Role::Assistant,
                "(the held call expired; the thread is left to a person)",
            ));
        }
        self.save().await;
    }

    /// Whether the last message waits for the model's answer.
    fn awaiting_model(&self) -> bool {
        matches!(
            self.messages.last().map(|m| m.role),
            Some(Role::User | Role::Tool)
        )
    }

    /// Runs until the proxy stops the session: reads events, works the thread when woken.
    pub(crate) async fn run(&mut self) -> anyhow::Result<()> {
        self.resume_pending_hold().await;
        loop {
            if !self.awaiting_model() {
                self.read_events().await;
            }
            if self.awaiting_model() {
                let end = self.round().await;
                eprintln!("threadgate-agent-runner: round ended: {end:?}");
                if end == RoundEnd::Stopped {
                    return Ok(());
                }
                if end == RoundEnd::ModelFailed {
                    // The last message still waits for an answer; do not spin on it.
                    self.park_last_turn().await;
                }
            }
        }
    }

    /// After a failed round the conversation waits for the next customer event.
    async fn park_last_turn(&mut self) {
        self.messages.push(ChatMessage::text(
            Role::Assistant,
            "(the model could not be reached; waiting for the next message)",
        ));
        self.save().await;
    }

    /// One long poll of the feed; a customer event becomes a user message.
    pub(crate) async fn read_events(&mut self) {
        let path = format!(
            "/v1/events?after={}&wait={}",
            self.cursor, self.settings.poll_wait
        );
        let page = match self.api.get(&path).await {
            Ok(r) if r.ok() => match r.read::<EventsPage>() {
                Ok(page) => page,
                Err(e) => {
                    eprintln!("threadgate-agent-runner: events: {e:#}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    return;
                }
            },
            Ok(r) => {
                eprintln!("threadgate-agent-runner: events: HTTP {}", r.status);
                tokio::time::sleep(Duration::from_secs(1)).await;
                return;
            }
            Err(e) => {
                eprintln!("threadgate-agent-runner: events: {e:#}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                return;
            }
        };
        let mut woke = false;
        if let Some(journal) = &self.settings.journal {
            journal_events(journal, &page);
        }
        for e in &page.events {
            self.pending.push(prompt::describe_event(e));
            woke |= prompt::wakes(&e.event_type);
        }
        self.cursor = self.cursor.max(page.next);
        if self.pending.len() > PENDING_CAP {
            let extra = self.pending.len() - PENDING_CAP;
            self.pending.drain(..extra);
        }
        if woke {
            let text = prompt::events_message(&std::mem::take(&mut self.pending));
            self.messages.push(ChatMessage::text(Role::User, text));
            self.events_consumed = self.cursor;
            self.save().await;
        }
    }

    /// Asks the model and runs its tools until the turn ends.
    pub(crate) async fn round(&mut self) -> RoundEnd {
        let cap = self
            .agent
            .limits
            .map_or(DEFAULT_MAX_TURNS, |l| l.max_turns)
            .max(1);
        for _ in 0..cap {
            let message = match self.ask_model().await {
                Ok(m) => m,
                Err(end) => return end,
            };
            self.messages.push(message.clone());
            let calls = &message.tool_calls;
            if calls.is_empty() {
                self.save().await;
                return RoundEnd::Quiet;
            }
            let mut flow = Flow::Continue;
            for call in calls {
                if flow == Flow::Expired {
                    self.messages.push(tool_message(
                        call,
                        json!({"status": "not_run", "note": "The session stopped before this call."}),
                    ));
                    continue;
                }
                let (content, f) = match self.run_tool(call, &message).await {
                    Submitted::Final(content, f) => (content, f),
                    Submitted::Held(held) => self.wait_for_person(call, held).await,
                };
                self.messages.push(tool_message(call, content));
                if f != Flow::Continue {
                    flow = f;
                }
            }
            self.save().await;
            match flow {
                Flow::Done => return RoundEnd::Done,
                Flow::Expired => {
                    self.leave_to_person().await;
                    return RoundEnd::LeftToPerson;
                }
                Flow::Continue => {}
            }
        }
        RoundEnd::TurnCap
    }

    /// `POST /v1/model/chat/completions`, retried on 5xx and transport errors.
    async fn ask_model(&mut self) -> Result<ChatMessage, RoundEnd> {
        let mut tools = self.gateway.definitions().to_vec();
        tools.extend(local::definitions());
        let request = ChatRequest {
            max_tokens: ANSWER_TOKENS,
            messages: self.messages.clone(),
            model: self.agent.model.clone(),
            tool_choice: "auto".to_owned(),
            tools,
        };
        for attempt in 1..=MODEL_RETRIES {
            match self.api.post("/v1/model/chat/completions", &request).await {
                Ok(r) if r.ok() => {
                    let answer = r.read::<ChatAnswer>();
                    if let Some(choice) = answer.ok().and_then(|a| a.choices.into_iter().next()) {
                        return Ok(clean_message(choice.message));
                    }
                    eprintln!(
                        "threadgate-agent-runner: model answer without a message (attempt {attempt})"
                    );
                }
                Ok(r) if r.status == 429 => {
                    eprintln!("threadgate-agent-runner: model budget exhausted: stopping");
                    return Err(RoundEnd::Stopped);
                }
                Ok(r) if r.code() == "secret_in_prompt" => {
                    // Resending the same conversation would only be refused again.
                    eprintln!(
                        "threadgate-agent-runner: a stored secret reached the prompt: stopping"
                    );
                    return Err(RoundEnd::Stopped);
                }
                Ok(r) if r.status < 500 => {
                    eprintln!(
                        "threadgate-agent-runner: model call refused: HTTP {} {}",
                        r.status,
                        r.code()
                    );
                    return Err(RoundEnd::ModelFailed);
                }
                Ok(r) => eprintln!(
                    "threadgate-agent-runner: model call failed: HTTP {} {} (attempt {attempt})",
                    r.status,
                    r.code()
                ),
                Err(e) => {
                    eprintln!(
                        "threadgate-agent-runner: model call failed: {e:#} (attempt {attempt})"
                    )
                }
            }
            tokio::time::sleep(Duration::from_millis(500 * u64::from(attempt))).await;
        }
        Err(RoundEnd::ModelFailed)
    }

    /// Runs one tool call; garbage (bad JSON, unknown names) becomes an error result.
    async fn run_tool(&mut self, call: &ToolCall, message: &ChatMessage) -> Submitted {
        let name = call.function.name.as_str();
        let raw = call.function.arguments.as_str();
        let args: Value = match serde_json::from_str(if raw.trim().is_empty() { "{}" } else { raw })
        {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                return Submitted::Final(
                    error_result(format!("the arguments of `{name}` must be a JSON object")),
                    Flow::Continue,
                );
            }
            Err(e) => {
                eprintln!("threadgate-agent-runner: invalid JSON arguments for {name:?}");
                return Submitted::Final(
                    error_result(format!(
                        "the arguments of `{name}` are not valid JSON ({e}); nothing ran"
                    )),
                    Flow::Continue,
                );
            }
        };
        if name == local::CHECKPOINT {
            return Submitted::Final(self.checkpoint().await, Flow::Continue);
        }
        if let Some(result) = local::run(&self.settings.workspace, name, &args).await {
            eprintln!(
                "threadgate-agent-runner: local tool {name}: {}",
                if result.is_ok() { "ok" } else { "error" }
            );
            return match result {
                Ok(v) => Submitted::Final(v, Flow::Continue),
                Err(e) => Submitted::Final(error_result(format!("{e:#}")), Flow::Continue),
            };
        }
        let Some(tool) = self.gateway.resolve(name).map(str::to_owned) else {
            eprintln!("threadgate-agent-runner: unknown tool {name:?}");
            let mut known: Vec<String> = self.gateway.names().map(str::to_owned).collect();
            known.extend(local::definitions_names().map(str::to_owned));
            return Submitted::Final(
                error_result(format!(
                    "there is no tool `{name}`; nothing ran. The tools are: {}",
                    known.join(", ")
                )),
                Flow::Continue,
            );
        };
        let (args, diagnosis) = split_diagnosis(args);
        let diagnosis = diagnosis.or_else(|| {
            message
                .content
                .as_deref()
                .filter(|t| !t.trim().is_empty())
                .map(str::to_owned)
        });
        let findings = self.findings_file();
        calls::submit(&self.api, &tool, args, diagnosis, findings.as_deref()).await
    }

    /// `POST /v1/checkpoint`: threadgate's answer as the tool's result; a refusal (too
    /// soon, busy) or a failure as an error result the model can read.
    async fn checkpoint(&self) -> Value {
        let reply = match self.api.post("/v1/checkpoint", &json!({})).await {
            Ok(reply) => reply,
            Err(e) => return error_result(format!("{e:#}")),
        };
        eprintln!("threadgate-agent-runner: checkpoint: HTTP {}", reply.status);
        if !reply.ok() {
            let message = reply
                .read::<ErrorAnswer>()
                .map(|e| e.body().message.clone())
                .unwrap_or_default();
            return error_result(format!("no checkpoint taken ({}): {message}", reply.code()));
        }
        match reply.read::<CheckpointAnswer>() {
            Ok(answer) => json!({"status": "ok", "checkpoint": answer}),
            Err(e) => error_result(format!("{e:#}")),
        }
    }

    /// Where held calls' diagnoses are written: `.threadgate/findings.md` in the
    /// workspace, when the workspace (not a symlink out of it) is there.
    fn findings_file(&self) -> Option<PathBuf> {
        local::confine(&self.settings.workspace, ".threadgate/findings.md").ok()
    }

    /// Saves the conversation with the held call marked pending (a session stopped now
    /// waits on it again when resumed), then waits for the person's decision.
    async fn wait_for_person(&mut self, call: &ToolCall, held: Held) -> (Value, Flow) {
        let tool = self
            .gateway
            .resolve(&call.function.name)
            .unwrap_or("")
            .to_owned();
        let marker = HoldMarker::PendingApproval {
            held: held.clone(),
            tool: tool.clone(),
        };
        let marker = serde_json::to_value(&marker).unwrap_or(Value::Null);
        self.messages.push(tool_message(call, marker));
        self.save().await;
        self.messages.pop();
        calls::wait_held(&self.api, &tool, &held).await
    }

    /// A held call expired: a note for the person who takes the thread over.
    async fn leave_to_person(&mut self) {
        if !self.gateway.has("helpdesk.add_note") {
            return;
        }
        let args = json!({
            "thread_id": self.agent.thread_id,
            "text": "The agent's held call expired without a decision; the agent stopped. A person needs to take this thread over.",
        });
        // The call's answer is logged with the gateway call.
        let _ = calls::call(&self.api, "helpdesk.add_note", args, None, None).await;
    }

    /// `PUT /v1/transcript`; a failure is logged, the conversation goes on in memory.
    /// Above the server's size cap (413), the oldest tool results are elided (here and
    /// in the conversation the model sees next) until it fits.
    pub(crate) async fn save(&mut self) {
        loop {
            let body = Transcript {
                events_consumed: self.events_consumed,
                messages: self.messages.clone(),
            };
            match self.api.put("/v1/transcript", &body).await {
                Ok(r) if r.status == 413 && self.elide_oldest_results() => continue,
                other => return report_save(other),
            }
        }
    }

    /// Replaces the oldest half of the not-yet-elided tool results; false when none is left.
    fn elide_oldest_results(&mut self) -> bool {
        let open: Vec<usize> = self
            .messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == Role::Tool && m.content.as_deref() != Some(ELIDED))
            .map(|(i, _)| i)
            .collect();
        if open.is_empty() {
            return false;
        }
        for &i in open.iter().take(open.len().div_ceil(2)) {
            if let Some(m) = self.messages.get_mut(i) {
                m.content = Some(ELIDED.to_owned());
            }
        }
        eprintln!("threadgate-agent-runner: transcript over the cap; older tool results elided");
        true
    }
}

/// What an elided tool result says.
const ELIDED: &str = "[elided: the transcript reached its size cap]";
/// Events read while the agent sleeps that are kept for its next wake.
const PENDING_CAP: usize = 200;
/// The largest tool result given to the model (bytes of its JSON text).
const TOOL_RESULT_CAP: usize = 32 * 1024;

fn report_save(reply: anyhow::Result<crate::api::Reply>) {
    match reply {
        Ok(r) if r.ok() => {}
        Ok(r) => eprintln!(
            "threadgate-agent-runner: transcript not saved: HTTP {} {}",
            r.status,
            r.code()
        ),
        Err(e) => eprintln!("threadgate-agent-runner: transcript not saved: {e:#}"),
    }
}

/// The largest the events journal grows; past it, pages are no longer appended.
const JOURNAL_CAP: u64 = 4 * 1024 * 1024;

/// Appends a non-empty events page to the journal (one JSON line), within its cap.
fn journal_events(path: &std::path::Path, page: &EventsPage) {
    use std::io::Write;
    if page.events.is_empty() {
        return;
    }
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    let Ok(mut line) = serde_json::to_string(page) else {
        return;
    };
    line.push('\n');
    if size + line.len() as u64 > JOURNAL_CAP {
        return;
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("threadgate-agent-runner: events journal: {e}");
    }
}

/// Keeps what the model's answer needs in the conversation: its content and tool
/// calls, as the assistant's.
fn clean_message(m: ChatMessage) -> ChatMessage {
    ChatMessage {
        content: m.content,
        role: Role::Assistant,
        tool_call_id: None,
        tool_calls: m.tool_calls,
    }
}

fn tool_message(call: &ToolCall, content: Value) -> ChatMessage {
    ChatMessage::tool_result(
        call.id.clone(),
        prompt::cap_text(&content.to_string(), TOOL_RESULT_CAP),
    )
}

fn error_result(message: String) -> Value {
    json!({"status": "error", "error": message})
}
