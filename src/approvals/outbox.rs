//! The note outbox: internal notes for held calls reach Plain even if Plain is down
//! when the call is held, and are never posted twice. A note is queued in the same
//! transaction that holds its call; an attempt is recorded before it is sent, so after
//! a crash the outbox first looks for the note's marker on the thread's timeline.

use std::sync::Arc;
use std::time::Duration;

use crate::executions::store::{self, OutboxNote};
use crate::gateway::Gate;

/// The longest the outbox waits between retries of one note.
const MAX_BACKOFF_MS: i64 = 10 * 60 * 1000;

/// Sends every due note once; returns how many reached Plain.
pub async fn drain(gate: &Gate) -> usize {
    let Some(helpdesk) = gate.connectors.helpdesk.clone() else {
        return 0;
    };
    let now = gate.now();
    let due = gate
        .db
        .read(move |c| store::due_notes(c, now, 50))
        .await
        .unwrap_or_default();
    let mut sent = 0;
    for note in due {
        match send(gate, &helpdesk, &note).await {
            Ok(()) => {
                let (id, now) = (note.execution_id.clone(), gate.now());
                if gate
                    .db
                    .write(move |c| store::note_sent(c, &id, now))
                    .await
                    .is_ok()
                {
                    sent += 1;
                }
            }
            Err(error) => {
                let backoff = (2_000i64 << note.attempts.clamp(0, 16)).min(MAX_BACKOFF_MS);
                let (id, next) = (note.execution_id.clone(), gate.now() + backoff);
                let error = gate.current_redactor().redact(&error).into_owned();
                tracing::warn!(execution = %note.execution_id, error = %error, "cannot post the note yet; will retry");
                let _ = gate
                    .db
                    .write(move |c| store::note_failed(c, &id, &error, next))
                    .await;
            }
        }
    }
    sent
}

async fn send(
    gate: &Gate,
    helpdesk: &crate::connectors::HelpdeskConnector,
    note: &OutboxNote,
) -> Result<(), String> {
    if note.attempts > 0 {
        // An earlier attempt may have reached Plain before threadgate lost the answer.
        match helpdesk
            .find_note_containing(&note.thread_id, &note.marker)
            .await
        {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    let id = note.execution_id.clone();
    gate.db
        .write(move |c| store::note_attempting(c, &id))
        .await
        .map_err(|e| e.to_string())?;
    helpdesk
        .create_note(&note.thread_id, &note.text, Some(&note.markdown))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Runs the outbox until the process stops: on every wake-up and every few seconds.
pub async fn run(gate: Arc<Gate>) {
    loop {
        drain(&gate).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), gate.outbox.notified()).await;
    }
}
