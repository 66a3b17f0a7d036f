//! The conversation loop: read the thread's events, ask the model, run the tools it
//! chooses, and save the transcript after each turn, so a session stopped for idleness
//! and resumed goes on with the same conversation.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::api::Api;
use crate::calls::{self, Flow, Submitted};
use crate::local;
use crate::prompt::{self, Agent};
use crate::tools::{GatewayTools, split_diagnosis};

/// Model calls in a row that may fail (5xx, transport) before the turn is given up.
const MODEL_RETRIES: u32 = 3;
/// Model turns in one round when the agent sets no limit.
const DEFAULT_MAX_TURNS: u64 = 40;
/// The `max_tokens` of one model answer.
const ANSWER_TOKENS: u64 = 4096;

/// How a round of work on the thread ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundEnd {
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
pub struct Settings {
    pub socket: PathBuf,
    pub workspace: PathBuf,
    /// Seconds of one events long poll.
    pub poll_wait: u64,
    /// Where the events read are journaled for the agent's own tools, if anywhere.
    pub journal: Option<PathBuf>,
}

/// One session's runner.
pub struct Runner {
    api: Api,
    settings: Settings,
    agent: Agent,
    gateway: GatewayTools,
    messages: Vec<Value>,
    events_consumed: i64,
    /// The feed position read so far (events that do not wake the agent included).
    cursor: i64,
    /// Lines of events read but not yet given to the model.
    pending: Vec<String>,
    /// A held call the previous run of the session was waiting on: (index of its tool
    /// message, tool, the 202 body).
    resume_hold: Option<(usize, String, Value)>,
}

impl Runner {
    /// Loads the agent, its tools and the transcript from the socket.
    pub async fn load(settings: Settings) -> anyhow::Result<Runner> {
        let api = Api::new(&settings.socket);
        let agent = api.get("/v1/agent").await.context("GET /v1/agent")?;
        if !agent.ok() {
            bail!("GET /v1/agent: HTTP {} {}", agent.status, agent.body);
        }
        let agent = Agent::from_json(&agent.body);
        let tools = api.get("/v1/tools").await.context("GET /v1/tools")?;
        let gateway = GatewayTools::from_listing(&tools.body);
        let transcript = api
            .get("/v1/transcript")
            .await
            .context("GET /v1/transcript")?;
        let (messages, consumed) = if transcript.ok() {
            (
                transcript.body["messages"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
                transcript.body["events_consumed"].as_i64().unwrap_or(0),
            )
        } else {
            eprintln!(
                "threadgate-agent-runner: no transcript (HTTP {}); starting a new conversation",
                transcript.status
            );
            (Vec::new(), 0)
        };
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
    pub fn agent_name(&self) -> &str {
        &self.agent.name
    }

    /// The conversation so far.
    pub fn messages(&self) -> &[Value] {
        &self.messages
    }

    /// Starts a conversation, or picks up where a stopped session left it: a held call it
    /// was waiting on is waited on again; a call without a saved result gets one saying so.
    fn repair(&mut self) {
        if self.messages.is_empty() {
            self.messages.push(self.agent.system_message());
            return;
        }
        let Some(at) = self.messages.iter().rposition(|m| m["role"] == "assistant") else {
            return;
        };
        let calls = self.messages[at]["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for call in &calls {
            let answered = (at + 1..self.messages.len())
                .find(|&i| self.messages[i]["tool_call_id"] == call["id"]);
            match answered {
                Some(i) => {
                    let content: Value = serde_json::from_str(
                        self.messages[i]["content"].as_str().unwrap_or(""),
                    )
                    .unwrap_or(Value::Null);
                    if content["status"] == "pending_approval" {
                        let tool = content["tool"].as_str().unwrap_or("").to_owned();
                        self.resume_hold = Some((i, tool, content["held"].clone()));
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
    pub async fn resume_pending_hold(&mut self) {
        let Some((i, tool, held)) = self.resume_hold.take() else {
            return;
        };
        let (content, flow) = calls::wait_held(&self.api, &tool, &held).await;
        self.messages[i]["content"] =
            json!(prompt::cap_text(&content.to_string(), TOOL_RESULT_CAP));
        if flow == Flow::Expired {
            self.leave_to_person().await;
            self.messages.push(json!({"role": "assistant", "content": "(the held call expired; the thread is left to a person)"}));
        }
        self.save().await;
    }

    /// Whether the last message waits for the model's answer.
    fn awaiting_model(&self) -> bool {
        matches!(
            self.messages.last().map(|m| m["role"].as_str()),
            Some(Some("user" | "tool"))
        )
    }

    /// Runs until the proxy stops the session: reads events, works the thread when woken.
    pub async fn run(&mut self) -> anyhow::Result<()> {
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
        self.messages.push(json!({"role": "assistant", "content": "(the model could not be reached; waiting for the next message)"}));
        self.save().await;
    }

    /// One long poll of the feed; a customer event becomes a user message.
    pub async fn read_events(&mut self) {
        let path = format!(
            "/v1/events?after={}&wait={}",
            self.cursor, self.settings.poll_wait
        );
        let page = match self.api.get(&path).await {
            Ok(r) if r.ok() => r.body,
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
        for e in page["events"].as_array().into_iter().flatten() {
            self.pending.push(prompt::describe_event(e));
            woke |= prompt::wakes(e["type"].as_str().unwrap_or(""));
        }
        if let Some(next) = page["next"].as_i64() {
            self.cursor = self.cursor.max(next);
        }
        if self.pending.len() > PENDING_CAP {
            let extra = self.pending.len() - PENDING_CAP;
            self.pending.drain(..extra);
        }
        if woke {
            let text = prompt::events_message(&std::mem::take(&mut self.pending));
            self.messages.push(json!({"role": "user", "content": text}));
            self.events_consumed = self.cursor;
            self.save().await;
        }
    }

    /// Asks the model and runs its tools until the turn ends.
    pub async fn round(&mut self) -> RoundEnd {
        let cap = self.agent.max_turns.unwrap_or(DEFAULT_MAX_TURNS).max(1);
        for _ in 0..cap {
            let message = match self.ask_model().await {
                Ok(m) => m,
                Err(end) => return end,
            };
            self.messages.push(message.clone());
            let calls = message["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if calls.is_empty() {
                self.save().await;
                return RoundEnd::Quiet;
            }
            let mut flow = Flow::Continue;
            for call in &calls {
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
    async fn ask_model(&mut self) -> Result<Value, RoundEnd> {
        let mut tools = self.gateway.definitions().to_vec();
        tools.extend(local::definitions());
        let mut request = json!({
            "messages": self.messages,
            "tools": tools,
            "tool_choice": "auto",
            "max_tokens": ANSWER_TOKENS,
        });
        if let Some(model) = &self.agent.model {
            request["model"] = json!(model);
        }
        for attempt in 1..=MODEL_RETRIES {
            match self.api.post("/v1/model/chat/completions", &request).await {
                Ok(r) if r.ok() => {
                    let message = &r.body["choices"][0]["message"];
                    if message.is_object() {
                        return Ok(clean_message(message));
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
    async fn run_tool(&mut self, call: &Value, message: &Value) -> Submitted {
        let name = call["function"]["name"].as_str().unwrap_or("");
        let raw = call["function"]["arguments"].as_str().unwrap_or("{}");
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
            message["content"]
                .as_str()
                .filter(|t| !t.trim().is_empty())
                .map(str::to_owned)
        });
        let findings = self.findings_file();
        calls::submit(&self.api, &tool, args, diagnosis, findings.as_deref()).await
    }

    /// Where held calls' diagnoses are written: `.threadgate/findings.md` in the
    /// workspace, when the workspace (not a symlink out of it) is there.
    fn findings_file(&self) -> Option<PathBuf> {
        local::confine(&self.settings.workspace, ".threadgate/findings.md").ok()
    }

    /// Saves the conversation with the held call marked pending (a session stopped now
    /// waits on it again when resumed), then waits for the person's decision.
    async fn wait_for_person(&mut self, call: &Value, held: Value) -> (Value, Flow) {
        let tool = self
            .gateway
            .resolve(call["function"]["name"].as_str().unwrap_or(""))
            .unwrap_or("")
            .to_owned();
        let marker = json!({"status": "pending_approval", "tool": tool, "held": held});
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
        let (result, _) = calls::call(&self.api, "helpdesk.add_note", args, None, None).await;
        eprintln!(
            "threadgate-agent-runner: note on expiry: {}",
            result["status"]
        );
    }

    /// `PUT /v1/transcript`; a failure is logged, the conversation goes on in memory.
    /// Above the server's size cap (413), the oldest tool results are elided (here and
    /// in the conversation the model sees next) until it fits.
    pub async fn save(&mut self) {
        loop {
            let body = json!({"messages": self.messages, "events_consumed": self.events_consumed});
            match self.api.put("/v1/transcript", &body).await {
                Ok(r) if r.status == 413 && self.elide_oldest_results() => continue,
                other => return report_save(other),
            }
        }
    }

    /// Replaces the oldest half of the not-yet-elided tool results; false when none is left.
    fn elide_oldest_results(&mut self) -> bool {
        let open: Vec<usize> = (0..self.messages.len())
            .filter(|&i| {
                self.messages[i]["role"] == "tool" && self.messages[i]["content"] != ELIDED
            })
            .collect();
        if open.is_empty() {
            return false;
        }
        for &i in &open[..open.len().div_ceil(2)] {
            self.messages[i]["content"] = json!(ELIDED);
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
fn journal_events(path: &std::path::Path, page: &Value) {
    use std::io::Write;
    if page["events"].as_array().is_none_or(|e| e.is_empty()) {
        return;
    }
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    let line = format!("{page}\n");
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

/// Keeps what a chat message needs: role, content, tool calls.
fn clean_message(m: &Value) -> Value {
    let mut out = json!({"role": "assistant", "content": m["content"].clone()});
    if let Some(calls) = m["tool_calls"].as_array().filter(|c| !c.is_empty()) {
        out["tool_calls"] = json!(calls);
    }
    out
}

fn tool_message(call: &Value, content: Value) -> Value {
    json!({
        "role": "tool",
        "tool_call_id": call["id"].as_str().unwrap_or(""),
        "content": prompt::cap_text(&content.to_string(), TOOL_RESULT_CAP),
    })
}

fn error_result(message: String) -> Value {
    json!({"status": "error", "error": message})
}
