//! What the model is told: the agent's instructions and skills as the system message,
//! and the thread's events as user messages.

use serde_json::{Value, json};

/// The most characters of one event's text given to the model.
const EVENT_TEXT_CAP: usize = 6000;
/// The largest user message made of events (bytes); older events are left out.
const EVENTS_MESSAGE_CAP: usize = 32 * 1024;

/// `text` cut to at most `max` bytes (at a character boundary), saying how much was cut.
pub fn cap_text(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[... {} bytes cut]", &text[..end], text.len() - end)
}

/// The user message for newly read events: the most recent that fit the cap.
pub fn events_message(lines: &[String]) -> String {
    let mut kept = Vec::new();
    let mut size = 0;
    for line in lines.iter().rev() {
        if size + line.len() > EVENTS_MESSAGE_CAP && !kept.is_empty() {
            break;
        }
        size += line.len();
        kept.push(cap_text(line, EVENTS_MESSAGE_CAP));
    }
    kept.reverse();
    let left_out = lines.len() - kept.len();
    let mut text = String::from("New on the thread:\n");
    if left_out > 0 {
        text.push_str(&format!("[{left_out} earlier events left out]\n\n"));
    }
    text.push_str(&kept.join("\n\n"));
    text
}

/// The agent as `GET /v1/agent` describes it.
#[derive(Debug, Clone, Default)]
pub struct Agent {
    pub name: String,
    pub model: Option<String>,
    pub instructions: String,
    pub thread_id: String,
    pub max_turns: Option<u64>,
    /// `(name, description, body)` of each skill.
    pub skills: Vec<(String, String, String)>,
}

impl Agent {
    /// Reads `GET /v1/agent`'s body; missing fields are empty.
    pub fn from_json(v: &Value) -> Agent {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let skills = v["skills"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|k| {
                // `body` per the agent interface; `text` is what older servers sent.
                let body = k["body"].as_str().or(k["text"].as_str()).unwrap_or("");
                (s(&k["name"]), s(&k["description"]), body.to_owned())
            })
            .collect();
        Agent {
            name: s(&v["name"]),
            model: v["model"].as_str().map(str::to_owned),
            instructions: s(&v["instructions"]),
            thread_id: s(&v["thread_id"]),
            max_turns: v["limits"]["max_turns"].as_u64(),
            skills,
        }
    }

    /// The system message that opens a conversation.
    pub fn system_message(&self) -> Value {
        let mut text = String::new();
        text.push_str(self.instructions.trim());
        text.push_str(&format!(
            "\n\n# This session\nYou work Plain thread `{}`. Tools named `workspace__*` act on \
             the code checked out in /workspace inside your sandbox (what you write there lands \
             on the thread's branch). Every other tool goes through threadgate's gateway, whose \
             policy runs it, holds it for a person, or blocks it. Give every gateway call a \
             `diagnosis`: what you found and why. A held call is waited on for you: you get the \
             person's decision as the tool's result. Never retry a held or blocked call with \
             other arguments. You are done with a turn of the conversation when you have replied \
             to the customer (helpdesk__reply_to_thread) or escalated.",
            self.thread_id
        ));
        for (name, description, body) in &self.skills {
            text.push_str(&format!(
                "\n\n# Skill: {name}\n{description}\n\n{}",
                body.trim()
            ));
        }
        json!({"role": "system", "content": text})
    }
}

/// Whether an event of this type is something the customer did, which wakes the agent.
pub fn wakes(event_type: &str) -> bool {
    event_type == "thread.thread_created" || event_type.ends_with("_received")
}

/// One feed event (`{"position","type","event"}`) as a line for the model.
pub fn describe_event(e: &Value) -> String {
    let ty = e["type"].as_str().unwrap_or("event");
    let p = &e["event"]["payload"];
    let text = [
        &p["email"]["textContent"],
        &p["chat"]["text"],
        &p["slackMessage"]["text"],
        &p["msTeamsMessage"]["text"],
        &p["discordMessage"]["text"],
        &p["note"]["text"],
    ]
    .into_iter()
    .find_map(|v| v.as_str())
    .map(str::to_owned)
    .or_else(|| {
        let t = &p["thread"];
        t["title"].as_str().map(|title| {
            let preview = t["previewText"].as_str().unwrap_or("");
            format!("{title}\n{preview}")
        })
    })
    .unwrap_or_else(|| p.to_string());
    let text: String = text.chars().take(EVENT_TEXT_CAP).collect();
    format!("[{ty}] {text}")
}
