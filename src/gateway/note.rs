//! The internal note a held call puts on its thread: the agent's diagnosis (labelled as
//! the agent's), the call with redacted arguments, the rule that held it and the
//! approval link. Each note carries a marker with its execution id so the outbox can
//! find it on the thread after a crash instead of posting it twice.

use serde_json::Value;

use crate::executions::store::{Execution, OutboxNote};
use crate::secrets::Redactor;

/// The marker line that identifies a note's execution on the thread's timeline.
pub fn marker(execution_id: &str) -> String {
    format!("threadgate-execution: {execution_id}")
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
        .map(|d| redactor.redact(d).into_owned())
        .unwrap_or_else(|| "(the agent gave no diagnosis)".into());
    let args = serde_json::to_string_pretty(redacted_args).unwrap_or_default();
    let marker = marker(&exec.id);
    let quoted: String = diagnosis.lines().map(|l| format!("> {l}\n")).collect();
    let markdown = format!(
        "**A call is waiting for a person's approval**\n\n\
         **The agent's diagnosis** (written by the agent, not verified):\n\n{quoted}\n\
         **The call:** `{tool}`\n\n```json\n{args}\n```\n\n\
         **Held by:** {rule}\n\n\
         **Approve or deny:** {approval_url}\n\n\
         _{marker}_\n",
        tool = exec.tool,
    );
    let text = format!(
        "A call is waiting for a person's approval.\n\n\
         The agent's diagnosis (written by the agent, not verified):\n{diagnosis}\n\n\
         The call: {tool} {args_line}\n\
         Held by: {rule}\n\
         Approve or deny: {approval_url}\n\n\
         {marker}\n",
        tool = exec.tool,
        args_line = redacted_args,
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
