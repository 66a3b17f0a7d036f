//! The thread event outbox: a held call's trail (`executions::trail`) reaches Plain at
//! least once, even if Plain is down when the call changes, and shows once: each event
//! has an external id Plain takes once, and Plain's refusal of one it already has
//! counts as sent. So unlike a note, an event needs no marker search after a crash: it
//! is simply sent again.
//!
//! Events go out in rounds, fairly across threads, as notes do: a round takes at most
//! [`EVENTS_PER_THREAD`] of each thread's due events, in the order they happened, and
//! an event waits while an earlier one of its thread is put off. A round whose events
//! cannot be read is an error for the caller to log; it is never "nothing is due".
//! Instances sharing the database each drain: a round's events are claimed in one write
//! ([`trail::claim`]), so no two instances post the same event at once.

use super::Outbox;
use super::rounds::{Round, in_rounds};
use crate::connectors::HelpdeskConnector;
use crate::connectors::helpdesk::{EventPosted, ThreadEvent};
use crate::executions::trail::{self, TrailEvent};
use crate::store::StoreError;

/// Events of one thread in one round at most.
pub const EVENTS_PER_THREAD: i64 = 2;
/// Events in one round at most.
const EVENTS_PER_ROUND: i64 = 50;
/// How long a drainer holds the events it took: another instance takes one again only
/// after this (Plain takes an external id once, so a re-sent event shows once).
const CLAIM_MS: i64 = 60_000;

/// Sends every due event, round by round, until none is due; returns how many reached
/// Plain (or were already there).
pub async fn drain(outbox: &Outbox) -> Result<usize, StoreError> {
    let Some(helpdesk) = outbox.helpdesk.clone() else {
        return Ok(0);
    };
    let due = || {
        let now = outbox.now();
        let until = now.saturating_add(CLAIM_MS);
        let db = outbox.db.clone();
        async move {
            // A read first: nothing due costs no write.
            let seen = db
                .read(move |c| trail::due(c, now, EVENTS_PER_THREAD, EVENTS_PER_ROUND))
                .await?;
            if seen.is_empty() {
                return Ok(seen);
            }
            // Several instances may drain: each round's events are claimed in a write.
            db.write(move |c| trail::claim(c, now, (EVENTS_PER_THREAD, EVENTS_PER_ROUND), until))
                .await
        }
    };
    in_rounds(due, |round| send_round(outbox, &helpdesk, round)).await
}

/// Sends one round.
async fn send_round(outbox: &Outbox, helpdesk: &HelpdeskConnector, due: Vec<TrailEvent>) -> Round {
    let mut round = Round {
        sent: 0,
        settled: 0,
    };
    for event in due {
        let id = event.external_id.clone();
        let written = match send(helpdesk, &event).await {
            Ok(posted) => {
                if posted == EventPosted::AlreadyThere {
                    tracing::info!(event = %id, "plain already had this thread event");
                }
                round.sent += 1;
                let now = outbox.now();
                outbox.db.write(move |c| trail::sent(c, &id, now)).await
            }
            Err(error) => {
                let next = crate::retry::OUTBOX.next_at_ms(outbox.now(), event.attempts);
                let error = outbox.redactor().redact(&error).into_owned();
                tracing::warn!(event = %id, error = %error, "cannot post the thread event yet; will retry");
                outbox
                    .db
                    .write(move |c| trail::failed(c, &id, &error, next))
                    .await
            }
        };
        match written {
            Ok(()) => round.settled += 1,
            Err(e) => {
                tracing::error!(event = %event.external_id, error = %e, "cannot record a thread event attempt; it is sent again, and plain takes it once");
            }
        }
    }
    round
}

async fn send(helpdesk: &HelpdeskConnector, event: &TrailEvent) -> Result<EventPosted, String> {
    let link = event
        .link
        .as_ref()
        .map(|(url, label)| (url.as_str(), label.as_str()));
    let sent = ThreadEvent {
        thread_id: &event.thread_id,
        external_id: &event.external_id,
        title: &event.title,
        body: &event.body,
        link,
    };
    helpdesk
        .create_thread_event(&sent)
        .await
        .map_err(|e| e.to_string())
}
