//! The internal note a held call puts on its thread: the approval link first, then the
//! call with redacted arguments and the rule that held it, then the agent's diagnosis
//! (labelled as the agent's, quoted line by line). Each note carries a marker so the
//! outbox can find it on the thread after a crash instead of posting it twice.
//!
//! Agent-written text never makes a line of its own: every line ending an agent could
//! use (`\r\n`, a bare `\r`, U+0085, U+2028, U+2029, vertical tab, form feed) is
//! normalised before the text is quoted, and in Markdown every ASCII punctuation mark
//! of it is escaped, so no link, heading or emphasis of the agent's is rendered.
//!
//! The marker is keyed: besides the execution id it holds a random key made when the
//! note is queued and kept only in the outbox's row. An agent knows its execution ids
//! and can write notes on its thread, but cannot write a note the outbox would take
//! for the real one.

use rand::Rng as _;
use serde_json::Value;

use crate::executions::store::{Execution, OutboxNote};
use crate::money::Currency;
use crate::secrets::Redactor;
use crate::session::agent_text::one_line;
pub use crate::session::agent_text::{agent_lines, escape_markdown};

/// The line that names a note's execution for people reading the thread (and the
/// start of its marker).
pub fn reference(execution_id: &str) -> String {
    format!("threadgate-execution: {execution_id}")
}

/// A new marker for the note of `execution_id`: its [`reference`] and a random key
/// that no one outside the orchestrator has seen before the note is posted.
pub fn new_marker(execution_id: &str) -> String {
    let mut key = [0u8; 16];
    rand::rng().fill_bytes(&mut key);
    format!("{} note-key {}", reference(execution_id), hex::encode(key))
}

/// Builds the note for a held call.
pub fn held_note(
    exec: &Execution,
    redacted_args: &Value,
    rule: &str,
    approval_url: &str,
    redactor: &Redactor,
) -> OutboxNote {
    let diagnosis = exec
        .diagnosis
        .as_deref()
        .map(|d| redactor.redact(d).into_owned());
    let lines = match &diagnosis {
        Some(d) => agent_lines(d),
        None => vec!["(the agent gave no diagnosis)".to_owned()],
    };
    let rule = one_line(rule);
    let marker = new_marker(&exec.id);
    let quoted_md: String = lines
        .iter()
        .map(|l| format!("> {}\n", escape_markdown(l)))
        .collect();
    let quoted_text: String = lines.iter().map(|l| format!("> {l}\n")).collect();
    let args = json_on_lines(&serde_json::to_string_pretty(redacted_args).unwrap_or_default());
    let rows = call_rows(&exec.tool, redacted_args);
    let table_md: String = rows
        .iter()
        .map(|(name, value)| format!("| {name} | {} |\n", escape_markdown(value)))
        .collect();
    let table_text: String = rows
        .iter()
        .map(|(name, value)| format!("    {name}: {value}\n"))
        .collect();
    let markdown = format!(
        "**A call is waiting for a person's approval**\n\n\
         **Approve or deny:** {approval_url}\n\n\
         **The call:**\n\n| | |\n| --- | --- |\n{table_md}\n\
         Its arguments, as sent:\n\n```json\n{args}\n```\n\n\
         **Held by:** {rule_md}\n\n\
         **The agent's diagnosis** (written by the agent, not verified):\n\n{quoted_md}\n\
         _{marker}_\n",
        rule_md = escape_markdown(&rule),
    );
    let indented: String = args.lines().map(|l| format!("    {l}\n")).collect();
    let text = format!(
        "A call is waiting for a person's approval.\n\
         Approve or deny: {approval_url}\n\n\
         The call:\n{table_text}\
         Its arguments, as sent:\n{indented}\
         Held by: {rule}\n\n\
         The agent's diagnosis (written by the agent, not verified):\n{quoted_text}\n\
         {marker}\n",
    );
    OutboxNote {
        execution_id: exec.id.clone(),
        thread_id: exec.thread_id.clone(),
        marker,
        text,
        markdown,
        attempts: 0,
    }
}

/// The most characters of one value the call's table shows (the JSON below it has all).
const CELL_CHARS: usize = 120;

/// The call as a reviewer reads it first: the tool, and where the arguments have them
/// the amount in the currency's units, the customer, the charge and the reason. Each
/// value is on one line and at most [`CELL_CHARS`] long; the agent wrote it, so the
/// Markdown escapes it like the diagnosis.
fn call_rows(tool: &str, args: &Value) -> Vec<(&'static str, String)> {
    let text = |names: &[&str]| {
        names.iter().find_map(|name| match args.get(*name)? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
    };
    let amount =
        args.get("amount")
            .and_then(Value::as_i64)
            .map(|minor| match Currency::of_args(args) {
                Some(currency) => currency.format(minor),
                None => format!("{minor} (in the smallest unit; no currency given)"),
            });
    let rows = [
        ("Tool", Some(tool.to_owned())),
        ("Amount", amount),
        ("Customer", text(&["customer", "customer_email", "email"])),
        ("Charge", text(&["charge", "payment_intent"])),
        ("Reason", text(&["reason"])),
    ];
    rows.into_iter()
        .filter_map(|(name, value)| Some((name, cell(&value?))))
        .collect()
}

/// `value` on one line, cut at [`CELL_CHARS`] characters.
fn cell(value: &str) -> String {
    let line = one_line(value);
    match line.char_indices().nth(CELL_CHARS) {
        Some((cut, _)) => format!("{}…", line.get(..cut).unwrap_or_default()),
        None => line,
    }
}

/// JSON text with the line breaks serde_json leaves raw inside strings (U+0085, U+2028,
/// U+2029) written as escapes, so a value cannot end a line of the note. Valid JSON
/// still: outside strings serde_json writes none of them.
fn json_on_lines(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '\u{85}' | '\u{2028}' | '\u{2029}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
#[path = "held_tests.rs"]
mod tests;
