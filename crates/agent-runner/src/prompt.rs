//! What the model is told: the agent's instructions and skills as the system message,
//! and the thread's events as user messages.

use serde::Deserialize;
use serde_json::Value;
use threadgate_api::{AgentView, ChatMessage, FeedEvent, Role};

/// The most characters of one event's text given to the model.
const EVENT_TEXT_CAP: usize = 6000;
/// The largest user message made of events (bytes); older events are left out.
const EVENTS_MESSAGE_CAP: usize = 32 * 1024;

/// `text` cut to at most `max` bytes (at a character boundary), saying how much was cut.
pub(crate) fn cap_text(text: &str, max: usize) -> String {
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
pub(crate) fn events_message(lines: &[String]) -> String {
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

/// The system message that opens a conversation: the agent's instructions, what this
/// session is, and its skills.
pub(crate) fn system_message(agent: &AgentView) -> ChatMessage {
    let mut text = String::new();
    text.push_str(agent.instructions.trim());
    text.push_str(&format!(
        "\n\n# This session\nYou work Plain thread `{}`. Tools named `workspace__*` act on \
         the code checked out in /workspace inside your sandbox (what you write there lands \
         on the thread's branch). Every other tool goes through threadgate's gateway, whose \
         policy runs it, holds it for a person, or blocks it. Give every gateway call a \
         `diagnosis`: what you found and why. A held call is waited on for you: you get the \
         person's decision as the tool's result. Never retry a held or blocked call with \
         other arguments. You are done with a turn of the conversation when you have replied \
         to the customer (helpdesk__reply_to_thread) or escalated.",
        agent.thread_id
    ));
    for skill in &agent.skills {
        text.push_str(&format!(
            "\n\n# Skill: {}\n{}\n\n{}",
            skill.name,
            skill.description,
            skill.body.trim()
        ));
    }
    ChatMessage::text(Role::System, text)
}

/// Whether an event of this type is something the customer did, which wakes the agent.
pub(crate) fn wakes(event_type: &str) -> bool {
    event_type == "thread.thread_created" || event_type.ends_with("_received")
}

/// One feed event as a line for the model: its type and the text the customer (or a
/// person) wrote, else the thread's title and preview, else the whole payload.
pub(crate) fn describe_event(e: &FeedEvent) -> String {
    let payload = Envelope::deserialize(&e.event)
        .map(|envelope| envelope.payload)
        .unwrap_or_default();
    let text = Payload::deserialize(&payload)
        .ok()
        .and_then(Payload::text)
        .unwrap_or_else(|| payload.to_string());
    let text: String = text.chars().take(EVENT_TEXT_CAP).collect();
    format!("[{}] {text}", e.event_type)
}

/// A Plain webhook event: only its payload is read.
#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    payload: Value,
}

/// The parts of a Plain event's payload that carry what someone wrote.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Payload {
    email: Option<Email>,
    chat: Option<Message>,
    slack_message: Option<Message>,
    ms_teams_message: Option<Message>,
    discord_message: Option<Message>,
    note: Option<Message>,
    thread: Option<ThreadPreview>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Email {
    text_content: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    text: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ThreadPreview {
    title: Option<String>,
    preview_text: Option<String>,
}

impl Payload {
    /// The first text written, in the order of the channels; else the thread's title and
    /// preview.
    fn text(self) -> Option<String> {
        let email = self.email.and_then(|e| e.text_content);
        let messages = [
            self.chat,
            self.slack_message,
            self.ms_teams_message,
            self.discord_message,
            self.note,
        ];
        email
            .or_else(|| messages.into_iter().flatten().find_map(|m| m.text))
            .or_else(|| {
                let thread = self.thread?;
                let title = thread.title?;
                Some(format!(
                    "{title}\n{}",
                    thread.preview_text.unwrap_or_default()
                ))
            })
    }
}
