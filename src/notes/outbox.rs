//! The note outbox: internal notes for held calls reach Plain even if Plain is down
//! when the call is held, and are never posted twice. A note is queued in the same
//! transaction that holds its call; an attempt is recorded before it is sent, so after
//! a crash the outbox first looks for the note's marker (keyed: see `notes::held`)
//! on the thread's timeline.
//!
//! Notes go out in rounds, fairly across threads: a round takes at most
//! [`NOTES_PER_THREAD`] of each thread's due notes, every thread's oldest first, so a
//! session that floods its thread with holds delays another thread's note by one round
//! at most, never by its whole backlog. A round whose notes cannot be read is logged
//! and tried again at the next wake-up; it is never taken for "nothing is due".

use super::Outbox;
use super::rounds::{Round, in_rounds};
use crate::connectors::HelpdeskConnector;
use crate::executions::store::{self, OutboxNote};
use crate::store::{Dialect, StoreError};

/// Notes of one thread in one round at most.
pub const NOTES_PER_THREAD: i64 = 2;
/// How long a drainer on Postgres holds the notes it took: another instance takes a
/// note again only after this (the marker is looked for first, so it is not posted
/// twice).
const CLAIM_MS: i64 = 60_000;
/// Notes in one round at most.
const NOTES_PER_ROUND: i64 = 50;

/// Sends every due note, round by round, until none is due; returns how many reached
/// Plain. An error reading the due notes ends the drain with that error (what was
/// sent before it stays sent).
pub async fn drain(outbox: &Outbox) -> Result<usize, StoreError> {
    let Some(helpdesk) = outbox.helpdesk.clone() else {
        return Ok(0);
    };
    let due = || {
        let now = outbox.now();
        let until = now.saturating_add(CLAIM_MS);
        let db = outbox.db.clone();
        async move {
            match db.dialect() {
                // One process drains: its due notes are its own, read on a snapshot.
                Dialect::Sqlite => {
                    db.read(move |c| store::due_notes(c, now, NOTES_PER_THREAD, NOTES_PER_ROUND))
                        .await
                }
                // Several instances drain: each round's notes are claimed in a write.
                Dialect::Postgres => {
                    db.write(move |c| {
                        store::claim_notes(c, now, (NOTES_PER_THREAD, NOTES_PER_ROUND), until)
                    })
                    .await
                }
            }
        }
    };
    in_rounds(due, |round| send_round(outbox, &helpdesk, round)).await
}

async fn send_round(outbox: &Outbox, helpdesk: &HelpdeskConnector, due: Vec<OutboxNote>) -> Round {
    let mut round = Round {
        sent: 0,
        settled: 0,
    };
    for note in due {
        match send(outbox, helpdesk, &note).await {
            Ok(()) => {
                let (id, now) = (note.execution_id.clone(), outbox.now());
                match outbox
                    .db
                    .write(move |c| store::note_sent(c, &id, now))
                    .await
                {
                    Ok(()) => {
                        round.sent += 1;
                        round.settled += 1;
                    }
                    Err(e) => {
                        tracing::error!(execution = %note.execution_id, error = %e, "note posted but not recorded; its marker is looked for before it is posted again");
                    }
                }
            }
            Err(error) => {
                let (id, next) = (
                    note.execution_id.clone(),
                    crate::retry::OUTBOX.next_at_ms(outbox.now(), note.attempts),
                );
                let error = outbox.redactor().redact(&error).into_owned();
                tracing::warn!(execution = %note.execution_id, error = %error, "cannot post the note yet; will retry");
                match outbox
                    .db
                    .write(move |c| store::note_failed(c, &id, &error, next))
                    .await
                {
                    Ok(()) => round.settled += 1,
                    Err(e) => {
                        tracing::error!(execution = %note.execution_id, error = %e, "cannot record a failed note attempt");
                    }
                }
            }
        }
    }
    round
}

async fn send(
    outbox: &Outbox,
    helpdesk: &HelpdeskConnector,
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
    outbox
        .db
        .write(move |c| store::note_attempting(c, &id))
        .await
        .map_err(|e| e.to_string())?;
    helpdesk
        .create_note(&note.thread_id, &note.text, Some(&note.markdown))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}
